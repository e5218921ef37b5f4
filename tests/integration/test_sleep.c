/* Sleep and wake of a local session (issue 27, docs/sleep.md) against a
 * real gpumemd: the sleeper (this process) gives its memory back keeping its
 * addresses, a neighbour of another tenant (this binary again, as uid 65534,
 * with "neighbour" as its first argument) takes that memory, a wake waits
 * for it and fails after its timeout, then succeeds once the neighbour gave
 * it back, and every kept block holds its data at its old address. On the
 * host backend the data is written and read directly; over the emulated cuda
 * driver by emulated kernels (device memory is not CPU-accessible there).
 * The daemon's books are checked after every request (GPUMEMD_DEBUG builds)
 * and the tenants' charged bytes at every step here. Needs root to act as
 * another uid; reports and skips the neighbour's cases otherwise. */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "msg.h"
#include "testutil.h"
#ifdef GM_TEST_FAKECUDA
#include "fakecuda_check.h"
#endif

#define MiB (1024ull * 1024ull)
#define NEIGHBOUR_UID 65534
/* The device: 64 MiB. The sleeper holds 42 MiB (a 40 MiB segment and a
 * 2 MiB small-pool one) and caches 16 MiB; the neighbour wants 48 MiB,
 * which fits only while the sleeper sleeps. */
#define CAPACITY "64M"
#define SLEEPER_TENANT "uid:0"
#define NEIGHBOUR_TENANT "neighbour"

static gm_test_daemon_t daemon_;
#ifdef GM_TEST_FAKECUDA
static char pool_path[64];
#endif

static bool on_cuda(void) {
        return strcmp(gm_test_backend(), "cuda") == 0;
}

static uint64_t now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

/* gm_test_fill()'s pattern into a block: directly on host, by kernel on cuda. */
static void fill(void *p, size_t n, uint64_t seed) {
#ifdef GM_TEST_FAKECUDA
        if (on_cuda()) {
                ck_assert(gm_fake_device_fill(p, n, seed));
                return;
        }
#endif
        gm_test_fill(p, n, seed);
}

static bool verify(const void *p, size_t n, uint64_t seed) {
#ifdef GM_TEST_FAKECUDA
        if (on_cuda())
                return gm_fake_device_verify(p, n, seed) == 1;
#endif
        return gm_test_verify(p, n, seed);
}

static void setup(void) {
#ifdef GM_TEST_FAKECUDA
        if (on_cuda()) {
                gm_fake_new_pool(pool_path, sizeof(pool_path));
                ck_assert_int_eq(chmod(pool_path, 0666), 0); /* one device for every uid's processes */
        }
#endif
        gm_test_daemon_start_config(&daemon_, CAPACITY, NULL, "[tenant " NEIGHBOUR_TENANT "]\nuser = 65534\n");
}

static void teardown(void) {
        gm_test_daemon_stop(&daemon_);
#ifdef GM_TEST_FAKECUDA
        if (on_cuda()) {
                gm_fake_assert_no_objects(); /* page-locked host memory included */
                gm_fake_assert_device_drained();
                unlink(pool_path);
        }
#endif
}

static gpumem_client *connect_local(void) {
        gpumem_client *c = NULL;
        int r = gpumem_connect_heap(daemon_.socket_path, GPUMEM_HEAP_LOCAL, &c);
        ck_assert_msg(r == 0, "connect: %s", gpumem_strerror(r));
        return c;
}

static void *alloc(gpumem_client *c, size_t size) {
        void *p = NULL;
        int r = gpumem_alloc(c, size, 0, &p);
        ck_assert_msg(r == 0, "alloc %zu: %s", size, gpumem_last_error(c));
        return p;
}

static uint64_t charged(const char *tenant) {
        return gm_test_tenant_charged(daemon_.socket_path, tenant);
}

/* ---- the neighbour: another tenant's process ---- */

/* Reads commands from stdin: "alloc MIB" (prints "ok" or "refused ERR MSG"),
 * "free" (frees and trims, prints "freed BYTES"), "exit". */
