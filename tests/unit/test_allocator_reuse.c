/* Page reuse (alloc_conf gpumemd_page_reuse:True, a gpumemd extension): when a
 * request fits no free block, whole 2 MiB pages inside free blocks move to
 * where the request needs them and only the shortfall is new memory. Every
 * expected figure is derived by hand in the comments; the fake provider's
 * ledger checks each move (from where, to where, from_segment_empty). */
#include <stdlib.h>

#include "snapshot.h"
#include "test_allocator.h"

static void open_reuse(bool reuse, uint64_t capacity) {
        gm_alloc_config_t c;

        config_default(&c);
        c.expandable_segments = true;
        c.page_reuse = reuse;
        heap_open(&c, capacity);
}

static gm_page_reuse_info_t reuse_info(void) {
        gm_page_reuse_info_t info;

        gm_heap_page_reuse(H, &info);
        return info;
}

typedef struct ranges {
        unsigned n;
        uint64_t bytes;
} ranges_t;

static void count_range(const gm_segment_info_t *seg, void *userdata) {
        ranges_t *r = userdata;

        r->n++;
        r->bytes += seg->size;
}

/* The snapshot's view: one segment per contiguous mapped range. */
static ranges_t walk_ranges(void) {
        ranges_t r = {0};
        gm_heap_visitor_t v = {.segment_fn = count_range, .userdata = &r};

        gm_heap_walk(H, &v);
        return r;
}

START_TEST(test_reuse_conf) {
        gm_alloc_config_t c;
        char err[128] = "";

        ck_assert_int_eq(
                gm_alloc_config_parse("expandable_segments:True,gpumemd_page_reuse:True", &c, err, sizeof(err)), 0);
        ck_assert(c.page_reuse && c.expandable_segments);
        ck_assert_int_eq(gm_alloc_config_parse("gpumemd_page_reuse:False", &c, err, sizeof(err)), 0);
        ck_assert(!c.page_reuse);
        ck_assert_int_eq(gm_alloc_config_parse("", &c, err, sizeof(err)), 0);
        ck_assert(!c.page_reuse); /* off by default: PyTorch parity */
        ck_assert_int_eq(gm_alloc_config_parse("gpumemd_page_reuse:True", &c, err, sizeof(err)), -EINVAL);
        ck_assert_str_eq(err, "gpumemd_page_reuse:True needs expandable_segments:True");
        ck_assert_int_eq(gm_alloc_config_parse("expandable_segments:True,gpumemd_page_reuse:1", &c, err, sizeof(err)),
                         -EINVAL);

        open_reuse(true, 1 * GiB);
        ck_assert(reuse_info().configured && reuse_info().active);
        ck_assert_ptr_null(reuse_info().inactive_reason);
        open_reuse(false, 1 * GiB);
        ck_assert(!reuse_info().active);
        ck_assert_str_eq(reuse_info().inactive_reason, "not configured (alloc_conf gpumemd_page_reuse:True)");
}
END_TEST

/* A page-reuse heap of its own (1 GiB device) on `f`, which holds
 * fake_capacity bytes, without remap() or create_run() where asked. */
static uint64_t own_cursor;

static gm_heap_t *own_heap(fake_provider_t *f, uint64_t fake_capacity, bool remap, bool create_run) {
        gm_alloc_config_t c;
        gm_provider_t p;
        gm_heap_params_t params = {.capacity = 1 * GiB, .va_cursor = &own_cursor};
        gm_heap_t *h;

        own_cursor = 1ULL << 40;
        config_default(&c);
        c.expandable_segments = c.page_reuse = true;
        fake_init(f, fake_capacity);
        p = fake_provider(f);
        if (!remap)
                p.remap = NULL;
        if (!create_run)
                p.create_run = NULL;
        ck_assert_int_eq(gm_heap_new(&c, &p, &params, &h), 0);
        return h;
}

