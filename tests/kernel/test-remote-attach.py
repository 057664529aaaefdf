"""A remote export becomes a device: `mloop serve` (this kind's server)
on 127.0.0.1 over TCP, `mloop attach nbd://127.0.0.1:PORT/NAME` with four
connections (the export advertises multi-conn), data written through the
device lands in the served image; detach leaves the server serving."""
import mmap
import os
import socket
import subprocess
import time

from kfix import CONNECTIONS, make_image, sysfs, wait_until
import kinds


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_test(kind, cl):
    image = make_image(cl)
    port = free_port()
    serve = subprocess.Popen([kinds.CLI, "serve", image, "--listen", f"tcp:127.0.0.1:{port}",
                              "--export-name", "disk", "--server", kind.server],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=kind.env())
    cl.push(lambda: serve.poll() is None and (serve.terminate(), serve.wait()))

    def listening():
        assert serve.poll() is None, f"mloop serve exited: {serve.stderr.read()}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
    wait_until(listening, "mloop serve to listen", timeout=60)

    uri = f"nbd://127.0.0.1:{port}/disk"
    p = kind.cli("attach", uri, "--connections", str(CONNECTIONS), "--timeout", "300")
    dev = p.stdout.strip()

    def undo():
        if sysfs(dev, "pid") is not None:
            kind.cli("detach", dev)
    cl.push(undo)
    queues = len(os.listdir(f"/sys/block/{os.path.basename(dev)}/mq"))
    assert queues == CONNECTIONS, f"{dev} has {queues} hardware queues, expected {CONNECTIONS}"
    kind.assert_kept(dev)
    listed = [d for d in __import__("json").loads(kind.cli("list", "--json").stdout)
              if d["device"] == dev]
    assert listed and listed[0]["file"] == uri and listed[0]["server"] == "remote", listed

    data = mmap.mmap(-1, 1 << 20)
    data.write(os.urandom(1 << 20))
    fd = os.open(dev, os.O_RDWR | os.O_DIRECT)
    try:
        os.pwritev(fd, [data], 3 << 20)
        os.fsync(fd)
    finally:
        os.close(fd)
    with open(image, "rb") as f:
        f.seek(3 << 20)
        assert f.read(1 << 20) == data[:], "data written through the device is not in the image"

    kind.cli("detach", uri)
    wait_until(lambda: sysfs(dev, "pid") is None, f"{dev} to disconnect")
    time.sleep(0.5)
    assert serve.poll() is None, "detaching a remote device stopped the remote server"
    serve.terminate()
    serve.wait(timeout=30)
