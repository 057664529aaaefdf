/* mloop-server — a client's address, as the log names it (peer.h). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <glib.h>

#include "peer.h"

char *
peer_address (int fd)
{
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  char text[INET6_ADDRSTRLEN];

  if (getpeername (fd, (struct sockaddr *) &ss, &len) == -1)
    return NULL;
  if (ss.ss_family == AF_INET) {
    struct sockaddr_in *in = (struct sockaddr_in *) &ss;

    return g_strdup (inet_ntop (AF_INET, &in->sin_addr, text, sizeof text));
  }
  if (ss.ss_family == AF_INET6) {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *) &ss;

    if (IN6_IS_ADDR_V4MAPPED (&in6->sin6_addr))
      return g_strdup (inet_ntop (AF_INET, &in6->sin6_addr.s6_addr[12],
                                  text, sizeof text));
    return g_strdup (inet_ntop (AF_INET6, &in6->sin6_addr, text,
                                sizeof text));
  }
  return NULL;
}
