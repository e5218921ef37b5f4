/* Check suite for ipc/hotmsg.c, the fixed-layout codec of the hot messages:
 * round trips (direct and through gm_msg_unpack), every truncation and
 * extension, bad magic, version, kind, flags and counts, the messages that
 * stay protobuf, and that no protobuf Envelope is taken for one. */
#include <check.h>
#include <errno.h>
#include <string.h>

#include "hotmsg.h"
#include "msg.h"

static Gpumem__Envelope alloc_env(Gpumem__Alloc *a, uint64_t *ids, size_t n_ids) {
        gpumem__alloc__init(a);
        a->size = 4096;
        a->stream = 0x1122334455667788ull;
        a->frees_fenced = true;
        a->freed_block_ids = ids;
        a->n_freed_block_ids = n_ids;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 0xfedcba9876543210ull;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
        env.alloc = a;
        return env;
}

static size_t encode(const Gpumem__Envelope *env, uint8_t *buf) {
        size_t len = 0;
        ck_assert_int_eq(gm_hotmsg_encode(env, buf, GM_HOTMSG_MAX_SIZE, &len), 0);
        ck_assert(gm_hotmsg_is(buf, len));
        return len;
}

START_TEST(test_hotmsg_alloc_roundtrip) {
        uint64_t ids[GM_CARRIED_FREES_MAX];
        for (size_t i = 0; i < GM_CARRIED_FREES_MAX; i++)
                ids[i] = 1000 + i;
        for (size_t n = 0; n <= GM_CARRIED_FREES_MAX; n += 21) {
                Gpumem__Alloc a;
                Gpumem__Envelope env = alloc_env(&a, ids, n);
                uint8_t buf[GM_HOTMSG_MAX_SIZE];
                size_t len = encode(&env, buf);
                ck_assert_uint_eq(len, GM_HOTMSG_HEADER_SIZE + 16 + 8 * n);
                Gpumem__Envelope out;
                gm_hotmsg_body_t body;
                ck_assert_int_eq(gm_hotmsg_decode(buf, len, &out, &body), 0);
                ck_assert_int_eq(out.body_case, GPUMEM__ENVELOPE__BODY_ALLOC);
                ck_assert_uint_eq(out.request_id, env.request_id);
                ck_assert_uint_eq(out.alloc->size, 4096);
                ck_assert_uint_eq(out.alloc->stream, a.stream);
                ck_assert(out.alloc->frees_fenced);
                ck_assert_uint_eq(out.alloc->n_freed_block_ids, n);
                for (size_t i = 0; i < n; i++)
                        ck_assert_uint_eq(out.alloc->freed_block_ids[i], ids[i]);
                ck_assert_str_eq(out.alloc->tag, ""); /* the default pool, as protobuf gives it */
                ck_assert_uint_eq(out.alloc->n_frames, 0);
                /* Through the envelope decoder every receiver uses, then re-encoded: the same bytes. */
                Gpumem__Envelope *heap = NULL;
                ck_assert_int_eq(gm_msg_unpack(buf, len, &heap), 0);
                uint8_t again[GM_HOTMSG_MAX_SIZE];
                ck_assert_uint_eq(encode(heap, again), len);
                ck_assert_mem_eq(again, buf, len);
                gm_msg_free(heap);
        }
}
END_TEST

