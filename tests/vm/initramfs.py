"""The kernel-test VM's initramfs: busybox, tests/vm/init, the modules needed
to reach the host's root over 9p, and the generated configuration.

Written as an uncompressed newc cpio archive by this module itself, so it
needs neither root (the /dev/console node is only a header) nor cpio.
Compressed modules (6.12 ships .ko.xz) are stored decompressed: busybox's
insmod takes plain .ko files.
"""
import lzma
import os
import subprocess

# Modules the guest cannot load before the 9p share is mounted: the virtio
# PCI transport and the 9p filesystem.  The rest is loaded after the chroot
# with the host's kmod (see init).
BOOT_MODULES = ["virtio_pci", "9pnet_virtio", "9p"]
# Loaded with `modprobe -d` once the host root is mounted.
LATER_MODULES = ["virtio_blk", "ext4", "crc32c_generic", "nbd", "loop"]
# Loaded likewise where the kernel has them: ublk_drv is in Debian's 6.12,
# not in its 6.1 (CONFIG_BLK_DEV_UBLK unset there).
OPTIONAL_MODULES = ["ublk_drv"]

BUSYBOX_CANDIDATES = ["/bin/busybox", "/usr/bin/busybox"]


class _Cpio:
    """A newc ("070701") archive writer: header, name, data, each padded
    to four bytes."""

    def __init__(self, f):
        self.f = f
        self.ino = 1

    def _entry(self, name, mode, data=b"", rdev=(0, 0)):
        name_b = name.encode() + b"\0"
        fields = [self.ino, mode, 0, 0, 1, 0, len(data), 0, 0,
                  rdev[0], rdev[1], len(name_b), 0]
        self.ino += 1
        header = b"070701" + b"".join(b"%08X" % v for v in fields)
        self.f.write(header + name_b)
        self.f.write(b"\0" * (-(len(header) + len(name_b)) % 4))
        self.f.write(data)
        self.f.write(b"\0" * (-len(data) % 4))

    def directory(self, name):
        self._entry(name, 0o040755)

    def file(self, name, data, mode=0o644):
        self._entry(name, 0o100000 | mode, data)

    def char_device(self, name, major, minor):
        self._entry(name, 0o020600, rdev=(major, minor))

    def close(self):
        self._entry("TRAILER!!!", 0)


def find_busybox():
    """Path of a statically linked busybox (package busybox-static), or
    None: the initramfs has no libc for a dynamic one."""
    for path in BUSYBOX_CANDIDATES:
        if os.path.exists(path):
            with open(path, "rb") as f:
                head = f.read(4096)
            # A dynamic executable names its loader in PT_INTERP, near the start.
            if b"ld-linux" not in head:
                return path
    return None


def boot_module_files(moddir, kver):
    """The .ko files BOOT_MODULES need, in load order, without repeats
    (kmod's --show-depends lists each module's dependencies first)."""
    out = subprocess.run(["modprobe", "-d", moddir, "-S", kver, "--show-depends",
                          "-a", *BOOT_MODULES],
                         capture_output=True, text=True, check=True).stdout
    files = []
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["insmod"] and words[1] not in files:
            files.append(words[1])
    return files


def has_module(moddir, kver, name):
    """Whether the kernel KVER (its tree in MODDIR) has module NAME."""
    return subprocess.run(["modprobe", "-d", moddir, "-S", kver, "--show-depends", name],
                          capture_output=True).returncode == 0


def later_modules(moddir, kver):
    """LATER_MODULES and those OPTIONAL_MODULES the kernel KVER has."""
    return LATER_MODULES + [m for m in OPTIONAL_MODULES if has_module(moddir, kver, m)]


def module_name_and_data(path):
    """(NAME.ko, contents) of the module file PATH, decompressed if it is
    a .ko.xz."""
    base = os.path.basename(path)
    with open(path, "rb") as k:
        data = k.read()
    if base.endswith(".ko.xz"):
        return base[:-len(".xz")], lzma.decompress(data)
    if not base.endswith(".ko"):
        raise ValueError(f"{path}: a module compression busybox cannot load")
    return base, data


def build(path, busybox, moddir, kver, guest_cmd, preserve=(), out=False, early_cmd=""):
    """Writes the initramfs to PATH; GUEST_CMD is the shell script the guest
    runs chrooted into the host root, EARLY_CMD one it runs there first,
    while only one vCPU is up (tests/vm/init says why); PRESERVE lists host directories under
    /tmp, /run or /var/tmp to keep visible over the guest's mounts there;
    OUT says whether qemu shares an output directory (tag "out")."""
    init = os.path.join(os.path.dirname(os.path.abspath(__file__)), "init")
    modules = boot_module_files(moddir, kver)
    conf = (f"KVER='{kver}'\nMODDIR='{moddir}'\n"
            f"MODULES='{' '.join(later_modules(moddir, kver))}'\n"
            f"PRESERVE='{' '.join(preserve)}'\n"
            f"OUT='{1 if out else ''}'\n")
    with open(path, "wb") as f:
        a = _Cpio(f)
        for d in ["bin", "dev", "proc", "sys", "etc", "host", "lib", "lib/modules"]:
            a.directory(d)
        # Without /dev/console the kernel starts init with no stdio.
        a.char_device("dev/console", 5, 1)
        with open(busybox, "rb") as b:
            a.file("bin/busybox", b.read(), 0o755)
        with open(init, "rb") as i:
            a.file("init", i.read(), 0o755)
        a.file("etc/vm.conf", conf.encode())
        a.file("etc/guest-cmd", guest_cmd.encode())
        a.file("etc/guest-early-cmd", early_cmd.encode())
        unpacked = [module_name_and_data(m) for m in modules]
        a.file("etc/modules.order", "".join(n + "\n" for n, _ in unpacked).encode())
        for name, data in unpacked:
            a.file("lib/modules/" + name, data)
        a.close()
