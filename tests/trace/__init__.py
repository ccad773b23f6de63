"""The trace: the edge-case catalogue, the mode stack, composites kept or decomposed, dynamic shapes."""
