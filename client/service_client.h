/* mloop — the mloop command run by a user who is not root: attach,
 * detach and list through mloop's D-Bus service (dbus/manager.h), which
 * polkit lets them use.  The image is opened here, as the user, and
 * passed to the service as a descriptor.
 */
#ifndef MLOOP_CLIENT_SERVICE_CLIENT_H
#define MLOOP_CLIENT_SERVICE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

struct mloop_service_attach {
  const char *file;
  bool read_only, no_partscan, autoclear;
};

/* Each returns 0 (the attached device in *DEVICE, the list in *TEXT; g_free
 * them) or -1 with ERR, one line naming the reason.
 */
int mloop_service_attach (const struct mloop_service_attach *req,
                          char **device, char *err, size_t errlen);
int mloop_service_detach (const char *device, char *err, size_t errlen);
int mloop_service_list (bool json, char **text, char *err, size_t errlen);

#endif /* MLOOP_CLIENT_SERVICE_CLIENT_H */
