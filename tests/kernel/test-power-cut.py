"""Power cut at the flushes: what an fsync() promised is on disk.

The workload and the checks are in powercut.py.  Each FLUSH and FUA entry
of the log is a power cut that must leave a clean filesystem holding every
synced file: about 200-380 points, 2-5 minutes of checks under TCG.  The
full tier checks every one; the standard tier a sample (powercut.choose):
every point where a sync's promise is first checkable, and an evenly
spread set placed by a printed seed.  For both servers through the kernel
client, and for the loop device with direct I/O, the reference.  The proof
that this can fail is test-power-cut-early-ack.py.
"""
import os

import powercut
from kfix import tmpdir


def run_test(kind, cl):
    d = tmpdir(cl)
    log, base, rec, ops = powercut.run_workload(kind, d)
    points, distinct, checked, failure = powercut.check_points(
        d, log, base, ops, powercut.tier_seed(), lambda line: print(line, flush=True))
    print(f"# power-cut: {points} flush/FUA points, {distinct} distinct images, "
          f"{checked} checked, {rec.seq} syncs", flush=True)
    assert failure is None, failure
    assert points >= 200, f"only {points} flush/FUA entries in the log: too few to prove much"
    os.unlink(log)
