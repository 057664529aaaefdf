"""The Debian packages, installed and used in the VM: what
scripts/check-package cannot do on a host without an NBD client.

The guest's root is the host's, read-only over 9p, so the test makes a
writable one: an overlayfs over it with a tmpfs above, /proc, /sys, /dev
and /var/tmp bound in and its own /tmp and /run, and runs every command
chrooted there, with an environment naming nothing of the build tree.
In it:

1. `dpkg -i` installs the packages (each debian/control names) built by
   `scripts/check-package --debs DIR` (MLOOP_DEBS=DIR; a SKIP without it).
2. The installed mloop attaches an image; mkfs.ext4, mount, a file
   written, umount, detach: `mloop list` is empty.  No mloopd listens
   yet (no systemd runs here): each device has its supervisor.  Then the
   postinst has enabled mloopd.socket, and mloopd is started as systemd
   would start it from there (the installed unit's ExecStart): steps 3
   and 4 go through it (the mounts' devices are kept by it).
3. /etc/fstab: a `defaults` line (that image), a line with
   `nofail,x-systemd.device-timeout=5s` (mount(8) hands the helper
   `-o nofail`, and leaves x-* out) and a line whose image is missing.
   `mount -a` mounts the first two through /sbin/mount.mloop (the file
   of step 2 reads back, new ones are written) and says why the third
   fails in one line, attaching nothing for it (exit 64: some mounted);
   a plain umount(8) of each leaves no device, process or state.
   systemd-fstab-generator, run by hand on that fstab, writes mount
   units of Type=mloop with What= the image, required by
   local-fs.target, or only wanted with nofail.
   The full tier adds an upgrade under IO: while fio writes and verifies
   through a device mloopd keeps, mloopd is stopped (SIGTERM), the
   packages are installed again and the new mloopd started from the
   unit's ExecStart, as the postinst has systemd restart it: no IO
   error or mismatch, the device taken over by the new mloopd with its
   server unchanged (30-60 s more).
4. mloop-attach@.service: `systemd-analyze verify` passes for the
   instance of the image's escaped path; its ExecStart and ExecStop,
   taken from the installed unit with %f and $OPTIONS expanded as systemd
   would (OPTIONS=--read-only, as a drop-in may set), attach the image
   (the files of step 3 read back) and detach it.  `mount -t mloop -o ro`
   reads back the file written through the nofail line.
5. mloopd stopped (SIGTERM, as the prerm has systemd do) exits 0 and
   removes its socket; `dpkg --purge`: no file of the packages, no
   unit, no enabled socket, no /run/mloop, no program, no device, no
   process is left, and dpkg knows none of them.

Run time: 32-56 s in the 6.1 VM under TCG on the project machine (7
runs; the spread is the host's load and page cache), a quarter of it
dpkg's and a tenth systemd-analyze's.  The standard tier runs it once,
in `kernel 6.1 (native)` (runner.py, PACKAGE).
"""
import glob
import hashlib
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import tempfile
import time

import fioverify
import kinds
from kfix import Skip, nbd_in_use, processes_mentioning, run, tmpdir, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))


def control_packages():
    """The binary packages debian/control names."""
    with open(os.path.join(HERE, "..", "..", "debian", "control")) as f:
        return [line.split(":", 1)[1].strip() for line in f if line.startswith("Package:")]


PACKAGES = control_packages()
# Commands in the new root see only this: nothing of the build tree's
# (MLOOP_CLI, MLOOP_TRACE...), so the installed programs run as installed.
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
# What the new root takes from the guest's: kernel filesystems and the
# scratch disk where images live (O_DIRECT works there).  Its /tmp and
# /run are its own tmpfs, so what the installed programs leave there
# (/run/mloop, mount(8)'s /run/mount) is seen, and goes with the root.
BINDS = ["proc", "sys", "dev", "var/tmp"]
RUNTIME_DIR = "/run/mloop"
# Where the package's postinst enables mloopd's socket.
SOCKET_WANTED = "/etc/systemd/system/sockets.target.wants/mloopd.socket"
IMAGE_SIZE = 64 << 20
# fio's verify round across the upgrade: 4 jobs of this many bytes,
# still writing after its first second under TCG.
UPGRADE_REGION = 4 << 20
# mount(8)'s exit status when some of `mount -a` mounted and some failed.
MOUNT_SOME_OK = 64


