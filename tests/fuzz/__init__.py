"""Differential fuzzing of the exporter against the reference.

* ``program.py``: a generated program as data (inputs, optional buffer, statements,
  returns) that renders to paste-ready ``nn.Module`` source and is built by exec'ing it;
* ``strategies.py``: hypothesis strategies drawing programs statement by statement
  against a shadow eager run, so every program runs in eager;
* ``harness.py``: the property: export, contract check, replay against the reference;
* ``torch_baselines.py``: the same property on torch 2.13's own functional paths.

Run: ``python -m pytest tests/fuzz/test_fuzz.py`` (bounded, deterministic),
``python -m pytest -m fuzz_long tests/fuzz/test_fuzz.py``, or
``python -m scripts.fuzz --budget N --seed S [--regions] [--against torch] [--shrink]``.
"""
