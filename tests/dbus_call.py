"""Calls mloop's D-Bus service the way a hostile or careless client
might, with dbus-python: run as a user by tests on a private bus
(servicebus.py).  Prints the service's answer on one line: "OK DEVICE",
or "ERROR message".

  dbus_call.py attach HOW PATH [NAME] [OPTION=BOOL...]
      HOW: rw, ro (O_RDWR, O_RDONLY), wo (O_WRONLY), path (O_PATH)
  dbus_call.py hangup PATH     send an attach and disconnect at once
  dbus_call.py attach-when-told PATH [ro]
      opens PATH (O_RDWR; ro: O_RDONLY, attached read-only), prints
      "OPEN", and attaches it once a line comes on stdin: the test
      changes the file's server meanwhile.
  dbus_call.py detach DEVICE
  dbus_call.py pile N PATH WAIT
      N read-only attaches of PATH sent at once, each allowing an
      authentication dialog (run under silent_agent.py, they wait),
      then one more without: its answer, at once on a line of its own
      ("FIRST answer"); then, once that answer changes (asked every
      0.2 s, for at most WAIT seconds), both on one line, "first / new".
  dbus_call.py heavy N attach|detach|list PATH FDS NAME_BYTES [REPEAT]
      N calls sent at once, as pile's, each carrying FDS descriptors of
      PATH (an attach's image is the first) and a name of NAME_BYTES
      bytes (0: PATH), an attach's option read-only given REPEAT times
      (default 1); prints "SENT" and waits for the answers, then
      prints them ("OK" or "ERROR message", one line each).  Through
      GDBus (python3-gi), since dbus-python sends only the descriptors
      the arguments name: exit 77 without it.
  dbus_call.py flood N PATH
      N read-only attaches of PATH expecting no reply, over 4
      connections, as fast as the bus takes them: a burst that fills the
      bus's queue to the service.  Prints "SENT".
  dbus_call.py answered-within SECONDS
      Lists every 0.1 s (each try given 1 s) until the service answers,
      for at most SECONDS: "ANSWERED T" (seconds it took) or "NO ANSWER".
  dbus_call.py repeat N PATH NAME
      N read-only attaches of PATH under NAME, one after the other:
      prints each distinct answer once, as "COUNT x ANSWER".
  dbus_call.py handle H PATH
      A read-only attach carrying one descriptor, of PATH, whose image
      argument names descriptor H of the message instead of the first
      (dbus-python numbers them itself: GDBus, as heavy).
  dbus_call.py carrying PATH ping|attach-relative|attach [N]
      A call carrying the descriptor of PATH (O_RDWR):
      org.freedesktop.DBus.Peer.Ping (which GDBus answers itself;
      anyone may send it), an attach under a relative name (refused
      before polkit is asked), or an attach of PATH.  Prints the answer
      (GDBus, as heavy).  With N, N such calls one after the other,
      each with a descriptor of its own: prints each distinct answer
      once, as "COUNT x ANSWER".
  dbus_call.py lingering
      A read-write attach (its name absolute, an authentication
      allowed) carrying a TCP socket on 127.0.0.1 in place of a file:
      SO_LINGER set (1,000,000 s) and data in it that its peer, this
      process, never reads.  None of its descriptors is kept here once
      the call is sent, and the bus closes its own once it has passed it
      on: run under silent_agent.py, the call waits for polkit, and the
      service's close, once it refuses the call, is the socket's last
      and waits for the data to go.  Prints "SENT", then keeps the peer
      until its standard input ends (dbus-python, which sends in the
      calling thread).
"""
import os
import sys
import time

import dbus
import dbus.lowlevel

OPEN_FLAGS = {"rw": os.O_RDWR, "ro": os.O_RDONLY, "wo": os.O_WRONLY,
              "path": os.O_PATH}


def manager(bus):
    return dbus.Interface(bus.get_object("org.mloop.Manager1", "/org/mloop/Manager1"),
                          "org.mloop.Manager1")


