/* Check suite for allocator/pickle.c and allocator/snapshot.c.
 *
 * Encoder: byte-exact pickles for small values (hand-assembled from
 * Lib/pickletools.py's opcode table), JSON escaping and number forms, misuse
 * detection. Snapshots: real heaps on a small private provider whose trace
 * callback feeds a gm_history_t, written in both formats to temp files and
 * judged by tests/lib/snapshot_check.py (schema, states, sums, cumulative and
 * non-overlapping addresses, MemoryViz.js opcodes, traces agreeing with
 * blocks, both formats holding the same tree). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkostemp */
#endif
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "allocator.h"
#include "history.h"
#include "pickle.h"
#include "snapshot.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)

#define ck_assert_ok(expr)                                                     \
        do {                                                                   \
                int _r = (expr);                                               \
                ck_assert_msg(_r >= 0, "%s failed: %s", #expr, strerror(-_r)); \
        } while (0)

/* Finishes w and compares the whole output with a string literal. */
#define ck_assert_output(w, lit) assert_output((w), (lit), sizeof(lit) - 1)

static void assert_output(gm_pickler_t *w, const char *expected, size_t n) {
        char *buf = NULL;
        size_t len = 0;
        ck_assert_ok(gm_pickler_finish(w, &buf, &len));
        ck_assert_uint_eq(len, n);
        ck_assert_mem_eq(buf, expected, n);
        free(buf);
}

static gm_pickler_t new_writer(gm_pickle_format_t format) {
        gm_pickler_t w;
        ck_assert_ok(gm_pickler_init(&w, format));
        return w;
}

/* ---- pickle encoder ---- */

START_TEST(test_pickle_ints) {
        static const struct {
                int64_t v;
                const char *bytes;
                size_t len;
        } cases[] = {
#define C(v, lit) {(v), (lit), sizeof(lit) - 1}
                C(0, "\x80\x02K\x00."),
                C(255, "\x80\x02K\xff."),
                C(256, "\x80\x02M\x00\x01."),
                C(65535, "\x80\x02M\xff\xff."),
                C(65536, "\x80\x02J\x00\x00\x01\x00."),
                C(-1, "\x80\x02J\xff\xff\xff\xff."),
                C(INT32_MAX, "\x80\x02J\xff\xff\xff\x7f."),
                C(INT32_MIN, "\x80\x02J\x00\x00\x00\x80."),
                C(2147483648LL, "\x80\x02\x8a\x05\x00\x00\x00\x80\x00."),
                C(-2147483649LL, "\x80\x02\x8a\x05\xff\xff\xff\x7f\xff."),
                C(1LL << 53, "\x80\x02\x8a\x07\x00\x00\x00\x00\x00\x00\x20."),
                C(INT64_MAX, "\x80\x02\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f."),
                C(INT64_MIN, "\x80\x02\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80."),
#undef C
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                gm_pickler_t w = new_writer(GM_PICKLE_FORMAT_PICKLE);
                gm_pickler_int(&w, cases[i].v);
                assert_output(&w, cases[i].bytes, cases[i].len);
        }

        gm_pickler_t w = new_writer(GM_PICKLE_FORMAT_PICKLE);
        gm_pickler_uint(&w, 1ull << 63); /* needs a ninth byte to stay positive */
        ck_assert_output(&w, "\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00.");
        w = new_writer(GM_PICKLE_FORMAT_PICKLE);
        gm_pickler_uint(&w, UINT64_MAX);
        ck_assert_output(&w, "\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.");
        w = new_writer(GM_PICKLE_FORMAT_PICKLE);
        gm_pickler_uint(&w, 300);
        ck_assert_output(&w, "\x80\x02M\x2c\x01.");
}
END_TEST

START_TEST(test_pickle_scalars) {
        gm_pickler_t w = new_writer(GM_PICKLE_FORMAT_PICKLE);
        gm_pickler_begin_list(&w);
        gm_pickler_double(&w, 1.5);
        gm_pickler_double(&w, -2.0);
        gm_pickler_bool(&w, true);
        gm_pickler_bool(&w, false);
        gm_pickler_none(&w);
        gm_pickler_end_list(&w);
        ck_assert_output(&w, "\x80\x02]("
                             "G\x3f\xf8\x00\x00\x00\x00\x00\x00"
                             "G\xc0\x00\x00\x00\x00\x00\x00\x00"
                             "\x88\x89Ne.");
}
END_TEST

START_TEST(test_pickle_containers) {
        gm_pickler_t w = new_writer(GM_PICKLE_FORMAT_PICKLE);
        gm_pickler_begin_dict(&w);
        gm_pickler_key(&w, "a");
        gm_pickler_begin_list(&w);
        gm_pickler_int(&w, 1);
        gm_pickler_bool(&w, true);
        gm_pickler_none(&w);
        gm_pickler_end_list(&w);
        gm_pickler_key(&w, "b");
        gm_pickler_begin_dict(&w); /* empty: the MARK is dropped again */
        gm_pickler_end_dict(&w);
        gm_pickler_key(&w, "c");
        gm_pickler_begin_list(&w);
        gm_pickler_end_list(&w);
        gm_pickler_end_dict(&w);
        ck_assert_output(&w, "\x80\x02}("
                             "X\x01\x00\x00\x00"
                             "a"
                             "](K\x01\x88Ne"
                             "X\x01\x00\x00\x00"
                             "b"
                             "}"
                             "X\x01\x00\x00\x00"
                             "c"
                             "]"
                             "u.");

        w = new_writer(GM_PICKLE_FORMAT_PICKLE);
        gm_pickler_begin_dict(&w);
        gm_pickler_end_dict(&w);
        ck_assert_output(&w, "\x80\x02}.");
}
END_TEST

START_TEST(test_pickle_tuples) {
        static const int64_t v[] = {1, 2, 3, 4};
        gm_pickler_t w = new_writer(GM_PICKLE_FORMAT_PICKLE);
        gm_pickler_begin_list(&w);
        for (size_t n = 0; n <= 4; n++)
                gm_pickler_tuple_ints(&w, v, n);
        gm_pickler_end_list(&w);
        ck_assert_output(&w, "\x80\x02]("
                             ")"
                             "K\x01\x85"
                             "K\x01K\x02\x86"
                             "K\x01K\x02K\x03\x87"
                             "(K\x01K\x02K\x03K\x04t"
                             "e.");
}
END_TEST

START_TEST(test_pickle_strings) {
        gm_pickler_t w = new_writer(GM_PICKLE_FORMAT_PICKLE);
        gm_pickler_begin_list(&w);
        gm_pickler_str(&w, "");
        gm_pickler_str(&w, "\xc3\xa9");         /* é stays as is */
        gm_pickler_str(&w, "\xf0\x9f\x98\x80"); /* 4-byte sequence stays */
        gm_pickler_str(&w, "a\xff");            /* invalid byte */
        gm_pickler_str(&w, "\xed\xa0\x80");     /* surrogate: 3 invalid bytes */
        gm_pickler_str(&w, "\xc0\xaf");         /* overlong '/' */
        gm_pickler_end_list(&w);
        ck_assert_output(&w, "\x80\x02]("
                             "X\x00\x00\x00\x00"
                             "X\x02\x00\x00\x00\xc3\xa9"
                             "X\x04\x00\x00\x00\xf0\x9f\x98\x80"
                             "X\x04\x00\x00\x00"
                             "a\xef\xbf\xbd"
                             "X\x09\x00\x00\x00\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                             "X\x06\x00\x00\x00\xef\xbf\xbd\xef\xbf\xbd"
                             "e.");
}
END_TEST

/* 100000 ints grow the buffer many times; the size follows from the opcode
 * widths: 256 BININT1 (2 bytes), 65280 BININT2 (3), 34464 BININT (5). */
START_TEST(test_pickle_growth) {
        gm_pickler_t w = new_writer(GM_PICKLE_FORMAT_PICKLE);
        char *buf;
        size_t len;

        gm_pickler_begin_list(&w);
        for (int64_t i = 0; i < 100000; i++)
                gm_pickler_int(&w, i);
        gm_pickler_end_list(&w);
        ck_assert_ok(gm_pickler_finish(&w, &buf, &len));
        ck_assert_uint_eq(len, 2 + 2 + 256 * 2 + 65280 * 3 + 34464 * 5 + 1 + 1);
        ck_assert_mem_eq(buf + len - 7,
                         "J\x9f\x86\x01\x00"
                         "e.",
                         7); /* 99999 = 0x1869f */
        free(buf);
}
END_TEST

/* ---- JSON encoder ---- */

START_TEST(test_json_values) {
        static const int64_t pool[2] = {0, 0};
        gm_pickler_t w = new_writer(GM_PICKLE_FORMAT_JSON);
        volatile double tenth = 0.1, fifth = 0.2;

        gm_pickler_begin_dict(&w);
        gm_pickler_key(&w, "q\"\\\n\t\r\b\f\x01\x1f/\x7f");
        gm_pickler_str(&w, "\xc3\xa9 \xff");
        gm_pickler_key(&w, "f");
        gm_pickler_begin_list(&w);
        gm_pickler_double(&w, 1.5);
        gm_pickler_double(&w, tenth);
        gm_pickler_double(&w, tenth + fifth);
        gm_pickler_double(&w, 1.0);
        gm_pickler_double(&w, 0.0);
        gm_pickler_double(&w, 1e300);
        gm_pickler_double(&w, NAN);
        gm_pickler_double(&w, -INFINITY);
        gm_pickler_end_list(&w);
        gm_pickler_key(&w, "t");
        gm_pickler_tuple_ints(&w, pool, 2);
        gm_pickler_key(&w, "i");
        gm_pickler_begin_list(&w);
        gm_pickler_int(&w, -1);
        gm_pickler_int(&w, INT64_MIN);
        gm_pickler_uint(&w, UINT64_MAX);
        gm_pickler_end_list(&w);
        gm_pickler_key(&w, "b");
        gm_pickler_begin_list(&w);
        gm_pickler_bool(&w, true);
        gm_pickler_bool(&w, false);
        gm_pickler_none(&w);
        gm_pickler_end_list(&w);
        gm_pickler_key(&w, "e");
        gm_pickler_begin_dict(&w);
        gm_pickler_end_dict(&w);
        gm_pickler_key(&w, "l");
        gm_pickler_begin_list(&w);
        gm_pickler_end_list(&w);
        gm_pickler_end_dict(&w);
        ck_assert_output(&w, "{\"q\\\"\\\\\\n\\t\\r\\b\\f\\u0001\\u001f/\x7f\":\"\xc3\xa9 \xef\xbf\xbd\","
                             "\"f\":[1.5,0.1,0.30000000000000004,1.0,0.0,1e+300,null,null],"
                             "\"t\":[0,0],"
                             "\"i\":[-1,-9223372036854775808,18446744073709551615],"
                             "\"b\":[true,false,null],"
                             "\"e\":{},\"l\":[]}\n");
}
END_TEST

/* ---- misuse ---- */

static int finish_error(gm_pickler_t *w) {
        char *buf = NULL;
        size_t len = 0;
        int r = gm_pickler_finish(w, &buf, &len);
        ck_assert_ptr_null(buf); /* out-parameters untouched on failure */
        ck_assert_uint_eq(len, 0);
        return r;
}

START_TEST(test_misuse) {
        for (int f = 0; f < _GM_PICKLE_FORMAT_MAX; f++) {
                gm_pickler_t w = new_writer(f);
                ck_assert_int_eq(finish_error(&w), -EINVAL); /* no value at all */

                w = new_writer(f);
                gm_pickler_begin_list(&w);
                gm_pickler_key(&w, "k"); /* key outside a dict */
                gm_pickler_end_list(&w);
                ck_assert_int_eq(finish_error(&w), -EINVAL);

                w = new_writer(f);
                gm_pickler_begin_dict(&w);
                gm_pickler_int(&w, 1); /* value where a key is due */
                gm_pickler_end_dict(&w);
                ck_assert_int_eq(finish_error(&w), -EINVAL);

                w = new_writer(f);
                gm_pickler_begin_dict(&w);
                gm_pickler_key(&w, "a");
                gm_pickler_key(&w, "b"); /* two keys in a row */
                ck_assert_int_eq(finish_error(&w), -EINVAL);

                w = new_writer(f);
                gm_pickler_begin_dict(&w);
                gm_pickler_key(&w, "a");
                gm_pickler_end_dict(&w); /* key without value */
                ck_assert_int_eq(finish_error(&w), -EINVAL);

                w = new_writer(f);
                gm_pickler_begin_dict(&w);
                gm_pickler_end_list(&w); /* wrong closer */
                ck_assert_int_eq(finish_error(&w), -EINVAL);

                w = new_writer(f);
                gm_pickler_int(&w, 1);
                gm_pickler_int(&w, 2); /* second root */
                ck_assert_int_eq(finish_error(&w), -EINVAL);

                w = new_writer(f);
                gm_pickler_begin_list(&w); /* never closed */
                gm_pickler_str(&w, "x");
                ck_assert_int_eq(finish_error(&w), -EINVAL);

                /* Depth: 32 nested lists are fine, the 33rd is refused. */
                w = new_writer(f);
                for (int i = 0; i < GM_PICKLER_MAX_DEPTH; i++)
                        gm_pickler_begin_list(&w);
                for (int i = 0; i < GM_PICKLER_MAX_DEPTH; i++)
                        gm_pickler_end_list(&w);
                char *buf;
                size_t len;
                ck_assert_ok(gm_pickler_finish(&w, &buf, &len));
                free(buf);
                w = new_writer(f);
                for (int i = 0; i <= GM_PICKLER_MAX_DEPTH; i++)
                        gm_pickler_begin_list(&w);
                for (int i = 0; i <= GM_PICKLER_MAX_DEPTH; i++)
                        gm_pickler_end_list(&w);
                ck_assert_int_eq(finish_error(&w), -EINVAL);

                /* gm_pickler_done() frees an abandoned writer. */
                w = new_writer(f);
                gm_pickler_begin_list(&w);
                gm_pickler_str(&w, "abandoned");
                gm_pickler_done(&w);
                gm_pickler_done(NULL);
        }
        gm_pickler_t w;
        ck_assert_int_eq(gm_pickler_init(&w, _GM_PICKLE_FORMAT_MAX), -EINVAL);
}
END_TEST

/* ---- snapshots of real heaps ---- */

/* A provider on nothing: it hands out handles and records every trace event
 * into the device history, with a two-frame stack on allocations. */
typedef struct session {
        gm_heap_t *heap;
        uint32_t pid;
        uint64_t live_bytes; /* created minus released */
        uint64_t next_handle;
        gm_history_t *history;
        uint64_t *clock_us;
        gm_snapshot_piece_t pieces[64]; /* what a daemon would have granted, sorted */
        size_t n_pieces;
} session_t;

static int cmp_piece(const void *a, const void *b) {
        const gm_snapshot_piece_t *x = a, *y = b;
        if (x->segment_id != y->segment_id)
                return (x->segment_id > y->segment_id) - (x->segment_id < y->segment_id);
        return (x->offset > y->offset) - (x->offset < y->offset);
}

static int fake_create(void *userdata, uint64_t segment_id, uint64_t segment_va_size, uint64_t offset, uint64_t size,
                       uint64_t *ret_handle) {
        session_t *s = userdata;
        s->live_bytes += size;
        *ret_handle = ++s->next_handle;
        ck_assert_uint_lt(s->n_pieces, 64);
        s->pieces[s->n_pieces++] = (gm_snapshot_piece_t){
                .segment_id = segment_id, .va_size = segment_va_size, .offset = offset, .size = size};
        qsort(s->pieces, s->n_pieces, sizeof(s->pieces[0]), cmp_piece);
        return 0;
}

static void fake_release(void *userdata, uint64_t segment_id, uint64_t offset, uint64_t size, uint64_t handle,
                         bool whole_segment) {
        session_t *s = userdata;
        ck_assert_uint_ge(s->live_bytes, size);
        s->live_bytes -= size;
        for (size_t i = 0; i < s->n_pieces; i++)
                if (s->pieces[i].segment_id == segment_id && s->pieces[i].offset == offset) {
                        memmove(&s->pieces[i], &s->pieces[i + 1], (s->n_pieces - i - 1) * sizeof(s->pieces[0]));
                        s->n_pieces--;
                        break;
                }
}

static void fake_trace(void *userdata, int action, uint64_t addr, uint64_t size, uint64_t stream) {
        static const gm_frame_t stack[] = {
                {.filename = "model.py", .line = 7, .name = "forward"},
                {.filename = "train \"loop\".py", .line = 42, .name = "step"},
        };
        session_t *s = userdata;
        gm_history_entry_t e = {
                .action = action,
                .addr = addr,
                .size = size,
                .stream = stream,
                .time_us = ++*s->clock_us,
                .pid = s->pid,
        };
        ck_assert_ok(gm_history_record(s->history, &e, stack, action == GM_TRACE_ALLOC ? 2 : 0));
}

typedef struct fixture {
        gm_alloc_config_t conf_a, conf_b;
        uint64_t va_cursor, clock_us;
        gm_history_t *history;
        session_t a, b;
        gm_snapshot_heap_t heaps[2];
} fixture_t;

static fixture_t fx;

static void start_session(session_t *s, uint32_t pid, const gm_alloc_config_t *conf) {
        const gm_provider_t provider = {
                .create = fake_create,
                .release = fake_release,
                .trace = fake_trace,
                .userdata = s,
        };
        const gm_heap_params_t params = {.capacity = 1 * GiB, .va_cursor = &fx.va_cursor};
        *s = (session_t){.pid = pid, .history = fx.history, .clock_us = &fx.clock_us};
        ck_assert_ok(gm_heap_new(conf, &provider, &params, &s->heap));
}

static void setup(void) {
        char err[256];
        memset(&fx, 0, sizeof(fx));
        fx.va_cursor = 1 * GiB;
        fx.clock_us = 1700000000000000ull;
        ck_assert_ok(gm_history_new(1000, 1 * MiB, &fx.history));
        ck_assert_ok(gm_alloc_config_parse("max_split_size_mb:128,roundup_power2_divisions:4", &fx.conf_a, err,
                                           sizeof(err)));
        ck_assert_ok(gm_alloc_config_parse("expandable_segments:True", &fx.conf_b, err, sizeof(err)));
        start_session(&fx.a, 100, &fx.conf_a);
        start_session(&fx.b, 200, &fx.conf_b);
        fx.heaps[0] = (gm_snapshot_heap_t){.heap = fx.a.heap, .pid = 100, .tenant = "alice", .session_id = 1};
        fx.heaps[1] = (gm_snapshot_heap_t){
                .heap = fx.b.heap,
                .pid = 200,
                .tenant = "bob \"the builder\"\n",
                .session_id = 2,
        };
}

static void teardown(void) {
        ck_assert_int_eq(gm_heap_check(fx.a.heap), 0);
        ck_assert_int_eq(gm_heap_check(fx.b.heap), 0);
        fx.a.heap = gm_heap_destroy(fx.a.heap);
        fx.b.heap = gm_heap_destroy(fx.b.heap);
        ck_assert_uint_eq(fx.a.live_bytes, 0);
        ck_assert_uint_eq(fx.b.live_bytes, 0);
        fx.history = gm_history_free(fx.history);
}

static uint64_t alloc(session_t *s, uint64_t size) {
        gm_alloc_result_t res;
        ck_assert_ok(gm_heap_alloc(s->heap, size, 0, &res));
        return res.block_id;
}

static void save(const char *buf, size_t len, char *path_template) {
        int fd = mkostemp(path_template, O_CLOEXEC);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, buf, len), (ssize_t) len);
        ck_assert_int_eq(close(fd), 0);
}

