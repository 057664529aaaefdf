#!/usr/bin/python3
"""mloop-dbus with a caller whose descriptors never finish closing, on a
private system bus with a real dbus-daemon and polkitd (servicebus.py).

close(2) waits as long as a caller likes in two ways no right is needed
for: a file of a FUSE file system they run, whose server is sent a
FLUSH at every close and waited for uninterruptibly (their server never
answers the service's: tests/helpers/fuse-stuck-flush), and a TCP
socket on the loopback with SO_LINGER set whose peer never reads, the
service's close its last.  The FUSE file is passed to the service as a
user (nobody) in each way that had a thread the whole service needs
close it: an attach refused before polkit is asked (a relative name:
the main thread freed that message), an attach polkit allows, refused
for being on a user's FUSE file system (the device thread closed its
copy), and org.freedesktop.DBus.Peer.Ping carrying it, which anyone may
send and GDBus answers itself (its one worker thread, all of the
service's bus traffic, freed it).  The socket comes with an attach
left waiting for an authentication nobody gives, refused after
--authorization-timeout (the main thread): held by the service until
then, its close is the last, after the bus's (whose close comes right
after it passes the socket on, and lingered itself when the service
was first).  While the service's close waits, another user's call is
answered within 5 s, and the caller hears their answer; the lingering
close is cut short within 6 s while its peer stays, the service started
with that signal (SIGURG) blocked, as a starter that blocks it leaves
it across exec (before its closers unblocked it, the close lingered
until its peer went); and a service told
to stop (SIGTERM) while a close waits leaves the bus at once, so the
next call starts another, and its process ends once the FUSE server
goes.

7.5-9.5 s (the bus, five attackers, the service started again with a 2 s
--authorization-timeout, 2-3 s of a close lingering; 60 s before the
service closed callers' descriptors in threads of their own, each call
waiting out its 5 s).  Skipped without /dev/fuse or python3-gi;
the client suite (the standard and full tiers)."""
import os
import select
import signal
import subprocess
import sys
import time

import harness
import procstop
import servicebus
from stuck_fuse import StuckFuse, skip_unless_possible
from harness import check

SERVICE = os.environ.get("MLOOP_DBUS_BIN", "")
SRC_DBUS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "dbus")
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALL = [sys.executable, os.path.join(TESTS, "dbus_call.py")]
USER, OTHER = servicebus.USER, servicebus.OTHER
# How long another user's call may take while the attacker's close waits.
ANSWER_S = 5
NOT_ATTACHED = "ERROR /dev/nbd0 is not attached by mloop"


def as_user(user, argv, **kw):
    """ARGV started as USER (a (name, uid, gid)); KW as Popen's."""
    _, uid, gid = user
    return subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}",
                             "--clear-groups", "--"] + argv, text=True, **kw)


def call_as(bus, user, args, timeout=ANSWER_S):
    try:
        r = bus.run_as(user, CALL + list(args), timeout=timeout)
        return (r.stdout + r.stderr).strip()
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout} s"


def waits_in(pid, where):
    """PID's threads whose kernel wait (wchan) is one of WHERE."""
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                wchan = f.read().strip()
        except OSError:
            continue
        if wchan in where:
            found.append(wchan)
    return found


def answers(bus, what):
    """Checks that the service answers OTHER's call (started for it if
    need be): before WHAT."""
    out = call_as(bus, OTHER, ["detach", "/dev/nbd0"], timeout=20)
    check(f"{what}: the service answers before", out == NOT_ATTACHED, out)


