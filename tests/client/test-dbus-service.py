#!/usr/bin/python3
"""mloop's D-Bus service (mloop-dbus) on a private system bus with a real
dbus-daemon and polkitd (servicebus.py), as users who are not root:
every refusal that needs no kernel NBD client.  polkit's no is one line
naming the action; a descriptor that proves no right to read (O_PATH,
O_WRONLY), or only to read when writing is asked, a directory or a
device node, a relative name and an unknown option are refused before
anything starts, and so is a file of a pseudo file system (proc, sysfs:
what it reads depends on who opened it; a message queue of mqueue, which any user may make) and one in memory (/dev/shm:
written through a device, its pages would be the service's); a good descriptor gets as far as the kernel (which has
no NBD client here).  `mloop attach` as a user goes through the service
and refuses root's options; a user's list and detach ask it too (a
file named without a slash is named absolutely, and the service refuses
a relative path, which it would look for in its own directory).  The
service survives a client that hangs up mid-call, and a killed service
is activated again by the next call.  Detach asks polkit before it
looks for the path it is given (a refusal says the same whether the
path exists or not), and looks for it with the caller's rights only:
with gdb holding the service between resolving the path as the caller
and looking for it, a caller who swaps a directory of theirs for a
symlink to a root-only one hears the same of a path that exists there
as of one that does not, and /proc's magic links (the service's own
open files, its cwd, its executable) are not followed; the path is
looked for with the caller's whole entry in the user database (6,000
bytes) and every group it gives them (301, one of them a group a
directory denies: still denied; 0.5 s).  A list names each device's
owner from the user database: with gdb holding that lookup 6 s (a
device's state made up in a runtime directory of the service's own),
another user's call is answered meanwhile (8-11 s); a list carrying a
descriptor, which it would keep while it waits, is refused.  A user's
detach of /dev/nbdN where their stale state and root's device share
the index removes their own state, not root's (states made up; 0.3 s);
one polkit lets detach another's device detaches root's there by its
image's path, not answered "ask again" for ever (0.3 s).
A caller whose authentication never ends (a real
polkit agent that never answers: silent_agent.py) holds up no other
user's call, and is refused after --authorization-timeout; an attach
past --max-devices-per-user is refused in one line, and so is a call
past the calls one user may have in progress (counted by login uid:
a second uid with the first's login uid is refused past the first's
calls, as subordinate uids in a user namespace would be; with gdb
holding the service's user database lookup of a named /etc/subuid
owner for 6 s, another user's call is answered; an owner whose entry
is 6,000 bytes long is still matched), and so is, before polkit
is asked, a call carrying more than it needs (descriptors beyond an
attach's image, a detach's name longer than a path, an option given
twice), which would keep it all while it waits; the service logs a
caller's name with its control characters escaped, and a user's
refusals at most 5 times in 10 s (two uids with one login uid 5 times
in all), each showing at most 256 bytes of
the name (40 refused attaches with a name of 4,095 control characters:
4 lines under 1 KB after the cap's, root's refusal still logged, the count of the rest said as the service stops; 1 s).  The attach itself
is the VM's (tests/kernel/test-dbus-attach.py).  An attach whose
image argument names a descriptor the call does not carry (past them,
or negative) is refused, and the service lives on.  A refusal quoting a
long name, cut short mid-character, still reaches the caller.  A
file whose name is not UTF-8 is attached under its name made UTF-8, and
its detach by that name is refused in one line, by the client, since a
D-Bus string cannot carry it (0.06 s).  An image on a FUSE file system
its user mounts (nbdfuse), whose server they stop once the call is the
service's, is refused at once, and another user's call is answered
meanwhile; so is one whose mount they took away lazily (umount -l)
after opening the file, and one opened through an overlay of it they
mount in a user namespace of their own (4.5 s each; skipped without
nbdfuse and nbdkit), and so is one on a FUSE file system mounted in a user
namespace, whose mountinfo says user_id=0 there (the kernel refuses
root's look at it; 4.5 s more).  A caller with 1,600 mounts of 15 KB lines in a mount
namespace of their own, their image's mount the last, is refused for
it after 8 MiB of their mountinfo, which the service does not hold
(its peak memory grows by less than 4 MiB; 1-2 s).  A burst of 3,000
calls expecting no answer, which fills the bus's queue to the service and
makes the bus drop its answers to the service, holds the service up for
seconds, not the 25 s a wait for a lost answer in its main loop
would (0.3-0.5 s).  A service just started makes its proxy for
polkitd without waiting in its main loop: with polkitd stopped, its
first attach is refused after --authorization-timeout and another
user's list is answered meanwhile (6.5 s, the service started twice).  About 22 s (16.5 s
measured idle, 17-19 s with the machine's load at 6-8, 25 s beside
the rest of the client suite; the swapped paths 2.5-3 s of it, the
calls carrying too much and the descriptor numbers 3-4 s more: 19.6-22 s
measured with the machine loaded; 37 s measured since the FUSE file
system of a user namespace, 7 s, the overlay of one, 4.5 s, and the
many mounts, 1-2 s, came);
the standard and full tiers' client suite."""
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import harness
import procstop  # tests/: a SIGSTOP that has taken effect
from harness import check
import servicebus

MLOOP = os.environ["MLOOP_CLI"]
SERVICE = os.environ.get("MLOOP_DBUS_BIN", "")
SRC_DBUS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "dbus")
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALL = [sys.executable, os.path.join(TESTS, "dbus_call.py")]
SILENT_AGENT = [sys.executable, os.path.join(TESTS, "silent_agent.py")]
USER, OTHER = servicebus.USER, servicebus.OTHER


