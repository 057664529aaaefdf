"""The overlay's power-cut replay can fail: with mloop-server acknowledging
FLUSH without doing it (MLOOP_TEST_ACK_FLUSH_EARLY=1, as in
test-power-cut-early-ack.py), the overlay is never synced, and the sample
test-power-cut-overlay.py checks must catch a lost file or a broken
filesystem.  Only the native CLI kind has the switch; the others skip."""
import importlib.util
import os

from kfix import Skip

SWITCH = "MLOOP_TEST_ACK_FLUSH_EARLY"
HERE = os.path.dirname(os.path.abspath(__file__))


def run_test(kind, cl):
    if getattr(kind, "name", None) != "native":
        raise Skip("only mloop-server has a switch to acknowledge FLUSH undone")
    spec = importlib.util.spec_from_file_location(
        "power_cut_overlay", os.path.join(HERE, "test-power-cut-overlay.py"))
    overlay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(overlay)
    os.environ[SWITCH] = "1"
    cl.push(os.environ.pop, SWITCH, None)
    points, distinct, checked, rec, failure = overlay.replay(kind, cl)
    print(f"# power-cut-overlay-early-ack: caught after {checked} checks ({distinct} "
          f"distinct images at {points} points): {failure}", flush=True)
    assert failure is not None, \
        f"a server that acknowledges FLUSH undone passed {checked} overlay power-cut checks"
