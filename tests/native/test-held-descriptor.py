"""mloop-server given a name of one of its descriptors (/proc/self/fd/3,
the way mloop's D-Bus service hands a caller's image on) serves that
open file as it was opened, never a reopen of it with the server's own
rights: a descriptor opened read-only is served read-only though the
server runs as root and the file is root's to write, and what is served
is exactly the open file's data, whether the file needs a page-cache
tail (odd size) or not.  A descriptor that is not open is a one-line
error.  Native server only; about 1 s."""
import os
import subprocess
import time

import harness
from harness import check

import nbd

SERVER = os.environ.get("MLOOP_SERVER_BIN", "")


def serve_descriptor(fd, sock, *options):
    """mloop-server serving FD as its descriptor 3, by that name."""
    p = subprocess.Popen([SERVER, "--listen", f"unix:{sock}", *options, "/proc/self/fd/3"],
                         pass_fds=(fd,), preexec_fn=lambda: os.dup2(fd, 3),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    harness.on_exit(lambda: harness.terminate(p))
    deadline = time.monotonic() + 20
    while not os.path.exists(sock):
        if p.poll() is not None or time.monotonic() > deadline:
            return p, None
        time.sleep(0.02)
    h = nbd.NBD()
    h.connect_unix(sock)
    return p, h


def main():
    if not SERVER:
        harness.skip("MLOOP_SERVER_BIN is not set")
    d = harness.tmpdir()
    data = os.urandom((1 << 20) + 1000)        # odd size: a page-cache tail
    for size, name in ((1 << 20, "even.img"), (len(data), "odd.img")):
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(data[:size])

        # Opened read-only: served read-only, though root could write it.
        os.chmod(path, 0o444)
        fd = os.open(path, os.O_RDONLY)
        p, h = serve_descriptor(fd, os.path.join(d, f"ro-{name}.sock"))
        os.close(fd)
        check(f"{name}: a read-only descriptor is served", h is not None,
              p.stderr.read() if h is None else "")
        if h is None:
            continue
        check(f"{name}: a read-only descriptor is served read-only", h.is_read_only() == 1,
              f"is_read_only() = {h.is_read_only()}")
        check(f"{name}: the data served is the open file's", h.pread(size, 0) == data[:size])
        h.shutdown()
        harness.terminate(p)

        # Opened read-write: written through the same open file.
        os.chmod(path, 0o644)
        fd = os.open(path, os.O_RDWR)
        p, h = serve_descriptor(fd, os.path.join(d, f"rw-{name}.sock"))
        os.close(fd)
        new = bytes(reversed(data[:size]))
        h.pwrite(new, 0)
        h.flush()
        h.shutdown()
        harness.terminate(p)
        with open(path, "rb") as f:
            check(f"{name}: what is written reaches the file", f.read() == new)

    # A name of a descriptor that is not open.
    r = subprocess.run([SERVER, "--listen", f"unix:{os.path.join(d, 'none.sock')}",
                        "/proc/self/fd/9"], capture_output=True, text=True, timeout=30)
    err = r.stderr.strip()
    check("a descriptor that is not open: one line naming it",
          r.returncode != 0 and "/proc/self/fd/9" in err and "\n" not in err, err)
    harness.exit_if_failed()


main()
