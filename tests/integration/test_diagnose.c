/* Diagnosis: the sample and refusal rings, the rules of diagnose.c over
 * synthetic series, and each rule end to end: a real gpumemd, real client
 * processes producing each case (a growing live list, the 16 MiB / 32 MiB
 * pattern, a pending cross-stream free, an idle hoarder beside a refused
 * process), read back by the real gpumemctl diagnose, top and status. The
 * end-to-end cases run in the heap mode of $GPUMEM_HEAP (both legs). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "diagnose.h"
#include "json_read.h"
#include "samples.h"
#include "testutil.h"
#ifdef GM_TEST_FAKECUDA
#include "fakecuda_check.h"
#endif

#define MiB (1024ull * 1024ull)

/* ---- the rings ---- */

static gm_sample_t figures(uint64_t allocated, uint64_t reserved) {
        return (gm_sample_t){.allocated = allocated, .reserved = reserved};
}

START_TEST(test_ring_merges_within_period_and_extends_unchanged) {
        static gm_sample_ring_t r;
        memset(&r, 0, sizeof(r));
        gm_sample_t f = figures(10, 20);
        gm_sample_ring_record(&r, 1000, &f);
        f.allocated = 4;
        gm_sample_ring_record(&r, 1300, &f);
        f.allocated = 12;
        f.request_max = 7;
        gm_sample_ring_record(&r, 1600, &f);
        ck_assert_uint_eq(r.n, 1); /* one sample per period */
        const gm_sample_t *s = gm_sample_ring_last(&r);
        ck_assert_uint_eq(s->t_ms, 1000);
        ck_assert_uint_eq(s->until_ms, 1600);
        ck_assert_uint_eq(s->allocated, 12);
        ck_assert_uint_eq(s->allocated_min, 4);
        ck_assert_uint_eq(s->allocated_max, 12);
        ck_assert_uint_eq(s->request_max, 7);
        f.request_max = 0;
        gm_sample_ring_record(&r, 5000, &f); /* unchanged: the span grows */
        ck_assert_uint_eq(r.n, 1);
        ck_assert_uint_eq(gm_sample_ring_last(&r)->until_ms, 5000);
        f.allocated = 13;
        gm_sample_ring_record(&r, 5100, &f); /* changed after the period: a new sample */
        ck_assert_uint_eq(r.n, 2);
        ck_assert_uint_eq(gm_sample_ring_last(&r)->t_ms, 5100);
        ck_assert_uint_eq(gm_sample_ring_last(&r)->allocated_min, 13);
        ck_assert_ptr_null(gm_sample_ring_at(&r, 2));
}
END_TEST

START_TEST(test_ring_is_bounded_and_ordered) {
        static gm_sample_ring_t r;
        memset(&r, 0, sizeof(r));
        for (uint64_t i = 0; i < 3 * GM_SAMPLES_CAP + 7; i++) {
                gm_sample_t f = figures(i, 2 * i);
                gm_sample_ring_record(&r, i * GM_SAMPLE_PERIOD_MS, &f);
                ck_assert_uint_le(r.n, GM_SAMPLES_CAP);
        }
        ck_assert_uint_eq(r.n, GM_SAMPLES_CAP);
        uint64_t first = 3 * GM_SAMPLES_CAP + 7 - GM_SAMPLES_CAP;
        for (size_t i = 0; i < r.n; i++)
                ck_assert_uint_eq(gm_sample_ring_at(&r, i)->allocated, first + i);
}
END_TEST

START_TEST(test_sample_pack_round_trip) {
        gm_sample_t s = {1, 2, 3, 4, 5, 6, 100, 8, 9, 10, 11, 12, 13, 14, 15}, back;
        uint64_t v[GM_SAMPLE_FIELDS];
        gm_sample_pack(&s, v);
        gm_sample_unpack(v, GM_SAMPLE_FIELDS, &back);
        ck_assert_int_eq(memcmp(&s, &back, sizeof(s)), 0);
        gm_sample_unpack(v, 3, &back); /* an older daemon's shorter stride */
        ck_assert_uint_eq(back.allocated, 3);
        ck_assert_uint_eq(back.reserved, 0);
        /* R = A + P + I, and I = pinned + whole idle segments */
        ck_assert_uint_eq(gm_sample_inactive(&s), 100 - 3 - 6);
        ck_assert_uint_eq(gm_sample_idle_whole(&s), 100 - 3 - 6 - 8);
}
END_TEST

