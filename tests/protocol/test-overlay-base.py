#!/usr/bin/python3
"""An overlay knows the base it was made for, and holds that base.

Identity: an overlay made over one image is refused over another image
of the same size, in one line naming both, and over its base written at
either end since; it is served over a copy of
its base (another file, another inode, same bytes), and over the other
image when overlay-adopt-base is given, which records it as the base.

An overlay in the first format (version 1, no identity recorded, its
base's path as the server was given it) is still served over any image
of its base's size, as before, and stays in that format unless
overlay-adopt-base records the image.

Locking: while a server serves an overlay, its base is locked shared,
so an exclusive lock (what `mloop overlay commit` takes to merge) fails;
a read-only server on the same base runs beside it; the lock goes with
the server.  For nbdkit the server also daemonizes (it forks after
opening the base): the child must keep the lock.

Creation: two servers starting on one new overlay at once never both
serve it.  The first is held (strace delays its rename or link of the
new file into place by 3 s) while the second makes the overlay and
serves it; the first must then be refused, not replace the second's
file.

Cost: about 5 s native, 8.5 s nbdkit, 3 s of each the race's delay
(standard tier, protocol suite)."""
import errno
import fcntl
import os
import shutil
import signal
import subprocess
import time

import harness
from harness import check

MIB = 1 << 20
SIZE = 4 * MIB

if harness.STORE != "file":
    harness.skip("an overlay's base is a local file")

d = harness.tmpdir()
base = harness.make_image(SIZE, harness.pattern(SIZE, 5))
other = harness.make_image(SIZE, harness.pattern(SIZE, 6))
copy = os.path.join(d, "copy.img")
shutil.copyfile(base, copy)


def start(image, overlay, adopt=False):
    params = [f"overlay={overlay}"]
    if adopt:
        # mloop-server spells the flag without a value.
        params.append("overlay-adopt-base=on" if harness.SERVER_KIND == "nbdkit"
                      else "overlay-adopt-base")
    return harness.Server(image, params)


def refused(image, overlay, want):
    try:
        srv = start(image, overlay)
    except RuntimeError as e:
        msg = str(e).strip().splitlines()
        lines = [l for l in msg if want in l]
        check(f"{os.path.basename(image)} refused: {want}", len(lines) == 1, str(e))
        return str(e)
    srv.stop()
    check(f"{os.path.basename(image)} refused: {want}", False, "it started")
    return ""


def base_locked_exclusively(path):
    """Whether another holder keeps an exclusive lock off PATH."""
    # The servers' lock is an open file description lock (fileio.h);
    # a POSIX write lock conflicts with it, and needs PATH open for
    # writing, as the merge's exclusive lock does.
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return True
    finally:
        os.close(fd)


# ---- identity ----
ov = os.path.join(d, "a.overlay")
srv = start(base, ov)
h = srv.connect(strict=False)
h.pwrite(b"\xaa" * 4096, 8192)
h.flush()
check("the base is locked while served with an overlay",
      base_locked_exclusively(base))
ro = harness.Server(base, [], nbdkit_args=["-r"])
hro = ro.connect()
check("a read-only server shares the base with the overlay's",
      hro.pread(512, 0) == harness.pattern(SIZE, 5)[:512])
hro.shutdown()
ro.stop()
h.shutdown()
srv.stop()
check("the lock goes with the server", not base_locked_exclusively(base))

msg = refused(other, ov, "was made for")
check("the refusal names both bases", base in msg and other in msg, msg)

srv = start(copy, ov)
h = srv.connect(strict=False)
check("a copy of the base serves the overlay", h.pread(4096, 8192) == b"\xaa" * 4096)
h.shutdown()
srv.stop()
# The copy is its base now; written at one end since, it is refused.
with open(copy, "r+b") as f:
    f.write(b"\x01" * 512)
refused(copy, ov, "was written since the overlay was made")

srv = start(other, ov, adopt=True)
h = srv.connect(strict=False)
check("overlay-adopt-base serves it over another image",
      h.pread(4096, 8192) == b"\xaa" * 4096 and
      h.pread(4096, 0) == harness.pattern(SIZE, 6)[:4096])
h.shutdown()
srv.stop()
try:
    srv = start(other, ov)
    srv.stop()
    check("the adopted image is now its base", True)
except RuntimeError as e:
    check("the adopted image is now its base", False, str(e))
refused(base, ov, "was made for")

# ---- the first format: no identity ----
def header_version(path):
    with open(path, "rb") as f:
        return int.from_bytes(f.read(12)[8:12], "little")


