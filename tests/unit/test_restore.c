/* Restoring a heap from its client's ledger (daemon restart): a heap that
 * went through a random workload is described as a client would describe it
 * (segments with their mapped pieces, live blocks), rebuilt in a fresh heap,
 * and must agree figure for figure, pass the checker, and keep working. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "allocator.h"
#include "fake_provider.h"

#define MiB (1ULL << 20)
#define CAPACITY (1ULL << 30)

typedef struct ledger_segment {
        uint64_t id, va_size, stream, base, n_pieces;
        gm_restore_piece_t pieces[1024];
} ledger_segment_t;

typedef struct ledger_block {
        uint64_t id, segment_id, offset, size, requested;
        bool pending;
} ledger_block_t;

typedef struct ledger {
        ledger_segment_t *segs;
        size_t n_segs;
        ledger_block_t *blocks;
        size_t n_blocks;
} ledger_t;

static ledger_segment_t *ledger_seg(ledger_t *l, uint64_t id) {
        for (size_t i = 0; i < l->n_segs; i++)
                if (l->segs[i].id == id)
                        return &l->segs[i];
        return NULL;
}

static void on_segment(const gm_segment_info_t *seg, void *userdata) {
        ledger_t *l = userdata;
        ledger_segment_t *s = ledger_seg(l, seg->id);
        if (!s) {
                s = &l->segs[l->n_segs++];
                memset(s, 0, sizeof(*s));
                s->id = seg->id;
                s->stream = seg->stream;
                s->base = UINT64_MAX;
        }
        if (seg->addr < s->base)
                s->base = seg->addr; /* completed below for expandable segments */
}

static void on_block(const gm_segment_info_t *seg, const gm_block_info_t *b, void *userdata) {
        ledger_t *l = userdata;
        if (b->state == GM_BLOCK_INACTIVE)
                return;
        l->blocks[l->n_blocks++] = (ledger_block_t){
                .id = b->id,
                .segment_id = seg->id,
                .offset = b->addr, /* an address until the segment base is known */
                .size = b->size,
                .requested = b->requested_size,
                .pending = b->state == GM_BLOCK_ACTIVE_PENDING_FREE,
        };
}

/* Describes heap h (whose memory came from provider f) as its client would. */
static void describe(gm_heap_t *h, fake_provider_t *f, bool expandable, ledger_t *l) {
        l->segs = calloc(4096, sizeof(*l->segs));
        l->blocks = calloc(200000, sizeof(*l->blocks));
        l->n_segs = l->n_blocks = 0;
        gm_heap_walk(h, &(gm_heap_visitor_t){.segment_fn = on_segment, .block_fn = on_block, .userdata = l});
        for (uint64_t i = 0; i < f->n_pieces; i++) {
                fake_piece_t *p = &f->pieces[i];
                ledger_segment_t *s = p->live ? ledger_seg(l, p->segment_id) : NULL;
                if (!s)
                        continue;
                s->pieces[s->n_pieces++] = (gm_restore_piece_t){.offset = p->offset, .size = p->size, .handle = i};
        }
        for (size_t k = 0; k < l->n_segs; k++) {
                ledger_segment_t *s = &l->segs[k];
                uint64_t min_off = UINT64_MAX, end = 0;
                for (size_t i = 0; i < s->n_pieces; i++) {
                        if (s->pieces[i].offset < min_off)
                                min_off = s->pieces[i].offset;
                        if (s->pieces[i].offset + s->pieces[i].size > end)
                                end = s->pieces[i].offset + s->pieces[i].size;
                }
                s->base -= min_off; /* the lowest mapped range starts at the lowest piece */
                uint64_t page = s->pieces[0].size;
                s->va_size = expandable ? (CAPACITY * 9 + 8 * page - 1) / (8 * page) * page : end;
        }
        for (size_t i = 0; i < l->n_blocks; i++)
                l->blocks[i].offset -= ledger_seg(l, l->blocks[i].segment_id)->base;
}

static gm_alloc_config_t config(bool expandable) {
        gm_alloc_config_t c;
        gm_alloc_config_default(&c);
        c.expandable_segments = expandable;
        return c;
}

static void random_ops(gm_heap_t *h, unsigned *seed, uint64_t *live, size_t *n_live, size_t max, int ops) {
        for (int i = 0; i < ops; i++) {
                unsigned r = rand_r(seed);
                if (*n_live < max && (r % 3 != 0 || *n_live == 0)) {
                        uint64_t size = r % 7 == 0 ? 1 + (uint64_t) rand_r(seed) % (24 * MiB)
                                                   : 1 + (uint64_t) rand_r(seed) % (600 * 1024);
                        gm_alloc_result_t res;
                        if (gm_heap_alloc(h, size, rand_r(seed) % 2, &res) == 0)
                                live[(*n_live)++] = res.block_id;
                } else if (*n_live > 0) {
                        size_t k = rand_r(seed) % *n_live;
                        ck_assert_int_eq(gm_heap_free(h, live[k], false), 0);
                        live[k] = live[--*n_live];
                }
        }
}

