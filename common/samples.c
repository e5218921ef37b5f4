/* Sample and refusal rings (samples.h). */
#include <string.h>

#include "samples.h"

/* The fields of gm_sample_t in wire order. */
#define SAMPLE_FIELD_LIST(X) \
        X(t_ms)              \
        X(until_ms)          \
        X(allocated)         \
        X(allocated_min)     \
        X(allocated_max)     \
        X(pending)           \
        X(reserved)          \
        X(inactive_split)    \
        X(largest_free)      \
        X(segments)          \
        X(retries)           \
        X(allocations)       \
        X(request_max)       \
        X(refusals)          \
        X(releasing)

#define COUNT_FIELD(name) +1
_Static_assert(0 SAMPLE_FIELD_LIST(COUNT_FIELD) == GM_SAMPLE_FIELDS, "wire order lists every field");
_Static_assert(sizeof(gm_sample_t) == GM_SAMPLE_FIELDS * sizeof(uint64_t), "gm_sample_t is its fields");

static uint64_t max_u64(uint64_t a, uint64_t b) {
        return a > b ? a : b;
}

static uint64_t min_u64(uint64_t a, uint64_t b) {
        return a < b ? a : b;
}

/* Whether the figures (not the times, extremes or requests) are the same. */
static bool same_figures(const gm_sample_t *a, const gm_sample_t *b) {
        return a->allocated == b->allocated && a->pending == b->pending && a->reserved == b->reserved &&
               a->inactive_split == b->inactive_split && a->largest_free == b->largest_free &&
               a->segments == b->segments && a->retries == b->retries && a->allocations == b->allocations &&
               a->refusals == b->refusals && a->releasing == b->releasing;
}

static gm_sample_t *slot(gm_sample_ring_t *r, size_t i) {
        return &r->ring[(r->head + i) % GM_SAMPLES_CAP];
}

void gm_sample_ring_record(gm_sample_ring_t *r, uint64_t now_ms, const gm_sample_t *f) {
        gm_sample_t *last = r->n ? slot(r, r->n - 1) : NULL;
        if (last && now_ms < last->t_ms + GM_SAMPLE_PERIOD_MS) {
                /* Within the period: the span's last figures, its extremes. */
                uint64_t t = last->t_ms, lo = last->allocated_min, hi = last->allocated_max, req = last->request_max;
                *last = *f;
                last->t_ms = t;
                last->until_ms = max_u64(now_ms, t);
                last->allocated_min = min_u64(lo, f->allocated);
                last->allocated_max = max_u64(hi, f->allocated);
                last->request_max = max_u64(req, f->request_max);
                return;
        }
        if (last && f->request_max == 0 && same_figures(last, f)) {
                last->until_ms = max_u64(now_ms, last->until_ms);
                return;
        }
        if (r->n == GM_SAMPLES_CAP) {
                r->head = (r->head + 1) % GM_SAMPLES_CAP;
                r->n--;
        }
        gm_sample_t *s = slot(r, r->n++);
        *s = *f;
        s->t_ms = s->until_ms = now_ms;
        s->allocated_min = s->allocated_max = f->allocated;
}

const gm_sample_t *gm_sample_ring_at(const gm_sample_ring_t *r, size_t i) {
        return i < r->n ? &r->ring[(r->head + i) % GM_SAMPLES_CAP] : NULL;
}

const gm_sample_t *gm_sample_ring_last(const gm_sample_ring_t *r) {
        return r->n ? gm_sample_ring_at(r, r->n - 1) : NULL;
}

uint64_t gm_sample_inactive(const gm_sample_t *s) {
        uint64_t active = s->allocated + s->pending;
        return s->reserved > active ? s->reserved - active : 0;
}

uint64_t gm_sample_idle_whole(const gm_sample_t *s) {
        uint64_t inactive = gm_sample_inactive(s);
        return inactive > s->inactive_split ? inactive - s->inactive_split : 0;
}

void gm_sample_pack(const gm_sample_t *s, uint64_t out[GM_SAMPLE_FIELDS]) {
        size_t i = 0;
#define PACK_FIELD(name) out[i++] = s->name;
        SAMPLE_FIELD_LIST(PACK_FIELD)
#undef PACK_FIELD
}

void gm_sample_unpack(const uint64_t *in, size_t stride, gm_sample_t *ret) {
        uint64_t v[GM_SAMPLE_FIELDS] = {0};
        memcpy(v, in, min_u64(stride, GM_SAMPLE_FIELDS) * sizeof(uint64_t));
        size_t i = 0;
#define UNPACK_FIELD(name) ret->name = v[i++];
        SAMPLE_FIELD_LIST(UNPACK_FIELD)
#undef UNPACK_FIELD
}

void gm_refusal_ring_add(gm_refusal_ring_t *r, const gm_refusal_t *ev) {
        if (r->n == GM_REFUSALS_CAP) {
                r->head = (r->head + 1) % GM_REFUSALS_CAP;
                r->n--;
        }
        r->ring[(r->head + r->n++) % GM_REFUSALS_CAP] = *ev;
        r->total++;
}

const gm_refusal_t *gm_refusal_ring_at(const gm_refusal_ring_t *r, size_t i) {
        return i < r->n ? &r->ring[(r->head + i) % GM_REFUSALS_CAP] : NULL;
}
