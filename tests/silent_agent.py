"""Runs a command whose polkit authentication never ends: a real polkit
authentication agent (org.freedesktop.PolicyKit1.AuthenticationAgent,
registered with polkitd for the command's process) that takes the
request and never answers, as a password dialog left open does.  Run as
a user by tests on a private bus (servicebus.py), with dbus-python.

  silent_agent.py COMMAND [ARG...]

Exits with the command's status; its output is the command's.  The
agent is registered for the command's own process (pid and start time)
before it execs, so only that command's checks reach it.
"""
import os
import sys

import dbus

AUTHORITY = ("org.freedesktop.PolicyKit1", "/org/freedesktop/PolicyKit1/Authority")
AGENT_PATH = "/org/mloop/test/SilentAgent"


def start_time(pid):
    # Field 22 of /proc/PID/stat, after the command name in parentheses.
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def main():
    argv = sys.argv[1:]
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        if os.read(go_r, 1) != b"g":
            os._exit(125)
        os.execvp(argv[0], argv)
    os.close(go_r)
    bus = dbus.SystemBus()
    authority = dbus.Interface(bus.get_object(*AUTHORITY),
                               "org.freedesktop.PolicyKit1.Authority")
    subject = ("unix-process", {"pid": dbus.UInt32(pid),
                                "start-time": dbus.UInt64(start_time(pid))})
    # No main loop: polkitd's BeginAuthentication waits in this
    # connection's queue, unanswered, for as long as the command runs.
    authority.RegisterAuthenticationAgent(subject, "C", AGENT_PATH)
    os.write(go_w, b"g")
    os.close(go_w)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))


main()
