/* A local session's part of the daemon's snapshots: the daemon asks
 * (SnapshotQuery) for the heap's segments, blocks and trace, and this
 * answers with allocator/snapshot.h's answer format in SnapshotAnswer
 * packets; it also turns the heap's own trace ring on and off as the
 * daemon's memory history goes (HistoryControl pushes). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client-internal.h"
#include "local_heap.h"
#include "snapshot.h"

/* Room an answer packet keeps for the envelope around its bytes. */
#define ANSWER_PACKET_OVERHEAD 256

bool gm_local_asks_note(gm_local_asks_t *asks, const Gpumem__Envelope *env) {
        switch (env->body_case) {
        case GPUMEM__ENVELOPE__BODY_SNAPSHOT_QUERY:
                asks->query_id = env->snapshot_query->query_id; /* a newer query replaces an older one */
                asks->query_max_bytes = env->snapshot_query->max_bytes;
                return true;
        case GPUMEM__ENVELOPE__BODY_HISTORY_PUSH:
                asks->history_due = true;
                asks->history_enabled = env->history_push->enabled;
                asks->history_max_entries = env->history_push->max_entries;
                return true;
        default:
                return false;
        }
}

/* Sends the answer in packets that fit; a refusal when buf is NULL. */
static void send_answer(gpumem_client *c, uint64_t query_id, const char *buf, size_t len) {
        size_t chunk = gm_client_max_packet(c) > 2 * ANSWER_PACKET_OVERHEAD
                               ? gm_client_max_packet(c) - ANSWER_PACKET_OVERHEAD
                               : ANSWER_PACKET_OVERHEAD;
        size_t at = 0;
        do {
                size_t n = len - at < chunk ? len - at : chunk;
                Gpumem__SnapshotAnswer ans = GPUMEM__SNAPSHOT_ANSWER__INIT;
                ans.query_id = query_id;
                ans.total_size = len;
                ans.refused = buf == NULL;
                ans.data.data = (uint8_t *) (buf ? buf + at : NULL);
                ans.data.len = n;
                ans.last = at + n == len;
                Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
                env.body_case = GPUMEM__ENVELOPE__BODY_SNAPSHOT_ANSWER;
                env.snapshot_answer = &ans;
                if (gm_client_post(c, &env) < 0)
                        return; /* the daemon is gone: nobody waits for it */
                at += n;
        } while (at < len);
}

bool gm_local_asks_serve(gpumem_client *c) {
        gm_local_asks_t *asks = gm_client_asks_lock(c);
        gm_local_asks_t due = *asks;
        gm_client_asks_unlock(c);
        if (!due.query_id && !due.history_due)
                return false;
        gm_local_t *heap = gm_client_heap_trylock(c);
        if (!heap)
                return true;
        if (due.history_due)
                gm_local_history(heap, due.history_enabled, due.history_max_entries, (uint32_t) getpid());
        char *buf = NULL;
        size_t len = 0;
        int r = due.query_id ? gm_snapshot_answer_encode(gm_local_heap(heap), gm_local_history_ring(heap),
                                                         due.query_max_bytes, &buf, &len)
                             : 0;
        gm_client_heap_unlock(c);
        asks = gm_client_asks_lock(c);
        if (asks->query_id == due.query_id)
                asks->query_id = 0;
        if (due.history_due && asks->history_enabled == due.history_enabled &&
            asks->history_max_entries == due.history_max_entries)
                asks->history_due = false;
        gm_client_asks_unlock(c);
        if (due.query_id)
                send_answer(c, due.query_id, r == 0 ? buf : NULL, r == 0 ? len : 0);
        free(buf);
        return false;
}