/* Runs snapshot_check.py on a snapshot held in memory; returns its exit code. */
static int check_snapshot(const char *buf, size_t len, const char *args) {
        char path[] = "/tmp/gm-snapshot-XXXXXX";
        char cmd[2048];

        save(buf, len, path);
        snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' %s", GM_PYTHON3, GM_SNAPSHOT_CHECK, path, args);
        int status = system(cmd);
        unlink(path);
        ck_assert_msg(WIFEXITED(status), "checker did not exit normally");
        return WEXITSTATUS(status);
}

static void write_snapshot(const gm_snapshot_source_t *src, gm_snapshot_format_t fmt, char **ret_buf, size_t *ret_len) {
        ck_assert_ok(gm_snapshot_write(src, fmt, ret_buf, ret_len));
}

/* The scenario: interleaved allocations of a native session (a) and an
 * expandable one (b) from one address space, an immediate free, a deferred
 * free still pending (its id is returned), and an oom entry. */
static uint64_t run_scenario(void) {
        uint64_t a_tiny = alloc(&fx.a, 1000);      /* 2 MiB small segment */
        uint64_t b_5m = alloc(&fx.b, 5 * MiB);     /* maps one 20 MiB page */
        alloc(&fx.a, 3 * MiB);                     /* 20 MiB large segment, split */
        uint64_t a_600k = alloc(&fx.a, 600 * KiB); /* from the small segment */
        alloc(&fx.b, 30 * MiB);                    /* maps a second page */
        ck_assert_ok(gm_heap_free(fx.a.heap, a_tiny, false));
        ck_assert_ok(gm_heap_free(fx.a.heap, a_600k, true));
        ck_assert_ok(gm_heap_free(fx.b.heap, b_5m, false));
        gm_history_entry_t oom = {
                .action = GM_TRACE_OOM, .addr = 4 * MiB, .size = 64 * MiB, .time_us = ++fx.clock_us, .pid = 200};
        ck_assert_ok(gm_history_record(fx.history, &oom, NULL, 0));
        return a_600k;
}

