"""mloop's D-Bus service in the guest, on a private system bus with a
real dbus-daemon and polkitd (tests/servicebus.py): a user who is not
root attaches an image they own with `mloop attach`, gets the device
node (theirs, 0600), writes and reads it (the data is in the image),
and sees it, with its owner, in their `mloop list` as root does in
theirs.  Another user may not detach it ("not your device"), nor attach
an image they cannot open.  The device survives its server's SIGKILL
(the supervisor hands the restarted server the caller's descriptor) and
the service's SIGKILL; the user then detaches it through a service the
bus starts again, and the node is root's again.  A read-only attach is
read-only; a polkit rule denying attach is obeyed.  A user's autoclear
device gives its node back to root when the kernel lets it go; one its
user opens again at once, which the kernel keeps for them, stays
recorded until they close it, and its node is then root's.  A
node a user was left holding is root's again before the next device is
connected there (a user watching its size never opens it).  The name a
caller gives is only a label: a user who names their image after
root's neither becomes its kernel backend nor is found by `mloop detach
ROOT-IMAGE`, and their own `mloop detach FILE` finds it by the file they
resolved.  With the service's per-user
cap at 1 a user's second attach is refused until the first is detached,
and so is another uid's attach made with the first user's login uid
(as a user's subordinate uids in a user namespace keep it), and a name with control characters and an RLO (U+202E) is listed
escaped, in root's list and the user's; a device the user detached
while holding its node open counts against the cap until they close it.  An ACL the
user set on their node while it was theirs is gone once it is root's
again, and they cannot read root's next image there.  About 25-33 s in
the VM (42-60 s with the machine loaded)."""
import os
import signal
import stat
import subprocess
import sys
import time

from kfix import free_nbd, make_image, nbd_in_use, sysfs, wait_until

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import servicebus  # noqa: E402

import dbusfix  # noqa: E402
from dbusfix import one_line  # noqa: E402

import kinds  # noqa: E402

USER, OTHER = servicebus.USER, servicebus.OTHER
DBUS_CALL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "dbus_call.py")
PATTERN = bytes(range(256)) * 16 * 64          # 256 KiB
CALL = [sys.executable, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "dbus_call.py")]
# Run as a user: opens DEV the moment the kernel gives it a size, as
# someone waiting for the next device there would, and says what it got.
WATCHER = """
import os, sys, time
dev, size = sys.argv[1], "/sys/block/" + os.path.basename(sys.argv[1]) + "/size"
print("ready", flush=True)
while True:
    try:
        if open(size).read().strip() != "0":
            fd = os.open(dev, os.O_RDONLY)
            print("opened", flush=True)
            time.sleep(60)
    except OSError:
        pass
    time.sleep(0.001)
"""


# Run as the node's owner: an access ACL on NODE letting UID read and
# write it, as `setfacl -m u:UID:rw NODE` sets (no acl package needed).
SET_ACL = """
import os, struct, sys
node, uid = sys.argv[1], int(sys.argv[2])
entries = [(0x01, 6, 0xffffffff), (0x02, 6, uid), (0x04, 0, 0xffffffff),
           (0x10, 6, 0xffffffff), (0x20, 0, 0xffffffff)]
os.setxattr(node, "system.posix_acl_access", struct.pack("<I", 2) +
            b"".join(struct.pack("<HHI", *e) for e in entries))
"""


def has_acl(path):
    try:
        os.getxattr(path, "system.posix_acl_access")
        return True
    except OSError:
        return False


def user_image(cl, owner, seed):
    image = make_image(cl, seed=seed)
    os.chmod(os.path.dirname(image), 0o755)
    os.chown(image, owner[1], owner[2])
    os.chmod(image, 0o600)
    return image


def node_owner(dev):
    st = os.stat(dev)
    return st.st_uid, stat.S_IMODE(st.st_mode)