static int neighbour_main(const char *socket_path) {
        gpumem_client *c = NULL;
        int r = gpumem_connect_heap(socket_path, GPUMEM_HEAP_LOCAL, &c);
        if (r < 0) {
                printf("refused %d %s\n", r, "connect");
                return 2;
        }
        void *p = NULL;
        char line[128];
        printf("ready\n");
        fflush(stdout);
        while (fgets(line, sizeof(line), stdin)) {
                unsigned long long mib;
                if (sscanf(line, "alloc %llu", &mib) == 1) {
                        r = gpumem_alloc(c, mib * MiB, 0, &p);
                        if (r == 0)
                                printf("ok\n");
                        else
                                printf("refused %d %s\n", r, gpumem_last_error(c));
                } else if (strncmp(line, "free", 4) == 0) {
                        uint64_t released = 0;
                        gpumem_free(c, p);
                        p = NULL;
                        gpumem_trim(c, &released);
                        printf("freed %" PRIu64 "\n", released);
                } else if (strncmp(line, "exit", 4) == 0) {
                        break;
                }
                fflush(stdout);
        }
        gpumem_disconnect(c);
        return 0;
}

static void tell(gm_test_proc_t *p, const char *cmd, char *reply, size_t len) {
        ck_assert_int_eq(write(p->stdin_fd, cmd, strlen(cmd)), (ssize_t) strlen(cmd));
        bool got = gm_test_proc_read_line(p, reply, len);
        if (!got) {
                const char *cat[] = {"/usr/bin/tail", "-n", "20", daemon_.log_path, NULL};
                char log[8192];
                gm_test_run(log, sizeof(log), cat);
                ck_abort_msg("the neighbour ended (exit %d) at '%s'; the daemon's log:\n%s", gm_test_proc_finish(p),
                             cmd, log);
        }
}

/* `gpumemctl clients --json`: the asleep and sleeping_bytes of this process. */
static void clients_shows(bool asleep, uint64_t sleeping_bytes) {
        char out[16384], pat[160];
        const char *argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "clients", "--json", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        snprintf(pat, sizeof(pat), "\"pid\": %d,", (int) getpid());
        const char *e = strstr(out, pat);
        ck_assert_msg(e != NULL, "%s", out);
        snprintf(pat, sizeof(pat), "\"asleep\": %s, \"sleeping_bytes\": %" PRIu64, asleep ? "true" : "false",
                 sleeping_bytes);
        const char *end = strchr(e, '}');
        const char *at = strstr(e, pat);
        ck_assert_msg(at && at < end, "want %s in %s", pat, e);
        /* Its statistics page (the heap's figures, sleeping blocks too) stays within the daemon's bounds. */
        at = strstr(e, "\"stats_page_invalid\": false");
        ck_assert_msg(at && at < end, "the statistics page failed the bounds: %s", e);
}

/* ---- the cases ---- */

/* The whole story: sleep keeping the data, the neighbour takes the memory, a
 * wake times out, the neighbour gives it back, the wake restores it all. */
