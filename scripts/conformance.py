"""Conformance run: PyTorch's own test databases through ours and torch.export.

Each case of ``tests/conformance`` (ExportDB, ModuleInfo, OpInfo, hop_db) is
exported with ``predispatch_func.export`` and with ``torch.export.export`` in
the same run, and both programs are replayed against the reference by the same replay
(``tests/conformance/judge.py``). Each (case, exporter) runs in a worker
process with a time limit; a worker that crashes or hangs is replaced and the
case recorded as an error. Results go to a jsonl file, one line per (case,
exporter), so an interrupted run resumes where it stopped.

Everything is per torch release: the run judges the torch of the interpreter
it runs in, its default results file is ``.conformance/results-torch-<release>.jsonl``
(``2.15.0``, whatever the local build tag), and its report is that release's
section, ``docs/runs/conformance/torch-<release>.md``. ``docs/runs/conformance.md`` is
then rebuilt from every section present, newest torch first, so a run under
one torch leaves the others' sections as they were.

Usage::

    python -m scripts.conformance [--suite opinfo] [--limit N | --sample N] [--workers 2]
        [--results PATH] [--timeout 60] [-k SUBSTR]
    python -m scripts.conformance --report-only   # rebuild this torch's section from its results file
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import subprocess
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from tests.conformance import release_key, torch_release
from tests.conformance.runner import load_results, run

STATUSES = ("ok", "wrong", "refusal", "error")


# --- results and report --------------------------------------------------------------


def _commit() -> str:
    if os.environ.get("CONFORMANCE_COMMIT"):  # a run from an exported tree
        return os.environ["CONFORMANCE_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_ROOT, check=False,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001
        return "unknown"


def report(results: dict[tuple[str, str], dict], suites: list[str], meta: dict) -> str:
    """This torch's section of ``docs/runs/conformance.md``."""
    import torch

    by_case = _by_case(results, suites)
    commits = sorted({r.get("commit", "") for r in results.values() if r.get("commit")})
    builds = sorted({r["torch"] for r in results.values() if r.get("torch")}) or [torch.__version__]
    lines = [f"## torch {torch_release()}", "",
             (f"- commit of the results: {', '.join(f'`{c}`' for c in commits) or 'unknown'}; "
              f"torch {', '.join(f'`{b}`' for b in builds)}"),
             f"- run: {meta.get('run', '')}", f"- cases: {_selection(by_case, suites)}", ""]
    complete = _complete(by_case)
    lines += [f"### Summary (torch {torch_release()})", ""]
    lines += _summary(complete, suites, _ran(by_case, suites))
    baseline = meta.get("baseline")
    if baseline:
        base_by_case = _by_case(baseline, suites)
        base_commits = sorted({r.get("commit", "") for r in baseline.values() if r.get("commit")})
        lines += [(f"An earlier run ({', '.join(base_commits) or meta.get('baseline_label', 'before the fixes')}, "
                  "the same judge):"), ""]
        lines += _summary(_complete(base_by_case), suites, _ran(base_by_case, suites))
    for suite in suites:
        rows = {c: rs for c, rs in complete.items() if c.startswith(suite + "/")}
        if not rows:
            continue
        lines += [f"### {suite} (torch {torch_release()})", ""]
        variants = collections.defaultdict(dict)
        for c, rs in rows.items():
            variants[c.split("/")[2]][c] = rs
        lines += ["| variant | cases | ours ok / wrong / refusal / error | torch.export ok / wrong / refusal / error |",
                  "|---|---|---|---|"]
        for variant, vrows in sorted(variants.items()):
            counts = {e: collections.Counter(rs[e]["status"] for rs in vrows.values()) for e in ("ours", "torch")}
            cells = [" / ".join(str(counts[e][s]) for s in STATUSES) for e in ("ours", "torch")]
            lines.append(f"| {variant} | {len(vrows)} | {cells[0]} | {cells[1]} |")
        lines.append("")
        wrong = sorted((c, rs) for c, rs in rows.items() if "wrong" in (rs["ours"]["status"], rs["torch"]["status"]))
        if wrong:
            lines += ["Silently wrong (ours / torch.export):", ""]
            for c, rs in wrong:
                for e in ("ours", "torch"):
                    if rs[e]["status"] == "wrong":
                        lines.append(f"- `{c}` {e} (torch.export: {rs['torch']['status']}): "
                                     f"{_md(rs[e]['detail'][:200])}" if e == "ours" else
                                     f"- `{c}` torch.export (ours: {rs['ours']['status']}): {_md(rs[e]['detail'][:200])}")
            lines.append("")
        for e, title in (("ours", "Our errors and refusals"), ("torch", "torch.export's errors and refusals")):
            clusters = collections.defaultdict(list)
            for c, rs in rows.items():
                if rs[e]["status"] in ("error", "refusal"):
                    clusters[(rs[e]["status"], rs[e]["signature"])].append(c)
            if not clusters:
                continue
            lines += [f"{title}, by cause:", "", "| n | kind | signature | e.g. |", "|---|---|---|---|"]
            for (status, sig), cs in sorted(clusters.items(), key=lambda kv: -len(kv[1])):
                lines.append(f"| {len(cs)} | {status} | {_md(sig)} | `{min(cs)}` |")
            lines.append("")
    na = sum(1 for rs in by_case.values() if any(r["status"] == "n/a" for r in rs.values()))
    lines += [f"Not counted: {na} case names with no sample or where eager raises.", ""]
    return "\n".join(lines)


