"""Texts of torch's error messages that we translate into refusals.
"""

from __future__ import annotations

__all__: list[str] = []