def find_debs():
    """The .deb of each package in MLOOP_DEBS, or Skip when there are
    none; a set that lacks some (built from another tree) fails."""
    where = os.environ.get("MLOOP_DEBS")
    if not where:
        raise Skip("MLOOP_DEBS is unset (scripts/check-package --debs DIR builds "
                   "the packages into DIR; .ci/run does)")
    found = {p: glob.glob(os.path.join(where, f"{p}_*.deb")) for p in PACKAGES}
    if not any(found.values()):
        raise Skip(f"no .deb of mloop's in MLOOP_DEBS={where}")
    for p, debs in found.items():
        assert len(debs) == 1, \
            f"MLOOP_DEBS={where} has {len(debs)} {p}_*.deb, not one (debian/control " \
            f"names {', '.join(PACKAGES)}; scripts/check-package --debs DIR builds them)"
    return [debs[0] for debs in found.values()]


# Packages whose file lists the new root keeps (see preload_lists): they
# own the directories ours install into (base-files /usr/sbin..., systemd
# /lib/systemd/system and man8, nbdkit its plugin directory, polkitd
# /usr/libexec and D-Bus's and polkit's), so dpkg knows those are shared
# and leaves them at the purge.
KEEP_LISTS = {"base-files", "systemd", "nbdkit", "polkitd"}


def preload_lists(upper):
    """Puts dpkg's file lists (info/*.list) into the overlay's upper
    layer UPPER before the overlay is mounted: empty ones, but for
    KEEP_LISTS.  Each dpkg run reads the list of every installed package
    (1,200 here), which over 9p under TCG takes 30 s; what the lists are
    for beyond the directories ours share (a file of ours another
    package owns) is scripts/check-package's, which installs on the host
    with the real lists."""
    info = "/var/lib/dpkg/info"
    for d in ("/var", "/var/lib", "/var/lib/dpkg", info):
        st = os.stat(d)
        os.mkdir(upper + d, st.st_mode & 0o7777)
        os.chown(upper + d, st.st_uid, st.st_gid)
    for name in os.listdir(info):
        if not name.endswith(".list"):
            continue
        if name[:-len(".list")].split(":")[0] in KEEP_LISTS:
            shutil.copy(os.path.join(info, name), upper + info)
        else:
            open(os.path.join(upper + info, name), "w").close()


def mounts_below(path):
    """Mount points at or below PATH, in mount order."""
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            mnt = line.split()[1].replace("\\040", " ")
            if mnt == path or mnt.startswith(path + "/"):
                found.append(mnt)
    return found


