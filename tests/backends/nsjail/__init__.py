"""nsjail."""
