/* Local sessions' statistics pages: bounded reads, the session's figures,
 * and their part of the tenant's and the device's statistics. What a client
 * writes there is untrusted: a read that fails the bounds of what the daemon
 * granted counts as zeros and flags the session; nothing read here reaches
 * charged bytes or quotas (the broker's), and folded counters never go back. */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "localstats.h"
#include "log.h"

/* The statistics page is read at most this many times per refresh. */
#define PAGE_READ_TRIES 64
/* The smallest block a heap hands out: bounds the block counts a page may claim. */
#define MIN_BLOCK 512

/* ---- gm_stats_t as arrays (every gm_stat_t, then every int64 counter) ---- */

#define N_STATS ((offsetof(gm_stats_t, num_alloc_retries)) / sizeof(gm_stat_t))
#define N_COUNTERS 6 /* num_alloc_retries .. num_reclaim_waits; max_split_size is a setting */
_Static_assert(offsetof(gm_stats_t, num_alloc_retries) % sizeof(gm_stat_t) == 0, "gm_stat_t array");
_Static_assert(offsetof(gm_stats_t, max_split_size) ==
                       offsetof(gm_stats_t, num_alloc_retries) + N_COUNTERS * sizeof(int64_t),
               "counters before max_split_size");

static gm_stat_t *stat_at(gm_stats_t *s, size_t i) {
        return &((gm_stat_t *) s)[i];
}

static const gm_stat_t *cstat_at(const gm_stats_t *s, size_t i) {
        return &((const gm_stat_t *) s)[i];
}

static int64_t *counter_at(gm_stats_t *s, size_t i) {
        return &(&s->num_alloc_retries)[i];
}

static int64_t ccounter_at(const gm_stats_t *s, size_t i) {
        return (&s->num_alloc_retries)[i];
}

static int64_t max64(int64_t a, int64_t b) {
        return a > b ? a : b;
}

void gm_localstats_fold(gm_stats_t *sink, const gm_stats_t *want, const gm_stats_t *applied) {
        for (size_t i = 0; i < N_STATS; i++) {
                gm_stat_t *d = stat_at(sink, i);
                const gm_stat_t *w = cstat_at(want, i), *a = cstat_at(applied, i);
                d->current += w->current - a->current;
                d->peak = max64(d->peak, d->current);
                if (w->peak > a->peak) /* the session peaked since the last read: the others as they are now */
                        d->peak = max64(d->peak, d->current - w->current + w->peak);
                /* allocated - freed moves exactly as current does, so the
                 * sink keeps allocated = freed + current whatever the page
                 * says: what left current without being counted (a session
                 * that ended with live blocks, a page read as zeros) is
                 * counted as freed, what came without being counted as
                 * allocated. Neither ever goes back. */
                int64_t moved = w->current - a->current;
                int64_t allocated = max64(0, w->allocated - a->allocated);
                int64_t freed = max64(0, w->freed - a->freed);
                if (allocated - freed > moved)
                        freed = allocated - moved;
                else
                        allocated = freed + moved;
                d->allocated += allocated;
                d->freed += freed;
        }
        for (size_t i = 0; i < N_COUNTERS; i++)
                *counter_at(sink, i) += max64(0, ccounter_at(want, i) - ccounter_at(applied, i));
}

void gm_localstats_add(gm_stats_t *sum, const gm_stats_t *add) {
        for (size_t i = 0; i < N_STATS; i++) {
                gm_stat_t *d = stat_at(sum, i);
                const gm_stat_t *a = cstat_at(add, i);
                d->current += a->current;
                d->peak += a->peak;
                d->allocated += a->allocated;
                d->freed += a->freed;
        }
        for (size_t i = 0; i < N_COUNTERS; i++)
                *counter_at(sum, i) += ccounter_at(add, i);
}

static void zero_currents(gm_stats_t *stats) {
        for (size_t i = 0; i < N_STATS; i++)
                stat_at(stats, i)->current = 0;
}

gm_localstats_tenant_t *gm_localstats_tenant(const gm_requests_t *d, const char *name) {
        for (gm_localstats_tenant_t *lt = d->local->tenants; lt; lt = lt->next)
                if (strcmp(lt->name, name) == 0)
                        return lt;
        gm_localstats_tenant_t *lt = calloc(1, sizeof(*lt));
        if (!lt)
                return NULL;
        snprintf(lt->name, sizeof(lt->name), "%s", name);
        gm_stats_init(&lt->stats);
        lt->stats.max_split_size = 0;
        lt->next = d->local->tenants;
        d->local->tenants = lt;
        return lt;
}