/* Checks, destroys, and verifies that everything came back correctly. */
static void own_heap_close(gm_heap_t *h, fake_provider_t *f) {
        ck_assert_int_eq(gm_heap_check(h), 0);
        gm_heap_destroy(h);
        ck_assert_uint_eq(f->live_handles, 0);
        ck_assert_uint_eq(f->errors, 0);
        fake_done(f);
}

/* A provider without remap(): the key is accepted, the mode says it is
 * inactive, and the heap is plain expandable (20 MiB large pages). */
START_TEST(test_reuse_needs_remap) {
        fake_provider_t f;
        gm_heap_t *h = own_heap(&f, 1 * GiB, false, true);
        gm_alloc_result_t r;
        gm_page_reuse_info_t info;

        gm_heap_page_reuse(h, &info);
        ck_assert(info.configured && !info.active);
        ck_assert_str_eq(info.inactive_reason, "the memory provider cannot move pages (no remap)");
        ck_assert_int_eq(gm_heap_alloc(h, 16 * MiB, 0, &r), 0);
        ck_assert_int_eq(gm_heap_stats(h)->reserved_bytes[GM_STAT_ALL].current, 20 * MiB);
        own_heap_close(h, &f);
}
END_TEST

/* A run of new pages is one create_run() call, all or nothing: a 32 MiB
 * block in a fresh heap is 16 pages in one call; a refused call leaves
 * nothing created and the retry ladder's second try makes the run again. */
START_TEST(test_reuse_create_run) {
        gm_alloc_result_t a, b;

        open_reuse(true, 1 * GiB);
        a = alloc_ok(32 * MiB, 0);
        ck_assert_uint_eq(F.create_runs, 1);
        ck_assert_uint_eq(F.creates, 16);
        ck_assert_uint_eq(F.run_pages_max, 16);
        F.fail_next = 1;
        b = alloc_ok(48 * MiB, 0); /* 24 pages: refused once, then made at once */
        ck_assert_uint_eq(F.create_runs, 3);
        ck_assert_uint_eq(F.creates, 16 + 24);
        ck_assert_uint_eq(F.live_bytes, 80 * MiB);
        ck_assert_int_eq(STATS->num_alloc_retries, 1);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 80 * MiB);
        ck_assert_int_eq(STATS->num_device_alloc, 2); /* one segment_map per block */
        free_ok(a.block_id, false);
        free_ok(b.block_id, false);
}
END_TEST

/* Without create_run() the heap makes one create() per page and, when one
 * fails, gives back those it made (the last with whole_segment): at a 20
 * MiB device a 32 MiB block makes 10 pages, fails on the 11th, and nothing
 * stays (the fake ledger checks every release's whole_segment flag). */
START_TEST(test_reuse_create_per_page) {
        fake_provider_t f;
        gm_heap_t *h = own_heap(&f, 20 * MiB, true, false);
        gm_alloc_result_t r;

        ck_assert_int_eq(gm_heap_alloc(h, 32 * MiB, 0, &r), -ENOMEM);
        ck_assert_int_eq(gm_heap_check(h), 0);
        ck_assert_uint_eq(f.create_runs, 0);
        ck_assert_uint_eq(f.creates, 2 * 10); /* the ladder's retry makes the same 10 */
        ck_assert_uint_eq(f.releases, 2 * 10);
        ck_assert_uint_eq(f.whole_releases, 2);
        ck_assert_uint_eq(f.live_handles, 0);
        ck_assert_int_eq(gm_heap_stats(h)->reserved_bytes[GM_STAT_ALL].current, 0);
        ck_assert_int_eq(gm_heap_alloc(h, 16 * MiB, 0, &r), 0);
        ck_assert_uint_eq(f.live_bytes, 16 * MiB);
        own_heap_close(h, &f);
}
END_TEST

