/* Stream-ordered frees, for both heaps: a free whose block's streams still
 * have work waits in the client's pending list with one event per stream;
 * the connection's poll (conn.h) completes it once they are done. A stream
 * being captured into a CUDA graph gets its event only after the capture. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "frees.h"
#include "mapping.h"

void gm_frees_destroy(gpumem_client *c, pending_free_t *p, bool owner) {
        for (size_t i = 0; i < p->n_events && owner; i++)
                if (p->events[i])
                        c->mapper->ops->event_destroy(c->mapper, p->events[i]);
        free(p->events);
        free(p->streams);
        free(p);
}

int gm_frees_refused_in_capture(gpumem_client *c, int r, size_t size, uint64_t stream, bool told, bool elsewhere) {
        char diagnosis[512] = "";
        if (told)
                snprintf(diagnosis, sizeof(diagnosis), " (%s)", gm_conn_last_error(c));
        if (elsewhere)
                return gm_conn_set_error(c, r,
                                         "gpumem: out of memory allocating %zu bytes on stream 0x%llx: refused during "
                                         "a capture in progress in this process (another thread's CUDA graph "
                                         "capture, or another stream's): no cached block fits and freeing cached "
                                         "memory would synchronize and unmap, which invalidates that capture; "
                                         "allocate again once the capture has ended%s",
                                         size, (unsigned long long) stream, diagnosis);
        return gm_conn_set_error(c, r,
                                 "gpumem: out of memory allocating %zu bytes: refused during a capture of stream "
                                 "0x%llx into a CUDA graph: no cached block fits and freeing cached memory would "
                                 "synchronize and unmap, which invalidates the capture; allocate before the "
                                 "capture or give the graph a private pool%s",
                                 size, (unsigned long long) stream, diagnosis);
}

/* Whether event i of p is done: one deferred during a capture is recorded
 * once the capture ended, and is pending until then. */
static bool event_done(gpumem_client *c, pending_free_t *p, size_t i) {
        if (!p->events[i]) {
                if (gm_mapping_stream_captured(c, p->streams[i]) ||
                    c->mapper->ops->event_record(c->mapper, p->streams[i], &p->events[i]) < 0)
                        return false;
        }
        return c->mapper->ops->event_query(c->mapper, p->events[i]) != 0; /* errors end the wait */
}

void gm_frees_sent(gpumem_client *c, uint64_t stream, uint64_t size) {
        if (size < c->mapper->granularity || !atomic_load_explicit(&c->client_fences, memory_order_relaxed))
                return;
        gm_fences_freed(&c->fences, stream);
        atomic_store_explicit(&c->fences_freed, c->fences.n_freed > 0, memory_order_relaxed);
}

bool gm_frees_poll(gpumem_client *c) {
        for (pending_free_t **pp = &c->pending_frees; *pp;) {
                pending_free_t *p = *pp;
                bool done = true;
                for (size_t i = 0; i < p->n_events && done; i++)
                        done = event_done(c, p, i);
                if (!done) {
                        pp = &p->next;
                        continue;
                }
                *pp = p->next;
                if (c->local) {
                        /* The heap is taken before lock: the service thread finishes it. */
                        p->next = c->completed_frees;
                        c->completed_frees = p;
                        continue;
                } else {
                        Gpumem__FreeCompleted fc = GPUMEM__FREE_COMPLETED__INIT;
                        fc.block_id = p->block_id;
                        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
                        env.request_id = ++c->next_request_id;
                        env.body_case = GPUMEM__ENVELOPE__BODY_FREE_COMPLETED;
                        env.free_completed = &fc;
                        gm_conn_send(c, &env);
                        gm_frees_sent(c, p->block.stream, p->block.size);
                }
                gm_frees_destroy(c, p, true);
        }
        return c->pending_frees != NULL || c->completed_frees != NULL;
}

int gm_frees_record_events(gpumem_client *c, pending_free_t *p, const uint64_t *streams, size_t n) {
        uint64_t *events = calloc(n, sizeof(*events)), *copy = malloc(n * sizeof(*copy));
        if (!events || !copy) {
                free(events);
                free(copy);
                return -ENOMEM;
        }
        memcpy(copy, streams, n * sizeof(*copy));
        for (size_t i = 0; i < n; i++) {
                int r = gm_mapping_stream_captured(c, streams[i])
                                ? 0
                                : c->mapper->ops->event_record(c->mapper, streams[i], &events[i]);
                if (r < 0) {
                        while (i-- > 0)
                                if (events[i])
                                        c->mapper->ops->event_destroy(c->mapper, events[i]);
                        free(events);
                        free(copy);
                        return r;
                }
        }
        p->events = events;
        p->streams = copy;
        p->n_events = n;
        return 0;
}

void gm_frees_forget(gpumem_client *c, bool owner) {
        while (c->pending_frees) {
                pending_free_t *p = c->pending_frees;
                c->pending_frees = p->next;
                gm_frees_destroy(c, p, owner);
        }
        while (c->completed_frees) {
                pending_free_t *p = c->completed_frees;
                c->completed_frees = p->next;
                gm_frees_destroy(c, p, owner);
        }
}
