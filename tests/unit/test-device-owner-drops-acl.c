/* A device node given back to root keeps no access ACL its user set.
 * While a user owns their device's node (mode 0600) they may set an
 * ACL on it, as any owner may; chown and chmod 0660 keep the ACL, and
 * chmod's mask lets a named user's entry through, so the user could
 * open the node again once root's next image is connected there.
 * Giving a node back removes its ACL, and a node that has one is not
 * root's only.
 * Root (it makes a node in /dev, which keeps ACLs): about 0.01 s, in
 * the unit suite of every tier; a SKIP without root or ACLs in /dev.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "device_owner.h"
#include "unit.h"

#define USER_UID 65534
#define ACL_VERSION 2
#define ACL_USER_OBJ 0x01
#define ACL_USER 0x02
#define ACL_GROUP_OBJ 0x04
#define ACL_MASK 0x10
#define ACL_OTHER 0x20
#define NO_ID 0xffffffffu

struct acl_entry {
  uint16_t tag, perm;
  uint32_t id;
};

/* In a child as USER_UID: sets on NODE an ACL letting that uid read and
 * write it (0), or says why not (errno), or 255 on an open that worked
 * when OPEN is set.
 */
static int
as_user (const char *node, bool open_it)
{
  struct {
    uint32_t version;
    struct acl_entry e[5];
  } __attribute__ ((packed)) acl = {
    ACL_VERSION, {
      { ACL_USER_OBJ, 6, NO_ID }, { ACL_USER, 6, USER_UID },
      { ACL_GROUP_OBJ, 0, NO_ID }, { ACL_MASK, 6, NO_ID },
      { ACL_OTHER, 0, NO_ID },
    },
  };
  pid_t pid = fork ();
  int status;

  CHECK (pid != -1, "fork: %s", strerror (errno));
  if (pid == 0) {
    if (setgroups (0, NULL) == -1 || setgid (USER_UID) == -1 ||
        setuid (USER_UID) == -1)
      _exit (EPERM);
    if (open_it)
      _exit (open (node, O_RDWR) >= 0 ? 255 : 0);
    _exit (setxattr (node, "system.posix_acl_access", &acl, sizeof acl,
                     0) == 0 ? 0 : errno);
  }
  CHECK (waitpid (pid, &status, 0) == pid && WIFEXITED (status),
         "the child as uid %d did not exit", USER_UID);
  return WEXITSTATUS (status);
}

int
main (void)
{
  char name[64], node[80], err[512];
  int r;

  unit_deadline (10);
  if (geteuid () != 0)
    unit_skip ("needs root, to make a device node in /dev");
  snprintf (name, sizeof name, "mloop-unit-acl-%d", (int) getpid ());
  snprintf (node, sizeof node, "/dev/%s", name);
  if (mknod (node, S_IFCHR | 0660, makedev (1, 3)) == -1)
    unit_skip ("mknod %s: %s", node, strerror (errno));
  unit_remove_at_exit (node);

  CHECK (mloop_device_owner_set (name, USER_UID, err, sizeof err) == 0,
         "%s", err);
  r = as_user (node, false);
  if (r == EOPNOTSUPP)
    unit_skip ("/dev keeps no ACLs here");
  CHECK (r == 0, "the node's owner could not set an ACL: %s", strerror (r));

  CHECK (mloop_device_owner_set (name, 0, err, sizeof err) == 0, "%s", err);
  CHECK (getxattr (node, "system.posix_acl_access", NULL, 0) == -1 &&
         errno == ENODATA, "the node given back to root keeps its ACL");
  CHECK (as_user (node, true) == 0,
         "the user opened the node given back to root");
  CHECK (mloop_device_owner_is_root (name), "the node is not root's");

  /* One left with an ACL (its owner's, set as root here) is not root's
   * only, so the next attach takes it back before using it.
   */
  CHECK (mloop_device_owner_set (name, USER_UID, err, sizeof err) == 0,
         "%s", err);
  CHECK (as_user (node, false) == 0, "the node's owner could not set an ACL");
  CHECK (chown (node, 0, 0) == 0 && chmod (node, 0660) == 0, "%s",
         strerror (errno));
  CHECK (!mloop_device_owner_is_root (name),
         "a node whose ACL lets a user open it counts as root's only");

  printf ("ok: a node given back to root has no ACL its user set\n");
  return 0;
}