START_TEST(test_sleep_neighbour_wake) {
        if (geteuid() != 0) {
                fprintf(stderr, "test_sleep_neighbour_wake: needs root (acts as uid %d), skipped\n", NEIGHBOUR_UID);
                return;
        }
        gpumem_client *c = connect_local();
        void *big = alloc(c, 40 * MiB), *small = alloc(c, 512 * 1024), *dropped = alloc(c, 256 * 1024);
        void *cached = alloc(c, 16 * MiB);
        fill(big, 40 * MiB, 1);
        fill(small, 512 * 1024, 2);
        fill(dropped, 256 * 1024, 3);
        ck_assert_int_eq(gpumem_free(c, cached), 0);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 58 * MiB);
        ck_assert_uint_eq(gpumem_sleeping_bytes(c), 0);

        const char *all[] = {"*", NULL};
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_sleep(c, NULL, all, &released), 0);
        ck_assert_uint_eq(released, 58 * MiB);
        ck_assert_uint_eq(gpumem_sleeping_bytes(c), 42 * MiB);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 0);
        clients_shows(true, 42 * MiB);
        ck_assert_int_eq(gpumem_sleep(c, NULL, all, &released), -EALREADY);
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 1024, 0, &p), -EAGAIN);
        ck_assert_msg(strstr(gpumem_last_error(c), "asleep"), "%s", gpumem_last_error(c));
        ck_assert_int_eq(gpumem_free(c, dropped), 0); /* a sleeping block may go; its kept data with it */
        uint64_t trimmed = 1;
        ck_assert_int_eq(gpumem_trim(c, &trimmed), 0);
        ck_assert_uint_eq(trimmed, 0); /* nothing more to give */

        /* The neighbour, another tenant, takes what the sleeper gave back. */
        const char *argv[] = {SLEEP_BIN, "neighbour", daemon_.socket_path, NULL};
        gm_test_proc_t nb;
        gm_test_spawn(argv, NEIGHBOUR_UID, &nb);
        char line[2048];
        ck_assert(gm_test_proc_read_line(&nb, line, sizeof(line)));
        ck_assert_str_eq(line, "ready");
        tell(&nb, "alloc 48\n", line, sizeof(line));
        ck_assert_msg(strcmp(line, "ok") == 0, "neighbour: %s", line);
        ck_assert_uint_eq(charged(NEIGHBOUR_TENANT), 48 * MiB);

        /* A wake while it holds the memory waits its timeout, then fails. */
        uint64_t t0 = now_ms();
        int r = gpumem_wake(c, 300);
        uint64_t waited = now_ms() - t0;
        ck_assert_int_eq(r, -ENOMEM);
        ck_assert_msg(waited >= 250, "the wake waited %" PRIu64 " ms", waited);
        ck_assert_msg(strstr(gpumem_last_error(c), "cannot wake") && strstr(gpumem_last_error(c), "still asleep"), "%s",
                      gpumem_last_error(c));
        ck_assert_uint_eq(gpumem_sleeping_bytes(c), 42 * MiB);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 0); /* what it got went back */
        ck_assert_uint_eq(charged(NEIGHBOUR_TENANT), 48 * MiB);
        clients_shows(true, 42 * MiB);

        tell(&nb, "free\n", line, sizeof(line));
        ck_assert_msg(strcmp(line, "freed 50331648") == 0, "neighbour: %s", line);
        ck_assert_uint_eq(charged(NEIGHBOUR_TENANT), 0);

        ck_assert_msg(gpumem_wake(c, 5000) == 0, "wake: %s", gpumem_last_error(c));
        ck_assert_uint_eq(gpumem_sleeping_bytes(c), 0);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 42 * MiB);
        clients_shows(false, 0);
        ck_assert_msg(verify(big, 40 * MiB, 1), "the big block lost its data");
        ck_assert_msg(verify(small, 512 * 1024, 2), "the small block lost its data");
        ck_assert_int_eq(gpumem_wake(c, 0), 0); /* awake: nothing to do */

        /* Awake, it allocates again; the neighbour now cannot have its 48 MiB. */
        void *more = alloc(c, 4 * MiB);
        fill(more, 4 * MiB, 4);
        tell(&nb, "alloc 48\n", line, sizeof(line));
        ck_assert_msg(strncmp(line, "refused -12 ", 12) == 0, "neighbour: %s", line);
        ck_assert_int_eq(write(nb.stdin_fd, "exit\n", 5), 5);
        ck_assert_int_eq(gm_test_proc_finish(&nb), 0);
        ck_assert_uint_eq(charged(NEIGHBOUR_TENANT), 0);

        ck_assert_int_eq(gpumem_free(c, big), 0);
        ck_assert_int_eq(gpumem_free(c, small), 0);
        ck_assert_int_eq(gpumem_free(c, more), 0);
        gpumem_disconnect(c);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 0);
}
END_TEST

/* Keep nothing: the memory goes back without a copy; the pointers come
 * back at the same addresses, usable. A client that ends asleep leaks
 * nothing. */
START_TEST(test_sleep_keep_nothing_and_end_asleep) {
        gpumem_client *c = connect_local();
        void *a = alloc(c, 12 * MiB);
        ck_assert_int_eq(gpumem_sleep(c, NULL, NULL, NULL), 0);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 0);
        ck_assert_msg(gpumem_wake(c, 0) == 0, "wake: %s", gpumem_last_error(c));
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 12 * MiB);
        fill(a, 12 * MiB, 7); /* mapped again, read-write */
        ck_assert(verify(a, 12 * MiB, 7));
        ck_assert_int_eq(gpumem_sleep(c, NULL, NULL, NULL), 0);
        gpumem_disconnect(c); /* ends asleep */
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 0);
}
END_TEST

/* What sleep refuses: a malformed pool name or none, a bad keep tag, a
 * central session. */