static const gm_localstats_tenant_t *find_local_tenant(const gm_requests_t *d, const char *name) {
        for (const gm_localstats_tenant_t *lt = d->local->tenants; lt; lt = lt->next)
                if (strcmp(lt->name, name) == 0)
                        return lt;
        return NULL;
}

static bool in_range(const gm_stat_t *st, int64_t current_max, int64_t peak_max) {
        return st->current >= 0 && st->current <= current_max && st->peak >= st->current && st->peak <= peak_max &&
               st->allocated >= 0 && st->freed >= 0;
}

/* Whether a page's figures fit what this session was granted (asleep, plus
 * what it held as it fell asleep: its heap keeps those blocks and segments,
 * and its awake pools may have peaked above them meanwhile). */
static bool page_plausible(const gm_session_view_t *s, const gm_stats_t *p) {
        const gm_session_grants_t *g = &s->grants;
        int64_t granted = g->bytes.current + (int64_t) s->sleep.granted_bytes;
        int64_t granted_peak = g->bytes.peak + (int64_t) s->sleep.granted_bytes;
        int64_t segments = g->segments.current + (int64_t) s->sleep.segments;
        int64_t segments_ever = g->segments.allocated > segments ? g->segments.allocated : segments;
        const gm_stat_t *bytes[] = {p->allocated_bytes, p->reserved_bytes, p->active_bytes, p->inactive_split_bytes,
                                    p->requested_bytes};
        const gm_stat_t *counts[] = {p->allocation, p->active, p->inactive_split};
        for (size_t k = 0; k < sizeof(bytes) / sizeof(bytes[0]); k++)
                for (int t = 0; t < _GM_STAT_TYPE_MAX; t++)
                        if (!in_range(&bytes[k][t], granted, granted_peak))
                                return false;
        for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
                for (int t = 0; t < _GM_STAT_TYPE_MAX; t++)
                        if (!in_range(&counts[k][t], granted / MIN_BLOCK, granted_peak / MIN_BLOCK))
                                return false;
        for (int t = 0; t < _GM_STAT_TYPE_MAX; t++)
                if (!in_range(&p->segment[t], segments, segments_ever))
                        return false;
        if (!in_range(&p->oversize_allocations, granted / MIN_BLOCK, granted_peak / MIN_BLOCK) ||
            !in_range(&p->oversize_segments, segments, segments_ever))
                return false;
        /* The heap keeps every pool split exact. */
        for (size_t i = 0; i + 3 <= 27; i += 3) {
                const gm_stat_t *st = cstat_at(p, i);
                if (st[GM_STAT_SMALL_POOL].current + st[GM_STAT_LARGE_POOL].current != st[GM_STAT_ALL].current)
                        return false;
        }
        for (size_t i = 0; i < N_COUNTERS; i++)
                if (ccounter_at(p, i) < 0)
                        return false;
        return true;
}

static void overlay_exact(gm_localstats_t *l) {
        l->figures.reserved_bytes[GM_STAT_ALL] = l->exact.reserved_bytes[GM_STAT_ALL];
        l->figures.segment[GM_STAT_ALL] = l->exact.segment[GM_STAT_ALL];
        l->figures.num_device_alloc = l->exact.num_device_alloc;
        l->figures.num_device_free = l->exact.num_device_free;
        l->figures.num_reclaim_waits = l->exact.num_reclaim_waits;
}

static bool grants_same(const gm_session_grants_t *a, const gm_session_grants_t *b) {
        return a->bytes.current == b->bytes.current && a->bytes.peak == b->bytes.peak &&
               a->segments.current == b->segments.current && a->segments.allocated == b->segments.allocated;
}

/* Whether a read now would give what the last one gave: the page's sequence
 * number is the one it had then (the writer bumps it around every change)
 * and so are the bounds the copy is checked against. A writer that changes
 * the payload without bumping it only keeps its own figures stale. */
static bool read_current(const gm_localstats_t *l, const gm_session_view_t *sv, uint64_t seq, int64_t max_split) {
        return l->read_once && seq == l->read_seq && !(seq & 1) && grants_same(&sv->grants, &l->read_grants) &&
               l->figures.max_split_size == max_split;
}

