/* What admin.c (the observability and administration calls) builds on
 * beyond the public header: the session's request path and its local heap,
 * from gpumem.c, the top of libgpumem's floors (which lists them). Not
 * installed. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "gpumem/gpumem.h"
#include "msg.h"
#include "stats.h"

/* Records the calling thread's detailed message for gpumem_last_error(c) and
 * returns err. */
int gm_client_set_error(const gpumem_client *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Sends env on c's session (a fork()ed child gets its own first) and waits for
 * a reply with body `want`. An Error reply becomes its negative code, with its
 * text for gpumem_last_error(). With ret_fd, *ret_fd is the first fd the reply
 * carried or -1, the caller's to close; without, fds are closed. */
int gm_client_call(gpumem_client *c, Gpumem__Envelope *env, Gpumem__Envelope__BodyCase want,
                   Gpumem__Envelope **ret_reply, int *ret_fd);

/* A local session: resets its heap's peaks and/or accumulated figures (the
 * daemon's own figures of the session follow its ResetStats). Central: nothing. */
void gm_client_reset_local_stats(gpumem_client *c, bool peak, bool accumulated);

/* A local session's heap statistics (a copy), its daemon's device index and
 * capacity; -EOPNOTSUPP for a central session. */
int gm_client_local_stats(gpumem_client *c, gm_stats_t *ret_stats, int *ret_device, uint64_t *ret_capacity);
/* A local session's snapshot of its own heap (its segments, blocks and trace
 * ring), JSON or pickle, freed with free(); -EOPNOTSUPP for a central one. */
int gm_client_local_snapshot(gpumem_client *c, bool json, char **ret_buf, size_t *ret_len);
/* A local session's heap records its trace (at most max_entries) or stops
 * (clearing it); a central one: nothing. */
int gm_client_local_history(gpumem_client *c, bool enabled, uint64_t max_entries);

/* The socket c is connected to. */
const char *gm_client_socket_path(const gpumem_client *c);