START_TEST(test_sleep_refusals) {
        gpumem_client *c = connect_local();
        const char *none[] = {NULL}, *bad[] = {"no spaces", NULL};
        ck_assert_int_eq(gpumem_sleep(c, bad, NULL, NULL), -EINVAL);
        ck_assert_int_eq(gpumem_sleep(c, none, NULL, NULL), -EINVAL);
        ck_assert_int_eq(gpumem_sleep(c, NULL, bad, NULL), -EINVAL);
        ck_assert_uint_eq(gpumem_sleeping_bytes(c), 0);
        gpumem_disconnect(c);
        gpumem_client *central = NULL;
        ck_assert_int_eq(gpumem_connect_heap(daemon_.socket_path, GPUMEM_HEAP_CENTRAL, &central), 0);
        ck_assert_int_eq(gpumem_sleep(central, NULL, NULL, NULL), -EOPNOTSUPP);
        ck_assert_int_eq(gpumem_wake(central, 0), -EOPNOTSUPP);
        gpumem_disconnect(central);
}
END_TEST

/* One tagged pool sleeps: its pieces go (its blocks' data kept), the default
 * pool's stay mapped and usable; the wake's grants are booked under the
 * pool's name again. */
/* A session whose kv_cache pool (a 24 MiB block, data `seed`) sleeps keeping
 * its data, beside a 12 MiB block of the default pool (data seed + 1). */
static gpumem_client *kv_cache_asleep(uint64_t seed, void **ret_kv, void **ret_weights) {
        gpumem_client *c = connect_local();
        ck_assert_int_eq(gpumem_pool_begin(c, "kv_cache"), 0);
        void *kv = alloc(c, 24 * MiB);
        ck_assert_int_eq(gpumem_pool_end(c), 0);
        void *weights = alloc(c, 12 * MiB);
        fill(kv, 24 * MiB, seed);
        fill(weights, 12 * MiB, seed + 1);
        const char *pools[] = {"kv_cache", NULL};
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_sleep(c, pools, pools, &released), 0);
        ck_assert_uint_eq(released, 24 * MiB);
        ck_assert_uint_eq(gpumem_sleeping_bytes(c), 24 * MiB);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 12 * MiB);
        *ret_kv = kv;
        *ret_weights = weights;
        return c;
}

START_TEST(test_sleep_one_pool) {
        void *kv, *weights;
        gpumem_client *c = kv_cache_asleep(11, &kv, &weights);
        ck_assert_msg(verify(weights, 12 * MiB, 12), "the awake pool's block lost its data");
        ck_assert_msg(gpumem_wake(c, 0) == 0, "wake: %s", gpumem_last_error(c));
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 36 * MiB);
        ck_assert_msg(verify(kv, 24 * MiB, 11), "the pool's block lost its data");
        char out[16384], pat[64];
        const char *argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "clients", "--json", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        snprintf(pat, sizeof(pat), "\"kv_cache\": %llu", 24 * MiB);
        ck_assert_msg(strstr(out, pat), "want %s in %s", pat, out);
        ck_assert_int_eq(gpumem_free(c, kv), 0);
        ck_assert_int_eq(gpumem_free(c, weights), 0);
        gpumem_disconnect(c);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 0);
}
END_TEST

/* A pool sleeps alone: while kv_cache sleeps the default pool and weights
 * allocate and free (and trim their cache) as before; only kv_cache refuses,
 * naming itself, until the wake brings its data back at its addresses. */