START_TEST(test_refusal_ring_wraps) {
        static gm_refusal_ring_t r;
        memset(&r, 0, sizeof(r));
        for (uint64_t i = 0; i < GM_REFUSALS_CAP + 5; i++)
                gm_refusal_ring_add(&r, &(gm_refusal_t){.t_ms = i, .size = i});
        ck_assert_uint_eq(r.n, GM_REFUSALS_CAP);
        ck_assert_uint_eq(r.total, GM_REFUSALS_CAP + 5);
        ck_assert_uint_eq(gm_refusal_ring_at(&r, 0)->t_ms, 5);
        ck_assert_ptr_null(gm_refusal_ring_at(&r, GM_REFUSALS_CAP));
}
END_TEST

/* ---- the rules over synthetic series ---- */

/* A series of `n` one-second samples from `f`, allocated given per sample. */
static size_t series(gm_sample_t *out, size_t n, const uint64_t *allocated, gm_sample_t f) {
        for (size_t i = 0; i < n; i++) {
                out[i] = f;
                out[i].t_ms = 1000 * (i + 1);
                out[i].until_ms = 1000 * (i + 1) + 900;
                out[i].allocated = out[i].allocated_min = out[i].allocated_max = allocated[i];
                out[i].allocations = i;
        }
        return n;
}

static bool has(const gm_diagnosis_t *d, gm_diag_kind_t kind) {
        for (size_t i = 0; i < d->n_findings; i++)
                if (d->findings[i].kind == kind)
                        return true;
        return false;
}

static gm_diagnosis_t run(const gm_sample_t *s, size_t n, uint64_t now, gm_diag_input_t extra) {
        extra.samples = s;
        extra.n_samples = n;
        extra.now_ms = now;
        if (!extra.window_ms)
                extra.window_ms = 60000;
        gm_diagnosis_t d;
        ck_assert_int_eq(gm_diagnose(&extra, &d), 0);
        return d;
}

START_TEST(test_rule_leak) {
        gm_sample_t s[8];
        uint64_t rising[8] = {1 * MiB, 2 * MiB, 3 * MiB, 4 * MiB, 5 * MiB, 6 * MiB, 7 * MiB, 8 * MiB};
        size_t n = series(s, 8, rising, figures(0, 8 * MiB));
        gm_diagnosis_t d = run(s, n, 9000, (gm_diag_input_t){0});
        ck_assert(has(&d, GM_DIAG_LEAK));
        ck_assert_str_eq(gm_diag_verdict(&d), "leak");
        ck_assert_uint_eq(d.fig.floor_early, 1 * MiB);
        ck_assert_uint_ge(d.fig.floor_late, 5 * MiB);
        /* A training loop: up and back down to its floor every step. */
        uint64_t saw[8] = {1 * MiB, 8 * MiB, 1 * MiB, 8 * MiB, 1 * MiB, 8 * MiB, 1 * MiB, 8 * MiB};
        n = series(s, 8, saw, figures(0, 8 * MiB));
        d = run(s, n, 9000, (gm_diag_input_t){0});
        ck_assert(!has(&d, GM_DIAG_LEAK));
        /* Growth below the threshold (a few KiB) is no leak. */
        uint64_t creep[8] = {100 * MiB,        100 * MiB,        100 * MiB,        100 * MiB,
                             100 * MiB + 4096, 100 * MiB + 4096, 100 * MiB + 8192, 100 * MiB + 8192};
        n = series(s, 8, creep, figures(0, 128 * MiB));
        d = run(s, n, 9000, (gm_diag_input_t){0});
        ck_assert(!has(&d, GM_DIAG_LEAK));
        /* One sample (steady the whole window): nothing to compare. */
        d = run(s, 1, 9000, (gm_diag_input_t){0});
        ck_assert(!has(&d, GM_DIAG_LEAK));
}
END_TEST

