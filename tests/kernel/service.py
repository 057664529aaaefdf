"""mloopd, the resident service, run by hand in a kind's runtime
directory (where `mloop` looks for its socket): started, killed, started
again and stopped.  For test-service-attach.py and the service kind
(kinds.py), which runs every test of its groups through one mloopd."""
import os
import subprocess
import sys

from kfix import wait_until

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import mloopd_control  # noqa: E402

MLOOPD = os.environ.get("MLOOPD_BIN")


class Service:
    """mloopd in KIND's runtime directory, logging to LOG."""

    def __init__(self, kind, log):
        self.env = kind.env()
        self.sock = os.path.join(kind.runtime_dir, "mloopd.sock")
        self.log = log
        self.proc = None

    def start(self, extra_env=None):
        """Starts mloopd, with EXTRA_ENV (a dict) added to its environment."""
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen([MLOOPD], env=dict(self.env, **(extra_env or {})),
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
