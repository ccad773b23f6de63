"""The trace: writes into inputs, views and intermediates, composites kept or decomposed, symbolic sizes,
the mode stack, refusals naming the user's line."""
