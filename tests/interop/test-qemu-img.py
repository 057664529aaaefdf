#!/usr/bin/python3
"""qemu-img convert into and out of mloop, and qemu-img compare finds
the image, the export and the round trip equal; qemu-img map through
mloop agrees with the image's own map (qemu-img map of the file, or an
RBD image's allocation).  qemu-img opens the file while mloop serves
it: the server's image lock lets QEMU's readers in, while qemu-io may
not open it for writing, served plain or as the base under an overlay
(the server holds QEMU's lock byte for refusing writers)."""
import json
import shutil
import subprocess
import harness

if shutil.which("qemu-img") is None:
    harness.skip("qemu-img (qemu-utils) is not installed")

SIZE = 64 << 20
d = harness.tmpdir()
src = harness.make_image(SIZE, directory=d)
with open(src, "r+b") as f:
    for off in (0, 20 << 20, SIZE - (1 << 20)):
        f.seek(off)
        f.write(harness.pattern(1 << 20, off))
target = d + "/target.img"
with open(target, "wb") as f:
    f.truncate(SIZE)
srv = harness.Server(target)
nbd_uri = f"nbd:unix:{srv.sock}"


def qemu_img(*args):
    return subprocess.run(["qemu-img", *args], check=True, capture_output=True,
                           text=True, timeout=300).stdout


qemu_img("convert", "-n", "-f", "raw", "-O", "raw", src, nbd_uri)      # into mloop
qemu_img("compare", "-f", "raw", "-F", "raw", src, nbd_uri)
back = d + "/back.img"
qemu_img("convert", "-f", "raw", "-O", "raw", nbd_uri, back)             # out of mloop
qemu_img("compare", "-f", "raw", "-F", "raw", src, back)


def data_ranges(m):
    out = []
    for e in json.loads(m):
        if e["data"]:
            if out and out[-1][1] == e["start"]:
                out[-1] = (out[-1][0], e["start"] + e["length"])
            else:
                out.append((e["start"], e["start"] + e["length"]))
    return out


served = data_ranges(qemu_img("map", "--output=json", "-f", "raw", nbd_uri))
if harness.STORE == "file":
    local = data_ranges(qemu_img("map", "--output=json", "-f", "raw", target))
else:
    local = harness.image_data_ranges(target, 0, SIZE)
assert served == local, f"qemu-img map via mloop {served} != the image's {local}"


def qemu_may_not_write(image):
    """QEMU refuses, in its own lock bytes, to open a served image for
    writing, and writes nothing into it."""
    before = harness.file_digest(image)
    r = subprocess.run(["qemu-io", "-f", "raw", "-c", "write -P 0x77 0 4k",
                        image], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and '"write" lock' in r.stderr, \
        f"qemu-io opened {image} for writing while mloop served it: " \
        f"{r.stdout.strip()} {r.stderr.strip()}"
    assert harness.file_digest(image) == before, f"qemu-io wrote {image}"


if harness.STORE == "file" and shutil.which("qemu-io"):
    qemu_may_not_write(target)
srv.stop()
if harness.STORE == "file" and shutil.which("qemu-io"):
    # The base under an overlay: its devices read it for as long as the
    # overlay lives.  qemu-img still reads it.
    srv = harness.Server(src, [f"overlay={d}/overlay"])
    qemu_img("info", "-f", "raw", src)
    qemu_may_not_write(src)
    srv.stop()
print(f"ok: qemu-img convert in and out, compare equal, map {served}; "
      "QEMU may not write a served image")
