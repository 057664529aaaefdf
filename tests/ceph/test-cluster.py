#!/usr/bin/python3
"""The Ceph fixture (tests/ceph/cluster.py) on its own, before anything of
mloop's uses it: a real one-node cluster starts on loopback only, with
cephx, takes IO through the rbd command and librbd's Python binding
(python3-rbd, when installed), keeps a snapshot read-only and unchanged,
keeps its data across an OSD restart and an OSD crash, and leaves no
process or file behind.  SKIPs (77) without the Ceph packages.

Cost on the project machine (2 cores): 15-17 s, 17-27 s while other
tests load both cores: start 5-10 s, IO and snapshot checks 4 s, the
two OSD restarts 2.5-5 s each, stop 0.1 s.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time

import cluster  # beside this file

reason = cluster.missing_reason()
if reason:
    print(f"SKIP: {reason}")
    sys.exit(77)

try:
    import rados
    import rbd
except ImportError:
    rbd = None

MiB = 1 << 20
failed = []


# tests/harness.py has these, but importing it needs an NBD server to test.
def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail and not ok else ""),
          flush=True)
    if not ok:
        failed.append(name)
    return ok


def exit_if_failed():
    if failed:
        sys.exit(f"{len(failed)} check(s) failed: {', '.join(failed)}")


def listening_addresses(pids):
    """The local addresses (ip, port) of the TCP sockets that PIDS listen
    on, from /proc: every daemon must listen on 127.0.0.1 only."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                    continue
                ip, port = cols[1].split(":")
                if len(ip) == 8:  # IPv4, as a little-endian word
                    ip = ".".join(str(int(ip[i:i + 2], 16)) for i in (6, 4, 2, 0))
                found.append((ip, int(port, 16)))
    return found


def rbd_cli(c, *args):
    return subprocess.run(["rbd", *c.client_args(), *args], capture_output=True,
                          text=True, timeout=120)


def export(c, spec, path):
    """The bytes of SPEC, read with rbd export."""
    p = rbd_cli(c, "export", "--no-progress", spec, path)
    if p.returncode != 0:
        return f"rbd export failed: {p.stderr.strip()}".encode()
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    return data


rng = random.Random(1)
pattern = rng.randbytes(6 * MiB + 4096)  # not a whole number of 4 MiB objects

