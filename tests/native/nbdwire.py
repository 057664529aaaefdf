"""A tiny hand-rolled NBD client for tests that must send what libnbd
never would: malformed options, hostile lengths, truncated handshakes."""
import socket
import struct

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REP_MAGIC = 0x0003E889045565A9
REQ_MAGIC = 0x25609513
REPLY_MAGIC = 0x67446698
STRUCTURED_MAGIC = 0x668E33EF
OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_INFO, OPT_GO = 1, 2, 3, 6, 7
OPT_STRUCTURED_REPLY, OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT = 8, 9, 10
REP_ACK, REP_SERVER, REP_INFO, REP_META_CONTEXT = 1, 2, 3, 4
REP_ERR_UNSUP, REP_ERR_INVALID, REP_ERR_TOO_BIG = 0x80000001, 0x80000003, 0x80000009
REP_ERR_UNKNOWN = 0x80000006
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH = 0, 1, 2, 3
CMD_BLOCK_STATUS = 7
CMD_FLAG_REQ_ONE = 1 << 3
REPLY_FLAG_DONE = 1
REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA, REPLY_TYPE_BLOCK_STATUS = 0, 1, 5
REPLY_TYPE_ERROR, REPLY_TYPE_ERROR_OFFSET = 0x8001, 0x8002
STATE_HOLE, STATE_ZERO = 1, 2


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

    def meta_context(self, opt, name=b"", queries=()):
        """LIST or SET_META_CONTEXT: ([(id, context name)], final reply type)."""
        data = struct.pack(">I", len(name)) + name + struct.pack(">I", len(queries))
        data += b"".join(struct.pack(">I", len(q)) + q for q in queries)
        self.option(opt, data)
        contexts = []
        while True:
            o, rtype, payload = self.reply()
            assert o == opt, f"reply for option {o}, not {opt}"
            if rtype != REP_META_CONTEXT:
                return contexts, rtype
            contexts.append((struct.unpack(">I", payload[:4])[0], payload[4:]))

    def request(self, cmd, offset=0, length=0, flags=0, cookie=1, payload=b""):
        self.s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, flags, cmd, cookie,
                                   offset, length) + payload)

    def simple_reply(self, data_len=0):
        magic, error, cookie = struct.unpack(">IIQ", self.recv_exact(16))
        assert magic == REPLY_MAGIC, f"bad reply magic {magic:#x}"
        data = self.recv_exact(data_len) if error == 0 and data_len else b""
        return error, cookie, data

    def chunk(self):
        """One structured reply chunk: (flags, type, cookie, payload)."""
        magic, flags, ctype, cookie, n = struct.unpack(">IHHQI", self.recv_exact(20))
        assert magic == STRUCTURED_MAGIC, f"bad chunk magic {magic:#x}"
        return flags, ctype, cookie, self.recv_exact(n)
