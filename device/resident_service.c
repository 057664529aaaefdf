/* mloop — asking mloopd to keep a device's server (resident_service.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <glib.h>

#include "device_state.h"
#include "errmsg.h"
#include "message.h"
#include "resident_service.h"

/* The longest mloopd may take to answer: a keep waits for the server to
 * listen (nbdkit in a TCG guest can take many seconds), under its own
 * start timeout of 60 s.
 */
#define ANSWER_TIMEOUT_S 90

/* A connection to mloopd: -1 with errno ENOENT or ECONNREFUSED when
 * none listens here.
 */
static int
connect_service (void)
{
  g_autofree char *path = g_build_filename (mloop_runtime_dir (),
                                            MLOOP_SERVICE_SOCKET, NULL);
  struct sockaddr_un a = { .sun_family = AF_UNIX };
  const struct timeval timeout = { .tv_sec = ANSWER_TIMEOUT_S };
  int sock;

  if (strlen (path) >= sizeof a.sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  strcpy (a.sun_path, path);
  sock = socket (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (sock == -1)
    return -1;
  if (connect (sock, (struct sockaddr *) &a, sizeof a) == -1 ||
      setsockopt (sock, SOL_SOCKET, SO_RCVTIMEO, &timeout,
                  sizeof timeout) == -1) {
    int e = errno;

    close (sock);
    errno = e;
    return -1;
  }
  return sock;
}

/* Sends OUT on a new connection and receives the answer into IN (the
 * caller clears it): 1, 0 when no mloopd listens, -1 with ERR (its error
 * field, or why there is no answer).
 */
static int
ask (const struct mloop_control_out *out, struct mloop_control_in *in,
     char *err, size_t errlen)
{
  const char *error;
  int sock = connect_service (), r;

  if (sock == -1 && (errno == ENOENT || errno == ECONNREFUSED))
    return 0;
  if (sock == -1)
    return mloop_fail (err, errlen, "cannot reach mloopd: %s",
                       strerror (errno));
  if (mloop_control_send (sock, out, NULL, 0) == -1) {
    r = mloop_fail (err, errlen, "asking mloopd: %s", strerror (errno));
    close (sock);
    return r;
  }
  r = mloop_control_recv (sock, in, err, errlen);
  close (sock);
  if (r == 0)
    return mloop_fail (err, errlen, "mloopd closed the connection without "
                       "an answer");
  if (r == -1)
    return -1;
  error = mloop_control_get (in, "error");
  if (error)
    r = mloop_fail (err, errlen, "%s", error);
  else if (mloop_control_get (in, "ok") == NULL)
    r = mloop_fail (err, errlen, "mloopd answered neither ok nor error");
  if (r == -1)
    mloop_control_in_clear (in);
  return r;
}

/* Asks OUT, whose answer carries nothing but ok: 1, 0 when no mloopd
 * listens, -1 with ERR.  Frees OUT.
 */
static int
ask_for_ok (struct mloop_control_out *out, char *err, size_t errlen)
{
  struct mloop_control_in *in = g_new (struct mloop_control_in, 1);
  int r = ask (out, in, err, errlen);

  if (r == 1)
    mloop_control_in_clear (in);
  g_free (out);
  g_free (in);
  return r;
}

/* A request of OP about DIR alone: 1, 0 when no mloopd listens, -1. */
static int
ask_about (const char *op, const char *dir, char *err, size_t errlen)
{
  struct mloop_control_out *out = g_new (struct mloop_control_out, 1);

  mloop_control_out_init (out);
  mloop_control_add (out, "op", op);
  mloop_control_add (out, "dir", dir);
  return ask_for_ok (out, err, errlen);
}

/* The connections in IN, a keep's answer, into *KEPT if they are the
 * WANT asked for and their export is told whole; else none (closed).
 */
static void
take_connections (struct mloop_control_in *in, unsigned want,
                  struct mloop_service_kept *kept)
{
  struct mloop_nbd_export *x = &kept->export;
  const char *key[] = { "connections", "size", "flags", "min-block",
                        "preferred-block", "max-block" };
  guint64 v[G_N_ELEMENTS (key)];
  size_t i;

  kept->n_fds = 0;
  for (i = 0; i < G_N_ELEMENTS (key); i++) {
    const char *text = mloop_control_get (in, key[i]);

    if (text == NULL ||
        !g_ascii_string_to_unsigned (text, 10, 0, G_MAXUINT64, &v[i], NULL))
      return;
  }
  if (v[0] != want || in->n_fds != want || v[2] > G_MAXUINT16 ||
      v[3] > G_MAXUINT32 || v[4] > G_MAXUINT32 || v[5] > G_MAXUINT32)
    return;
  *x = (struct mloop_nbd_export) {
    .size = v[1], .flags = (uint16_t) v[2], .min_block = (uint32_t) v[3],
    .preferred_block = (uint32_t) v[4], .max_block = (uint32_t) v[5],
  };
  for (i = 0; i < in->n_fds; i++) {
    kept->fds[i] = in->fds[i];
    in->fds[i] = -1;
  }
  kept->n_fds = want;
}

int
mloop_service_keep (const struct mloop_server_spec *spec, const char *dir,
                    unsigned connections, struct mloop_service_kept *kept,
                    char *err, size_t errlen)
{
  struct mloop_control_out *out = g_new (struct mloop_control_out, 1);
  struct mloop_control_in *in = g_new (struct mloop_control_in, 1);
  char n[32];
  const char *pid;
  int r;

  mloop_control_out_init (out);
  mloop_control_add (out, "op", "keep");
  mloop_control_add (out, "dir", dir);
  mloop_control_add (out, "server", spec->kind->name);
  mloop_control_add (out, "image", spec->image);
  if (spec->overlay)
    mloop_control_add (out, "overlay", spec->overlay);
#define NUMBER(key, value)                                      \
  if (value) {                                                  \
    snprintf (n, sizeof n, "%" PRIu64, (uint64_t) (value));     \
    mloop_control_add (out, key, n);                            \
  }
  NUMBER ("offset", spec->offset);
  NUMBER ("sizelimit", spec->sizelimit);
  NUMBER ("threads", spec->threads);
  NUMBER ("io-timeout", spec->io_timeout);
  NUMBER ("connections", connections);
#undef NUMBER
  if (spec->read_only)
    mloop_control_add (out, "read-only", "1");
  if (out->too_big)
    r = mloop_fail (err, errlen, "the image's name is too long to ask "
                    "mloopd about");
  else
    r = ask (out, in, err, errlen);
  if (r == 1) {
    pid = mloop_control_get (in, "server-pid");
    kept->server = pid ? (pid_t) atoi (pid) : 0;
    kept->in_process = g_strcmp0 (mloop_control_get (in, "in-process"),
                                  "1") == 0;
    take_connections (in, connections, kept);
    /* Closes what descriptors were not taken. */
    mloop_control_in_clear (in);
  }
  g_free (out);
  g_free (in);
  return r;
}

int
mloop_service_keep_remote (const char *uri, const char *dir, char *err,
                           size_t errlen)
{
  struct mloop_control_out *out = g_new (struct mloop_control_out, 1);

  mloop_control_out_init (out);
  mloop_control_add (out, "op", "keep");
  mloop_control_add (out, "dir", dir);
  mloop_control_add (out, "remote", uri);
  if (out->too_big) {
    g_free (out);
    return mloop_fail (err, errlen, "the export's address is too long to "
                       "ask mloopd about");
  }
  return ask_for_ok (out, err, errlen);
}

/* OP about DIR, a device mloopd keeps: 0, or -1 with ERR (also when
 * mloopd does not listen).
 */
static int
ask_keeper (const char *op, const char *dir, char *err, size_t errlen)
{
  int r = ask_about (op, dir, err, errlen);

  if (r == 0)
    return mloop_fail (err, errlen, "mloopd, which keeps %s, does not "
                       "listen", dir);
  return r < 0 ? -1 : 0;
}

int
mloop_service_drop (const char *dir, char *err, size_t errlen)
{
  return ask_keeper ("drop", dir, err, errlen);
}

int
mloop_service_restart (const char *dir, char *err, size_t errlen)
{
  return ask_keeper ("restart", dir, err, errlen);
}

bool
mloop_service_keeps (const char *dir)
{
  char err[256];

  return ask_about ("has", dir, err, sizeof err) == 1;
}
