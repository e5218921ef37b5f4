/* Local sessions' statistics pages: bounded reads, the session's figures,
 * and their fold into the tenant's and the device's statistics. What a
 * client writes there is untrusted: a read that fails the bounds of what the
 * daemon granted counts as zeros and flags the session; nothing read here
 * reaches charged bytes or quotas, and folded counters never go backwards. */
#include <errno.h>
#include <stddef.h>

#include "local.h"
#include "log.h"

/* The statistics page is read at most this many times per refresh. */
#define PAGE_READ_TRIES 64
/* The smallest block a heap hands out: bounds the block counts a page may claim. */
#define MIN_BLOCK 512

/* ---- gm_stats_t as arrays (every gm_stat_t, then every int64 counter) ---- */

#define N_STATS ((offsetof(gm_stats_t, num_alloc_retries)) / sizeof(gm_stat_t))
#define N_COUNTERS 5 /* num_alloc_retries .. num_device_free; max_split_size is a setting */
_Static_assert(offsetof(gm_stats_t, num_alloc_retries) % sizeof(gm_stat_t) == 0, "gm_stat_t array");
_Static_assert(offsetof(gm_stats_t, max_split_size) ==
                       offsetof(gm_stats_t, num_alloc_retries) + N_COUNTERS * sizeof(int64_t),
               "counters before max_split_size");

static gm_stat_t *stat_at(gm_stats_t *s, size_t i) {
        return &((gm_stat_t *) s)[i];
}

static int64_t *counter_at(gm_stats_t *s, size_t i) {
        return &(&s->num_alloc_retries)[i];
}

static int64_t max64(int64_t a, int64_t b) {
        return a > b ? a : b;
}

void gm_local_fold(gm_stats_t *sink, const gm_stats_t *want, const gm_stats_t *applied) {
        for (size_t i = 0; i < N_STATS; i++) {
                gm_stat_t *d = stat_at(sink, i);
                const gm_stat_t *w = stat_at((gm_stats_t *) want, i), *a = stat_at((gm_stats_t *) applied, i);
                d->current += w->current - a->current;
                d->peak = max64(d->peak, d->current);
                d->allocated += max64(0, w->allocated - a->allocated);
                d->freed += max64(0, w->freed - a->freed);
        }
        for (size_t i = 0; i < N_COUNTERS; i++)
                *counter_at(sink, i) += max64(0, *counter_at((gm_stats_t *) want, i) - *counter_at((gm_stats_t *) applied, i));
}

static bool in_range(const gm_stat_t *st, int64_t current_max, int64_t peak_max) {
        return st->current >= 0 && st->current <= current_max && st->peak >= st->current && st->peak <= peak_max &&
               st->allocated >= 0 && st->freed >= 0;
}

/* Whether a page's figures fit what this session was granted. */
static bool page_plausible(const gm_local_session_t *l, const gm_stats_t *p) {
        int64_t granted = (int64_t) l->granted;
        int64_t granted_peak = l->exact.reserved_bytes[GM_STAT_ALL].peak;
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
                if (!in_range(&p->segment[t], (int64_t) l->segments.len, (int64_t) l->segments_ever))
                        return false;
        if (!in_range(&p->oversize_allocations, granted / MIN_BLOCK, granted_peak / MIN_BLOCK) ||
            !in_range(&p->oversize_segments, (int64_t) l->segments.len, (int64_t) l->segments_ever))
                return false;
        /* The heap keeps every pool split exact. */
        for (size_t i = 0; i < 9; i++) {
                const gm_stat_t *st = stat_at((gm_stats_t *) p, 3 * i);
                if (st[GM_STAT_SMALL_POOL].current + st[GM_STAT_LARGE_POOL].current != st[GM_STAT_ALL].current)
                        return false;
        }
        for (size_t i = 0; i < N_COUNTERS; i++)
                if (*counter_at((gm_stats_t *) p, i) < 0)
                        return false;
        return true;
}

/* Reads the page; a valid read becomes the session's figures, with the
 * exact ones laid over. Folds the change into tenant and device. */
void gm_local_refresh_session(gm_session_t *s) {
        gm_local_session_t *l = s->local;
        gm_daemon_t *d = s->daemon;
        gm_stats_t page;
        int r = gm_statpage_read(l->page, &page, sizeof(page), PAGE_READ_TRIES);
        if (r == -EAGAIN)
                return; /* the heap is in the middle of a change: keep the last figures */
        bool valid = r == 0 && page_plausible(l, &page);
        if (!valid) {
                if (!l->page_invalid)
                        log_warning("session %llu (pid %d): its statistics page fails the daemon's bounds; "
                                    "its block figures count as zero",
                                    (unsigned long long) s->id, (int) s->cred.pid);
                l->invalid_reads++;
                gm_stats_init(&page);
        }
        l->page_invalid = !valid;
        /* What the daemon knows exactly is not the page's to say. */
        for (int t = 0; t < _GM_STAT_TYPE_MAX; t++)
                if (t == GM_STAT_ALL) {
                        page.reserved_bytes[t] = (gm_stat_t){0};
                        page.segment[t] = (gm_stat_t){0};
                }
        page.num_device_alloc = page.num_device_free = 0;
        page.max_split_size = d->device_stats.max_split_size;
        gm_local_fold(&s->tenant->stats, &page, &l->applied);
        gm_local_fold(&d->device_stats, &page, &l->applied);
        l->applied = page;
        l->figures = page;
        l->figures.reserved_bytes[GM_STAT_ALL] = l->exact.reserved_bytes[GM_STAT_ALL];
        l->figures.segment[GM_STAT_ALL] = l->exact.segment[GM_STAT_ALL];
        l->figures.num_device_alloc = l->exact.num_device_alloc;
        l->figures.num_device_free = l->exact.num_device_free;
}

void gm_local_refresh(gm_daemon_t *d) {
        for (gm_session_t *s = d->sessions; s; s = s->next)
                if (s->local && !s->closing)
                        gm_local_refresh_session(s);
}

const gm_stats_t *gm_session_stats(const gm_session_t *s) {
        if (s->local)
                return &s->local->figures;
        return s->heap ? gm_heap_stats(s->heap) : NULL;
}

bool gm_local_page_invalid(const gm_session_t *s) {
        return s->local && s->local->page_invalid;
}

uint64_t gm_session_cached_bytes(const gm_session_t *s) {
        const gm_stats_t *st = gm_session_stats(s);
        if (!st)
                return 0;
        int64_t cached = st->reserved_bytes[GM_STAT_ALL].current - st->active_bytes[GM_STAT_ALL].current;
        return cached > 0 ? (uint64_t) cached : 0;
}

uint64_t gm_daemon_others_cached(const gm_daemon_t *d, const gm_session_t *s) {
        uint64_t cached = d->releasing_bytes - s->releasing_bytes;
        for (const gm_session_t *o = d->sessions; o; o = o->next)
                if (o != s)
                        cached += gm_session_cached_bytes(o);
        return cached;
}

void gm_local_zero_currents(gm_stats_t *stats) {
        for (size_t i = 0; i < N_STATS; i++)
                stat_at(stats, i)->current = 0;
}