#define A_ACTIONS_1 "segment_alloc,alloc"
#define B_ACTIONS_1 "segment_map,alloc"
#define A_ACTIONS_2 "segment_alloc,alloc,alloc"
#define B_ACTIONS_2 "segment_map,alloc"
#define FREES "free_requested,free_completed,free_requested,free_requested,free_completed"

START_TEST(test_snapshot_both_formats) {
        run_scenario();
        gm_snapshot_source_t src = {
                .device = 1,
                .heaps = fx.heaps,
                .n_heaps = 2,
                .history = fx.history,
                .config = &fx.conf_b,
        };
        char *pkl, *json;
        size_t pkl_len, json_len;
        write_snapshot(&src, GM_SNAPSHOT_PICKLE, &pkl, &pkl_len);
        write_snapshot(&src, GM_SNAPSHOT_JSON, &json, &json_len);
        ck_assert_mem_eq(pkl, "\x80\x02}(", 4);
        ck_assert_int_eq(pkl[pkl_len - 1], '.');
        ck_assert_int_eq(json[0], '{');

        /* a: small [1024 inactive][640 KiB pending][rest inactive], large [3 MiB][17 MiB];
         * b: one mapped 40 MiB range [5 MiB inactive][30 MiB][5 MiB inactive]. */
        char json_path[] = "/tmp/gm-snapshot-json-XXXXXX";
        save(json, json_len, json_path);
        char args[1024];
        snprintf(args, sizeof(args),
                 "--device 1 --segments 3 --expandable --states active_allocated,active_pending_free,inactive "
                 "--actions %s,%s,%s,%s,%s,oom --same-as '%s'",
                 A_ACTIONS_1, B_ACTIONS_1, A_ACTIONS_2, B_ACTIONS_2, FREES, json_path);
        ck_assert_int_eq(check_snapshot(pkl, pkl_len, args), 0);
        ck_assert_int_eq(check_snapshot(json, json_len, args), 0);
        unlink(json_path);

        /* Figures the checker cannot know, read from the JSON text. */
        json[json_len - 1] = '\0';
        ck_assert_ptr_nonnull(strstr(json, "\"tenant\":\"bob \\\"the builder\\\"\\n\""));
        /* 600 KiB with roundup_power2_divisions:4 rounds to a 128 KiB step: 640 KiB. */
        ck_assert_ptr_nonnull(strstr(json, "\"size\":655360,\"requested_size\":614400,"
                                           "\"state\":\"active_pending_free\""));
        ck_assert_ptr_nonnull(strstr(json, "\"total_size\":41943040,"));
        ck_assert_ptr_nonnull(strstr(json, "\"PYTORCH_CUDA_ALLOC_CONF\":\"expandable_segments:True\","
                                           "\"max_split_size\":-1,"));
        ck_assert_ptr_nonnull(strstr(json, "\"expandable_segments\":true,"));
        ck_assert_ptr_nonnull(strstr(json, "{\"action\":\"oom\",\"device_free\":4194304,\"size\":67108864,"));
        ck_assert_ptr_nonnull(strstr(json, "\"frames\":[{\"filename\":\"model.py\",\"line\":7,\"name\":\"forward\"},"
                                           "{\"filename\":\"train \\\"loop\\\".py\",\"line\":42,\"name\":\"step\"}],"
                                           "\"pid\":100}"));
        ck_assert_ptr_nonnull(strstr(json, "\"device_traces\":[[],[{"));
        free(pkl);
        free(json);
}
END_TEST

