"""A server given a name of one of its descriptors (/proc/self/fd/N,
the way mloop's D-Bus service hands a caller's image on) serves that
open file as it was opened, never a reopen of it with the server's own
rights: a descriptor opened read-only is served read-only though the
server runs as root and the file is root's to write, and what is served
and written is exactly the open file's data, whether the file needs a
page-cache tail (odd size) or not.  Both servers; about 2 s each."""
import os

import harness
from harness import check

harness.file_only("a descriptor names a file, not an RBD image")


def serve(path, flags):
    """The server on PATH opened with FLAGS, by its descriptor's name."""
    fd = os.open(path, flags)
    try:
        return harness.Server(f"/proc/self/fd/{fd}", pass_fds=(fd,))
    finally:
        os.close(fd)


def main():
    d = harness.tmpdir()
    data = os.urandom((1 << 20) + 1000)        # odd size: a page-cache tail
    for size, name in ((1 << 20, "even.img"), (len(data), "odd.img")):
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(data[:size])

        # Opened read-only: served read-only, though root could write it.
        os.chmod(path, 0o444)
        server = serve(path, os.O_RDONLY)
        h = server.connect()
        check(f"{name}: a read-only descriptor is served read-only", h.is_read_only() == 1,
              f"is_read_only() = {h.is_read_only()}")
        check(f"{name}: the data served is the open file's", h.pread(size, 0) == data[:size])
        h.shutdown()
        server.read_only = True
        server.stop()

        # Opened read-write: written through the same open file.
        os.chmod(path, 0o644)
        server = serve(path, os.O_RDWR)
        h = server.connect()
        new = bytes(reversed(data[:size]))
        h.pwrite(new, 0)
        h.flush()
        h.shutdown()
        server.read_only = True            # nothing to copy back: a file
        server.stop()
        with open(path, "rb") as f:
            check(f"{name}: what is written reaches the file", f.read() == new)
    harness.exit_if_failed()


main()
