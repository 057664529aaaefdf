"""A client that hangs up with replies queued cannot take a device down.

Debian 12's nbdkit (1.32.5; fixed upstream in 1.33.10) aborts with
"raw_send_socket: Assertion `sock >= 0' failed" when a client sends
pipelined reads, then a request with a bad magic, and closes: every
connection of that nbdkit dies with it, the kernel's included.  A hostile
client that can reach the device's private socket
(/run/mloop/dev-*/sock) does exactly that here, while a writer keeps
writing to the device.  With --server nbdkit the supervisor must restart
nbdkit and reconnect the kernel (if this nbdkit does abort); with the
native server, the server must not die at all.  Either way the writer
sees no error and every byte written reads back equal, through the device
and in the image."""
import hashlib
import os
import struct
import subprocess
import sys
import time

from kfix import COMMAND_TIMEOUT, make_image, tmpdir, wait_until
from restart import attach, status, kill_mark

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "native"))
import nbdwire  # noqa: E402

TIMEOUT = 10       # the device's request timeout (see restart.attach)
READS = 64         # pipelined reads before the bad request
READ_SIZE = 64 << 10
ATTEMPTS = 20      # the abort is a race in nbdkit; each try varies the delay
NATIVE_ATTEMPTS = 5  # mloop-server must survive every one
DATA = 32 << 20    # written through the device meanwhile


def hostile(sock, delay):
    """64 pipelined reads, DELAY seconds, a request with a bad magic, close."""
    w = None
    try:
        w = nbdwire.Wire(sock)
        w.greeting()
        w.go()
        w.s.sendall(b"".join(
            struct.pack(">IHHQQI", nbdwire.REQ_MAGIC, 0, nbdwire.CMD_READ, i,
                        i * READ_SIZE, READ_SIZE) for i in range(READS)))
        time.sleep(delay)
        w.s.sendall(struct.pack(">IHHQQI", 0xBADC0FFE, 0, nbdwire.CMD_READ, READS, 0, 4096))
    except (OSError, EOFError, AssertionError):
        pass  # a server that hangs up first, or is down, is fine
    finally:
        if w is not None:
            w.close()


def run_test(kind, cl):
    if getattr(kind, "server", None) not in ("nbdkit", "native"):
        raise AssertionError(f"kind {kind.name} has no mloop supervisor")
    image = make_image(cl)
    att = attach(kind, cl, image, TIMEOUT)
    dev = att.device
    before = status(kind, dev)
    sock = before["device"]["socket"]
    d = tmpdir(cl)
    data = os.path.join(d, "data")
    with open(data, "wb") as f:
        f.write(os.urandom(DATA))
    want = hashlib.sha256(open(data, "rb").read()).hexdigest()
    writer = subprocess.Popen(["dd", f"if={data}", f"of={dev}", "bs=64k", "oflag=direct",
                               "conv=fsync", "status=none"], stderr=subprocess.PIPE, text=True)
    cl.push(lambda: writer.poll() is None and (writer.kill(), writer.wait()))

    aborted, tries = False, 0
    for tries in range(1, (ATTEMPTS if kind.server == "nbdkit" else NATIVE_ATTEMPTS) + 1):
        pid = status(kind, dev)["device"]["server_pid"]
        if kind.server == "nbdkit":
            kill_mark(dev, pid)  # a deliberate kill: see restart.kill_mark
        hostile(sock, 0.05 * (1 + tries % 5))
        time.sleep(1)
        now = status(kind, dev)
        if (now["restarts"] > before["restarts"] or not now["server_running"]
                or now["device"]["server_pid"] != pid):
            aborted = True
            break

    if kind.server == "native":
        assert not aborted, f"mloop-server died on a hostile client: {now['last_failure']}"
    if aborted:
        def back():
            s = status(kind, dev)
            return (s["restarts"] > before["restarts"] and s["server_running"]
                    and s.get("connections_open") == kind.queues)
        wait_until(back, f"{dev}'s server to be restarted and reconnected", timeout=60)
        print(f"# {kind.server} aborted on try {tries}; restarted: "
              f"{status(kind, dev)['last_failure']}", flush=True)
    else:
        print(f"# {kind.server} survived {tries} hostile clients", flush=True)

    _, err = writer.communicate(timeout=COMMAND_TIMEOUT)
    assert writer.returncode == 0, f"dd to {dev} failed: {err.strip()}"
    got = subprocess.run(["dd", f"if={dev}", "bs=64k", f"count={DATA // 65536}",
                          "iflag=direct", "status=none"], capture_output=True,
                         timeout=COMMAND_TIMEOUT, check=True).stdout
    assert hashlib.sha256(got).hexdigest() == want, \
        "the data read back through the device differs from what was written"
    att.detach()
    with open(image, "rb") as f:
        assert hashlib.sha256(f.read(DATA)).hexdigest() == want, \
            "the image differs from what was written through the device"
