#!/usr/bin/python3
"""One device's slow server start holds up no other device in mloopd.

A server may take long to start (an RBD cluster slow to answer, an image
on a stalled disk): mloopd waits for it to listen for up to a minute.
Its control socket, and every other device, must not wait with it.  Here
mloopd runs mloop-server through a stand-in that sleeps SLOW_S seconds
before starting a server whose image's name says "slow": while a keep of
the slow device is answered only once its server listens, a keep of a
quick one, a list and a has are answered at once.  Then the slow
device's server is killed: its restart takes SLOW_S again, and a keep
and a drop of another device meanwhile are still answered at once; the
slow device serves again afterwards.  A planned restart of the slow
device is answered at once, its old server serving until the next one
listens.  mloopd stopped while a slow keep
is under way answers it first, and the next mloopd takes the device
over.

Root (mloopd answers root only).  About 14 s (standard tier, client
suite)."""
import os
import signal
import subprocess
import threading
import time

import nbd

import harness
import mloopd_control
import procstop
from harness import check
from mloopd_control import wait_for

MLOOPD = os.environ["MLOOPD_BIN"]
SERVER = os.environ["MLOOP_SERVER_BIN"]
SLOW_S = 3
QUICK_S = 1.5  # an answer not held up by the slow start comes well within SLOW_S
SIZE = 1 << 20

if os.geteuid() != 0:
    harness.skip("mloopd answers root only")

d = harness.tmpdir()
run = os.path.join(d, "run")
control = os.path.join(run, "mloopd.sock")
stand_in = os.path.join(d, "slow-server")
mloopd_control.stand_in_server(stand_in, SERVER, f"""\
case "$*" in *slow*) sleep {SLOW_S} ;; esac
""")
env = dict(os.environ, MLOOP_RUNTIME_DIR=run, MLOOP_SERVER_BIN=stand_in)
servers_seen = set()
harness.on_exit(lambda: mloopd_control.kill(servers_seen))



def ask(**fields):
    return mloopd_control.ask(control, **fields)


def listening():
    try:
        return ask(op="list").get("ok") == "1"
    except OSError:
        return False


def start_mloopd():
    log = open(os.path.join(d, "mloopd.log"), "a")
    p = subprocess.Popen([MLOOPD], env=env, stdout=log, stderr=log)
    harness.kill_at_exit(p)
    wait_for("mloopd to listen", listening)
    return p


mloopd = start_mloopd()


attaches = []     # each device's attach, under way for the test's life


def device(name):
    data = harness.pattern(SIZE, len(name))
    image = os.path.join(d, f"{name}.img")
    with open(image, "wb") as f:
        f.write(data)
    directory = os.path.join(run, f"dev-{name}")
    attaches.append(mloopd_control.attaching(directory))
    return directory, image, data


def timed(**fields):
    start = time.monotonic()
    a = ask(**fields)
    return a, time.monotonic() - start


def reads_back(directory, data):
    h = nbd.NBD()
    try:
        h.connect_unix(os.path.join(directory, "sock"))
        ok = h.pread(SIZE, 0) == data
        h.shutdown()
        return ok
    except nbd.Error:
        return False


slow_dir, slow_image, slow_data = device("slow")
slow_answer = {}


def keep_slow():
    slow_answer["a"], slow_answer["took"] = timed(op="keep", dir=slow_dir, image=slow_image,
                                                  threads=1)


slow_keep = threading.Thread(target=keep_slow)
slow_keep.start()
time.sleep(0.3)  # the slow keep is under way
a, took = timed(op="list")
check("list is answered while a server starts", a.get("ok") == "1" and took < QUICK_S,
      f"{a} in {took:.2f} s")
a, took = timed(op="has", dir=slow_dir)
check("a device whose server starts is kept already", a.get("ok") == "1" and took < QUICK_S,
      f"{a} in {took:.2f} s")
a, took = timed(op="drop", dir=slow_dir)
check("a device whose first server starts is not dropped meanwhile",
      "still starting" in a.get("error", "") and took < QUICK_S, f"{a} in {took:.2f} s")
quick_dir, quick_image, quick_data = device("quick")
a, took = timed(op="keep", dir=quick_dir, image=quick_image, threads=1)
check("a keep is answered while another device's server starts",
      a.get("ok") == "1" and took < QUICK_S, f"{a} in {took:.2f} s")
