#!/usr/bin/python3
"""`mloop overlay commit` and `mloop overlay discard` on this host, with
mloop-server writing the overlay (the kernel suite's test-overlay.py adds
the refusals for an attached device).

commit: after unaligned writes, a zero and a trim through the server,
the base reads exactly as the device did, the overlay is gone, and the
base's path is printed (a control character in it escaped).  discard: the overlay is gone, durably
(strace sees its directory synced), and the base untouched.  Refused in one line, with the overlay and the base left as
they were: an overlay a server holds, a file that is not an overlay
(discard never removes it), a missing file, an overlay made for a
window of its base.

The base is the one the overlay was made for: a server started by hand
with a relative image name records the image's absolute path, so commit
from another directory writes that image and no namesake; an image put
in the base's place is refused in one line naming both, unless
--adopt-base; a base a stopped commit has partly written is still its
base by the mark the commit wrote first, refused without it; a moved base is named with --base; `mloop overlay adopt`
records another image as the base.  `mloop overlay clear` forgets a
failed sync's mark, which fails every server's FLUSH till then (not
while a server holds the overlay, nor through a link, nor on a file
that is no overlay).  The base is locked,
not compared by name: a server writing it under another name (a hard
link) makes commit refuse, and so does qemu-io with it open.  About 3 s
(standard tier, client suite)."""
import errno
import fcntl
import os
import shutil
import struct
import subprocess
import time

import nbd

import harness
from harness import check

MLOOP = os.environ["MLOOP_CLI"]
F_OFD_GETLK = 36
SIZE = 8 << 20
if harness.SERVER_KIND != "native":
    harness.skip("drives mloop-server's --overlay")

d = harness.tmpdir()
env = dict(os.environ, MLOOP_RUNTIME_DIR=os.path.join(d, "run"))


def mloop(*args):
    return subprocess.run([MLOOP, *args], capture_output=True, text=True, timeout=120,
                          env=env)


def refused(name, args, expect):
    p = mloop(*args)
    lines = p.stderr.strip().splitlines()
    check(f"{name}: one line naming the cause, exit non-zero",
          p.returncode != 0 and len(lines) == 1 and expect in lines[0], p.stderr)


def digest(path):
    return harness.file_digest(path)


def written_overlay(base, overlay):
    """Writes through a server on BASE with OVERLAY; returns the device's
    bytes as a file."""
    srv = harness.Server(base, [f"overlay={overlay}"])
    h = srv.connect(strict=False)
    h.pwrite(harness.pattern(1 << 20, 7), 3 * (1 << 20) + 512)
    h.pwrite(b"\x55" * 100, SIZE - 100)
    h.zero(8192, 65536)
    h.trim(1 << 20, 6 * (1 << 20) + 4096)
    h.flush()
    device = os.path.join(d, "device.img")
    subprocess.run(["nbdcopy", srv.uri, device], check=True)
    h.shutdown()
    srv.stop()
    return device


base = harness.make_image(SIZE, harness.pattern(SIZE, 3), directory=d)
base_before = digest(base)
overlay = os.path.join(d, "one.overlay")
device = written_overlay(base, overlay)
check("the device differs from its base", digest(device) != base_before)

# Refusals leave both as they were.
overlay_before = digest(overlay)
srv = harness.Server(base, [f"overlay={overlay}"])
# The server holds the base shared too, which the commit locks first.
refused("commit of an overlay a server holds", ["overlay", "commit", overlay],
        "the overlay's base, is in use by a server")
refused("discard of an overlay a server holds", ["overlay", "discard", overlay],
        "is in use by a server")
srv.stop()


def qemu_holds(path):
    """Whether another process holds QEMU's lock byte 100 of PATH (every
    QEMU process with the image open does)."""
    probe = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 100, 1, 0)
    fd = os.open(path, os.O_RDONLY)
    try:
        return struct.unpack("hhqqi", fcntl.fcntl(fd, F_OFD_GETLK, probe))[0] \
            != fcntl.F_UNLCK
    finally:
        os.close(fd)


