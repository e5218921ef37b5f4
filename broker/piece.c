/* Pieces of physical memory: the only place that creates, charges, stores,
 * adopts and releases them. A piece is charged to its session's tenant from
 * the moment it is LIVE until its memory went back to the backend; the
 * backend's in_use counts every piece with a handle here, unbacked_bytes the
 * ones without (re-registered by their clients after a restart). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "piece.h"

bool gm_piece_charged(const gm_piece_t *p) {
        return p->state == GM_PIECE_LIVE || p->state == GM_PIECE_TO_RELEASE || p->state == GM_PIECE_RELEASING;
}

static void charge(gm_piece_t *p, bool on) {
        gm_tenant_t *t = p->session ? p->session->tenant : NULL;
        if (!t)
                return;
        uint64_t *tag_bytes = &p->session->tags.bytes[p->tag];
        if (on) {
                t->charged_bytes += p->phys.size;
                *tag_bytes += p->phys.size;
        } else {
                gm_assert(t->charged_bytes >= p->phys.size && *tag_bytes >= p->phys.size);
                t->charged_bytes -= p->phys.size;
                *tag_bytes -= p->phys.size;
        }
}

void gm_piece_attach(gm_session_t *s, gm_piece_t *p, gm_piece_state_t state) {
        gm_assert(!p->session); /* a piece has one owner */
        p->session = s;
        p->state = state;
        p->prev = NULL;
        p->next = s->pieces;
        if (s->pieces)
                s->pieces->prev = p;
        s->pieces = p;
        if (gm_piece_charged(p))
                charge(p, true);
}

static void detach(gm_piece_t *p) {
        gm_session_t *s = p->session;
        if (!s)
                return;
        if (gm_piece_charged(p))
                charge(p, false);
        if (p->prev)
                p->prev->next = p->next;
        else
                s->pieces = p->next;
        if (p->next)
                p->next->prev = p->prev;
        p->prev = p->next = NULL;
        p->session = NULL;
}

const gm_tag_quota_t *gm_piece_tag_quota_over(const gm_session_t *s, unsigned tag, uint64_t bytes,
                                              uint64_t *ret_charged) {
        const gm_tenant_t *t = s->tenant;
        if (!t || tag == 0 || tag > GM_SESSION_MAX_TAGS || !t->n_tag_quotas)
                return NULL;
        for (size_t i = 0; i < t->n_tag_quotas; i++) {
                const gm_tag_quota_t *q = &t->tag_quotas[i];
                if (strcmp(q->tag, s->tags.names[tag]) != 0)
                        continue;
                uint64_t charged = gm_tenant_tag_charged(s->broker, t, q->tag);
                if (charged <= q->bytes && bytes <= q->bytes - charged)
                        return NULL;
                *ret_charged = charged;
                return q;
        }
        return NULL;
}

/* What session s could still be given under its tenant's quota (UINT64_MAX:
 * none) and on the device: audited memory counts as charged
 * (process_check.c), other sessions' claims as taken, its own claim as its
 * own. */
static void room(const gm_session_t *s, uint64_t *ret_quota_room, uint64_t *ret_device_room) {
        const gm_broker_t *b = s->broker;
        const gm_tenant_t *t = s->tenant;
        uint64_t held = t->charged_bytes + t->audited_bytes + gm_claim_others_of_tenant(s);
        uint64_t elsewhere = b->unbacked_bytes + b->audited_bytes + gm_claim_others_of_device(s);
        uint64_t free = b->backend->capacity - b->backend->in_use; /* the unbacked pieces' and the audited memory are
                                                                      the device's too */
        *ret_quota_room = !t->quota ? UINT64_MAX : held < t->quota ? t->quota - held : 0;
        *ret_device_room = elsewhere < free ? free - elsewhere : 0;
}

int gm_piece_room_for(const gm_session_t *s, uint64_t bytes, unsigned tag) {
        uint64_t quota_room, device_room, charged;
        room(s, &quota_room, &device_room);
        if (bytes > quota_room)
                return -EDQUOT;
        if (gm_piece_tag_quota_over(s, tag, bytes, &charged))
                return -EDQUOT;
        if (bytes > device_room)
                return -ENOMEM;
        return 0;
}

uint64_t gm_piece_room(const gm_session_t *s) {
        uint64_t quota_room, device_room;
        room(s, &quota_room, &device_room);
        return quota_room < device_room ? quota_room : device_room;
}

