/* Tagged pools (gm_heap_alloc_tagged()): a tag's blocks come only from its
 * own segments, page reuse moves pages only within a tag, and the per-tag
 * statistics add up to the heap's. The heap is checked after every step
 * (alloc_ok / free_ok / tagged_ok), per-tag books included. */
#include <stdlib.h>
#include <string.h>

#include "test_allocator.h"

static gm_alloc_result_t tagged_ok(uint64_t size, uint64_t stream, unsigned tag) {
        gm_alloc_result_t res;
        int r = gm_heap_alloc_tagged(H, size, stream, tag, &res);

        ck_assert_msg(r == 0, "alloc %llu in tag %u: %s", (unsigned long long) size, tag, strerror(-r));
        CHECK_HEAP();
        return res;
}

static unsigned tag_of(uint64_t segment_id) {
        unsigned tag = 99;

        ck_assert_int_eq(gm_heap_segment_tag(H, segment_id, &tag), 0);
        return tag;
}

static void open_mode(bool expandable, bool reuse) {
        gm_alloc_config_t c;

        config_default(&c);
        c.expandable_segments = expandable;
        c.page_reuse = reuse;
        heap_open(&c, 1 * GiB);
}

/* Each walked segment's blocks lie in one tag's segment; counts segments per tag. */
typedef struct tag_walk {
        unsigned segments[GM_HEAP_MAX_TAGS];
        uint64_t active[GM_HEAP_MAX_TAGS];
} tag_walk_t;

static void on_segment(const gm_segment_info_t *seg, void *userdata) {
        tag_walk_t *w = userdata;

        ck_assert_uint_lt(seg->tag, GM_HEAP_MAX_TAGS);
        ck_assert_uint_eq(seg->tag, tag_of(seg->id));
        w->segments[seg->tag]++;
        w->active[seg->tag] += seg->active_size;
}

static tag_walk_t walk_tags(void) {
        tag_walk_t w = {0};
        gm_heap_visitor_t v = {.segment_fn = on_segment, .userdata = &w};

        gm_heap_walk(H, &v);
        return w;
}

/* Sum over tags of each tag's current figures == the heap's. */
static void check_tags_add_up(void) {
        gm_stats_t sum, t;

        memset(&sum, 0, sizeof(sum));
        for (unsigned tag = 0; tag < GM_HEAP_MAX_TAGS; tag++) {
                ck_assert_int_eq(gm_heap_tag_stats(H, tag, &t), 0);
                for (int k = 0; k < _GM_STAT_TYPE_MAX; k++) {
                        sum.allocated_bytes[k].current += t.allocated_bytes[k].current;
                        sum.reserved_bytes[k].current += t.reserved_bytes[k].current;
                        sum.active[k].current += t.active[k].current;
                        sum.allocation[k].current += t.allocation[k].current;
                        sum.segment[k].current += t.segment[k].current;
                        ck_assert_int_le(t.reserved_bytes[k].peak, STATS->reserved_bytes[k].peak);
                }
        }
        for (int k = 0; k < _GM_STAT_TYPE_MAX; k++) {
                ck_assert_int_eq(sum.allocated_bytes[k].current, STATS->allocated_bytes[k].current);
                ck_assert_int_eq(sum.reserved_bytes[k].current, STATS->reserved_bytes[k].current);
                ck_assert_int_eq(sum.active[k].current, STATS->active[k].current);
                ck_assert_int_eq(sum.allocation[k].current, STATS->allocation[k].current);
                ck_assert_int_eq(sum.segment[k].current, STATS->segment[k].current);
        }
}

/* A freed block of one tag is never handed to another: the same request in
 * another tag gets a segment of its own. */
