#!/usr/bin/python3
"""`mloop overlay commit` and `mloop overlay adopt` never make an
overlay: they act on one that exists.  Both check that the path names a
file first, but the path is the caller's to choose and may change
before the overlay is opened (held there by gdb): its directory swapped
for a symlink to another, where no overlay is, must end the command
with one line, and make no file there.  Opened as a server opens an
overlay, it was made there instead, by whoever ran the command, root as
well, wherever the symlink led.  SKIPs (77) without gdb.  About 3 s
(client suite, standard tier; gdb's starts are most of it)."""
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
    harness.skip("gdb is not installed (it holds the command at the open)")

d = harness.tmpdir()
env = dict(os.environ, MLOOP_RUNTIME_DIR=os.path.join(d, "run"))
base = harness.make_image(SIZE, bytes(SIZE), directory=d)
users = os.path.join(d, "users")
os.mkdir(users)
overlay = os.path.join(users, "one.overlay")
srv = harness.Server(base, [f"overlay={overlay}"])
h = srv.connect(strict=False)
h.pwrite(b"\x5a" * 65536, 1 << 20)
h.flush()
h.shutdown()
srv.stop()
elsewhere = os.path.join(d, "elsewhere")
os.mkdir(elsewhere)
aside = os.path.join(d, "users.aside")


def held_at_open(*args):
    """Runs mloop ARGS under gdb; at the overlay's open, USERS is swapped
    for a symlink to ELSEWHERE.  Returns the run and mloop's lines."""
    p = subprocess.run(["gdb", "-q", "-batch", "-nx",
                        "-ex", "set breakpoint pending on",
                        "-ex", "break open_locked", "-ex", "run",
                        "-ex", f"shell mv {users} {aside} && "
                        f"ln -s {elsewhere} {users}",
                        "-ex", "continue",
                        "--args", MLOOP, "overlay", *args],
                       capture_output=True, text=True, timeout=120, env=env)
    if "Breakpoint 1," not in p.stdout:
        harness.skip(f"gdb did not stop at open_locked: {p.stdout[-300:]!r}")
    os.unlink(users)
    os.rename(aside, users)
    return p, [line for line in p.stderr.splitlines()
               if line.startswith("mloop")]


for what in (["adopt", overlay, base], ["commit", overlay]):
    p, said = held_at_open(*what)
    check(f"{what[0]} of an overlay gone at its open says so, in one line",
          len(said) == 1 and "No such file" in said[0], p.stderr[-500:])
    check(f"{what[0]} of an overlay gone at its open exits non-zero",
          "exited with code" in p.stdout, p.stdout[-300:])
    check(f"{what[0]} makes no file where the symlink led",
          os.listdir(elsewhere) == [], repr(os.listdir(elsewhere)))
    for name in os.listdir(elsewhere):
        os.unlink(os.path.join(elsewhere, name))

with open(base, "rb") as f:
    f.seek(1 << 20)
    check("the base is untouched", f.read(65536) == bytes(65536))
p = subprocess.run([MLOOP, "overlay", "commit", overlay],
                   capture_output=True, text=True, timeout=60, env=env)
check("the overlay then commits as before", p.returncode == 0, p.stderr)
harness.exit_if_failed()