def main():
    bus = dbus.SystemBus()
    what = sys.argv[1]
    try:
        if what == "attach":
            how, path = sys.argv[2], sys.argv[3]
            name = sys.argv[4] if len(sys.argv) > 4 else os.path.abspath(path)
            options = {}
            for o in sys.argv[5:]:
                key, value = o.split("=")
                options[key] = dbus.Boolean(value == "true")
            fd = os.open(path, OPEN_FLAGS[how])
            device = manager(bus).Attach(dbus.types.UnixFd(fd), name,
                                         dbus.Dictionary(options, signature="sv"),
                                         timeout=120)
            print(f"OK {device}")
        elif what == "attach-when-told":
            ro = sys.argv[3:] == ["ro"]
            fd = os.open(sys.argv[2], os.O_RDONLY if ro else os.O_RDWR)
            print("OPEN", flush=True)
            sys.stdin.readline()
            # Sent at once, without introspecting the service first.
            m = dbus.Interface(bus.get_object("org.mloop.Manager1", "/org/mloop/Manager1",
                                              introspect=False), "org.mloop.Manager1")
            options = {"read-only": dbus.Boolean(True)} if ro else {}
            device = m.Attach(dbus.types.UnixFd(fd), sys.argv[2],
                                         dbus.Dictionary(options, signature="sv"),
                                         timeout=120)
            print(f"OK {device}")
        elif what == "hangup":
            fd = os.open(sys.argv[2], os.O_RDWR)
            manager(bus).Attach(dbus.types.UnixFd(fd), os.path.abspath(sys.argv[2]),
                                dbus.Dictionary({}, signature="sv"),
                                reply_handler=lambda *a: None,
                                error_handler=lambda *a: None)
            bus.flush()
            bus.close()
            print("OK sent")
        elif what == "pile":
            pile(bus, int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
        elif what == "heavy":
            heavy(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]),
                  int(sys.argv[6]), int(sys.argv[7]) if len(sys.argv) > 7 else 1)
        elif what == "flood":
            flood(int(sys.argv[2]), sys.argv[3])
        elif what == "answered-within":
            answered_within(bus, float(sys.argv[2]))
        elif what == "repeat":
            repeat(bus, int(sys.argv[2]), sys.argv[3], sys.argv[4])
        elif what == "handle":
            handle(int(sys.argv[2]), sys.argv[3])
        elif what == "carrying" and len(sys.argv) > 4:
            answers = {}
            for _ in range(int(sys.argv[4])):
                fd = os.open(sys.argv[2], os.O_RDWR)
                answer = send_carrying(fd, sys.argv[3], os.path.abspath(sys.argv[2]))
                answers[answer] = answers.get(answer, 0) + 1
            for answer, count in answers.items():
                print(f"{count} x {answer}")
        elif what == "carrying":
            fd = os.open(sys.argv[2], os.O_RDWR)
            print(send_carrying(fd, sys.argv[3], os.path.abspath(sys.argv[2])))
        elif what == "lingering":
            lingering(bus)
        elif what == "detach":
            manager(bus).Detach(sys.argv[2])
            print("OK")
    except dbus.DBusException as e:
        print(f"ERROR {e.get_dbus_message()}")


def attach_message(fd, name, interactive):
    msg = dbus.lowlevel.MethodCallMessage("org.mloop.Manager1", "/org/mloop/Manager1",
                                          "org.mloop.Manager1", "Attach")
    msg.append(dbus.types.UnixFd(fd), name,
               dbus.Dictionary({"read-only": dbus.Boolean(True)}, signature="sv"),
               signature="hsa{sv}")
    msg.set_allow_interactive_authorization(interactive)
    return msg


def repeat(bus, n, path, name):
    """N attaches in turn, each answered before the next is sent."""
    fd = os.open(path, os.O_RDONLY)
    answers = {}
    for _ in range(n):
        try:
            device = manager(bus).Attach(dbus.types.UnixFd(fd), name,
                                         dbus.Dictionary({"read-only": dbus.Boolean(True)},
                                                         signature="sv"), timeout=30)
            answer = f"OK {device}"
        except dbus.DBusException as e:
            answer = f"ERROR {e.get_dbus_message()}"
        answers[answer] = answers.get(answer, 0) + 1
    for answer, count in answers.items():
        print(f"{count} x {answer}")


