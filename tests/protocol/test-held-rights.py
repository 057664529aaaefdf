"""A server serving a descriptor's file (as mloop-dbus hands a user's
image on) writes it with no right beyond the open file's: not into the
blocks ext4 keeps for root (a file system made with half its blocks
reserved, its other half filled by a user, who can then write no block
of their image), which root's rights (fsuid 0, CAP_SYS_RESOURCE, the
right that also passes a disk quota's hard limit) let the server write
where its user could not.  Skipped without root, mkfs.ext4, a loop
device or setpriv.  Both servers; about 0.5 s each."""
import os
import shutil
import subprocess
import sys

import harness
from harness import check

MiB = 1 << 20


def mount_reserved_ext4(d):
    """A 64 MiB ext4 with half its blocks reserved, mounted (loop) on
    D/mnt until exit; skips the test where it cannot be."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None or \
            shutil.which("setpriv") is None:
        harness.skip("needs root, mkfs.ext4 and setpriv")
    os.chmod(d, 0o755)                      # the user reaches the mount
    fs = os.path.join(d, "fs.img")
    mnt = os.path.join(d, "mnt")
    os.mkdir(mnt)
    with open(fs, "wb") as f:
        f.truncate(64 * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "50", "-O", "^has_journal", fs],
                   check=True, capture_output=True)
    if subprocess.run(["mount", "-o", "loop", fs, mnt], capture_output=True).returncode != 0:
        harness.skip("cannot mount an ext4 image (no loop device?)")
    harness.on_exit(lambda: subprocess.run(["umount", mnt], check=True))
    os.chmod(mnt, 0o777)
    return mnt


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def main():
    if not harness.file_only("a descriptor names a file, not an RBD image"):
        sys.exit(0)
    mnt = mount_reserved_ext4(harness.tmpdir())
    nobody = (65534, 65534)
    image = os.path.join(mnt, "user.img")
    with open(image, "wb") as f:
        f.truncate(48 * MiB)
    os.chown(image, *nobody)
    # The user fills what is theirs to fill: the rest is root's reserve.
    as_user = ["setpriv", f"--reuid={nobody[0]}", f"--regid={nobody[1]}", "--clear-groups"]
    subprocess.run(as_user + ["dd", "if=/dev/zero", f"of={mnt}/filler", "bs=1M"],
                   capture_output=True)
    r = subprocess.run(as_user + ["dd", "if=/dev/zero", f"of={image}", "bs=1M", "count=1",
                                  "conv=notrunc,fsync"], capture_output=True, text=True)
    check("the user can write no block of their image themselves",
          r.returncode != 0 and "No space left" in r.stderr, r.stderr.strip())
    before = free_bytes(mnt)

    fd = os.open(image, os.O_RDWR)
    try:
        server = harness.Server(f"/proc/self/fd/{fd}", pass_fds=(fd,))
    finally:
        os.close(fd)
    h = server.connect()
    written = 0
    for i in range(8):
        try:
            h.pwrite(b"\xab" * MiB, (8 + i) * MiB)
            h.flush()
            written += 1
        except Exception:
            pass
    h.shutdown()
    server.read_only = True                 # nothing to copy back: a file
    server.stop()
    taken = before - free_bytes(mnt)
    check("no write through the server reaches root's reserved blocks",
          written == 0 and taken < MiB,
          f"{written} MiB written, {taken} bytes of the reserve taken")
    harness.exit_if_failed()


main()