START_TEST(test_tags_never_share_a_segment) {
        gm_alloc_result_t a, b, c, d, l5, l6;
        gm_stats_t t;

        open_mode(false, false);
        a = alloc_ok(4096, 0); /* tag 0 before any tag: the heap's own figures */
        ck_assert_int_eq(gm_heap_tag_stats(H, 0, &t), 0);
        ck_assert_int_eq(t.allocated_bytes[GM_STAT_ALL].current, 4096);
        ck_assert_int_eq(gm_heap_tag_stats(H, 3, &t), 0);
        ck_assert_int_eq(t.allocated_bytes[GM_STAT_ALL].current, 0);
        ck_assert_int_eq(gm_heap_tag_stats(H, GM_HEAP_MAX_TAGS, &t), -EINVAL);
        ck_assert_int_eq(gm_heap_alloc_tagged(H, 4096, 0, GM_HEAP_MAX_TAGS, &b), -EINVAL);
        b = tagged_ok(4096, 0, 3);
        ck_assert_uint_ne(a.segment_id, b.segment_id);
        ck_assert_uint_eq(tag_of(a.segment_id), 0);
        ck_assert_uint_eq(tag_of(b.segment_id), 3);
        ck_assert_int_eq(gm_heap_tag_stats(H, 0, &t), 0); /* tag 0's figures carried over */
        ck_assert_int_eq(t.allocated_bytes[GM_STAT_ALL].current, 4096);
        ck_assert_int_eq(t.allocation[GM_STAT_ALL].allocated, 1);
        free_ok(b.block_id, false); /* tag 3's segment is now all free */
        c = alloc_ok(4096, 0);
        ck_assert_uint_eq(c.segment_id, a.segment_id); /* split from tag 0's, not tag 3's */
        d = tagged_ok(4096, 0, 3);
        ck_assert_uint_eq(d.segment_id, b.segment_id); /* tag 3's cache serves tag 3 */
        ck_assert_int_eq(gm_heap_tag_stats(H, 3, &t), 0);
        ck_assert_int_eq(t.allocated_bytes[GM_STAT_SMALL_POOL].current, 4096);
        ck_assert_int_eq(t.reserved_bytes[GM_STAT_ALL].current, 2 * MiB);
        ck_assert_int_eq(t.allocation[GM_STAT_ALL].allocated, 2);
        check_tags_add_up();
        /* the large pool too */
        l5 = tagged_ok(12 * MiB, 1, 5);
        free_ok(l5.block_id, false);
        l6 = tagged_ok(12 * MiB, 1, 6);
        ck_assert_uint_ne(l5.segment_id, l6.segment_id);
        ck_assert_uint_eq(walk_tags().segments[5], 1);
        ck_assert_uint_eq(walk_tags().segments[6], 1);
        ck_assert_uint_eq(walk_tags().active[6], 12 * MiB);
        check_tags_add_up();
        ck_assert_uint_eq(gm_heap_largest_free(H), 12 * MiB); /* tag 5's idle segment */
        /* empty_cache() reaches every tag's pools */
        free_ok(l6.block_id, false);
        free_ok(a.block_id, false);
        free_ok(c.block_id, false);
        free_ok(d.block_id, false);
        gm_heap_release_cached(H);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 0);
        check_tags_add_up();
        ck_assert_int_eq(gm_heap_tag_stats(H, 5, &t), 0);
        ck_assert_int_eq(t.reserved_bytes[GM_STAT_ALL].peak, 12 * MiB);
}
END_TEST

/* Expandable segments with page reuse: a free page of tag 1 never moves to
 * tag 2 (tag 2 creates its own), but moves within tag 1 (another stream). */
START_TEST(test_tags_page_reuse_within_tag) {
        gm_alloc_result_t a, b, c;
        gm_page_reuse_info_t info;

        open_mode(true, true);
        a = tagged_ok(8 * MiB, 0, 1);
        free_ok(a.block_id, false);
        b = tagged_ok(8 * MiB, 7, 2);
        gm_heap_page_reuse(H, &info);
        ck_assert(info.active);
        ck_assert_uint_eq(info.pages_moved, 0);
        ck_assert_uint_ne(tag_of(b.segment_id), tag_of(a.segment_id));
        c = tagged_ok(8 * MiB, 7, 1); /* tag 1, another stream: tag 1's pages move */
        gm_heap_page_reuse(H, &info);
        ck_assert_uint_eq(info.pages_moved, 4);
        ck_assert_uint_eq(tag_of(c.segment_id), 1);
        check_tags_add_up();
        free_ok(b.block_id, false);
        free_ok(c.block_id, false);
        check_tags_add_up();
}
END_TEST

/* Random work over 4 tags, 3 streams, both pools and both modes: checked
 * after each step, the per-tag figures add up all along. */
START_TEST(test_tags_random) {
        uint64_t live[64] = {0};
        unsigned seed = 27;

        open_mode(_i & 1, _i & 2);
        for (int step = 0; step < 2000; step++) {
                unsigned k = (unsigned) rand_r(&seed) % 64;

                if (live[k]) {
                        free_ok(live[k], false);
                        live[k] = 0;
                } else {
                        uint64_t size = (uint64_t) rand_r(&seed) % (rand_r(&seed) % 4 ? 512 * 1024 : 24 * MiB) + 1;
                        live[k] = tagged_ok(size, (uint64_t) rand_r(&seed) % 3, k % 4).block_id;
                }
                if (step % 100 == 0) {
                        check_tags_add_up();
                        if (step % 500 == 0)
                                gm_heap_release_cached(H);
                }
        }
        check_tags_add_up();
        for (int k = 0; k < 64; k++)
                if (live[k])
                        free_ok(live[k], false);
}
END_TEST

/* A heap that keeps its statistics in caller storage (a local session's
 * page): the per-tag figures land in area.tags from the first tagged
 * allocation on; gm_heap_move_stats(NULL, copy) takes them along, and
 * without a copy they stop: the teardown writes nothing to the area. */
