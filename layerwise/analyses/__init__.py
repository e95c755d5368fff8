"""Per-layer analyses."""
