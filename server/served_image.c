/* mloop-server — one image served (served_image.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aio_ring.h"
#include "nbd_proto.h"
#include "served_image.h"

/* What the export supports, as its transmission flags say it. */
static uint16_t
transmission_flags (bool read_only, bool discard)
{
  uint16_t f = NBD_FLAG_HAS_FLAGS | NBD_FLAG_CAN_MULTI_CONN;

  if (read_only)
    return f | NBD_FLAG_READ_ONLY | NBD_FLAG_SEND_FLUSH;
  f |= NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA |
    NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO;
  if (discard)
    f |= NBD_FLAG_SEND_TRIM;
  return f;
}

int
served_image_open (struct served_image *s,
                   const struct mloop_engine_config *cfg,
                   bool read_only, bool discard,
                   served_image_warn_fn warn, char *err, size_t errlen)
{
  struct mloop_engine_config c = *cfg;
  const struct mloop_store_info *info;
  char line[512];

  memset (s, 0, sizeof *s);
  pthread_mutex_init (&s->next_worker_lock, NULL);
  c.want_write = !read_only;
  if (mloop_engine_open (&s->engine, &c, err, errlen) < 0)
    return -1;
  info = mloop_engine_info (&s->engine);
  if (info->direct_fell_back) {
    snprintf (line, sizeof line, "warning: %s: O_DIRECT not supported "
              "here, using buffered IO", c.path);
    warn (line);
  }
  /* A file on a read-only mount, say: served read-only. */
  s->read_only = read_only || !info->writable;
  s->discard = discard;
  /* The workers open their AIO contexts when their first request comes;
   * a system with no room even for the smallest one (fs.aio-max-nr) is
   * refused here, in one line that `mloop attach` passes on.
   */
  if (mloop_aio_check_room (err, errlen) == -1) {
    mloop_engine_close (&s->engine);
    return -1;
  }
  mloop_engine_probe_features (&s->engine);

  s->export.size = mloop_engine_size (&s->engine);
  if (s->export.size == 0) {
    snprintf (line, sizeof line, "warning: %s: the export is 0 bytes "
              "(an empty image, or a window past its end): clients can "
              "read and write nothing", c.path);
    warn (line);
  }
  s->export.transmission_flags = transmission_flags (s->read_only, discard);
  s->export.min_block = MLOOP_MIN_BLOCK_SIZE;
  s->export.preferred_block = info->preferred_block_size;
  /* The largest READ/WRITE accepted: nbdkit's limit (the buffer budget,
   * not this, bounds what a client can make the server hold).
   */
  s->export.max_block = MLOOP_MAX_REQUEST;
  return 0;
}

int
served_image_start (struct served_image *s, unsigned threads,
                    const struct worker_options *opts,
                    char *err, size_t errlen)
{
  struct worker_options o = *opts;
  unsigned i;

  o.engine = &s->engine;
  o.read_only = s->read_only;
  o.discard = s->discard;
  o.max_request = MLOOP_MAX_REQUEST;
  o.offload_tenant = &s->tenant;
  s->workers = calloc (threads, sizeof *s->workers);
  if (s->workers == NULL) {
    snprintf (err, errlen, "starting %u workers: out of memory", threads);
    return -1;
  }
  for (i = 0; i < threads; i++) {
    s->workers[i] = worker_start (&o, err, errlen);
    if (s->workers[i] == NULL) {
      served_image_stop (s);
      return -1;
    }
    s->nr_workers++;
  }
  return 0;
}

void
served_image_add_connection (struct served_image *s, int fd,
                             const struct session *session)
{
  struct worker *w;

  pthread_mutex_lock (&s->next_worker_lock);
  w = s->workers[s->next_worker++ % s->nr_workers];
  pthread_mutex_unlock (&s->next_worker_lock);
  worker_add_connection (w, fd, session);
}

void
served_image_begin_stop (struct served_image *s)
{
  unsigned i;

  for (i = 0; i < s->nr_workers; i++)
    worker_begin_stop (s->workers[i]);
}

void
served_image_stop (struct served_image *s)
{
  unsigned i;

  for (i = 0; i < s->nr_workers; i++)
    worker_stop (s->workers[i]);
  free (s->workers);
  s->workers = NULL;
  s->nr_workers = 0;
}

void
served_image_close (struct served_image *s)
{
  mloop_engine_close (&s->engine);
  pthread_mutex_destroy (&s->next_worker_lock);
}
