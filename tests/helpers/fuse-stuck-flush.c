/* Test helper: a one-file FUSE file system (the raw /dev/fuse protocol,
 * no libfuse) whose server answers every request at once but one: the
 * FUSE_FLUSH sent by a process whose name (comm) is VICTIM, or by a
 * process it started (however deep: one forked and not yet exec'd
 * still closes its copies of VICTIM's descriptors, under the name of
 * the thread that forked it), which it never answers.  The kernel sends FUSE_FLUSH at every close(2) of a
 * file of the mount and waits for the answer uninterruptibly, so the
 * victim's close of a descriptor of its file waits until this server
 * answers or goes (its /dev/fuse descriptor closed: the connection is
 * aborted and every waiting request fails).  A server that answers
 * FLUSH with ENOSYS once (libfuse's default, nbdfuse) is never sent
 * one again: this one answers everyone else's.
 *
 *   fuse-stuck-flush MOUNTPOINT UID GID VICTIM
 *
 * Mounts (needs root; allow_other, user_id=UID: as a user's mount made
 * through fusermount), then serves as UID:GID the file disk.img (4 MiB
 * of zeros, writes accepted and dropped) until killed.  Says "serving"
 * on standard error once mounted, and a line for each FLUSH: whose,
 * and whether it is answered.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/fuse.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define SIZE (4u << 20)

static char buf[FUSE_MIN_READ_BUFFER + (1 << 20)];
static char zeros[1 << 20];
static int dev;

static void
reply (uint64_t unique, int error, const void *arg, size_t len)
{
  struct fuse_out_header h = { .len = sizeof h + len, .error = error,
                               .unique = unique };
  struct iovec iov[2] = { { &h, sizeof h }, { (void *) arg, len } };

  /* ENOENT: the request was interrupted meanwhile. */
  if (writev (dev, iov, len ? 2 : 1) == -1 && errno != ENOENT)
    perror ("fuse-stuck-flush: writev");
}

static void
fill_attr (struct fuse_attr *a, uint64_t ino)
{
  memset (a, 0, sizeof *a);
  a->ino = ino;
  a->nlink = 1;
  a->blksize = 4096;
  if (ino == FUSE_ROOT_ID)
    a->mode = S_IFDIR | 0755;
  else {
    a->mode = S_IFREG | 0666;
    a->size = SIZE;
    a->blocks = SIZE / 512;
  }
}

/* FIELD ("Tgid", "PPid") of thread or process ID's /proc status, or 0. */
static long
status_field (long id, const char *field)
{
  char path[64], status[4096], key[32];
  const char *t;
  ssize_t n;
  int fd;

  snprintf (path, sizeof path, "/proc/%ld/status", id);
  if ((fd = open (path, O_RDONLY | O_CLOEXEC)) == -1)
    return 0;
  n = read (fd, status, sizeof status - 1);
  close (fd);
  if (n <= 0)
    return 0;
  status[n] = '\0';
  snprintf (key, sizeof key, "\n%s:", field);
  t = strstr (status, key);
  return t ? strtol (t + strlen (key), NULL, 10) : 0;
}

/* The name (comm) of process PID: its thread group leader's, which a
 * thread renamed does not change.
 */
static void
process_name (long pid, char *out, size_t size)
{
  char path[64];
  ssize_t n;
  int fd;

  snprintf (out, size, "?");
  snprintf (path, sizeof path, "/proc/%ld/comm", pid);
  if ((fd = open (path, O_RDONLY | O_CLOEXEC)) == -1)
    return;
  n = read (fd, out, size - 1);
  close (fd);
  out[n > 0 ? n : 0] = '\0';
  out[strcspn (out, "\n")] = '\0';
}

/* Whether the process thread TID belongs to is VICTIM or one it
 * started; OUT, its name, "NAME (started by VICTIM)" for the latter.
 */
static bool
is_victim (pid_t tid, const char *victim, char *out, size_t size)
{
  long pid = status_field (tid, "Tgid");
  char name[64];

  if (pid == 0)
    pid = tid;
  process_name (pid, out, size);
  if (strcmp (out, victim) == 0)
    return true;
  for (long p = status_field (pid, "PPid"); p > 1;
       p = status_field (p, "PPid")) {
    process_name (p, name, sizeof name);
    if (strcmp (name, victim) == 0) {
      snprintf (out + strlen (out), size - strlen (out), " (started by %s)",
                victim);
      return true;
    }
  }
  return false;
}

