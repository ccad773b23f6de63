"""The torch releases this package supports, each tested in CI (``.ci/run``) and each
with its shipped schema-audit table (``schema_audit/tables/``).

``pyproject.toml`` admits ``torch>=2.11,<2.16``; a later patch release of one of
these runs with the audit done lazily (see ``schema_audit/lazy.py``).
"""

SUPPORTED_TORCH_RELEASES = ("2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