int gm_piece_create(gm_session_t *s, const gm_piece_spec_t *spec, gm_piece_t **ret_piece) {
        gm_broker_t *b = s->broker;
        if (!s->tenant || s->ended)
                return -ESHUTDOWN;
        if (spec->size == 0 || spec->offset + spec->size < spec->offset ||
            spec->offset + spec->size > spec->segment_va_size)
                return -EINVAL;
        int r = gm_piece_room_for(s, spec->size, spec->tag);
        if (r < 0)
                return r;
        gm_piece_t *p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        r = gm_backend_create(b->backend, spec->size, &p->phys);
        if (r < 0) {
                free(p);
                return r;
        }
        p->segment_id = spec->segment_id;
        p->segment_va_size = spec->segment_va_size;
        p->offset = spec->offset;
        p->tag = spec->tag <= GM_SESSION_MAX_TAGS ? spec->tag : 0;
        gm_piece_attach(s, p, GM_PIECE_LIVE);
        gm_claim_consume(s, spec->size);
        gm_ledger_store(b, s, p);
        gm_piece_list_unsent(s, p); /* for the reply that hands it to the client */
        *ret_piece = p;
        return 0;
}

int gm_piece_create_run(gm_session_t *s, const gm_piece_spec_t *first, uint64_t n, gm_piece_t **pieces) {
        if (!s->tenant || s->ended)
                return -ESHUTDOWN;
        if (n == 0 || first->size == 0 || first->offset > first->segment_va_size ||
            n > (first->segment_va_size - first->offset) / first->size)
                return -EINVAL;
        int r = gm_piece_room_for(s, n * first->size, first->tag); /* the run as a whole */
        uint64_t k = 0;
        for (; k < n && r == 0; k += r == 0) {
                gm_piece_spec_t spec = *first;
                spec.offset += k * first->size;
                r = gm_piece_create(s, &spec, &pieces[k]);
        }
        while (r < 0 && k-- > 0) /* never sent: back to the backend at once */
                gm_piece_release(s, pieces[k], false);
        return r;
}

void gm_piece_list_unsent(gm_session_t *s, gm_piece_t *p) {
        p->queue = NULL;
        if (s->new_tail)
                s->new_tail->queue = p;
        else
                s->new_head = p;
        s->new_tail = p;
}

/* Unlinks p from the session's unsent list, if it is there. */
static void unlist_new(gm_session_t *s, gm_piece_t *p) {
        gm_piece_t *prev = NULL;
        for (gm_piece_t *q = s->new_head; q; prev = q, q = q->queue) {
                if (q != p)
                        continue;
                if (prev)
                        prev->queue = q->queue;
                else
                        s->new_head = q->queue;
                if (s->new_tail == q)
                        s->new_tail = prev;
                q->queue = NULL;
                return;
        }
}

void gm_piece_release(gm_session_t *s, gm_piece_t *p, bool whole_segment) {
        if (!p->sent)
                unlist_new(s, p);
        p->in_heap = false;
        if (s->ended || !p->sent) {
                /* Not mapped anywhere (never sent, or the client is gone). */
                gm_piece_destroy(s->broker, p);
                return;
        }
        /* Kept in release order, so that a segment's last piece (whole_segment)
         * is asked back with or after every other piece of it. */
        p->state = GM_PIECE_TO_RELEASE;
        p->whole_segment = whole_segment;
        p->queue = NULL;
        if (s->rel_tail)
                s->rel_tail->queue = p;
        else
                s->rel_head = p;
        s->rel_tail = p;
}

void gm_piece_granted(gm_session_t *s, gm_piece_t *p) {
        unlist_new(s, p);
        p->in_heap = false;
        p->sent = false; /* released at once: its client gives it back unmapped (or is gone) */
        p->granted = true;
        p->handed_ms = gm_now_ms();
}

bool gm_piece_still_mapped(const gm_broker_t *b, const gm_piece_t *p) {
        return p->phys.fd >= 0 && (p->sent || p->granted) && b->backend->ops->mapped &&
               b->backend->ops->mapped(b->backend, &p->phys) == 1;
}

/* Whether a liar's piece may still be mapped: the backend's word per piece,
 * or (where it has none) the driver listing the process with device memory. */
static bool still_held(const gm_broker_t *b, const gm_piece_t *p, pid_t pid) {
        if (b->backend->ops->mapped)
                return gm_piece_still_mapped(b, p);
        return p->phys.fd >= 0 && p->sent && gm_process_check_holds_memory(b, pid);
}

static bool lingering_held(const gm_broker_t *b, const gm_lingering_t *l) {
        if (b->backend->ops->mapped)
                return b->backend->ops->mapped(b->backend, &l->phys) == 1;
        return gm_process_check_holds_memory(b, l->pid);
}

/* Keeps p's memory charged to tenant t (in the backend still) while mapped. */
static bool linger(gm_broker_t *b, gm_tenant_t *t, pid_t pid, gm_piece_t *p) {
        gm_lingering_t *l = calloc(1, sizeof(*l));
        if (!l)
                return false;
        l->phys = p->phys;
        l->tenant = t;
        l->pid = pid;
        l->next = b->lingering;
        b->lingering = l;
        t->charged_bytes += p->phys.size;
        gm_host_log(b, LOG_WARNING,
                    "segment %" PRIu64 " (%" PRIu64 " bytes) of tenant '%s' is still mapped by a process after its "
                    "session let go of it: it stays charged until it is unmapped",
                    p->segment_id, p->phys.size, t->name);
        return true;
}

