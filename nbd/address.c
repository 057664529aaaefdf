/* mloop — where an NBD server listens or an export is found. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "address.h"

static int __attribute__((format (printf, 3, 4)))
fail (char *err, size_t errlen, const char *fmt, ...)
{
  va_list ap;

  if (err && errlen) {
    va_start (ap, fmt);
    vsnprintf (err, errlen, fmt, ap);
    va_end (ap);
  }
  return -1;
}

/* TEXT is none of FORMS: say which would do. */
static int
expected (const char *text, unsigned forms, char *err, size_t errlen)
{
  static const struct { unsigned form; const char *syntax; } all[] = {
    { MLOOP_NBD_ADDRESS_UNIX, "unix:PATH" },
    { MLOOP_NBD_ADDRESS_TCP, "tcp:HOST:PORT" },
    { MLOOP_NBD_ADDRESS_URI, "nbd://HOST[:PORT][/NAME]" },
  };
  char list[128] = "";

  if (forms == MLOOP_NBD_ADDRESS_URI)
    return fail (err, errlen, "%s: not an nbd:// URI", text);
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (forms & all[i].form) {
      if (*list)
        strcat (list, " or ");
      strcat (list, all[i].syntax);
    }
  return fail (err, errlen, "%s: expected %s", text, list);
}

static bool
is_number (const char *s)
{
  if (*s == '\0')
    return false;
  for (; *s; s++)
    if (*s < '0' || *s > '9')
      return false;
  return true;
}

/* PORT (digits) names a port one can listen on or connect to: 1-65535.
 * getaddrinfo would take 99999 modulo 65536 and 0 as "any port", a
 * listener nobody could be told of.
 */
static bool
port_in_range (const char *port)
{
  size_t len = strlen (port);
  unsigned long value;

  while (len > 1 && *port == '0') {   /* leading zeroes: "08080" is 8080 */
    port++;
    len--;
  }
  value = len <= 5 ? strtoul (port, NULL, 10) : 0;
  return value >= 1 && value <= 65535;
}

/* A's port (digits) is refused outside 1-65535: -1 with ERR and A
 * cleared, else 0.  TEXT is what was parsed.
 */
static int
check_port_range (const char *text, struct mloop_nbd_address *a,
                  char *err, size_t errlen)
{
  int rv;

  if (port_in_range (a->port))
    return 0;
  rv = fail (err, errlen, "%s: port %s is out of range (1-65535)", text,
             a->port);
  mloop_nbd_address_clear (a);
  return rv;
}

/* Splits HOSTPORT in place: "[v6]:PORT", "[v6]", "HOST:PORT" or "HOST"
 * (a bare IPv6 address takes its last group as the port).  *PORT is NULL
 * when there is none.  False when something follows "[v6]".
 */
static bool
split_host_port (char *hostport, const char **host, const char **port)
{
  char *colon;

  if (hostport[0] == '[' && (colon = strchr (hostport, ']')) != NULL) {
    if (colon[1] != '\0' && colon[1] != ':')
      return false;
    *colon = '\0';
    *host = hostport + 1;
    colon = colon[1] == ':' ? colon + 1 : NULL;
  }
  else {
    *host = hostport;
    colon = strrchr (hostport, ':');
  }
  *port = NULL;
  if (colon) {
    *colon = '\0';
    *port = colon + 1;
  }
  return true;
}

static int
parse_unix (const char *text, struct mloop_nbd_address *a,
            char *err, size_t errlen)
{
  const char *path = text + strlen ("unix:");

  if (*path == '\0')
    return fail (err, errlen, "unix: needs a PATH");
  if (strlen (path) >= sizeof ((struct sockaddr_un *) 0)->sun_path)
    return fail (err, errlen, "%s: path too long", text);
  a->buf = strdup (path);
  if (a->buf == NULL)
    return fail (err, errlen, "out of memory");
  a->unix_path = a->buf;
  a->name = "";
  return 0;
}

static int
parse_tcp (const char *text, unsigned forms, struct mloop_nbd_address *a,
           char *err, size_t errlen)
{
  a->buf = strdup (text + strlen ("tcp:"));
  if (a->buf == NULL)
    return fail (err, errlen, "out of memory");
  if (!split_host_port (a->buf, &a->host, &a->port) || a->port == NULL ||
      !is_number (a->port)) {
    mloop_nbd_address_clear (a);
    return expected (text, forms, err, errlen);
  }
  if (check_port_range (text, a, err, errlen) == -1)
    return -1;
  a->name = "";
  return 0;
}

static int
parse_uri (const char *text, unsigned forms, struct mloop_nbd_address *a,
           char *err, size_t errlen)
{
  char *slash;

  a->buf = strdup (text + strlen ("nbd://"));
  if (a->buf == NULL)
    return fail (err, errlen, "out of memory");
  a->name = "";
  slash = strchr (a->buf, '/');
  if (slash) {
    *slash = '\0';
    a->name = slash + 1;
  }
  if (!split_host_port (a->buf, &a->host, &a->port)) {
    mloop_nbd_address_clear (a);
    return expected (text, forms, err, errlen);
  }
  if (*a->host == '\0') {
    mloop_nbd_address_clear (a);
    return fail (err, errlen, "%s: no host", text);
  }
  if (a->port == NULL || *a->port == '\0')
    a->port = MLOOP_NBD_DEFAULT_PORT;
  else if (!is_number (a->port)) {
    mloop_nbd_address_clear (a);
    return fail (err, errlen, "%s: the port must be a number", text);
  }
  else if (check_port_range (text, a, err, errlen) == -1)
    return -1;
  return 0;
}

int
mloop_nbd_address_parse (const char *text, unsigned forms,
                         struct mloop_nbd_address *a,
                         char *err, size_t errlen)
{
  memset (a, 0, sizeof *a);
  if ((forms & MLOOP_NBD_ADDRESS_UNIX) && strncmp (text, "unix:", 5) == 0)
    return parse_unix (text, a, err, errlen);
  if ((forms & MLOOP_NBD_ADDRESS_TCP) && strncmp (text, "tcp:", 4) == 0)
    return parse_tcp (text, forms, a, err, errlen);
  if ((forms & MLOOP_NBD_ADDRESS_URI) && strncmp (text, "nbds://", 7) == 0)
    return fail (err, errlen, "the kernel's NBD client cannot speak TLS: "
                 "reach a TLS export through a local relay "
                 "(see docs/remote.md)");
  if ((forms & MLOOP_NBD_ADDRESS_URI) && strncmp (text, "nbd://", 6) == 0)
    return parse_uri (text, forms, a, err, errlen);
  return expected (text, forms, err, errlen);
}

void
mloop_nbd_address_clear (struct mloop_nbd_address *a)
{
  free (a->buf);
  memset (a, 0, sizeof *a);
}
