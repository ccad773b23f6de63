"""What differs between the torch releases we support, decided once by probing
the installed torch for the feature, not by comparing version strings.

Each probe names the releases it tells apart and why the difference matters;
``tests/test_torch_assumptions.py`` checks each answer against the behaviour
it stands for.
"""

from __future__ import annotations

__all__: list[str] = []
