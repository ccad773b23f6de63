import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))

# every graph pass of the exporter ends in graph.lint() (predispatch_func/graphs.py)
os.environ.setdefault("PREDISPATCH_FUNC_LINT", "1")