START_TEST(test_sleep_pool_alone) {
        gpumem_client *c = connect_local();
        ck_assert_int_eq(gpumem_pool_begin(c, "kv_cache"), 0);
        void *kv = alloc(c, 24 * MiB), *kv_small = alloc(c, 256 * 1024);
        ck_assert_int_eq(gpumem_pool_end(c), 0);
        ck_assert_int_eq(gpumem_pool_begin(c, "weights"), 0);
        void *w = alloc(c, 12 * MiB);
        ck_assert_int_eq(gpumem_pool_end(c), 0);
        fill(kv, 24 * MiB, 21);
        fill(kv_small, 256 * 1024, 22);
        fill(w, 12 * MiB, 23);
        const char *pools[] = {"kv_cache", NULL};
        uint64_t released = 0;
        ck_assert_int_eq(gpumem_sleep(c, pools, pools, &released), 0);
        ck_assert_uint_eq(gpumem_sleeping_bytes(c), 26 * MiB);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 12 * MiB);

        /* The awake pools go on: the default pool and weights allocate and free. */
        void *d = alloc(c, 12 * MiB), *d_small = alloc(c, 4096);
        fill(d, 12 * MiB, 24);
        ck_assert_int_eq(gpumem_pool_begin(c, "weights"), 0);
        void *w2 = alloc(c, 16 * MiB);
        ck_assert_int_eq(gpumem_pool_end(c), 0);
        fill(w2, 16 * MiB, 25);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), (12 + 12 + 2 + 16) * MiB);
        ck_assert(verify(d, 12 * MiB, 24) && verify(w2, 16 * MiB, 25) && verify(w, 12 * MiB, 23));
        ck_assert_int_eq(gpumem_free(c, d), 0);
        ck_assert_int_eq(gpumem_free(c, d_small), 0);
        ck_assert_int_eq(gpumem_free(c, w2), 0);
        uint64_t trimmed = 0;
        ck_assert_int_eq(gpumem_trim(c, &trimmed), 0); /* the awake pools' cache goes, the sleeping pool is left be */
        ck_assert_uint_eq(trimmed, (12 + 2 + 16) * MiB);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 12 * MiB);
        ck_assert_uint_eq(gpumem_sleeping_bytes(c), 26 * MiB);

        /* Only the sleeping pool refuses, and says which. */
        ck_assert_int_eq(gpumem_pool_begin(c, "kv_cache"), 0);
        void *p;
        ck_assert_int_eq(gpumem_alloc(c, 1024, 0, &p), -EAGAIN);
        ck_assert_msg(strstr(gpumem_last_error(c), "pool 'kv_cache' is asleep"), "%s", gpumem_last_error(c));
        ck_assert_int_eq(gpumem_pool_end(c), 0);
        clients_shows(true, 26 * MiB);

        ck_assert_msg(gpumem_wake(c, 0) == 0, "wake: %s", gpumem_last_error(c));
        ck_assert_uint_eq(charged(SLEEPER_TENANT), (12 + 26) * MiB);
        ck_assert_msg(verify(kv, 24 * MiB, 21), "the pool's block lost its data");
        ck_assert_msg(verify(kv_small, 256 * 1024, 22), "the pool's small block lost its data");
        ck_assert_msg(verify(w, 12 * MiB, 23), "the awake pool's block lost its data");
        ck_assert_int_eq(gpumem_pool_begin(c, "kv_cache"), 0); /* awake: it allocates again */
        void *kv2 = alloc(c, 1024);
        ck_assert_int_eq(gpumem_pool_end(c), 0);
        ck_assert_int_eq(gpumem_free(c, kv2), 0);
        ck_assert_int_eq(gpumem_free(c, kv), 0);
        ck_assert_int_eq(gpumem_free(c, kv_small), 0);
        ck_assert_int_eq(gpumem_free(c, w), 0);
        gpumem_disconnect(c);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 0);
}
END_TEST

/* Whether `gpumemctl clients` (`json`: --json) shows `want` in this process's entry. */
static bool clients_entry_has(bool json, const char *want) {
        char out[16384], pid[32];
        const char *argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "clients", json ? "--json" : NULL, NULL};
        if (gm_test_run(out, sizeof(out), argv) != 0)
                return false;
        snprintf(pid, sizeof(pid), json ? "\"pid\": %d," : " %d ", (int) getpid());
        const char *e = strstr(out, pid);
        const char *end = e ? strchr(e, json ? '}' : '\n') : NULL;
        const char *at = e ? strstr(e, want) : NULL;
        return at && (!end || at < end);
}

/* The daemon dies (SIGKILL) while a pool sleeps and a new one starts on the
 * same socket, with no fd store: the session re-attaches on its own, still
 * asleep (its re-attach says what its wake needs), the awake pool's memory
 * charged exactly as before, and the wake maps the pool at its addresses
 * again with its data. */
