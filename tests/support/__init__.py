"""Helpers the test files share: the replay against the reference, the edge-case catalogue, refusal
expectations, the conformance runner's judgement, torch limits per release, hop_db cases, custom ops
for the audit, the import walker."""
