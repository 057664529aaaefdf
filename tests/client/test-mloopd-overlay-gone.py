#!/usr/bin/python3
"""A device's overlay is made by its first server only: once the device
is in use, a server started for it again never makes an empty one.

A device kept with overlay=FILE has its first server make FILE when
there is none.  Every later start of its server finds the device in use
(on a real attach, a filesystem mounted on it): were FILE gone by then
(removed, renamed away) and made anew, empty, the device would suddenly
read the base where its writes were.  So each later start must refuse,
saying why in the device's log (supervisor.log), and make nothing at
FILE:

- a restart after the server's death (SIGKILL), for mloop-server and,
  when the plugin is built and nbdkit is installed, for nbdkit; with
  FILE there, the restart serves what was written (the control); FILE
  put back, the next try serves it again;
- a planned restart (op=restart, what `mloop resize` asks): the old
  server serves on, and the restart is recorded as failed;
- the next mloopd, whose device's server died while none ran;
- the next mloopd --serve=in-process, re-opening the device inside
  itself.

On the host, with no kernel NBD client: mloopd keeps device directories
under a runtime directory of its own, each attach held under way by its
directory's lock (tests/mloopd_control.py), and the test writes through
the device's socket with libnbd.

Root (mloopd answers root only).  About 4 s (standard tier, client
suite)."""
import os
import shutil
import signal

import nbd

import harness
import mloopd_control
from harness import check
from mloopd_control import wait_for

MLOOPD = os.environ["MLOOPD_BIN"]
SIZE = 4 << 20
WRITTEN = b"\x5a" * 8192
AT = 65536

if os.geteuid() != 0:
    harness.skip("mloopd answers root only")

d = harness.tmpdir()
run, control = mloopd_control.private_runtime(d)
env = dict(os.environ, MLOOP_RUNTIME_DIR=run)
log = os.path.join(d, "mloopd.log")
# After every mloopd is killed (on_exit runs the most recent first):
# the servers they left serving, by the runtime directory they name.
harness.on_exit(lambda: mloopd_control.kill(
    mloopd_control.processes_naming(run)))
attaches = []


def start(*options):
    p = mloopd_control.start([MLOOPD, *options], env, log, control)
    harness.kill_at_exit(p)
    return p


def sigkill(p):
    p.send_signal(signal.SIGKILL)
    p.wait()


def keep(name, server="native"):
    """A device NAME kept with an overlay not made yet: (its directory,
    its overlay's path)."""
    dev = os.path.join(run, name)
    attaches.append(mloopd_control.attaching(dev))
    overlay = os.path.join(d, f"{name}.overlay")
    image = harness.make_image(SIZE, harness.pattern(SIZE, len(attaches)))
    a = mloopd_control.ask(control, op="keep", dir=dev, server=server,
                           image=image, overlay=overlay)
    check(f"{name}: kept with an overlay", a.get("ok") == "1", a)
    check(f"{name}: its first server made the overlay",
          os.path.isfile(overlay))
    return dev, overlay


def read_back(dev):
    """What the device's export holds at AT, or None when it serves
    nothing."""
    try:
        h = nbd.NBD()
        h.connect_unix(os.path.join(dev, "sock"))
        data = h.pread(len(WRITTEN), AT)
        h.shutdown()
        return data
    except nbd.Error:
        return None


def write(dev):
    h = nbd.NBD()
    h.connect_unix(os.path.join(dev, "sock"))
    h.pwrite(WRITTEN, AT, nbd.CMD_FLAG_FUA)
    h.shutdown()


