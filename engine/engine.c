/* mloop — the IO engine: opening a store, and every call forwarded to it.
 * See engine.h and store.h.
 */
#include <errno.h>
#include <string.h>

#include "engine.h"
#include "file_store.h"
#include "rbd_load.h"

void
mloop_engine_config_init (struct mloop_engine_config *cfg)
{
  memset (cfg, 0, sizeof *cfg);
  cfg->direct = MLOOP_DIRECT_AUTO;
  cfg->want_write = true;
}

int
mloop_engine_open (struct mloop_engine *e,
                   const struct mloop_engine_config *cfg,
                   char *err, size_t errlen)
{
  e->store = NULL;
  if (strncmp (cfg->path, MLOOP_RBD_PREFIX, strlen (MLOOP_RBD_PREFIX)) == 0)
    return mloop_rbd_store_open (&e->store, cfg, err, errlen);
  return mloop_file_store_open (&e->store, cfg, err, errlen);
}

void
mloop_engine_probe_features (struct mloop_engine *e)
{
  e->store->ops->probe_features (e->store);
}

void
mloop_engine_quiesce (struct mloop_engine *e)
{
  if (e->store && e->store->ops->quiesce)
    e->store->ops->quiesce (e->store);
}

void
mloop_engine_close (struct mloop_engine *e)
{
  if (e->store)
    e->store->ops->close (e->store);
  e->store = NULL;
}

int
mloop_engine_flush (struct mloop_engine *e)
{
  return e->store->ops->flush (e->store);
}

int
mloop_engine_reprobe_size (struct mloop_engine *e, char *err, size_t errlen)
{
  return e->store->ops->reprobe_size (e->store, err, errlen);
}

int
mloop_engine_set_size (struct mloop_engine *e, uint64_t size, char *err,
                       size_t errlen)
{
  return e->store->ops->set_size (e->store, size, err, errlen);
}

uint64_t
mloop_engine_size (const struct mloop_engine *e)
{
  return e->store->ops->size (e->store);
}

void
mloop_engine_describe (const struct mloop_engine *e, char *buf, size_t len)
{
  e->store->ops->describe (e->store, buf, len);
}

int
mloop_engine_prepare (struct mloop_engine *e, struct mloop_io *io)
{
  return e->store->ops->prepare (e->store, io);
}

int
mloop_engine_perform_blocking (struct mloop_engine *e, struct mloop_io *io)
{
  return e->store->ops->perform_blocking (e->store, io);
}

void
mloop_engine_complete_blocking (struct mloop_engine *e, struct mloop_io *io,
                                int result)
{
  e->store->ops->complete_blocking (e->store, io, result);
}

long
mloop_engine_perform_event (struct mloop_engine *e, struct mloop_io *io)
{
  return e->store->ops->perform_event (e->store, io);
}

void
mloop_engine_abandon (struct mloop_engine *e, struct mloop_io *io)
{
  e->store->ops->abandon (e->store, io);
}

enum mloop_event_result
mloop_engine_complete_event (struct mloop_engine *e, struct mloop_io *io,
                             long res)
{
  return e->store->ops->complete_event (e->store, io, res);
}

int
mloop_engine_trim (struct mloop_engine *e, uint64_t offset, uint64_t count,
                   unsigned flags)
{
  return e->store->ops->trim (e->store, offset, count, flags);
}

int
mloop_engine_zero (struct mloop_engine *e, uint64_t offset, uint64_t count,
                   unsigned flags)
{
  return e->store->ops->zero (e->store, offset, count, flags);
}

int
mloop_engine_extents (struct mloop_engine *e, uint64_t offset,
                      uint64_t count, bool req_one, mloop_extent_fn fn,
                      void *opaque)
{
  return e->store->ops->extents (e->store, offset, count, req_one, fn,
                                 opaque);
}
