"""Runs a command in a throwaway VM booted from Debian's kernel, for tests
that need kernel drivers the host lacks (nbd).

The guest is one of the kernels prepared by tests/vm/prepare-kernel (the
series "6.1" or "6.12": argument, or MLOOP_VM_KERNEL, default 6.1), an
initramfs from initramfs.py, the host's root shared read-only over 9p (so every host
binary and the build tree run unchanged once chrooted into it) and a sparse
scratch disk formatted ext4 here on the host.  qemu runs under TCG: KVM is
not usable on this project's machines (see docs of the environment).

The guest's command writes to the second serial port, which lands in a file
that run() relays line by line; kernel messages land in another.  Given an
output directory, the guest also sees it writable at /run/mloop-vm-out
(files left there, such as traces, outlive the VM).  run() returns once the
VM has powered off or been killed, and always removes its temporary files.
"""
import os
import shutil
import subprocess
import tempfile
import time

import initramfs

VM_DIR = os.environ.get("MLOOP_VM_DIR", "/var/cache/mloop-vm")
QEMU = "qemu-system-x86_64"
SCRATCH_SIZE = 2 << 30  # sparse; holds the test images
EXIT_MARK = "MLOOP-VM-EXIT "


class VmError(Exception):
    """The VM cannot be set up; the message is one line."""


class NotPrepared(VmError):
    """No kernel was prepared (tests/vm/prepare-kernel never ran)."""


# The kernel series prepare-kernel knows, the first the default.
SERIES = ("6.1", "6.12")
# Where the guest finds the output directory (in its chroot, on its own /run).
GUEST_OUT = "/run/mloop-vm-out"


def kernel_series(series=None):
    """SERIES, else MLOOP_VM_KERNEL, else the default; a VmError for one
    prepare-kernel does not know."""
    series = series or os.environ.get("MLOOP_VM_KERNEL") or SERIES[0]
    if series not in SERIES:
        raise VmError(f"unknown kernel series {series!r} (one of {', '.join(SERIES)})")
    return series


def prepared_kernel(series=None):
    """(tree, version) of the kernel of SERIES (see kernel_series) that
    prepare-kernel unpacked last."""
    series = kernel_series(series)
    names = [f"kernel-{series}"] + (["current"] if series == "6.1" else [])
    for name in names:  # "current": a cache prepared before kernel-6.1 existed
        try:
            with open(os.path.join(VM_DIR, name)) as f:
                kver = f.read().strip()
            break
        except FileNotFoundError:
            continue
    else:
        raise NotPrepared(f"no {series} kernel prepared in {VM_DIR} "
                          f"(run tests/vm/prepare-kernel {series})")
    tree = os.path.join(VM_DIR, kver)
    if not os.path.exists(os.path.join(tree, ".prepared")):
        raise NotPrepared(f"kernel {kver} in {VM_DIR} is incomplete "
                          f"(run tests/vm/prepare-kernel {series})")
    return tree, kver


HIDDEN = ("/tmp", "/run", "/var/tmp")


def preserved_dirs(paths):
    """The top directories under /tmp, /run or /var/tmp holding PATHS (a
    checkout and build tree there, as a CI job may have): the guest binds
    them back over its own mounts there."""
    keep = set()
    for p in paths:
        real = os.path.realpath(p)
        for hidden in HIDDEN:
            if real.startswith(hidden + "/"):
                keep.add(os.path.join(hidden, real[len(hidden) + 1:].split("/")[0]))
    return sorted(keep)


def check_paths(paths):
    """The guest mounts tmpfs over /tmp and /run and the scratch disk over
    /var/tmp: the host files the guest needs must live elsewhere."""
    for p in paths:
        real = os.path.realpath(p)
        for hidden in ("/tmp", "/run", "/var/tmp"):
            if real == hidden or real.startswith(hidden + "/"):
                raise VmError(f"{p} is under {hidden}, which the guest mounts over")