/* A tenant's own view: only its heap, only its pid's trace entries; and the
 * knobs of a native configuration. */
START_TEST(test_snapshot_tenant_view) {
        uint64_t pending = run_scenario();
        gm_snapshot_source_t src = {
                .device = 0,
                .heaps = &fx.heaps[0],
                .n_heaps = 1,
                .history = fx.history,
                .only_heap_pids = true,
                .config = &fx.conf_a,
        };
        char *buf;
        size_t len;
        write_snapshot(&src, GM_SNAPSHOT_PICKLE, &buf, &len);
        ck_assert_int_eq(check_snapshot(buf, len,
                                        "--device 0 --segments 2 --states active_pending_free "
                                        "--actions " A_ACTIONS_1 "," A_ACTIONS_2 ",free_requested,free_completed,"
                                        "free_requested"),
                         0);
        free(buf);

        write_snapshot(&src, GM_SNAPSHOT_JSON, &buf, &len);
        buf[len - 1] = '\0';
        ck_assert_ptr_null(strstr(buf, "\"pid\":200"));
        ck_assert_ptr_nonnull(strstr(buf, "\"max_split_size\":134217728,"));
        ck_assert_ptr_nonnull(strstr(buf, "\"roundup_power2_divisions\":{\"1\":4,\"2\":4,"));
        ck_assert_ptr_nonnull(strstr(buf, "\"32768\":4}"));
        ck_assert_ptr_nonnull(strstr(buf, "\"garbage_collection_threshold\":0.0,"));
        free(buf);

        /* Once the deferred free completes, its block is inactive and merged. */
        ck_assert_ok(gm_heap_free_completed(fx.a.heap, pending));
        write_snapshot(&src, GM_SNAPSHOT_PICKLE, &buf, &len);
        ck_assert_int_eq(check_snapshot(buf, len,
                                        "--device 0 --segments 2 --states active_allocated,inactive "
                                        "--actions " A_ACTIONS_1 "," A_ACTIONS_2 ",free_requested,free_completed,"
                                        "free_requested,free_completed"),
                         0);
        free(buf);
        write_snapshot(&src, GM_SNAPSHOT_JSON, &buf, &len);
        buf[len - 1] = '\0';
        ck_assert_ptr_null(strstr(buf, "active_pending_free"));
        ck_assert_ptr_nonnull(strstr(buf, "\"total_size\":2097152,\"allocated_size\":0,\"active_size\":0,"));
        free(buf);
}
END_TEST