START_TEST(test_tags_stats_in_caller_storage) {
        static gm_heap_stats_area_t area;
        uint64_t cursor = 0x7f0000000000ULL;
        gm_alloc_config_t c;
        config_default(&c);
        fake_init(&F, 1 * GiB);
        gm_provider_t p = fake_provider(&F);
        gm_heap_params_t params = {
                .capacity = 1 * GiB, .va_cursor = &cursor, .stats = &area.all, .tag_stats = area.tags};
        ck_assert_int_eq(gm_heap_new(&c, &p, &params, &H), 0);
        gm_alloc_result_t a = alloc_ok(4096, 0), b = tagged_ok(3 * MiB, 0, 3);
        ck_assert_int_eq(area.tags[3].allocated_bytes[GM_STAT_ALL].current, (int64_t) b.size);
        ck_assert_int_eq(area.tags[0].allocated_bytes[GM_STAT_ALL].current, (int64_t) a.size);
        ck_assert_int_eq(area.all.allocated_bytes[GM_STAT_ALL].current, (int64_t) (a.size + b.size));
        gm_heap_move_stats(H, NULL, true); /* copied out: the area no longer moves */
        CHECK_HEAP();
        free_ok(b.block_id, false);
        CHECK_HEAP();
        ck_assert_int_eq(area.tags[3].allocated_bytes[GM_STAT_ALL].current, (int64_t) b.size);
        gm_stats_t t;
        ck_assert_int_eq(gm_heap_tag_stats(H, 3, &t), 0);
        ck_assert_int_eq(t.allocated_bytes[GM_STAT_ALL].current, 0);
        free_ok(a.block_id, false);
        H = gm_heap_destroy(H);
        memset(&area, 0, sizeof(area));
        ck_assert_int_eq(gm_heap_new(&c, &p, &params, &H), 0); /* again, then without a copy */
        b = tagged_ok(3 * MiB, 0, 2);
        ck_assert_int_eq(area.tags[2].allocated_bytes[GM_STAT_ALL].current, (int64_t) b.size);
        gm_heap_move_stats(H, NULL, false); /* the area may be gone (a fork()ed child's teardown) */
        H = gm_heap_destroy(H);             /* which then writes nothing there */
        ck_assert_int_eq(area.tags[2].allocated_bytes[GM_STAT_ALL].current, (int64_t) b.size);
        ck_assert_int_eq(area.all.allocated_bytes[GM_STAT_ALL].current, (int64_t) b.size);
        ck_assert_uint_eq(F.live_handles, 0);
        fake_done(&F);
        heap_open(&c, 1 * GiB); /* for the teardown's checks */
}
END_TEST

static void setup(void) {
}

static void teardown(void) {
        heap_close();
}

/* A held tag (a sleeping pool) allocates nothing (-EAGAIN) and keeps its
 * cache through every release, the retry ladder's too; the other tags go
 * on, and once let go it serves from its cache again. */
START_TEST(test_tags_held_sleep_alone) {
        gm_alloc_result_t kv, w, big, r;
        gm_alloc_config_t c;

        config_default(&c);
        heap_open(&c, 64 * MiB);
        kv = tagged_ok(12 * MiB, 0, 2);
        free_ok(kv.block_id, false); /* tag 2's idle cached segment */
        w = tagged_ok(12 * MiB, 0, 1);
        gm_heap_hold_tags(H, 1u << 2);
        CHECK_HEAP();
        ck_assert_uint_eq(gm_heap_held_tags(H), 1u << 2);
        ck_assert_int_eq(gm_heap_alloc_tagged(H, 4096, 0, 2, &r), -EAGAIN);
        ck_assert_int_eq(gm_heap_alloc_tagged(H, 4096, 0, 9, &r), 0); /* an unused tag is not held */
        free_ok(r.block_id, false);
        ck_assert_uint_eq(gm_heap_release_cached(H), 2 * MiB); /* tag 9's goes, tag 2's stays */
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 24 * MiB);
        /* 42 MiB fit beside tag 1's only if tag 2's cache went: the ladder leaves it be. */
        ck_assert_int_eq(gm_heap_alloc_tagged(H, 42 * MiB, 0, 1, &big), -ENOMEM);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 24 * MiB);
        CHECK_HEAP();
        gm_heap_hold_tags(H, 0);
        r = tagged_ok(12 * MiB, 0, 2);
        ck_assert_uint_eq(r.segment_id, kv.segment_id); /* its cache serves it again */
        free_ok(r.block_id, false);
        free_ok(w.block_id, false);
        gm_heap_hold_tags(H, UINT32_MAX); /* bits past the tags are dropped */
        ck_assert_uint_eq(gm_heap_held_tags(H), GM_HEAP_ALL_TAGS);
        CHECK_HEAP();
        gm_heap_hold_tags(H, 0);
        gm_heap_release_cached(H);
        ck_assert_int_eq(RESERVED(GM_STAT_ALL), 0);
}
END_TEST

Suite *allocator_tags_suite(void) {
        Suite *s = suite_create("allocator_tags");
        TCase *tc = tcase_create("tags");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_tags_never_share_a_segment);
        tcase_add_test(tc, test_tags_page_reuse_within_tag);
        tcase_add_test(tc, test_tags_held_sleep_alone);
        tcase_add_loop_test(tc, test_tags_random, 0, 4);
        tcase_add_test(tc, test_tags_stats_in_caller_storage);
        suite_add_tcase(s, tc);
        return s;
}