def processes_in(root):
    """(pid, command line) of each process chrooted into ROOT."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{pid}/root") != root:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append((int(pid), f.read().replace(b"\0", b" ").decode().strip()))
        except OSError:
            continue  # gone meanwhile
    return found


class NewRoot:
    """A writable root over the guest's read-only one, undone by CL:
    whatever the test left mounted in it is unmounted, every device
    the installed mloop attached is detached, and its processes are gone
    before the root itself is unmounted."""

    def __init__(self, cl):
        if not os.path.isdir("/sys/module/overlay"):
            moddir = os.environ.get("MLOOP_VM_MODDIR")
            p = run(["modprobe"] + (["-d", moddir] if moddir else []) + ["overlay"],
                    check=False)
            if p.returncode != 0:
                raise Skip(f"no overlayfs: {(p.stderr or p.stdout).strip()}")
        base = tempfile.mkdtemp(prefix="mloop-ktest-root-", dir="/tmp")
        cl.push(os.rmdir, base)
        # One tmpfs holds the upper layer and everything else the test
        # writes in the root: unmounting it frees all of it.
        run(["mount", "-t", "tmpfs", "-o", "mode=755", "mloop-ktest-root", base])
        cl.push(run, ["umount", base])
        for d in ("upper", "work", "root"):
            os.mkdir(os.path.join(base, d))
        preload_lists(os.path.join(base, "upper"))
        self.root = os.path.join(base, "root")
        # lowerdir=/ is the 9p root alone: the guest's mounts on it are
        # not in the overlay, hence the binds.
        run(["mount", "-t", "overlay", "-o",
             f"lowerdir=/,upperdir={base}/upper,workdir={base}/work",
             "mloop-ktest-root", self.root])
        cl.push(self.teardown)
        self.ours = {self.root}
        for d in BINDS:
            self._mount(d, "--bind", "/" + d)
        self._mount("tmp", "-t", "tmpfs", "-o", "mode=1777", "mloop-ktest-tmp")
        self._mount("run", "-t", "tmpfs", "-o", "mode=755", "mloop-ktest-run")
        # man-db's trigger would index every manual page over 9p.
        if os.path.exists(self.path("/var/lib/man-db/auto-update")):
            os.unlink(self.path("/var/lib/man-db/auto-update"))

    def _mount(self, where, *args):
        """mount ARGS on the root's WHERE, unmounted by teardown."""
        target = os.path.join(self.root, where)
        run(["mount", *args, target])
        self.ours.add(target)

    def path(self, p):
        """Where the root's path P is, seen from outside it."""
        return self.root + p

    def in_root(self, *cmd, check=True):
        """Runs CMD in the root."""
        return run(["chroot", self.root, *cmd], check=check, env=CLEAN_ENV)

    def start_service(self, unit):
        """The installed UNIT's ExecStart, started in the root as systemd
        would (its process; teardown's wait for the root's processes
        kills it if the test does not stop it)."""
        with open(self.path(f"/lib/systemd/system/{unit}")) as f:
            env, cmds = unit_commands(f.read())
        log = open(os.path.join(self.root, "tmp", f"{unit}.log"), "w")
        with log:
            return subprocess.Popen(["chroot", self.root, *shlex.split(cmds["ExecStart"])],
                                    env=dict(CLEAN_ENV, **env), stdout=log, stderr=log)

    def teardown(self):
        errors = []
        for mnt in reversed(mounts_below(self.root)):
            if mnt not in self.ours:
                p = run(["umount", mnt], check=False)
                if p.returncode:
                    errors.append(f"umount {mnt}: {p.stderr.strip()}")
        if os.path.isdir(self.path(RUNTIME_DIR)):
            # Purged, the build's mloop (seen through the lower layer)
            # reads the same state.
            installed = os.path.exists(self.path("/usr/sbin/mloop"))
            p = self.in_root("mloop" if installed else kinds.CLI, "detach", "--all", check=False)
            if p.returncode:
                errors.append(f"mloop detach --all: {p.stderr.strip()}")
        try:
            wait_until(lambda: not processes_in(self.root),
                       "the processes in the new root to exit", timeout=20)
        except AssertionError:
            left = processes_in(self.root)
            errors.append(f"processes left in the new root, killed: {left}")
            for pid, _ in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            wait_until(lambda: not processes_in(self.root), "killed processes to go")
        p = run(["umount", "-R", self.root], check=False)
        if p.returncode:
            errors.append(f"umount -R {self.root}: {p.stderr.strip()}")
        assert not errors, "; ".join(errors)


def listing(root):
    """`mloop list --json` of the installed mloop."""
    return json.loads(root.in_root("mloop", "list", "--json").stdout)


def devices(root):
    """The installed mloop's devices: {device: file}."""
    return {d["device"]: d["file"] for d in listing(root)}


def connected():
    return {f"/dev/{d}" for d in os.listdir("/sys/block")
            if d.startswith("nbd") and nbd_in_use(f"/dev/{d}")}