static void
serve (const char *victim)
{
  for (;;) {
    ssize_t n = read (dev, buf, sizeof buf);
    struct fuse_in_header *in = (void *) buf;
    void *arg = buf + sizeof *in;

    if (n == -1) {
      if (errno == EINTR || errno == ENOENT || errno == EAGAIN)
        continue;
      if (errno == ENODEV)              /* unmounted */
        exit (0);
      perror ("fuse-stuck-flush: read");
      exit (1);
    }
    switch (in->opcode) {
    case FUSE_INIT: {
      const struct fuse_init_in *i = arg;
      struct fuse_init_out o = {
        .major = FUSE_KERNEL_VERSION,
        .minor = i->minor < FUSE_KERNEL_MINOR_VERSION ? i->minor
                 : FUSE_KERNEL_MINOR_VERSION,
        .max_readahead = i->max_readahead, .max_write = 128 << 10,
        .max_background = 16, .congestion_threshold = 12,
      };

      reply (in->unique, 0, &o, sizeof o);
      break;
    }
    case FUSE_LOOKUP: {
      struct fuse_entry_out e = { .nodeid = 2, .attr_valid = 1,
                                  .entry_valid = 1 };

      if (in->nodeid != FUSE_ROOT_ID || strcmp (arg, "disk.img") != 0) {
        reply (in->unique, -ENOENT, NULL, 0);
        break;
      }
      fill_attr (&e.attr, 2);
      reply (in->unique, 0, &e, sizeof e);
      break;
    }
    case FUSE_GETATTR: {
      struct fuse_attr_out a = { .attr_valid = 1 };

      fill_attr (&a.attr, in->nodeid);
      reply (in->unique, 0, &a, sizeof a);
      break;
    }
    case FUSE_OPEN:
    case FUSE_OPENDIR: {
      struct fuse_open_out o = { .fh = 1 };

      reply (in->unique, 0, &o, sizeof o);
      break;
    }
    case FUSE_READ: {
      const struct fuse_read_in *r = arg;
      size_t len = r->offset >= SIZE ? 0 : r->size;

      if (len > SIZE - r->offset)
        len = SIZE - r->offset;
      if (len > sizeof zeros)
        len = sizeof zeros;
      reply (in->unique, 0, zeros, len);
      break;
    }
    case FUSE_WRITE: {
      const struct fuse_write_in *w = arg;
      struct fuse_write_out o = { .size = w->size };

      reply (in->unique, 0, &o, sizeof o);
      break;
    }
    case FUSE_FLUSH: {
      char name[128];
      bool answered = !is_victim (in->pid, victim, name, sizeof name);

      fprintf (stderr, "fuse-stuck-flush: FLUSH from thread %u of %s: %s\n",
               in->pid, name, answered ? "answered" : "never answered");
      if (answered)
        reply (in->unique, 0, NULL, 0);
      break;
    }
    case FUSE_READDIR:
    case FUSE_RELEASE:
    case FUSE_RELEASEDIR:
    case FUSE_ACCESS:
    case FUSE_FSYNC:
      reply (in->unique, 0, NULL, 0);
      break;
    case FUSE_STATFS: {
      struct fuse_statfs_out s = { .st = { .bsize = 4096, .frsize = 4096,
                                           .namelen = 255 } };

      reply (in->unique, 0, &s, sizeof s);
      break;
    }
    case FUSE_FORGET:
    case FUSE_BATCH_FORGET:
    case FUSE_INTERRUPT:                /* no answer expected */
      break;
    case FUSE_DESTROY:
      reply (in->unique, 0, NULL, 0);
      exit (0);
    default:
      reply (in->unique, -ENOSYS, NULL, 0);
      break;
    }
  }
}

int
main (int argc, char **argv)
{
  char opts[256];
  uid_t uid;
  gid_t gid;

  if (argc != 5) {
    fprintf (stderr, "usage: fuse-stuck-flush MOUNTPOINT UID GID VICTIM\n");
    return 2;
  }
  uid = (uid_t) strtoul (argv[2], NULL, 10);
  gid = (gid_t) strtoul (argv[3], NULL, 10);
  dev = open ("/dev/fuse", O_RDWR | O_CLOEXEC);
  if (dev == -1) {
    perror ("fuse-stuck-flush: /dev/fuse");
    return 1;
  }
  snprintf (opts, sizeof opts, "fd=%d,rootmode=40000,user_id=%u,"
            "group_id=%u,allow_other", dev, (unsigned) uid, (unsigned) gid);
  if (mount ("fuse-stuck-flush", argv[1], "fuse.fuse-stuck-flush",
             MS_NOSUID | MS_NODEV, opts) == -1) {
    perror ("fuse-stuck-flush: mount");
    return 1;
  }
  if (setgroups (0, NULL) == -1 || setresgid (gid, gid, gid) == -1 ||
      setresuid (uid, uid, uid) == -1) {
    perror ("fuse-stuck-flush: setresuid");
    return 1;
  }
  fprintf (stderr, "fuse-stuck-flush: serving\n");
  serve (argv[4]);
  return 0;
}
