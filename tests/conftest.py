"""Test settings. ``tests`` is a package: its helpers import as ``tests.support.*`` from the
repository root, which pytest puts on the path (rootdir-based), as ``python -m scripts.NAME`` does."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# every graph pass of the exporter ends in graph.lint() (predispatch_func/graphs.py)
os.environ.setdefault("PREDISPATCH_FUNC_LINT", "1")