def watch_as(user, bus, dev, cl):
    """A process of USER's that opens DEV as soon as it has a size."""
    _, uid, gid = user
    p = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}",
                          "--clear-groups", "--", sys.executable, "-c", WATCHER, dev],
                         env=bus.env, stdout=subprocess.PIPE, text=True)
    cl.push(lambda: p.poll() is None and (p.kill(), p.wait()))
    assert p.stdout.readline().strip() == "ready", "the watcher did not start"
    return p


# Run as a user: opens DEV, closes it (an autoclear device's last close)
# and opens it again at once, then holds it until stdin closes.
HOLD_AGAIN = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.close(fd)
fd = os.open(sys.argv[1], os.O_RDONLY)
print("held", flush=True)
sys.stdin.read()
"""


def hold_again_as(user, bus, dev, cl):
    """A process of USER's holding DEV opened again after its last close."""
    _, uid, gid = user
    p = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}",
                          "--clear-groups", "--", sys.executable, "-c", HOLD_AGAIN, dev],
                         env=bus.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    cl.push(lambda: p.poll() is None and (p.kill(), p.wait()))
    line = p.stdout.readline().strip()
    assert line == "held", f"the user could not open {dev} again: {line!r}"
    return p


def same_person_refused(kind, bus, cl, dev):
    """With one device per user, USER's DEV attached: OTHER's attach is
    refused when OTHER, one of USER's subordinate uids in the service's
    /etc/subuid, runs with USER's login uid, as a user's
    subordinate uids in a user namespace of theirs do (the service
    counts a user's devices by login uid, else by uid: USER's attach
    here had none, so DEV counts against uid USER)."""
    if not os.path.exists("/proc/self/loginuid"):
        print("# skipped: the devices of one person's uids: no login uids")
        return

    def login_as_user():
        with open("/proc/self/loginuid", "w") as f:
            f.write(str(USER[1]))

    image = user_image(cl, OTHER, seed=3)
    r = subprocess.run(["setpriv", f"--reuid={OTHER[1]}", f"--regid={OTHER[2]}",
                        "--clear-groups", "--", kinds.CLI, "attach", image],
                       env=bus.env, capture_output=True, text=True, timeout=120,
                       preexec_fn=login_as_user)
    if r.returncode == 0:
        kind.cli("detach", r.stdout.strip(), check=False)
    assert r.returncode != 0 and one_line(r) == \
        f"mloop: attach {image}: a user may have 1 devices attached at once " \
        "(mloop-dbus --max-devices-per-user) and you have 1: detach one first", \
        f"a second uid with the login uid of {dev}'s user: {one_line(r)}"