static void check_same(const gm_stats_t *a, const gm_stats_t *b) {
        for (int t = 0; t < _GM_STAT_TYPE_MAX; t++) {
                ck_assert_int_eq(a->allocation[t].current, b->allocation[t].current);
                ck_assert_int_eq(a->allocated_bytes[t].current, b->allocated_bytes[t].current);
                ck_assert_int_eq(a->active[t].current, b->active[t].current);
                ck_assert_int_eq(a->active_bytes[t].current, b->active_bytes[t].current);
                ck_assert_int_eq(a->requested_bytes[t].current, b->requested_bytes[t].current);
                ck_assert_int_eq(a->reserved_bytes[t].current, b->reserved_bytes[t].current);
                ck_assert_int_eq(a->segment[t].current, b->segment[t].current);
                ck_assert_int_eq(a->inactive_split[t].current, b->inactive_split[t].current);
                ck_assert_int_eq(a->inactive_split_bytes[t].current, b->inactive_split_bytes[t].current);
        }
        ck_assert_int_eq(a->oversize_allocations.current, b->oversize_allocations.current);
        ck_assert_int_eq(a->oversize_segments.current, b->oversize_segments.current);
}

static void restore_roundtrip(bool expandable, unsigned seed) {
        gm_alloc_config_t cfg = config(expandable);
        fake_provider_t fa, fb;
        fake_init(&fa, CAPACITY);
        fake_init(&fb, CAPACITY);
        uint64_t cursor_a = 1ULL << 40, cursor_b = 1ULL << 44;
        gm_provider_t pa = fake_provider(&fa), pb = fake_provider(&fb);
        gm_heap_params_t params_a = {.capacity = CAPACITY, .va_cursor = &cursor_a};
        gm_heap_params_t params_b = {.capacity = CAPACITY, .va_cursor = &cursor_b};
        gm_heap_t *a, *b;
        ck_assert_int_eq(gm_heap_new(&cfg, &pa, &params_a, &a), 0);
        static uint64_t live[4096];
        size_t n_live = 0;
        random_ops(a, &seed, live, &n_live, 300, 3000);
        /* Some frees still waiting for their streams. */
        for (size_t i = 0; i < n_live / 4; i++) {
                ck_assert_int_eq(gm_heap_free(a, live[i], true), 0);
                live[i] = live[--n_live];
        }
        ledger_t l;
        describe(a, &fa, expandable, &l);
        gm_stats_t before = *gm_heap_stats(a);
        ck_assert_int_gt(l.n_segs, 0);
        ck_assert_int_gt(l.n_blocks, 0);
        a = gm_heap_destroy(a);

        ck_assert_int_eq(gm_heap_new(&cfg, &pb, &params_b, &b), 0);
        for (size_t k = 0; k < l.n_segs; k++) {
                ledger_segment_t *s = &l.segs[k];
                for (size_t i = 0; i < s->n_pieces; i++) /* the memory the client still holds */
                        ck_assert_int_eq(pb.create(&fb, s->id, s->va_size, s->pieces[i].offset, s->pieces[i].size,
                                                   &s->pieces[i].handle),
                                         0);
                ck_assert_int_eq(gm_heap_restore_segment(b, s->id, s->va_size, s->stream, s->pieces, s->n_pieces), 0);
        }
        /* Contradicting claims are refused. */
        ck_assert_int_eq(gm_heap_restore_segment(b, l.segs[0].id, l.segs[0].va_size, 0, l.segs[0].pieces, 1), -EEXIST);
        for (size_t i = 0; i < l.n_blocks; i++) {
                ledger_block_t *bl = &l.blocks[i];
                ck_assert_int_eq(gm_heap_restore_block(b, bl->id, bl->segment_id, bl->offset, bl->size, bl->requested,
                                                       bl->pending),
                                 0);
        }
        ck_assert_int_eq(gm_heap_restore_block(b, 999999999, l.blocks[0].segment_id, l.blocks[0].offset,
                                               l.blocks[0].size, l.blocks[0].requested, false),
                         -EINVAL); /* overlaps a restored block */
        ck_assert_int_eq(gm_heap_restore_finish(b), 0);
        check_same(&before, gm_heap_stats(b));
        /* It goes on working: pending frees complete, new blocks get new ids. */
        for (size_t i = 0; i < l.n_blocks; i++)
                if (l.blocks[i].pending)
                        ck_assert_int_eq(gm_heap_free_completed(b, l.blocks[i].id), 0);
        uint64_t max_id = 0;
        for (size_t i = 0; i < l.n_blocks; i++)
                if (l.blocks[i].id > max_id)
                        max_id = l.blocks[i].id;
        gm_alloc_result_t res;
        ck_assert_int_eq(gm_heap_alloc(b, 4096, 0, &res), 0);
        ck_assert_uint_gt(res.block_id, max_id);
        random_ops(b, &seed, live, &n_live, 300, 2000);
        ck_assert_int_eq(gm_heap_check(b), 0);
        b = gm_heap_destroy(b);
        ck_assert_uint_eq(fb.live_handles, 0);
        ck_assert_uint_eq(fb.errors, 0);
        ck_assert_uint_eq(fa.errors, 0);
        fake_done(&fa);
        fake_done(&fb);
        free(l.segs);
        free(l.blocks);
}

START_TEST(test_restore_native) {
        restore_roundtrip(false, 1234u + (unsigned) _i);
}
END_TEST

START_TEST(test_restore_expandable) {
        restore_roundtrip(true, 4321u + (unsigned) _i);
}
END_TEST

int main(void) {
        Suite *s = suite_create("restore");
        TCase *tc = tcase_create("restore");
        tcase_set_timeout(tc, 120);
        tcase_add_loop_test(tc, test_restore_native, 0, 5);
        tcase_add_loop_test(tc, test_restore_expandable, 0, 5);
        suite_add_tcase(s, tc);
        SRunner *sr = srunner_create(s);
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