def pile(bus, n, path, wait):
    """N calls left waiting, then the answers to two more (one line)."""
    fd = os.open(path, os.O_RDONLY)
    for _ in range(n):
        bus.send_message(attach_message(fd, os.path.abspath(path), True))
    def ask():
        try:
            reply = bus.send_message_with_reply_and_block(
                attach_message(fd, os.path.abspath(path), False), 30)
            return f"OK {reply.get_args_list()[0]}"
        except dbus.DBusException as e:
            return f"ERROR {e.get_dbus_message()}"

    first = later = ask()
    print(f"FIRST {first}", flush=True)
    end = time.monotonic() + wait
    while later == first and time.monotonic() < end:
        time.sleep(0.2)
        later = ask()
    print(f"{first} / {later}")


def flood(n, path):
    """N attaches of PATH expecting no answer, over 4 connections."""
    address = os.environ["DBUS_SYSTEM_BUS_ADDRESS"]
    buses = [dbus.bus.BusConnection(address) for _ in range(4)]
    fd = os.open(path, os.O_RDONLY)
    for i in range(n):
        msg = attach_message(fd, os.path.abspath(path), False)
        msg.set_no_reply(True)
        buses[i % len(buses)].send_message(msg)
    for b in buses:
        b.flush()
    print("SENT", flush=True)


