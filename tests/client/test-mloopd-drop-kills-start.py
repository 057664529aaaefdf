#!/usr/bin/python3
"""A device dropped while its server is being restarted takes the
starting server with it, at once.

A keeper stopped while a restart's server has been spawned but does not
listen yet (a slow open of a large overlay, an image on a stalled disk)
marked that start abandoned and left the kill to the start's end, which
comes from the main loop when the server listens or the start times out
(60 s).  Until then the server runs on unwatched, holding the image's
and the overlay's locks, with the device's state already gone: an
attach of the same overlay is refused.  mloop-supervisor, whose loop
never runs again after a stop, left it running for good.

Here a stand-in for mloop-server records its pid and, when it finds a
token, waits until told before it becomes the server: the device is
kept, the token laid, its server killed, and the device dropped while
the restart's server waits.  That server must be gone when the drop is
answered.

Root (mloopd answers root only).  About 1 s (client suite)."""
import os
import signal

import harness
import mloopd_control
from harness import check
from mloopd_control import wait_for

MLOOPD = os.environ["MLOOPD_BIN"]
SERVER = os.environ["MLOOP_SERVER_BIN"]
SIZE = 1 << 20

if os.geteuid() != 0:
    harness.skip("mloopd answers root only")

d = harness.tmpdir()
run, control = mloopd_control.private_runtime(d)
held = mloopd_control.HeldStart(d, SERVER)
env = dict(os.environ, MLOOP_RUNTIME_DIR=run, MLOOP_SERVER_BIN=held.path)
dev = os.path.join(run, "dev-dropped")
attach = mloopd_control.attaching(dev)    # under way for the test's life
sock = os.path.join(dev, "sock")
image = harness.make_image(SIZE)


def cleanup():
    held.release()
    mloopd_control.kill(mloopd_control.processes_naming(sock))


harness.on_exit(cleanup)

p = mloopd_control.start([MLOOPD], env, os.path.join(d, "mloopd.log"), control)
harness.kill_at_exit(p)
a = mloopd_control.ask(control, op="keep", dir=dev, server="native",
                       image=image, threads=1)
check("the device is kept", a.get("ok") == "1", a)
first = mloopd_control.server_pid(dev)
held.lay()
os.kill(first, signal.SIGKILL)
wait_for("the restart's server to be spawned, waiting",
         lambda: len(held.pids()) == 2 and held.holding())
starting = held.pids()[1]
a = mloopd_control.ask(control, op="drop", dir=dev)
check("the device is dropped", a.get("ok") == "1", a)
check("the restart's server is gone when the drop is answered",
      not mloopd_control.alive(starting), f"pid {starting} still runs")
check("no process names the device's socket",
      mloopd_control.processes_naming(sock) == [],
      mloopd_control.processes_naming(sock))
p.terminate()
check("mloopd exits 0", p.wait(timeout=30) == 0)
harness.exit_if_failed()
