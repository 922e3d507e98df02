#!/usr/bin/env python3
"""Helpers of scripts/gpu_check.sh that read CTest's own output.

    gpu_check_tests.py summary JUNIT [--allow REGEX] [--dry-run]
        One line per test of a `ctest --output-junit` file (PASS/FAIL/SKIP, seconds, name, and a
        skip's reason: the line after gtest's "Skipped"), then a count line. Exit 0 when every test
        passed; a skip counts as passed with --dry-run (no GPU) or when its reason matches --allow
        (e.g. "needs 2 CUDA devices" on a one-GPU machine); 1 otherwise.
    gpu_check_tests.py groups BUILD_DIR LABEL_REGEX
        The tests carrying a label that matches LABEL_REGEX, grouped by executable: one line per
        executable, "<executable>\t<gtest filter of its tests>" (for compute-sanitizer runs).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET


def skip_reason(output: str) -> str:
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.rstrip().endswith(": Skipped") and i + 1 < len(lines):
            return lines[i + 1].strip()
    return "skipped"


def summary(args) -> int:
    root = ET.parse(args.junit).getroot()
    cases = root.iter("testcase")
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0, "SKIP-FAIL": 0}
    for c in cases:
        name, secs = c.get("name"), float(c.get("time") or 0)
        out = (c.findtext("system-out") or "")
        if c.find("failure") is not None or c.get("status") == "fail":
            kind, note = "FAIL", ""
            tail = [l for l in out.splitlines() if l.strip()][-6:]
            note = " | ".join(l.strip() for l in tail if "Failure" in l or "error" in l.lower())[:300]
        elif c.find("skipped") is not None or c.get("status") in ("notrun", "disabled"):
            reason = skip_reason(out)
            allowed = args.dry_run or (args.allow and re.search(args.allow, out))
            kind, note = ("SKIP" if allowed else "SKIP-FAIL"), reason
        else:
            kind, note = "PASS", ""
        counts[kind] += 1
        label = {"SKIP-FAIL": "SKIP (a GPU test must run here: FAILED)"}.get(kind, kind)
        print(f"  {label:<5} {secs:7.2f}s  {name}" + (f"  -- {note[:160]}" if note else ""))
    total = sum(counts.values())
    print(f"  {total} tests: {counts['PASS']} passed, {counts['FAIL']} failed, "
          f"{counts['SKIP'] + counts['SKIP-FAIL']} skipped"
          + (f" ({counts['SKIP-FAIL']} of them not allowed here)" if counts["SKIP-FAIL"] else ""))
    return 0 if counts["FAIL"] == 0 and counts["SKIP-FAIL"] == 0 and total > 0 else 1


def groups(args) -> int:
    out = subprocess.run(["ctest", "--test-dir", args.build_dir, "--show-only=json-v1", "-L",
                          args.label], check=True, text=True, capture_output=True).stdout
    by_exe: dict[str, list[str]] = {}
    for t in json.loads(out).get("tests", []):
        cmd = t.get("command") or []
        filt = [a.split("=", 1)[1] for a in cmd if a.startswith("--gtest_filter=")]
        if cmd and filt:
            by_exe.setdefault(cmd[0], []).append(filt[0])
    for exe, names in by_exe.items():
        print(f"{exe}\t{':'.join(names)}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary")
    s.add_argument("junit")
    s.add_argument("--allow", default="")
    s.add_argument("--dry-run", action="store_true")
    g = sub.add_parser("groups")
    g.add_argument("build_dir")
    g.add_argument("label")
    args = ap.parse_args()
    return summary(args) if args.cmd == "summary" else groups(args)


if __name__ == "__main__":
    sys.exit(main())
