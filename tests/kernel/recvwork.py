"""The kernel NBD client's receive work, and a guard against Linux 6.1
starving it (docs/design.md, "A request held for the whole timeout").

For each connection the kernel queues one work item, recv_work, on the
device's "nbdN-recv" workqueue (unbound, high priority, WQ_MEM_RECLAIM); it
reads that connection's replies for as long as the connection lives.  When
a burst of them is queued and the worker pool must create a kworker for
them, and creating one takes longer than 10 ms (MAYDAY_INITIAL_TIMEOUT:
easy under TCG on a busy host), the workqueue's rescuer steps in.  On 6.1
the rescuer moves *every* pending item of that workqueue onto its own list
and runs them one after another; the first never returns while its
connection lives, so the other connections' replies are never read: their
requests wait for the request timeout, and the stale replies are read as
"Unexpected reply" once the first connection closes.  Debian's 6.12 has
the rescuer take one item at a time, leaving the rest to kworkers.

What userspace can see: a kworker running a work item reports it in its
name (/proc/PID/comm "kworker/u9:0+nbd0-recv"; the rescuer "nbd0-recv" on
6.1, "kworker/R-nbd0-recv" on 6.12, does the same while it runs one).

  receivers(index)        receive works running for /dev/nbdINDEX
  starved(dev, n)         a reason when fewer than N of DEV's connections
                          have their receive work running, else None
  warm(connections)       makes the pool create idle kworkers, so that a
                          later connect never needs to create one
"""
import os
import re
import socket
import struct
import time

NETLINK_GENERIC = 16
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
GENL_ID_CTRL, CTRL_CMD_GETFAMILY = 0x10, 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2
# include/uapi/linux/nbd-netlink.h
NBD_CMD_CONNECT, NBD_CMD_DISCONNECT = 1, 2
NBD_ATTR_INDEX, NBD_ATTR_SIZE_BYTES, NBD_ATTR_BLOCK_SIZE_BYTES = 1, 2, 3
NBD_ATTR_SERVER_FLAGS, NBD_ATTR_SOCKETS = 5, 7
NBD_FLAG_HAS_FLAGS, NBD_FLAG_CAN_MULTI_CONN = 1 << 0, 1 << 8
NBD_SOCK_ITEM, NBD_SOCK_FD = 1, 1
NLA_F_NESTED = 1 << 15


def _receiver_comms(index):
    """The command names of the threads now running one of
    /dev/nbdINDEX's receive works (a kworker's comm carries the work's
    queue after a "+")."""
    suffix = f"+nbd{index}-recv"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm.endswith(suffix):
            yield comm


def receivers(index):
    """How many of /dev/nbdINDEX's receive works are running now."""
    return sum(1 for _ in _receiver_comms(index))


def starved(dev, connections, timeout=10):
    """None once all CONNECTIONS of DEV have their receive work running;
    a reason if that does not happen within TIMEOUT seconds."""
    index = int(re.search(r"(\d+)$", dev).group(1))
    deadline = time.monotonic() + timeout
    while True:
        n = receivers(index)
        if n >= connections:
            return None
        if time.monotonic() > deadline:
            return (f"{dev}: the kernel runs the receive work of {n} of its {connections} "
                    f"connections (Linux 6.1's workqueue rescuer holds the rest, see "
                    f"tests/kernel/recvwork.py); requests on the others wait for the "
                    f"request timeout")
        time.sleep(0.05)


