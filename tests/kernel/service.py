"""mloopd, the resident service, run by hand in a kind's runtime
directory (where `mloop` looks for its socket): started, killed, started
again and stopped.  For test-service-attach.py and the service kind
(kinds.py), which runs every test of its groups through one mloopd;
for_test gives the mloopd tests of that group run beside."""
import os
import subprocess
import sys

from kfix import Skip, tmpdir, wait_until

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import mloopd_control  # noqa: E402

MLOOPD = os.environ.get("MLOOPD_BIN")


class Service:
    """mloopd in KIND's runtime directory, logging to LOG."""

    def __init__(self, kind, log, options=()):
        self.env = kind.env()
        self.options = list(options)
        self.sock = os.path.join(kind.runtime_dir, "mloopd.sock")
        self.log = log
        self.proc = None

    def start(self, extra_env=None):
        """Starts mloopd, with EXTRA_ENV (a dict) added to its environment."""
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen([MLOOPD] + self.options, env=dict(self.env, **(extra_env or {})),
                                         stdout=log, stderr=log)
        wait_until(self.listening, "mloopd to listen")

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def listening(self):
        try:
            return mloopd_control.ask(self.sock, op="list").get("ok") == "1"
        except OSError:
            return False

    def kept(self):
        return mloopd_control.kept(self.sock)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.running():
            self.proc.terminate()
            self.proc.wait(timeout=60)
        if os.path.exists(self.sock):
            os.unlink(self.sock)


def for_test(kind, cl):
    """The mloopd a test of mloopd runs with: the service kind's own, or,
    for the other `mloop attach` kinds of NBD devices (native, nbdkit),
    one started in KIND's runtime directory and stopped by CL; a Skip
    for the rest."""
    if getattr(kind, "service", None):
        return kind.service
    if getattr(kind, "server", None) not in ("native", "nbdkit") or not hasattr(kind, "env"):
        raise Skip("mloopd keeps the NBD devices of `mloop attach`")
    if not MLOOPD or not os.path.exists(MLOOPD):
        raise Skip("mloopd is not built")
    kind.env()  # names the runtime directory
    os.makedirs(kind.runtime_dir, mode=0o700, exist_ok=True)
    service = Service(kind, os.path.join(tmpdir(cl), "mloopd.log"))
    cl.push(service.stop)
    service.start()
    return service
