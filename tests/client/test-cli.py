#!/usr/bin/python3
"""mloop's command line on this host, where most failures can be tested
without a kernel NBD client: every refusal is one line on stderr naming
the cause, a non-zero exit, and nothing left behind (no runtime directory
entry, no server process).  The kernel suite (tests/kernel) covers attach
itself."""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

MLOOP = os.environ["MLOOP_CLI"]
failures = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(name)


def servers():
    """Pids of mloop-server and nbdkit processes serving under RUNDIR."""
    found = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(d + "/cmdline", "rb") as f:
                if rundir.encode() in f.read():
                    found.append(int(d[6:]))
        except OSError:
            pass
    return found


def mloop(*args, user=None):
    cmd = [MLOOP, *args]
    if user:
        cmd = ["setpriv", f"--reuid={user}", "--regid=65534", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def refused(name, args, expect, user=None):
    """ARGS must fail with one stderr line containing EXPECT, leaving
    nothing behind."""
    p = mloop(*args, user=user)
    lines = p.stderr.strip().splitlines()
    check(f"{name}: exit non-zero", p.returncode != 0, f"exit {p.returncode}")
    check(f"{name}: one line naming the cause", len(lines) == 1 and expect in lines[0],
          repr(p.stderr))
    check(f"{name}: nothing on stdout", p.stdout == "", repr(p.stdout))
    left = [e for e in os.listdir(rundir) if e != ".lock"] if os.path.isdir(rundir) else []
    check(f"{name}: nothing left in the runtime dir", left == [], repr(left))
    check(f"{name}: no server left running", servers() == [], repr(servers()))


work = tempfile.mkdtemp(prefix="mloop-cli-", dir="/var/tmp")
rundir = os.path.join(work, "run")
env = dict(os.environ, MLOOP_RUNTIME_DIR=rundir)
try:
    image = os.path.join(work, "disk.img")
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    os.chmod(work, 0o755)
    os.chmod(image, 0o644)

    p = mloop("--help")
    check("--help", p.returncode == 0 and "attach" in p.stdout and "detach" in p.stdout)
    p = mloop("--version")
    check("--version", p.returncode == 0 and p.stdout.startswith("mloop "))
    p = mloop("attach", "--help")
    check("attach --help lists its options", p.returncode == 0 and
          all(o in p.stdout for o in ("--connections", "--threads", "--read-only",
                                      "--block-size", "--device", "--find",
                                      "--timeout", "--server")), p.stdout)
    refused("unknown command", ["frobnicate"], "unknown command 'frobnicate'")
    p = mloop()
    check("no command: usage, exit 1", p.returncode == 1 and "Usage" in p.stderr)

    refused("attach without FILE", ["attach"], "exactly one FILE")
    refused("attach two FILEs", ["attach", image, image], "exactly one FILE")
    refused("--connections 0", ["attach", "--connections", "0", image], "--connections 0")
    refused("--threads 0", ["attach", "--threads", "0", image], "--threads 0")
    refused("--timeout 0", ["attach", "--timeout", "0", image], "--timeout 0")
    refused("--connections 17", ["attach", "--connections", "17", image], "--connections 17")
    refused("--threads 65", ["attach", "--threads", "65", image], "--threads 65")
    refused("--block-size 1000", ["attach", "--block-size", "1000", image], "--block-size 1000")
    refused("--server foo", ["attach", "--server", "foo", image], "--server foo")
    refused("--device /dev/sda", ["attach", "--device", "/dev/sda", image],
            "--device /dev/sda: not a device name (/dev/nbdN or /dev/ublkbN)")
    refused("--find with --device", ["attach", "--find", "--device", "/dev/nbd0", image],
            "exclude each other")
    refused("--connections four", ["attach", "--connections", "four", image], "four")
    refused("missing image", ["attach", os.path.join(work, "nope.img")],
            "nope.img: No such file or directory")
    refused("directory as image", ["attach", work], "Is a directory")
    # An error quotes names as `mloop list` shows them: a terminal's
    # escapes in one (a label another user gave) reach root escaped.
    odd = os.path.join(work, "a\x1b]0;x\x07\u202eb.img")
    refused("a name's control characters are escaped in an error", ["attach", odd],
            "a\\x1b]0;x\\x07\\xe2\\x80\\xaeb.img: No such file or directory")
    p = mloop("attach", odd)
    check("an error writes no control or bidi character",
          not any(c in p.stderr for c in "\x1b\x07\u202e"), repr(p.stderr))
    # Not root: mloop's D-Bus service attaches for users, and none is
    # reachable here.
    os.chmod(work, 0o711)
    os.mkdir(os.path.join(work, "public"), 0o755)
    user_image = os.path.join(work, "public", "disk.img")
    with open(user_image, "wb") as f:
        f.truncate(1 << 20)
    os.chmod(user_image, 0o666)
    env["DBUS_SYSTEM_BUS_ADDRESS"] = f"unix:path={work}/no-bus"
    refused("not root, no service", ["attach", user_image],
            "mloop's D-Bus service (org.mloop.Manager1, for users who are not root) "
            "cannot be reached", user="nobody")
    del env["DBUS_SYSTEM_BUS_ADDRESS"]
    refused("--transport bogus", ["attach", "--transport", "bogus", image],
            "--transport bogus: must be nbd, ublk or auto")
    refused("ublk with --autoclear", ["attach", "--transport", "ublk", "--autoclear", image],
            "the ublk transport does not take --autoclear")
    refused("ublk with --threads", ["attach", "--transport", "ublk", "--threads", "2", image],
            "does not take --threads")
    refused("ublk for a remote export", ["attach", "--transport", "ublk", "nbd://127.0.0.1/x"],
            "does not take a remote export")
    refused("a remote export's port past 65535", ["attach", "nbd://127.0.0.1:99999/x"],
            "nbd://127.0.0.1:99999/x: port 99999 is out of range (1-65535)")
    refused("a remote export's port 0", ["attach", "nbd://127.0.0.1:0/x"],
            "port 0 is out of range (1-65535)")
    refused("an RBD name's id= with a '/'", ["attach", "rbd:pool/img:id=x/../../y"],
            "a cephx user's name has no '/'")
    refused("--ceph-id with a '/'", ["attach", "--ceph-id", "x/..", "rbd:pool/img"],
            "--ceph-id x/..: a cephx user's name has no '/'")
    # The attaching shell's environment reaches no server of the device.
    env["CEPH_ARGS"] = "--id someone"
    refused("an RBD attach with $CEPH_ARGS set", ["attach", "rbd:pool/img"],
            "CEPH_ARGS is set, and reaches none of the device's servers")
    del env["CEPH_ARGS"]
    # librados takes its plugin directories from $CEPH_LIB as well.
    env["CEPH_LIB"] = "/tmp"
    refused("an RBD attach with $CEPH_LIB set", ["attach", "rbd:pool/img"],
            "CEPH_LIB is set, and reaches none of the device's servers")
    del env["CEPH_LIB"]
    # A $CEPH_CONF that finds nothing here, or names a place the search
    # cannot judge, pins no configuration: the device's servers, in
    # mloopd's environment, would search without it and find another,
    # /etc/ceph/ceph.conf's cluster perhaps.
    env["CEPH_CONF"] = os.path.join(work, "no-such.conf")
    refused("an RBD attach whose $CEPH_CONF finds nothing", ["attach", "rbd:pool/img"],
            f"no Ceph configuration found here ($CEPH_CONF: {env['CEPH_CONF']})")
    env["CEPH_CONF"] = "/etc/ceph/$name.conf"
    refused("an RBD attach whose $CEPH_CONF names $name", ["attach", "rbd:pool/img"],
            "$CEPH_CONF's /etc/ceph/$name.conf: only $cluster and $home are understood")
    # Found by the search, backup.conf is the cluster "ceph"'s (librados
    # names a cluster after a file it is given, not one it finds), but
    # recorded as the device's conf= it would be "backup"'s: another
    # keyring, log and admin socket than the attach's environment says.
    found = os.path.join(work, "backup.conf")
    with open(found, "w") as f:
        f.write("[global]\nmon_host = 127.0.0.1:1\n")
    os.chmod(found, 0o644)
    env["CEPH_CONF"] = found
    refused("an RBD attach whose $CEPH_CONF finds another cluster's name",
            ["attach", "rbd:pool/img"],
            f"{found}, the Ceph configuration found, is the cluster ceph's")
    del env["CEPH_CONF"]
    # Recorded as given and read by servers run in /: /ceph.conf.
    refused("an RBD name's relative conf=", ["attach", "rbd:pool/img:id=a:conf=ceph.conf"],
            "conf=ceph.conf is relative, and a device's servers run in /")
    refused("ublk with an nbd --device", ["attach", "--transport", "ublk", "--device",
                                          "/dev/nbd3", image],
            "the ublk transport does not take --device /dev/nbdN")
    refused("a ublk --device with --transport nbd",
            ["attach", "--transport", "nbd", "--device", "/dev/ublkb3", image],
            "--device /dev/ublkb3 is a ublk device; the nbd transport makes /dev/nbdN")
    if os.path.exists("/dev/ublk-control"):
        print("skip no-ublk-kernel refusal: this kernel has ublk")
    else:
        refused("kernel without ublk", ["attach", "--transport", "ublk", image],
                "/dev/ublk-control: No such file or directory")
        refused("a ublk --device on a kernel without ublk",
                ["attach", "--device", "/dev/ublkb3", image],
                "/dev/ublk-control: No such file or directory")

    nbd_here = os.path.exists("/sys/module/nbd") or \
        subprocess.run(["modprobe", "-q", "nbd"], capture_output=True).returncode == 0
    if nbd_here:
        print("skip no-NBD-kernel refusal: this kernel has nbd")
    else:
        refused("kernel without NBD", ["attach", image], "'modprobe nbd' failed")

    p = mloop("list")
    check("list with nothing attached prints nothing", p.returncode == 0 and p.stdout == "",
          repr(p.stdout))
    p = mloop("list", "--json")
    check("list --json with nothing attached is []",
          p.returncode == 0 and json.loads(p.stdout) == [], repr(p.stdout))
    refused("detach an unattached device", ["detach", "/dev/nbd7"],
            "/dev/nbd7 is not attached by mloop")
    refused("detach an unattached file", ["detach", image], "is not attached by mloop")
    refused("detach without arguments", ["detach"], "--all")
    refused("status of an unattached device", ["status", "nbd3"], "not attached by mloop")
    refused("detach an unattached ublk device", ["detach", "/dev/ublkb2"],
            "/dev/ublkb2 is not attached by mloop")
    refused("resize of an unattached device", ["resize", "nbd3"], "not attached by mloop")
    refused("resize without a device", ["resize"], "give one DEVICE or FILE")
    refused("resize to a size that is none", ["resize", "--size", "12Q", "nbd3"],
            "--size 12Q: not a size")
    p = mloop("detach", "--all")
    check("detach --all with nothing attached succeeds", p.returncode == 0, p.stderr)
finally:
    shutil.rmtree(work, ignore_errors=True)

if failures:
    sys.exit(f"{len(failures)} check(s) failed: {', '.join(failures)}")
