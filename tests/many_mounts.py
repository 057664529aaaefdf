"""Run as root of a user namespace of its own (unshare -Urm) by
tests/client/test-dbus-service.py: makes COUNT mounts (tmpfs, stacked)
on a directory under DIR whose path is 3,765 spaces deep, each shown
in mountinfo as some 15 KB of escapes, then binds DIR/image onto
DIR/last, so the image's mount is the last line, and attaches
DIR/last/disk.img through dbus_call.py as USER_ID:GROUP_ID (a user
namespace nested in this one gives the caller their own uid back,
which the bus checks).

  many_mounts.py DIR COUNT USER_ID GROUP_ID
"""
import ctypes
import os
import sys


def main():
    top, count, uid, gid = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source, target, fstype, flags):
        if libc.mount(source.encode(), target.encode(), fstype, flags, None) != 0:
            sys.exit(f"mount {target}: {os.strerror(ctypes.get_errno())}")

    deep = os.path.join(top, "deep", "/".join([" " * 250] * 15))
    os.makedirs(deep)
    for _ in range(count):
        mount("none", deep, b"tmpfs", 0)
    last = os.path.join(top, "last")
    os.mkdir(last)
    mount(os.path.join(top, "image"), last, None, 4096)   # MS_BIND
    call = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dbus_call.py")
    os.execvp("unshare", ["unshare", "-U", f"--map-user={uid}", f"--map-group={gid}",
                          sys.executable, call, "attach", "rw",
                          os.path.join(last, "disk.img")])


main()
