/* Who holds the metrics endpoint's HTTP connections. Every local user reaches
 * 127.0.0.1, so a limit per IP address is a limit for all of them together:
 * one user's trickling connections (slowloris) would fill it and blind every
 * scrape. The guard counts connections per peer instead: per uid for a local
 * peer (a loopback TCP peer's socket owner, found with sock_diag; a Unix
 * socket's SO_PEERCRED), per address for a remote one, and admits at most
 * GM_HTTP_PER_PEER of them, so that a user (Prometheus's, say) always finds
 * room while fewer than GM_HTTP_CONNECTIONS / GM_HTTP_PER_PEER users hold
 * theirs. Loop thread only. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#define GM_HTTP_CONNECTIONS 64u /* the endpoint's connection limit */
#define GM_HTTP_PER_PEER 8u     /* one peer's share of it */

typedef struct gm_http_guard {
        struct {
                int fd; /* -1: free */
                uint64_t peer;
        } slots[GM_HTTP_CONNECTIONS];
} gm_http_guard_t;

void gm_http_guard_init(gm_http_guard_t *g);
/* Whether accepted connection fd (peer address addr) may be served; if so,
 * it holds a slot until gm_http_guard_release(fd). On false the caller
 * closes fd. */
bool gm_http_guard_admit(gm_http_guard_t *g, int fd, const struct sockaddr *addr, socklen_t addrlen);
/* Frees fd's slot (unknown fds are ignored). */
void gm_http_guard_release(gm_http_guard_t *g, int fd);