def device_log(dev):
    try:
        with open(os.path.join(dev, "supervisor.log"), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def says_gone(dev, overlay, after=0):
    """Whether the device's log, from byte AFTER on, says FILE is gone."""
    return f"the overlay {overlay} is gone" in device_log(dev)[after:]


def server_of(dev):
    """The live server in the device's pid file, or 0."""
    pid = mloopd_control.server_pid(dev)
    return pid if pid and mloopd_control.alive(pid) else 0


def refused(what, dev, overlay, after=0, timeout=15):
    """The checks of a later start with the overlay gone."""
    try:
        wait_for("the refusal in the device's log",
                 lambda: says_gone(dev, overlay, after), timeout=timeout)
        said = True
    except AssertionError:
        said = False
    check(f"{what}: no overlay made anew at its path",
          not os.path.exists(overlay), "an empty one serves the base's bytes")
    check(f"{what}: the device's log says why", said,
          device_log(dev)[after:][-600:])


def restart_after_death(server):
    name = f"dev-{server}"
    dev, overlay = keep(name, server)
    write(dev)
    first = server_of(dev)
    os.kill(first, signal.SIGKILL)
    wait_for("the server restarted", lambda: server_of(dev) not in (0, first))
    check(f"{name}: a restart with the overlay there serves what was "
          "written", read_back(dev) == WRITTEN)
    aside = overlay + ".aside"
    os.rename(overlay, aside)
    mark = len(device_log(dev))
    os.kill(server_of(dev), signal.SIGKILL)
    refused(f"{name}: a restart with the overlay renamed away", dev, overlay,
            mark)
    check(f"{name}: no server serves the device meanwhile",
          read_back(dev) is None)
    os.rename(aside, overlay)
    try:
        wait_for("a restart with the overlay back",
                 lambda: read_back(dev) == WRITTEN, timeout=20)
        back = True
    except AssertionError:
        back = False
    check(f"{name}: the overlay put back, the next try serves it", back,
          device_log(dev)[-600:])
    a = mloopd_control.ask(control, op="drop", dir=dev)
    check(f"{name}: dropped", a.get("ok") == "1", a)


mloopd = start()

# --- A restart after the server's death -------------------------------
restart_after_death("native")
if (shutil.which("nbdkit") and
        os.path.exists(os.path.join(os.path.dirname(MLOOPD), "..", "plugin",
                                    "nbdkit-mloop-plugin.so"))):
    restart_after_death("nbdkit")
else:
    print("# nbdkit or the plugin missing: its restart not checked")

# --- A planned restart -------------------------------------------------
dev, overlay = keep("dev-planned")
write(dev)
first = server_of(dev)
os.rename(overlay, overlay + ".aside")
mark = len(device_log(dev))
a = mloopd_control.ask(control, op="restart", dir=dev)
check("dev-planned: restart asked", a.get("ok") == "1", a)
refused("dev-planned: a planned restart with the overlay renamed away", dev,
        overlay, mark)
check("dev-planned: the old server serves on, through the overlay it holds",
      server_of(dev) == first and read_back(dev) == WRITTEN)
check("dev-planned: dropped",
      mloopd_control.ask(control, op="drop", dir=dev).get("ok") == "1")

# --- The next mloopd, the server dead meanwhile -----------------------
dev, overlay = keep("dev-taken")
write(dev)
first = server_of(dev)
sigkill(mloopd)
os.kill(first, signal.SIGKILL)
wait_for("the server gone", lambda: not mloopd_control.alive(first))
os.rename(overlay, overlay + ".aside")
mark = len(device_log(dev))
mloopd = start()
refused("dev-taken: the next mloopd's server with the overlay renamed away",
        dev, overlay, mark)
check("dev-taken: no server serves the device", read_back(dev) is None)
sigkill(mloopd)
mloopd_control.kill(mloopd_control.processes_naming(dev))
shutil.rmtree(dev)                      # forgotten by the next mloopd

# --- The next mloopd serving inside itself ----------------------------
mloopd = start("--serve=in-process")
dev, overlay = keep("dev-hosted")
write(dev)
sigkill(mloopd)
os.rename(overlay, overlay + ".aside")
mark = len(device_log(dev))
mloopd = start()
refused("dev-hosted: the next mloopd's re-open with the overlay renamed "
        "away", dev, overlay, mark)
check("dev-hosted: nothing serves the device", read_back(dev) is None)
harness.terminate(mloopd)
harness.exit_if_failed()
