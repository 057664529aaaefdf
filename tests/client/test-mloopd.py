#!/usr/bin/python3
"""mloopd, the resident service, keeps many devices' servers in one
process, and what it keeps survives it.

On the host, with no kernel NBD client: mloopd keeps DEVICES directories
under its own runtime directory, each with mloop-server on an image of
its own, asked over its control socket as mloop asks it.  Each export is
read back by libnbd; a server killed is restarted by mloopd (its
replacement serves the same bytes); a planned restart replaces one; a
dropped device's server and socket are gone.  mloopd killed with SIGKILL
leaves the servers serving, and the next mloopd takes every recorded
device over (a server killed then is restarted by the new one); SIGTERM
lets go the same way.  Refusals: a peer that is not root, a directory
outside the runtime directory, one kept already, an unknown op, a
missing image, each one line.  The count of processes: one mloopd and
one server per device, no supervisor.  A remote export's device is
kept without a server and taken over the same way.

Root (mloopd answers root only; the non-root check runs as nobody).
About 5 s (standard tier, client suite)."""
import os
import resource
import signal
import subprocess
import time

import nbd

import harness
import mloopd_control
import procstop
from harness import check
from mloopd_control import wait_for

MLOOPD = os.environ["MLOOPD_BIN"]
DEVICES = 8
SIZE = 4 << 20
FDS_PER_DEVICE = 2
# mloopd's own: standard streams, its listener, the kernel log, glib's
# wakeups and the like, whatever the number of devices.
BASE_FDS = 12

if os.geteuid() != 0:
    harness.skip("mloopd answers root only")

d = harness.tmpdir()
run = os.path.join(d, "run")
control = os.path.join(run, "mloopd.sock")
env = dict(os.environ, MLOOP_RUNTIME_DIR=run)
servers_seen = set()
harness.on_exit(lambda: mloopd_control.kill(servers_seen))