START_TEST(test_hotmsg_reply_and_free_roundtrip) {
        Gpumem__AllocReply ar = GPUMEM__ALLOC_REPLY__INIT;
        ar.block_id = 7, ar.segment_id = 8, ar.offset = 1ull << 40, ar.block_size = 2 << 20;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 3;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC_REPLY;
        env.alloc_reply = &ar;
        uint8_t buf[GM_HOTMSG_MAX_SIZE];
        size_t len = encode(&env, buf);
        ck_assert_uint_eq(len, GM_HOTMSG_HEADER_SIZE + 32);
        static const uint8_t head[8] = {GM_HOTMSG_MAGIC, GM_HOTMSG_VERSION, GM_HOTMSG_KIND_ALLOC_REPLY, 0, 0, 0, 0, 0};
        ck_assert_mem_eq(buf, head, sizeof(head));
        ck_assert_uint_eq(buf[8], 3); /* little-endian */
        Gpumem__Envelope out;
        gm_hotmsg_body_t body;
        ck_assert_int_eq(gm_hotmsg_decode(buf, len, &out, &body), 0);
        ck_assert_int_eq(out.body_case, GPUMEM__ENVELOPE__BODY_ALLOC_REPLY);
        ck_assert_uint_eq(out.request_id, 3);
        ck_assert_uint_eq(out.alloc_reply->block_id, 7);
        ck_assert_uint_eq(out.alloc_reply->segment_id, 8);
        ck_assert_uint_eq(out.alloc_reply->offset, 1ull << 40);
        ck_assert_uint_eq(out.alloc_reply->block_size, 2 << 20);
        ck_assert_uint_eq(out.alloc_reply->n_new_mappings, 0);

        uint64_t more[3] = {11, 12, 13};
        Gpumem__Free f = GPUMEM__FREE__INIT;
        f.block_id = 10;
        f.more_block_ids = more;
        f.n_more_block_ids = 3;
        env.body_case = GPUMEM__ENVELOPE__BODY_FREE;
        env.free = &f;
        len = encode(&env, buf);
        ck_assert_uint_eq(len, GM_HOTMSG_HEADER_SIZE + 8 + 24);
        ck_assert_int_eq(gm_hotmsg_decode(buf, len, &out, &body), 0);
        ck_assert_int_eq(out.body_case, GPUMEM__ENVELOPE__BODY_FREE);
        ck_assert_uint_eq(out.free->block_id, 10);
        ck_assert(!out.free->deferred);
        ck_assert_uint_eq(out.free->n_more_block_ids, 3);
        ck_assert_uint_eq(out.free->more_block_ids[2], 13);

        f.deferred = true;
        f.n_more_block_ids = 0;
        len = encode(&env, buf);
        ck_assert_int_eq(gm_hotmsg_decode(buf, len, &out, &body), 0);
        ck_assert(out.free->deferred);
        ck_assert_uint_eq(out.free->n_more_block_ids, 0);
        ck_assert_ptr_null(out.free->more_block_ids);
}
END_TEST

/* Every shorter and every longer packet is refused, and nothing is written. */
START_TEST(test_hotmsg_every_truncation_refused) {
        uint64_t ids[5] = {1, 2, 3, 4, 5};
        Gpumem__Alloc a;
        Gpumem__Envelope env = alloc_env(&a, ids, 5);
        uint8_t buf[GM_HOTMSG_MAX_SIZE + 8] = {0};
        size_t len = encode(&env, buf);
        for (size_t n = 0; n < len + 8; n++) {
                if (n == len)
                        continue;
                Gpumem__Envelope out = {.request_id = 42};
                gm_hotmsg_body_t body;
                ck_assert_int_eq(gm_hotmsg_decode(buf, n, &out, &body), -EBADMSG);
                ck_assert_uint_eq(out.request_id, 42);
                Gpumem__Envelope *heap = NULL;
                ck_assert_int_eq(gm_msg_unpack(buf, n, &heap), -EBADMSG);
                ck_assert_ptr_null(heap);
        }
}
END_TEST

static void assert_refused(const uint8_t *buf, size_t len) {
        Gpumem__Envelope out;
        gm_hotmsg_body_t body;
        ck_assert_int_eq(gm_hotmsg_decode(buf, len, &out, &body), -EBADMSG);
        Gpumem__Envelope *heap = NULL;
        ck_assert_int_eq(gm_msg_unpack(buf, len, &heap), -EBADMSG);
}

