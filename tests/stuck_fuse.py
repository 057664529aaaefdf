"""A FUSE file whose server never answers one program's FLUSH
(tests/helpers/fuse-stuck-flush), mounted as a user's mount: every
close(2) that program makes of a descriptor of the file waits until the
server answers or goes.  Used by tests/client/test-dbus-stuck-close.py
and test-dbus-closers-full.py."""
import importlib.util
import os
import subprocess

import servicebus

FUSE_STUCK_FLUSH = os.environ.get("MLOOP_FUSE_STUCK_FLUSH", "")


def skip_unless_possible(skip):
    """Calls SKIP (harness.skip) with the reason when a test of callers
    passing a stuck FUSE file to mloop-dbus cannot run here."""
    if os.geteuid() != 0:
        skip("needs root: it mounts a FUSE file system and runs callers as users")
    if not os.path.exists("/dev/fuse"):
        skip("no /dev/fuse")
    if importlib.util.find_spec("gi") is None:      # dbus_call.py carrying: GDBus
        skip("no python3-gi")
    if not os.path.exists(FUSE_STUCK_FLUSH):
        skip(f"{FUSE_STUCK_FLUSH or 'fuse-stuck-flush'} is not built")


class StuckFuse:
    """fuse-stuck-flush mounted at WORK/NAME as USER's (a (name, uid,
    gid)) mount, its server never answering VICTIM's FLUSH (the name,
    comm, of the process)."""

    def __init__(self, work, name, user, victim="mloop-dbus"):
        self.mnt = os.path.join(work, name)
        os.mkdir(self.mnt)
        self.victim = victim
        self.log_path = os.path.join(work, name + ".log")
        self.server = subprocess.Popen(
            [FUSE_STUCK_FLUSH, self.mnt, str(user[1]), str(user[2]), victim],
            stderr=open(self.log_path, "w"))
        self.image = os.path.join(self.mnt, "disk.img")
        servicebus.poll_until(lambda: "serving" in self.log() or
                              self.server.poll() is not None, 10)
        if "serving" not in self.log():
            raise AssertionError("fuse-stuck-flush did not mount: " + self.log())

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stuck(self):
        """How many of the victim's FLUSHes wait unanswered."""
        return self.log().count(f"of {self.victim}: never answered")

    def service_stuck(self, count=1, timeout=10):
        """Whether COUNT of the victim's closes wait for this server
        (within TIMEOUT seconds)."""
        servicebus.poll_until(lambda: self.stuck() >= count, timeout)
        return self.stuck() >= count

    def close(self):
        """The server killed: the connection aborted, every FLUSH waiting
        on it fails, and the mount goes."""
        if self.server.poll() is None:
            self.server.kill()
        self.server.wait()
        subprocess.run(["umount", "-l", self.mnt], capture_output=True)