START_TEST(test_snapshot_empty) {
        gm_snapshot_source_t src = {.device = 0, .heaps = fx.heaps, .n_heaps = 2, .config = &fx.conf_a};
        char *buf;
        size_t len;
        for (int f = GM_SNAPSHOT_PICKLE; f <= GM_SNAPSHOT_JSON; f++) {
                write_snapshot(&src, f, &buf, &len);
                ck_assert_int_eq(check_snapshot(buf, len, "--device 0 --segments 0 --actions ''"), 0);
                free(buf);
        }
        write_snapshot(&src, GM_SNAPSHOT_PICKLE_1_13, &buf, &len);
        ck_assert_int_eq(check_snapshot(buf, len, "--legacy --segments 0"), 0);
        free(buf);
}
END_TEST

START_TEST(test_snapshot_bad_source) {
        gm_snapshot_source_t src = {.device = 0, .heaps = fx.heaps, .n_heaps = 2, .config = &fx.conf_a};
        gm_snapshot_heap_t no_heap = {.heap = NULL};
        char *buf = NULL;
        size_t len = 0;

        ck_assert_int_eq(gm_snapshot_write(&src, _GM_SNAPSHOT_FORMAT_MAX, &buf, &len), -EINVAL);
        src.config = NULL;
        ck_assert_int_eq(gm_snapshot_write(&src, GM_SNAPSHOT_JSON, &buf, &len), -EINVAL);
        src.config = &fx.conf_a;
        src.device = -1;
        ck_assert_int_eq(gm_snapshot_write(&src, GM_SNAPSHOT_JSON, &buf, &len), -EINVAL);
        src.device = 0;
        src.heaps = &no_heap;
        src.n_heaps = 1;
        ck_assert_int_eq(gm_snapshot_write(&src, GM_SNAPSHOT_JSON, &buf, &len), -EINVAL);
        ck_assert_ptr_null(buf);
        ck_assert_uint_eq(len, 0);
}
END_TEST

/* The scenario's heaps and history collected by hand, with command names. */
static gm_snapshot_data_t *collect_scenario(void) {
        gm_snapshot_data_t *d;
        uint32_t owner;
        ck_assert_ok(gm_snapshot_data_new(&d));
        const char *commands[2] = {"train.py", "serve\tx"};
        for (int i = 0; i < 2; i++) {
                gm_snapshot_owner_t o = {.pid = fx.heaps[i].pid,
                                         .tenant = fx.heaps[i].tenant,
                                         .command = commands[i],
                                         .session_id = fx.heaps[i].session_id};
                ck_assert_ok(gm_snapshot_data_add_owner(d, &o, &owner));
                ck_assert_uint_eq(owner, (uint32_t) i);
                ck_assert_ok(gm_snapshot_data_add_heap(d, owner, fx.heaps[i].heap));
        }
        ck_assert_ok(gm_snapshot_data_add_history(d, fx.history, false));
        return d;
}

static void render(gm_snapshot_data_t *d, const gm_snapshot_options_t *o, char **ret_buf, size_t *ret_len) {
        ck_assert_ok(gm_snapshot_render(d, o, ret_buf, ret_len));
}

/* A caller's view holds the entries of the sessions in it: an entry that
 * names its session is matched by that session, not by its pid, so an ended
 * session of another tenant whose pid a session in view now has stays out
 * (issue 25: pids are reused); an entry naming no session (a client's own
 * ring) is matched by its pid. */
START_TEST(test_history_in_view_by_session) {
        gm_history_t *h;
        ck_assert_ok(gm_history_new(16, 0, &h));
        const gm_history_entry_t
                ended_other = {.action = GM_TRACE_ALLOC, .addr = 1 << 20, .size = 512, .pid = 4242, .session_id = 7},
                mine = {.action = GM_TRACE_ALLOC, .addr = 2 << 20, .size = 1024, .pid = 4242, .session_id = 9},
                no_session = {.action = GM_TRACE_ALLOC, .addr = 3 << 20, .size = 2048, .pid = 4242},
                elsewhere = {.action = GM_TRACE_ALLOC, .addr = 4 << 20, .size = 4096, .pid = 5000, .session_id = 10};
        ck_assert_ok(gm_history_record(h, &ended_other, NULL, 0));
        ck_assert_ok(gm_history_record(h, &mine, NULL, 0));
        ck_assert_ok(gm_history_record(h, &no_session, NULL, 0));
        ck_assert_ok(gm_history_record(h, &elsewhere, NULL, 0));
        gm_snapshot_data_t *d;
        uint32_t owner;
        ck_assert_ok(gm_snapshot_data_new(&d));
        gm_snapshot_owner_t o = {.pid = 4242, .tenant = "b", .session_id = 9};
        ck_assert_ok(gm_snapshot_data_add_owner(d, &o, &owner));
        ck_assert_ok(gm_snapshot_data_add_history(d, h, true));
        ck_assert_uint_eq(gm_snapshot_data_traces(d), 2); /* mine and no_session */
        gm_alloc_config_t conf;
        char err[128];
        ck_assert_ok(gm_alloc_config_parse("", &conf, err, sizeof(err)));
        char *buf;
        size_t len;
        render(d, &(gm_snapshot_options_t){.format = GM_SNAPSHOT_JSON, .config = &conf}, &buf, &len);
        char *text = strndup(buf, len); /* the rendering is not a C string */
        free(buf);
        buf = text;
        ck_assert_msg(!strstr(buf, "\"size\":512,") && strstr(buf, "\"size\":1024,") && strstr(buf, "\"size\":2048,") &&
                              !strstr(buf, "\"size\":4096,"),
                      "%s", buf);
        free(buf);
        gm_snapshot_data_free(d);
        gm_history_free(h);
}
END_TEST

/* Device scale: each block's and trace entry's category (its tenant, or
 * "pid N"), the closing `snapshot` entry in "unknown" (MemoryViz.js throws
 * when categories lack it), and the process named in the outermost frame. */