void gm_localstats_refresh_conn(gm_request_conn_t *c) {
        gm_localstats_t *l = c->local;
        const gm_requests_t *d = c->rq;
        gm_stats_t page;
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        uint64_t seq = atomic_load_explicit((const _Atomic uint64_t *) &l->page->seq, memory_order_acquire);
        if (read_current(l, &sv, seq, d->broker->device_stats.max_split_size))
                return; /* nothing changed since the last read: every figure stands */
        int r = gm_statpage_read(l->page, &page, sizeof(page), PAGE_READ_TRIES);
        if (r == -EAGAIN)
                return; /* the heap is in the middle of a change: keep the last figures */
        l->read_once = r == 0;
        l->read_seq = seq;
        l->read_grants = sv.grants;
        bool valid = r == 0 && page_plausible(&sv, &page);
        if (!valid) {
                if (!l->page_invalid)
                        log_warning("session %llu (pid %d): its statistics page fails the daemon's bounds; "
                                    "its block figures count as zero",
                                    (unsigned long long) sv.id, (int) sv.pid);
                gm_stats_init(&page);
        }
        l->page_invalid = !valid;
        /* What the daemon knows exactly is not the page's to say. */
        page.reserved_bytes[GM_STAT_ALL] = (gm_stat_t){0};
        page.segment[GM_STAT_ALL] = (gm_stat_t){0};
        page.num_device_alloc = page.num_device_free = page.num_reclaim_waits = 0;
        page.max_split_size = d->broker->device_stats.max_split_size;
        gm_localstats_tenant_t *lt = gm_localstats_tenant(d, sv.tenant->name);
        if (lt)
                gm_localstats_fold(&lt->stats, &page, &l->applied);
        gm_localstats_fold(&d->local->device, &page, &l->applied);
        l->applied = page;
        l->figures = page;
        overlay_exact(l);
}

/* Moves the session's exact figures, its tenant's and the device's local
 * totals by `bytes` and `segments`, counting `allocs` and `frees` of pieces. */
static void exact_apply(gm_request_conn_t *c, int64_t bytes, int64_t segments, int64_t allocs, int64_t frees) {
        const gm_requests_t *d = c->rq;
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        gm_localstats_tenant_t *lt = gm_localstats_tenant(d, sv.tenant->name);
        gm_stats_t *sinks[] = {&c->local->exact, &d->local->device, lt ? &lt->stats : NULL};
        for (size_t i = 0; i < sizeof(sinks) / sizeof(sinks[0]) && sinks[i]; i++) {
                if (bytes)
                        gm_stat_update(&sinks[i]->reserved_bytes[GM_STAT_ALL], bytes);
                if (segments)
                        gm_stat_update(&sinks[i]->segment[GM_STAT_ALL], segments);
                sinks[i]->num_device_alloc += allocs;
                sinks[i]->num_device_free += frees;
        }
        overlay_exact(c->local);
}

void gm_localstats_exact_sync(gm_request_conn_t *c) {
        gm_localstats_t *l = c->local;
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        const gm_session_grants_t *now = &sv.grants, *was = &l->synced;
        exact_apply(c, now->bytes.current - was->bytes.current, now->segments.current - was->segments.current,
                    (int64_t) (now->pieces + now->returned) - (int64_t) (was->pieces + was->returned),
                    (int64_t) now->returned - (int64_t) was->returned);
        l->synced = *now;
}

static void exact_gone(gm_request_conn_t *c) {
        gm_localstats_t *l = c->local;
        exact_apply(c, -l->synced.bytes.current, -l->synced.segments.current, 0, (int64_t) l->synced.pieces);
        l->synced = (gm_session_grants_t){0};
}

void gm_localstats_gone(gm_request_conn_t *c) {
        gm_localstats_t *l = c->local;
        const gm_requests_t *d = c->rq;
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        if (sv.tenant)                         /* the page stays mapped until the end: */
                gm_localstats_refresh_conn(c); /* what it did since the last read (a short session: all of it) */
        gm_stats_t gone = l->applied;
        zero_currents(&gone);
        gm_localstats_tenant_t *lt = sv.tenant ? gm_localstats_tenant(d, sv.tenant->name) : NULL;
        if (lt)
                gm_localstats_fold(&lt->stats, &gone, &l->applied);
        gm_localstats_fold(&d->local->device, &gone, &l->applied);
        if (sv.tenant)
                exact_gone(c);
}

void gm_localstats_client_view(void *userdata, const gm_session_t *s, gm_client_view_t *ret) {
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        gm_request_conn_t *c = sv.userdata;
        *ret = (gm_client_view_t){0};
        if (!c || !sv.tenant)
                return;
        if (c->local && !c->closed) {
                gm_localstats_refresh_conn(c);
                const gm_stats_t *st = &c->local->figures;
                ret->session_allocated = (uint64_t) st->allocated_bytes[GM_STAT_ALL].current;
                ret->session_active = (uint64_t) st->active_bytes[GM_STAT_ALL].current;
        }
        const gm_localstats_tenant_t *lt = find_local_tenant(c->rq, sv.tenant->name);
        ret->tenant_active = lt ? (uint64_t) lt->stats.active_bytes[GM_STAT_ALL].current : 0;
        ret->device_active = (uint64_t) c->rq->local->device.active_bytes[GM_STAT_ALL].current;
}