_INTRO = [
    "# Conformance against PyTorch's own test databases", "",
    "Generated by `python -m scripts.conformance` (do not edit by hand): one section per torch release, "
    "each rebuilt by a run under that torch (`docs/runs/conformance/torch-<release>.md`, newest first).", "",
    ("Each case is exported with ours and with `torch.export.export` in the same run and both "
     "programs are replayed against the reference (outputs, written-back inputs, buffers, parameters, "
     "each output's `requires_grad`, gradients, RNG state). `wrong`: exports but differs from "
     "eager (or, for ours, breaks the IR contract). `refusal`: a clear error (our "
     "`UnsupportedError`, torch's `UserError`). `error`: any other exception. Cases where eager "
     "itself raises, or the database has no such sample, are not counted. In each summary, "
     "`case names run` says how many of the suite's case names on that torch were run (all of "
     "them: a full run; fewer: a sample), and `cases` counts those both exporters ran where the "
     "case applies (eager runs it and the database has the sample)."), ""]


def write_index(report_path: str, sections_dir: str) -> None:
    """``docs/runs/conformance.md``: the intro, then every torch's section, newest first."""
    found = []
    if os.path.isdir(sections_dir):
        for fname in os.listdir(sections_dir):
            if fname.startswith("torch-") and fname.endswith(".md"):
                found.append((release_key(fname[len("torch-"):-len(".md")]), fname))
    parts = ["\n".join(_INTRO)]
    for _, fname in sorted(found, reverse=True):
        with open(os.path.join(sections_dir, fname)) as f:
            parts.append(f.read().rstrip("\n") + "\n")
    with open(report_path, "w") as f:
        f.write("\n".join(parts))


def write_known_gaps(results: dict[tuple[str, str], dict], suites: list[str]) -> None:
    """Update ``known_gaps.json`` for this torch from the cases both exporters ran."""
    from tests.conformance import known_gaps as kg

    judged = {case: (ours, results[(case, "torch")]) for (case, exporter), ours in sorted(results.items())
              if exporter == "ours" and (case, "torch") in results and case.split("/", 1)[0] in suites}
    gaps = kg.update(kg.entries(), judged, torch_release())
    kg.write_entries(gaps)
    mine = sum(1 for e in gaps.values() if torch_release() in e["torch"])
    print(f"{mine} known gaps of torch {torch_release()} ({len(gaps)} in all) written to {kg.PATH}", file=sys.stderr)


def _by_case(results: dict[tuple[str, str], dict], suites: list[str]) -> dict[str, dict[str, dict]]:
    by_case: dict[str, dict[str, dict]] = collections.defaultdict(dict)
    for (case, exporter), r in results.items():
        if case.split("/", 1)[0] in suites:
            by_case[case][exporter] = r
    return by_case


