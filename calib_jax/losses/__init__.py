"""Training-time calibration losses (filled in by the loss modules)."""