/* A daemon restart rebuilds a page-reuse heap from its client's ledger: a
 * large-pool segment of three 2 MiB pages with a live 3 MiB block at 0 must
 * be restored into the large pool (named, since the page size no longer
 * tells); a 2 MiB request then takes [3,5) of it, and the moved-page checks
 * (unique handles) hold. */
START_TEST(test_reuse_restore_pool) {
        gm_alloc_config_t c;
        gm_provider_t p;
        uint64_t cursor = 1ULL << 40;
        gm_heap_params_t params = {.capacity = 1 * GiB, .va_cursor = &cursor};
        gm_restore_piece_t pieces[3];
        fake_provider_t f;
        gm_heap_t *h;
        gm_alloc_result_t r;

        config_default(&c);
        c.expandable_segments = c.page_reuse = true;
        fake_init(&f, 1 * GiB);
        p = fake_provider(&f);
        for (int i = 0; i < 3; i++) {
                pieces[i] = (gm_restore_piece_t){.offset = (uint64_t) i * 2 * MiB, .size = 2 * MiB};
                ck_assert_int_eq(p.create(&f, 7, 64 * MiB, pieces[i].offset, 2 * MiB, &pieces[i].handle), 0);
        }
        ck_assert_int_eq(gm_heap_new(&c, &p, &params, &h), 0);
        ck_assert_int_eq(gm_heap_restore_segment_in_pool(h, 7, 64 * MiB, 0, false, pieces, 3), 0);
        ck_assert_int_eq(gm_heap_restore_block(h, 100, 7, 0, 3 * MiB, 3 * MiB, false), 0);
        ck_assert_int_eq(gm_heap_restore_finish(h), 0);
        ck_assert_int_eq(gm_heap_stats(h)->reserved_bytes[GM_STAT_LARGE_POOL].current, 6 * MiB);
        ck_assert_int_eq(gm_heap_stats(h)->reserved_bytes[GM_STAT_SMALL_POOL].current, 0);
        ck_assert_int_eq(gm_heap_alloc(h, 2 * MiB, 0, &r), 0);
        ck_assert_uint_eq(r.segment_id, 7);
        ck_assert_uint_eq(r.offset, 3 * MiB);
        ck_assert_int_eq(gm_heap_check(h), 0);
        /* a small-pool segment never has 20 MiB pages */
        pieces[0].size = 20 * MiB;
        ck_assert_int_eq(gm_heap_restore_segment_in_pool(h, 8, 80 * MiB, 0, true, pieces, 1), -EINVAL);
        gm_heap_destroy(h);
        ck_assert_uint_eq(f.live_handles, 0);
        ck_assert_uint_eq(f.errors, 0);
        fake_done(&f);
}
END_TEST

/* 8 x 16 MiB, every other one freed, then 4 x 32 MiB (plain expandable: 260
 * MiB reserved for 192 MiB live). With 2 MiB pages each 16 MiB block maps 8
 * pages exactly: 128 MiB. Holes at [0,16) [32,48) [64,80) [96,112). The
 * first 32 MiB goes to the tail at 128 and takes the top pages of the two
 * lowest holes (smallest first, then lowest address); the second goes to 160
 * and takes the other two; the holes are now unmapped and too small, so the
 * third and fourth map 16 new pages each at 192 and 224: 192 MiB. */
