"""Helpers the test files share: the eager-replay oracle, the edge-case catalogue, refusal
expectations, torch limits per release, hop_db cases, custom ops for the audit, the import walker."""
