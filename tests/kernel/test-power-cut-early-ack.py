"""The power-cut test can fail: against a server that acknowledges FLUSH
without doing it, a power cut at some flush loses a synced file or leaves
a filesystem fsck does not pass.

mloop-server has a test-only switch for that, MLOOP_TEST_ACK_FLUSH_EARLY=1
(server/dispatch.c), inherited from mloop attach through the supervisor.
Only the native CLI kind has it; the others skip.
"""
import os

import powercut
from kfix import Skip, tmpdir

SWITCH = "MLOOP_TEST_ACK_FLUSH_EARLY"


def run_test(kind, cl):
    if getattr(kind, "name", None) != "native":
        raise Skip("only mloop-server has a switch to acknowledge FLUSH undone")
    d = tmpdir(cl)
    os.environ[SWITCH] = "1"
    cl.push(os.environ.pop, SWITCH, None)
    log, base, rec, ops = powercut.run_workload(kind, d)
    os.environ.pop(SWITCH)
    # The same sample as test-power-cut's: it must catch what that misses.
    points, distinct, checked, failure = powercut.check_points(
        d, log, base, ops, powercut.tier_seed(), lambda line: print(line, flush=True))
    print(f"# power-cut-early-ack: caught after {checked} checks ({distinct} distinct "
          f"images at {points} points): {failure}",
          flush=True)
    assert failure is not None, \
        f"a server that acknowledges FLUSH undone passed all {points} power cuts"
