#!/usr/bin/python3
"""Where a test run's time went: the run's total, each setup's, and the
slowest tests, read from meson's logs (meson-logs/testlog*.json, one JSON
object per test).  A kernel group (one meson test, one VM) is also split
into its checks: the runner prints "# NAME: SECONDS s" after each.

  test-times.py [--since EPOCH] [--top N] MESON_LOG_DIR...

--since leaves out tests started before EPOCH (a log left by an earlier
run) and makes the total the wall time since then; scripts/run-tests
prints this at the end of every run, passed or failed.
"""
import argparse
import glob
import json
import os
import re
import time

CHECK_TIME = re.compile(r"^# ([\w.-]+): (\d+(?:\.\d+)?) s$", re.M)


def setup_of(path):
    """testlog.json is the default setup's, testlog-NAME.json NAME's."""
    base = os.path.basename(path)[:-len(".json")]
    return base.split("-", 1)[1] if "-" in base else "main"


def read_logs(dirs, since):
    tests = []
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "testlog*.json"))):
            setup = setup_of(path)
            with open(path) as f:
                for line in f:
                    try:
                        t = json.loads(line)
                    except ValueError:
                        continue  # a run killed while writing
                    if since and t.get("starttime", 0) < since:
                        continue
                    tests.append((setup, t))
    return tests


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--since", type=float, default=0)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("dirs", nargs="+")
    args = ap.parse_args()
    tests = read_logs(args.dirs, args.since)
    if not tests:
        return
    print("=== test time ===")
    if args.since:
        total = time.time() - args.since
        print(f"total: {total / 60:.1f} min ({total:.0f} s), build and setup included")
    per_setup = {}
    for setup, t in tests:
        per_setup[setup] = per_setup.get(setup, 0) + t["duration"]
    for setup, secs in per_setup.items():
        print(f"  {setup}: {secs / 60:.1f} min of test time "
              f"(tests run two at a time where they may)")
    rows = [(t["duration"], f"{t['name']} [{setup}] {t['result']}") for setup, t in tests]
    # A kernel group's own checks, so the slow one inside a VM shows.
    for setup, t in tests:
        group = t["name"].split(" / ", 1)[-1]
        for name, secs in CHECK_TIME.findall(t.get("stdout") or ""):
            rows.append((float(secs), f"  {name} in {group} [{setup}]"))
    rows.sort(reverse=True)
    print(f"the {args.top} slowest (meson tests, and checks inside kernel groups):")
    for secs, what in rows[:args.top]:
        print(f"  {secs:7.1f} s  {what}")


if __name__ == "__main__":
    main()
