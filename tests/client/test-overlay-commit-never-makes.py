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
import subprocess

import harness
import held_mloop
from harness import check

MLOOP = held_mloop.MLOOP
SIZE = 4 << 20
held_mloop.require("it holds the command at the open")

d = harness.tmpdir()
env = held_mloop.runtime_env(d)
users = os.path.join(d, "users")
os.mkdir(users)
overlay = os.path.join(users, "one.overlay")
base = held_mloop.make_overlay(d, SIZE, overlay)
elsewhere = os.path.join(d, "elsewhere")
os.mkdir(elsewhere)
aside = os.path.join(d, "users.aside")


def held_at_open(*args):
    """Runs mloop ARGS under gdb; at the overlay's open, USERS is swapped
    for a symlink to ELSEWHERE.  Returns the run and mloop's lines."""
    p, said = held_mloop.run(env, "open_locked",
                             f"mv {users} {aside} && ln -s {elsewhere} {users}",
                             *args)
    os.unlink(users)
    os.rename(aside, users)
    return p, said


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