def end_pile(pile):
    """Kills a caller started in a session of its own to keep calls
    waiting (`pile`), its whole group, and reaps it."""
    try:
        os.killpg(pile.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    pile.communicate()


def one_line(r):
    lines = (r.stdout + r.stderr).strip().splitlines()
    return lines[0] if len(lines) == 1 else "\n".join(lines)


def main():
    if os.geteuid() != 0:
        harness.skip("needs root: it runs callers as other users")
    servicebus.run_on_bus(SERVICE, SRC_DBUS, "mloop-dbus-test-", run, harness.skip)
    harness.exit_if_failed()


def run(bus, work):
    image = os.path.join(work, "mine.img")
    with open(image, "wb") as f:
        f.truncate(16 << 20)
    os.chown(image, USER[1], USER[2])
    os.mkdir(os.path.join(work, "dir"))
    root_only = os.path.join(work, "root-only.img")
    with open(root_only, "wb") as f:
        f.truncate(1 << 20)
    os.chmod(root_only, 0o644)
    # In memory: written through a device, charged to the service.
    shm_image = None
    if os.path.isdir("/dev/shm"):
        fd, shm_image = tempfile.mkstemp(prefix="mloop-dbus-test-", dir="/dev/shm")
        os.close(fd)
        os.truncate(shm_image, 1 << 20)
        os.chown(shm_image, USER[1], USER[2])
        harness.on_exit(lambda: os.unlink(shm_image))
    # A message queue is a regular file a user may make where mqueue is
    # mounted (/dev/mqueue): its text depends on who reads it.
    mqueue_file = mqueue_image()

    def call(*args, user=USER):
        return one_line(bus.run_as(user, CALL + list(args)))

    # A descriptor that proves no right to the data, or the wrong right.
    for how, path, options, expect in [
            ("path", image, [], "not opened for reading"),
            ("wo", image, [], "not opened for reading"),
            ("ro", image, [], "opened read-only: attach it read-only"),
            ("ro", os.path.join(work, "dir"), ["read-only=true"], "not a regular file"),
            ("ro", "/dev/null", ["read-only=true"], "not a regular file"),
            ("ro", "/proc/version", ["read-only=true"], "on proc, a pseudo file system"),
            ("ro", "/sys/kernel/uevent_seqnum", ["read-only=true"],
             "on sysfs, a pseudo file system"),
            ("rw", shm_image, [], "on tmpfs, in memory"),
            ("ro", mqueue_file, ["read-only=true"], "on mqueue, a pseudo file system"),
            ("rw", image, ["bogus=true"], "unknown option bogus")]:
        if path is None:
            print("# skipped: an image in memory (no /dev/shm), or a message "
                  "queue (mqueue cannot be mounted)")
            continue
        out = call("attach", how, path, os.path.abspath(path), *options)
        check(f"refused: {how} descriptor of {os.path.basename(path)} {options}",
              out.startswith("ERROR") and expect in out and "\n" not in out, out)
    out = call("attach", "rw", image, "mine.img")
    check("refused: a relative name", out.startswith("ERROR") and "absolute path" in out, out)
    # A name longer than any path would be kept in the device's state,
    # and every list, anyone's, would carry it.
    out = call("attach", "rw", image, "/" + "x" * 5000)
    check("refused: a name longer than a path can be",
          out == "ERROR the image's name is 5001 bytes long: a path has at most 4095", out)
    # A refusal quoting a long name of two-byte characters, cut short
    # to fit the service's message, is still UTF-8 (D-Bus carries
    # nothing else): the caller reads why, and the log has no critical.
    name = "/a" + "\u00e9" * 700
    out = call("attach", "ro", image, name)
    check("a refusal quoting a long name cut mid-character is still the refusal",
          out.startswith("ERROR " + name[:100]) and "Invalid UTF-8" not in out
          and "CRITICAL" not in bus.log("daemon.log"), out[:60] + " ... " + out[-60:])
    # A good descriptor reaches the kernel, which has no NBD client here.
    out = call("attach", "rw", image)
    check("a good descriptor gets as far as the kernel",
          out.startswith("ERROR") and "NBD" in out and "descriptor" not in out, out)

    # The image argument is a number into the message's descriptors,
    # the caller's to choose: one past them crashed the service (GLib's
    # check sets no error), and a negative one read before GLib's array
    # and attached whatever descriptor of the service's it named.
    pid = bus.service_pid()
    for h in (1, -1, -2, -3, -4, -1000):
        out = call("handle", str(h), image)
        if out == "no python3-gi":
            print("# skipped: descriptor numbers: no python3-gi to send them")
            break
        check(f"refused: an attach naming descriptor {h} of the one it carries",
              out == f"ERROR org.mloop.Error.InvalidArgs descriptor {h} was not passed "
              "with the call (1 was)" and bus.service_pid() == pid,
              f"{out}; service pid {pid} -> {bus.service_pid()}")
        pid = bus.service_pid()
    # polkit: OTHER may not attach; nobody may once a rule says no.
    out = call("attach", "ro", root_only, os.path.abspath(root_only), "read-only=true",
               user=OTHER)
    check("polkit's no names the action",
          out == "ERROR not authorized: polkit refused org.mloop.attach "
          "(it needs an administrator's authentication)", out)
    r = bus.run_as(OTHER, [MLOOP, "attach", "--read-only", root_only])
    check("mloop attach as a user: polkit's no in one line",
          r.returncode != 0 and one_line(r) == f"mloop: attach {root_only}: not authorized: "
          "polkit refused org.mloop.attach (it needs an administrator's authentication)",
          one_line(r))
    bus.set_rules(servicebus.DENY_ATTACH)
    out = call("attach", "rw", image)
    check("a rule denying attach is obeyed", "not authorized" in out, out)
    bus.set_rules(servicebus.ALLOW_USER)

    # Detach asks polkit before it looks at the path: a user it refuses
    # learns nothing of what exists where only root can look.
    secret = os.path.join(work, "root-only-dir", "secret")
    os.makedirs(os.path.dirname(secret), mode=0o700)
    open(secret, "w").close()
    hidden = call("detach", secret, user=OTHER)
    missing = call("detach", secret + "-missing", user=OTHER)
    check("a refused detach of a path that exists says what one that does not says",
          hidden.startswith("ERROR not authorized: polkit refused org.mloop.detach")
          and hidden.replace(secret, "P") == missing.replace(secret + "-missing", "P"),
          f"{hidden} / {missing}")
    # A user polkit lets detach has the path looked for with their rights.
    hidden = call("detach", secret)
    missing = call("detach", secret + "-missing")
    check("an allowed detach looks for a path with the caller's rights",
          hidden.endswith("Permission denied")
          and hidden.replace(secret, "P") == missing.replace(secret + "-missing", "P"),
          f"{hidden} / {missing}")
    swapped_while_looking(bus, work, secret)
    magic_links(bus, work)
    caller_with_large_entries(bus, work, image)
    list_holds_nobody(bus, work)
    own_stale_state_by_name(bus, work)
    detach_other_past_own_stale_state(bus, work)

    stalled_callers(bus, image, root_only)
    bounded_wait(bus, root_only)
    names_in_the_log(bus, work, image)
    long_name_not_logged(bus, image)
    heavy_calls(bus, root_only)
    detach_on_stalled_fuse(bus, work)
    attach_on_stalled_fuse(bus, work, lazy=False)
    attach_on_stalled_fuse(bus, work, lazy=True)
    attach_on_stalled_fuse(bus, work, overlay=True)
    attach_on_namespaced_fuse(bus, work)
    many_mounts(bus, work)
    per_user_cap(bus, image)
    polkit_silent_at_start(bus, image)

    # The mloop command as a user.
    r = bus.run_as(USER, [MLOOP, "attach", root_only])
    check("a user's attach of an image they cannot write says so",
          r.returncode != 0 and "Permission denied (use --read-only" in one_line(r), one_line(r))
    r = bus.run_as(USER, [MLOOP, "attach", "--threads", "2", image])
    check("a user's attach refuses root's options in one line",
          r.returncode != 0 and "not root" in one_line(r) and "\n" not in one_line(r),
          one_line(r))
    r = bus.run_as(USER, [MLOOP, "list"])
    check("a user's list asks the service (nothing attached)",
          r.returncode == 0 and r.stdout == "", r.stdout + r.stderr)
    r = bus.run_as(USER, [MLOOP, "list", "--json"])
    check("a user's list --json", r.returncode == 0 and r.stdout.strip() == "[]",
          r.stdout + r.stderr)
    for command in ("status", "resize"):
        r = bus.run_as(USER, [MLOOP, command, "/dev/nbd0"])
        check(f"a user's {command} says it needs root",
              r.returncode != 0 and one_line(r).startswith(f"mloop: {command}: needs root"),
              one_line(r))
    r = bus.run_as(USER, [MLOOP, "detach", "/dev/nbd0"])
    check("a user's detach of what is not attached",
          r.returncode != 0 and "not attached" in one_line(r), one_line(r))
    # A file named without a slash is the caller's, in their directory,
    # not one in the service's; the service takes no relative path.
    r = bus.run_as(USER, [MLOOP, "detach", os.path.basename(image)], cwd=work)
    check("a user's detach of a file named without a slash names it absolutely",
          one_line(r) == f"mloop: detach {os.path.basename(image)}: {image} is not "
          "attached by mloop", one_line(r))
    for name in ("mine.img", "dir/mine.img", ""):
        out = call("detach", name)
        check(f"a detach of the relative path {name!r} is refused",
              out == f"ERROR {name}: not a device's name nor an absolute path", out)

    # A client that hangs up mid-call; a service killed between calls.
    pid = bus.service_pid()
    call("hangup", image)
    time.sleep(0.5)
    out = call("detach", "/dev/nbd0")
    check("the service survives a client hanging up mid-call",
          bus.service_pid() == pid and "not attached" in out, f"{out}; pid {pid} -> {bus.service_pid()}")
    bus.kill_service(signal.SIGKILL)
    r = bus.run_as(USER, [MLOOP, "list"])
    check("a killed service is started again by the next call",
          r.returncode == 0 and bus.service_pid() not in (None, pid), r.stderr)
    r = bus.run_as(USER, [MLOOP, "--version"])
    check("mloop --version as a user", r.returncode == 0, r.stderr)
    names_not_utf8(bus, work)
    flooded(bus, root_only)


def flooded(bus, root_only):
    """A burst of calls expecting no answer fills the bus's queue to the
    service, and the bus then drops what it would deliver to the service,
    the answers to the service's own calls too.  The service asks the
    bus which user a caller is without waiting in its main loop, where
    a lost answer would hold up every call 25 s: it answers again
    within seconds of the burst.  Last: calls of
    the burst's whose polkit answer was lost wait out the authorization
    timeout."""
    p = subprocess.Popen(
        ["setpriv", f"--reuid={OTHER[1]}", f"--regid={OTHER[2]}", "--clear-groups",
         "--"] + CALL + ["flood", "3000", root_only],
        env=bus.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        sent = p.stdout.readline().strip()
        out = call_on(bus, "answered-within", "20") if sent == "SENT" else sent
    finally:
        p.kill()
        p.wait()
    check("a burst of calls holds the service up for seconds, not 25 s",
          out.startswith("ANSWERED") and float(out.split()[1]) < 10, out)


def names_not_utf8(bus, work):
    """A D-Bus string is UTF-8, a file's name need not be.  A user's
    attach of such a file sends its name, only a label, made UTF-8, and
    gets as far as the kernel; their detach by that name, which the
    service would have to look for, says in one line to name the device
    instead.  Neither is a GLib critical and a mangled call."""
    odd = os.path.join(os.fsencode(work), b"caf\xe9.img")
    with open(odd, "wb") as f:
        f.truncate(1 << 20)
    os.chown(odd, USER[1], USER[2])
    r = bus.run_as(USER, [os.fsencode(MLOOP), b"attach", odd], errors="replace")
    check("a user's attach of a file whose name is not UTF-8 reaches the kernel",
          r.returncode != 0 and "NBD" in one_line(r) and "CRITICAL" not in r.stderr,
          one_line(r))
    r = bus.run_as(USER, [os.fsencode(MLOOP), b"detach", odd], errors="replace")
    check("a user's detach by a name that is not UTF-8 says to name the device",
          r.returncode != 0 and one_line(r).endswith(
              ": the name is not UTF-8, which the service cannot be sent: "
              "detach the device (mloop list names it)"), one_line(r))


def magic_links(bus, work):
    """/proc's magic links (fd/N, cwd, exe) resolve in the process that
    follows them: a detach's path, resolved in the service, must not
    lead its caller to what the service holds open, nor through a
    symlink of theirs to one."""
    link = os.path.join(work, "dir", "to-service-exe")
    os.symlink("/proc/self/exe", link)
    for path in ["/proc/self/fd/2", "/dev/stderr", "/proc/self/cwd",
                 "/proc/self/exe", link]:
        out = call_on(bus, "detach", path)
        check(f"a detach of {path} follows no magic link of the service's",
              out == f"ERROR {path}: not an nbd or ublk device, and Too many "
              "levels of symbolic links", out)


# A group of USER's that the directory DENIED denies (group bits below
# other's), and as many other groups of theirs as an enterprise
# directory (nested groups) may give a user.
DENIED_GID = 3100000
MANY_GROUPS = 300


def caller_with_large_entries(bus, work, image):
    """A detach's path is looked for with the caller's entry in the user
    database and every group it gives them, however large: an entry of
    6,000 bytes is still the caller's (the path is found), and with 300
    groups, one of them a group a directory denies, the directory is
    still denied to them, as with one group (fewer groups can be more
    rights)."""
    with open("/etc/passwd") as f:
        entries = f.read().splitlines()
    found = [e for e in entries if e.split(":")[0] == USER[0]]
    if not found or found[0].split(":")[2] != str(USER[1]):
        print(f"# skipped: a caller's large entries: no user {USER[0]} of uid {USER[1]}")
        return
    fields = found[0].split(":")
    fields[4] = "x" * 6000
    passwd = "".join((":".join(fields) if e == found[0] else e) + "\n" for e in entries)
    args = bus.service_args
    try:
        bus.set_service_args(args, passwd=passwd)
        out = call_on(bus, "detach", image)
        check("a detach's path is looked for as a caller whose entry is 6,000 bytes",
              out == f"ERROR {image} is not attached by mloop", out)
        denied = os.path.join(work, "denied")
        os.mkdir(denied)
        os.chown(denied, 0, DENIED_GID)
        os.chmod(denied, 0o705)
        inside = os.path.join(denied, "inside.img")
        open(inside, "w").close()
        with open("/etc/group") as f:
            machine = f.read()
        for many in (0, MANY_GROUPS):
            group = machine + f"mloop-denied:x:{DENIED_GID}:{USER[0]}\n" + "".join(
                f"mloop-g{i}:x:{DENIED_GID + 1 + i}:{USER[0]}\n" for i in range(many))
            bus.set_service_args(args, group=group)
            out = call_on(bus, "detach", inside)
            check(f"a directory that denies a group of the caller's is denied to them "
                  f"with {many + 1} groups",
                  out == f"ERROR {inside}: not an nbd or ublk device, and Permission denied",
                  out)
    finally:
        bus.set_service_args(args)


def stalled_callers(bus, image, root_only):
    """OTHER's attach, and then detach, wait on an authentication nobody
    answers (a password dialog left open); USER's calls are served
    meanwhile."""
    waiting = []
    try:
        for argv in (["attach", "--read-only", root_only], ["detach", "/dev/nbd0"]):
            waiting.append(subprocess.Popen(
                ["setpriv", f"--reuid={OTHER[1]}", f"--regid={OTHER[2]}",
                 "--clear-groups", "--"] + SILENT_AGENT + [MLOOP] + argv,
                env=bus.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True))
            time.sleep(1)
            try:
                r = bus.run_as(USER, [MLOOP, "list"], timeout=10)
                served = r.returncode == 0 and r.stdout == ""
                out = r.stdout + r.stderr
            except subprocess.TimeoutExpired:
                served, out = False, "no answer within 10 s"
            check(f"a user's list is served while another's {argv[0]} waits for "
                  "its authentication", served, out)
            out = call_as(bus, USER, ["attach", "rw", image], timeout=10)
            check(f"a user's attach is served while another's {argv[0]} waits "
                  "for its authentication",
                  out.startswith("ERROR") and "NBD" in out, out)
            check(f"the {argv[0]} waiting for its authentication still waits",
                  waiting[-1].poll() is None, waiting[-1].poll())
    finally:
        # The agent and the command it runs, which would otherwise wait
        # for its answer until the bus goes away.
        for p in waiting:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def bounded_wait(bus, root_only):
    """polkit's answer is waited for a bounded time: a dialog left open
    ends in a one-line refusal."""
    bus.set_service_args(["--authorization-timeout", "2"])
    try:
        r = bus.run_as(OTHER, SILENT_AGENT + [MLOOP, "attach", "--read-only", root_only],
                       timeout=30)
        out = one_line(r)
    except subprocess.TimeoutExpired:
        out = "no answer within 30 s"
    check("an authentication left waiting ends after --authorization-timeout",
          out == f"mloop: attach {root_only}: not authorized: polkit did not answer "
          "for org.mloop.attach within 2 s (an authentication left waiting?)", out)
    calls_in_progress(bus, root_only)
    calls_of_one_person(bus, root_only)
    owner_lookup_holds_nobody(bus, os.path.dirname(root_only), root_only)
    owner_with_long_entry(bus, root_only)
    bus.set_service_args([])


# mloop-dbus's calls in progress per user (dbus/manager.h).
MAX_CALLS_PER_USER = 8


def calls_in_progress(bus, root_only):
    """A user leaves as many calls waiting for authentication as they
    may have in progress; the next is refused at once, in one line,
    where polkit would otherwise be asked (each waiting call holds the
    service's memory and the descriptor it passed), while another user
    is served.  Once the waiting ones have timed out (2 s), polkit is
    asked again."""
    pile = None
    try:
        pile = subprocess.Popen(
            ["setpriv", f"--reuid={OTHER[1]}", f"--regid={OTHER[2]}", "--clear-groups",
             "--"] + SILENT_AGENT + CALL + ["pile", str(MAX_CALLS_PER_USER), root_only, "20"],
            env=bus.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        time.sleep(0.5)
        out = call_on(bus, "attach", "ro", root_only, os.path.abspath(root_only),
                      "read-only=true", user=USER)
        check("a user's call is not counted against another's calls in progress",
              out.startswith("ERROR") and "NBD" in out, out)
        try:
            out = pile.communicate(timeout=40)[0].strip().splitlines()[-1]
        except (subprocess.TimeoutExpired, IndexError):
            out = "no answer within 30 s"
        refused = (f"ERROR you have {MAX_CALLS_PER_USER} calls in progress, the most "
                   "one user may: wait for one to end")
        polkit_no = ("ERROR not authorized: polkit refused org.mloop.attach "
                     "(it needs an administrator's authentication)")
        check("a call past a user's calls in progress is refused at once; polkit is "
              "asked again once they end", out == f"{refused} / {polkit_no}", out)
    finally:
        if pile is not None:
            end_pile(pile)


# Two uids of one person: subordinate uids of a user's (/etc/subuid),
# in a user namespace of theirs, reach the bus as uids of their own but
# keep the login uid of the user's session.  The service sees
# SUBUID as /etc/subuid while it tests them.
ONE_PERSON = [("bin", 2, 2), ("sys", 3, 3)]
LOGIN_UID = 4242
SUBUID = f"{LOGIN_UID}:2:2\n"


def as_person(user, argv):
    """ARGV as USER, with the login uid LOGIN_UID, as a login gives it."""
    _, uid, gid = user
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"] + argv


def write_login_uid(login):
    with open("/proc/self/loginuid", "w") as f:
        f.write(str(login))


def set_login_uid():
    write_login_uid(LOGIN_UID)


@contextlib.contextmanager
def one_person_piled(bus, root_only, login, subuid, passwd=None):
    """With the service seeing SUBUID as /etc/subuid (and PASSWD as
    /etc/passwd), the first uid of ONE_PERSON with login uid LOGIN keeps
    as many calls waiting for authentication as one person may have;
    then a call of the second uid with that login uid must be refused
    at once, as the same person's.  The calls stay waiting while the
    caller's block runs."""
    first, second = ONE_PERSON
    pile = None
    args = bus.service_args
    # The piled calls wait for authentication until the caller's block
    # is done, however slowly the second call starts.
    bus.set_service_args(["--authorization-timeout", "60"], subuid=subuid, passwd=passwd)
    try:
        pile = subprocess.Popen(
            as_person(first, SILENT_AGENT + CALL + ["pile", str(MAX_CALLS_PER_USER),
                                                    root_only, "60"]),
            env=bus.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, preexec_fn=lambda: write_login_uid(login))
        # Its own next call refused: the piled ones are counted.
        out = pile.stdout.readline().strip()
        check("one uid's calls fill the calls one person may have in progress",
              out == f"FIRST ERROR you have {MAX_CALLS_PER_USER} calls in progress, "
              "the most one user may: wait for one to end", out)
        r = subprocess.run(
            as_person(second, CALL + ["attach", "ro", root_only,
                                      os.path.abspath(root_only), "read-only=true"]),
            env=bus.env, capture_output=True, text=True, timeout=60,
            preexec_fn=lambda: write_login_uid(login))
        out = one_line(r)
        check("a call of another uid of one person's is refused past the calls "
              "that person may have in progress",
              out == f"ERROR you have {MAX_CALLS_PER_USER} calls in progress, the most "
              "one user may: wait for one to end", out)
        yield
    finally:
        if pile is not None:
            end_pile(pile)
        bus.set_service_args(args)


def calls_of_one_person(bus, root_only):
    """The calls in progress one user may have are counted by the
    person, their login uid: one uid of theirs leaves as many calls
    waiting for authentication as they may have, and a call of another
    uid of theirs is refused at once; each uid counted on its own, one
    person could have 65,537 times as many (a uid and its subordinate
    ones), and take every descriptor the service has."""
    if not os.path.exists("/proc/self/loginuid"):
        print("# skipped: the calls of one person's uids: no login uids "
              "(a kernel without audit)")
        return
    with one_person_piled(bus, root_only, LOGIN_UID, SUBUID):
        # A process with no login uid may write any there, unprivileged:
        # OTHER, no subordinate uid of LOGIN_UID's, is not counted as them.
        r = subprocess.run(
            ["setpriv", f"--reuid={OTHER[1]}", f"--regid={OTHER[2]}", "--clear-groups",
             "--", "sh", "-c", f'echo {LOGIN_UID} > /proc/self/loginuid && exec "$@"',
             "sh"] + CALL + ["attach", "ro", root_only, os.path.abspath(root_only),
                             "read-only=true"],
            env=bus.env, capture_output=True, text=True, timeout=60)
        out = one_line(r)
        check("a uid that wrote another person's login uid itself is not counted "
              "as that person", out.startswith("ERROR not authorized"), out)


def owner_with_long_entry(bus, root_only):
    """An /etc/subuid owner named, whose user database entry is larger
    than a first guess of a buffer (a long GECOS field: 6,000 bytes), is
    still matched: else each of their subordinate uids would count as a
    person of its own, with caps of its own."""
    if not os.path.exists("/proc/self/loginuid"):
        print("# skipped: an owner with a long entry: no login uids")
        return
    name, login = NAMED_OWNER
    with open("/etc/passwd") as f:
        entries = f.read().splitlines()
    found = [e for e in entries if e.split(":")[0] == name]
    if not found or found[0].split(":")[2] != str(login):
        print(f"# skipped: an owner with a long entry: no user {name} of uid {login}")
        return
    fields = found[0].split(":")
    fields[4] = "x" * 6000
    passwd = "".join((":".join(fields) if e == found[0] else e) + "\n" for e in entries)
    with one_person_piled(bus, root_only, login, f"{name}:2:2\n", passwd):
        pass


# gdb, attached to the service, holds the thread making its user
# database lookup of an /etc/subuid owner's name (a slow NSS source:
# LDAP, say) for HOLD_S seconds: that thread sleeps in a call gdb makes,
# which lets the service's other threads run on meanwhile.
HOLD_S = 6
HOLD_IN_OWNER_LOOKUP = """set pagination off
set confirm off
set breakpoint pending on
handle all nostop noprint pass
break getpwnam_r
commands 1
silent
delete 1
shell touch {held}
call (unsigned int) sleep (%d)
detach
quit
end
shell touch {ready}
continue
""" % HOLD_S
# An owner named in /etc/subuid, as adduser writes it: Debian's lp.
NAMED_OWNER = ("lp", 7)


def owner_lookup_holds_nobody(bus, work, root_only):
    """The service looks up the name of the owner of a subordinate uid's
    range when a caller of that uid has the owner's login uid; with that
    lookup held (gdb), another user's call is answered meanwhile, and
    the held call then gets polkit's answer."""
    gdb = shutil.which("gdb")
    if gdb is None or not os.path.exists("/proc/self/loginuid"):
        print("# skipped: an owner's lookup held: no gdb or no login uids")
        return
    name, login = NAMED_OWNER
    held, ready = (os.path.join(work, f) for f in ("held", "ready"))
    for f in (held, ready):
        if os.path.exists(f):
            os.unlink(f)
    args = bus.service_args
    bus.set_service_args(args, subuid=f"{name}:2:2\n")
    call_on(bus, "detach", "/dev/nbd0")          # the service is running
    script = os.path.join(work, "hold-owner.gdb")
    with open(script, "w") as f:
        f.write(HOLD_IN_OWNER_LOOKUP.format(held=held, ready=ready))
    debugger = subprocess.Popen([gdb, "-q", "-batch", "-nx", "-x", script, "-p",
                                 str(bus.service_pid())],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    caller = None
    try:
        servicebus.poll_until(lambda: os.path.exists(ready) or debugger.poll() is not None)
        if not os.path.exists(ready):
            why = (servicebus.stop_gdb(debugger).strip().splitlines() or ["no answer"])[-1]
            print(f"# skipped: gdb cannot attach to the service ({why})")
            return
        caller = subprocess.Popen(
            as_person(ONE_PERSON[0], CALL + ["attach", "ro", root_only]),
            env=bus.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=lambda: write_login_uid(login))
        servicebus.poll_until(lambda: os.path.exists(held) or debugger.poll() is not None)
        check("the service looks up the name of a subordinate uid's owner",
              os.path.exists(held), servicebus.stop_gdb(debugger)[-300:] if not os.path.exists(held)
              else "")
        out = call_as(bus, USER, ["answered-within", str(HOLD_S // 2)], timeout=30)
        check("another user's call is answered while an owner's lookup is held",
              out.startswith("ANSWERED"), out)
        out = one_line(subprocess.CompletedProcess([], 0, caller.communicate(timeout=30)[0], ""))
        check("the call whose owner was looked up gets polkit's answer",
              out.startswith("ERROR not authorized: polkit refused"), out)
    finally:
        servicebus.stop_gdb(debugger)
        if caller is not None and caller.poll() is None:
            caller.kill()
            caller.wait()
        bus.set_service_args(args)


# gdb, attached to the service, holds the thread looking up a device's
# owner's name for a list (a slow NSS source) for HOLD_S seconds.
HOLD_IN_OWNER_NAME = HOLD_IN_OWNER_LOOKUP.replace(
    "break getpwnam_r", "break getpwuid_r")


def list_holds_nobody(bus, work):
    """A list names each device's owner from the user database, whose
    sources (LDAP, sssd) may be slow or not answer: with gdb holding
    that lookup, another user's call is answered meanwhile, and the
    list then shows the device and its owner.  A device's state is
    made up in a runtime directory of the service's own."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print("# skipped: a list's owner lookup held: no gdb")
        return
    run_dir = os.path.join(work, "list-run")
    device = os.path.join(run_dir, "dev-listed")
    os.makedirs(device)
    with open(os.path.join(device, "state"), "w") as f:
        f.write(f"[device]\nindex=999\nfile=held:listed\nheld_image=true\n"
                f"label=/listed.img\nowner={USER[1]}\n")
    held, ready = (os.path.join(work, f) for f in ("held", "ready"))
    for f in (held, ready):
        if os.path.exists(f):
            os.unlink(f)
    args = bus.service_args
    bus.set_service_args(args, env={"MLOOP_RUNTIME_DIR": run_dir})
    call_on(bus, "detach", "/dev/nbd0")          # the service is running
    script = os.path.join(work, "hold-owner-name.gdb")
    with open(script, "w") as f:
        f.write(HOLD_IN_OWNER_NAME.format(held=held, ready=ready))
    debugger = subprocess.Popen([gdb, "-q", "-batch", "-nx", "-x", script, "-p",
                                 str(bus.service_pid())],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lister = None
    try:
        servicebus.poll_until(lambda: os.path.exists(ready) or debugger.poll() is not None)
        if not os.path.exists(ready):
            why = (servicebus.stop_gdb(debugger).strip().splitlines() or ["no answer"])[-1]
            print(f"# skipped: gdb cannot attach to the service ({why})")
            return
        lister = subprocess.Popen(
            ["setpriv", f"--reuid={USER[1]}", f"--regid={USER[2]}", "--clear-groups",
             "--", MLOOP, "list"],
            env=bus.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        servicebus.poll_until(lambda: os.path.exists(held) or debugger.poll() is not None)
        check("a list looks up a device's owner's name",
              os.path.exists(held), servicebus.stop_gdb(debugger)[-300:] if not os.path.exists(held)
              else "")
        out = call_as(bus, OTHER, ["detach", "/dev/nbd0"], timeout=HOLD_S // 2)
        check("another user's call is answered while a list's owner lookup is held",
              out.startswith("ERROR not authorized: polkit refused"), out)
        out = lister.communicate(timeout=30)[0]
        check("the list whose owner lookup was held shows the device and its owner",
              re.search(rf"^/dev/nbd999 .* {USER[0]} +/listed.img$", out, re.M), out)
    finally:
        servicebus.stop_gdb(debugger)
        if lister is not None and lister.poll() is None:
            lister.kill()
            lister.wait()
        bus.set_service_args(args)


def own_stale_state_by_name(bus, work):
    """One index, two states: the caller's, which outlived its device (an
    autoclear device the kernel let go before its supervisor looked), and
    root's device attached there since.  The caller's detach of /dev/nbdN
    is of their own state, as a detach of their image's path is: it found
    root's and refused ("not your device").  States made up in a runtime
    directory of the service's own; nothing is at the index."""
    run_dir = os.path.join(work, "stale-run")
    states = {}
    for name, text in (
            ("dev-root", "file=/root-image.img\nheld_image=false\nowner=0\n"),
            ("dev-stale", "file=held:stale\nheld_image=true\nlabel=/stale.img\n"
                          f"owner={OTHER[1]}\nperson={OTHER[1]}\nautoclear=true\n")):
        states[name] = os.path.join(run_dir, name)
        os.makedirs(states[name])
        with open(os.path.join(states[name], "state"), "w") as f:
            f.write(f"[device]\ntransport=nbd\nindex=998\n{text}")
    args = bus.service_args
    bus.set_service_args(args, env={"MLOOP_RUNTIME_DIR": run_dir})
    bus.set_rules(servicebus.ALLOW_BOTH_ATTACH)
    try:
        out = call_on(bus, "detach", "/dev/nbd998", user=OTHER)
        check("a user's detach of /dev/nbdN is of their own stale state there, "
              "not root's device", out.startswith("OK"), out)
        check("the detach removed the user's stale state and left root's",
              not os.path.exists(states["dev-stale"]) and
              os.path.exists(os.path.join(states["dev-root"], "state")),
              str(sorted(os.listdir(run_dir))))
    finally:
        bus.set_rules(servicebus.ALLOW_USER)
        bus.set_service_args(args)


def detach_other_past_own_stale_state(bus, work):
    """One index, two states: the caller's, which outlived its device,
    and root's device attached there since.  The caller, whom polkit
    lets detach another's device, detaches root's by its image's path:
    the second round, once polkit said yes, detaches the very state the
    first found.  Looked up again by the device's name, it found the
    caller's own stale state first and answered "ask again" for ever.
    States made up in a runtime directory of the service's own; nothing
    is at the index."""
    run_dir = os.path.join(work, "stale-other-run")
    image = os.path.join(work, "roots-image.img")
    open(image, "w").close()
    os.chmod(image, 0o644)
    st = os.stat(image)
    states = {}
    for name, text in (
            ("dev-root", f"file={os.path.realpath(image)}\nfile_dev={st.st_dev}\n"
                         f"file_ino={st.st_ino}\nheld_image=false\nowner=0\n"),
            ("dev-stale", "file=held:stale\nheld_image=true\nlabel=/stale.img\n"
                          f"owner={USER[1]}\nperson={USER[1]}\nautoclear=true\n")):
        states[name] = os.path.join(run_dir, name)
        os.makedirs(states[name])
        with open(os.path.join(states[name], "state"), "w") as f:
            f.write(f"[device]\ntransport=nbd\nindex=997\n{text}")
    args = bus.service_args
    bus.set_service_args(args, env={"MLOOP_RUNTIME_DIR": run_dir})
    try:
        out = call_on(bus, "detach", image, user=USER)
        check("a detach of another's device at an index where the caller has a "
              "stale state detaches that device", out.startswith("OK"), out)
        check("the detach removed root's state and left the caller's stale one",
              not os.path.exists(states["dev-root"]) and
              os.path.exists(os.path.join(states["dev-stale"], "state")),
              str(sorted(os.listdir(run_dir))))
    finally:
        bus.set_service_args(args)
        os.unlink(image)


# gdb, attached to the service, holds the thread resolving a path where it takes
# back root's rights (setfsuid (0)) after resolving a path as the
# caller, until the test has swapped the caller's directory.
HOLD_AFTER_RESOLVING = "setfsuid if (int) $rdi == 0"


def swapped_while_looking(bus, work, secret):
    """A caller polkit lets detach swaps one of their own directories for
    a symlink to a root-only one after the service resolved their path
    with their rights: the service must not resolve the name again as
    root, so the answer is the same for a path that exists there as for
    one that does not."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print("# skipped: no gdb to hold the service between resolving and looking")
        return
    swap = os.path.join(work, "swap")
    os.mkdir(swap)
    os.chown(swap, USER[1], USER[2])
    as_user = ["setpriv", f"--reuid={USER[1]}", f"--regid={USER[2]}", "--clear-groups", "--"]
    subprocess.run(as_user + ["sh", "-c", "mkdir d && touch d/secret d/secret-missing"],
                   cwd=swap, check=True)
    call_on(bus, "detach", "/dev/nbd0")          # the service is running
    answers = []
    for name in ("secret", "secret-missing"):
        answer = detach_swapped(bus, gdb, work, swap, as_user, name)
        if answer is None:
            return
        answers.append(answer)
    hidden, missing = answers
    shown = os.path.join(swap, "d", "P")
    check("a path swapped for a root-only one between resolving and looking "
          "says what a missing one says",
          hidden.replace("secret", "P") == missing.replace("secret-missing", "P")
          and f"{shown} is not attached by mloop" in hidden.replace("secret", "P"),
          f"{hidden} / {missing}")


def detach_swapped(bus, gdb, work, swap, as_user, name):
    """USER's detach of SWAP/d/NAME, d replaced by a symlink to the
    root-only directory while gdb holds the service: its answer, or None
    (and a line saying why) when gdb may not attach to the service."""
    debugger, held, go, ready = servicebus.start_gdb_hold(bus, gdb, work, HOLD_AFTER_RESOLVING)
    caller = None
    try:
        servicebus.poll_until(lambda: os.path.exists(ready) or debugger.poll() is not None)
        if not os.path.exists(ready) and debugger.poll() is not None:
            why = (debugger.communicate()[0].strip().splitlines() or ["no answer"])[-1]
            print(f"# skipped: gdb cannot attach to the service ({why})")
            return None
        caller = subprocess.Popen(as_user + CALL + ["detach", os.path.join(swap, "d", name)],
                                  env=bus.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        servicebus.poll_until(lambda: os.path.exists(held) or debugger.poll() is not None)
        if not os.path.exists(held):
            return "gdb did not hold the service: " + servicebus.stop_gdb(debugger)[-300:]
        subprocess.run(as_user + ["sh", "-c", "mv d d.old && ln -s ../root-only-dir d"],
                       cwd=swap, check=True)
        open(go, "w").close()
        out = caller.communicate(timeout=30)[0]
        return one_line(subprocess.CompletedProcess([], 0, out, ""))
    finally:
        open(go, "w").close()                   # gdb lets the service go
        servicebus.stop_gdb(debugger)
        if caller is not None and caller.poll() is None:
            caller.kill()
            caller.wait()
        if os.path.islink(os.path.join(swap, "d")):
            os.unlink(os.path.join(swap, "d"))
            os.rename(os.path.join(swap, "d.old"), os.path.join(swap, "d"))


def names_in_the_log(bus, work, image):
    """A name chosen by the caller reaches the service's log escaped:
    its control characters, and RLO (U+202E), which would show what
    follows reversed."""
    name = os.path.join(work, "a\x1b[2J\u009b1m\u202eb.img")
    out = call_on(bus, "attach", "rw", image, name)
    log = bus.log("daemon.log")
    shown = os.path.join(work, "a\\x1b[2J\\xc2\\x9b1m\\xe2\\x80\\xaeb.img")
    check("the service logs a caller's name with its control characters escaped",
          out.startswith("ERROR") and f"attach {shown} refused" in log
          and "\x1b" not in log and "\u009b" not in log and "\u202e" not in log,
          out + " / " + log[-300:])


def detach_on_stalled_fuse(bus, work):
    """A path on a FUSE mount whose server never answers never resolves:
    the caller's detach waits, and only theirs (another user's call is
    served meanwhile) until the FUSE server goes."""
    mnt = os.path.join(work, "fuse")
    os.mkdir(mnt)
    os.chmod(mnt, 0o755)
    try:
        fuse = os.open("/dev/fuse", os.O_RDWR)
    except OSError as e:
        print(f"# skipped: a stalled FUSE mount: /dev/fuse: {e}")
        return
    try:
        # USER's mount, as fusermount makes it with allow_other (which
        # user_allow_other in /etc/fuse.conf lets users ask for; without
        # it FUSE refuses root at once); its server (this test) never
        # reads a request.
        r = subprocess.run(["mount", "-i", "-t", "fuse", "-o",
                            f"fd={fuse},rootmode=40000,user_id={USER[1]},group_id={USER[2]},"
                            "allow_other",
                            "stalled", mnt], pass_fds=[fuse], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"# skipped: a stalled FUSE mount: {r.stderr.strip()}")
            return
        _, uid, gid = USER
        stuck = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}",
                                  "--clear-groups", "--"] + CALL
                                 + ["detach", os.path.join(mnt, "x")],
                                 env=bus.env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        time.sleep(1)
        bus.set_rules(servicebus.ALLOW_BOTH_ATTACH)
        out = call_as(bus, OTHER, ["detach", "/dev/nbd0"], 10)
        check("a detach stalled on its caller's FUSE mount holds up no other user's",
              out == "ERROR /dev/nbd0 is not attached by mloop", out)
        os.close(fuse)
        fuse = -1
        try:
            out = stuck.communicate(timeout=20)[0].strip()
        except subprocess.TimeoutExpired:
            stuck.kill()
            out = "no answer"
        check("the stalled detach is answered once the FUSE server goes",
              out.startswith("ERROR") and "not connected" in out, out)
    finally:
        bus.set_rules(servicebus.ALLOW_USER)
        if fuse != -1:
            os.close(fuse)
        subprocess.run(["umount", "-l", mnt], capture_output=True)


def attach_on_stalled_fuse(bus, work, lazy=False, overlay=False):
    """A user's image on a FUSE file system they mount (nbdfuse, as
    fusermount would mount it for them with allow_other): they open it,
    (LAZY: unmount it lazily, which no mountinfo shows then, while the
    file stays open; OVERLAY: through an overlay of it they mount in a
    user namespace where they are root, whose file root's looks reach
    the FUSE server with the user's rights, and call from there, a
    nested namespace giving the bus their own uid), then stop its server.  Every look at the file would wait for it, the
    attach's and every other caller's after it in the device thread, for
    as long as the user likes: the attach is refused at once, naming
    the cause, asking the file system nothing, and another user's detach
    is answered meanwhile.  (The bus, which looks at a descriptor it
    passes on, would wait too: the server is stopped once the call is
    the service's.)"""
    for tool in ("nbdfuse", "nbdkit"):
        if shutil.which(tool) is None:
            print(f"# skipped: an attach on a stalled FUSE mount: no {tool}")
            return
    _, uid, gid = USER
    mnt = os.path.join(work, "fuse-image-lazy" if lazy
                       else "fuse-image-overlay" if overlay else "fuse-image")
    backing = os.path.join(work, "fuse-backing.img")
    os.mkdir(mnt)
    with open(backing, "ab") as f:
        f.truncate(4 << 20)
    for path in (mnt, backing):
        os.chown(path, uid, gid)
    image = os.path.join(mnt, "disk.img")
    # The user's own mount (user_id is theirs), made without fusermount,
    # which needs user_allow_other in /etc/fuse.conf for allow_other.
    fuse = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                             "--inh-caps=+sys_admin,+dac_override",
                             "--ambient-caps=+sys_admin,+dac_override", "--",
                             "nbdfuse", "-o", "allow_other", image,
                             "--command", "nbdkit", "-s", "file", backing],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    caller = None
    try:
        servicebus.poll_until(lambda: os.path.exists(image) or fuse.poll() is not None, 10)
        if not os.path.exists(image):
            fuse.kill()
            print(f"# skipped: an attach on a stalled FUSE mount: "
                  f"{fuse.communicate()[1].strip()}")
            return
        bus.set_rules(servicebus.ALLOW_BOTH_ATTACH)
        argv = CALL + ["attach-when-told", image]
        if overlay:
            # Read-only: a write would copy the file up, off the FUSE.
            top, empty = mnt + "-top", mnt + "-empty"
            os.mkdir(top)
            os.mkdir(empty)
            os.listdir(mnt)             # FUSE's root's attributes, not 000
            argv = ["unshare", "-Urm", "sh", "-c",
                    f"mount -t overlay overlay -o lowerdir={mnt}:{empty} {top} || exit 1\n"
                    # Opened as root there, who may search the
                    # overlay's root whatever its mode (FUSE's may be 0).
                    f"exec 7<{top}/disk.img || exit 1\n"
                    f"exec unshare -U --map-user={uid} --map-group={gid} "
                    f"{' '.join(CALL)} attach-when-told /proc/self/fd/7 ro"]
        caller = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}",
                                   "--clear-groups", "--"] + argv,
                                  env=bus.env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        opened = caller.stdout.readline().strip()
        if overlay and opened != "OPEN":
            rest = caller.communicate(timeout=20)[0].strip().splitlines()
            print(f"# skipped: an attach through an overlay of a stalled FUSE mount: "
                  f"{(rest or [opened])[-1]}")
            return
        check("the user opens their FUSE image", opened == "OPEN", opened)
        if lazy:
            subprocess.run(["umount", "-l", mnt], check=True)
        # The bus looks at the descriptor it passes on (a stopped FUSE
        # server would hold up the bus itself): the server is stopped
        # once the call waits for the service, stopped meanwhile.
        call_on(bus, "list")
        service = bus.service_pid()
        procstop.sigstop(service)
        try:
            caller.stdin.write("go\n")
            caller.stdin.flush()
            time.sleep(1)
            procstop.sigstop(fuse.pid)
            time.sleep(2)               # past what FUSE keeps of the file
        finally:
            os.kill(service, signal.SIGCONT)
        time.sleep(1)
        out = call_as(bus, OTHER, ["detach", "/dev/nbd0"], 10)
        how = (" unmounted lazily" if lazy else
               " through an overlay of a user namespace" if overlay else "")
        check(f"an attach of a stalled FUSE image{how} holds up no other user's call",
              out == "ERROR /dev/nbd0 is not attached by mloop", out)
        fuse.send_signal(signal.SIGCONT)
        try:
            said = caller.communicate(timeout=60)[0].strip()
        except subprocess.TimeoutExpired:
            said = "no answer"
        why = ("on a file system the calling process has no mount of" if lazy
               else "on an overlay file system, and the calling process is in a "
               "user namespace of its own" if overlay
               else f"on a FUSE file system uid {uid} mounted")
        check(f"an image on a user's FUSE file system{how} is refused, naming it",
              said.startswith("ERROR") and why in said, said)
    finally:
        bus.set_rules(servicebus.ALLOW_USER)
        if caller and caller.poll() is None:
            caller.kill()
            caller.wait()
        fuse.send_signal(signal.SIGCONT)
        subprocess.run(["umount", "-l", mnt], capture_output=True)
        if fuse.poll() is None:
            fuse.kill()
        fuse.wait()


def attach_on_namespaced_fuse(bus, work):
    """A user who makes a user namespace where they are root mounts a
    FUSE file system (nbdfuse) whose mountinfo says user_id=0, as root's
    does, and calls from there (a namespace nested in it gives them
    their own uid back, which the bus checks); they stop its server once
    the call is the service's.  The kernel refuses a look at the file by
    anyone outside that namespace, root too, asking the server nothing;
    with fuse's allow_sys_admin_access set it lets the service look, and
    the caller's mountinfo, a FUSE mount seen from a user namespace of
    its own, refuses it: either way the attach is refused at once, and
    another user's detach is answered meanwhile."""
    for tool in ("nbdfuse", "nbdkit", "unshare"):
        if shutil.which(tool) is None:
            print(f"# skipped: an attach on a FUSE mount of a user namespace: no {tool}")
            return
    _, uid, gid = USER
    home = os.path.join(work, "userns")
    os.mkdir(home)
    mnt = os.path.join(home, "mnt")
    os.mkdir(mnt)
    backing = os.path.join(home, "backing.img")
    with open(backing, "wb") as f:
        f.truncate(4 << 20)
    # /dev/fuse as Debian makes it, open to all (a test machine's may
    # be root's only): bound over /dev/fuse in the user's namespace.
    dev = os.path.join(home, "fuse")
    try:
        os.mknod(dev, 0o666 | 0o020000, os.makedev(10, 229))
        os.chmod(dev, 0o666)
    except OSError as e:
        print(f"# skipped: an attach on a FUSE mount of a user namespace: {e}")
        return
    for path in (home, mnt, backing):
        os.chown(path, uid, gid)
    image = os.path.join(mnt, "disk.img")
    script = (f"mount --bind {dev} /dev/fuse || exit 1\n"
              f"nbdfuse -o allow_other {image} --command nbdkit -s file {backing} "
              f"</dev/null >/dev/null 2>&1 &\n"
              f"echo FUSE $!\n"
              f"i=0; while [ ! -e {image} ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done\n"
              f"grep -q -e ' {mnt} .* - fuse.*[ ,]user_id=0,' /proc/self/mountinfo || exit 1\n"
              f"exec unshare -U --map-user={uid} --map-group={gid} "
              f"{' '.join(CALL)} attach-when-told {image}\n")
    user = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                             "--", "unshare", "-Urm", "sh", "-c", script],
                            env=bus.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    fuse = None
    try:
        first = user.stdout.readline().strip()
        opened = user.stdout.readline().strip()
        if not first.startswith("FUSE ") or opened != "OPEN":
            rest = user.communicate(timeout=20)[0].strip()
            print(f"# skipped: an attach on a FUSE mount of a user namespace: "
                  f"{first} {opened} {rest}")
            return
        fuse = int(first.split()[1])
        bus.set_rules(servicebus.ALLOW_BOTH_ATTACH)
        call_on(bus, "list")
        service = bus.service_pid()
        procstop.sigstop(service)
        try:
            user.stdin.write("go\n")
            user.stdin.flush()
            time.sleep(1)
            procstop.sigstop(fuse)
            time.sleep(2)               # past what FUSE keeps of the file
        finally:
            os.kill(service, signal.SIGCONT)
        time.sleep(1)
        out = call_as(bus, OTHER, ["detach", "/dev/nbd0"], 10)
        check("an attach of a stalled FUSE image of a user namespace holds up no "
              "other user's call", out == "ERROR /dev/nbd0 is not attached by mloop", out)
        os.kill(fuse, signal.SIGCONT)
        try:
            said = user.communicate(timeout=60)[0].strip()
        except subprocess.TimeoutExpired:
            said = "no answer"
        check("an image on a FUSE file system of a user namespace is refused",
              said.startswith("ERROR") and
              (("cannot look at the file" in said and said.endswith("Permission denied"))
               or "on a FUSE file system uid 0 mounted" in said), said)
    finally:
        bus.set_rules(servicebus.ALLOW_USER)
        if fuse is not None:
            try:
                os.kill(fuse, signal.SIGCONT)
            except ProcessLookupError:
                pass
        # The namespace, its mount and server end with its processes.
        try:
            os.killpg(user.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        user.wait()
        servicebus.poll_until(lambda: fuse is None or not os.path.exists(f"/proc/{fuse}"), 10)


def memory_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def many_mounts(bus, work):
    """A caller whose mountinfo is long (1,600 mounts in a mount
    namespace of their own, each line some 15 KB of escapes: 24 MB, and
    a user may make 100,000) and whose image's mount is the last: the
    service reads at most 8 MiB of it, a line at a time, and refuses
    the attach naming why; its memory's peak grows by less than 4 MiB
    (by the file's size, twice over, when it was read whole)."""
    if shutil.which("unshare") is None:
        print("# skipped: a caller with many mounts: no unshare")
        return
    _, uid, gid = USER
    top = os.path.join(work, "many-mounts")
    os.makedirs(os.path.join(top, "image"))
    with open(os.path.join(top, "image", "disk.img"), "wb") as f:
        f.truncate(1 << 20)
    for path in (top, os.path.join(top, "image"), os.path.join(top, "image", "disk.img")):
        os.chown(path, uid, gid)
    call_on(bus, "list")
    service = bus.service_pid()
    with open(f"/proc/{service}/clear_refs", "w") as f:
        f.write("5")                    # the peak is now what it uses
    before = memory_kb(service, "VmHWM")
    r = bus.run_as(USER, ["unshare", "-Urm", sys.executable,
                          os.path.join(TESTS, "many_mounts.py"), top, "1600",
                          str(uid), str(gid)], timeout=120)
    out = one_line(r)
    if r.returncode != 0 and not out.startswith("ERROR"):
        print(f"# skipped: a caller with many mounts: {out}")
        return
    grown = memory_kb(service, "VmHWM") - before
    check("an image whose mount is past 8 MiB of its caller's mountinfo is refused",
          out.startswith("ERROR") and "is not within the first 8 MiB of the calling "
          "process's mounts" in out, out)
    check("a caller's long mountinfo is not held by the service",
          grown < 4096, f"its peak grew by {grown} KiB")


def long_name_not_logged(bus, image):
    """A name no path could have is refused before it is kept or logged:
    else each call could write hundreds of kilobytes of escapes to the
    journal, pushing out what root needs to read."""
    before = len(bus.log("daemon.log"))
    out = call_on(bus, "attach", "rw", image, "/" + "\x01" * 100000)
    grown = len(bus.log("daemon.log")) - before
    check("a name longer than a path can be is refused and not logged",
          out == "ERROR the image's name is 100001 bytes long: a path has at most 4095"
          and grown < 4096, f"{out[:200]} / the log grew by {grown} bytes")


def heavy_calls(bus, root_only):
    """A call waiting for polkit keeps its message: one carrying more
    than it needs (descriptors beyond an attach's image, a detach's name
    longer than a path, an option repeated, a list's descriptor) is
    refused at once, before polkit is asked.  Else a user's calls in progress, each left waiting
    on an authentication nobody answers, could hold 16 descriptors (as
    many as the bus lets a message carry) or a 32 MiB name each."""
    pid = bus.service_pid()
    before = len(os.listdir(f"/proc/{pid}/fd"))
    for args, expect in [
            (["attach", root_only, "16", "0"],
             "ERROR 16 descriptors were passed: pass the image's, and only it"),
            (["attach", root_only, "1", "0", "3"], "ERROR option read-only given twice"),
            (["detach", root_only, "0", "5000"],
             "ERROR the device's or image's name is 5000 bytes long: a path has at most 4095"),
            (["detach", root_only, "1", "0"],
             "ERROR 1 descriptors were passed with a call that takes none"),
            # A list may wait for the user database (list_holds_nobody).
            (["list", root_only, "1", "0"],
             "ERROR 1 descriptors were passed with a call that takes none")]:
        p = subprocess.Popen(
            ["setpriv", f"--reuid={OTHER[1]}", f"--regid={OTHER[2]}", "--clear-groups",
             "--"] + SILENT_AGENT + CALL + ["heavy", str(MAX_CALLS_PER_USER)] + args,
            env=bus.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        try:
            first = p.stdout.readline().strip()
            held = len(os.listdir(f"/proc/{pid}/fd")) - before
            p.wait(timeout=10)              # a few lines: the pipe holds them
            out = p.stdout.read().strip().splitlines()
            if p.returncode == 77:
                print(f"# skipped: heavy calls: {first}")
                return
            check(f"a {args[0]} carrying more than it needs is refused before polkit "
                  f"({' '.join(args[2:])})",
                  first == "SENT" and out == [expect] * MAX_CALLS_PER_USER,
                  f"{first} / {out[:2]} (exit {p.returncode})")
        except subprocess.TimeoutExpired:
            check(f"a {args[0]} carrying more than it needs is refused before polkit "
                  f"({' '.join(args[2:])})", False,
                  f"the calls wait for polkit, holding {held} more descriptors")
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def per_user_cap(bus, image):
    """A user has at most --max-devices-per-user devices: past it an
    attach is refused in one line before anything starts."""
    bus.set_service_args(["--max-devices-per-user", "0"], subuid=SUBUID)
    out = call_on(bus, "attach", "rw", image)
    check("an attach past the per-user cap is refused in one line",
          out == "ERROR a user may have 0 devices attached at once "
          "(mloop-dbus --max-devices-per-user) and you have 0: detach one first", out)
    refusals_of_one_person(bus, image)
    refusals_logged(bus, image)
    bus.set_service_args([])
    for args, expect in [(["--max-devices-per-user", "many"], "--max-devices-per-user many"),
                         (["--authorization-timeout", "0"], "--authorization-timeout 0"),
                         (["extra"], "unexpected argument extra")]:
        r = subprocess.run([SERVICE] + args, capture_output=True, text=True, timeout=10,
                           env=dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent"))
        check(f"mloop-dbus {' '.join(args)} is refused in one line",
              r.returncode != 0 and one_line(r).startswith(f"mloop-dbus: {expect}")
              and "\n" not in one_line(r), one_line(r))


def refusals_of_one_person(bus, image):
    """The refusals logged are counted by the person too: two uids with
    one login uid, each refused 10 times past the cap (polkit lets
    both), are logged 5 times in all, not 5 times each.  The service
    sees SUBUID as /etc/subuid."""
    if not os.path.exists("/proc/self/loginuid"):
        print("# skipped: the refusals of one person's uids: no login uids")
        return
    bus.set_rules(servicebus.ALLOW_USER + "".join(
        'polkit.addRule(function(action, subject) {\n'
        f'    if (action.id == "org.mloop.attach" && subject.user == "{name}")\n'
        '        return polkit.Result.YES;\n'
        '});\n' for name, _, _ in ONE_PERSON))
    try:
        before = bus.log("daemon.log")
        outs = [subprocess.run(as_person(user, CALL + ["repeat", "10", image, "/one-person.img"]),
                               env=bus.env, capture_output=True, text=True, timeout=120,
                               preexec_fn=set_login_uid).stdout.strip()
                for user in ONE_PERSON]
        during = bus.log("daemon.log")[len(before):]
    finally:
        bus.set_rules(servicebus.ALLOW_USER)
    logged = len(re.findall(r"uid [23]: attach /one-person.img refused", during))
    check("the refusals of two uids with one login uid are logged 5 times in all",
          all(o.startswith("10 x ERROR a user may have 0") for o in outs) and logged == 5,
          f"{outs}: {logged} lines logged")


def refusals_logged(bus, image):
    """A user repeating a refused attach (here past the cap of 0) with a
    name of 4,095 control characters, each logged as four, wrote 8 MB of
    log a second, and the journal then drops the service's lines past
    its rate limit, other users' too: each user's refusals are logged
    at most 5 times in 10 s, another user's (root's here) still are,
    and the count of the rest is logged when the window ends, or, as
    here, when the service stops."""
    name = "/" + "\x1b" * 4094
    # Escaped, each is four bytes: the log shows the first 256 bytes.
    shown = "/" + "\\x1b" * 63 + "... (4095 bytes)"
    before = bus.log("daemon.log")
    out = bus.run_as(USER, CALL + ["repeat", "40", image, name]).stdout.strip()
    check("40 refused attaches are answered", out.startswith("40 x ERROR a user may have 0"),
          out[:200])
    r = subprocess.run(CALL + ["attach", "ro", image, "/root's.img", "read-only=true"],
                       env=bus.env, capture_output=True, text=True, timeout=120)
    during = bus.log("daemon.log")[len(before):]
    bus.kill_service()
    after = bus.log("daemon.log")[len(before):]
    uid = USER[1]
    # The cap's refusal just before was one of this window's 5.
    logged = during.count(f"uid {uid}: attach {shown} refused")
    check("a user's repeated refusals are logged 5 times in 10 s",
          logged == 4, f"{logged} lines, {len(during)} bytes")
    longest = max(len(line) for line in during.splitlines())
    check("a refusal's log line shows at most 256 bytes of the name",
          longest < 1024, f"a line of {longest} bytes")
    check("another user's refusal is logged after them",
          r.stdout.startswith("ERROR") and "uid 0: attach /root's.img refused" in during,
          r.stdout + during[-300:])
    said = re.findall(rf"uid {uid}: (\d+) more refused calls not logged "
                      r"\(at most 5 in 10 s per user\)", after)
    check("the count of the refusals not logged is logged as the service stops",
          said == ["36"], f"{said}: " + after[-300:])


def polkit_silent_at_start(bus, image):
    """A service just started asks polkit for the first time without
    waiting in its main loop: its proxy for polkitd is made on the side
    while polkitd is stopped (a burst of calls that makes the bus drop
    the answers does the same), its first attach is refused after
    --authorization-timeout, and another user's list is answered
    meanwhile."""
    bus.set_service_args(["--authorization-timeout", "3"])
    call_on(bus, "list")                # started, polkit not asked yet
    polkitd = bus.name_owner_pid("org.freedesktop.PolicyKit1")
    procstop.sigstop(polkitd)
    try:
        first = subprocess.Popen(
            ["setpriv", f"--reuid={USER[1]}", f"--regid={USER[2]}", "--clear-groups",
             "--"] + CALL + ["attach", "ro", image, image, "read-only=true"],
            env=bus.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(1)
        out = call_on(bus, "answered-within", "20", user=OTHER)
        try:
            first_out = first.communicate(timeout=40)[0].strip()
        except subprocess.TimeoutExpired:
            first.kill()
            first_out = first.communicate()[0].strip()
    finally:
        os.kill(polkitd, signal.SIGCONT)
    check("a list is answered while a new service's first call waits for polkit",
          out.startswith("ANSWERED") and float(out.split()[1]) < 3, out)
    check("a new service's first call refused after --authorization-timeout",
          first_out == "ERROR not authorized: polkit did not answer for "
          "org.mloop.attach within 3 s (an authentication left waiting?)", first_out)
    bus.set_service_args([])


def mqueue_image():
    """A message queue the user may read, on an mqueue file system
    mounted for the test (unmounted and removed at exit), or None."""
    mnt = tempfile.mkdtemp(prefix="mloop-dbus-test-mqueue-")
    os.chmod(mnt, 0o755)
    harness.on_exit(lambda: os.rmdir(mnt))
    if subprocess.run(["mount", "-t", "mqueue", "mqueue", mnt],
                      capture_output=True).returncode != 0:
        return None
    harness.on_exit(lambda: subprocess.run(["umount", mnt], check=True))
    path = os.path.join(mnt, "queue")
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o644))
    os.chown(path, USER[1], USER[2])
    return path


def call_on(bus, *args, user=USER):
    return one_line(bus.run_as(user, CALL + list(args)))


def call_as(bus, user, args, timeout):
    try:
        return one_line(bus.run_as(user, CALL + list(args), timeout=timeout))
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout} s"


main()
