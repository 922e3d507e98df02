#!/usr/bin/env python3
"""Newton-Schulz algorithms side by side, from muon_bench's Google Benchmark JSON.

    ns_bench_summary.py BENCH_JSON [--markdown]

One line per (size, backend, shape) of the `<size>/<backend>/ns_<algo>/<rows>x<cols>` rows: the
`ns_rate/gemm_rate` of plain, syrk, gram and auto (the median of the repetitions when the run had
--benchmark_repetitions, else the one run; "-" when the row did not run), the fastest of plain,
syrk and gram, and auto over that fastest (1.0: auto ran the fastest; below: it chose another, or
its table says that one does not meet the exactness contract there, kernels/ns_choice.hpp). For
`scripts/gpu_check.sh` (the CUDA rows: is gram faster than cuBLAS' plain GEMMs on the GPU, where
auto runs plain until it is measured) and for the CPU tables of bench/README.md. Exit 1 when the
file holds no such row.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys

ROW = re.compile(r"^(small|large)/(\w+)/ns_(plain|syrk|gram|auto)/(\d+x\d+)(/|$)")
ALGOS = ("plain", "syrk", "gram", "auto")
RATIO = "ns_rate/gemm_rate"


def ratios(doc: dict) -> dict[tuple[str, str, str], dict[str, float]]:
    """(size, backend, shape) -> algo -> ratio: the median aggregate where there is one, else
    the median of the iteration rows (one row: its value)."""
    medians: dict[tuple, float] = {}
    runs: dict[tuple, list[float]] = {}
    for b in doc.get("benchmarks", []):
        m = ROW.match(b.get("run_name") or b.get("name", ""))
        if not m or RATIO not in b or b.get("error_occurred"):
            continue
        key = (m.group(1), m.group(2), m.group(4), m.group(3))
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[key] = float(b[RATIO])
        else:
            runs.setdefault(key, []).append(float(b[RATIO]))
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for key in list(runs) + [k for k in medians if k not in runs]:
        value = medians.get(key, statistics.median(runs.get(key, [0.0])))
        out.setdefault(key[:3], {})[key[3]] = value
    return out


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench_json")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = ap.parse_args()
    with open(args.bench_json) as f:
        table = ratios(json.load(f))
    if not table:
        print(f"{args.bench_json}: no ns_<algo> rows with {RATIO}")
        return 1
    head = ["size", "backend", "shape", *ALGOS, "fastest", "auto/fastest"]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + " --- |" * len(head))
    else:
        print(f"{RATIO} per algorithm")
        print("  ".join(f"{h:<8}" if i > 2 else f"{h:<10}" for i, h in enumerate(head)))
    for (size, backend, shape), r in table.items():
        timed = {a: r[a] for a in ("plain", "syrk", "gram") if a in r}
        fastest = max(timed, key=timed.get) if timed else None
        rel = r["auto"] / timed[fastest] if fastest and "auto" in r else None
        cells = [size, backend, shape, *(fmt(r.get(a)) for a in ALGOS), fastest or "-", fmt(rel)]
        if args.markdown:
            print("| " + " | ".join(cells) + " |")
        else:
            print("  ".join(f"{c:<8}" if i > 2 else f"{c:<10}" for i, c in enumerate(cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
