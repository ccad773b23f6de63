"""hop_db and the ExportDB cond_*/map/autograd_function examples through our exporter.

Each case is exported with ``predispatch_func.export`` and replayed against
eager by ``pf.verify`` (outputs, write-backs, gradients where eager has them).
Prints one line per case and a summary table; ``--json`` writes the results.

    PYTHONPATH=$PWD python -m scripts.hop_figures [--samples 2] [--json out.json] [-k SUBSTR]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import traceback
import warnings

from tests.support.hop_db_cases import exportdb_cases, hop_db_cases, judge


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("-k", default="")
    opts = parser.parse_args()
    warnings.simplefilter("ignore")
    results = []
    for name, model, args, skip in [*hop_db_cases(opts.samples), *exportdb_cases()]:
        if opts.k not in name:
            continue
        status, detail = ("n/a", skip) if skip else judge(model, args)
        results.append({"case": name, "status": status, "detail": detail})
        print(f"{status:12} {name:55} {detail}", flush=True)
    table = collections.Counter((r["case"].split("/")[0], r["status"]) for r in results)
    print("\nsuite      " + " ".join(f"{s:>11}" for s in ("ok", "wrong", "refused", "error", "eager-fails", "n/a")))
    for suite in ("hop", "exportdb"):
        print(f"{suite:10} " + " ".join(f"{table[(suite, s)]:>11}" for s in
                                        ("ok", "wrong", "refused", "error", "eager-fails", "n/a")))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
