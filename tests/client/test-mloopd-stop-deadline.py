#!/usr/bin/python3
"""mloopd stopped while servers start stops within its stop deadline,
and leaves what it let go for the next mloopd.

A stop answers the keeps under way and waits for the restarts under way,
so that the next mloopd finds their pid files; but a server may take a
minute to listen, and systemd kills mloopd at TimeoutStopSec, mid-start.
So the whole stop has one deadline (--stop-wait, inside the unit's
TimeoutStopSec): at it, the keeps still waiting are answered with an
error (their attach fails; their records go), and the servers still
starting are killed (a restart's record stays: the next mloopd starts
the device's server anew).

Here a stand-in for mloop-server waits, while a file says so, before it
becomes the server: a device is kept and its server killed (its restart
waits), a second device's keep waits, and mloopd --stop-wait=2 gets
SIGTERM.  It must exit 0 within the deadline and a little, answer the
waiting keep, leave no server starting, and the next mloopd must keep
and serve the first device and not the second.

Root (mloopd answers root only).  About 3 s (client suite)."""
import os
import signal
import threading
import time

import harness
import mloopd_control
from harness import check
from mloopd_control import wait_for

MLOOPD = os.environ["MLOOPD_BIN"]
SERVER = os.environ["MLOOP_SERVER_BIN"]
SIZE = 1 << 20
STOP_WAIT_S = 2
SLACK_S = 3     # the kill of what still starts, and a loaded machine

if os.geteuid() != 0:
    harness.skip("mloopd answers root only")

d = harness.tmpdir()
run, control = mloopd_control.private_runtime(d)
hold = os.path.join(d, "hold")
stand_in = os.path.join(d, "server")
mloopd_control.stand_in_server(stand_in, SERVER, f"""\
while [ -e {hold} ]; do sleep 0.05; done
""")
env = dict(os.environ, MLOOP_RUNTIME_DIR=run, MLOOP_SERVER_BIN=stand_in)


attaches = []     # each device's attach, under way for the test's life


def device(name):
    path = os.path.join(run, name)
    attaches.append(mloopd_control.attaching(path))
    return path, os.path.join(path, "sock")


restarting, restarting_sock = device("dev-restarting")
keeping, keeping_sock = device("dev-keeping")
image = harness.make_image(SIZE)


def remove_file(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def cleanup():
    remove_file(hold)
    for sock in (restarting_sock, keeping_sock):
        mloopd_control.kill(mloopd_control.processes_naming(sock))


harness.on_exit(cleanup)


def start(*args):
    p = mloopd_control.start([MLOOPD, *args], env,
                             os.path.join(d, "mloopd.log"), control)
    harness.kill_at_exit(p)
    return p


p = start(f"--stop-wait={STOP_WAIT_S}")
a = mloopd_control.ask(control, op="keep", dir=restarting, server="native",
                       image=image, threads=1)
check("a device is kept", a.get("ok") == "1", a)
first = mloopd_control.server_pid(restarting)
open(hold, "w").close()
os.kill(first, signal.SIGKILL)
wait_for("its restart's server to be spawned",
         lambda: os.path.exists(os.path.join(restarting,
                                             "server.pid.starting")))
answer = {}


def keep():
    try:
        answer.update(mloopd_control.ask(control, op="keep", dir=keeping,
                                         server="native", image=image,
                                         threads=1))
    except OSError as e:
        answer["exception"] = str(e)


keeper = threading.Thread(target=keep)
keeper.start()
wait_for("the second keep's server to be spawned",
         lambda: os.path.exists(os.path.join(keeping, "server.pid.starting")))
began = time.monotonic()
p.send_signal(signal.SIGTERM)
try:
    status = p.wait(timeout=STOP_WAIT_S + SLACK_S)
except Exception:
    status = None
took = time.monotonic() - began
check(f"mloopd stops within its stop deadline ({STOP_WAIT_S} s) and a "
      "little", status is not None, f"still running after {took:.1f} s")
check("mloopd, stopped, exits 0", status == 0, f"exit status {status}")
keeper.join(timeout=30)
check("the keep still waiting at the deadline is answered with an error",
      "stopping" in answer.get("error", ""), answer)
check("its device's record is gone (its attach failed)",
      not os.path.exists(os.path.join(keeping, "keep")))
left = (mloopd_control.processes_naming(restarting_sock) +
        mloopd_control.processes_naming(keeping_sock))
check("no server is left starting", left == [], f"pids {left}")
check("no start's record is left",
      not os.path.exists(os.path.join(restarting, "server.pid.starting")) and
      not os.path.exists(os.path.join(keeping, "server.pid.starting")))
check("the restarting device's record stays, for the next mloopd",
      os.path.exists(os.path.join(restarting, "keep")))

remove_file(hold)
p = start()
check("the next mloopd keeps the restarting device, not the other",
      mloopd_control.kept(control) == {restarting},
      mloopd_control.kept(control))
try:
    wait_for("the restarting device's new server", lambda: mloopd_control.alive(
        mloopd_control.server_pid(restarting)))
    serving = True
except AssertionError:
    serving = False
check("the next mloopd serves the restarting device", serving)
a = mloopd_control.ask(control, op="drop", dir=restarting)
check("the device is dropped", a.get("ok") == "1", a)
p.terminate()
check("mloopd exits 0", p.wait(timeout=30) == 0)
harness.exit_if_failed()