START_TEST(test_reuse_pattern) {
        gm_alloc_result_t r[8], big[4];
        gm_page_reuse_info_t info;
        ranges_t w;

        open_reuse(true, 1 * GiB);
        for (int i = 0; i < 8; i++) {
                r[i] = alloc_ok(16 * MiB, 0);
                ck_assert_uint_eq(r[i].offset, (uint64_t) i * 16 * MiB);
        }
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 128 * MiB);
        ck_assert_uint_eq(F.creates, 64);
        ck_assert_uint_eq(F.create_runs, 8); /* each block's 8 new pages in one call */
        for (int i = 0; i < 8; i += 2)
                free_ok(r[i].block_id, false);
        for (int i = 0; i < 4; i++) {
                big[i] = alloc_ok(32 * MiB, 0);
                ck_assert_uint_eq(big[i].offset, 128 * MiB + (uint64_t) i * 32 * MiB);
                ck_assert_uint_eq(big[i].segment_id, r[0].segment_id);
                ck_assert_int_eq(RESERVED(GM_STAT_ALL), i < 2 ? 128 * MiB : (128 + (i - 1) * 32) * MiB);
        }
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 192 * MiB);
        ck_assert_int_eq(STATS->reserved_bytes[GM_STAT_ALL].peak, 192 * MiB);
        ck_assert_int_eq(STATS->requested_bytes[GM_STAT_ALL].peak, 192 * MiB);
        ck_assert_uint_eq(F.remaps, 32);
        ck_assert_uint_eq(F.remap_calls, 4); /* one call per hole: a run of 8 pages */
        ck_assert_uint_eq(F.creates, 96);
        ck_assert_uint_eq(F.create_runs, 10); /* the last two blocks' 16 new pages: a call each */
        ck_assert_uint_eq(F.run_pages_max, 16);
        ck_assert_uint_eq(F.live_bytes, 192 * MiB);
        ck_assert_uint_eq(F.stream_queries, 1); /* one question answers both moves' holes */
        ck_assert_uint_eq(F.traces[GM_TRACE_SEGMENT_MAP], 12);
        ck_assert_uint_eq(F.traces[GM_TRACE_SEGMENT_UNMAP], 4);
        ck_assert_int_eq(STATS->num_device_alloc, 12);
        ck_assert_int_eq(STATS->num_device_free, 4);
        ck_assert_int_eq(STATS->num_alloc_retries, 0);
        info = reuse_info();
        ck_assert_uint_eq(info.pages_moved, 32);
        ck_assert_uint_eq(info.ranges_moved, 4);
        ck_assert_uint_eq(info.allocs_with_moves, 2);
        ck_assert_uint_eq(info.refused_busy, 0);
        /* mapped: [16,32) [48,64) [80,96) and [112,256) */
        w = walk_ranges();
        ck_assert_uint_eq(w.n, 4);
        ck_assert_uint_eq(w.bytes, 192 * MiB);
        for (int i = 1; i < 8; i += 2)
                free_ok(r[i].block_id, false);
        for (int i = 0; i < 4; i++)
                free_ok(big[i].block_id, false);
        ck_assert_uint_eq(gm_heap_release_cached(H), 192 * MiB);
        ck_assert_uint_eq(F.live_handles, 0);
        ck_assert_uint_eq(F.releases, 96);
        ck_assert_uint_eq(F.release_runs, 4); /* one call per mapped range */
        ck_assert_uint_eq(F.whole_releases, 1);
}
END_TEST

/* A sawtooth: A0 = 40 MiB, then A(k) = 40 + 2k MiB is allocated before
 * A(k-1) is freed. A1 maps 21 pages at 40. A2 (44) fits no hole, goes to the
 * tail at 82 and takes all 20 pages of A0's hole plus 2 new ones. A3 (46)
 * goes to the lowest room, [0,40) unmapped + A1's [40,82): its own pages are
 * [0,23), so A1's pages [23,41) move down to [0,18) and 2 are new. Each step
 * after makes just the 2 pages of growth: reserved equals the live requested
 * bytes after every step. */
