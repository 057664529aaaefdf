"""Calls mloop's D-Bus service the way a hostile or careless client
might, with dbus-python: run as a user by tests on a private bus
(servicebus.py).  Prints the service's answer on one line: "OK DEVICE",
or "ERROR message".

  dbus_call.py attach HOW PATH [NAME] [OPTION=BOOL...]
      HOW: rw, ro (O_RDWR, O_RDONLY), wo (O_WRONLY), path (O_PATH)
  dbus_call.py hangup PATH     send an attach and disconnect at once
  dbus_call.py detach DEVICE
"""
import os
import sys

import dbus

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
        elif what == "detach":
            manager(bus).Detach(sys.argv[2])
            print("OK")
    except dbus.DBusException as e:
        print(f"ERROR {e.get_dbus_message()}")


main()