t = time.monotonic()
c = cluster.Cluster()
try:
    c.start()
    print(f"# started in {c.times['start']:.1f} s: " +
          ", ".join(f"{k} {v:.1f} s" for k, v in c.times.items() if k != "start"))
    daemon_pids = [d.proc.pid for d in c.daemons.values()]
    cluster_dir = c.dir
    # The test's own files go with the cluster's, removed with them.
    work = c.path("test")
    os.mkdir(work)

    check("health is HEALTH_OK", c.ceph("health").strip() == "HEALTH_OK",
          c.ceph("health", "detail"))
    addrs = listening_addresses(daemon_pids)
    check("every daemon listens, on 127.0.0.1 only",
          addrs and all(ip == "127.0.0.1" for ip, _ in addrs), repr(addrs))
    auth = c.ceph_json("auth", "get", c.client_name)
    check("the test client has cephx caps on its pool only",
          auth[0]["caps"].get("osd") == f"profile rbd pool={c.pool}", repr(auth))

    # The rbd command: a file imported as an image reads back whole.
    src = os.path.join(work, "pattern")
    with open(src, "wb") as f:
        f.write(pattern)
    p = rbd_cli(c, "import", "--no-progress", src, c.spec("imported"))
    check("rbd import", p.returncode == 0, p.stderr)
    out = os.path.join(work, "out")
    check("rbd export reads what rbd import wrote",
          export(c, c.spec("imported"), out) == pattern)

    c.create_image("disk", 64 * MiB)
    info = json.loads(c.rbd("info", "--format", "json", c.spec("disk")))
    check("create_image makes an image of the size asked", info["size"] == 64 * MiB, repr(info))
    check("images() lists both", sorted(c.images()) == ["disk", "imported"], repr(c.images()))

    if rbd:
        # librbd through python3-rbd, as the test client: writes at an
        # unaligned offset across an object boundary, read back by librbd
        # and by the rbd command.
        r = rados.Rados(conffile=c.conf, rados_id=c.client_id)
        r.connect(timeout=30)
        ioctx = r.open_ioctx(c.pool)
        offset = 4 * MiB - 1000
        with rbd.Image(ioctx, "disk") as image:
            image.write(pattern, offset)
            check("librbd reads what it wrote", image.read(offset, len(pattern)) == pattern)
        expected = bytes(offset) + pattern + bytes(64 * MiB - offset - len(pattern))
        check("rbd export reads what librbd wrote", export(c, c.spec("disk"), out) == expected)
    else:
        print("# python3-rbd is not installed: librbd checks skipped")
        p = rbd_cli(c, "import", "--no-progress", src, c.spec("disk2"))
        check("rbd import of a second image", p.returncode == 0, p.stderr)
        expected = pattern

    # A snapshot: frozen at its creation, and no writes through it.
    name = "disk" if rbd else "disk2"
    p = rbd_cli(c, "snap", "create", c.spec(name, "s1"))
    check("rbd snap create", p.returncode == 0, p.stderr)
    p = rbd_cli(c, "bench", "--io-type", "write", "--io-total", "1M", c.spec(name, "s1"))
    check("rbd refuses to write to a snapshot", p.returncode != 0, p.stdout + p.stderr)
    if rbd:
        with rbd.Image(ioctx, name, snapshot="s1") as snap:
            try:
                snap.write(b"x" * 4096, 0)
                check("librbd refuses a write to a snapshot (EROFS)", False, "it was written")
            except rbd.ReadOnlyImage:
                check("librbd refuses a write to a snapshot (EROFS)", True)
        with rbd.Image(ioctx, name) as image:
            image.write(b"\xff" * MiB, 0)
        new_head = b"\xff" * MiB + expected[MiB:]
    else:
        # rbd bench writes data of its own, not known here: the image must
        # differ from the snapshot after it.
        p = rbd_cli(c, "bench", "--io-type", "write", "--io-pattern", "seq",
                    "--io-total", "1M", c.spec(name))
        check("rbd bench writes to the image", p.returncode == 0, p.stderr)
        new_head = export(c, c.spec(name), out)
    check("the snapshot keeps the data it was taken with",
          export(c, c.spec(name, "s1"), out) == expected)
    check("the image has the data written after the snapshot",
          export(c, c.spec(name), out) == new_head != expected)

    # The OSD stopped and started again, as a later test will do under IO:
    # a clean stop, then a crash.  Each restart is a new instance, with
    # the same data.
    for sig in (signal.SIGTERM, signal.SIGKILL):
        t0 = time.monotonic()
        c.stop_osd(sig)
        check(f"osd.0 stops on {sig.name}", not c.daemons["osd"].alive())
        c.start_osd()
        check(f"osd.0 restarts after {sig.name} ({time.monotonic() - t0:.1f} s)",
              c.daemons["osd"].alive())
        check(f"the data survives the OSD's {sig.name}",
              export(c, c.spec(name), out) == new_head and
              export(c, c.spec("imported"), out) == pattern)
    daemon_pids.append(c.daemons["osd"].proc.pid)

    if rbd:
        ioctx.close()
        r.shutdown()
    for image in c.images():
        c.remove_image(image)
    check("remove_image removes images and their snapshots", c.images() == [])
finally:
    c.stop()

print(f"# stopped in {c.times['stop']:.2f} s; whole test {time.monotonic() - t:.1f} s")
alive = [pid for pid in daemon_pids if os.path.exists(f"/proc/{pid}")]
check("no daemon is left running", alive == [], repr(alive))
check("no file is left", not os.path.exists(cluster_dir), cluster_dir)
exit_if_failed()