def _ran(by_case: dict[str, dict[str, dict]], suites: list[str]) -> dict[str, str]:
    from tests import conformance

    return {s: f"{sum(1 for c, rs in by_case.items() if c.startswith(s + '/') and len(rs) == 2)} "
               f"of {len(conformance.case_names(s))}" for s in suites}


def _selection(by_case: dict[str, dict[str, dict]], suites: list[str]) -> str:
    from tests import conformance

    ran = sum(1 for rs in by_case.values() if len(rs) == 2)
    total = sum(len(conformance.case_names(s)) for s in suites)
    if ran == total:
        return f"every case of every suite ({total} case names: a full run)"
    return (f"a sample, {ran} of {total} case names (the fixed one: `--sample 100 --seed 0 --test-sample`, "
            "unless the run line says otherwise)")


def _complete(by_case: dict[str, dict[str, dict]]) -> dict[str, dict[str, dict]]:
    """Cases both exporters ran, where neither found the case not applicable."""
    return {c: rs for c, rs in by_case.items() if len(rs) == 2 and "n/a" not in
            (rs["ours"]["status"], rs["torch"]["status"])}


def _summary(complete: dict[str, dict[str, dict]], suites: list[str], ran: dict[str, str]) -> list[str]:
    from tests.conformance.known_gaps import known_gaps

    lines = [("| suite | case names run | cases | ours ok / wrong / refusal / error | "
              "torch.export ok / wrong / refusal / error | ours not ok where torch ok |"),
             "|---|---|---|---|---|---|"]
    for suite in suites:
        rows = {c: rs for c, rs in complete.items() if c.startswith(suite + "/")}
        if not rows:
            continue
        counts = {e: collections.Counter(rs[e]["status"] for rs in rows.values()) for e in ("ours", "torch")}
        behind = [c for c, rs in rows.items() if rs["torch"]["status"] == "ok" and rs["ours"]["status"] != "ok"]
        listed = sum(1 for c in behind if c in known_gaps())
        cells = [" / ".join(str(counts[e][s]) for s in STATUSES) for e in ("ours", "torch")]
        lines.append(f"| {suite} | {ran.get(suite, '?')} | {len(rows)} | {cells[0]} | {cells[1]} | {len(behind)}"
                     + (f" ({listed} listed in known_gaps.json)" if listed else "") + " |")
    return [*lines, ""]


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# --- main ----------------------------------------------------------------------------


def select(suites: list[str], k: list[str] | None, limit: int | None, sample: int | None, seed: int) -> list[str]:
    from tests import conformance

    names = [n for s in suites for n in conformance.case_names(s) if not k or any(x in n for x in k)]
    if sample is not None:
        rng = random.Random(seed)
        names = [n for s in suites for n in sorted(rng.sample([m for m in names if m.startswith(s + "/")],
                                                             min(sample, sum(m.startswith(s + "/") for m in names))))]
    if limit is not None:
        names = names[:limit]
    return names