def write_file(path, seed, size=1 << 20):
    data = random.Random(seed).randbytes(size)
    with open(path, "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def assert_nothing_left(root, images, why):
    """No device, server, supervisor or device state of IMAGES."""
    problems = []
    if devices(root):
        problems.append(f"mloop list: {devices(root)}")
    for image in images:
        problems += [f"process {pid}: {cmd}" for pid, cmd in processes_mentioning(image)]
    run_dir = root.path(RUNTIME_DIR)
    state = sorted(set(os.listdir(run_dir)) - {".lock", "mloopd.sock", "mloopd.lock"}) \
        if os.path.isdir(run_dir) else []
    if state:
        problems.append(f"{RUNTIME_DIR} holds {state}")
    assert not problems, f"{why}: " + "; ".join(problems)


def wait_nothing_left(root, images, why):
    """As assert_nothing_left, once the supervisors of autoclear devices
    let go (within a second or two of the last close)."""
    def clean():
        try:
            assert_nothing_left(root, images, why)
            return True
        except AssertionError:
            return False
    try:
        wait_until(clean, why, timeout=20)
    except AssertionError:
        assert_nothing_left(root, images, why)  # says what is left


def unit_commands(text):
    """(Environment=, {ExecStart: ..., ExecStop: ...}) of a unit's text."""
    env, cmds = {}, {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "[")):
            continue
        key, _, value = line.partition("=")
        if key == "Environment":
            for word in shlex.split(value):
                name, _, v = word.partition("=")
                env[name] = v
        elif key in ("ExecStart", "ExecStop"):
            assert key not in cmds, f"more than one {key}= in the unit"
            cmds[key] = value
    return env, cmds


def expand(cmd, path, env):
    """CMD's argv as systemd runs it for the instance of PATH: %f is the
    unescaped path, $NAME the words of ENV's NAME, ${NAME} its value."""
    argv = []
    for word in shlex.split(cmd):
        if word == "%f":
            argv.append(path)
        elif word.startswith("${") and word.endswith("}"):
            argv.append(env.get(word[2:-1], ""))  # one word, as systemd has it
        elif word.startswith("$"):
            argv += env.get(word[1:], "").split()  # split at white space
        else:
            assert "%" not in word and "$" not in word, f"cannot expand {word!r} in {cmd!r}"
            argv.append(word)
    return argv


def upgrade_under_io(root, cl, images, debs, mloopd):
    """fio verifying through a device MLOOPD keeps while MLOOPD is
    stopped and the packages DEBS are installed again, then their mloopd
    started (returned): no IO error or mismatch, the device taken over
    with its server unchanged."""
    upgraded = os.path.join(images, "upgrade.img")
    with open(upgraded, "wb") as f:
        f.truncate(IMAGE_SIZE)
    dev = root.in_root("mloop", "attach", upgraded).stdout.strip()
    before = json.loads(root.in_root("mloop", "status", "--json", dev).stdout)
    assert before["service_kept"], f"{dev} is not kept by the installed mloopd: {before}"
    fio = fioverify.start_round(dev, cl, UPGRADE_REGION)
    time.sleep(fioverify.ROUND_START)
    assert fio.poll() is None, "fio ended before the upgrade began"
    mloopd.terminate()
    assert mloopd.wait(timeout=30) == 0, f"mloopd, stopped for the upgrade, exited {mloopd.returncode}"
    root.in_root("dpkg", "-i", *[f"/tmp/debs/{os.path.basename(d)}" for d in debs])
    # The teardown stops it if a check below fails.
    upgraded_mloopd = root.start_service("mloopd.service")
    wait_until(lambda: os.path.exists(root.path(f"{RUNTIME_DIR}/mloopd.sock")),
               "the upgraded mloopd to listen")
    fioverify.check_round(fio, UPGRADE_REGION)
    after = json.loads(root.in_root("mloop", "status", "--json", dev).stdout)
    assert after["service_kept"] and after["supervisor_running"] and \
        after["device"]["server_pid"] == before["device"]["server_pid"], \
        f"the upgraded mloopd did not take {dev} over, its server serving on: {after}"
    root.in_root("mloop", "detach", dev)
    assert_nothing_left(root, [upgraded], "after the upgrade's device was detached")
    return upgraded_mloopd


