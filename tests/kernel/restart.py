"""Helpers for the supervision tests (mloop attach kinds only): kill a
device's server and wait for its supervisor to bring the device back."""
import json
import os
import signal
import time

from kfix import wait_until


def attach(kind, cl, image, timeout):
    """Attaches with a short request timeout (also the dead-connection
    timeout): requests in flight on a killed server are requeued when it
    expires, and a device without a server fails after it."""
    return kind.attach(cl, image, args=kind.attach_args(image) + ["--timeout", str(timeout)])


def status(kind, dev):
    return json.loads(kind.cli("status", "--json", dev).stdout)


def kill_server(kind, dev, timeout=30):
    """SIGKILLs DEV's server, waits until the supervisor has a new one
    serving the device, and returns the seconds that took."""
    before = status(kind, dev)
    pid = before["device"]["server_pid"]
    assert before["server_running"], f"{dev}: server pid {pid} not running before the kill"
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()

    def back():
        s = status(kind, dev)
        return (s["restarts"] > before["restarts"] and s["server_running"]
                and s["device"]["server_pid"] != pid
                and s.get("connections_open") == kind.queues)
    wait_until(back, f"{dev}'s server to be restarted and reconnected", timeout)
    return time.monotonic() - start