void gm_piece_sweep_lingering(gm_broker_t *b, bool all) {
        for (gm_lingering_t **lp = &b->lingering; *lp;) {
                gm_lingering_t *l = *lp;
                if (!all && lingering_held(b, l)) {
                        lp = &l->next;
                        continue;
                }
                *lp = l->next;
                gm_assert(l->tenant->charged_bytes >= l->phys.size);
                l->tenant->charged_bytes -= l->phys.size;
                gm_backend_release(b->backend, &l->phys);
                free(l);
        }
}

void gm_piece_destroy(gm_broker_t *b, gm_piece_t *p) {
        /* Memory is not gone because its session is: while a process maps
         * it, it stays charged. Where the backend can tell per piece (host),
         * every session's pieces are asked (an honest client unmaps before it
         * closes its connection, and a killed process's mappings are gone
         * before its socket closes); elsewhere only a session that lied,
         * judged by its process's figure. */
        gm_tenant_t *t = p->session && (p->session->lied || b->backend->ops->mapped) ? p->session->tenant : NULL;
        pid_t pid = t ? p->session->pid : 0;
        bool leaving = !b->stopping && !b->keep_stored; /* not kept for a next daemon */
        bool keep = t && leaving && still_held(b, p, pid);
        /* Its session is over: whatever its client kept (the fd, a private
         * or read-only mapping) loses the contents (the host backend's check
         * punches them out, then seals). Not at a stop: live clients keep
         * their memory across the daemon's exit. */
        if (!keep && leaving)
                (void) gm_piece_still_mapped(b, p);
        detach(p);
        if (keep && linger(b, t, pid, p)) {
                gm_ledger_unstore(b, p);
                free(p);
                return;
        }
        if (!b->keep_stored)
                gm_ledger_unstore(b, p);
        else if (p->store_id)
                b->n_stored--; /* the next daemon's now */
        else if (p->record_id)
                b->n_recorded--; /* journaled for the next daemon */
        if (p->phys.fd < 0) {
                gm_assert(b->unbacked_bytes >= p->phys.size);
                b->unbacked_bytes -= p->phys.size;
        } else {
                gm_assert(b->backend->in_use >= p->phys.size);
                gm_backend_release(b->backend, &p->phys);
        }
        free(p);
}

int gm_piece_adopt(gm_broker_t *b, int fd, const gm_ledger_entry_t *e, gm_piece_t **ret_piece) {
        gm_piece_t *p = calloc(1, sizeof(*p));
        if (!p) {
                close(fd);
                return -ENOMEM;
        }
        int r = b->backend->ops->adopt(b->backend, fd, e->size, &p->phys); /* consumes fd */
        if (r < 0) {
                free(p);
                return r;
        }
        p->segment_id = e->segment_id;
        p->offset = e->offset;
        p->segment_va_size = e->va_size;
        p->store_id = e->store_id;
        p->pool = e->pool;
        p->tag = (uint8_t) e->tag; /* named in its orphan's tags */
        p->state = GM_PIECE_ORPHAN;
        b->n_stored++;
        *ret_piece = p;
        return 0;
}

gm_piece_t *gm_piece_new_unbacked(gm_session_t *s, const gm_piece_spec_t *spec) {
        gm_broker_t *b = s->broker;
        /* Memory nobody can vouch for is believed only while it fits the device. */
        uint64_t used = gm_piece_reserved(b) + b->claimed_bytes;
        if (spec->size > b->backend->capacity || used > b->backend->capacity - spec->size)
                return NULL;
        gm_piece_t *p = calloc(1, sizeof(*p));
        if (!p)
                return NULL;
        p->segment_id = spec->segment_id;
        p->segment_va_size = spec->segment_va_size;
        p->offset = spec->offset;
        p->phys = (gm_phys_t){.fd = -1, .size = spec->size, .handle = 0};
        b->unbacked_bytes += spec->size;
        gm_piece_attach(s, p, GM_PIECE_ADOPTING);
        return p;
}

void gm_piece_claimed(gm_session_t *s, gm_piece_t *p) {
        p->state = GM_PIECE_LIVE;
        p->in_heap = true;
        p->sent = true; /* the client holds it mapped */
        charge(p, true);
}

void gm_piece_move(gm_broker_t *b, gm_piece_t *p, uint64_t segment_id, uint64_t va_size, uint64_t offset) {
        p->segment_id = segment_id;
        p->segment_va_size = va_size;
        p->offset = offset;
        gm_ledger_moved(b, p);
}

gm_piece_t *gm_piece_find(const gm_session_t *s, uint64_t segment_id, uint64_t offset) {
        for (gm_piece_t *p = s->pieces; p; p = p->next)
                if (p->state == GM_PIECE_LIVE && p->segment_id == segment_id && p->offset == offset)
                        return p;
        return NULL;
}

uint64_t gm_piece_reserved(const gm_broker_t *b) {
        return b->backend->in_use + b->unbacked_bytes;
}
