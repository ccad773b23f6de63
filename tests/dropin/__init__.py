"""pf.export where torch.export.export stood: its arguments, dynamic-shape forms and error classes."""