START_TEST(test_hotmsg_bad_header_fields_refused) {
        uint64_t ids[2] = {1, 2};
        Gpumem__Alloc a;
        Gpumem__Envelope env = alloc_env(&a, ids, 2);
        uint8_t good[GM_HOTMSG_MAX_SIZE], buf[GM_HOTMSG_MAX_SIZE];
        size_t len = encode(&env, good);
        memcpy(buf, good, len);
        buf[0] = 0x0f; /* field 1, wire type 7: neither codec */
        assert_refused(buf, len);
        for (unsigned v = 0; v < 256; v++) {
                if (v == GM_HOTMSG_VERSION)
                        continue;
                memcpy(buf, good, len);
                buf[1] = (uint8_t) v;
                assert_refused(buf, len);
        }
        for (unsigned kind = 0; kind < 256; kind++) {
                if (kind >= GM_HOTMSG_KIND_ALLOC && kind <= GM_HOTMSG_KIND_FREE)
                        continue;
                memcpy(buf, good, len);
                buf[2] = (uint8_t) kind;
                assert_refused(buf, len);
        }
        for (unsigned bit = 1; bit < 8; bit++) { /* only bit 0 is an Alloc's flag */
                memcpy(buf, good, len);
                buf[3] = (uint8_t) (1u << bit);
                assert_refused(buf, len);
        }
        memcpy(buf, good, len);
        buf[7] = 0x80; /* n_ids 2^31 + 2 */
        assert_refused(buf, len);
}
END_TEST

/* The counts' range: ids up to GM_CARRIED_FREES_MAX, none on a reply. */
START_TEST(test_hotmsg_out_of_range_counts_refused) {
        uint8_t buf[GM_HOTMSG_MAX_SIZE + 64] = {GM_HOTMSG_MAGIC, GM_HOTMSG_VERSION, GM_HOTMSG_KIND_ALLOC};
        uint32_t n = GM_CARRIED_FREES_MAX + 1;
        memcpy(buf + 4, &n, sizeof(n));
        assert_refused(buf, GM_HOTMSG_HEADER_SIZE + 16 + 8 * n);
        buf[2] = GM_HOTMSG_KIND_FREE;
        assert_refused(buf, GM_HOTMSG_HEADER_SIZE + 8 + 8 * n);
        buf[2] = GM_HOTMSG_KIND_ALLOC_REPLY;
        n = 1;
        memcpy(buf + 4, &n, sizeof(n));
        assert_refused(buf, GM_HOTMSG_HEADER_SIZE + 32 + 8);
        buf[3] = 1; /* a reply has no flags */
        n = 0;
        memcpy(buf + 4, &n, sizeof(n));
        assert_refused(buf, GM_HOTMSG_HEADER_SIZE + 32);
        buf[3] = 0;
        Gpumem__Envelope out;
        gm_hotmsg_body_t body;
        ck_assert_int_eq(gm_hotmsg_decode(buf, GM_HOTMSG_HEADER_SIZE + 32, &out, &body), 0);
        /* The most ids the layout carries: accepted, the handlers judge the count. */
        buf[2] = GM_HOTMSG_KIND_FREE;
        n = GM_CARRIED_FREES_MAX;
        memcpy(buf + 4, &n, sizeof(n));
        ck_assert_int_eq(gm_hotmsg_decode(buf, GM_HOTMSG_HEADER_SIZE + 8 + 8 * n, &out, &body), 0);
        ck_assert_uint_eq(out.free->n_more_block_ids, GM_CARRIED_FREES_MAX);
}
END_TEST