def run_test(kind, cl):
    debs = find_debs()
    connected_before = connected()
    # Before the root: the cleanup stack detaches first, then removes.
    images = tmpdir(cl)
    root = NewRoot(cl)

    # 1. Install.
    os.mkdir(root.path("/tmp/debs"))
    for deb in debs:
        shutil.copy(deb, root.path("/tmp/debs"))
    root.in_root("dpkg", "-i", *[f"/tmp/debs/{os.path.basename(d)}" for d in debs])
    owned = set(root.in_root("dpkg", "-L", *PACKAGES).stdout.split("\n")) - {""}
    for prog in ["/usr/sbin/mloop", "/usr/sbin/mloop-supervisor", "/usr/sbin/mloop-server",
                 "/sbin/mount.mloop"]:  # mount(8) looks in /sbin: /usr/sbin, merged
        assert os.access(root.path(prog), os.X_OK), f"{prog} is not installed"

    # 2. Attach, make a filesystem, write, detach.
    disk = os.path.join(images, "disk.img")
    other = os.path.join(images, "nofail.img")
    missing = os.path.join(images, "missing.img")
    for image in (disk, other):
        with open(image, "wb") as f:
            f.truncate(IMAGE_SIZE)
    root.in_root("mkfs.ext4", "-q", "-F", other)
    dev = root.in_root("mloop", "attach", disk).stdout.strip()
    assert dev.startswith("/dev/nbd") and nbd_in_use(dev), f"mloop attach printed {dev!r}"
    assert devices(root) == {dev: disk}, f"mloop list: {devices(root)}"
    root.in_root("mkfs.ext4", "-q", dev)
    os.makedirs(root.path("/mnt/data"))
    root.in_root("mount", dev, "/mnt/data")
    first = write_file(root.path("/mnt/data/first"), 1)
    root.in_root("umount", "/mnt/data")
    root.in_root("mloop", "detach", dev)
    assert not nbd_in_use(dev), f"{dev} is still connected after mloop detach"
    assert_nothing_left(root, [disk], "after mloop detach")

    # mloopd, as systemd starts it from the socket the package enabled
    # (no systemd runs here): the rest goes through it.
    assert os.path.islink(root.path(SOCKET_WANTED)), \
        "mloopd.socket is not enabled after the install"
    mloopd = root.start_service("mloopd.service")
    wait_until(lambda: os.path.exists(root.path(f"{RUNTIME_DIR}/mloopd.sock")),
               "the installed mloopd to listen")

    # 3. /etc/fstab, through mount(8) and its helper /sbin/mount.mloop.
    for d in ("x", "y", "z"):
        os.makedirs(root.path(f"/mnt/{d}"))
    with open(root.path("/etc/fstab"), "w") as f:
        f.write(f"{disk} /mnt/x mloop defaults 0 0\n"
                f"{other} /mnt/y mloop nofail,x-systemd.device-timeout=5s 0 0\n"
                f"{missing} /mnt/z mloop defaults 0 0\n")
    p = root.in_root("mount", "-a", check=False)
    err = p.stderr.strip()
    assert p.returncode == MOUNT_SOME_OK, \
        f"mount -a: exit {p.returncode}, not {MOUNT_SOME_OK}: {err}"
    assert "\n" not in err and missing in err and "No such file or directory" in err, \
        f"mount -a: the missing image's error is not one line naming it: {err!r}"
    with open("/proc/self/mounts") as f:
        mounted = {m: d for d, m in (line.split()[:2] for line in f)}
    for mnt, image in ((root.path("/mnt/x"), disk), (root.path("/mnt/y"), other)):
        assert mounted.get(mnt, "").startswith("/dev/nbd"), \
            f"mount -a did not mount {image} on {mnt}: {mounted.get(mnt)}"
    assert root.path("/mnt/z") not in mounted, "the missing image's line mounted something"
    assert sorted(devices(root).values()) == sorted([disk, other]), \
        f"mloop list after mount -a: {devices(root)}"
    assert not processes_mentioning(missing), \
        f"the failed line left {processes_mentioning(missing)}"
    assert digest(root.path("/mnt/x/first")) == first, "the file of step 2 reads back wrong"
    for dev in devices(root):
        status = json.loads(root.in_root("mloop", "status", "--json", dev).stdout)
        assert status["service_kept"], f"{dev} is not kept by the installed mloopd: {status}"
    # mount(8) compares a line's source (the image) with what is mounted
    # (the device): a second mount -a asks the helper again, which says
    # done; only the missing image's line fails again.
    p = root.in_root("mount", "-a", check=False)
    assert p.returncode == MOUNT_SOME_OK and missing in p.stderr and \
        disk not in p.stderr and other not in p.stderr, \
        f"a second mount -a: exit {p.returncode}: {p.stderr.strip()}"
    assert sorted(devices(root).values()) == sorted([disk, other]), \
        f"mloop list after a second mount -a: {devices(root)}"
    second = write_file(root.path("/mnt/x/second"), 2)
    third = write_file(root.path("/mnt/y/third"), 3)
    root.in_root("umount", "/mnt/x")
    root.in_root("umount", "/mnt/y")
    wait_nothing_left(root, [disk, other], "after umount(8) of the fstab mounts")
    # mount -s (sloppy) reaches the helper as -s.
    root.in_root("mount", "-s", "-t", "mloop", disk, "/mnt/x")
    root.in_root("umount", "/mnt/x")
    wait_nothing_left(root, [disk], "after mount -s and umount")

    # The unit systemd makes of each line (what=, where=, type=, options=
    # and local-fs.target's requires/ or wants/).
    gen = root.path("/tmp/generator")
    os.mkdir(gen)
    p = root.in_root("/lib/systemd/system-generators/systemd-fstab-generator",
                "/tmp/generator", "/tmp/generator", "/tmp/generator")
    # x-systemd.device-timeout is for a device (What=/dev/...); the
    # generator says it ignores it, and nothing else.
    said = [line for line in p.stderr.splitlines()
            if line != f"x-systemd.device-timeout ignored for {other}"]
    assert not said, f"systemd-fstab-generator: {p.stderr.strip()}"
    for where, image, nofail in (("/mnt/x", disk, False), ("/mnt/y", other, True)):
        unit = f"{where[1:].replace('/', '-')}.mount"
        with open(os.path.join(gen, unit)) as f:
            text = f.read()
        lines = set(text.splitlines())
        for want in (f"What={image}", f"Where={where}", "Type=mloop"):
            assert want in lines, f"{unit} has no {want}:\n{text}"
        required = os.path.exists(os.path.join(gen, "local-fs.target.requires", unit))
        wanted = os.path.exists(os.path.join(gen, "local-fs.target.wants", unit))
        if nofail:
            assert wanted and not required and "Options=nofail" in lines \
                and "Before=local-fs.target" not in lines, \
                f"{unit} (nofail): wanted {wanted}, required {required}:\n{text}"
        else:
            assert required and not wanted and "Before=local-fs.target" in lines, \
                f"{unit}: wanted {wanted}, required {required}:\n{text}"

    # An upgrade under IO: while fio writes and verifies through a device
    # mloopd keeps, mloopd is stopped (SIGTERM: it lets go, the server
    # serves on), the same packages are installed again, and the new
    # mloopd is started, as the postinst has systemd restart it: it
    # takes the device over.  Full tier only: 30-60 s more under TCG
    # (dpkg again, fio), and the standard tier's service-attach and
    # test-mloopd.py already take devices over from a stopped mloopd.
    if os.environ.get("MLOOP_TEST_TIER") == "full":
        mloopd = upgrade_under_io(root, cl, images, debs, mloopd)
    else:
        print("# package: the upgrade under IO is the full tier's", flush=True)

    # 4. mloop-attach@.service for the image.
    unit = root.in_root("systemd-escape", "--template", "mloop-attach@.service",
                   "--path", disk).stdout.strip()
    # Offline (no systemd runs here): the unit's syntax, its specifiers
    # for this instance, the units it names, ExecStart's program and the
    # man page of Documentation=.
    p = root.in_root("systemd-analyze", "verify", unit, check=False)
    assert p.returncode == 0 and not (p.stdout + p.stderr).strip(), \
        f"systemd-analyze verify {unit}: exit {p.returncode}: {(p.stdout + p.stderr).strip()}"
    with open(root.path("/lib/systemd/system/mloop-attach@.service")) as f:
        env, cmds = unit_commands(f.read())
    instance = unit[len("mloop-attach@"):-len(".service")]
    path = root.in_root("systemd-escape", "--unescape", "--path", instance).stdout.strip()
    assert path == disk, f"{unit} is for {path}, not {disk}"
    env["OPTIONS"] = "--read-only"
    start = expand(cmds["ExecStart"], path, env)
    dev = root.in_root(*start).stdout.strip()
    now = listing(root)
    assert [(d["device"], d["file"], d["read_only"]) for d in now] == [(dev, disk, True)] \
        and nbd_in_use(dev), f"{' '.join(start)}: printed {dev!r}; mloop list: {now}"
    root.in_root("mount", "-o", "ro", dev, "/mnt/data")
    got = (digest(root.path("/mnt/data/first")), digest(root.path("/mnt/data/second")))
    root.in_root("umount", "/mnt/data")
    assert got == (first, second), "the files of steps 2 and 3 read back wrong"
    root.in_root(*expand(cmds["ExecStop"], path, env))
    assert not nbd_in_use(dev), f"{dev} is still connected after ExecStop"
    assert_nothing_left(root, [disk], "after the unit's ExecStop")
    root.in_root("mount", "-t", "mloop", "-o", "ro", other, "/mnt/y")
    got = digest(root.path("/mnt/y/third"))
    root.in_root("umount", "/mnt/y")
    assert got == third, "the file written through the nofail line reads back wrong"
    wait_nothing_left(root, [other], "after mount -t mloop and umount")

    # 5. Purge, mloopd stopped first as the package's prerm has systemd
    # do: it lets go of no device (it keeps none now) and removes its
    # socket.
    mloopd.terminate()
    assert mloopd.wait(timeout=30) == 0, f"the installed mloopd exited {mloopd.returncode}"
    assert not os.path.exists(root.path(f"{RUNTIME_DIR}/mloopd.sock")), \
        "the installed mloopd left its socket"
    root.in_root("dpkg", "--purge", *PACKAGES)
    p = root.in_root("dpkg-query", "-W", "-f", "${Package} ${Status}\n", *PACKAGES, check=False)
    for pkg in PACKAGES:
        assert f"{pkg} unknown ok not-installed" in p.stdout.splitlines() \
            or f"no packages found matching {pkg}" in p.stderr, \
            f"dpkg-query after the purge: {p.stdout.strip()} {p.stderr.strip()}"
    left = sorted(f for f in owned if os.path.lexists(root.path(f))
                  and not os.path.isdir(root.path(f)))
    assert not left, f"left after the purge: {left}"
    left = glob.glob(root.path("/usr/sbin/mloop*")) + glob.glob(root.path("/sbin/mount.mloop")) \
        + glob.glob(root.path("/lib/systemd/system/mloop*")) \
        + glob.glob(root.path("/usr/lib/*/mloop"))
    assert not left, f"left after the purge: {left}"
    assert not os.path.exists(root.path(RUNTIME_DIR)), f"{RUNTIME_DIR} is left after the purge"
    assert not os.path.lexists(root.path(SOCKET_WANTED)), \
        "mloopd.socket is still enabled after the purge"
    assert not processes_in(root.root), f"processes left: {processes_in(root.root)}"
    left = connected() - connected_before
    assert not left, f"left connected: {sorted(left)}"
