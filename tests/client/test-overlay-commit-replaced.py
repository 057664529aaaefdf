#!/usr/bin/python3
"""`mloop overlay commit` removes the overlay it merged, and nothing
else: a file renamed over the overlay's name while the merge runs (held
there by gdb, at the copy) is left where it is, the commit says so in
one line and exits non-zero, and the base holds the merged data.
SKIPs (77) without gdb.  About 2 s (client suite, standard tier; gdb's
start is most of it)."""
import os

import harness
import held_mloop
from harness import check

SIZE = 4 << 20
held_mloop.require("it holds the commit mid-merge")

d = harness.tmpdir()
env = held_mloop.runtime_env(d)
overlay = os.path.join(d, "one.overlay")
base = held_mloop.make_overlay(d, SIZE, overlay)

stranger = os.path.join(d, "stranger")
with open(stranger, "wb") as f:
    f.write(b"not an overlay")
# At the copy, the overlay's name is given to another file.
p, said = held_mloop.run(env, "copy_marked", f"mv {stranger} {overlay}",
                         "commit", overlay)
check("the commit says the overlay was replaced, in one line",
      len(said) == 1 and "was replaced during the merge" in said[0], p.stderr[-500:])
check("the commit exits non-zero", "exited with code" in p.stdout, p.stdout[-300:])
with open(overlay, "rb") as f:
    check("the file renamed over the overlay is still there", f.read() == b"not an overlay")
with open(base, "rb") as f:
    f.seek(1 << 20)
    check("the base holds the merged data", f.read(65536) == b"\x5a" * 65536)
harness.exit_if_failed()