START_TEST(test_snapshot_categories) {
        run_scenario();
        gm_snapshot_data_t *d = collect_scenario();
        ck_assert_uint_eq(gm_snapshot_data_traces(d), gm_history_len(fx.history));
        gm_snapshot_options_t o = {.device = 1,
                                   .format = GM_SNAPSHOT_JSON,
                                   .category = GM_SNAPSHOT_CATEGORY_TENANT,
                                   .process_frames = true,
                                   .now_us = 1800000000000000ull,
                                   .config = &fx.conf_b};
        char *buf, args[1024];
        size_t len;
        snprintf(args, sizeof(args), "--device 1 --segments 3 --categories --actions %s,%s,%s,%s,%s,oom,snapshot",
                 A_ACTIONS_1, B_ACTIONS_1, A_ACTIONS_2, B_ACTIONS_2, FREES);
        for (int f = GM_SNAPSHOT_PICKLE; f <= GM_SNAPSHOT_JSON; f++) {
                o.format = f;
                render(d, &o, &buf, &len);
                ck_assert_int_eq(check_snapshot(buf, len, args), 0);
                free(buf);
        }
        render(d, &o, &buf, &len);
        buf[len - 1] = '\0';
        ck_assert_ptr_nonnull(strstr(buf, "\"state\":\"active_pending_free\",\"frames\":[{\"filename\":\"model.py\""));
        ck_assert_ptr_nonnull(strstr(buf, "{\"filename\":\"[pid 100 train.py]\",\"line\":0,"
                                          "\"name\":\"tenant alice, session 1\"}],\"category\":\"alice\"}"));
        ck_assert_ptr_nonnull(strstr(buf, "\"category\":\"bob \\\"the builder\\\"\\n\""));
        ck_assert_ptr_nonnull(strstr(buf, "{\"action\":\"snapshot\",\"addr\":0,\"size\":"));
        ck_assert_ptr_nonnull(strstr(buf, "\"time_us\":1800000000000000,\"category\":\"unknown\",\"pid\":0}"));
        free(buf);
        o.category = GM_SNAPSHOT_CATEGORY_PID;
        render(d, &o, &buf, &len);
        buf[len - 1] = '\0';
        ck_assert_ptr_nonnull(strstr(buf, "\"category\":\"pid 200\""));
        ck_assert_ptr_null(strstr(buf, "\"category\":\"alice\""));
        free(buf);
        /* Without categories nothing of it is written. */
        o.category = GM_SNAPSHOT_CATEGORY_NONE;
        o.process_frames = false;
        render(d, &o, &buf, &len);
        buf[len - 1] = '\0';
        ck_assert_ptr_null(strstr(buf, "category"));
        ck_assert_ptr_null(strstr(buf, "[pid "));
        free(buf);
        gm_snapshot_data_free(d);
}
END_TEST

/* PyTorch 1.13 (Debian's python3-torch): a bare list of segments whose live
 * blocks keep their stack in `history`; torch.cuda._memory_viz reads it
 * when a PyTorch 1.x is installed. */
START_TEST(test_snapshot_pickle_1_13) {
        run_scenario();
        gm_snapshot_source_t src = {
                .device = 0, .heaps = fx.heaps, .n_heaps = 2, .history = fx.history, .config = &fx.conf_b};
        char *buf;
        size_t len;
        write_snapshot(&src, GM_SNAPSHOT_PICKLE_1_13, &buf, &len);
        ck_assert_mem_eq(buf, "\x80\x02](", 4);
        ck_assert_int_eq(check_snapshot(buf, len, "--legacy --segments 3"), 0);
        free(buf);
        gm_snapshot_data_t *d = collect_scenario();
        gm_snapshot_options_t o = {.format = GM_SNAPSHOT_PICKLE_1_13, .process_frames = true, .config = &fx.conf_b};
        render(d, &o, &buf, &len);
        ck_assert_int_eq(check_snapshot(buf, len, "--legacy --segments 3"), 0);
        free(buf);
        gm_snapshot_data_free(d);
}
END_TEST

/* A session whose blocks are not known (it did not answer in time): its
 * segments as one marked block each; segments added by hand are checked,
 * overlaps refused, and the output limit holds. */
START_TEST(test_snapshot_blocks_unknown_and_limits) {
        run_scenario();
        gm_snapshot_data_t *d = collect_scenario();
        uint32_t silent;
        gm_snapshot_owner_t o = {
                .pid = 300, .tenant = "carol", .command = "stuck", .session_id = 3, .blocks_unknown = true};
        ck_assert_ok(gm_snapshot_data_add_owner(d, &o, &silent));
        gm_segment_info_t seg = {.addr = 8 * GiB, .size = 4 * MiB};
        gm_block_info_t whole = {
                .addr = 8 * GiB, .size = 4 * MiB, .requested_size = 4 * MiB, .state = GM_BLOCK_ACTIVE_ALLOCATED};
        gm_block_info_t gap[2] = {{.addr = 8 * GiB, .size = 1 * MiB}, {.addr = 8 * GiB + 2 * MiB, .size = 2 * MiB}};
        ck_assert_int_eq(gm_snapshot_data_add_segment(d, silent, &seg, gap, 2), -EINVAL);
        ck_assert_int_eq(gm_snapshot_data_add_segment(d, silent + 1, &seg, &whole, 1), -EINVAL);
        ck_assert_ok(gm_snapshot_data_add_segment(d, silent, &seg, &whole, 1));
        size_t blocks = gm_snapshot_data_blocks(d);
        gm_snapshot_options_t opts = {.device = 1,
                                      .format = GM_SNAPSHOT_JSON,
                                      .category = GM_SNAPSHOT_CATEGORY_PID,
                                      .process_frames = true,
                                      .config = &fx.conf_b};
        char *buf = NULL;
        size_t len = 0;
        render(d, &opts, &buf, &len);
        ck_assert_int_eq(check_snapshot(buf, len, "--device 1 --segments 4 --categories"), 0);
        buf[len - 1] = '\0';
        ck_assert_ptr_nonnull(strstr(buf, "\"session_id\":3,\"gpumemd_blocks_unknown\":true}"));
        ck_assert_ptr_nonnull(strstr(buf, "[pid 300 stuck, blocks unknown: no answer in time]"));
        free(buf);
        opts.max_bytes = len - 1;
        buf = NULL;
        ck_assert_int_eq(gm_snapshot_render(d, &opts, &buf, &len), -EFBIG);
        ck_assert_ptr_null(buf);
        /* Two segments over one range: refused, or the viewers' replay breaks. */
        gm_segment_info_t over = {.addr = 8 * GiB + 2 * MiB, .size = 4 * MiB};
        gm_block_info_t over_block = {.addr = over.addr, .size = over.size, .requested_size = 1};
        ck_assert_ok(gm_snapshot_data_add_segment(d, silent, &over, &over_block, 1));
        ck_assert_uint_eq(gm_snapshot_data_blocks(d), blocks + 1);
        opts.max_bytes = 0;
        ck_assert_int_eq(gm_snapshot_render(d, &opts, &buf, &len), -EINVAL);
        gm_snapshot_data_free(d);
}
END_TEST

/* Shared objects: one segment each, once, from GM_SNAPSHOT_SHARED_BASE up
 * on addresses of their own, with their mappers, in every format. */