START_TEST(test_rule_fragmentation) {
        gm_sample_t s[4];
        uint64_t steady[4] = {160 * MiB, 160 * MiB, 160 * MiB, 160 * MiB};
        gm_sample_t f = figures(0, 288 * MiB);
        f.inactive_split = 128 * MiB;
        f.largest_free = 16 * MiB;
        f.request_max = 32 * MiB;
        size_t n = series(s, 4, steady, f);
        gm_diagnosis_t d = run(s, n, 5000, (gm_diag_input_t){0});
        ck_assert(has(&d, GM_DIAG_FRAGMENTATION));
        ck_assert(!has(&d, GM_DIAG_LEAK));
        ck_assert_str_eq(d.fig.frag_band, "mild");
        ck_assert_double_eq_tol(d.fig.frag_ratio, 1.0 - 160.0 / 288.0, 1e-9);
        ck_assert_ptr_nonnull(strstr(d.findings[0].summary, "smaller than recent requests of 32.00 MiB"));
        ck_assert_ptr_nonnull(strstr(d.findings[0].next, "1. expandable_segments:True"));
        ck_assert_ptr_nonnull(strstr(d.findings[0].next, "(reserved/allocated is above 1.3)"));
        /* PyTorch's order: expandable segments, max_split_size_mb, garbage collection, the viewer. */
        const char *next = d.findings[0].next;
        const char *steps[] = {"expandable", "max_split_size_mb", "garbage_collection_threshold", "memory_viz"};
        for (size_t i = 0; i + 1 < sizeof(steps) / sizeof(steps[0]); i++)
                ck_assert_msg(strstr(next, steps[i]) && strstr(next, steps[i + 1]) &&
                                      strstr(next, steps[i]) < strstr(next, steps[i + 1]),
                              "%s before %s", steps[i], steps[i + 1]);
        /* The same gap as whole idle segments is cache, not fragmentation. */
        f.inactive_split = 0;
        n = series(s, 4, steady, f);
        d = run(s, n, 5000, (gm_diag_input_t){0});
        ck_assert(!has(&d, GM_DIAG_FRAGMENTATION));
        /* Bands. */
        uint64_t most[4] = {85 * MiB, 85 * MiB, 85 * MiB, 85 * MiB};
        n = series(s, 4, most, figures(0, 100 * MiB));
        ck_assert_str_eq(run(s, n, 5000, (gm_diag_input_t){0}).fig.frag_band, "slight");
        uint64_t few[4] = {40 * MiB, 40 * MiB, 40 * MiB, 40 * MiB};
        n = series(s, 4, few, figures(0, 100 * MiB));
        ck_assert_str_eq(run(s, n, 5000, (gm_diag_input_t){0}).fig.frag_band, "severe");
        uint64_t all[4] = {97 * MiB, 97 * MiB, 97 * MiB, 97 * MiB};
        n = series(s, 4, all, figures(0, 100 * MiB));
        ck_assert_str_eq(run(s, n, 5000, (gm_diag_input_t){0}).fig.frag_band, "normal");
}
END_TEST

START_TEST(test_rule_streams) {
        gm_sample_t s[3];
        uint64_t none[3] = {0, 0, 0};
        gm_sample_t f = figures(0, 24 * MiB);
        f.pending = 24 * MiB;
        size_t n = series(s, 3, none, f);
        gm_diagnosis_t d = run(s, n, 4000, (gm_diag_input_t){0});
        ck_assert(has(&d, GM_DIAG_STREAMS));
        ck_assert(!has(&d, GM_DIAG_FRAGMENTATION));
        ck_assert_str_eq(gm_diag_verdict(&d), "streams");
        f.pending = 1 * MiB; /* small beside 24 MiB */
        f.reserved = 100 * MiB;
        n = series(s, 3, none, f);
        d = run(s, n, 4000, (gm_diag_input_t){0});
        ck_assert(!has(&d, GM_DIAG_STREAMS));
}
END_TEST

START_TEST(test_rule_idle_cache) {
        gm_sample_t s[1];
        uint64_t zero[1] = {0};
        size_t n = series(s, 1, zero, figures(0, 192 * MiB));
        /* Idle since 1 s, now 40 s: long enough; another process was refused. */
        gm_diagnosis_t d = run(s, n, 40000, (gm_diag_input_t){.others_refused = 2});
        ck_assert(has(&d, GM_DIAG_IDLE_CACHE));
        ck_assert_uint_eq(d.fig.idle_whole, 192 * MiB);
        ck_assert_ptr_nonnull(strstr(d.findings[0].next, "gpumemctl trim"));
        /* Nobody refused: idle cache is harmless. */
        d = run(s, n, 40000, (gm_diag_input_t){0});
        ck_assert_uint_eq(d.n_findings, 0);
        ck_assert_str_eq(gm_diag_verdict(&d), "healthy");
        /* Not idle long: within the window's half. */
        d = run(s, n, 3000, (gm_diag_input_t){.others_refused = 2});
        ck_assert(!has(&d, GM_DIAG_IDLE_CACHE));
        /* Reclaim already asked for it: the released part counts and is named. */
        s[0].reserved = 0;
        s[0].releasing = 192 * MiB;
        d = run(s, n, 40000, (gm_diag_input_t){.others_refused = 1});
        ck_assert(has(&d, GM_DIAG_IDLE_CACHE));
        ck_assert_ptr_nonnull(strstr(d.findings[0].summary, "reclaim already runs"));
}
END_TEST