def _attr(kind, payload):
    data = struct.pack("=HH", 4 + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


class _Genl:
    def __init__(self):
        self.s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
        self.s.bind((0, 0))
        self.seq = 0

    def close(self):
        self.s.close()

    def request(self, family, cmd, attrs, version=1):
        """Sends a request and returns the reply messages' attribute bytes;
        raises OSError with the kernel's errno."""
        self.seq += 1
        body = struct.pack("=BBH", cmd, version, 0) + b"".join(attrs)
        self.s.send(struct.pack("=IHHII", 16 + len(body), family,
                                NLM_F_REQUEST | NLM_F_ACK, self.seq, 0) + body)
        replies = []
        while True:
            data = self.s.recv(65536)
            off = 0
            while off < len(data):
                length, mtype, _, seq, _ = struct.unpack_from("=IHHII", data, off)
                if mtype == NLMSG_ERROR:
                    err = struct.unpack_from("=i", data, off + 16)[0]
                    if err:
                        raise OSError(-err, os.strerror(-err))
                    return replies
                replies.append(data[off + 20:off + length])
                off += (length + 3) & ~3

    def family(self, name):
        for attrs in self.request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY,
                                  [_attr(CTRL_ATTR_FAMILY_NAME, name.encode() + b"\0")]):
            off = 0
            while off + 4 <= len(attrs):
                alen, akind = struct.unpack_from("=HH", attrs, off)
                if akind == CTRL_ATTR_FAMILY_ID:
                    return struct.unpack_from("=H", attrs, off + 4)[0]
                off += (alen + 3) & ~3
        raise OSError(f"no generic netlink family {name!r}")


def _free_index():
    """The highest-numbered nbd device with nothing connected."""
    names = [d for d in os.listdir("/sys/block") if re.fullmatch(r"nbd\d+", d)]
    for d in sorted(names, key=lambda d: -int(d[3:])):
        try:
            with open(f"/sys/block/{d}/size") as f:
                if f.read().strip() == "0" and not os.path.exists(f"/sys/block/{d}/pid"):
                    return int(d[3:])
        except OSError:
            continue
    return None


def warm(need=13, connections=16, rounds=5):
    """Connects a spare nbd device with CONNECTIONS socket pairs (no server,
    no IO) and disconnects it, until NEED receive works ran on kworkers at
    once: the pool then keeps that many kworkers idle (for 5 minutes),
    so a later connect of fewer connections never waits for one to be
    created.  NEED covers three devices of 4 connections at once (as
    test-cli-detach-forms.py attaches) and a spare.
    Returns the rounds it took (ROUNDS + 1 if never), or None if the
    kernel has no nbd or no spare device."""
    index = _free_index()
    if index is None:
        return None
    g = _Genl()
    try:
        try:
            family = g.family("nbd")
        except OSError:
            return None
        for r in range(1, rounds + 1):
            pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                     for _ in range(connections)]
            try:
                items = b"".join(_attr(NBD_SOCK_ITEM | NLA_F_NESTED,
                                       _attr(NBD_SOCK_FD, struct.pack("=I", a.fileno())))
                                 for a, _ in pairs)
                g.request(family, NBD_CMD_CONNECT, [
                    _attr(NBD_ATTR_INDEX, struct.pack("=I", index)),
                    _attr(NBD_ATTR_SIZE_BYTES, struct.pack("=Q", 1 << 20)),
                    _attr(NBD_ATTR_BLOCK_SIZE_BYTES, struct.pack("=Q", 4096)),
                    _attr(NBD_ATTR_SERVER_FLAGS, struct.pack(
                        "=Q", NBD_FLAG_HAS_FLAGS | NBD_FLAG_CAN_MULTI_CONN)),
                    _attr(NBD_ATTR_SOCKETS | NLA_F_NESTED, items)])
                # Until every receive work runs, or no new kworker took
                # one for a while (the rescuer holds the rest).
                deadline = time.monotonic() + 3
                last, since = -1, time.monotonic()
                while time.monotonic() < deadline:
                    n = receivers(index)
                    if n >= connections:
                        break
                    if n != last:
                        last, since = n, time.monotonic()
                    elif time.monotonic() - since > 0.5:
                        break
                    time.sleep(0.02)
                on_kworkers = receivers(index) - _rescuer_busy(index)
                g.request(family, NBD_CMD_DISCONNECT,
                          [_attr(NBD_ATTR_INDEX, struct.pack("=I", index))])
            finally:
                for a, b in pairs:
                    a.close()
                    b.close()
            # The disconnect ends every receive work; wait for them to go.
            deadline = time.monotonic() + 10
            while receivers(index) and time.monotonic() < deadline:
                time.sleep(0.02)
            if on_kworkers >= need:
                return r
        return rounds + 1
    finally:
        g.close()


def _rescuer_busy(index):
    """1 if /dev/nbdINDEX's workqueue rescuer is running a work item."""
    return int(any(not comm.startswith("kworker/u")
                   for comm in _receiver_comms(index)))