START_TEST(test_reuse_sawtooth) {
        static const uint64_t offsets[] = {0, 40 * MiB, 82 * MiB, 0, 46 * MiB, 94 * MiB};
        gm_alloc_result_t prev, cur_block;
        uint64_t live;

        open_reuse(true, 4 * GiB);
        prev = alloc_ok(40 * MiB, 0);
        for (unsigned k = 1; k <= 24; k++) {
                cur_block = alloc_ok((40 + 2 * k) * MiB, 0);
                live = (40 + 2 * (k - 1) + 40 + 2 * k) * MiB;
                ck_assert_int_eq(RESERVED(GM_STAT_ALL), live);
                ck_assert_int_eq(cur(STATS->requested_bytes, GM_STAT_ALL), live);
                if (k < sizeof(offsets) / sizeof(offsets[0]))
                        ck_assert_uint_eq(cur_block.offset, offsets[k]);
                free_ok(prev.block_id, false);
                prev = cur_block;
        }
        ck_assert_int_eq(STATS->reserved_bytes[GM_STAT_ALL].peak, STATS->requested_bytes[GM_STAT_ALL].peak);
        /* A2 moved 20 pages, A3 18, then every step all but the 2 new ones */
        ck_assert_uint_eq(F.creates, 20 + 21 + 23 * 2);
        ck_assert_uint_eq(reuse_info().allocs_with_moves, 23);
        ck_assert_uint_eq(reuse_info().pages_moved, F.remaps);
        ck_assert_int_eq(STATS->num_alloc_retries, 0);
}
END_TEST

/* Moves wait for the device: a hole freed on a busy stream keeps its pages
 * (new memory instead) while the fence marked after its free is pending,
 * asked once per allocation; once the device passes that fence the pages
 * move although the stream is still busy; a block whose free is still
 * deferred never gives pages; the same stream's own holes obey the same
 * rule. Free counts: x is free 1, z free 2, big free 3. */
START_TEST(test_reuse_busy_stream) {
        gm_alloc_result_t x, y, z, z2, z3, d, big;

        open_reuse(true, 1 * GiB);
        x = alloc_ok(16 * MiB, 1); /* stream 1's segment, 8 pages */
        y = alloc_ok(16 * MiB, 0); /* stream 0's segment */
        ck_assert_uint_ne(x.segment_id, y.segment_id);
        free_ok(x.block_id, false);
        F.busy[1] = true;
        z = alloc_ok(16 * MiB, 0); /* fence 1 marked on stream 1, pending: 8 new pages */
        ck_assert_uint_eq(z.offset, 16 * MiB);
        ck_assert_uint_eq(F.remaps, 0);
        ck_assert_uint_eq(F.stream_queries, 1);
        ck_assert_uint_eq(F.fence_marked[1], 1);
        ck_assert_uint_eq(reuse_info().refused_busy, 1);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 48 * MiB);
        z2 = alloc_ok(16 * MiB, 0); /* a new allocation asks again: still pending */
        ck_assert_uint_eq(F.stream_queries, 2);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 64 * MiB);
        fake_progress(&F, 1);       /* the device passes fence 1; stream 1 stays busy */
        z3 = alloc_ok(16 * MiB, 0); /* x's 8 pages move to [48,64) */
        ck_assert_uint_eq(z3.offset, 48 * MiB);
        ck_assert_uint_eq(F.stream_queries, 3);
        ck_assert_uint_eq(F.remaps, 8);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 64 * MiB);
        ck_assert_int_eq(RESERVED(GM_STAT_LARGE_POOL), 64 * MiB);
        ck_assert_uint_eq(walk_ranges().n, 1); /* stream 1's segment had no other page: gone */

        /* a deferred free holds its pages until its completion */
        free_ok(z.block_id, true); /* [16,32) pending */
        d = alloc_ok(16 * MiB, 0);
        ck_assert_uint_eq(d.offset, 64 * MiB);
        ck_assert_uint_eq(F.remaps, 8);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 80 * MiB);
        ck_assert_int_eq(gm_heap_free_completed(H, z.block_id), 0);
        CHECK_HEAP();

        /* stream 0 busy: its own hole [16,32) (free 2) stays too */
        F.busy[0] = true;
        big = alloc_ok(32 * MiB, 0); /* the 16 MiB hole fits no 32: 16 new pages at 80 */
        ck_assert_uint_eq(big.offset, 80 * MiB);
        ck_assert_uint_eq(F.remaps, 8);
        ck_assert_uint_eq(F.fence_marked[0], 2);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 112 * MiB);
        F.busy[0] = false;
        free_ok(big.block_id, false);
        big = alloc_ok(48 * MiB, 0); /* fence 3 completes: [80,112) grows by the 8 pages of [16,32) */
        ck_assert_uint_eq(big.offset, 80 * MiB);
        ck_assert_uint_eq(F.remaps, 16);
        ck_assert_uint_eq(F.fence_marked[0], 3);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 112 * MiB);
        (void) y;
        (void) z2;
}
END_TEST