START_TEST(test_rule_refusals_by_class) {
        gm_sample_t s[2];
        uint64_t a[2] = {10 * MiB, 10 * MiB};
        size_t n = series(s, 2, a, figures(0, 10 * MiB));
        gm_diag_input_t in = {.refused_bytes_max = 20 * MiB};
        in.refusals[0] = 3; /* quota */
        gm_diagnosis_t d = run(s, n, 3000, in);
        ck_assert(has(&d, GM_DIAG_REFUSALS));
        ck_assert_ptr_nonnull(strstr(d.findings[0].summary, "3 by the tenant's quota (quota)"));
        ck_assert_ptr_nonnull(strstr(d.findings[0].next, "only an admin can raise"));
        ck_assert_int_eq(gm_diag_refusal_class_of("external"), 4);
        ck_assert_int_eq(gm_diag_refusal_class_of("nonsense"), -1);
        /* A fragmentation refusal makes a fragmentation finding even when the ratio is low. */
        in.refusals[0] = 0;
        in.refusals[1] = 1;
        d = run(s, n, 3000, in);
        ck_assert(has(&d, GM_DIAG_FRAGMENTATION));
        ck_assert(has(&d, GM_DIAG_REFUSALS));
        gm_diag_input_t empty = {0};
        ck_assert_int_eq(gm_diagnose(&empty, &d), -EINVAL);
}
END_TEST

/* ---- the JSON reader (the snapshot gpumemctl reads back) ---- */

START_TEST(test_json_reader) {
        const char *doc =
                " {\"segments\": [{\"address\": 9007199254740993, \"blocks\": [], \"ok\": true,"
                " \"no\": false, \"x\": null, \"neg\": -1.5e2, \"s\": \"a\\\"b\\\\c\\u00e9\\ud83d\\ude00\\n\"}],"
                " \"empty\": {}} ";
        gm_json_t *v = NULL;
        ck_assert_int_eq(gm_json_parse(doc, strlen(doc), &v, NULL), 0);
        const gm_json_t *segs = gm_json_get(v, "segments");
        ck_assert_int_eq(segs->type, GM_JSON_ARRAY);
        ck_assert_uint_eq(segs->n, 1);
        const gm_json_t *seg = segs->items[0];
        ck_assert_uint_eq(gm_json_get_uint(seg, "address", 0), 9007199254740993ull); /* exact above 2^53 */
        ck_assert(gm_json_get(seg, "ok")->boolean);
        ck_assert(!gm_json_get(seg, "no")->boolean);
        ck_assert_int_eq(gm_json_get(seg, "x")->type, GM_JSON_NULL);
        ck_assert_double_eq(gm_json_get(seg, "neg")->number, -150.0);
        ck_assert_uint_eq(gm_json_get_uint(seg, "neg", 7), 7); /* not an unsigned integer */
        ck_assert_str_eq(gm_json_get_string(seg, "s", ""), "a\"b\\c\xc3\xa9\xf0\x9f\x98\x80\n");
        ck_assert_str_eq(gm_json_get_string(seg, "missing", "dflt"), "dflt");
        ck_assert_int_eq(gm_json_get(v, "empty")->n, 0);
        ck_assert_ptr_null(gm_json_get(segs, "segments")); /* not an object */
        ck_assert_ptr_null(gm_json_free(v));
        static const char *const bad[] = {"",         "{",       "[1,]",      "{\"a\" 1}", "01",      "-",
                                          "1.",       "1e",      "\"abc",     "\"a\x01\"", "[1] [2]", "tru",
                                          "{\"a\":}", "\"\\x\"", "\"\\u12\"", "nul"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                size_t at = 0;
                ck_assert_msg(gm_json_parse(bad[i], strlen(bad[i]), &v, &at) == -EINVAL, "accepted '%s'", bad[i]);
        }
        /* Nesting is bounded. */
        char deep[2 * (GM_JSON_MAX_DEPTH + 2) + 1];
        for (int i = 0; i < GM_JSON_MAX_DEPTH + 2; i++) {
                deep[i] = '[';
                deep[GM_JSON_MAX_DEPTH + 2 + i] = ']';
        }
        deep[sizeof(deep) - 1] = '\0';
        ck_assert_int_eq(gm_json_parse(deep, strlen(deep), &v, NULL), -EINVAL);
        ck_assert_int_eq(gm_json_parse(deep + 2, strlen(deep) - 4, &v, NULL), 0);
        gm_json_free(v);
}
END_TEST

/* ---- end to end ---- */

static gm_test_daemon_t daemon_;
#ifdef GM_TEST_FAKECUDA
static char pool_path[64];
#endif

static bool cuda_backend(void) {
        return strcmp(gm_test_backend(), "cuda") == 0;
}

static void start(const char *capacity, const char *config) {
#ifdef GM_TEST_FAKECUDA
        if (cuda_backend())
                gm_fake_new_pool(pool_path, sizeof(pool_path)); /* inherited by the daemon and clients */
#endif
        gm_test_daemon_start_config(&daemon_, capacity, NULL, config ? config : "");
}

static void stop(void) {
        gm_test_daemon_stop(&daemon_);
#ifdef GM_TEST_FAKECUDA
        if (cuda_backend())
                unlink(pool_path);
#endif
}