class Result:
    def __init__(self):
        self.exit_status = None  # the guest command's, None if it never said
        self.timed_out = False
        self.gave_up = None  # why run() stopped a guest before its deadline
        self.qemu_status = None
        self.console = []  # kernel console lines


class _Follower:
    """Yields the complete lines appended to a file since the last call."""

    def __init__(self, path):
        self.path = path
        self.pos = 0
        self.partial = b""

    def lines(self, final=False):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return []
        self.pos += len(data)
        data = self.partial + data
        parts = data.split(b"\n")
        self.partial = parts.pop()
        if final and self.partial:
            parts.append(self.partial)
            self.partial = b""
        return [p.decode("utf-8", "replace").rstrip("\r") for p in parts]


def boot_cpu_args(tree, kver):
    """Kernel arguments that boot the guest on one vCPU; tests/vm/init
    brings the others up once it has loaded its modules.

    The kernel patches its own code while it boots and loads modules
    (static keys: an int3 on an instruction's first byte, then the rest,
    then the first byte, every CPU serialized in between).  Under qemu
    7.2's multi-threaded TCG another vCPU sometimes runs that int3 after
    the patch is done: "Oops: int3" in a jump label's NOP and a panic at
    boot, about 1 boot in 20 of Debian's 6.12 on this project's machines
    (a CI run died of it).  With one vCPU running, no other sees it.
    Turning a tracepoint on or off patches the kernel the same way, so
    the kernel tests turn theirs on before the other vCPUs come up (run's
    EARLY_CMD): on 6.1, in a guest toggling a few tracepoints while a
    shell forked on the other vCPUs, within half a minute one vCPU looped
    in the int3 handler at a patched tracepoint in __schedule, and the
    toggling one waited on it forever (soft lockups; a CI run hung so
    while its tracing started).

    A CPU brought up late measures its delay loop, about 2 s per vCPU
    under TCG, unless lpj= gives it.  The guest's TSC is the host's
    (TCG reads it), so loops per jiffy are the host's TSC rate (its
    "cpu MHz", which can differ from the TSC under frequency scaling:
    then only udelay's accuracy suffers) over the kernel's HZ."""
    args = ["maxcpus=1"]
    try:
        with open(os.path.join(tree, "boot", f"config-{kver}")) as f:
            hz = int(next(line.split("=")[1] for line in f if line.startswith("CONFIG_HZ=")))
        with open("/proc/cpuinfo") as f:
            mhz = float(next(line.split(":")[1] for line in f if line.startswith("cpu MHz")))
    except (OSError, StopIteration, ValueError):
        return args  # no lpj: the vCPUs measure it, slower but right
    return args + [f"lpj={int(mhz * 1e6 / hz)}"]


# How long before it kills the VM run() warns that it will (on_deadline).
DEADLINE_WARNING = 120