# QEMU with the base open (qemu-io, as a virtual machine would): the
# commit would rewrite the image under it.
if shutil.which("qemu-io"):
    qemu = subprocess.Popen(["qemu-io", "-f", "raw", base], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    harness.on_exit(lambda: harness.terminate(qemu))
    deadline = time.time() + 30
    while not qemu_holds(base) and time.time() < deadline and qemu.poll() is None:
        time.sleep(0.05)
    check("qemu-io holds the base", qemu_holds(base))
    refused("commit into a base QEMU has open", ["overlay", "commit", overlay],
            "open in QEMU")
    qemu.stdin.close()
    qemu.wait(timeout=60)
refused("discard of a file that is not an overlay", ["overlay", "discard", base],
        "is not an mloop overlay")
refused("commit of a missing overlay", ["overlay", "commit", os.path.join(d, "none")],
        "No such file")
refused("an unknown overlay command", ["overlay", "merge", overlay], "commit, discard or clear")
check("refusals changed neither base nor overlay",
      digest(base) == base_before and digest(overlay) == overlay_before)

# An overlay of a window has other bytes than the whole base.
window = os.path.join(d, "window.overlay")
srv = harness.Server(base, [f"overlay={window}", "sizelimit=4194304"])
srv.stop()
refused("commit of an overlay made for a window", ["overlay", "commit", window],
        "was made for a base of 4194304 bytes")

# A commit stopped half-way has written the first clusters already (the
# zeroed range): the base's first MiB differs, and it must still run, by
# the mark the commit put in the overlay's header before its first write
# into the base (at 4072, design.md "The format").  Without the mark the
# changed base is refused.
with open(base, "r+b") as f:
    f.seek(65536)
    f.write(bytes(8192))
overlay_before = digest(overlay)
refused("a base written since, without the mark", ["overlay", "commit", overlay],
        "first or last MiB differ")
check("the refusal left the overlay", digest(overlay) == overlay_before)
with open(overlay, "r+b") as f:
    f.seek(4072)
    f.write((1).to_bytes(4, "little"))
p = mloop("overlay", "commit", overlay)
check("commit succeeds and prints the base", p.returncode == 0 and
      p.stdout.strip() == os.path.realpath(base), p.stdout + p.stderr)
check("the base now reads as the device did", harness.files_equal(base, device))
check("the overlay is gone", not os.path.exists(overlay))

# A commit stopped half-way into an image that is gone since: discard
# refuses (the image may have moved, and the overlay holds the rest of
# it), and names both ways out; adopting another image drops the mark.
# The other image is made before the base goes: made after, ext4 gives
# it the freed inode number, and born in the base's second it is taken
# for that very file (only a birth second tells them apart), which keeps
# the mark.
gone_base = harness.make_image(SIZE, harness.pattern(SIZE, 13))
gone_overlay = os.path.join(d, "gone.overlay")
written_overlay(gone_base, gone_overlay)
with open(gone_overlay, "r+b") as f:
    f.seek(4072)
    f.write((1).to_bytes(4, "little"))
stand_in = harness.make_image(SIZE, harness.pattern(SIZE, 14))
os.unlink(gone_base)
refused("discard of a half-merged overlay whose base is gone",
        ["overlay", "discard", gone_overlay], "is not there")
p = mloop("overlay", "discard", gone_overlay)
check("the refusal names the commit elsewhere and the adoption",
      "--base" in p.stderr and f"mloop overlay adopt {gone_overlay}" in p.stderr,
      p.stderr)
p = mloop("overlay", "adopt", gone_overlay, stand_in)
check("adopting another image", p.returncode == 0, p.stderr)
p = mloop("overlay", "discard", gone_overlay)
check("then discard removes it", p.returncode == 0 and
      not os.path.exists(gone_overlay), p.stderr)

committed = digest(base)
other = os.path.join(d, "two.overlay")
written_overlay(base, other)
# Under strace: the removal is made durable (its directory synced after
# the unlink), or a power cut could bring the discarded writes back to
# the next device attached with this overlay's name.
trace = os.path.join(d, "discard.strace")
if shutil.which("strace"):
    p = subprocess.run(["strace", "-f", "-qq", "-o", trace,
                        "-e", "trace=unlink,unlinkat,fsync,fdatasync",
                        MLOOP, "overlay", "discard", other],
                       capture_output=True, text=True, timeout=120,
                       env=harness.traced_env(env))
    calls = open(trace).read().splitlines()
    # By its name in its directory's descriptor (unlinkat), or its path.
    removed = [i for i, line in enumerate(calls)
               if "unlink" in line and "= 0" in line and
               ('"' + os.path.basename(other) + '"' in line or other in line)]
    check("discard syncs the overlay's directory after the unlink",
          len(removed) == 1 and any("fsync(" in line and "= 0" in line
                                    for line in calls[removed[0] + 1:]),
          "\n".join(calls))
else:
    p = mloop("overlay", "discard", other)
check("discard succeeds", p.returncode == 0 and p.stderr == "", p.stderr)
check("discard removed the overlay and left the base", not os.path.exists(other)
      and digest(base) == committed)

# A server started by hand in the base's directory, naming it relatively.
rel_dir = harness.tmpdir()
rel_base = harness.make_image(SIZE, harness.pattern(SIZE, 11), directory=rel_dir)
rel_overlay = os.path.join(rel_dir, "rel.overlay")
namesake = harness.make_image(SIZE, harness.pattern(SIZE, 12))
namesake_before = digest(namesake)
srv = subprocess.Popen([harness.SERVER_BIN, "--listen", f"unix:{rel_dir}/s.sock",
                        "--pid-file", f"{rel_dir}/s.pid", "--overlay=rel.overlay",
                        "disk.img"], cwd=rel_dir, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
harness.on_exit(lambda srv=srv: harness.terminate(srv))
while not os.path.exists(f"{rel_dir}/s.pid") and srv.poll() is None:
    time.sleep(0.02)
h = nbd.NBD()
h.connect_uri(f"nbd+unix:///?socket={rel_dir}/s.sock")
h.pwrite(b"\x77" * 4096, 0)
h.flush()
h.shutdown()
harness.terminate(srv)
p = subprocess.run([MLOOP, "overlay", "commit", rel_overlay], capture_output=True,
                   text=True, timeout=120, env=env, cwd=os.path.dirname(namesake))
check("commit from elsewhere writes the base, not a namesake",
      p.returncode == 0 and p.stdout.strip() == rel_base and
      harness.read_image(rel_base, 0, 4096) == b"\x77" * 4096 and
      digest(namesake) == namesake_before, p.stdout + p.stderr)

# Another image in the base's place.
third = os.path.join(d, "three.overlay")
written_overlay(base, third)
third_before = digest(third)
# A server writing the base under another name holds it.
link = base + ".link"
os.link(base, link)
writer = harness.Server(link, [])
refused("commit while a server writes the base under another name",
        ["overlay", "commit", third], "is in use")
writer.stop()
os.unlink(link)
check("refused while written: the overlay stays", os.path.exists(third)
      and digest(third) == third_before)
moved = base + ".moved"
os.rename(base, moved)
impostor = harness.make_image(SIZE, harness.pattern(SIZE, 13))
os.rename(impostor, base)
impostor_before = digest(base)
refused("commit into another image at the base's path", ["overlay", "commit", third],
        f"was made for {base}")
p = mloop("overlay", "commit", third)
check("the refusal names both", moved not in p.stderr and base in p.stderr
      and "not " in p.stderr, p.stderr)
check("the refusal changed neither", digest(base) == impostor_before
      and digest(third) == third_before)

# The moved base, named.  (Kept for the first format's case below.)
shutil.copyfile(third, third + ".v1")
p = mloop("overlay", "commit", "--base", moved, third)
check("--base names a moved base", p.returncode == 0 and p.stdout.strip() == moved
      and not os.path.exists(third), p.stdout + p.stderr)

# The first format recorded the path the server was given, perhaps
# relative: commit asks for the base rather than guess.
v1 = third + ".v1"
with open(v1, "r+b") as f:
    h = bytearray(f.read(4096))
    h[8:12] = (1).to_bytes(4, "little")
    h[48:4096] = bytes(4096 - 48)
    h[64:72] = b"disk.img"
    f.seek(0)
    f.write(h)
refused("commit of a version 1 overlay naming its base relatively",
        ["overlay", "commit", v1], "names its base only as disk.img")
p = mloop("overlay", "commit", "--base", moved, v1)
check("--base commits a version 1 overlay", p.returncode == 0 and
      p.stdout.strip() == moved and not os.path.exists(v1), p.stdout + p.stderr)

# adopt: the override for an overlay a device will attach.
fourth = os.path.join(d, "four.overlay")
written_overlay(moved, fourth)
elsewhere = harness.make_image(SIZE, harness.pattern(SIZE, 14))
try:
    harness.Server(elsewhere, [f"overlay={fourth}"]).stop()
    check("an overlay is refused over another image", False)
except RuntimeError as e:
    check("an overlay is refused over another image", "was made for" in str(e), str(e))
refused("adopt of an image of another size",
        ["overlay", "adopt", fourth, harness.make_image(SIZE + 4096)],
        "was made for a base of")
p = mloop("overlay", "adopt", fourth, elsewhere)
check("adopt records another image as the base", p.returncode == 0 and
      p.stdout == p.stderr == "", p.stdout + p.stderr)
srv = harness.Server(elsewhere, [f"overlay={fourth}"])
srv.stop()
p = mloop("overlay", "commit", fourth)
check("commit then writes the adopted image", p.returncode == 0 and
      p.stdout.strip() == elsewhere, p.stdout + p.stderr)

# clear: a failed sync's mark (flag 8 of the header's flags word, as a
# server sets it when a sync of the overlay fails) fails every FLUSH of
# every server after, until the owner clears it.
marked = os.path.join(d, "marked.overlay")
written_overlay(base, marked)
with open(marked, "r+b") as f:
    f.seek(4072)
    flags = struct.unpack("<I", f.read(4))[0]
    f.seek(4072)
    f.write(struct.pack("<I", flags | 8))
srv = harness.Server(base, [f"overlay={marked}"])
h = srv.connect(strict=False)
try:
    h.flush()
    check("FLUSH on an overlay marked with a failed sync fails", False)
except nbd.Error as e:
    check("FLUSH on an overlay marked with a failed sync fails",
          e.errnum == errno.EIO, str(e))
refused("clear of an overlay a server holds", ["overlay", "clear", marked],
        "is in use by a server")
h.shutdown()
srv.stop()
link = os.path.join(d, "marked.link")
os.symlink(marked, link)
refused("clear through a symbolic link", ["overlay", "clear", link],
        "is a symbolic link")
refused("clear of a file that is no overlay", ["overlay", "clear", base],
        "is not an mloop overlay")
p = mloop("overlay", "clear", marked)
check("clear forgets the failed sync", p.returncode == 0 and
      p.stdout == p.stderr == "", p.stdout + p.stderr)
srv = harness.Server(base, [f"overlay={marked}"])
h = srv.connect(strict=False)
h.flush()
h.shutdown()
srv.stop()

# The base's path is the overlay's header's, whoever wrote it: printed,
# its control characters are escaped, as mloop list escapes names (an
# ESC here would be a terminal's command in the output root reads).
named_dir = harness.tmpdir()
named = os.path.join(named_dir, "base\x1b[2Jx.img")
shutil.copyfile(harness.make_image(SIZE), named)
named_overlay = os.path.join(named_dir, "named.overlay")
harness.Server(named, [f"overlay={named_overlay}"]).stop()
p = mloop("overlay", "commit", named_overlay)
check("commit prints a base's control characters escaped",
      p.returncode == 0 and "\x1b" not in p.stdout and
      p.stdout.strip() == named.replace("\x1b", "\\x1b"), repr(p.stdout + p.stderr))

harness.exit_if_failed()
