#!/usr/bin/python3
"""qemu-img map --output=json and nbdinfo --map through mloop equal the
image's own map (a file's SEEK_DATA/SEEK_HOLE, an RBD image's
allocation): the whole image, and (a file's) an offset=/sizelimit=
window whose edges fall inside a data region and inside a hole (the map
is the file's, shifted and clipped)."""
import json
import shutil
import subprocess
import harness

if shutil.which("qemu-img") is None:
    harness.skip("qemu-img (qemu-utils) is not installed")
if shutil.which("nbdinfo") is None:
    harness.skip("nbdinfo (libnbd-bin) is not installed")

MiB = 1 << 20
SIZE = 64 * MiB
REGIONS = [(0, MiB), (10 * MiB, 3 * MiB), (40 * MiB, 64 << 10), (SIZE - MiB, MiB)]
image = harness.make_patterned_image(SIZE, REGIONS)


def merge(ranges):
    out = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True,
                          timeout=300).stdout


def served_maps(srv, size):
    q = json.loads(run("qemu-img", "map", "--output=json", "-f", "raw", srv.uri))
    qemu = merge((e["start"], e["start"] + e["length"]) for e in q if e["data"])
    assert sum(e["length"] for e in q) == size, q
    n = json.loads(run("nbdinfo", "--map", "--json", srv.uri))
    # base:allocation: bit 0 hole, bit 1 zero; data is what is not a hole.
    info = merge((e["offset"], e["offset"] + e["length"]) for e in n
                 if not e["type"] & 1)
    assert sum(e["length"] for e in n) == size, n
    return qemu, info


cases = [("whole image", [], 0, SIZE),
         ("window", [f"offset={MiB // 2}", f"sizelimit={40 * MiB}"], MiB // 2, 40 * MiB)]
if not harness.file_only("an offset=/sizelimit= window"):
    cases = cases[:1]
for what, params, off, size in cases:
    srv = harness.Server(image, params)
    expected = harness.image_data_ranges(image, off, off + size)
    qemu, info = served_maps(srv, size)
    srv.stop()
    assert qemu == expected, f"{what}: qemu-img map {qemu} != the image's map {expected}"
    assert info == expected, f"{what}: nbdinfo --map {info} != the image's map {expected}"
    print(f"{what}: {len(expected)} data extents, identical")
print("ok: qemu-img map and nbdinfo --map equal the image's own map")
