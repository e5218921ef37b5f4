/* Whether a client that acknowledged a release still holds the memory, where
 * the backend cannot tell per piece (cuda: nobody can see who maps an
 * exported handle) but the driver reports each process's device memory
 * (NVML's running processes).
 *
 * A process's figure covers more than the daemon's memory (its context, its
 * own allocations, other sessions of the same process), so changes are
 * compared: when a release is first asked for, the process's figure and the
 * bytes the daemon has mapped into it (every session of that pid) are noted;
 * at the acknowledgement, the part of the figure the daemon does not account
 * for has grown by all the acknowledged bytes if the client kept them, and by
 * none if it let go. An acknowledgement that shows the drop also shows that
 * this driver attributes mapped memory to the process that maps it: only
 * after one such confirmation (by any session) is a kept release taken as a
 * lie, since with a driver that does not, every client would look like one. */
#include <errno.h>

#include "broker-internal.h"

/* The driver's figure for pid; false when it cannot tell. */
static bool process_figure(const gm_broker_t *b, pid_t pid, uint64_t *ret_bytes) {
        const gm_backend_ops_t *ops = b->backend->ops;
        return !ops->mapped && ops->process_bytes && pid > 0 &&
               ops->process_bytes(b->backend, (int) pid, ret_bytes) == 0;
}

/* Bytes the daemon has handed to the sessions of pid and not had back. */
static uint64_t mapped_into(const gm_broker_t *b, pid_t pid) {
        uint64_t n = 0;
        for (const gm_session_t *s = b->sessions; s; s = s->next)
                if (s->pid == pid && !s->ended)
                        for (const gm_piece_t *p = s->pieces; p; p = p->next)
                                if (p->sent)
                                        n += p->phys.size;
        return n;
}

void gm_release_note_holder(gm_session_t *s, gm_release_t *rel) {
        uint64_t figure;
        if (!process_figure(s->broker, s->pid, &figure))
                return;
        rel->holder_noted = true;
        rel->holder_unaccounted = (int64_t) figure - (int64_t) mapped_into(s->broker, s->pid);
}

bool gm_release_still_held(gm_session_t *s, const gm_release_t *rel, uint64_t acknowledged) {
        gm_broker_t *b = s->broker;
        uint64_t figure;
        if (!rel->holder_noted || acknowledged == 0 || !process_figure(b, s->pid, &figure))
                return false;
        /* The acknowledged pieces are still listed (they are freed after this). */
        int64_t unaccounted = (int64_t) figure - ((int64_t) mapped_into(b, s->pid) - (int64_t) acknowledged);
        int64_t growth = unaccounted - rel->holder_unaccounted;
        if (growth < (int64_t) (acknowledged / 2)) {
                b->driver_attributes_mappings = true; /* the memory left the process's figure */
                return false;
        }
        return b->driver_attributes_mappings && growth >= (int64_t) acknowledged;
}

bool gm_process_holds_device_memory(const gm_broker_t *b, pid_t pid) {
        uint64_t figure;
        return b->driver_attributes_mappings && process_figure(b, pid, &figure) && figure > 0;
}
