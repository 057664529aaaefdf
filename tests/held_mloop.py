"""`mloop overlay` held by gdb at one of its own functions, for the
client tests of what the command does when the files it checked change
under it.  The window between a check and what follows is made certain,
not raced for: gdb stops the command at a function named for that
point, runs one shell command there (a rename, a directory swapped for
a symlink) and lets it go on.  The tests make the overlay with
mloop-server, so they SKIP (77) with any other server, and without
gdb."""
import os
import shutil
import subprocess

import harness

MLOOP = os.environ["MLOOP_CLI"]


def require(why):
    """SKIPs the test unless mloop-server and gdb are here; WHY: what gdb
    holds the command for."""
    if harness.SERVER_KIND != "native":
        harness.skip("drives mloop-server's --overlay")
    if shutil.which("gdb") is None:
        harness.skip(f"gdb is not installed ({why})")


def runtime_env(d):
    """The environment for mloop with its runtime directory (state lock,
    records) private to the test, in D."""
    return dict(os.environ, MLOOP_RUNTIME_DIR=os.path.join(d, "run"))


def make_overlay(d, size, overlay):
    """Makes a base image of SIZE zero bytes in D and OVERLAY over it,
    with 64 KiB of 0x5a written at 1 MiB through mloop-server, so that a
    commit has something to merge.  Returns the base's path."""
    base = harness.make_image(size, bytes(size), directory=d)
    srv = harness.Server(base, [f"overlay={overlay}"])
    h = srv.connect(strict=False)
    h.pwrite(b"\x5a" * 65536, 1 << 20)
    h.flush()
    h.shutdown()
    srv.stop()
    return base


def run(env, stop_at, shell, *args):
    """Runs `mloop overlay ARGS` in ENV under gdb, which stops it at the
    function STOP_AT, runs the shell command SHELL there and lets it go
    on.  Returns the run and the lines mloop wrote on stderr; SKIPs the
    test when gdb never stopped there."""
    p = subprocess.run(["gdb", "-q", "-batch", "-nx",
                        "-ex", "set breakpoint pending on",
                        "-ex", f"break {stop_at}", "-ex", "run",
                        "-ex", f"shell {shell}",
                        "-ex", "continue",
                        "--args", MLOOP, "overlay", *args],
                       capture_output=True, text=True, timeout=120, env=env)
    if "Breakpoint 1," not in p.stdout:
        harness.skip(f"gdb did not stop at {stop_at}: {p.stdout[-300:]!r}")
    return p, [line for line in p.stderr.splitlines()
               if line.startswith("mloop")]