/* Pages move across pools and streams: a whole free small-pool page (two
 * freed 1 MiB blocks) serves a large request on another stream, and the
 * small segment, left without pages, disappears (from_segment_empty). */
START_TEST(test_reuse_cross_pool) {
        gm_alloc_result_t a, b, l;

        open_reuse(true, 1 * GiB);
        a = alloc_ok(MiB, 0);
        b = alloc_ok(MiB, 0);
        ck_assert_int_eq(RESERVED(GM_STAT_SMALL_POOL), 2 * MiB);
        free_ok(a.block_id, false);
        free_ok(b.block_id, false);
        l = alloc_ok(4 * MiB, 5);
        ck_assert_uint_eq(F.remaps, 1);
        ck_assert_uint_eq(F.creates, 2);
        ck_assert_int_eq(RESERVED(GM_STAT_SMALL_POOL), 0);
        ck_assert_int_eq(RESERVED(GM_STAT_LARGE_POOL), 4 * MiB);
        ck_assert_uint_eq(walk_ranges().n, 1);
        ck_assert_uint_eq(F.whole_releases, 0);
        (void) l;
}
END_TEST

/* A failing remap() leaves the page in its hole and new memory is made. */
START_TEST(test_reuse_remap_failure) {
        gm_alloc_result_t a, b, c;

        open_reuse(true, 1 * GiB);
        a = alloc_ok(4 * MiB, 0);
        b = alloc_ok(4 * MiB, 0);
        free_ok(a.block_id, false); /* hole [0,4): 2 pages */
        F.remap_fail_next = 1;
        c = alloc_ok(6 * MiB, 0); /* fits no hole: 3 new pages at the tail */
        ck_assert_uint_eq(c.offset, 8 * MiB);
        ck_assert_uint_eq(F.remaps, 0);
        ck_assert_uint_eq(reuse_info().remap_failures, 1);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 14 * MiB);
        ck_assert_uint_eq(gm_heap_largest_free(H), 4 * MiB);
        (void) b;
}
END_TEST

/* A run that fails part way: its first pages moved (the provider says how
 * many), the rest stay in the hole and the shortfall is new memory. */
START_TEST(test_reuse_remap_partial_run) {
        gm_alloc_result_t a, b, c;

        open_reuse(true, 1 * GiB);
        a = alloc_ok(8 * MiB, 0);
        b = alloc_ok(8 * MiB, 0);
        free_ok(a.block_id, false); /* hole [0,8): 4 pages */
        F.remap_fail_at = F.remaps + 3;
        c = alloc_ok(10 * MiB, 0); /* 5 pages at the tail: the hole's top 4 asked in one call, 2 move */
        ck_assert_uint_eq(c.offset, 16 * MiB);
        ck_assert_uint_eq(F.remap_calls, 1);
        ck_assert_uint_eq(F.remaps, 2);
        ck_assert_uint_eq(reuse_info().pages_moved, 2);
        ck_assert_uint_eq(reuse_info().remap_failures, 1);
        ck_assert_uint_eq(F.creates, 8 + 3);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 22 * MiB);
        ck_assert_uint_eq(F.live_bytes, 22 * MiB);
        ck_assert_uint_eq(gm_heap_largest_free(H), 4 * MiB); /* the hole's mapped bottom half */
        ck_assert_int_eq(gm_heap_check(H), 0);
        (void) b;
}
END_TEST