START_TEST(test_sleep_across_restart) {
        void *kv, *w;
        gpumem_client *c = kv_cache_asleep(31, &kv, &w);

        ck_assert_int_eq(kill(daemon_.pid, SIGKILL), 0);
        ck_assert_int_eq(waitpid(daemon_.pid, NULL, 0), daemon_.pid);
        gm_test_daemon_launch(&daemon_, CAPACITY, NULL);
        /* Re-attached once the new daemon shows it; asleep as it was. */
        char want[96];
        snprintf(want, sizeof(want), "\"asleep\": true, \"sleeping_bytes\": %llu", 24 * MiB);
        bool back = false;
        for (int i = 0; i < 1000 && !(back = clients_entry_has(true, want)); i++)
                usleep(10000);
        ck_assert_msg(back, "the session did not re-attach asleep");
        clients_shows(true, 24 * MiB); /* and its statistics page within the new daemon's bounds */
        ck_assert_msg(clients_entry_has(false, "(asleep: needs 24.0M to wake)"), "gpumemctl clients");
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 12 * MiB);
        ck_assert_uint_eq(gpumem_sleeping_bytes(c), 24 * MiB);
        ck_assert_msg(verify(w, 12 * MiB, 32), "the awake pool lost its data");
        void *p;
        ck_assert_int_eq(gpumem_pool_begin(c, "kv_cache"), 0);
        ck_assert_int_eq(gpumem_alloc(c, 1024, 0, &p), -EAGAIN);
        ck_assert_int_eq(gpumem_pool_end(c), 0);
        void *d = alloc(c, 12 * MiB); /* the awake pool goes on with the new daemon */
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 24 * MiB);
        ck_assert_int_eq(gpumem_free(c, d), 0);

        ck_assert_msg(gpumem_wake(c, 0) == 0, "wake: %s", gpumem_last_error(c));
        ck_assert_uint_eq(gpumem_sleeping_bytes(c), 0);
        clients_shows(false, 0);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), (12 + 12 + 24) * MiB);
        ck_assert_msg(verify(kv, 24 * MiB, 31), "the pool's block lost its data at its address");
        ck_assert_int_eq(gpumem_free(c, kv), 0);
        ck_assert_int_eq(gpumem_free(c, w), 0);
        gpumem_disconnect(c);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 0);
}
END_TEST

/* ---- where the kept data lives ---- */

/* The emulated driver's page-locked host memory (figures of this process):
 * live blocks and bytes, cuMemHostAlloc calls, bytes copied with a pinned host side. */
typedef struct pinned_view {
        long blocks, calls;
        uint64_t bytes, copied;
} pinned_view_t;

static pinned_view_t pinned_now(void) {
        pinned_view_t v = {0};
#ifdef GM_TEST_FAKECUDA
        fakecuda_usage_t u;
        if (on_cuda() && gm_fake_usage(&u))
                v = (pinned_view_t){.blocks = u.host_allocations,
                                    .calls = u.host_alloc_calls,
                                    .bytes = u.host_bytes,
                                    .copied = u.pinned_copy_bytes};
#endif
        return v;
}

/* A session with three kept blocks (8, 8 and 4 MiB, data seed, seed + 1,
 * seed + 2), asleep keeping them all. */
static gpumem_client *three_kept_asleep(uint64_t seed, void *ret_p[3], pinned_view_t *ret_before) {
        gpumem_client *c = connect_local();
        const size_t sizes[3] = {8 * MiB, 8 * MiB, 4 * MiB};
        for (int i = 0; i < 3; i++) {
                ret_p[i] = alloc(c, sizes[i]);
                fill(ret_p[i], sizes[i], seed + (uint64_t) i);
        }
        *ret_before = pinned_now();
        const char *all[] = {"*", NULL};
        ck_assert_msg(gpumem_sleep(c, NULL, all, NULL) == 0, "sleep: %s", gpumem_last_error(c));
        ck_assert_uint_eq(gpumem_sleeping_bytes(c), 20 * MiB);
        return c;
}

/* Wakes, checks every block's data at its address, frees them all. */
static void wake_verify_free(gpumem_client *c, void *p[3], uint64_t seed, int n) {
        const size_t sizes[3] = {8 * MiB, 8 * MiB, 4 * MiB};
        ck_assert_msg(gpumem_wake(c, 0) == 0, "wake: %s", gpumem_last_error(c));
        ck_assert_uint_eq(gpumem_sleeping_pinned_bytes(c), 0);
        for (int i = 0; i < n; i++) {
                ck_assert_msg(verify(p[i], sizes[i], seed + (uint64_t) i), "block %d lost its data", i);
                ck_assert_int_eq(gpumem_free(c, p[i]), 0);
        }
        gpumem_disconnect(c);
}

/* On cuda the kept data goes through one page-locked buffer (one
 * cuMemHostAlloc for the sleep's three blocks, every copy there and back
 * from it), freed at the wake; on host it is plain memory. */