static void spawn_ready(const char *const *argv, gm_test_proc_t *p, char *line, size_t len) {
        gm_test_spawn(argv, 0, p);
        ck_assert_msg(gm_test_proc_read_line(p, line, len), "%s %s: no output", argv[0], argv[2]);
        ck_assert_msg(strncmp(line, "ready", 5) == 0, "%s: '%s'", argv[2], line);
}

/* gpumemctl ARGS... (NULL-terminated after the command), output into out; the exit status. */
static int ctl(char *out, size_t len, const char *a0, const char *a1, const char *a2, const char *a3, const char *a4,
               const char *a5) {
        const char *argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, a0, a1, a2, a3, a4, a5, NULL};
        return gm_test_run(out, len, argv);
}

/* The process's entry of `diagnose --json`, from its pid on. */
static const char *diagnosis_of(char *out, size_t len, pid_t pid, const char *window) {
        char pids[16];
        snprintf(pids, sizeof(pids), "%d", (int) pid);
        ck_assert_int_eq(ctl(out, len, "diagnose", "--pid", pids, "--window", window, "--json"), 0);
        char pat[32];
        snprintf(pat, sizeof(pat), "\"pid\": %d,", (int) pid);
        const char *p = strstr(out, pat);
        ck_assert_msg(p, "no diagnosis of pid %d in: %s", (int) pid, out);
        return p;
}

static void assert_verdict(const char *entry, const char *verdict) {
        char pat[64];
        snprintf(pat, sizeof(pat), "\"verdict\": \"%s\"", verdict);
        ck_assert_msg(strstr(entry, pat), "want %s in: %s", pat, entry);
}

static bool local_mode(void) {
        const char *m = getenv("GPUMEM_HEAP");
        return m && strcmp(m, "local") == 0;
}

/* The growth lasts 3.6 s; the window covers the whole test (slow under the
 * sanitizers and the debug checks), so the rise stays inside it whatever the
 * pace: a narrower one can slide past the growth and rightly see a flat line. */
#define LEAK_WINDOW "120s"

START_TEST(test_e2e_leak) {
        start("1G", NULL);
        gm_test_proc_t w;
        char line[128], out[65536];
        ck_assert_int_eq(ctl(out, sizeof(out), "history", "on", NULL, NULL, NULL, NULL), 0);
        const char *argv[] = {GM_DIAG_WORKLOAD, daemon_.socket_path, "leak", "1048576", "150", "24", NULL};
        spawn_ready(argv, &w, line, sizeof(line));
        const char *e = diagnosis_of(out, sizeof(out), w.pid, LEAK_WINDOW);
        assert_verdict(e, "leak");
        ck_assert_ptr_nonnull(strstr(e, local_mode() ? "\"heap\": \"local\"" : "\"heap\": \"central\""));
        ck_assert_ptr_nonnull(strstr(e, "\"allocated_bytes\": 25165824")); /* 24 MiB still live */
        /* Who still holds it: the live blocks allocated in the window, by stack (the daemon's
         * snapshot has them in both heap modes: a local heap answers the daemon's query). */
        ck_assert_msg(strstr(e, "\"groups\": [{\"where\": \"train.py:42 keep_activations < train.py:90 step\", "
                                "\"blocks\": 24, \"bytes\": 25165824}]"),
                      "%s", e);
        /* The text form names it and says what to do. */
        char pids[16];
        snprintf(pids, sizeof(pids), "%d", (int) w.pid);
        ck_assert_int_eq(ctl(out, sizeof(out), "diagnose", "--pid", pids, "--window", LEAK_WINDOW, NULL), 0);
        ck_assert_msg(strstr(out, ": leak suspected\n") && strstr(out, "next: find who still holds it"), "%s", out);
        /* top: one row for it, with its command name and a rising trend. */
        ck_assert_int_eq(ctl(out, sizeof(out), "top", "--once", NULL, NULL, NULL, NULL), 0);
        ck_assert_msg(strstr(out, "gm-diag-workloa") && strstr(out, "capacity 1.0G") && !strstr(out, "\033["), "%s",
                      out);
        ck_assert_int_eq(ctl(out, sizeof(out), "top", "--json", "--window", LEAK_WINDOW, NULL, NULL), 0);
        ck_assert_ptr_nonnull(strstr(out, "\"command\": \"gm-diag-workloa\""));
        ck_assert_ptr_nonnull(strstr(out, "\"verdict\": \"leak\""));
        ck_assert_int_eq(ctl(out, sizeof(out), "top", "--interval", "100ms", "--iterations", "2", NULL), 0);
        ck_assert_msg(strstr(out, "\033[H\033[2J") && strstr(strstr(out, "\033[H\033[2J") + 1, "\033[H\033[2J"),
                      "two refreshes");
        ck_assert_int_eq(ctl(out, sizeof(out), "status", NULL, NULL, NULL, NULL, NULL), 0);
        ck_assert_msg(strstr(out, "1 process with memory") && strstr(out, " leak\n"), "%s", out);
        ck_assert_int_eq(gm_test_proc_finish(&w), 0);
        stop();
}
END_TEST