/* Limits see only the memory created: at a 128 MiB quota the two moving
 * 32 MiB requests of the pattern succeed without new memory; the third
 * needs 32 MiB more and is refused with -EDQUOT after the retry ladder (the
 * holes are already unmapped: nothing to release). */
START_TEST(test_reuse_limit) {
        gm_alloc_result_t r[8], res;

        open_reuse(true, 1 * GiB);
        gm_heap_set_limit(H, 128 * MiB, NULL);
        for (int i = 0; i < 8; i++)
                r[i] = alloc_ok(16 * MiB, 0);
        for (int i = 0; i < 8; i += 2)
                free_ok(r[i].block_id, false);
        alloc_ok(32 * MiB, 0);
        alloc_ok(32 * MiB, 0);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 128 * MiB);
        ck_assert_int_eq(gm_heap_alloc(H, 32 * MiB, 0, &res), -EDQUOT);
        CHECK_HEAP();
        ck_assert_int_eq(STATS->num_ooms, 1);
        ck_assert_int_eq(STATS->num_alloc_retries, 1);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 128 * MiB);
}
END_TEST

/* Half moved, half new: after the pattern's frees an 80 MiB request takes
 * the holes' 32 pages and needs 8 more, 144 MiB in all. At a 144 MiB quota it
 * fits; at 136 MiB it is refused, and the pages it had moved go back to the
 * provider (as the retry ladder's release would have done): 64 MiB left. */
static void half_moved(uint64_t limit) {
        gm_alloc_result_t r[8];

        open_reuse(true, 1 * GiB);
        gm_heap_set_limit(H, limit, NULL);
        for (int i = 0; i < 8; i++)
                r[i] = alloc_ok(16 * MiB, 0);
        for (int i = 0; i < 8; i += 2)
                free_ok(r[i].block_id, false);
}

START_TEST(test_reuse_limit_counts_moved) {
        gm_alloc_result_t res;

        half_moved(144 * MiB);
        res = alloc_ok(80 * MiB, 0);
        ck_assert_uint_eq(res.offset, 128 * MiB);
        ck_assert_uint_eq(F.remaps, 32);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 144 * MiB);
        half_moved(136 * MiB);
        ck_assert_int_eq(gm_heap_alloc(H, 80 * MiB, 0, &res), -EDQUOT);
        CHECK_HEAP();
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 64 * MiB);
        ck_assert_uint_eq(F.live_bytes, 64 * MiB);
        ck_assert_int_eq(STATS->num_ooms, 1);
}
END_TEST

static char *snapshot_json(const gm_alloc_config_t *config) {
        gm_snapshot_heap_t heap = {.heap = H, .pid = 1, .tenant = "t", .session_id = 1};
        gm_snapshot_source_t src = {.heaps = &heap, .n_heaps = 1, .config = config};
        char *buf, *json;
        size_t len;

        ck_assert_int_eq(gm_snapshot_write(&src, GM_SNAPSHOT_JSON, &buf, &len), 0);
        json = strndup(buf, len);
        free(buf);
        return json;
}

static unsigned count_of(const char *haystack, const char *needle) {
        unsigned n = 0;

        for (const char *p = haystack; (p = strstr(p, needle)); p++)
                n++;
        return n;
}

/* After moves a snapshot shows one segment per contiguous mapped range, and
 * allocator_settings name the extension only when it is set. */