/* What the layout does not carry whole stays protobuf. */
START_TEST(test_hotmsg_uncommon_cases_stay_protobuf) {
        uint8_t buf[GM_HOTMSG_MAX_SIZE];
        size_t len = 0;
        Gpumem__Alloc a;
        Gpumem__Envelope env = alloc_env(&a, NULL, 0);
        a.tag = "activations"; /* a tagged pool */
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, sizeof(buf), &len), -EOPNOTSUPP);
        a.tag = "";
        Gpumem__Frame frame = GPUMEM__FRAME__INIT, *frames[1] = {&frame};
        a.frames = frames; /* history's frames */
        a.n_frames = 1;
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, sizeof(buf), &len), -EOPNOTSUPP);
        a.n_frames = 0;
        Gpumem__StreamFence sf = GPUMEM__STREAM_FENCE__INIT, *sfs[1] = {&sf};
        a.fences_done = sfs;
        a.n_fences_done = 1;
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, sizeof(buf), &len), -EOPNOTSUPP);
        a.n_fences_done = 0;
        uint64_t other = 5;
        a.other_frees_fenced = &other;
        a.n_other_frees_fenced = 1;
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, sizeof(buf), &len), -EOPNOTSUPP);
        a.n_other_frees_fenced = 0;
        a.capturing = true; /* made during a stream capture: the flag is protobuf's alone */
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, sizeof(buf), &len), -EOPNOTSUPP);
        a.capturing = false;
        uint64_t many[GM_CARRIED_FREES_MAX + 1] = {0};
        a.freed_block_ids = many;
        a.n_freed_block_ids = GM_CARRIED_FREES_MAX + 1;
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, sizeof(buf), &len), -EOPNOTSUPP);
        a.n_freed_block_ids = 0;
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, GM_HOTMSG_HEADER_SIZE + 15, &len), -EMSGSIZE);
        ck_assert_uint_eq(len, 0);
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, sizeof(buf), &len), 0);

        Gpumem__AllocReply ar = GPUMEM__ALLOC_REPLY__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC_REPLY;
        env.alloc_reply = &ar;
        Gpumem__Mapping m = GPUMEM__MAPPING__INIT, *maps[1] = {&m};
        ar.new_mappings = maps; /* a reply that carries fds */
        ar.n_new_mappings = 1;
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, sizeof(buf), &len), -EOPNOTSUPP);
        ar.n_new_mappings = 0;
        Gpumem__PageMove pm = GPUMEM__PAGE_MOVE__INIT, *pms[1] = {&pm};
        ar.page_moves = pms;
        ar.n_page_moves = 1;
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, sizeof(buf), &len), -EOPNOTSUPP);
        ar.n_page_moves = 0;
        ar.fence_marks = sfs;
        ar.n_fence_marks = 1;
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, sizeof(buf), &len), -EOPNOTSUPP);

        Gpumem__Error e = GPUMEM__ERROR__INIT; /* an error */
        env.body_case = GPUMEM__ENVELOPE__BODY_ERROR;
        env.error = &e;
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, sizeof(buf), &len), -EOPNOTSUPP);
        Gpumem__Trim t = GPUMEM__TRIM__INIT; /* any other body */
        env.body_case = GPUMEM__ENVELOPE__BODY_TRIM;
        env.trim = &t;
        ck_assert_int_eq(gm_hotmsg_encode(&env, buf, sizeof(buf), &len), -EOPNOTSUPP);
}
END_TEST

/* Protobuf envelopes, packed as every sender packs them, never start with the magic. */
START_TEST(test_hotmsg_protobuf_never_taken_for_fixed) {
        uint8_t stack[GM_MSG_STACK_PACK_MAX], *data;
        size_t len;
        Gpumem__Alloc a;
        for (uint64_t id = 0; id < 300; id += 7) {
                Gpumem__Envelope env = alloc_env(&a, NULL, 0);
                env.request_id = id;
                ck_assert_int_eq(gm_msg_pack(&env, 65536, stack, sizeof(stack), &data, &len), 0);
                ck_assert(!gm_hotmsg_is(data, len));
                Gpumem__Free f = GPUMEM__FREE__INIT;
                env.body_case = GPUMEM__ENVELOPE__BODY_FREE;
                env.free = &f;
                ck_assert_int_eq(gm_msg_pack(&env, 65536, stack, sizeof(stack), &data, &len), 0);
                ck_assert(!gm_hotmsg_is(data, len));
        }
        ck_assert(!gm_hotmsg_is(stack, 0));
}
END_TEST

static Suite *hotmsg_suite(void) {
        Suite *s = suite_create("hotmsg");
        TCase *tc = tcase_create("codec");
        tcase_add_test(tc, test_hotmsg_alloc_roundtrip);
        tcase_add_test(tc, test_hotmsg_reply_and_free_roundtrip);
        tcase_add_test(tc, test_hotmsg_every_truncation_refused);
        tcase_add_test(tc, test_hotmsg_bad_header_fields_refused);
        tcase_add_test(tc, test_hotmsg_out_of_range_counts_refused);
        tcase_add_test(tc, test_hotmsg_uncommon_cases_stay_protobuf);
        tcase_add_test(tc, test_hotmsg_protobuf_never_taken_for_fixed);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(hotmsg_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed == 0 ? 0 : 1;
}
