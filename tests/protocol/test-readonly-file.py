#!/usr/bin/python3
"""A file that cannot be opened for writing (on a read-only mount) is
served read-only, and so is any file under nbdkit -r: every write, trim
and zero fails with EPERM; the file's bytes and mtime are unchanged."""
import errno
import os
import subprocess
import harness

SIZE = 4 << 20
DATA = harness.pattern(SIZE, 51)
MTIME = 1_000_000_000


def check_read_only(image, nbdkit_args=()):
    before = harness.file_digest(image)
    srv = harness.Server(image, nbdkit_args=list(nbdkit_args))
    h = srv.connect()
    assert h.is_read_only(), "export not read-only"
    for fn, args in [(h.pwrite, (b"x" * 4096, 0)), (h.trim, (4096, 0)),
                     (h.zero, (4096, 0))]:
        h.set_strict_mode(0)  # send them anyway: the server must refuse
        harness.expect_error(errno.EPERM, fn, *args)
    assert h.pread(SIZE, 0) == DATA
    h.shutdown()
    srv.stop()
    assert harness.file_digest(image) == before, "file changed"
    assert os.stat(image).st_mtime == MTIME, "mtime changed"


image = harness.make_image(SIZE, data=DATA)
os.utime(image, (MTIME, MTIME))
check_read_only(image, ["-r"])

if harness.file_only("a file on a read-only mount"):
    mnt = harness.mount_tmpfs("16m", "-r checked; a read-only mount")
    image = harness.make_image(SIZE, data=DATA, directory=mnt)
    os.utime(image, (MTIME, MTIME))
    subprocess.run(["mount", "-o", "remount,ro", mnt], check=True)
    check_read_only(image)
print("ok: nbdkit -r and a file on a read-only mount: writes, trims, zeroes -> EPERM")
