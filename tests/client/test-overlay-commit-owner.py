#!/usr/bin/python3
"""`mloop overlay commit` writes only a base the overlay file's owner may
write, whatever its header says.

An overlay's header is the overlay owner's to write: a user can craft one
naming any file, with the device and inode stat shows even for a file
they cannot read, and the mark a stopped commit leaves.  Root committing
that user's overlay must refuse, in one line naming the overlay's owner
and the base, and leave the base byte for byte as it was; once that user
may write the base, the same commit runs.  Root's own overlay is
trusted to name any base only while no one else may write it; the
overlay's owner, not root, is told to run the overlay commands as root
(the devices' state is root's).  A stopped commit's changed
ends are taken only with the mark the commit writes before its first
write into the base.

Runs on the host as root, no kernel NBD client needed.  About 1 s
(standard tier, client suite)."""
import os
import pwd
import struct
import subprocess

import harness
from harness import check

MLOOP = os.environ["MLOOP_CLI"]
SIZE = 4 << 20
# The header's fields (design.md, "The format").
HDR_BASE_DEV, HDR_BASE_INO, HDR_BASE_PATH = 48, 56, 64
HDR_BASE_FIRST_CRC, HDR_FLAGS = 4064, 4072
FLAG_MERGING = 1

if harness.SERVER_KIND != "native":
    harness.skip("drives mloop-server's --overlay")
if os.geteuid() != 0:
    harness.skip("needs root to own files as another user")
try:
    user = pwd.getpwnam("nobody")
except KeyError:
    harness.skip("no user 'nobody' to own the overlay")

d = harness.tmpdir()
os.chmod(d, 0o755)
env = dict(os.environ, MLOOP_RUNTIME_DIR=os.path.join(d, "run"))


def mloop(*args):
    return subprocess.run([MLOOP, *args], capture_output=True, text=True, timeout=120,
                          env=env)


# The user's overlay, written through a server over the user's own image.
mine = harness.make_image(SIZE, harness.pattern(SIZE, 5), directory=d)
overlay = os.path.join(d, "user.overlay")
srv = harness.Server(mine, [f"overlay={overlay}"])
h = srv.connect(strict=False)
h.pwrite(b"\xaa" * 65536, 0)
h.pwrite(b"\xbb" * 65536, SIZE - 65536)
h.flush()
h.shutdown()
srv.stop()

# A root-only file of the same size, standing for /etc/shadow.
secret_dir = os.path.join(d, "root-only")
os.mkdir(secret_dir)
secret = harness.make_image(SIZE, harness.pattern(SIZE, 9), directory=secret_dir)
os.chmod(secret, 0o600)
secret_before = harness.file_digest(secret)
st = os.stat(secret)

# The header names it, with what stat tells anyone, and the mark.
with open(overlay, "r+b") as f:
    f.seek(HDR_BASE_DEV)
    f.write(struct.pack("<QQ", st.st_dev, st.st_ino))
    f.seek(HDR_BASE_PATH)
    f.write(os.path.realpath(secret).encode().ljust(HDR_BASE_FIRST_CRC - HDR_BASE_PATH,
                                                    b"\0"))
    f.seek(HDR_BASE_FIRST_CRC)
    f.write(struct.pack("<III", 1, 2, 0))
os.chown(overlay, user.pw_uid, user.pw_gid)

p = mloop("overlay", "commit", overlay)
check("without the mark a commit writes first, the changed ends are refused",
      p.returncode != 0 and "first or last MiB differ" in p.stderr, p.stderr)
check("and the root-only file is unchanged",
      harness.file_digest(secret) == secret_before)


def set_mark():
    with open(overlay, "r+b") as f:
        f.seek(HDR_FLAGS)
        f.write(struct.pack("<I", FLAG_MERGING))


# The mark is the header's too: the user can set it.
set_mark()
for how, args in (("as recorded", []), ("named with --base", ["--base", secret]),
                  ("with --adopt-base", ["--adopt-base", "--base", secret])):
    p = mloop("overlay", "commit", *args, overlay)
    lines = p.stderr.strip().splitlines()
    check(f"{how}: committing a user's overlay into a root-only file is refused "
          "in one line naming the owner and the base",
          p.returncode != 0 and len(lines) == 1 and user.pw_name in lines[0] and
          secret in lines[0], p.stderr)
    check(f"{how}: the root-only file is unchanged",
          harness.file_digest(secret) == secret_before)
    check(f"{how}: the overlay stays", os.path.exists(overlay))

# Root's own overlay may name any base, but not when others may write
# it: any of them may have written its header.
os.chown(overlay, 0, 0)
os.chmod(overlay, 0o666)
p = mloop("overlay", "commit", overlay)
check("an overlay others may write is refused in one line saying so",
      p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1 and
      "written by others" in p.stderr, p.stderr)
check("and the root-only file is unchanged", harness.file_digest(secret) == secret_before)
os.chmod(overlay, 0o600)
os.chown(overlay, user.pw_uid, user.pw_gid)

# A user cannot see the devices' state, root's: their own overlay's
# commands say to run them as root, and leave it be.
for cmd in (["commit"], ["discard"], ["adopt"]):
    args = ["overlay", *cmd, overlay] + ([mine] if cmd == ["adopt"] else [])
    p = subprocess.run([MLOOP, *args], capture_output=True, text=True, timeout=120,
                       env=env, user=user.pw_uid, group=user.pw_gid, extra_groups=[])
    lines = p.stderr.strip().splitlines()
    check(f"overlay {cmd[0]} by the overlay's owner, not root, is refused in one "
          "line saying to run it as root",
          p.returncode != 0 and len(lines) == 1 and "run it as root" in lines[0],
          p.stderr)
    check(f"and the overlay stays after {cmd[0]}", os.path.exists(overlay))
check("and the root-only file is unchanged", harness.file_digest(secret) == secret_before)

# With the mark, the same file with other ends is a commit stopped
# half-way: it runs into a base the user may write.
os.chown(secret, user.pw_uid, user.pw_gid)
p = mloop("overlay", "commit", overlay)
check("once the user may write it, the stopped commit runs", p.returncode == 0, p.stderr)
with open(secret, "rb") as f:
    head = f.read(65536)
    f.seek(SIZE - 65536)
    tail = f.read(65536)
check("and wrote the overlay's clusters", head == b"\xaa" * 65536 and
      tail == b"\xbb" * 65536)

harness.exit_if_failed()
