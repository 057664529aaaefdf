/* mloop-server — which clients are let in (see admission.h). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glib.h>

#include "admission.h"
#include "peer.h"
#include "log_limit.h"

static struct {
  pthread_mutex_t lock;
  unsigned max_total, max_per_client;
  unsigned total;
  GHashTable *per_client;       /* address → open connections */
  GHashTable *client_of;        /* fd → its address, when counted there */
} adm = { .lock = PTHREAD_MUTEX_INITIALIZER };

void
admission_init (unsigned max_connections, unsigned max_per_client)
{
  adm.max_total = max_connections;
  adm.max_per_client = max_per_client;
  adm.per_client = g_hash_table_new_full (g_str_hash, g_str_equal, g_free,
                                          NULL);
  adm.client_of = g_hash_table_new (g_direct_hash, g_direct_equal);
}

/* Logs a refusal of a client at ADDRESS (NULL: a Unix socket's), under
 * the bound on repeated lines: a client retrying in a loop, or clients
 * from many addresses, cannot fill the log.
 */
static void
log_refusal (const char *address, unsigned open, const char *option,
             unsigned cap)
{
  log_limited ("refused a connection from %s: %u open, %s %u",
               address ? address : "a Unix socket client", open, option, cap);
}

bool
admission_admit (int fd)
{
  char *address = adm.max_per_client ? peer_address (fd) : NULL;
  unsigned from_it = 0;
  bool ok = true;

  pthread_mutex_lock (&adm.lock);
  if (address)
    from_it = GPOINTER_TO_UINT (g_hash_table_lookup (adm.per_client,
                                                     address));
  if (adm.max_total && adm.total >= adm.max_total) {
    if (address == NULL)
      address = peer_address (fd);      /* for the log line */
    log_refusal (address, adm.total, "--max-connections", adm.max_total);
    ok = false;
  }
  else if (address && from_it >= adm.max_per_client) {
    log_refusal (address, from_it, "--max-connections-per-client",
                 adm.max_per_client);
    ok = false;
  }
  if (ok) {
    adm.total++;
    if (address) {
      g_hash_table_replace (adm.per_client, g_strdup (address),
                            GUINT_TO_POINTER (from_it + 1));
      /* Its own copy, freed by admission_close. */
      g_hash_table_insert (adm.client_of, GINT_TO_POINTER (fd),
                           g_strdup (address));
    }
  }
  pthread_mutex_unlock (&adm.lock);
  g_free (address);
  return ok;
}

void
admission_close (int fd)
{
  char *address;

  pthread_mutex_lock (&adm.lock);
  adm.total--;
  address = g_hash_table_lookup (adm.client_of, GINT_TO_POINTER (fd));
  if (address) {
    unsigned n = GPOINTER_TO_UINT (g_hash_table_lookup (adm.per_client,
                                                        address));

    g_hash_table_remove (adm.client_of, GINT_TO_POINTER (fd));
    if (n <= 1)
      g_hash_table_remove (adm.per_client, address);
    else
      g_hash_table_replace (adm.per_client, g_strdup (address),
                            GUINT_TO_POINTER (n - 1));
    g_free (address);
  }
  /* Closed under the lock: FD's number cannot be reused by the next
   * accept before its entry is gone.
   */
  close (fd);
  pthread_mutex_unlock (&adm.lock);
}
