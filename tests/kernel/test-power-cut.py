"""Power cut at every flush: what an fsync() promised is on disk.

The workload and the checks are in powercut.py.  Here every FLUSH and FUA
entry of the log is a power cut that must leave a clean filesystem holding
every synced file (about 350 points; under TCG the checks take about 2 min,
two at a time).  For both servers through the kernel client, and for the
loop device with direct I/O, the reference.  The proof that this can fail
is test-power-cut-early-ack.py.
"""
import os

import powercut
from kfix import tmpdir


def run_test(kind, cl):
    d = tmpdir(cl)
    log, base, rec, ops = powercut.run_workload(kind, d)
    points, checked, failure = powercut.check_every_point(d, log, base, ops)
    print(f"# power-cut: {points} flush/FUA points, {checked} distinct images "
          f"checked, {rec.seq} syncs", flush=True)
    assert failure is None, failure
    assert points >= 200, f"only {points} flush/FUA entries in the log: too few to prove much"
    os.unlink(log)
