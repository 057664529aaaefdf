#!/usr/bin/python3
"""Structured replies and base:allocation, by the protocol, over TCP.
LIST and SET_META_CONTEXT before STRUCTURED_REPLY, and STRUCTURED_REPLY
with a payload, are NBD_REP_ERR_INVALID.  LIST with no query, or with the
"base:" wildcard, returns base:allocation (id 0); LIST of another
namespace only ACKs; a query longer than the option, INVALID; another
export's name, UNKNOWN.  SET ignores "base:" and unknown contexts (no id),
selects base:allocation with a nonzero id, and a failed SET drops an
earlier selection.  In transmission: BLOCK_STATUS without a selection
(no SET, or one that failed) is an NBD_REPLY_TYPE_ERROR chunk (EINVAL, flagged DONE); with one, a single
BLOCK_STATUS chunk under the selected id whose descriptors are the file's
map (HOLE|ZERO for holes), one descriptor within the length under
REQ_ONE; a READ is one OFFSET_DATA chunk, an out-of-range READ or
BLOCK_STATUS an EINVAL error chunk, each flagged DONE; a client that
negotiated nothing gets simple replies, BLOCK_STATUS included.  libnbd
agrees: opt_list_meta_context lists base:allocation, and block_status
with REQ_ONE returns one extent."""
import struct

import harness
import netserver
import nbdwire as nw
import nbd

SIZE = 8 << 20
DATA = (1 << 20, 64 << 10)            # one data extent, holes around it
BA = b"base:allocation"
EINVAL = 22

image = harness.make_image(SIZE)
with open(image, "r+b") as f:
    f.seek(DATA[0])
    f.write(b"\xab" * DATA[1])
srv = netserver.NetServer(image, ["--export-name", "disk"])


def connect():
    w = nw.Wire(srv.addr)
    harness.on_exit(w.close)
    w.greeting()
    return w


def structured(w):
    w.option(nw.OPT_STRUCTURED_REPLY)
    assert w.reply() == (nw.OPT_STRUCTURED_REPLY, nw.REP_ACK, b"")


def go(w, name=b"disk"):
    replies = w.go(name)
    assert replies[-1][1] == nw.REP_ACK, replies


def expect_error_chunk(w, cookie, error=EINVAL):
    flags, ctype, c, payload = w.chunk()
    assert c == cookie, (c, cookie)
    assert ctype == nw.REPLY_TYPE_ERROR and flags & nw.REPLY_FLAG_DONE, (flags, ctype)
    err, msg_len = struct.unpack(">IH", payload[:6])
    assert err == error and len(payload) == 6 + msg_len, (err, payload)


def block_status_refused_after_go(w):
    """GO, then BLOCK_STATUS with no context selected: an error chunk."""
    go(w)
    w.request(nw.CMD_BLOCK_STATUS, 0, 4096, cookie=1)
    expect_error_chunk(w, 1)
    w.close()


def block_status(w, offset, length, flags=0, cookie=7):
    w.request(nw.CMD_BLOCK_STATUS, offset, length, flags=flags, cookie=cookie)
    cflags, ctype, c, payload = w.chunk()
    assert c == cookie and ctype == nw.REPLY_TYPE_BLOCK_STATUS, (c, ctype, payload)
    assert cflags & nw.REPLY_FLAG_DONE, cflags
    ctx, = struct.unpack(">I", payload[:4])
    n = (len(payload) - 4) // 8
    assert len(payload) == 4 + 8 * n and n >= 1, payload
    return ctx, [struct.unpack(">II", payload[4 + 8 * i:12 + 8 * i]) for i in range(n)]


# --- negotiation ---------------------------------------------------------
w = connect()
for opt in (nw.OPT_LIST_META_CONTEXT, nw.OPT_SET_META_CONTEXT):
    assert w.meta_context(opt, b"disk", [BA]) == ([], nw.REP_ERR_INVALID), opt
w.option(nw.OPT_STRUCTURED_REPLY, b"x")
assert w.reply()[1] == nw.REP_ERR_INVALID
structured(w)
structured(w)                           # twice: still fine
L, S = nw.OPT_LIST_META_CONTEXT, nw.OPT_SET_META_CONTEXT
assert w.meta_context(L, b"disk") == ([(0, BA)], nw.REP_ACK)
assert w.meta_context(L, b"disk", [b"base:"]) == ([(0, BA)], nw.REP_ACK)
assert w.meta_context(L, b"disk", [b"base:", BA]) == ([(0, BA)], nw.REP_ACK)
assert w.meta_context(L, b"disk", [b"x-other:thing"]) == ([], nw.REP_ACK)
assert w.meta_context(L, b"other", [BA]) == ([], nw.REP_ERR_UNKNOWN)
# A query whose length runs past the option.
w.option(L, struct.pack(">I", 4) + b"disk" + struct.pack(">II", 1, 99) + BA)
assert w.reply()[1] == nw.REP_ERR_INVALID
assert w.meta_context(S, b"disk", [b"base:"]) == ([], nw.REP_ACK)
assert w.meta_context(S, b"disk", [b"x-other:thing", b"base:nothing"]) == ([], nw.REP_ACK)
contexts, final = w.meta_context(S, b"disk", [b"x-other:thing", BA])
assert final == nw.REP_ACK and len(contexts) == 1 and contexts[0][1] == BA, contexts
ba_id = contexts[0][0]
assert ba_id != 0
# A SET that fails drops the selection: BLOCK_STATUS is refused after GO.
assert w.meta_context(S, b"other", [BA]) == ([], nw.REP_ERR_UNKNOWN)
block_status_refused_after_go(w)