START_TEST(test_e2e_fragmentation) {
        start("300M", NULL);
        gm_test_proc_t w;
        char line[128], out[65536];
        const char *argv[] = {GM_DIAG_WORKLOAD, daemon_.socket_path, "frag", NULL};
        spawn_ready(argv, &w, line, sizeof(line));
        ck_assert_str_eq(line, "ready refused=1"); /* the second 32 MiB request */
        const char *e = diagnosis_of(out, sizeof(out), w.pid, "30s");
        assert_verdict(e, "fragmentation");
        ck_assert_msg(strstr(e, "\"inactive_split_bytes\": 134217728") &&
                              strstr(e, "\"largest_free_bytes\": 16777216") &&
                              strstr(e, "\"reserved_bytes\": 301989888") && strstr(e, "\"allocated_bytes\": 167772160"),
                      "%s", e);
        /* Its refusal, in its class, once (a local heap's second try is the same failure). */
        ck_assert_msg(strstr(e, "\"refusals\": {\"quota\": 0, \"fragmentation\": 1,"), "%s", e);
        ck_assert_msg(strstr(e, "\"kind\": \"refusals\""), "%s", e);
        ck_assert_msg(strstr(out, "\"class\": \"fragmentation\", \"size\": 33554432"), "%s", out);
        ck_assert_int_eq(gm_test_proc_finish(&w), 0);
        stop();
}
END_TEST

START_TEST(test_e2e_pending_stream_free) {
        start("1G", NULL);
        gm_test_proc_t w;
        char line[128], out[65536];
        /* On the cuda backend a library client frees on another stream whose work the emulated
         * driver holds; the host backend has no streams: a central client says so itself. */
        char hold[] = "/tmp/gm-diag-hold-XXXXXX";
        int hold_fd = mkstemp(hold);
        ck_assert_int_ge(hold_fd, 0);
        close(hold_fd);
        setenv("FAKECUDA_HOLD_EVENTS", hold, 1);
        const char *lib[] = {GM_DIAG_WORKLOAD, daemon_.socket_path, "stream-free", "25165824", NULL};
        const char *raw[] = {GM_DIAG_WORKLOAD, daemon_.socket_path, "pending", "25165824", NULL};
        spawn_ready(cuda_backend() ? lib : raw, &w, line, sizeof(line));
        unsetenv("FAKECUDA_HOLD_EVENTS");
        const char *e = diagnosis_of(out, sizeof(out), w.pid, "10s");
        assert_verdict(e, "streams");
        ck_assert_msg(strstr(e, "\"pending_free_bytes\": 25165824") && strstr(e, "\"allocated_bytes\": 0,"), "%s", e);
        if (cuda_backend())
                ck_assert_ptr_nonnull(strstr(e, local_mode() ? "\"heap\": \"local\"" : "\"heap\": \"central\""));
        unlink(hold); /* the stream's work is done: the free completes */
        ck_assert_int_eq(gm_test_proc_finish(&w), 0);
        stop();
}
END_TEST

/* Whether every thread of `pid` is in the stopped state ('T' in its stat). */
#define HOARDER_WINDOW "6s"
/* The idle time the idle-cache rule asks for in that window (diagnose.c:
 * half the window, under GM_DIAG_IDLE_MS). */
#define HOARDER_IDLE_MS 3000u

/* The figure `name` of a process's diagnosis entry. */
static uint64_t figure_of(const char *entry, const char *name) {
        char key[64];
        snprintf(key, sizeof(key), "\"%s\": ", name);
        const char *f = strstr(entry, key);
        ck_assert_msg(f, "no %s in: %s", name, entry);
        return strtoull(f + strlen(key), NULL, 10);
}

/* The process's entry of `diagnose --json` over HOARDER_WINDOW once its
 * figures show `allocated` and at least `reserved` and `idle_ms` bytes and
 * ms, asked again every 100 ms (each request samples every session first). */
static const char *diagnosis_when(char *out, size_t len, pid_t pid, uint64_t allocated, uint64_t reserved,
                                  uint64_t idle_ms) {
        for (int tries = 0;; tries++) {
                const char *e = diagnosis_of(out, len, pid, HOARDER_WINDOW);
                if (figure_of(e, "allocated_bytes") == allocated && figure_of(e, "reserved_bytes") >= reserved &&
                    figure_of(e, "idle_ms") >= idle_ms)
                        return e;
                ck_assert_msg(tries < 100,
                              "pid %d: want allocated %" PRIu64 ", reserved >= %" PRIu64 ", idle >= %" PRIu64 " ms: %s",
                              (int) pid, allocated, reserved, idle_ms, e);
                usleep(100000);
        }
}

