/* mloop — the per-request trace (see trace.h). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

#include "nbd_proto.h"
#include "trace.h"

#define TRACE_BUFFER 16384
#define TRACE_LINE   256        /* the longest line, with room to spare */

bool mloop_trace_enabled;

static int trace_fd = -1;
static bool trace_autoflush;
static pthread_key_t buffer_key;

struct buffer {
  size_t len;
  char data[TRACE_BUFFER];
};

static void
write_all (const char *p, size_t n)
{
  while (n > 0) {
    ssize_t r = write (trace_fd, p, n);

    if (r == -1 && errno == EINTR)
      continue;
    if (r <= 0)
      return;                   /* a diagnostic: drop what will not go */
    p += r;
    n -= (size_t) r;
  }
}

static void
buffer_flush (struct buffer *b)
{
  if (b->len) {
    write_all (b->data, b->len);
    b->len = 0;
  }
}

/* A thread's last events are written as it exits. */
static void
buffer_destroy (void *p)
{
  buffer_flush (p);
  free (p);
}

int
mloop_trace_open (const char *path, bool autoflush)
{
  int fd;

  if (trace_fd >= 0)
    return 0;                   /* already open: the first path wins */
  fd = open (path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd == -1)
    return -1;
  if (pthread_key_create (&buffer_key, buffer_destroy) != 0) {
    close (fd);
    errno = ENOMEM;
    return -1;
  }
  trace_fd = fd;
  trace_autoflush = autoflush;
  mloop_trace_enabled = true;
  return 0;
}

static struct buffer *
thread_buffer (void)
{
  struct buffer *b = pthread_getspecific (buffer_key);

  if (b == NULL) {
    b = malloc (sizeof *b);
    if (b == NULL)
      return NULL;
    b->len = 0;
    if (pthread_setspecific (buffer_key, b) != 0) {
      free (b);
      return NULL;
    }
  }
  return b;
}

static const char *
event_name (enum mloop_trace_event e)
{
  switch (e) {
  case MLOOP_TRACE_RECV: return "recv";
  case MLOOP_TRACE_SUBMIT: return "submit";
  case MLOOP_TRACE_COMPLETE: return "complete";
  case MLOOP_TRACE_REPLY: return "reply";
  case MLOOP_TRACE_DROP: return "drop";
  case MLOOP_TRACE_RETURN: return "return";
  }
  return "?";
}

static const char *
command_name (uint16_t cmd)
{
  switch (cmd) {
  case NBD_CMD_READ: return "read";
  case NBD_CMD_WRITE: return "write";
  case NBD_CMD_DISC: return "disc";
  case NBD_CMD_FLUSH: return "flush";
  case NBD_CMD_TRIM: return "trim";
  case NBD_CMD_WRITE_ZEROES: return "zero";
  case NBD_CMD_BLOCK_STATUS: return "block-status";
  }
  return "unknown";
}

void
mloop_trace_record (enum mloop_trace_event event, unsigned conn,
                    const void *cookie, uint64_t seq, uint16_t cmd,
                    uint64_t offset, uint64_t length, int error)
{
  struct buffer *b;
  struct timespec ts;
  char id[32];
  char *p;
  int n;

  if (trace_fd < 0 || (b = thread_buffer ()) == NULL)
    return;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  if (cookie) {
    const unsigned char *c = cookie;

    snprintf (id, sizeof id, "cookie=%02x%02x%02x%02x%02x%02x%02x%02x",
              c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]);
  }
  else
    snprintf (id, sizeof id, "seq=%" PRIu64, seq);
  if (TRACE_BUFFER - b->len < TRACE_LINE)
    buffer_flush (b);
  p = b->data + b->len;
  n = snprintf (p, TRACE_LINE, "%lld.%09ld %d/%ld %s conn=%u %s %s %" PRIu64
                "+%" PRIu64, (long long) ts.tv_sec, ts.tv_nsec, (int) getpid (),
                (long) syscall (SYS_gettid), event_name (event), conn, id,
                command_name (cmd), offset, length);
  if (n > 0 && n < TRACE_LINE && error)
    n += snprintf (p + n, (size_t) (TRACE_LINE - n), " error=%d", error);
  if (n <= 0 || n >= TRACE_LINE - 1)
    return;                     /* cannot happen with these fields */
  p[n++] = '\n';
  b->len += (size_t) n;
  if (trace_autoflush)
    buffer_flush (b);
}

void
mloop_trace_flush (void)
{
  struct buffer *b;

  if (trace_fd < 0 || (b = pthread_getspecific (buffer_key)) == NULL)
    return;
  buffer_flush (b);
}