def main(argv: list[str] | None = None) -> int:
    import torch

    from tests import conformance

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", action="append", choices=conformance.SUITES, help="repeatable; default all")
    p.add_argument("-k", action="append", help="only cases whose name contains this (repeatable: any of them)")
    p.add_argument("--limit", type=int, help="the first N cases")
    p.add_argument("--sample", type=int, help="a seeded random N cases per suite")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-sample", action="store_true",
                   help="the cases tests/external/test_conformance.py samples (with --sample, -k or --rerun-gaps: those too)")
    p.add_argument("--gap-cases", action="store_true",
                   help="also the cases known_gaps.json lists, for any torch (with --sample: the fixed sample)")
    p.add_argument("--write-known-gaps", action="store_true",
                   help="update tests/conformance/known_gaps.json for this torch from the results of the selected suites")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per (case, exporter)")
    p.add_argument("--results", default=os.path.join(_ROOT, ".conformance", f"results-torch-{torch_release()}.jsonl"),
                   help="default: .conformance/results-torch-<release>.jsonl of the interpreter's torch")
    p.add_argument("--report", default=os.path.join(_ROOT, "docs", "runs", "conformance.md"),
                   help="the index; this torch's section goes to conformance/torch-<release>.md beside it")
    p.add_argument("--fresh", action="store_true", help="ignore earlier results for the selected cases")
    p.add_argument("--retry", action="store_true", help="run again the pairs that timed out or crashed")
    p.add_argument("--rerun-gaps", action="store_true",
                   help="run again, with this checkout, the selected cases where ours falls short of torch.export")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--no-report", action="store_true",
                   help="leave docs alone (e.g. a --gap-cases check kept in its own --results file)")
    p.add_argument("--baseline", help="an earlier results file, summarised in the report too")
    p.add_argument("--baseline-label", default="before the fixes", help="what the earlier run was")
    a = p.parse_args(argv)
    suites = a.suite or list(conformance.SUITES)
    results = load_results(a.results)
    others = sorted({r["torch"] for r in results.values() if torch_release(r.get("torch", torch.__version__))
                     != torch_release()})
    named = re.fullmatch(r"results-torch-(.+)\.jsonl", os.path.basename(a.results))
    if named and torch_release(named.group(1)) != torch_release():
        others.append(named.group(1))
    if others:
        p.error(f"{a.results} holds results of torch {', '.join(others)}, not of this torch {torch.__version__}")
    start = time.monotonic()
    n_run = 0
    if not a.report_only:
        only_extras = (a.test_sample or a.gap_cases) and not (a.rerun_gaps or a.k or a.limit or a.sample is not None)
        names = [] if only_extras else select(suites, a.k, a.limit, a.sample, a.seed)
        if a.rerun_gaps:
            from tests.conformance.known_gaps import is_gap

            names = [n for n in names if (n, "ours") in results and (n, "torch") in results
                     and is_gap(results[(n, "ours")], results[(n, "torch")])]
        if a.test_sample:
            names += [n for n in conformance.sampled_cases() if n not in names]
        if a.gap_cases:
            from tests.conformance.known_gaps import entries

            known = set(n for s in suites for n in conformance.case_names(s))
            names += [n for n in sorted(entries()) if n in known and n not in names]
        a.fresh = a.fresh or a.rerun_gaps
        again = ("timeout", "worker crashed") if a.retry else ()
        tasks = [(n, e) for n in names for e in ("ours", "torch")
                 if a.fresh or (n, e) not in results or results[(n, e)]["signature"] in again]
        n_run = len(tasks)
        print(f"{len(names)} cases, {len(tasks)} (case, exporter) runs to do, {a.workers} workers", file=sys.stderr)
        os.makedirs(os.path.dirname(os.path.abspath(a.results)), exist_ok=True)
        with open(a.results, "a") as f:
            commit = _commit()

            def sink(r: dict) -> None:
                r["commit"] = commit
                r["torch"] = torch.__version__
                results[(r["case"], r["exporter"])] = r
                f.write(json.dumps(r) + "\n")
                f.flush()
            run(tasks, a.workers, a.timeout, sink)
    elapsed = time.monotonic() - start
    meta = {"commit": _commit(),
            "run": f"{n_run} (case, exporter) runs in {elapsed / 60:.1f} min with {a.workers} workers"
                   if n_run else (f"report rebuilt from the results file ({len(results)} (case, exporter) results, "
                                  f"{sum(r.get('seconds', 0) for r in results.values()) / 60:.0f} min of "
                                  "worker time judging them)")}
    if a.baseline:
        meta["baseline"] = load_results(a.baseline)
        meta["baseline_label"] = a.baseline_label
    if a.write_known_gaps:
        write_known_gaps(results, suites)
    if a.no_report:
        return 0
    text = report(results, suites, meta)
    sections = os.path.join(os.path.dirname(os.path.abspath(a.report)), "conformance")
    os.makedirs(sections, exist_ok=True)
    with open(os.path.join(sections, f"torch-{torch_release()}.md"), "w") as f:
        f.write(text)
    write_index(a.report, sections)
    print(text.split("### ", 2)[1] if "### " in text else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