def run(guest_cmd, on_output, on_console, timeout, smp=4, memory_mb=2048, preserve=(),
        series=None, outdir=None, scratch_size=SCRATCH_SIZE, on_deadline=None,
        early_cmd="", give_up=None):
    """Boots the VM with the kernel of SERIES, runs the shell script
    GUEST_CMD chrooted into the host root, and calls ON_OUTPUT(line) for
    each line it prints and ON_CONSOLE(line) for each console line.  OUTDIR,
    if given, is shared writable with the guest at GUEST_OUT.  Kills the VM
    after TIMEOUT seconds.  SCRATCH_SIZE is the (sparse) scratch disk's
    size, for images larger than the tests' (bench/kernel-path).
    ON_DEADLINE(seconds_left), if given, is called once DEADLINE_WARNING
    seconds before the VM is killed, so a log shows a run nearing its
    limit before it is cut.  EARLY_CMD, if given, is a shell script the
    guest runs before GUEST_CMD while it has one vCPU up: whatever turns
    on a tracepoint or another static key belongs there (boot_cpu_args
    says why).  GIVE_UP(), if given, is asked as the guest runs: a reason
    it returns stops the VM at once (a guest that cannot recover need not
    wait for TIMEOUT), kept in the Result.  Returns a Result."""
    if shutil.which(QEMU) is None:
        raise VmError(f"{QEMU} is not installed (package qemu-system-x86)")
    busybox = initramfs.find_busybox()
    if busybox is None:
        raise VmError("no statically linked busybox (package busybox-static)")
    tree, kver = prepared_kernel(series)
    kernel = os.path.join(tree, "boot", f"vmlinuz-{kver}")
    check_paths([tree])

    work = tempfile.mkdtemp(prefix="mloop-vm-", dir=os.environ.get("MLOOP_VM_TMPDIR"))
    proc = None
    result = Result()
    try:
        rd = os.path.join(work, "initramfs.cpio")
        initramfs.build(rd, busybox, tree, kver, guest_cmd, preserve,
                        out=outdir is not None, early_cmd=early_cmd)
        # Formatted here at host speed rather than by the emulated guest.
        scratch = os.path.join(work, "scratch.img")
        with open(scratch, "wb") as f:
            f.truncate(scratch_size)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "mloop-scratch", scratch],
                       check=True, stdout=subprocess.DEVNULL)
        console_log = os.path.join(work, "console.log")
        out_log = os.path.join(work, "output.log")
        cmd = [
            QEMU, "-accel", "tcg,thread=multi", "-cpu", "max",
            # One hardware queue per connection needs a vCPU per connection.
            "-smp", str(smp), "-m", str(memory_mb),
            "-nodefaults", "-nographic", "-monitor", "none", "-nic", "none",
            "-no-reboot",
            "-kernel", kernel, "-initrd", rd,
            # panic=-1 reboots at once on a panic, which -no-reboot turns
            # into qemu exiting; loglevel=5 keeps warnings and errors (nbd's
            # "Unexpected reply", oopses) on the console and boot chatter off.
            # maxcpus=1 and lpj: see boot_cpu_args.
            "-append", "console=ttyS0 panic=-1 loglevel=5 rdinit=/init "
                       + " ".join(boot_cpu_args(tree, kver)),
            "-virtfs", "local,path=/,mount_tag=host,security_model=none,"
                       "readonly=on,multidevs=remap",
            "-drive", f"file={scratch},format=raw,if=virtio,cache=unsafe",
            "-chardev", f"file,id=con,path={console_log}", "-serial", "chardev:con",
            "-chardev", f"file,id=out,path={out_log}", "-serial", "chardev:out",
        ]
        if outdir is not None:
            cmd += ["-virtfs", f"local,path={os.path.abspath(outdir)},mount_tag=out,"
                               "security_model=none,multidevs=remap"]
        qemu_log = open(os.path.join(work, "qemu.log"), "w")
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=qemu_log,
                                stderr=subprocess.STDOUT)
        out, con = _Follower(out_log), _Follower(console_log)
        deadline = time.monotonic() + timeout

        def pump(final=False):
            for line in con.lines(final):
                result.console.append(line)
                on_console(line)
            for line in out.lines(final):
                if line.startswith(EXIT_MARK):
                    result.exit_status = int(line[len(EXIT_MARK):])
                else:
                    on_output(line)

        warned = on_deadline is None
        while proc.poll() is None:
            if not warned and time.monotonic() > deadline - DEADLINE_WARNING:
                warned = True
                on_deadline(deadline - time.monotonic())
            if time.monotonic() > deadline:
                result.timed_out = True
                proc.kill()
                break
            pump()
            result.gave_up = give_up() if give_up else None
            if result.gave_up:
                proc.kill()
                break
            time.sleep(0.2)
        proc.wait()
        pump(final=True)
        result.qemu_status = proc.returncode
        qemu_log.close()
        if result.exit_status is None and not result.timed_out and not result.gave_up:
            with open(os.path.join(work, "qemu.log")) as f:
                for line in f.read().splitlines():
                    on_console("qemu: " + line)
        return result
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)
