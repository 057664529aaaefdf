#!/usr/bin/python3
"""nbdcopy from a local file into mloop and back out: byte-identical,
with multi-conn copying in parallel."""
import shutil
import subprocess
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
subprocess.run(["nbdcopy", "--connections=4", src, srv.uri], check=True, timeout=300)
back = d + "/back.img"
subprocess.run(["nbdcopy", "--connections=4", srv.uri, back], check=True, timeout=300)
srv.stop()
subprocess.run(["cmp", src, target], check=True)
subprocess.run(["cmp", src, back], check=True)
print("ok: nbdcopy into and out of mloop, identical")