START_TEST(test_snapshot_shared_objects) {
        run_scenario();
        gm_snapshot_data_t *d = collect_scenario();
        const gm_snapshot_mapper_t mappers[] = {{.pid = 100, .session_id = 1, .tenant = "alice"},
                                                {.pid = 200, .session_id = 2, .tenant = "bob"}};
        gm_snapshot_shared_t w = {.name = "model/w",
                                  .version = 3,
                                  .tenant = "alice",
                                  .state = "published",
                                  .size = 6 * MiB,
                                  .mappers = mappers,
                                  .n_mappers = 2};
        ck_assert_ok(gm_snapshot_data_add_shared(d, &w));
        w = (gm_snapshot_shared_t){.name = "kv", .version = 1, .tenant = "bob", .state = "withdrawn", .size = 1000};
        ck_assert_ok(gm_snapshot_data_add_shared(d, &w));
        w.size = 0;
        ck_assert_int_eq(gm_snapshot_data_add_shared(d, &w), -EINVAL);
        gm_snapshot_options_t opts = {
                .format = GM_SNAPSHOT_JSON, .category = GM_SNAPSHOT_CATEGORY_TENANT, .config = &fx.conf_b};
        char *buf = NULL;
        size_t len = 0;
        render(d, &opts, &buf, &len);
        ck_assert_int_eq(check_snapshot(buf, len, "--segments 5 --categories"), 0);
        buf[len - 1] = '\0';
        char want[512];
        snprintf(want, sizeof(want), "\"address\":%llu,\"total_size\":%llu,",
                 (unsigned long long) GM_SNAPSHOT_SHARED_BASE, (unsigned long long) (6 * MiB));
        ck_assert_msg(strstr(buf, want), "%s", buf);
        snprintf(want, sizeof(want), "\"address\":%llu,\"total_size\":1000,",
                 (unsigned long long) (GM_SNAPSHOT_SHARED_BASE + 6 * MiB));
        ck_assert_msg(strstr(buf, want), "%s", buf);
        ck_assert_ptr_nonnull(
                strstr(buf, "\"gpumemd_shared\":{\"name\":\"model/w\",\"version\":3,\"tenant\":\"alice\","
                            "\"state\":\"published\",\"mappers\":[{\"pid\":100,\"session_id\":1,\"tenant\":\"alice\"},"
                            "{\"pid\":200,\"session_id\":2,\"tenant\":\"bob\"}]}"));
        ck_assert_ptr_nonnull(strstr(buf, "\"state\":\"withdrawn\",\"mappers\":[]}"));
        free(buf);
        opts = (gm_snapshot_options_t){.format = GM_SNAPSHOT_PICKLE, .process_frames = true, .config = &fx.conf_b};
        render(d, &opts, &buf, &len);
        ck_assert_int_eq(check_snapshot(buf, len, "--segments 5"), 0);
        free(buf);
        opts.format = GM_SNAPSHOT_PICKLE_1_13;
        render(d, &opts, &buf, &len);
        ck_assert_int_eq(check_snapshot(buf, len, "--legacy --segments 5"), 0);
        free(buf);
        gm_snapshot_data_free(d);
}
END_TEST

/* A local session's answer: its heap (addresses from 0, as a local heap's)
 * and its own trace ring, encoded, then decoded by the daemon's checks into
 * a device snapshot beside another session's, moved up to a window of its
 * own. Tampered answers are refused whole. */
START_TEST(test_snapshot_answer) {
        uint64_t local_cursor = 0;
        session_t c = {.pid = 300, .clock_us = &fx.clock_us};
        ck_assert_ok(gm_history_new(100, 1 * MiB, &c.history));
        const gm_provider_t provider = {
                .create = fake_create, .release = fake_release, .trace = fake_trace, .userdata = &c};
        const gm_heap_params_t params = {.capacity = 1 * GiB, .va_cursor = &local_cursor};
        ck_assert_ok(gm_heap_new(&fx.conf_b, &provider, &params, &c.heap));
        uint64_t b1 = alloc(&c, 5 * MiB), b2 = alloc(&c, 1000);
        alloc(&c, 30 * MiB);
        ck_assert_ok(gm_heap_free(c.heap, b1, false));
        ck_assert_ok(gm_heap_free(c.heap, b2, true));
        run_scenario();

        char *ans;
        size_t ans_len;
        ck_assert_ok(gm_snapshot_answer_encode(c.heap, c.history, 0, &ans, &ans_len));
        ck_assert_int_eq(gm_snapshot_answer_encode(c.heap, c.history, 64, &ans, &ans_len), -EFBIG);
        gm_snapshot_data_t *d = collect_scenario();
        uint32_t owner;
        gm_snapshot_owner_t o = {.pid = 300, .tenant = "carol", .command = "local", .session_id = 3};
        ck_assert_ok(gm_snapshot_data_add_owner(d, &o, &owner));
        gm_snapshot_answer_limits_t lim = {
                .pieces = c.pieces, .n_pieces = c.n_pieces, .max_va_span = 1ull << 40, .max_blocks = 1000, .pid = 300};
        size_t blocks = gm_snapshot_data_blocks(d), traces = gm_snapshot_data_traces(d);
        uint64_t span = 0, base = 1ull << 44;

        /* Refused whole: bad magic, truncation, pieces not granted, limits. */
        ans[0] ^= 1;
        ck_assert_int_eq(gm_snapshot_data_add_answer(d, owner, ans, ans_len, &lim, base, &span), -EBADMSG);
        ans[0] ^= 1;
        ck_assert_int_eq(gm_snapshot_data_add_answer(d, owner, ans, ans_len - 1, &lim, base, &span), -EBADMSG);
        gm_snapshot_answer_limits_t none = lim;
        none.n_pieces = 0;
        ck_assert_int_eq(gm_snapshot_data_add_answer(d, owner, ans, ans_len, &none, base, &span), -EBADMSG);
        gm_snapshot_answer_limits_t small = lim;
        small.max_blocks = 3;
        ck_assert_int_eq(gm_snapshot_data_add_answer(d, owner, ans, ans_len, &small, base, &span), -E2BIG);
        small = lim;
        small.max_va_span = 1 * MiB;
        ck_assert_int_eq(gm_snapshot_data_add_answer(d, owner, ans, ans_len, &small, base, &span), -EBADMSG);
        ck_assert_uint_eq(gm_snapshot_data_blocks(d), blocks);
        ck_assert_uint_eq(gm_snapshot_data_traces(d), traces);
        /* Random damage: refused or taken, never a crash. */
        char *bad = malloc(ans_len);
        srand(7);
        for (int i = 0; i < 3000; i++) {
                memcpy(bad, ans, ans_len);
                for (int k = 0; k < 1 + i % 4; k++)
                        bad[(size_t) rand() % ans_len] = (char) rand();
                gm_snapshot_data_t *scratch;
                ck_assert_ok(gm_snapshot_data_new(&scratch));
                uint32_t so;
                ck_assert_ok(gm_snapshot_data_add_owner(scratch, &o, &so));
                int r = gm_snapshot_data_add_answer(scratch, so, bad, ans_len, &lim, base, &span);
                ck_assert(r == 0 || r == -EBADMSG || r == -E2BIG);
                gm_snapshot_data_free(scratch);
        }
        free(bad);

        ck_assert_ok(gm_snapshot_data_add_answer(d, owner, ans, ans_len, &lim, base, &span));
        ck_assert_uint_gt(span, 30 * MiB);
        ck_assert_uint_gt(gm_snapshot_data_traces(d), traces);
        gm_snapshot_options_t opts = {.device = 0,
                                      .format = GM_SNAPSHOT_JSON,
                                      .category = GM_SNAPSHOT_CATEGORY_TENANT,
                                      .process_frames = true,
                                      .config = &fx.conf_b};
        char *buf;
        size_t len;
        render(d, &opts, &buf, &len);
        ck_assert_int_eq(check_snapshot(buf, len,
                                        "--device 0 --segments 5 --categories --expandable "
                                        "--states active_allocated,active_pending_free,inactive"),
                         0);
        buf[len - 1] = '\0';
        ck_assert_ptr_nonnull(strstr(buf, "\"address\":17592186044416,")); /* 2^44: its window */
        ck_assert_ptr_nonnull(strstr(buf, "\"category\":\"carol\""));
        free(buf);
        /* Its segments only, as when it does not answer. */
        gm_snapshot_data_t *d2;
        ck_assert_ok(gm_snapshot_data_new(&d2));
        o.blocks_unknown = true;
        ck_assert_ok(gm_snapshot_data_add_owner(d2, &o, &owner));
        ck_assert_ok(gm_snapshot_data_add_pieces(d2, owner, c.pieces, c.n_pieces, base, &span));
        ck_assert_uint_eq(span, c.live_bytes);
        render(d2, &opts, &buf, &len);
        ck_assert_int_eq(check_snapshot(buf, len, "--device 0 --segments 2 --categories"), 0);
        free(buf);
        gm_snapshot_data_free(d2);
        gm_snapshot_data_free(d);
        free(ans);
        ck_assert_ok(gm_heap_free_completed(c.heap, b2));
        ck_assert_int_eq(gm_heap_check(c.heap), 0);
        c.heap = gm_heap_destroy(c.heap);
        gm_history_free(c.history);
}
END_TEST