START_TEST(test_e2e_idle_hoarder_beside_refused) {
        /* Quick timeouts: the hoarder is stopped and cannot give its cache back. */
        start("256M", "park_timeout_ms = 800\nrelease_timeout_ms = 400\n");
        gm_test_proc_t hoarder;
        char line[128], out[65536];
        const char *hv[] = {GM_TEST_CLIENT, daemon_.socket_path, "cache", "67108864", "3", NULL};
        spawn_ready(hv, &hoarder, line, sizeof(line));
        /* Its last figures (192 MiB cached, nothing live) in a sample, then that sample's period
         * over (the ring takes a new sample at most once a period): the refusal's change to its
         * figures then starts a sample of its own, after which the daemon tells how long it idled.
         * Inside the period the change would merge into the sample of its own frees. */
        diagnosis_when(out, sizeof(out), hoarder.pid, 0, 3 * 64 * MiB, 0);
        usleep(GM_SAMPLE_PERIOD_MS * 1000);
        gm_test_stop_process(hoarder.pid);
        const char *rv[] = {GM_TEST_CLIENT, daemon_.socket_path, "hold", "134217728", "1", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), rv), 1); /* refused: the cache did not come back */
        /* Idle as the daemon's samples see it: waited for, not slept for (the refusal stays
         * inside the window). */
        const char *e = diagnosis_when(out, sizeof(out), hoarder.pid, 0, 0, HOARDER_IDLE_MS);
        assert_verdict(e, "idle_cache");
        ck_assert_msg(strstr(e, "\"others_refused\": ") && !strstr(e, "\"others_refused\": 0"), "%s", e);
        ck_assert_msg(strstr(out, "\"class\": \"reclaim\""), "%s", out);
        /* status names the refusal's class (its minute is too short to call the hoarder idle). */
        ck_assert_int_eq(ctl(out, sizeof(out), "status", NULL, NULL, NULL, NULL, NULL), 0);
        ck_assert_msg(strstr(out, " reclaim (") && strstr(out, "gm-test-client"), "%s", out);
        ck_assert_int_eq(kill(hoarder.pid, SIGCONT), 0);
        ck_assert_int_eq(gm_test_proc_finish(&hoarder), 0);
        stop();
}
END_TEST

/* gpumemctl ARGS on a terminal of rows x cols (a pty on its stdout): the
 * output into out (the pty's "\r\n" as "\n"); the exit status. */
static int ctl_on_terminal(unsigned short rows, unsigned short cols, char *out, size_t len, const char *a0,
                           const char *a1) {
        int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        ck_assert_int_ge(master, 0);
        ck_assert_int_eq(grantpt(master), 0);
        ck_assert_int_eq(unlockpt(master), 0);
        char name[64];
        ck_assert_int_eq(ptsname_r(master, name, sizeof(name)), 0);
        int slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
        ck_assert_int_ge(slave, 0);
        struct winsize ws = {.ws_row = rows, .ws_col = cols};
        ck_assert_int_eq(ioctl(slave, TIOCSWINSZ, &ws), 0);
        const char *argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, a0, a1, NULL};
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                dup2(slave, STDOUT_FILENO);
                execv(argv[0], (char *const *) argv);
                _exit(127);
        }
        close(slave);
        size_t at = 0;
        char buf[4096];
        ssize_t n;
        while ((n = read(master, buf, sizeof(buf))) > 0) /* EIO once the child has closed it */
                for (ssize_t i = 0; i < n; i++)
                        if (buf[i] != '\r' && at + 1 < len)
                                out[at++] = buf[i];
        out[at] = '\0';
        close(master);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

