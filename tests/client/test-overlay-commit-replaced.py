#!/usr/bin/python3
"""`mloop overlay commit` removes the overlay it merged, and nothing
else: a file renamed over the overlay's name while the merge runs (held
there by gdb, at the copy) is left where it is, the commit says so in
one line and exits non-zero, and the base holds the merged data.
SKIPs (77) without gdb.  About 2 s (client suite, standard tier; gdb's
start is most of it)."""
import os
import shutil
import subprocess

import harness
from harness import check

MLOOP = os.environ["MLOOP_CLI"]
SIZE = 4 << 20
if harness.SERVER_KIND != "native":
    harness.skip("drives mloop-server's --overlay")
if shutil.which("gdb") is None:
    harness.skip("gdb is not installed (it holds the commit mid-merge)")

d = harness.tmpdir()
env = dict(os.environ, MLOOP_RUNTIME_DIR=os.path.join(d, "run"))
base = harness.make_image(SIZE, bytes(SIZE), directory=d)
overlay = os.path.join(d, "one.overlay")
srv = harness.Server(base, [f"overlay={overlay}"])
h = srv.connect(strict=False)
h.pwrite(b"\x5a" * 65536, 1 << 20)
h.flush()
h.shutdown()
srv.stop()

stranger = os.path.join(d, "stranger")
with open(stranger, "wb") as f:
    f.write(b"not an overlay")
# At the copy, the overlay's name is given to another file.
p = subprocess.run(["gdb", "-q", "-batch", "-nx",
                    "-ex", "set breakpoint pending on",
                    "-ex", "break copy_marked", "-ex", "run",
                    "-ex", f"shell mv {stranger} {overlay}",
                    "-ex", "continue",
                    "--args", MLOOP, "overlay", "commit", overlay],
                   capture_output=True, text=True, timeout=120, env=env)
said = [line for line in p.stderr.splitlines() if line.startswith("mloop")]
hit = "Breakpoint 1," in p.stdout
if not hit:
    harness.skip(f"gdb did not stop at copy_marked: {p.stdout[-300:]!r}")
check("the commit says the overlay was replaced, in one line",
      len(said) == 1 and "was replaced during the merge" in said[0], p.stderr[-500:])
check("the commit exits non-zero", "exited with code" in p.stdout, p.stdout[-300:])
with open(overlay, "rb") as f:
    check("the file renamed over the overlay is still there", f.read() == b"not an overlay")
with open(base, "rb") as f:
    f.seek(1 << 20)
    check("the base holds the merged data", f.read(65536) == b"\x5a" * 65536)
harness.exit_if_failed()
