#!/usr/bin/env python3
"""Summary table of a same-run A/B (scripts/device/ab.sh, attention mode).

Reads the JSON lines that bench/explore_attention.py printed into LOGDIR/ab_<variant>_<round>.log
and prints, per case (case, heads, and the split count where the case sweeps it), every
round's time per variant, the variant's median and its change against the base build's
median. Cases without a time (kernel lists) are skipped.

    python scripts/device/ab_summary.py LOGDIR [--all-splits]

By default only split 0 (the planner's choice) of the forced-split sweeps is shown.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

LOG = re.compile(r"ab_(?P<variant>.+)_(?P<round>\d+)\.log$")


def read(logdir: Path, all_splits: bool) -> dict[tuple, dict[str, list[tuple[int, float]]]]:
    """{(case, heads, splits): {variant: [(round, us), ...]}}"""
    table: dict[tuple, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(logdir.glob("ab_*_*.log")):
        m = LOG.search(path.name)
        if m is None:
            continue
        variant, rnd = m["variant"], int(m["round"])
        for line in path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "us" not in rec or "case" not in rec:
                continue
            sweep = " rows=" in rec["case"]  # a forced-split sweep (--b1, --split-sweep)
            if sweep and not all_splits and rec.get("splits", 0) != 0:
                continue
            key = (rec["case"], rec.get("heads"), rec.get("splits") if sweep else None)
            table[key][variant].append((rnd, float(rec["us"])))
    return table


def render(table: dict[tuple, dict[str, list[tuple[int, float]]]]) -> str:
    variants: list[str] = []
    for per in table.values():
        for v in per:
            if v not in variants:
                variants.append(v)
    order = [v for v in ("base", "new") if v in variants] + sorted(v for v in variants if v not in ("base", "new"))
    lines = ["| case | heads | variant | rounds (us) | median | vs base |", "|---|---|---|---|---|---|"]
    for (case, heads, splits), per in table.items():
        name = case if splits is None else f"{case}, splits {splits}"
        base = statistics.median(u for _, u in per["base"]) if per.get("base") else None
        for v in order:
            if v not in per:
                continue
            us = [u for _, u in sorted(per[v])]
            med = statistics.median(us)
            delta = "" if base is None or v == "base" else f"{100.0 * (med / base - 1.0):+.1f}%"
            lines.append(f"| {name} | {heads} | {v} | {' / '.join(f'{u:.4g}' for u in us)} | {med:.4g} | {delta} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logdir", type=Path)
    ap.add_argument("--all-splits", action="store_true", help="every split of the forced-split sweeps")
    args = ap.parse_args(argv)
    table = read(args.logdir, args.all_splits)
    if not table:
        print(f"no A/B timings under {args.logdir}", file=sys.stderr)
        return 1
    print(render(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