def answered_within(bus, seconds):
    """How long until the service answers a list, or NO ANSWER."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        msg = dbus.lowlevel.MethodCallMessage("org.mloop.Manager1", "/org/mloop/Manager1",
                                              "org.mloop.Manager1", "List")
        msg.append(False, signature="b")
        try:
            bus.send_message_with_reply_and_block(msg, 1)
            print(f"ANSWERED {time.monotonic() - start:.1f}")
            return
        except dbus.DBusException:
            time.sleep(0.1)
    print("NO ANSWER")


def gio():
    try:
        import gi
        gi.require_version("Gio", "2.0")
        from gi.repository import Gio, GLib
    except (ImportError, ValueError):
        print("no python3-gi")
        sys.exit(77)
    return Gio, GLib


def handle(h, path):
    """A read-only attach of PATH whose argument names descriptor H."""
    Gio, GLib = gio()
    conn = Gio.bus_get_sync(Gio.BusType.SYSTEM, None)
    fd_list = Gio.UnixFDList()
    fd = os.open(path, os.O_RDONLY)
    fd_list.append(fd)
    os.close(fd)
    try:
        conn.call_with_unix_fd_list_sync(
            "org.mloop.Manager1", "/org/mloop/Manager1", "org.mloop.Manager1", "Attach",
            GLib.Variant("(hsa{sv})", (h, os.path.abspath(path),
                                       {"read-only": GLib.Variant("b", True)})),
            GLib.VariantType.new("(s)"), Gio.DBusCallFlags.NONE, 30000, fd_list, None)
        print("OK")
    except GLib.Error as e:
        print(f"ERROR {Gio.DBusError.get_remote_error(e) or ''} "
              f"{e.message.split(': ', 1)[-1] if Gio.DBusError.is_remote_error(e) else e.message}")


def send_carrying(fd, how, name):
    """HOW (ping, attach-relative or attach, of NAME) sent carrying FD
    (given to GDBus): the answer ("OK" or "ERROR message")."""
    Gio, GLib = gio()
    conn = Gio.bus_get_sync(Gio.BusType.SYSTEM, None)
    fd_list = Gio.UnixFDList()
    fd_list.append(fd)
    os.close(fd)
    if how == "ping":
        msg = Gio.DBusMessage.new_method_call("org.mloop.Manager1", "/org/mloop/Manager1",
                                              "org.freedesktop.DBus.Peer", "Ping")
    else:
        msg = Gio.DBusMessage.new_method_call("org.mloop.Manager1", "/org/mloop/Manager1",
                                              "org.mloop.Manager1", "Attach")
        msg.set_body(GLib.Variant("(hsa{sv})", (0, name if how == "attach" else "relative.img",
                                                 {})))
    msg.set_unix_fd_list(fd_list)
    try:
        reply = conn.send_message_with_reply_sync(msg, Gio.DBusSendMessageFlags.NONE,
                                                  60000, None)[0]
    except GLib.Error as e:
        return f"ERROR {e.message}"
    if reply.get_message_type() == Gio.DBusMessageType.ERROR:
        body = reply.get_body()
        return "ERROR " + (body[0] if body else reply.get_error_name())
    return "OK"


def lingering(bus):
    """A TCP socket whose close waits (SO_LINGER) for data its peer, this
    process, never reads, passed with an attach that may wait for an
    authentication; the peer kept until stdin ends."""
    import socket
    import struct
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    s.connect(listener.getsockname())           # never accepted, never read
    s.setblocking(False)
    try:
        while True:
            s.send(b"x" * 65536)
    except BlockingIOError:
        pass
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 1000000))
    msg = dbus.lowlevel.MethodCallMessage("org.mloop.Manager1", "/org/mloop/Manager1",
                                          "org.mloop.Manager1", "Attach")
    msg.append(dbus.types.UnixFd(s), "/lingering.img", dbus.Dictionary({}, signature="sv"),
               signature="hsa{sv}")
    msg.set_allow_interactive_authorization(True)
    s.close()
    bus.send_message(msg)
    bus.flush()
    del msg                                     # its descriptor closed
    print("SENT", flush=True)
    sys.stdin.read()


def heavy(n, kind, path, fds, name_bytes, repeat):
    """N calls, each with FDS descriptors and a NAME_BYTES name."""
    Gio, GLib = gio()
    conn = Gio.bus_get_sync(Gio.BusType.SYSTEM, None)
    name = "/" + "x" * (name_bytes - 1) if name_bytes else os.path.abspath(path)
    loop = GLib.MainLoop()
    answers = []

    def answered(c, res, unused):
        try:
            reply = c.send_message_with_reply_finish(res)
            if reply.get_message_type() == Gio.DBusMessageType.ERROR:
                body = reply.get_body()
                answers.append("ERROR " + (body[0] if body else reply.get_error_name()))
            else:
                answers.append("OK")
        except GLib.Error as e:
            answers.append(f"ERROR {e.message}")
        if len(answers) == n:
            loop.quit()

    for _ in range(n):
        msg = Gio.DBusMessage.new_method_call("org.mloop.Manager1", "/org/mloop/Manager1",
                                              "org.mloop.Manager1", kind.capitalize())
        fd_list = Gio.UnixFDList()
        for _ in range(fds):
            fd = os.open(path, os.O_RDONLY)
            fd_list.append(fd)
            os.close(fd)
        if kind == "attach":
            options = GLib.VariantBuilder.new(GLib.VariantType.new("a{sv}"))
            for _ in range(repeat):
                options.add_value(GLib.Variant.new_dict_entry(
                    GLib.Variant("s", "read-only"),
                    GLib.Variant("v", GLib.Variant("b", True))))
            msg.set_body(GLib.Variant.new_tuple(GLib.Variant("h", 0), GLib.Variant("s", name),
                                                options.end()))
        elif kind == "list":
            msg.set_body(GLib.Variant("(b)", (False,)))
        else:
            msg.set_body(GLib.Variant("(s)", (name,)))
        if fds:
            msg.set_unix_fd_list(fd_list)
        msg.set_flags(Gio.DBusMessageFlags.ALLOW_INTERACTIVE_AUTHORIZATION)
        conn.send_message_with_reply(msg, Gio.DBusSendMessageFlags.NONE, 120000, None,
                                     answered, None)
    conn.flush_sync(None)
    print("SENT", flush=True)
    loop.run()
    for a in answers:
        print(a)


main()