def run_test(kind, cl, unit=None, check_sandbox=None):
    """UNIT: the service runs in that systemd unit; CHECK_SANDBOX(PID)
    then asserts the sandbox of the service and of a device's server."""
    bus = dbusfix.start(kind, cl, unit=unit)
    bus.set_rules(servicebus.ALLOW_BOTH_ATTACH)

    def as_user(user, *argv, check=True, text=True):
        r = bus.run_as(user, argv, text=text)
        if check:
            assert r.returncode == 0, f"{' '.join(argv)} as {user[0]}: {one_line(r)}"
        return r

    # 1. A user attaches their image; the node is theirs.
    image = user_image(cl, USER, seed=1)
    dev = as_user(USER, kinds.CLI, "attach", image).stdout.strip()
    cl.push(lambda: kind.cli("detach", dev, check=False))
    st = os.stat(dev)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (USER[1], 0o600), \
        f"{dev} is uid {st.st_uid} mode {oct(st.st_mode)}"
    listed = kind.cli("list", "--json").stdout
    assert '"owner":"nobody"' in listed.replace(" ", "") and image in listed, listed
    mine = as_user(USER, kinds.CLI, "list").stdout
    assert dev in mine and "nobody" in mine, f"the user's list: {mine}"

    if check_sandbox:
        check_sandbox(bus.service_pid())
        check_sandbox(kind.status(dev)["device"]["server_pid"])

    # 2. They write and read it; the data is in their image.
    pattern = os.path.join(os.path.dirname(image), "pattern")
    with open(pattern, "wb") as f:
        f.write(PATTERN)
    os.chmod(pattern, 0o644)
    as_user(USER, "dd", f"if={pattern}", f"of={dev}", "bs=64k", "seek=1", "oflag=direct",
            "conv=fsync", "status=none")
    back = as_user(USER, "dd", f"if={dev}", "bs=64k", "skip=1", "count=4", "iflag=direct",
                   "status=none", text=False)
    assert back.stdout == PATTERN, "the user reads back other data than they wrote"
    with open(image, "rb") as f:
        f.seek(65536)
        in_image = f.read(len(PATTERN))
    assert in_image == PATTERN, "what the user wrote is not in the image"

    # 3. Another user: not their device, not an image they can open.
    r = as_user(OTHER, kinds.CLI, "detach", dev, check=False)
    assert r.returncode != 0 and "is not your device" in one_line(r) and \
        "\n" not in one_line(r), f"another user's detach: {one_line(r)}"
    r = as_user(OTHER, kinds.CLI, "attach", "--read-only", image, check=False)
    assert r.returncode != 0 and "Permission denied" in one_line(r), one_line(r)
    r = as_user(OTHER, kinds.CLI, "attach", "--read-only", dev, check=False)
    assert r.returncode != 0 and "Permission denied" in one_line(r), one_line(r)

    # 4. The server dies: the restarted one reopens the caller's file.
    before = kind.status(dev)
    os.kill(before["device"]["server_pid"], signal.SIGKILL)
    wait_until(lambda: kind.status(dev)["restarts"] == 1 and
               kind.status(dev)["server_running"], "the server's restart")
    again = as_user(USER, "dd", f"if={dev}", "bs=64k", "skip=1", "count=4", "iflag=direct",
                    "status=none", text=False)
    assert again.stdout == back.stdout, "the restarted server reads other data"

    # 5. The service dies: the device goes on; the next call starts it.
    bus.kill_service(signal.SIGKILL)
    as_user(USER, "dd", f"if={pattern}", f"of={dev}", "bs=64k", "seek=8", "oflag=direct",
            "conv=fsync", "status=none")
    as_user(USER, kinds.CLI, "detach", dev)
    wait_until(lambda: not nbd_in_use(dev), f"{dev} to disconnect")
    st = os.stat(dev)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o660, \
        f"after detach {dev} is uid {st.st_uid} mode {oct(st.st_mode)}"
    assert not kind.state_entries(), f"state remains: {kind.state_entries()}"
    with open(image, "rb") as f:
        f.seek(8 * 65536)
        assert f.read(len(PATTERN)) == PATTERN, "the write after the service's death is lost"

    # 6. Read-only, then a rule that says no.
    dev = as_user(USER, kinds.CLI, "attach", "--read-only", image).stdout.strip()
    with open(f"/sys/block/{os.path.basename(dev)}/ro") as f:
        assert f.read().strip() == "1", f"{dev} is not read-only"
    as_user(USER, kinds.CLI, "detach", dev)
    bus.set_rules(servicebus.DENY_ATTACH)
    r = as_user(USER, kinds.CLI, "attach", image, check=False)
    assert r.returncode != 0 and "not authorized: polkit refused org.mloop.attach" in \
        one_line(r), one_line(r)
    assert not kind.state_entries(), f"state remains: {kind.state_entries()}"

    # 7. An autoclear device goes without a detach: its node goes back
    # to root once the kernel lets it go.
    bus.set_rules(servicebus.ALLOW_BOTH_ATTACH)
    out = as_user(USER, *CALL, "attach", "rw", image, image, "autoclear=true").stdout.strip()
    assert out.startswith("OK /dev/nbd"), f"autoclear attach: {out}"
    dev = out.split()[1]
    cl.push(lambda: kind.cli("detach", dev, check=False))
    assert node_owner(dev) == (USER[1], 0o600), f"{dev}: {node_owner(dev)}"
    as_user(USER, "dd", f"if={dev}", "of=/dev/null", "bs=4k", "count=1", "status=none")
    wait_until(lambda: not kind.state_entries(), "the autoclear device's cleanup")
    assert node_owner(dev) == (0, 0o660), \
        f"after an autoclear release {dev} is still uid/mode {node_owner(dev)}"

    # 7b. Its user opens it again the moment the kernel lets it go: the
    # kernel configures the idle device again and keeps it for them, so
    # it stays recorded (and counted) until they close it, and its node
    # is root's then.
    out = as_user(USER, *CALL, "attach", "rw", image, image, "autoclear=true").stdout.strip()
    assert out.startswith("OK /dev/nbd"), f"autoclear attach: {out}"
    dev = out.split()[1]
    cl.push(lambda: kind.cli("detach", dev, check=False))
    holder = hold_again_as(USER, bus, dev, cl)
    time.sleep(1.5)                     # three of the supervisor's looks
    assert kind.state_entries(), f"{dev}, held by its user, was forgotten"
    holder.stdin.close()
    holder.wait(10)
    wait_until(lambda: not kind.state_entries(), "the reopened device's cleanup")
    assert node_owner(dev) == (0, 0o660) and not nbd_in_use(dev), \
        f"after its user closed it {dev} is uid/mode {node_owner(dev)}"

    # 8. A node left a user's (as by an attach that died) is root's again
    # before root's next image is connected there: a user watching its
    # size never opens it.
    dev = free_nbd()
    os.chown(dev, USER[1], USER[2])
    os.chmod(dev, 0o600)
    cl.push(lambda: (os.chown(dev, 0, 0), os.chmod(dev, 0o660)))
    watcher = watch_as(USER, bus, dev, cl)
    root_image = make_image(cl, seed=7)
    os.chmod(root_image, 0o600)
    got = kind.cli(*kind.attach_args(root_image), "--device", dev).stdout.strip()
    cl.push(lambda: kind.cli("detach", got, check=False))
    assert got == dev, f"root's attach made {got}, not {dev}"
    time.sleep(0.5)
    watcher.kill()
    seen = watcher.communicate()[0]
    assert "opened" not in seen, f"a user opened {dev} while root's image was attached there"
    assert node_owner(dev) == (0, 0o660), f"root's {dev}: {node_owner(dev)}"

    # 9. The name is the caller's label, not the device's identity: a
    # user's image named after root's is neither root's kernel backend
    # nor what `mloop detach ROOT-IMAGE` finds.
    out = as_user(USER, *CALL, "attach", "rw", image, root_image).stdout.strip()
    assert out.startswith("OK /dev/nbd"), f"attach under root's name: {out}"
    mine = out.split()[1]
    cl.push(lambda: kind.cli("detach", mine, check=False))
    backend = sysfs(mine, "backend")
    assert backend != root_image and root_image not in (backend or ""), \
        f"the user's device has root's image's name as its backend: {backend}"
    listed = as_user(USER, kinds.CLI, "list").stdout
    assert mine in listed and root_image in listed, f"the user's label is not shown: {listed}"
    kind.cli("detach", root_image)
    wait_until(lambda: not nbd_in_use(dev), f"root's {dev} to disconnect")
    assert nbd_in_use(mine), f"`mloop detach {root_image}` detached the user's {mine}"
    # The user's detach by their file's path finds it by the identity of
    # the file they resolved, not by its label.
    as_user(USER, kinds.CLI, "detach", image)
    wait_until(lambda: not nbd_in_use(mine), f"the user's {mine} to disconnect")

    # 10. One device per user here: a second is refused until the first
    # is detached.  A name with control characters is shown escaped.
    bus.set_rules(servicebus.ALLOW_BOTH_ATTACH)
    # OTHER is one of USER's subordinate uids here (same_person_refused).
    bus.set_service_args(["--max-devices-per-user", "1"], subuid=f"{USER[0]}:{OTHER[1]}:1\n")
    hostile = os.path.join(os.path.dirname(image), "x\x1b[2J\u009bm\u202e.img")
    r = as_user(USER, sys.executable, DBUS_CALL, "attach", "rw", image, hostile)
    assert r.stdout.startswith("OK /dev/nbd"), one_line(r)
    dev = r.stdout.split()[1]
    cl.push(lambda: kind.cli("detach", dev, check=False))
    shown = os.path.join(os.path.dirname(image), "x\\x1b[2J\\xc2\\x9bm\\xe2\\x80\\xae.img")
    for who, listed in (("root's", kind.cli("list").stdout),
                        ("the user's", as_user(USER, kinds.CLI, "list").stdout)):
        assert shown in listed and "\x1b" not in listed and "\u009b" not in listed \
            and "\u202e" not in listed, \
            f"{who} list shows the name raw: {listed!r}"
    second = user_image(cl, USER, seed=2)
    r = as_user(USER, kinds.CLI, "attach", second, check=False)
    assert r.returncode != 0 and one_line(r) == \
        f"mloop: attach {second}: a user may have 1 devices attached at once " \
        "(mloop-dbus --max-devices-per-user) and you have 1: detach one first", one_line(r)
    as_user(USER, kinds.CLI, "detach", dev)
    dev = as_user(USER, kinds.CLI, "attach", second).stdout.strip()
    same_person_refused(kind, bus, cl, dev)

    # 11. A device detached while the user holds its node open stays
    # the kernel's (busy) until they close it, and counts against their
    # cap until then: otherwise opening each node before its detach
    # would pin any number of devices.
    holder = subprocess.Popen(["setpriv", f"--reuid={USER[1]}", f"--regid={USER[2]}",
                               "--clear-groups", "--", sys.executable, "-c",
                               "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
                               "print('open', flush=True); sys.stdin.read()", dev],
                              env=bus.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    cl.push(lambda: holder.poll() is None and (holder.kill(), holder.wait()))
    assert holder.stdout.readline().strip() == "open", "the user could not open their node"
    as_user(USER, kinds.CLI, "detach", dev)
    r = as_user(USER, kinds.CLI, "attach", image, check=False)
    assert r.returncode != 0 and "you have 1, 1 of them detached but still open" \
        in one_line(r), f"an attach past a held device: {one_line(r)}"
    holder.stdin.close()
    holder.wait(10)
    wait_until(lambda: not nbd_in_use(dev), f"the held {dev} to be let go")
    dev = as_user(USER, kinds.CLI, "attach", image).stdout.strip()
    as_user(USER, kinds.CLI, "detach", dev)
    assert not kind.state_entries(), f"state remains: {kind.state_entries()}"

    # 12. An ACL the user set on their node while it was theirs (as its
    # owner may) goes with it: chown and chmod 0660 keep an ACL, whose
    # entry for the user would open root's next image there to them.
    dev = as_user(USER, kinds.CLI, "attach", image).stdout.strip()
    cl.push(lambda: kind.cli("detach", dev, check=False))
    r = as_user(USER, sys.executable, "-c", SET_ACL, dev, str(USER[1]), check=False)
    if r.returncode == 0:
        as_user(USER, kinds.CLI, "detach", dev)
        wait_until(lambda: not nbd_in_use(dev), f"{dev} to disconnect")
        assert not has_acl(dev), f"{dev} keeps the ACL its user set, given back to root"
        got = kind.cli(*kind.attach_args(root_image), "--device", dev).stdout.strip()
        cl.push(lambda: kind.cli("detach", got, check=False))
        r = as_user(USER, "dd", f"if={dev}", "of=/dev/null", "bs=4k", "count=1",
                    "status=none", check=False)
        assert r.returncode != 0 and "Permission denied" in one_line(r), \
            f"the user read root's image on {dev}: {one_line(r)}"
        kind.cli("detach", got)
    else:
        print(f"# skipped: an ACL on the node: {one_line(r)}")
        as_user(USER, kinds.CLI, "detach", dev)
