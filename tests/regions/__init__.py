"""Grad-mode and autocast regions, the model's own and the caller's."""
