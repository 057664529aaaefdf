/* mloop — the parts of the mloop command that only some runs need, in a
 * module of their own (mloop-cli-extras.so) loaded when one of them is
 * used: describing devices (`mloop list`, `mloop status`, JSON with
 * json-glib) and the D-Bus client for users who are not root (GDBus,
 * service_client.h).
 *
 * Why a module: gio and json-glib bring eight libraries and GObject's
 * type set-up into every process that links them.  Under emulation (the
 * test VM) that was a third of the command's start, on the way of every
 * attach and detach root runs, which use neither.
 */
#ifndef MLOOP_CLIENT_EXTRAS_H
#define MLOOP_CLIENT_EXTRAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "device_state.h"
#include "device_status.h"
#include "service_client.h"

/* The module's one symbol; what each member does is in describe.h and
 * service_client.h, whose functions these are.
 */
struct mloop_cli_extras {
  void (*describe_list) (FILE *f, const struct mloop_device_state *list,
                         size_t n, bool json);
  void (*describe_status) (FILE *f, const struct mloop_device_state *s,
                           const struct mloop_device_status *st, bool json);
  int (*service_attach) (const struct mloop_service_attach *req,
                         char **device, char *err, size_t errlen);
  int (*service_detach) (const char *device, char *err, size_t errlen);
  int (*service_list) (bool json, char **text, char *err, size_t errlen);
};

#define MLOOP_CLI_EXTRAS_SYMBOL "mloop_cli_extras"

/* Loads the module (once); NULL after printing why it did not load. */
const struct mloop_cli_extras *mloop_cli_extras_load (void);

#endif /* MLOOP_CLIENT_EXTRAS_H */
