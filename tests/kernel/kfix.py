"""Fixtures for the kernel tests: commands, images, sysfs, and a cleanup
stack that undoes everything a test set up, in reverse order, even when the
test failed.

These tests run as root where a kernel NBD client exists: inside the test
VM (tests/vm) or natively.  Paths come from the environment, set by
tests/meson.build and passed on by run-kernel-tests:
  MLOOP_SERVER_BIN  the built mloop-server
  MLOOP_PLUGIN      the built nbdkit-mloop-plugin.so
  MLOOP_CLI         the built mloop (build/client/mloop)
  TMPDIR            where images go: it must take O_DIRECT (not tmpfs)
"""
import hashlib
import os
import random
import shutil
import subprocess
import tempfile
import time

# Under TCG a request can take seconds, so this is generous; but it stays
# well under COMMAND_TIMEOUT: the nbdkit stall described in
# run-kernel-tests (a request unanswered until the kernel requeues it) then
# costs a minute instead of failing the test by timeout.  A timeout is
# still reported by the kernel-log check.
DEVICE_TIMEOUT = 60
# How long any one command may take before the test fails instead of hanging.
COMMAND_TIMEOUT = 240
IMAGE_SIZE = 256 << 20
CONNECTIONS = 4
BLOCK_SIZE = 4096


class Skip(Exception):
    """Raised by a test that cannot run here; the message says why."""


def run(cmd, check=True, timeout=COMMAND_TIMEOUT, **kw):
    """Runs CMD capturing text output; raises AssertionError, with its
    stderr, when CHECK and it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}: "
                             f"{(p.stderr or p.stdout).strip()}")
    return p


class Cleanup:
    """A stack of undo actions, run most recent first when the `with`
    block ends.  Every action runs even if an earlier one failed; a failed
    action fails the test (it may have left something behind)."""

    def __init__(self):
        self.actions = []

    def push(self, fn, *args):
        self.actions.append((fn, args))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        errors = []
        while self.actions:
            fn, args = self.actions.pop()
            try:
                fn(*args)
            except Exception as e:
                errors.append(f"cleanup {getattr(fn, '__name__', fn)}: {e}")
        if errors and exc is None:
            raise AssertionError("; ".join(errors))
        return False


def tmpdir(cl):
    d = tempfile.mkdtemp(prefix="mloop-ktest-")
    cl.push(shutil.rmtree, d, True)
    return d


def make_image(cl, size=IMAGE_SIZE, fill=0, seed=1):
    """A sparse image of SIZE bytes whose first FILL bytes are random
    (seeded, so misplaced data cannot match); synced so O_DIRECT readers
    see it."""
    path = os.path.join(tmpdir(cl), "disk.img")
    rng = random.Random(seed)
    with open(path, "wb") as f:
        left = fill
        while left:
            n = min(left, 1 << 20)
            f.write(rng.randbytes(n))
            left -= n
        f.truncate(size)
        os.fsync(f.fileno())
    return path


def digest(path, offset=0, length=None):
    """sha256 of LENGTH bytes of PATH from OFFSET (to the end if None)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = length
        while left is None or left > 0:
            n = 1 << 20 if left is None else min(left, 1 << 20)
            block = f.read(n)
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


def file_digests(directory):
    """The sha256 of each regular file in DIRECTORY, by name."""
    got = {}
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                got[name] = hashlib.sha256(f.read()).hexdigest()
    return got


def sysfs(dev, attr):
    """/sys/block/<name>/ATTR for DEV (/dev/nbd0), stripped; None if absent."""
    try:
        with open(f"/sys/block/{os.path.basename(dev)}/{attr}") as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def wait_until(pred, what, timeout=30):
    """Polls PRED until it is true; fails the test, saying WHAT was
    awaited, after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def nbd_in_use(dev):
    """Whether the kernel has a connected nbd device DEV."""
    return sysfs(dev, "pid") is not None or sysfs(dev, "size") not in ("0", None)


def free_nbd():
    """The first /dev/nbdN with nothing connected."""
    for n in range(64):
        dev = f"/dev/nbd{n}"
        if os.path.exists(f"/sys/block/nbd{n}") and not nbd_in_use(dev):
            return dev
    raise AssertionError("no free /dev/nbdN")


def processes_mentioning(text):
    """(pid, command line) of every process whose command line contains TEXT."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # exited meanwhile
        if text in cmdline:
            found.append((int(pid), cmdline.strip()))
    return found


def mount(cl, dev, options=None):
    """Mounts DEV (ext4) at a fresh directory, unmounted by CL."""
    mnt = tmpdir(cl)
    cmd = ["mount", "-t", "ext4"] + (["-o", options] if options else []) + [dev, mnt]
    run(cmd)
    cl.push(_umount, mnt)
    return mnt


def reattach_clean(kind, cl, image):
    """Attaches IMAGE again, fails the test unless fsck -fn finds its ext4
    clean, and returns where it is mounted read-only."""
    att = kind.attach(cl, image)
    fsck = run(["fsck.ext4", "-fn", att.device], check=False)
    assert fsck.returncode == 0, f"fsck -fn exit {fsck.returncode}: {fsck.stdout}{fsck.stderr}"
    return mount(cl, att.device, "ro")


def _umount(mnt):
    if os.path.ismount(mnt):
        run(["umount", mnt])