START_TEST(test_e2e_top_fits_the_terminal) {
        start("256M", NULL);
        enum { PROCS = 8 };
        gm_test_proc_t holders[PROCS];
        char line[128], out[65536], seed[16];
        for (int i = 0; i < PROCS; i++) {
                snprintf(seed, sizeof(seed), "%d", i + 1);
                const char *argv[] = {GM_TEST_CLIENT, daemon_.socket_path, "hold", "1048576", seed, NULL};
                spawn_ready(argv, &holders[i], line, sizeof(line));
        }
        /* Every holder sampled (the daemon's tick): readiness, not timing. */
        for (int tries = 0; tries < 500; tries++) {
                ck_assert_int_eq(ctl(out, sizeof(out), "top", "--json", NULL, NULL, NULL, NULL), 0);
                if (gm_test_count(out, "\"pid\": ") == PROCS)
                        break;
                usleep(20000);
        }
        ck_assert_int_eq(gm_test_count(out, "\"pid\": "), PROCS);
        /* Not a terminal: every row, whole. */
        ck_assert_int_eq(ctl(out, sizeof(out), "top", "--once", NULL, NULL, NULL, NULL), 0);
        ck_assert_int_eq(gm_test_count(out, "gm-test-client"), PROCS);
        ck_assert_msg(!strstr(out, "more process"), "%s", out);
        /* 8 x 60: the device line, the header, 4 rows and "4 more" (the cursor's line left free), each
         * line cut to 60 columns. */
        ck_assert_int_eq(ctl_on_terminal(8, 60, out, sizeof(out), "top", "--once"), 0);
        ck_assert_msg(gm_test_count(out, "\n") == 7 && strstr(out, "... 4 more processes"), "%s", out);
        ck_assert_int_eq(gm_test_count(out, "gm-test-client"), 4);
        for (const char *p = out; *p; p = strchr(p, '\n') + 1)
                ck_assert_msg(strcspn(p, "\n") <= 60, "a line wider than 60 columns in:\n%s", out);
        ck_assert_msg(strncmp(out, "GPU 0 (", 7) == 0, "%s", out);
        /* A terminal tall enough: every row, no note. */
        ck_assert_int_eq(ctl_on_terminal(40, 200, out, sizeof(out), "top", "--once"), 0);
        ck_assert_int_eq(gm_test_count(out, "gm-test-client"), PROCS);
        ck_assert_msg(!strstr(out, "more process"), "%s", out);
        for (int i = 0; i < PROCS; i++)
                ck_assert_int_eq(gm_test_proc_finish(&holders[i]), 0);
        stop();
}
END_TEST

START_TEST(test_e2e_scopes_and_usage) {
        start("256M", NULL);
        char out[8192];
        /* Nothing holds memory: a pid naming nothing is an error, not silence. */
        ck_assert_int_eq(ctl(out, sizeof(out), "diagnose", "--pid", "999999", NULL, NULL, NULL), 1);
        ck_assert_int_eq(ctl(out, sizeof(out), "diagnose", NULL, NULL, NULL, NULL, NULL), 0);
        ck_assert_msg(strstr(out, "no process holds memory"), "%s", out);
        ck_assert_int_eq(ctl(out, sizeof(out), "diagnose", "--window", "soon", NULL, NULL, NULL), 2);
        ck_assert_int_eq(ctl(out, sizeof(out), "diagnose", "--pid", "1", "--tenant", "x", NULL), 2);
        ck_assert_int_eq(ctl(out, sizeof(out), "top", "--iterations", "0", NULL, NULL, NULL), 2);
        ck_assert_int_eq(ctl(out, sizeof(out), "status", "extra", NULL, NULL, NULL, NULL), 2);
        /* A non-admin may not read another tenant's samples, and sees none of them. */
        if (geteuid() == 0) {
                const char *other[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "diagnose", "--tenant", "uid:0", NULL};
                ck_assert_int_eq(gm_test_run_as(out, sizeof(out), 65534, other), 1);
                const char *own[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "top", "--json", NULL};
                ck_assert_int_eq(gm_test_run_as(out, sizeof(out), 65534, own), 0);
                ck_assert_msg(strstr(out, "\"device_scope\": false") && strstr(out, "\"processes\": []"), "%s", out);
        }
        stop();
}
END_TEST

int main(void) {
        Suite *s = suite_create("diagnose");
        TCase *unit = tcase_create("rings and rules");
        tcase_add_test(unit, test_ring_merges_within_period_and_extends_unchanged);
        tcase_add_test(unit, test_ring_is_bounded_and_ordered);
        tcase_add_test(unit, test_sample_pack_round_trip);
        tcase_add_test(unit, test_refusal_ring_wraps);
        tcase_add_test(unit, test_rule_leak);
        tcase_add_test(unit, test_rule_fragmentation);
        tcase_add_test(unit, test_rule_streams);
        tcase_add_test(unit, test_rule_idle_cache);
        tcase_add_test(unit, test_rule_refusals_by_class);
        tcase_add_test(unit, test_json_reader);
        suite_add_tcase(s, unit);
        TCase *e2e = tcase_create("end to end");
        tcase_set_timeout(e2e, 120);
        tcase_add_test(e2e, test_e2e_leak);
        tcase_add_test(e2e, test_e2e_fragmentation);
        tcase_add_test(e2e, test_e2e_pending_stream_free);
        tcase_add_test(e2e, test_e2e_idle_hoarder_beside_refused);
        tcase_add_test(e2e, test_e2e_top_fits_the_terminal);
        tcase_add_test(e2e, test_e2e_scopes_and_usage);
        suite_add_tcase(s, e2e);
        return gm_test_run_suite(s);
}
