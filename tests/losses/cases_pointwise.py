"""Property-suite cases of the per-example losses (see _harness.py)."""

CASES = []