/* The checker must be able to say no: a segment whose blocks do not add up,
 * a state PyTorch's docs name but its code never emits, and an opcode the
 * viewer cannot read. */
START_TEST(test_checker_rejects) {
        static const char *bad_states[] = {"active_awaiting_free", "active_allocated"};
        static const uint64_t bad_sizes[] = {4096, 2048};
        static const int64_t pool[2] = {0, 0};

        for (int i = 0; i < 2; i++) {
                gm_pickler_t w = new_writer(GM_PICKLE_FORMAT_PICKLE);
                char *buf;
                size_t len;
                gm_pickler_begin_dict(&w);
                gm_pickler_key(&w, "segments");
                gm_pickler_begin_list(&w);
                gm_pickler_begin_dict(&w);
                const char *ints[] = {"device",         "address", "total_size", "allocated_size", "active_size",
                                      "requested_size", "stream",  "pid",        "session_id"};
                const uint64_t vals[] = {0, 1 * GiB, 4096, 4096, 4096, 4096, 0, 1, 1};
                for (size_t k = 0; k < 9; k++) {
                        gm_pickler_key(&w, ints[k]);
                        gm_pickler_uint(&w, vals[k]);
                }
                gm_pickler_key(&w, "segment_type");
                gm_pickler_str(&w, "small");
                gm_pickler_key(&w, "tenant");
                gm_pickler_str(&w, "t");
                gm_pickler_key(&w, "segment_pool_id");
                gm_pickler_tuple_ints(&w, pool, 2);
                gm_pickler_key(&w, "is_expandable");
                gm_pickler_bool(&w, false);
                gm_pickler_key(&w, "frames");
                gm_pickler_begin_list(&w);
                gm_pickler_end_list(&w);
                gm_pickler_key(&w, "blocks");
                gm_pickler_begin_list(&w);
                gm_pickler_begin_dict(&w);
                gm_pickler_key(&w, "address");
                gm_pickler_uint(&w, 1 * GiB);
                gm_pickler_key(&w, "size");
                gm_pickler_uint(&w, bad_sizes[i]);
                gm_pickler_key(&w, "requested_size");
                gm_pickler_uint(&w, 2048);
                gm_pickler_key(&w, "state");
                gm_pickler_str(&w, bad_states[i]);
                gm_pickler_key(&w, "frames");
                gm_pickler_begin_list(&w);
                gm_pickler_end_list(&w);
                gm_pickler_end_dict(&w);
                gm_pickler_end_list(&w);
                gm_pickler_end_dict(&w);
                gm_pickler_end_list(&w);
                gm_pickler_end_dict(&w);
                ck_assert_ok(gm_pickler_finish(&w, &buf, &len));
                ck_assert_int_eq(check_snapshot(buf, len, "2>/dev/null"), 1);
                free(buf);
        }
        /* BINBYTES (protocol 3) is outside the viewer's set. */
        static const char bytes_pickle[] = "\x80\x03}(X\x01\x00\x00\x00"
                                           "aB\x01\x00\x00\x00"
                                           "bu.";
        ck_assert_int_eq(check_snapshot(bytes_pickle, sizeof(bytes_pickle) - 1, "2>/dev/null"), 1);
}
END_TEST

static Suite *snapshot_suite(void) {
        Suite *s = suite_create("snapshot");
        TCase *tc = tcase_create("encoder");
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_pickle_ints);
        tcase_add_test(tc, test_pickle_scalars);
        tcase_add_test(tc, test_pickle_containers);
        tcase_add_test(tc, test_pickle_tuples);
        tcase_add_test(tc, test_pickle_strings);
        tcase_add_test(tc, test_pickle_growth);
        tcase_add_test(tc, test_json_values);
        tcase_add_test(tc, test_misuse);
        suite_add_tcase(s, tc);

        tc = tcase_create("snapshot");
        tcase_set_timeout(tc, 120);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_test(tc, test_snapshot_both_formats);
        tcase_add_test(tc, test_snapshot_tenant_view);
        tcase_add_test(tc, test_snapshot_empty);
        tcase_add_test(tc, test_snapshot_bad_source);
        tcase_add_test(tc, test_checker_rejects);
        tcase_add_test(tc, test_snapshot_categories);
        tcase_add_test(tc, test_history_in_view_by_session);
        tcase_add_test(tc, test_snapshot_pickle_1_13);
        tcase_add_test(tc, test_snapshot_blocks_unknown_and_limits);
        tcase_add_test(tc, test_snapshot_shared_objects);
        tcase_add_test(tc, test_snapshot_answer);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(snapshot_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed == 0 ? 0 : 1;
}