# Structured replies but no SET at all: BLOCK_STATUS is an error chunk.
w = connect()
structured(w)
block_status_refused_after_go(w)

# --- transmission with base:allocation -----------------------------------
w = connect()
structured(w)
contexts, final = w.meta_context(S, b"disk", [BA])
assert final == nw.REP_ACK and [c[1] for c in contexts] == [BA]
ba_id = contexts[0][0]
go(w)
ctx, descs = block_status(w, 0, SIZE)
assert ctx == ba_id, (ctx, ba_id)
hole = nw.STATE_HOLE | nw.STATE_ZERO
assert descs == [(DATA[0], hole), (DATA[1], 0), (SIZE - sum(DATA), hole)], descs
ctx, descs = block_status(w, 0, 4096, flags=nw.CMD_FLAG_REQ_ONE)
assert descs == [(4096, hole)], descs
ctx, descs = block_status(w, DATA[0] - 512, 1 << 20, flags=nw.CMD_FLAG_REQ_ONE)
assert descs == [(512, hole)], descs
ctx, descs = block_status(w, DATA[0], 1 << 20, flags=nw.CMD_FLAG_REQ_ONE)
assert descs == [(DATA[1], 0)], descs
for off, n in ((SIZE, 512), (SIZE - 512, 1024), (0, 0)):
    w.request(nw.CMD_BLOCK_STATUS, off, n, cookie=9)
    expect_error_chunk(w, 9)
# READ: one OFFSET_DATA chunk; out of range: an error chunk.
w.request(nw.CMD_READ, DATA[0], 4096, cookie=3)
flags, ctype, c, payload = w.chunk()
assert (c, ctype, flags & nw.REPLY_FLAG_DONE) == (3, nw.REPLY_TYPE_OFFSET_DATA, 1)
assert payload == struct.pack(">Q", DATA[0]) + b"\xab" * 4096
for off, n in ((SIZE - 512, 1024), (SIZE, 512), (1 << 62, 512)):
    w.request(nw.CMD_READ, off, n, cookie=4)
    expect_error_chunk(w, 4)
w.request(nw.CMD_READ, 0, 512, flags=1 << 2, cookie=5)   # DF: one chunk
flags, ctype, c, payload = w.chunk()
assert (c, ctype, flags & nw.REPLY_FLAG_DONE) == (5, nw.REPLY_TYPE_OFFSET_DATA, 1)
assert payload == struct.pack(">Q", 0) + bytes(512)
# A FLUSH: a simple reply is still allowed and used.
w.request(nw.CMD_FLUSH, cookie=6)
assert w.simple_reply() == (0, 6, b"")
w.close()

# --- a selection for another name does not carry over --------------------
anyname = netserver.NetServer(image)
w = nw.Wire(anyname.addr)
harness.on_exit(w.close)
w.greeting()
structured(w)
assert len(w.meta_context(S, b"a", [BA])[0]) == 1
go(w, b"b")
w.request(nw.CMD_BLOCK_STATUS, 0, 4096, cookie=2)
expect_error_chunk(w, 2)
w.close()

# --- no negotiation: simple replies, exactly as before -------------------
w = connect()
go(w)
w.request(nw.CMD_READ, DATA[0], 512, cookie=11)
assert w.simple_reply(512) == (0, 11, b"\xab" * 512)
w.request(nw.CMD_READ, SIZE, 512, cookie=12)
assert w.simple_reply(512) == (EINVAL, 12, b"")
w.request(nw.CMD_BLOCK_STATUS, 0, 4096, cookie=13)
assert w.simple_reply() == (EINVAL, 13, b"")
w.close()

# --- libnbd --------------------------------------------------------------
h = nbd.NBD()
h.set_export_name("disk")
h.set_opt_mode(True)
h.connect_tcp(*map(str, srv.addr))
harness.on_exit(lambda: netserver.disconnect(h))
listed = []
assert h.opt_list_meta_context(lambda name: listed.append(name) or 0) == 1
assert listed == ["base:allocation"], listed
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.opt_go()
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
got = []
h.block_status(SIZE - DATA[0], DATA[0], lambda ctx, off, entries, err: got.extend(entries) or 0,
               nbd.CMD_FLAG_REQ_ONE)
assert got == [DATA[1], 0], got
assert h.pread(4096, DATA[0]) == b"\xab" * 4096
h.shutdown()

assert srv.alive() and anyname.alive()
anyname.stop()
srv.stop()
print("ok: structured replies, meta contexts and BLOCK_STATUS by the protocol "
      f"(base:allocation id {ba_id}); simple replies without negotiation")
