"""A tiny hand-rolled NBD client for tests that must send what libnbd
never would: malformed options, hostile lengths, truncated handshakes."""
import socket
import struct

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REP_MAGIC = 0x0003E889045565A9
REQ_MAGIC = 0x25609513
REPLY_MAGIC = 0x67446698
OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_INFO, OPT_GO = 1, 2, 3, 6, 7
REP_ACK, REP_SERVER, REP_INFO = 1, 2, 3
REP_ERR_UNSUP, REP_ERR_INVALID, REP_ERR_TOO_BIG = 0x80000001, 0x80000003, 0x80000009
REP_ERR_UNKNOWN = 0x80000006
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH = 0, 1, 2, 3


class Wire:
    def __init__(self, path, timeout=10):
        """PATH: a Unix socket's path, or a (host, port) pair for TCP."""
        family = socket.AF_INET if isinstance(path, tuple) else socket.AF_UNIX
        self.s = socket.socket(family, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(path)

    def close(self):
        self.s.close()

    def recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise EOFError(f"server closed after {len(buf)} of {n} bytes")
            buf += chunk
        return buf

    def greeting(self, client_flags=3):
        magic, opt, flags = struct.unpack(">QQH", self.recv_exact(18))
        assert magic == NBDMAGIC and opt == IHAVEOPT, "bad greeting"
        self.s.sendall(struct.pack(">I", client_flags))
        return flags

    def option(self, opt, data=b"", declared_len=None):
        n = len(data) if declared_len is None else declared_len
        self.s.sendall(struct.pack(">QII", IHAVEOPT, opt, n) + data)

    def reply(self):
        magic, opt, rtype, n = struct.unpack(">QIII", self.recv_exact(20))
        assert magic == REP_MAGIC, f"bad option reply magic {magic:#x}"
        return opt, rtype, self.recv_exact(n)

    def go(self, name=b"", info=()):
        data = struct.pack(">I", len(name)) + name + struct.pack(">H", len(info))
        data += b"".join(struct.pack(">H", i) for i in info)
        self.option(OPT_GO, data)
        replies = []
        while True:
            r = self.reply()
            replies.append(r)
            if r[1] != REP_INFO:
                return replies

    def request(self, cmd, offset=0, length=0, flags=0, cookie=1, payload=b""):
        self.s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, flags, cmd, cookie,
                                   offset, length) + payload)

    def simple_reply(self, data_len=0):
        magic, error, cookie = struct.unpack(">IIQ", self.recv_exact(16))
        assert magic == REPLY_MAGIC, f"bad reply magic {magic:#x}"
        data = self.recv_exact(data_len) if error == 0 and data_len else b""
        return error, cookie, data