def stuck_fuse(bus, work, name, how, expect):
    """USER passes the file of a FUSE server that never answers the
    service's FLUSH, HOW (dbus_call.py carrying's); they hear an answer
    saying EXPECT, and OTHER's call is answered while the service's
    close waits.  The FUSE mount, still mounted."""
    fuse = StuckFuse(work, name, USER)
    attacker = None
    try:
        answers(bus, name)
        attacker = as_user(USER, CALL + ["carrying", fuse.image, how], env=bus.env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        check(f"{name}: the service's close of the descriptor waits for the FUSE server",
              fuse.service_stuck(), fuse.log())
        start = time.monotonic()
        out = call_as(bus, OTHER, ["detach", "/dev/nbd0"])
        check(f"{name}: another user's call is answered while the close waits",
              out == NOT_ATTACHED, out)
        print(f"# {name}: answered in {time.monotonic() - start:.2f} s")
        try:
            said = attacker.communicate(timeout=ANSWER_S)[0].strip()
        except subprocess.TimeoutExpired:
            said = f"no answer within {ANSWER_S} s"
        check(f"{name}: the caller hears their answer",
              said == expect or (expect != "OK" and said.startswith("ERROR") and expect in said),
              said)
        return fuse
    except BaseException:
        fuse.close()
        raise
    finally:
        if attacker and attacker.poll() is None:
            attacker.kill()
            attacker.wait()


def stop_while_stuck(bus, work):
    """SIGTERM while a close waits for a FUSE server: the service leaves
    the bus at once (its process ends when the close does), and the
    next call starts another."""
    fuse = stuck_fuse(bus, work, "stop", "ping", "OK")
    try:
        pid = bus.service_pid()
        os.kill(pid, signal.SIGTERM)
        servicebus.poll_until(lambda: bus.service_pid() != pid, ANSWER_S)
        check("a service told to stop while a close waits leaves the bus",
              bus.service_pid() != pid, f"pid {pid} still owns the name")
        out = call_as(bus, OTHER, ["detach", "/dev/nbd0"], timeout=10)
        check("the next call is answered by a new service",
              out == NOT_ATTACHED and bus.service_pid() not in (None, pid),
              f"{out}; pid {pid} -> {bus.service_pid()}")
    finally:
        fuse.close()
    servicebus.poll_until(lambda: procstop.has_exited(pid), 10)
    check("the stopped service ends once the FUSE server goes", procstop.has_exited(pid))


# Where a thread waits for a lingering socket's data to go (tcp_close).
LINGER_WAITS = ("sk_stream_wait_close", "wait_woken")
SILENT_AGENT = [sys.executable, os.path.join(TESTS, "silent_agent.py")]
SIGBLOCK_EXEC = os.path.join(TESTS, "sigblock_exec.py")


def lingering(bus):
    """OTHER passes a TCP socket whose close lingers, its peer never
    reading, with an attach left waiting for an authentication (polkit
    asks a real agent that never answers: silent_agent.py), refused
    after --authorization-timeout (2 s; the service's main thread freed
    its message): USER's call is answered while the service's close
    lingers, and the close is cut short within 6 s while the peer
    stays.  The service holds the socket until then, so its close is
    the last, after the caller's and the bus's.  The service is started
    with the signal that cuts a close short blocked, as a process that
    blocks it would leave it to its exec, so every thread of it would
    have it blocked but those that unblock it."""
    bus.set_service_args(["--authorization-timeout", "2"],
                         wrapper=[sys.executable, SIGBLOCK_EXEC, "SIGURG"])
    bus.set_rules(servicebus.ALLOW_USER)
    attacker = None
    try:
        out = call_as(bus, USER, ["detach", "/dev/nbd0"], timeout=20)
        check("lingering: the service answers before", out == NOT_ATTACHED, out)
        pid = bus.service_pid()
        attacker = as_user(OTHER, SILENT_AGENT + CALL + ["lingering"], env=bus.env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, start_new_session=True)
        ready = select.select([attacker.stdout], [], [], 10)[0]
        sent = attacker.stdout.readline().strip() if ready else "nothing in 10 s"
        check("lingering: sent", sent == "SENT", sent)
        servicebus.poll_until(lambda: waits_in(pid, LINGER_WAITS), ANSWER_S)
        check("the service's close of a lingering socket waits",
              waits_in(pid, LINGER_WAITS), "no thread waits in tcp_close")
        start = time.monotonic()
        out = call_as(bus, USER, ["detach", "/dev/nbd0"])
        check("another user's call is answered while the service's close lingers",
              out == NOT_ATTACHED, out)
        print(f"# lingering: answered in {time.monotonic() - start:.2f} s")
        servicebus.poll_until(lambda: not waits_in(pid, LINGER_WAITS), 6)
        check("a lingering close is cut short while its peer stays",
              not waits_in(pid, LINGER_WAITS) and attacker.poll() is None,
              waits_in(pid, LINGER_WAITS))
    finally:
        if attacker is not None:
            attacker.stdin.close()
            try:
                os.killpg(attacker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            attacker.wait()
        bus.set_service_args([])
        bus.set_rules(servicebus.ALLOW_BOTH_ATTACH)


def run(bus, work):
    # Both may attach and detach their own: OTHER's detach of a device
    # not attached is answered at once.
    bus.set_rules(servicebus.ALLOW_BOTH_ATTACH)
    for name, how, expect in [
            # Refused before polkit is asked: the main thread.
            ("attach-relative", "attach-relative", "absolute path"),
            # polkit says yes; refused in the device thread.
            ("attach-allowed", "attach", f"on a FUSE file system uid {USER[1]} mounted"),
            # GDBus answers it in its worker thread.
            ("ping", "ping", "OK")]:
        stuck_fuse(bus, work, name, how, expect).close()
    lingering(bus)
    stop_while_stuck(bus, work)


def main():
    skip_unless_possible(harness.skip)
    servicebus.run_on_bus(SERVICE, SRC_DBUS, "mloop-stuck-close-", run, harness.skip)
    harness.exit_if_failed()


main()
