"""Property-suite cases of the batch-level losses (see _harness.py)."""

CASES = []