START_TEST(test_sleep_pinned) {
        void *p[3];
        pinned_view_t before;
        gpumem_client *c = three_kept_asleep(41, p, &before);
        pinned_view_t asleep = pinned_now();
        if (on_cuda()) {
                ck_assert_uint_eq(gpumem_sleeping_pinned_bytes(c), 20 * MiB);
                ck_assert_int_eq(asleep.blocks, 1);
                ck_assert_uint_eq(asleep.bytes, 20 * MiB);
                ck_assert_int_eq(asleep.calls - before.calls, 1);
                ck_assert_uint_eq(asleep.copied - before.copied, 20 * MiB);
        } else {
                ck_assert_uint_eq(gpumem_sleeping_pinned_bytes(c), 0);
        }
        ck_assert_int_eq(gpumem_free(c, p[2]), 0); /* its kept data goes; its place in the buffer stays */
        ck_assert_uint_eq(gpumem_sleeping_pinned_bytes(c), on_cuda() ? 16 * MiB : 0);
        ck_assert_uint_eq(pinned_now().bytes, asleep.bytes);
        wake_verify_free(c, p, 41, 2);
        pinned_view_t awake = pinned_now();
        ck_assert_int_eq(awake.blocks, 0);
        ck_assert_uint_eq(awake.bytes, 0);
        ck_assert_uint_eq(awake.copied - before.copied, on_cuda() ? 36 * MiB : 0);
}
END_TEST

/* The driver has no page-locked memory left: the sleep keeps the data in
 * pageable memory all the same, says so, and the wake restores it. */
START_TEST(test_sleep_pinned_fallback) {
        setenv("FAKECUDA_FAIL_HOST_ALLOC", "CUDA_ERROR_OUT_OF_MEMORY", 1);
        void *p[3];
        pinned_view_t before;
        gpumem_client *c = three_kept_asleep(51, p, &before);
        unsetenv("FAKECUDA_FAIL_HOST_ALLOC");
        pinned_view_t asleep = pinned_now();
        ck_assert_uint_eq(gpumem_sleeping_pinned_bytes(c), 0);
        ck_assert_int_eq(asleep.calls - before.calls, on_cuda() ? 1 : 0); /* it was tried */
        ck_assert_int_eq(asleep.blocks, 0);
        ck_assert_uint_eq(asleep.copied, before.copied);
        wake_verify_free(c, p, 51, 3);
        ck_assert_uint_eq(pinned_now().copied, before.copied);
}
END_TEST

/* GPUMEM_SLEEP_PINNED_MAX bounds the pinned share (each block whole, placed
 * while it fits; the rest pageable, the data intact either way); 0 pins
 * nothing; a value that is no size refuses the sleep, which leaves the
 * session awake. */
START_TEST(test_sleep_pinned_bound) {
        setenv("GPUMEM_SLEEP_PINNED_MAX", "9M", 1);
        void *p[3];
        pinned_view_t before;
        gpumem_client *c = three_kept_asleep(61, p, &before);
        pinned_view_t asleep = pinned_now();
        /* 9 MiB holds one 8 MiB block, or the 4 MiB one: which first is the table's order. */
        uint64_t pinned = gpumem_sleeping_pinned_bytes(c);
        if (on_cuda()) {
                ck_assert_msg(pinned == 8 * MiB || pinned == 4 * MiB, "%" PRIu64 " bytes pinned", pinned);
                ck_assert_uint_eq(asleep.bytes, pinned);
                ck_assert_uint_eq(asleep.copied - before.copied, pinned);
        } else {
                ck_assert_uint_eq(pinned, 0);
        }
        wake_verify_free(c, p, 61, 3);
        ck_assert_uint_eq(pinned_now().copied - before.copied, 2 * pinned);

        setenv("GPUMEM_SLEEP_PINNED_MAX", "0", 1);
        c = three_kept_asleep(71, p, &before);
        ck_assert_uint_eq(gpumem_sleeping_pinned_bytes(c), 0);
        ck_assert_int_eq(pinned_now().calls, before.calls); /* not even tried */
        wake_verify_free(c, p, 71, 3);

        setenv("GPUMEM_SLEEP_PINNED_MAX", "lots", 1);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 0);
        c = connect_local();
        void *a = alloc(c, 12 * MiB);
        const char *all[] = {"*", NULL};
        ck_assert_int_eq(gpumem_sleep(c, NULL, all, NULL), -EINVAL);
        ck_assert_msg(strstr(gpumem_last_error(c), "GPUMEM_SLEEP_PINNED_MAX"), "%s", gpumem_last_error(c));
        ck_assert_uint_eq(gpumem_sleeping_bytes(c), 0);       /* awake */
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 12 * MiB); /* nothing went back */
        unsetenv("GPUMEM_SLEEP_PINNED_MAX");
        ck_assert_int_eq(gpumem_free(c, a), 0);
        gpumem_disconnect(c);
}
END_TEST

