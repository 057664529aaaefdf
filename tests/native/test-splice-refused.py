#!/usr/bin/python3
"""Where splicing is refused, read replies are copied and nothing breaks.

mloop-server --splice on sends a large READ's data to a Unix socket by
page reference (vmsplice, then splice: server/splice_out.h).  A systemd unit's
SystemCallFilter= or a container's seccomp profile may refuse either
call.  The server must then copy the replies: it says so once at start,
and every read returns the image's bytes.  Here a real seccomp filter,
installed in the server's process before it starts, refuses:

- vmsplice altogether, and splice altogether: the start-up check fails,
  the log says why, and no connection holds a pipe;
- only the connections' non-blocking vmsplice (the start-up check's
  blocking one passes): the first large reply's lend fails, and that
  connection copies from then on, the same reply included.

Cost: under 2 s."""
import ctypes
import errno
import os
import platform
import struct

import harness
import nbdwire as nw

MIB = 1 << 20
SIZE = 16 * MIB

if platform.machine() != "x86_64":
    harness.skip("the seccomp filter here knows x86-64 system call numbers only")

NR_SPLICE, NR_VMSPLICE = 275, 278
AUDIT_ARCH_X86_64 = 0xC000003E
SPLICE_F_NONBLOCK = 2
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
LD_ABS_W, JEQ_K, RET_K = 0x20, 0x15, 0x06
# struct seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 * i.
NR, ARCH, ARG3 = 0, 4, 16 + 8 * 3


def refusing(nr, err, arg3=None):
    """A preexec function that makes system call NR fail with ERR (only
    when its fourth argument is ARG3, if given)."""
    prog = [(LD_ABS_W, 0, 0, ARCH),
            (JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
            (RET_K, 0, 0, RET_ALLOW),
            (LD_ABS_W, 0, 0, NR),
            (JEQ_K, 0, 3 if arg3 is not None else 1, nr)]
    if arg3 is not None:
        prog += [(LD_ABS_W, 0, 0, ARG3),
                 (JEQ_K, 0, 1, arg3)]
    prog += [(RET_K, 0, 0, RET_ERRNO | err),
             (RET_K, 0, 0, RET_ALLOW)]
    code = b"".join(struct.pack("=HBBI", *ins) for ins in prog)

    def install():
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(code)
        fprog = struct.pack("=HxxxxxxQ", len(prog), ctypes.addressof(buf))
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
           libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
                      ctypes.c_char_p(fprog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "installing the seccomp filter")
    return install


data = harness.pattern(SIZE, 21)
image = harness.make_image(SIZE, data=data)


def read_all(srv):
    """Reads the image in 1 MiB requests, all sent before any reply is
    read, so replies queue behind a full socket; checks every byte."""
    w = nw.Wire(srv.sock, timeout=30)
    w.greeting()
    assert w.go()[-1][1] == nw.REP_ACK
    for i in range(SIZE // MIB):
        w.request(nw.CMD_READ, i * MIB, MIB, cookie=i)
    for _ in range(SIZE // MIB):
        error, cookie, got = w.simple_reply(MIB)
        assert error == 0, f"READ {cookie}: error {error}"
        assert got == data[cookie * MIB:(cookie + 1) * MIB], \
            f"READ {cookie}: wrong data"
    w.request(nw.CMD_DISC)
    w.close()


def pipes_held(srv):
    with open(os.path.join(srv.dir, "server.pid")) as f:
        pid = int(f.read())
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("pipe:")
        except FileNotFoundError:
            pass
    return n


for name, nr in (("vmsplice", NR_VMSPLICE), ("splice", NR_SPLICE)):
    srv = harness.Server(image, params=["splice=on"],
                         preexec_fn=refusing(nr, errno.ENOSYS))
    # Valgrind holds pipes of its own: count the connections' pipes only.
    before = pipes_held(srv)
    w = nw.Wire(srv.sock, timeout=30)       # held open while counting pipes
    w.greeting()
    assert w.go()[-1][1] == nw.REP_ACK
    read_all(srv)
    held = pipes_held(srv) - before
    w.close()
    srv.stop()
    log = srv.log_text()
    assert "read replies are copied" in log and \
        os.strerror(errno.ENOSYS) in log, \
        f"{name} refused: the log does not say replies are copied: {log!r}"
    assert held == 0, f"{name} refused: the server still holds {held} pipe ends"
    print(f"ok: {name} refused at start: replies copied, every byte right")

srv = harness.Server(image, params=["splice=on"],
                     preexec_fn=refusing(NR_VMSPLICE, errno.ENOMEM,
                                         arg3=SPLICE_F_NONBLOCK))
read_all(srv)
read_all(srv)                               # and a fresh connection too
srv.stop()
log = srv.log_text()
assert "read replies are copied, not" not in log, \
    f"the start-up check failed though it may splice: {log!r}"
assert "copies its read replies from now on: vmsplice: " + \
    os.strerror(errno.ENOMEM) in log, \
    f"a connection's failed vmsplice is not logged: {log!r}"
print("ok: a connection's vmsplice refused: it copies, every byte right")
