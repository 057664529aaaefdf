"""The server protects itself against the local-NBD memory deadlock: the
threads that do the device's IO carry PR_SET_IO_FLUSHER (the kernel shows
it as PF_MEMALLOC_NOIO and PF_LOCAL_THROTTLE in the task flags) — the
guest's root has CAP_SYS_RESOURCE, unlike this project's build hosts."""
import mmap
import os

from kfix import make_image
from restart import status

PF_MEMALLOC_NOIO = 0x00080000
PF_LOCAL_THROTTLE = 0x00100000


def flusher_threads(pid):
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            # Field 9 (flags), counted after the ")" that ends the name.
            flags = int(f.read().rsplit(")", 1)[1].split()[6])
        if flags & PF_MEMALLOC_NOIO and flags & PF_LOCAL_THROTTLE:
            n += 1
    return n


def run_test(kind, cl):
    image = make_image(cl, fill=4 << 20)
    dev = kind.attach(cl, image).device
    # Traffic first: nbdkit's threads mark themselves on their first request.
    buf = mmap.mmap(-1, 1 << 20)
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    try:
        for i in range(4):
            os.preadv(fd, [buf], i << 20)
    finally:
        os.close(fd)
    pid = status(kind, dev)["device"]["server_pid"]
    n = flusher_threads(pid)
    # mloop-server: its main thread and every event-loop worker (4).
    want = 5 if kind.server == "native" else 1
    assert n >= want, f"{n} threads of server pid {pid} are IO flushers, expected >= {want}"
    print(f"# {n} IO-flusher threads in the {kind.server} server", flush=True)