void gm_localstats_tick(const gm_requests_t *d) {
        gm_localstats_refresh(d);
}

void gm_localstats_count_reclaim_wait(gm_request_conn_t *c) {
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        gm_localstats_tenant_t *lt = gm_localstats_tenant(c->rq, sv.tenant->name);
        c->local->exact.num_reclaim_waits++;
        c->rq->local->device.num_reclaim_waits++;
        if (lt)
                lt->stats.num_reclaim_waits++;
        overlay_exact(c->local);
}

void gm_localstats_refresh(const gm_requests_t *d) {
        for (gm_session_t *s = d->broker->sessions; s; s = gm_session_next(s)) {
                gm_session_view_t sv;
                gm_session_view(s, &sv);
                gm_request_conn_t *c = sv.userdata;
                if (c && c->local && !c->closed)
                        gm_localstats_refresh_conn(c);
        }
}

const gm_stats_t *gm_localstats_session(const gm_session_t *s) {
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        const gm_request_conn_t *c = sv.userdata;
        if (c && c->local)
                return &c->local->figures;
        return sv.heap ? gm_heap_stats(sv.heap) : NULL;
}

/* The id session view sv gives pool `tag`, or -1 when it never named it. */
static int tag_id(const gm_session_view_t *sv, const char *tag) {
        if (!tag[0])
                return 0;
        for (unsigned k = 1; sv->tags && k <= sv->tags->n && k <= GM_SESSION_MAX_TAGS; k++)
                if (strcmp(sv->tags->names[k], tag) == 0)
                        return (int) k;
        return -1;
}

static void zero_counters(gm_stats_t *st) {
        for (size_t i = 0; i < N_COUNTERS; i++)
                *counter_at(st, i) = 0;
}

bool gm_localstats_session_tag(const gm_session_t *s, const char *tag, gm_stats_t *ret) {
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        const gm_request_conn_t *c = sv.userdata;
        int id = tag_id(&sv, tag);
        gm_stats_init(ret);
        if (id < 0 || (!(c && c->local) && !sv.heap)) /* no pool named, or no heap (a gpumemctl) */
                return false;
        if (c && c->local) {
                if (id == 0 && sv.tags->n == 0) { /* no pool named: all of it is the default's */
                        *ret = c->local->figures;
                } else {
                        size_t at = offsetof(gm_heap_stats_area_t, tags) + (size_t) id * sizeof(gm_stats_t);
                        int r = gm_statpage_read_at(c->local->page, at, ret, sizeof(*ret), PAGE_READ_TRIES);
                        if (r < 0 || c->local->page_invalid || !page_plausible(&sv, ret))
                                gm_stats_init(ret);
                        ret->max_split_size = c->local->figures.max_split_size;
                }
        } else if (gm_heap_tag_stats(sv.heap, (unsigned) id, ret) < 0) {
                gm_stats_init(ret);
        }
        zero_counters(ret);
        return true;
}

bool gm_localstats_page_invalid(const gm_session_t *s) {
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        const gm_request_conn_t *c = sv.userdata;
        return c && c->local && c->local->page_invalid;
}

void gm_localstats_tenant_stats(const gm_requests_t *d, const gm_tenant_t *t, gm_stats_t *ret) {
        *ret = t->stats;
        const gm_localstats_tenant_t *lt = find_local_tenant(d, t->name);
        if (lt)
                gm_localstats_add(ret, &lt->stats);
}

void gm_localstats_device_stats(const gm_requests_t *d, gm_stats_t *ret) {
        *ret = d->broker->device_stats;
        gm_localstats_add(ret, &d->local->device);
}

void gm_localstats_free_all(const gm_requests_t *d) {
        while (d->local->tenants) {
                gm_localstats_tenant_t *lt = d->local->tenants;
                d->local->tenants = lt->next;
                free(lt);
        }
}

void gm_localstats_metrics_refresh(void *userdata) {
        gm_localstats_refresh(userdata);
}

void gm_localstats_metrics_tenant(void *userdata, const gm_tenant_t *t, gm_metrics_tenant_extra_t *ret) {
        const gm_requests_t *d = userdata;
        gm_localstats_tenant_stats(d, t, &ret->stats);
        for (const gm_session_t *os = d->broker->sessions; os; os = gm_session_next(os)) {
                gm_session_view_t ov;
                gm_session_view(os, &ov);
                const gm_request_conn_t *c = ov.userdata;
                if (c && !c->closed && ov.tenant == t)
                        ret->unresponsive += ov.unresponsive;
                if (c && c->local && !c->closed && ov.tenant == t) {
                        ret->local_sessions++;
                        ret->invalid_pages += c->local->page_invalid;
                }
        }
}
