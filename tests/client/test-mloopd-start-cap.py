#!/usr/bin/python3
"""mloopd spawns at most a few servers at once; the rest wait their turn.

Many keeps at once (a boot attaching every device, a takeover starting
every server that died) would otherwise spawn as many servers at once,
each loading its image, nbdkit and its plugins, a cluster connection.
Starts beyond 2 x the CPUs mloopd may run on (at least 4) are queued
and spawned as running ones end; a queued start abandoned (its attach
died, mloopd stopping) is dropped without a spawn.

Here mloopd runs on one CPU (taskset), so 4 at once; a stand-in for
mloop-server records each spawn and waits while a file says so before
it becomes the server.  Seven keeps at once must spawn four; one queued
whose attach dies must never spawn; the rest must all be served once
the servers may listen.  Then every server is killed while they may not
listen, and mloopd stopped (--stop-wait 2): four restarts spawn, the
queued ones are dropped and spawn none, and the next mloopd serves
every device.

Root (mloopd answers root only); taskset.  About 8 s (client suite)."""
import os
import shutil
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
DEVICES = 7
CAP = 4         # 2 x 1 CPU, at least 4
SETTLE_S = 1    # time for more spawns than the cap to show

if os.geteuid() != 0:
    harness.skip("mloopd answers root only")
if shutil.which("taskset") is None:
    harness.skip("no taskset to run mloopd on one CPU")

d = harness.tmpdir()
run, control = mloopd_control.private_runtime(d)
hold = os.path.join(d, "hold")
spawned = os.path.join(d, "spawned")
stand_in = os.path.join(d, "server")
mloopd_control.stand_in_server(stand_in, SERVER, f"""\
echo "$*" >> {spawned}
while [ -e {hold} ]; do sleep 0.05; done
""")
env = dict(os.environ, MLOOP_RUNTIME_DIR=run, MLOOP_SERVER_BIN=stand_in)
image = harness.make_image(SIZE)
dirs = [os.path.join(run, f"dev-{i}") for i in range(DEVICES)]
attaches = {path: mloopd_control.attaching(path) for path in dirs}


def cleanup():
    try:
        os.unlink(hold)
    except FileNotFoundError:
        pass
    for path in dirs:
        mloopd_control.kill(mloopd_control.processes_naming(
            os.path.join(path, "sock")))


harness.on_exit(cleanup)


def start(*args):
    p = mloopd_control.start(["taskset", "-c", "0", MLOOPD, *args], env,
                             os.path.join(d, "mloopd.log"), control)
    harness.kill_at_exit(p)
    return p


def spawns(path=None):
    """How many servers were spawned (of PATH's device only)."""
    try:
        with open(spawned) as f:
            lines = f.readlines()
    except FileNotFoundError:
        return 0
    sock = os.path.join(path or "", "sock")
    return sum(path is None or any(arg.endswith(sock) for arg in line.split())
               for line in lines)


def servers(path):
    return mloopd_control.processes_naming(os.path.join(path, "sock"))


answers = {}


def keep(path):
    answers[path] = mloopd_control.ask(control, op="keep", dir=path,
                                       server="native", image=image,
                                       threads=1)


# --- Keeps at once ---------------------------------------------------
p = start("--stop-wait", "2")
open(hold, "w").close()
threads = [threading.Thread(target=keep, args=(path,)) for path in dirs]
for t in threads:
    t.start()
wait_for("the first servers spawned", lambda: spawns() >= CAP)
time.sleep(SETTLE_S)
check(f"{DEVICES} keeps at once spawn {CAP} servers", spawns() == CAP,
      f"{spawns()} spawned")
queued = [path for path in dirs if spawns(path) == 0]
if queued:
    gone = queued[0]
    os.close(attaches.pop(gone))
    try:
        wait_for("the queued device whose attach died to be dropped",
                 lambda: gone not in mloopd_control.kept(control), timeout=6)
        ok = True
    except AssertionError:
        ok = False
    check("a queued keep whose attach died is dropped", ok)
else:
    gone = None
os.unlink(hold)
for t in threads:
    t.join(timeout=60)
served = [path for path in dirs if path != gone]
check("every other keep is answered once the servers listen",
      all(answers.get(path, {}).get("ok") == "1" for path in served),
      {os.path.basename(k): v for k, v in answers.items()})
if gone:
    check("the dropped keep is answered with an error",
          "error" in answers.get(gone, {}), answers.get(gone))
    check("and its server was never spawned", spawns(gone) == 0,
          f"{spawns(gone)} spawned")
check("one server spawned per device served", spawns() == len(served),
      f"{spawns()} spawned for {len(served)}")

# --- A stop with restarts queued -------------------------------------
open(hold, "w").close()
before = spawns()
for path in served:
    os.kill(mloopd_control.server_pid(path), signal.SIGKILL)
wait_for("the restarts spawned", lambda: spawns() - before >= CAP)
time.sleep(SETTLE_S)
check(f"{len(served)} restarts at once spawn {CAP} servers",
      spawns() - before == CAP, f"{spawns() - before} spawned")
p.terminate()
p.wait(timeout=30)
time.sleep(0.5)
check("a stop spawns none of the restarts queued",
      spawns() - before == CAP, f"{spawns() - before} spawned")
os.unlink(hold)
p = start()
try:
    wait_for("every device served by the next mloopd", lambda: all(
        mloopd_control.alive(mloopd_control.server_pid(path))
        for path in served), timeout=30)
    ok = True
except AssertionError:
    ok = False
check("the next mloopd serves every device", ok)
for path in served:
    a = mloopd_control.ask(control, op="drop", dir=path)
    check(f"{os.path.basename(path)} dropped", a.get("ok") == "1", a)
p.terminate()
check("mloopd exits 0", p.wait(timeout=30) == 0)
harness.exit_if_failed()
