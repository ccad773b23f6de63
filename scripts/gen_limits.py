"""Write ``docs/limits.md`` from ``predispatch_func/known_limits.py`` (the texts live next to the code).

Usage::

    python scripts/gen_limits.py           # rewrite docs/limits.md
    python scripts/gen_limits.py --check   # exit 1 if docs/limits.md is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from predispatch_func.known_limits import render

LIMITS_DOC = Path(__file__).resolve().parents[1] / "docs" / "limits.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the file is up to date")
    ns = parser.parse_args(argv)
    text = render()
    if ns.check:
        if LIMITS_DOC.read_text() != text:
            print(f"{LIMITS_DOC} is stale: run python scripts/gen_limits.py", file=sys.stderr)
            return 1
        return 0
    LIMITS_DOC.write_text(text)
    print(f"wrote {LIMITS_DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
