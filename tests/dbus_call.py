"""Calls mloop's D-Bus service the way a hostile or careless client
might, with dbus-python: run as a user by tests on a private bus
(servicebus.py).  Prints the service's answer on one line: "OK DEVICE",
or "ERROR message".

  dbus_call.py attach HOW PATH [NAME] [OPTION=BOOL...]
      HOW: rw, ro (O_RDWR, O_RDONLY), wo (O_WRONLY), path (O_PATH)
  dbus_call.py hangup PATH     send an attach and disconnect at once
  dbus_call.py detach DEVICE
  dbus_call.py pile N PATH WAIT
      N read-only attaches of PATH sent at once, each allowing an
      authentication dialog (run under silent_agent.py, they wait),
      then one more without: its answer; then, once that answer
      changes (asked every 0.2 s, for at most WAIT seconds), the new one.
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
    end = time.monotonic() + wait
    while later == first and time.monotonic() < end:
        time.sleep(0.2)
        later = ask()
    print(f"{first} / {later}")


main()