/* SleepState's reply: Ok (0), or the Error's code. */
static int sleep_state(int fd, uint64_t id, bool asleep, uint64_t bytes, char **tags, size_t n_tags) {
        Gpumem__SleepState ss = GPUMEM__SLEEP_STATE__INIT;
        ss.asleep = asleep;
        ss.sleeping_bytes = bytes;
        ss.tags = tags;
        ss.n_tags = n_tags;
        gm_test_raw_send_body(fd, id, GPUMEM__ENVELOPE__BODY_SLEEP_STATE, &ss);
        Gpumem__Envelope *e = gm_test_raw_recv(fd);
        ck_assert_ptr_nonnull(e);
        int r = e->body_case == GPUMEM__ENVELOPE__BODY_OK ? 0 : e->error ? (int) e->error->code : -1;
        gm_msg_free(e);
        return r;
}

/* The wire: SleepState is checked (never more than granted, bounded pool
 * names, local sessions only), and so is a wake's Grant wait. */
START_TEST(test_sleep_state_validated) {
        int fd = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello_local(fd);
        int seg_fd = -1;
        Gpumem__Envelope *e = gm_test_raw_grant(fd, 2, 1, 4 * MiB, &seg_fd);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_GRANT_REPLY);
        gm_msg_free(e);
        close(seg_fd);
        ck_assert_int_eq(sleep_state(fd, 3, true, 4 * MiB + 1, NULL, 0), EINVAL);
        char *bad[] = {"kv cache"}, *many[17];
        for (size_t i = 0; i < 17; i++)
                many[i] = "weights";
        ck_assert_int_eq(sleep_state(fd, 4, true, 0, bad, 1), EINVAL);
        ck_assert_int_eq(sleep_state(fd, 5, true, 0, many, 17), E2BIG);
        ck_assert_int_eq(sleep_state(fd, 6, true, 4 * MiB, many, 16), 0);
        ck_assert_int_eq(sleep_state(fd, 7, true, 4 * MiB, NULL, 0), EBUSY); /* asleep already */
        ck_assert_int_eq(sleep_state(fd, 8, false, 0, NULL, 0), 0);
        Gpumem__Grant g = GPUMEM__GRANT__INIT;
        g.segment_id = 2;
        g.segment_va_size = g.size = 2 * MiB;
        g.wait_for_memory = true;
        g.wait_ms = 3600001;
        gm_test_raw_send_body(fd, 9, GPUMEM__ENVELOPE__BODY_GRANT, &g);
        e = gm_test_raw_recv(fd);
        ck_assert_msg(e && e->body_case == GPUMEM__ENVELOPE__BODY_ERROR && e->error->code == EINVAL, "wait_ms");
        gm_msg_free(e);
        close(fd);
        ck_assert_uint_eq(charged(SLEEPER_TENANT), 0);

        int central = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello(central, false);
        ck_assert_int_eq(sleep_state(central, 2, true, 0, NULL, 0), EPROTO);
        close(central);
}
END_TEST

static Suite *sleep_suite(void) {
        Suite *s = suite_create("sleep");
        TCase *tc = tcase_create("sleep");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_sleep_neighbour_wake);
        tcase_add_test(tc, test_sleep_keep_nothing_and_end_asleep);
        tcase_add_test(tc, test_sleep_refusals);
        tcase_add_test(tc, test_sleep_one_pool);
        tcase_add_test(tc, test_sleep_pool_alone);
        tcase_add_test(tc, test_sleep_across_restart);
        tcase_add_test(tc, test_sleep_state_validated);
        tcase_add_test(tc, test_sleep_pinned);
        tcase_add_test(tc, test_sleep_pinned_fallback);
        tcase_add_test(tc, test_sleep_pinned_bound);
        suite_add_tcase(s, tc);
        return s;
}

int main(int argc, char **argv) {
        if (argc == 3 && strcmp(argv[1], "neighbour") == 0)
                return neighbour_main(argv[2]);
        return gm_test_run_suite(sleep_suite());
}