def make_version_1(path):
    """Rewrites PATH's header as the first format wrote it."""
    with open(path, "r+b") as f:
        h = bytearray(f.read(4096))
        h[8:12] = (1).to_bytes(4, "little")
        h[48:4096] = bytes(4096 - 48)
        h[64:72] = b"disk.img"
        f.seek(0)
        f.write(h)


old = os.path.join(d, "old.overlay")
srv = start(base, old)
h = srv.connect(strict=False)
h.pwrite(b"\xbb" * 4096, 0)
h.flush()
h.shutdown()
srv.stop()
check("a new overlay has format version 2", header_version(old) == 2)
make_version_1(old)
srv = start(other, old)
h = srv.connect(strict=False)
check("a version 1 overlay is served over an image of its size",
      h.pread(4096, 0) == b"\xbb" * 4096 and
      h.pread(4096, 4096) == harness.pattern(SIZE, 6)[4096:8192])
h.shutdown()
srv.stop()
check("and stays version 1", header_version(old) == 1)
srv = start(base, old, adopt=True)
srv.stop()
check("adopting its base records it (version 2)", header_version(old) == 2)
refused(other, old, "was made for")

# ---- a daemonized nbdkit keeps the lock after its fork ----
if harness.SERVER_KIND == "nbdkit":
    sock = os.path.join(d, "daemon.sock")
    pidfile = os.path.join(d, "daemon.pid")
    p = subprocess.run(["nbdkit", "-U", sock, "-P", pidfile, harness.PLUGIN,
                        f"file={base}", f"overlay={os.path.join(d, 'd.overlay')}"],
                       env=harness.nbdkit_env(), capture_output=True, text=True,
                       timeout=30)
    deadline = time.time() + 10
    while p.returncode == 0 and not os.path.exists(pidfile) and time.time() < deadline:
        time.sleep(0.05)
    pid = int(open(pidfile).read()) if os.path.exists(pidfile) else None

    def stop_daemon():
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    harness.on_exit(stop_daemon)
    check("nbdkit daemonized", p.returncode == 0 and pid, p.stderr)
    check("its child holds the base's lock", base_locked_exclusively(base))
    stop_daemon()
    for _ in range(200):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.05)
    pid = None
    if os.path.exists(sock):
        os.unlink(sock)

# ---- two servers making one overlay at once ----
race = os.path.join(d, "race.overlay")
logs = []


def command(image, sockname):
    sock = os.path.join(d, sockname + ".sock")
    pid = os.path.join(d, sockname + ".pid")
    if harness.SERVER_KIND == "native":
        cmd = [harness.SERVER_BIN, "--listen", f"unix:{sock}", "--pid-file", pid,
               f"--overlay={race}", image]
        env = dict(os.environ)
    else:
        cmd = ["nbdkit", "-f", "-U", sock, "-P", pid, harness.PLUGIN,
               f"file={image}", f"overlay={race}"]
        env = harness.nbdkit_env()
    return cmd, env, pid, sock


def spawn(cmd, env, name):
    log = open(os.path.join(d, name + ".log"), "w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    harness.on_exit(lambda: harness.terminate(proc))
    logs.append(log)
    return proc, log


if shutil.which("strace") is None:
    print("note: no strace: the creation race is left out")
else:
    calls = "rename,renameat,renameat2,link,linkat"
    cmd_a, env_a, pid_a, sock_a = command(base, "first")
    cmd_b, env_b, pid_b, sock_b = command(base, "second")
    a, log_a = spawn(["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={calls}",
                      "-e", f"inject={calls}:delay_enter=3000000"] + cmd_a,
                     harness.traced_env(env_a), "first")
    # The first has written its new file and waits to put it in place.
    deadline = time.time() + 20
    while not any(n.startswith("race.overlay.") for n in os.listdir(d)):
        if time.time() >= deadline or a.poll() is not None:
            break
        time.sleep(0.02)
    check("the first server makes its new overlay",
          any(n.startswith("race.overlay.") for n in os.listdir(d)))
    b, log_b = spawn(cmd_b, env_b, "second")
    deadline = time.time() + 20
    while not os.path.exists(pid_b) and b.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    check("the second server serves the overlay", os.path.exists(pid_b))
    try:
        a.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    log_a.seek(0)
    text_a = log_a.read()
    check("the first server is refused, not serving a replaced file",
          a.returncode not in (None, 0) and "in use by another server" in text_a,
          f"exit {a.returncode}: {text_a}")
    check("no new file is left behind",
          not [n for n in os.listdir(d) if n.startswith("race.overlay.")],
          str(os.listdir(d)))
    for p in (a, b):
        harness.terminate(p)
    for s in (sock_a, sock_b):
        if os.path.exists(s):
            os.unlink(s)

harness.exit_if_failed()
print("ok")
