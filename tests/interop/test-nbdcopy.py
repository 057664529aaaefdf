#!/usr/bin/python3
"""nbdcopy from a local file into mloop and back out: byte-identical,
with multi-conn copying in parallel."""
import shutil
import harness

if shutil.which("nbdcopy") is None:
    harness.skip("nbdcopy (libnbd-bin) is not installed")

SIZE = 128 << 20
d = harness.tmpdir()
src = harness.make_image(SIZE, data=harness.pattern(SIZE // 2, 71), directory=d)
target = d + "/target.img"
with open(target, "wb") as f:
    f.truncate(SIZE)
srv = harness.Server(target)
harness.nbdcopy_round_trip(srv, src, target)
print("ok: nbdcopy into and out of mloop, identical")
