#!/usr/bin/python3
"""The mloop command loads json-glib and gio (GDBus) only when it lists,
shows a status or asks mloop's D-Bus service: root's attach and detach,
and --version, start without them (client/extras.h says why).  What
needs them still works, and a missing module is one line naming it.
Costs about 1 s."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

MLOOP = os.environ["MLOOP_CLI"]
EXTRAS = "mloop-cli-extras.so"
LAZY = ("libgio-2.0", "libjson-glib-1.0", "libgobject-2.0")
failures = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(name)


def run(binary, *args):
    """Runs BINARY ARGS; returns it and the libraries the dynamic loader
    opened (LD_DEBUG=files writes them on stderr)."""
    p = subprocess.run([binary, *args], capture_output=True, text=True,
                       timeout=60, env=dict(env, LD_DEBUG="files"))
    loaded = [l for l in p.stderr.splitlines() if "file=" in l and "[0];" in l]
    messages = [l for l in p.stderr.splitlines() if not l.lstrip().split(":")[0].isdigit()]
    return p, loaded, messages


if os.geteuid() != 0:
    print("SKIP: root's attach and detach are what this checks")
    sys.exit(77)

work = tempfile.mkdtemp(prefix="mloop-lazy-", dir="/var/tmp")
env = dict(os.environ, MLOOP_RUNTIME_DIR=os.path.join(work, "run"))
try:
    image = os.path.join(work, "disk.img")
    with open(image, "wb") as f:
        f.truncate(1 << 20)

    for args in (["--version"], ["attach", image], ["attach", "/nonexistent/x.img"],
                 ["detach", "/dev/nbd15"], ["resize", "/dev/nbd15"]):
        p, loaded, _ = run(MLOOP, *args)
        heavy = [l for l in loaded if any(lib in l for lib in LAZY) or EXTRAS in l]
        check(f"mloop {' '.join(args)}: loads no gio, json-glib or {EXTRAS}",
              loaded and not heavy, "\n".join(heavy) or "no LD_DEBUG output")

    p, loaded, _ = run(MLOOP, "list", "--json")
    check("list --json loads the module", any(EXTRAS in l for l in loaded))
    try:
        listed = json.loads(p.stdout)
    except ValueError:
        listed = None
    check("list --json prints a JSON list", p.returncode == 0 and listed == [],
          repr(p.stdout))
    p, _, _ = run(MLOOP, "list")
    check("list prints nothing with no devices", p.returncode == 0 and p.stdout == "",
          repr(p.stdout))

    # The command alone, without its module beside it: it falls back to
    # the installed one, and names the module if that is missing too.
    alone = os.path.join(work, "mloop")
    shutil.copy(MLOOP, alone)
    p, _, messages = run(alone, "list")
    if p.returncode == 0:
        print("ok   (an installed module was found; its absence is not checked)")
    else:
        check("a missing module: one line naming it",
              len(messages) == 1 and EXTRAS in messages[0] and "did not load" in messages[0],
              repr(messages))
    p, loaded, _ = run(alone, "--version")
    check("--version needs no module", p.returncode == 0 and p.stdout.startswith("mloop "))
finally:
    shutil.rmtree(work, ignore_errors=True)

if failures:
    print(f"{len(failures)} check(s) failed: {', '.join(failures)}")
    sys.exit(1)