def low_descriptor_limit():
    """Started, as from a shell or a unit, with a soft limit below the
    hard one, which mloopd raises."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


def start_mloopd():
    log = open(os.path.join(d, "mloopd.log"), "a")
    p = subprocess.Popen([MLOOPD], env=env, stdout=log, stderr=log,
                         preexec_fn=low_descriptor_limit)
    harness.kill_at_exit(p)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and p.poll() is None:
        if os.path.exists(control):
            try:
                ask(op="list")
                return p
            except OSError:
                pass
        time.sleep(0.02)
    raise AssertionError("mloopd did not listen: " + open(log.name).read())


def ask(**fields):
    return mloopd_control.ask(control, **fields)


def device_dir(i):
    return os.path.join(run, f"dev-{i}")


def server_pid(i):
    return mloopd_control.server_pid(device_dir(i))


def reads_back(i):
    h = nbd.NBD()
    try:
        h.connect_unix(os.path.join(device_dir(i), "sock"))
        ok = h.pread(SIZE, 0) == images[i][1]
        h.shutdown()
        return ok
    except nbd.Error:
        return False


mloopd = start_mloopd()
images = []
attaches = []     # each device's attach, under way for the test's life
for i in range(DEVICES):
    data = harness.pattern(SIZE, 40 + i)
    images.append((harness.make_image(SIZE, data), data))
    attaches.append(mloopd_control.attaching(device_dir(i)))
    a = ask(op="keep", dir=device_dir(i), server="native", image=images[i][0],
            threads=2)
    check(f"device {i} kept", a.get("ok") == "1" and int(a.get("server-pid", 0)) > 0, a)
    servers_seen.add(server_pid(i))
check("every export reads back its image", all(reads_back(i) for i in range(DEVICES)))
listed = set(ask(op="list").get("dirs", "").split("\n"))
check("list names every device", listed == {device_dir(i) for i in range(DEVICES)}, listed)

# What a device costs mloopd in descriptors: its server's pidfd and its
# log; the kernel's log and its announcements are read once per process.
base = mloopd_control.descriptors(mloopd.pid) - len(servers_seen) * FDS_PER_DEVICE
check("a kept device costs mloopd at most two descriptors",
      base <= BASE_FDS, f"{mloopd_control.descriptors(mloopd.pid)} descriptors for "
      f"{len(servers_seen)} devices: {mloopd_control.descriptor_kinds(mloopd.pid)}")
soft, hard = mloopd_control.descriptor_limit(mloopd.pid)
check("mloopd's soft descriptor limit is raised to the hard one", soft == hard,
      f"soft {soft}, hard {hard}")

children = subprocess.run(["pgrep", "-P", str(mloopd.pid)], capture_output=True,
                          text=True).stdout.split()
check("one process per device beside mloopd: its server", len(children) == DEVICES,
      children)

# A server killed: mloopd starts another, which serves the same bytes.
old = server_pid(3)
os.kill(old, signal.SIGKILL)
wait_for("a new server for device 3", lambda: server_pid(3) not in (0, old) and reads_back(3))
servers_seen.add(server_pid(3))
check("a killed server is restarted and serves the image", reads_back(3))

# A planned restart: a new server, the old one gone.
old = server_pid(4)
a = ask(op="restart", dir=device_dir(4))
check("restart answered", a.get("ok") == "1", a)
wait_for("device 4's next server", lambda: server_pid(4) not in (0, old))
servers_seen.add(server_pid(4))
check("the restarted device serves its image", reads_back(4))

# Refusals, each one line.
for name, fields, expect in [
        ("a directory outside the runtime directory",
         dict(op="keep", dir=d, image=images[0][0]), "is not a device's directory"),
        ("a directory kept already",
         dict(op="keep", dir=device_dir(0), image=images[0][0]), "is kept already"),
        ("no image", dict(op="keep", dir=device_dir(0)), "no image"),
        ("a bad number", dict(op="keep", dir=device_dir(0), image=images[0][0],
                              threads="many"), "threads=many is not a number"),
        ("an unknown op", dict(op="format"), "unknown op"),
        ("drop of a device not kept", dict(op="drop", dir=d), "is not kept here")]:
    a = ask(**fields)
    check(f"refused: {name}", "ok" not in a and expect in a.get("error", "")
          and "\n" not in a["error"], a)
attaches.append(mloopd_control.attaching(os.path.join(run, "dev-bad")))
a = ask(op="keep", dir=os.path.join(run, "dev-bad"), image=os.path.join(d, "missing.img"))
check("refused: an image that is not there, in the server's words",
      "ok" not in a and "missing.img" in a.get("error", ""), a)
check("a refused keep leaves no record", not os.path.exists(
    os.path.join(run, "dev-bad", "keep")))
nobody = subprocess.run(
    ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
     "import socket,sys; s=socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); "
     "s.connect(sys.argv[1]); s.send(b'op=list\\0'); print(s.recv(4096))", control],
    capture_output=True, text=True, timeout=30)
check("a peer that is not root is refused", "root only" in nobody.stdout or
      "Permission denied" in nobody.stderr, nobody.stdout + nobody.stderr)

# Drop: the server and its socket are gone, the record too.
old = server_pid(7)
a = ask(op="drop", dir=device_dir(7))
check("drop answered", a.get("ok") == "1", a)
check("a dropped device's server is gone", procstop.has_exited(old))
check("a dropped device's record is gone",
      not os.path.exists(os.path.join(device_dir(7), "keep")))
kept = DEVICES - 1

# SIGKILL: the servers serve on; the next mloopd takes them over.
before = {i: server_pid(i) for i in range(kept)}
mloopd.kill()
mloopd.wait()
check("with mloopd killed, every server serves on",
      all(reads_back(i) for i in range(kept)))
mloopd = start_mloopd()
listed = set(ask(op="list").get("dirs", "").split("\n"))
check("the next mloopd keeps every recorded device",
      listed == {device_dir(i) for i in range(kept)}, listed)
check("it took the running servers over, starting none",
      all(server_pid(i) == before[i] for i in range(kept)))
os.kill(before[1], signal.SIGKILL)
wait_for("device 1's server, restarted by the new mloopd",
         lambda: server_pid(1) not in (0, before[1]) and reads_back(1))
servers_seen.add(server_pid(1))
check("a server killed after the takeover is restarted", reads_back(1))

# SIGTERM (an upgrade): the same.
before = {i: server_pid(i) for i in range(kept)}
mloopd.terminate()
mloopd.wait(timeout=30)
check("with mloopd stopped, every server serves on",
      all(reads_back(i) for i in range(kept)))
mloopd = start_mloopd()
check("the next mloopd takes them over again",
      all(server_pid(i) == before[i] for i in range(kept)) and
      len(ask(op="list").get("dirs", "").split("\n")) == kept)

for i in range(kept):
    check(f"device {i} dropped", ask(op="drop", dir=device_dir(i)).get("ok") == "1")

# A remote export's device: kept at once (its keeper connects only to
# heal, and nothing is connected here), no server of ours, and taken
# over by the next mloopd like the others.
remote = os.path.join(run, "dev-remote")
attaches.append(mloopd_control.attaching(remote))
a = ask(op="keep", dir=os.path.join(run, "dev-bad"), remote="nbd:/no-host")
check("refused: a remote address that is not an NBD URI, one line",
      "ok" not in a and "\n" not in a.get("error", "x\n"), a)
a = ask(op="keep", dir=remote, remote="nbd://127.0.0.1:1/disk")
check("a remote export's device kept", a.get("ok") == "1", a)
a = ask(op="restart", dir=remote)
check("refused: a restart of a remote device, which has no server of ours",
      "no server of ours" in a.get("error", ""), a)
check("no process started for it",
      subprocess.run(["pgrep", "-P", str(mloopd.pid)], capture_output=True,
                     text=True).stdout.split() == [])
mloopd.kill()
mloopd.wait()
mloopd = start_mloopd()
check("the next mloopd keeps the remote device", mloopd_control.kept(control) == {remote},
      mloopd_control.kept(control))
check("remote device dropped", ask(op="drop", dir=remote).get("ok") == "1")
check("its record is gone", not os.path.exists(os.path.join(remote, "keep")))
# A server a killed mloopd started is no one's child here (its reaper,
# init, may be slow): a zombie has exited all the same.
check("no server is left", all(procstop.has_exited(p) for p in servers_seen if p > 0))
harness.terminate(mloopd)
harness.exit_if_failed()
