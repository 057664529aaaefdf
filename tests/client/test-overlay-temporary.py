#!/usr/bin/python3
"""Where `--overlay temp` puts its overlay, and what sweeps it.

The temporary overlay's directory is made in $TMPDIR when set (as qemu's
-snapshot does), else /var/tmp: a TMPDIR that cannot take it is named in
the one-line refusal, and so is one that other users may write without
the sticky bit, or that another user owns, or one inside a directory
another user owns (one of them could swap the private directory, or
TMPDIR itself, for a symlink); a sticky one, as /tmp, is used.  An attach refused after the directory was made
(here: the host has no kernel NBD client) leaves nothing behind in it.
The tmpfiles.d rule shipped with mloop removes temporary overlays left
in /var/tmp at boot (a device does not survive a reboot, so neither
does its overlay's use), and nothing else there; and it keeps the
age-based cleaning of /var/tmp (systemd's own tmp.conf: 30 days) away
from them, which would remove a live device's overlay once it went
unread and unwritten that long: the next start of its server (a
restart, the next mloopd) would find it gone and leave the device
without one, and its writes would go with the last server holding it.

Runs on the host, no kernel NBD client needed.  About 0.4 s (standard
tier, client suite)."""
import glob
import os
import pwd
import shutil
import subprocess
import time

import harness
from harness import check

MLOOP = os.environ["MLOOP_CLI"]
TMPFILES_CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                             "systemd", "mloop-tmpfiles.conf")

if os.geteuid() != 0:
    harness.skip("mloop attach refuses before the overlay unless root")

d = harness.tmpdir()
env = dict(os.environ, MLOOP_RUNTIME_DIR=os.path.join(d, "run"))
# A name no other test uses, to find any directory made for it.
name = f"temp-probe-{os.getpid()}.img"
image = os.path.join(d, name)
with open(image, "wb") as f:
    f.truncate(1 << 20)


def attach(tmpdir):
    e = dict(env, TMPDIR=tmpdir)
    return subprocess.run([MLOOP, "attach", "--overlay", "temp", image],
                          capture_output=True, text=True, timeout=60, env=e)


missing = os.path.join(d, "no-such-dir")
p = attach(missing)
lines = p.stderr.strip().splitlines()
check("a TMPDIR that cannot take the overlay is named in one line",
      p.returncode != 0 and len(lines) == 1 and
      f"cannot make a temporary overlay in {missing}" in lines[0], p.stderr)

own = os.path.join(d, "tmp")
os.mkdir(own)
p = attach(own)
check("the attach is refused on this host", p.returncode != 0, p.stderr)
check("a refused attach leaves nothing in TMPDIR", os.listdir(own) == [],
      str(os.listdir(own)))
check("nor in /var/tmp", glob.glob(f"/var/tmp/mloop-*{name}*") == [],
      str(glob.glob(f"/var/tmp/mloop-*{name}*")))

# A TMPDIR any user may write without the sticky bit: another user
# could put a symlink in place of the private directory, and root would
# make the overlay, and at detach remove it, wherever that points.
shared = os.path.join(d, "shared")
os.mkdir(shared)
os.chmod(shared, 0o777)
p = attach(shared)
lines = p.stderr.strip().splitlines()
check("a TMPDIR others may write, not sticky, is refused in one line naming it",
      p.returncode != 0 and len(lines) == 1 and shared in lines[0] and
      "sticky" in lines[0], p.stderr)
check("and nothing is made in it", os.listdir(shared) == [], str(os.listdir(shared)))
try:
    nobody = pwd.getpwnam("nobody")
except KeyError:
    nobody = None
if nobody is None:
    print("note: no user 'nobody': a TMPDIR another user owns is left out")
else:
    theirs = os.path.join(d, "theirs")
    os.mkdir(theirs)
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    p = attach(theirs)
    lines = p.stderr.strip().splitlines()
    check("a TMPDIR another user owns is refused in one line naming it",
          p.returncode != 0 and len(lines) == 1 and theirs in lines[0] and
          f"belongs to uid {nobody.pw_uid}" in lines[0], p.stderr)
    check("and nothing is made in it", os.listdir(theirs) == [], str(os.listdir(theirs)))
    # Root's directory in theirs: they may rename it away and put their
    # own in its place, so each directory above counts too.
    inner = os.path.join(theirs, "roots")
    os.mkdir(inner)
    p = attach(inner)
    lines = p.stderr.strip().splitlines()
    check("a TMPDIR inside a directory another user owns is refused naming that one",
          p.returncode != 0 and len(lines) == 1 and theirs + ":" in lines[0] and
          f"belongs to uid {nobody.pw_uid}" in lines[0], p.stderr)
    check("and nothing is made in it", os.listdir(inner) == [], str(os.listdir(inner)))
    os.rmdir(inner)
sticky = os.path.join(d, "sticky")
os.mkdir(sticky)
os.chmod(sticky, 0o1777)
p = attach(sticky)
check("a sticky one, as /tmp, is used (refused later on this host)",
      p.returncode != 0 and "sticky" not in p.stderr and
      os.listdir(sticky) == [], p.stderr)

# The boot-time sweep, applied to a private root.
tool = shutil.which("systemd-tmpfiles")
check("mloop ships a tmpfiles.d rule", os.path.exists(TMPFILES_CONF), TMPFILES_CONF)
if tool is None:
    print("note: no systemd-tmpfiles: the sweep itself is left out")
elif os.path.exists(TMPFILES_CONF):
    root = os.path.join(d, "root")
    left = os.path.join(root, "var/tmp/mloop-overlay-disk.img-Ab12Cd")
    os.makedirs(left)
    open(os.path.join(left, "overlay"), "w").close()
    keep = [os.path.join(root, "var/tmp/mloop-fuzz"),
            os.path.join(root, "var/tmp/mloop-test-xyz"),
            os.path.join(root, "var/tmp/other")]
    for k in keep:
        os.makedirs(k)
    p = subprocess.run([tool, f"--root={root}", "--boot", "--remove", TMPFILES_CONF],
                       capture_output=True, text=True, timeout=60)
    check("systemd-tmpfiles applies the rule", p.returncode == 0, p.stderr)
    check("a temporary overlay left from before the boot is removed",
          not os.path.exists(left))
    check("nothing else in /var/tmp is", all(os.path.isdir(k) for k in keep))

    # The age-based cleaning, as systemd's tmp.conf has it, over a
    # device's overlay untouched for 40 days.  Its change time cannot be
    # set back, so only access and modification times count here.
    live = os.path.join(root, "var/tmp/mloop-overlay-disk.img-Ef34Gh")
    os.makedirs(live)
    overlay = os.path.join(live, "overlay")
    open(overlay, "w").close()
    old = time.time() - 40 * 86400
    for path in (overlay, live):
        os.utime(path, (old, old))
    aging = os.path.join(d, "tmp.conf")
    with open(aging, "w") as f:
        f.write("q /var/tmp 1777 root root amAM:30d\n")
    p = subprocess.run([tool, f"--root={root}", "--clean", aging, TMPFILES_CONF],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0 and "age" in p.stderr.lower():
        print(f"note: this systemd-tmpfiles takes no age-by: {p.stderr.strip()}")
    else:
        check("systemd-tmpfiles cleans by age", p.returncode == 0, p.stderr)
        check("the age-based cleaning leaves a device's temporary overlay",
              os.path.exists(overlay), str(os.listdir(os.path.join(root, "var/tmp"))))

harness.exit_if_failed()