START_TEST(test_reuse_snapshot) {
        gm_alloc_config_t c;
        gm_alloc_result_t r[8];
        char *json;

        config_default(&c);
        json = (open_reuse(false, 1 * GiB), snapshot_json(&c));
        ck_assert_ptr_null(strstr(json, "gpumemd_page_reuse"));
        free(json);
        open_reuse(true, 1 * GiB);
        c.expandable_segments = c.page_reuse = true;
        for (int i = 0; i < 8; i++)
                r[i] = alloc_ok(16 * MiB, 0);
        for (int i = 0; i < 8; i += 2)
                free_ok(r[i].block_id, false);
        alloc_ok(32 * MiB, 0); /* takes the pages of [0,16) and [32,48) */
        json = snapshot_json(&c);
        ck_assert_ptr_nonnull(strstr(json, "\"gpumemd_page_reuse\":true"));
        /* mapped: [16,32) and [48,160) (blocks 3, 5, 7, holes [64,80) [96,112), the new block) */
        ck_assert_uint_eq(count_of(json, "\"is_expandable\":true"), 2);
        ck_assert_uint_eq(count_of(json, "\"state\":\"active_allocated\""), 5);
        free(json);
}
END_TEST

/* An allocation that starts in a free mapped block and maps the unmapped
 * pages after it: that block lies in the target, so it gives no pages (one
 * new page, no move); when mapping the rest fails it is free again, in the
 * free set, so the retry's release of cached memory gives its pages back
 * (the heap check after every step sees it in the set). x (4 MiB) and y (3
 * MiB, 1 MiB of its second page left over) are freed into one 8 MiB free
 * mapped block before the unmapped rest of the segment. */
START_TEST(test_reuse_start_in_free_block) {
        gm_alloc_result_t x, y, a;

        for (int fail = 0; fail < 2; fail++) {
                open_reuse(true, 1 * GiB);
                x = alloc_ok(4 * MiB, 0);
                y = alloc_ok(3 * MiB, 0);
                ck_assert_uint_eq(y.offset, 4 * MiB);
                free_ok(x.block_id, false);
                free_ok(y.block_id, false);
                ck_assert_int_eq(RESERVED(GM_STAT_ALL), 8 * MiB);
                F.fail_next = (unsigned) fail;
                a = alloc_ok(10 * MiB, 0);
                ck_assert_uint_eq(reuse_info().pages_moved, 0);
                ck_assert_int_eq(RESERVED(GM_STAT_ALL), 10 * MiB);
                ck_assert_uint_eq(F.live_bytes, 10 * MiB);
                if (!fail) {
                        ck_assert_uint_eq(a.offset, 0); /* 4 pages kept, 1 new */
                        ck_assert_uint_eq(F.creates, 5);
                        ck_assert_int_eq(STATS->num_alloc_retries, 0);
                } else {
                        ck_assert_uint_eq(F.creates, 4 + 5); /* the 4 went back, 5 new in a new segment */
                        ck_assert_int_eq(STATS->num_alloc_retries, 1);
                        ck_assert_int_eq(STATS->num_device_free, 1);
                }
                free_ok(a.block_id, false);
                heap_close();
        }
}
END_TEST

static void setup(void) {
        H = NULL;
}

static void teardown(void) {
        if (H)
                heap_close();
}

Suite *allocator_reuse_suite(void) {
        Suite *s = suite_create("allocator_reuse");
        TCase *tc = tcase_create("page_reuse");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_reuse_conf);
        tcase_add_test(tc, test_reuse_needs_remap);
        tcase_add_test(tc, test_reuse_create_run);
        tcase_add_test(tc, test_reuse_create_per_page);
        tcase_add_test(tc, test_reuse_pattern);
        tcase_add_test(tc, test_reuse_sawtooth);
        tcase_add_test(tc, test_reuse_busy_stream);
        tcase_add_test(tc, test_reuse_cross_pool);
        tcase_add_test(tc, test_reuse_remap_failure);
        tcase_add_test(tc, test_reuse_remap_partial_run);
        tcase_add_test(tc, test_reuse_limit);
        tcase_add_test(tc, test_reuse_limit_counts_moved);
        tcase_add_test(tc, test_reuse_snapshot);
        tcase_add_test(tc, test_reuse_restore_pool);
        tcase_add_test(tc, test_reuse_start_in_free_block);
        suite_add_tcase(s, tc);
        return s;
}
