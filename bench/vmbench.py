"""What the benchmarks that run in the test VM share: the binaries they
pass into the guest, and the shell script that starts their guest half
(bench/kernel-path, bench/attach-speed)."""
import os
import shlex
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BINARIES = {"MLOOP_CLI": "client/mloop", "MLOOP_SERVER_BIN": "server/mloop-server",
            "MLOOP_PLUGIN": "plugin/nbdkit-mloop-plugin.so",
            "MLOOP_UBLK_BIN": "ublk/mloop-ublk", "MLOOPD_BIN": "supervisor/mloopd"}


def binaries(prog):
    """The environment naming this checkout's builds (or the ones the
    environment names); exits with PROG's message when one is missing."""
    env = {}
    for var, rel in BINARIES.items():
        path = os.path.realpath(os.environ.get(var) or os.path.join(REPO, "build", rel))
        if not os.path.exists(path):
            sys.exit(f"{prog}: {path} missing: build it (meson setup build && "
                     f"ninja -C build) or set {var}")
        env[var] = path
    return env


def guest_script(env, script, args):
    """The guest's shell script: ENV exported, then bench/SCRIPT run with
    ARGS by the guest's python3."""
    env = dict(env, TMPDIR="/var/tmp", PATH="/usr/sbin:/usr/bin:/sbin:/bin",
               HOME="/tmp", LANG="C.UTF-8", PYTHONDONTWRITEBYTECODE="1")
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append("exec /usr/bin/python3 " + shlex.quote(os.path.join(REPO, "bench", script))
                 + " " + " ".join(shlex.quote(str(x)) for x in args))
    return "\n".join(lines) + "\n"