servers_seen.add(mloopd_control.server_pid(quick_dir))
slow_keep.join()
check("the slow keep is answered once its server listens",
      slow_answer["a"].get("ok") == "1" and slow_answer["took"] >= SLOW_S - 0.5,
      slow_answer)
slow_pid = int(slow_answer["a"].get("server-pid", 0))
servers_seen.add(slow_pid)
check("the slow device serves its image", reads_back(slow_dir, slow_data))
check("the quick device serves its image", reads_back(quick_dir, quick_data))

# The slow device's server dies: its restart is as slow, and holds up
# no one either.
os.kill(slow_pid, signal.SIGKILL)
time.sleep(0.5)  # the restart is under way
other_dir, other_image, other_data = device("other")
a, took = timed(op="keep", dir=other_dir, image=other_image, threads=1)
check("a keep is answered while another device's server restarts",
      a.get("ok") == "1" and took < QUICK_S, f"{a} in {took:.2f} s")
servers_seen.add(mloopd_control.server_pid(other_dir))
a, took = timed(op="drop", dir=quick_dir)
check("a drop is answered while another device's server restarts",
      a.get("ok") == "1" and took < QUICK_S, f"{a} in {took:.2f} s")
wait_for("the slow device's next server",
         lambda: mloopd_control.server_pid(slow_dir) not in (0, slow_pid)
         and reads_back(slow_dir, slow_data), timeout=30)
servers_seen.add(mloopd_control.server_pid(slow_dir))
check("the slow device serves again after its restart", reads_back(slow_dir, slow_data))

# A planned restart of the slow device (`mloop resize` of an nbdkit
# device): its next server starts as slowly, the old one serving
# meanwhile, and no request waits for it.
before = mloopd_control.server_pid(slow_dir)
a, took = timed(op="restart", dir=slow_dir)
check("a planned restart is answered at once", a.get("ok") == "1" and took < QUICK_S,
      f"{a} in {took:.2f} s")
time.sleep(0.3)
a, took = timed(op="has", dir=other_dir)
check("a request is answered while a planned restart's server starts",
      a.get("ok") == "1" and took < QUICK_S, f"{a} in {took:.2f} s")
check("the old server serves while the next one starts", reads_back(slow_dir, slow_data))
a, took = timed(op="restart", dir=slow_dir)
check("a second planned restart meanwhile is answered at once", a.get("ok") == "1" and
      took < QUICK_S, f"{a} in {took:.2f} s")
wait_for("the planned restart's next server",
         lambda: mloopd_control.server_pid(slow_dir) not in (0, before), timeout=30)
servers_seen.add(mloopd_control.server_pid(slow_dir))
check("the next server serves after the planned restart", reads_back(slow_dir, slow_data))
wait_for("the old server to be gone", lambda: procstop.has_exited(before))

# Stopped (an upgrade) while a slow keep is under way: the keep is
# answered first, and the next mloopd takes its device over.
late_dir, late_image, late_data = device("slow-late")
slow_answer.clear()
late_keep = threading.Thread(target=lambda: slow_answer.update(
    a=ask(op="keep", dir=late_dir, image=late_image, threads=1)))
late_keep.start()
time.sleep(0.3)
mloopd.terminate()
late_keep.join()
check("a keep under way when mloopd is stopped is answered", slow_answer["a"].get("ok") == "1",
      slow_answer)
late_pid = int(slow_answer["a"].get("server-pid", 0))
servers_seen.add(late_pid)
check("mloopd, stopped, exits 0", mloopd.wait(timeout=30) == 0)
mloopd = start_mloopd()
check("the next mloopd takes the late device over, its server the same",
      late_dir in mloopd_control.kept(control) and
      mloopd_control.server_pid(late_dir) == late_pid and reads_back(late_dir, late_data))

for directory in (slow_dir, other_dir, late_dir):
    check(f"{os.path.basename(directory)} dropped",
          ask(op="drop", dir=directory).get("ok") == "1")
check("mloopd keeps nothing at the end", mloopd_control.kept(control) == set())
mloopd.terminate()
mloopd.wait(timeout=30)
harness.exit_if_failed()
