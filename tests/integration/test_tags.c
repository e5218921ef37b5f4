/* Tagged pools end to end (docs/tags.md): a real gpumemd, this process and
 * a forked child as its clients, local and central heaps, on the backend
 * $GPUMEM_TEST_BACKEND names (host, or cuda over the emulated driver). The
 * per-tag statistics add up to the session's, the daemon's per-tag bytes
 * (`gpumemctl clients --json`) match the client's, and a snapshot with
 * `--category tag` names each block's pool and passes the viewer checks. */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

#include "allocator.h"
#include "gpumem/gpumem.h"
#include "ipc.h"
#include "msg.h"
#include "testutil.h"

#define MiB (1024ull * 1024ull)

static gm_test_daemon_t daemon_;

static void setup(void) {
        gm_test_daemon_start(&daemon_, "1G", NULL);
}

static void teardown(void) {
        gm_test_daemon_stop(&daemon_);
}

static gpumem_client *connect_mode(gpumem_heap_mode mode) {
        gpumem_client *c = NULL;
        int r = gpumem_connect_heap(daemon_.socket_path, mode, &c);
        ck_assert_msg(r == 0, "gpumem_connect_heap: %s", gpumem_strerror(r));
        return c;
}

static int64_t stat_of(gpumem_client *c, const char *tag, const char *name) {
        int64_t v = -1;
        int r = tag ? gpumem_stat_tag(c, tag, name, &v) : gpumem_stat(c, name, &v);
        ck_assert_msg(r == 0, "stat %s of '%s': %s", name, tag ? tag : "(session)", gpumem_last_error(c));
        return v;
}

/* `gpumemctl clients --json`'s bytes of pool `tag` of process `pid` (-1: no such entry). */
static int64_t daemon_tag_bytes(pid_t pid, const char *tag) {
        return gm_test_client_tag_bytes(GPUMEMCTL_BIN, daemon_.socket_path, pid, tag);
}

/* Allocations in three pools, nested scopes included: kv_cache 3 small + 1
 * large + 1 (inside weights), weights 1, default 1. */
static void fill(gpumem_client *c, void *p[7]) {
        ck_assert_int_eq(gpumem_pool_begin(c, "kv_cache"), 0);
        ck_assert_str_eq(gpumem_pool_current(c), "kv_cache");
        for (int i = 0; i < 3; i++)
                ck_assert_int_eq(gpumem_alloc(c, 1 * MiB, 0, &p[i]), 0);
        ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &p[3]), 0);
        ck_assert_int_eq(gpumem_pool_end(c), 0);
        ck_assert_int_eq(gpumem_pool_begin(c, "weights"), 0);
        ck_assert_int_eq(gpumem_alloc(c, 4 * MiB, 0, &p[4]), 0);
        ck_assert_int_eq(gpumem_pool_begin(c, "kv_cache"), 0);
        ck_assert_int_eq(gpumem_alloc(c, 512 * 1024, 0, &p[5]), 0);
        ck_assert_int_eq(gpumem_pool_end(c), 0);
        ck_assert_str_eq(gpumem_pool_current(c), "weights");
        ck_assert_int_eq(gpumem_pool_end(c), 0);
        ck_assert_str_eq(gpumem_pool_current(c), "");
        ck_assert_int_eq(gpumem_alloc(c, 100 * 1024, 0, &p[6]), 0);
}

static uint64_t my_tenant_charged(void) {
        char tenant[32];
        snprintf(tenant, sizeof(tenant), "uid:%u", (unsigned) getuid());
        return gm_test_tenant_charged(daemon_.socket_path, tenant);
}

/* Frees them all and trims: the session reserves nothing, and the daemon's
 * per-pool bytes add up to what it still charges (on host nothing; on cuda
 * given-back pieces its process check could not verify stay charged, in
 * their pools, until the session ends). */
static void empty(gpumem_client *c, void *p[7]) {
        for (int i = 0; i < 7; i++)
                ck_assert_int_eq(gpumem_free(c, p[i]), 0);
        int64_t pools = -1;
        for (int i = 0; i < 200; i++) {
                ck_assert_int_eq(gpumem_trim(c, NULL), 0);
                pools = daemon_tag_bytes(getpid(), "kv_cache") + daemon_tag_bytes(getpid(), "weights") +
                        daemon_tag_bytes(getpid(), "");
                if (stat_of(c, NULL, "reserved_bytes.all.current") == 0 && (uint64_t) pools == my_tenant_charged())
                        break;
                usleep(20000);
        }
        ck_assert_int_eq(stat_of(c, NULL, "reserved_bytes.all.current"), 0);
        ck_assert_uint_eq((uint64_t) pools, my_tenant_charged());
        if (strcmp(gm_test_backend(), "host") == 0)
                ck_assert_int_eq(pools, 0);
}

/* A snapshot with category tag: every live block of a pool carries its
 * name (default: "default") and the file passes the viewers' checks. */
static void check_snapshot(void) {
        char file[512], out[4096], cmd[1400];
        snprintf(file, sizeof(file), "%s/tags.json", daemon_.dir);
        const char *argv[] = {GPUMEMCTL_BIN, "-s",   daemon_.socket_path, "snapshot", "-o", file,
                              "--format",    "json", "--category",        "tag",      NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        FILE *f = fopen(file, "r");
        ck_assert_ptr_nonnull(f);
        static char json[1 << 20];
        size_t n = fread(json, 1, sizeof(json) - 1, f);
        fclose(f);
        json[n] = '\0';
        ck_assert_uint_ge(gm_test_count(json, "\"category\":\"kv_cache\""), 5);
        ck_assert_uint_ge(gm_test_count(json, "\"category\":\"weights\""), 1);
        ck_assert_uint_ge(gm_test_count(json, "\"category\":\"default\""), 1);
        snprintf(cmd, sizeof(cmd), "%s %s %s --categories", GM_PYTHON3, GM_SNAPSHOT_CHECK, file);
        ck_assert_msg(system(cmd) == 0, "snapshot check failed: %s", cmd);
}

/* After fill(): the per-tag figures add up to the session's and are fill()'s. */
static void check_tag_stats(gpumem_client *c) {
        const char *keys[] = {"reserved_bytes.all.current", "allocated_bytes.all.current", "active.all.current",
                              "allocation.all.current", "segment.all.current"};
        for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
                ck_assert_int_eq(stat_of(c, "", keys[k]) + stat_of(c, "kv_cache", keys[k]) +
                                         stat_of(c, "weights", keys[k]),
                                 stat_of(c, NULL, keys[k]));
        ck_assert_int_eq(stat_of(c, "kv_cache", "allocation.all.current"), 5);
        ck_assert_int_eq(stat_of(c, "weights", "allocated_bytes.all.current"), 4 * MiB);
        ck_assert_int_eq(stat_of(c, "never_used", "allocated_bytes.all.current"), 0);
        ck_assert_int_eq(stat_of(c, "kv_cache", "num_alloc_retries"), 0);
        int64_t v;
        ck_assert_int_eq(gpumem_stat_tag(c, "no/such", "allocated_bytes.all.current", &v), -EINVAL);
}

/* `gpumemctl stats --tag TAG --json` (extra: more options, or NULL): the
 * value of `key` in its output; *ret_sessions its "sessions". */
static int64_t ctl_tag_stat(const char *tag, const char *extra, const char *extra_value, const char *key,
                            int64_t *ret_sessions) {
        static char out[65536];
        const char *argv[] = {GPUMEMCTL_BIN, "-s",  daemon_.socket_path, "stats", "--json", "--tag",
                              tag,           extra, extra_value,         NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        char pat[128];
        snprintf(pat, sizeof(pat), "\"tag\": \"%s\"", tag);
        ck_assert_msg(strstr(out, pat), "%s", out);
        const char *sessions = strstr(out, "\"sessions\": ");
        ck_assert_ptr_nonnull(sessions);
        *ret_sessions = strtoll(sessions + strlen("\"sessions\": "), NULL, 10);
        snprintf(pat, sizeof(pat), "\"%s\": ", key);
        const char *v = strstr(out, pat);
        ck_assert_msg(v, "no %s in %s", key, out);
        return strtoll(v + strlen(pat), NULL, 10);
}

/* gpumemctl stats --tag: the session's pool as the client sees it, for its
 * pid and its tenant; a pool nobody named counts no session; the text form
 * names the pool; a malformed tag is refused. */
static void check_ctl_tag_stats(gpumem_client *c) {
        char pid[16];
        snprintf(pid, sizeof(pid), "%d", (int) getpid());
        const char *keys[] = {"allocated_bytes.all.current", "reserved_bytes.all.current", "allocation.all.current",
                              "segment.all.current", "requested_bytes.all.peak"};
        const char *tags[] = {"kv_cache", "weights", ""};
        for (size_t t = 0; t < 3; t++)
                for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
                        int64_t sessions;
                        ck_assert_int_eq(ctl_tag_stat(tags[t], "--pid", pid, keys[k], &sessions),
                                         stat_of(c, tags[t], keys[k]));
                        ck_assert_int_eq(sessions, 1);
                        ck_assert_int_eq(ctl_tag_stat(tags[t], NULL, NULL, keys[k], &sessions), /* the tenant's */
                                         stat_of(c, tags[t], keys[k]));
                        ck_assert_int_eq(sessions, 1);
                }
        int64_t sessions;
        ck_assert_int_eq(ctl_tag_stat("never_used", "--pid", pid, "allocated_bytes.all.current", &sessions), 0);
        ck_assert_int_eq(sessions, 0);
        ck_assert_int_eq(daemon_tag_bytes(getpid(), "kv_cache"),
                         ctl_tag_stat("kv_cache", "--pid", pid, "reserved_bytes.all.current", &sessions));
        static char out[65536];
        const char *text[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "stats", "--tag", "kv_cache", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), text), 0);
        ck_assert_msg(strstr(out, "Tagged pool 'kv_cache' of 1 session(s)") && strstr(out, "Allocated memory"), "%s",
                      out);
        const char *bad[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "stats", "--tag", "no/such", NULL};
        ck_assert_int_ne(gm_test_run(out, sizeof(out), bad), 0);
}

START_TEST(test_tags_local) {
        gpumem_client *c = connect_mode(GPUMEM_HEAP_LOCAL);
        void *p[7];
        fill(c, p);
        check_tag_stats(c);
        check_ctl_tag_stats(c);
        /* the daemon books each pool's grants: its bytes are the client's reserved */
        ck_assert_int_eq(daemon_tag_bytes(getpid(), "kv_cache"), stat_of(c, "kv_cache", "reserved_bytes.all.current"));
        ck_assert_int_eq(daemon_tag_bytes(getpid(), "weights"), stat_of(c, "weights", "reserved_bytes.all.current"));
        ck_assert_int_eq(daemon_tag_bytes(getpid(), ""), stat_of(c, "", "reserved_bytes.all.current"));
        check_snapshot();
        empty(c, p);
        ck_assert_int_eq(stat_of(c, "kv_cache", "reserved_bytes.all.peak") > 0, 1);
        gpumem_disconnect(c);
}
END_TEST

START_TEST(test_tags_central) {
        gpumem_client *c = connect_mode(GPUMEM_HEAP_CENTRAL);
        void *p[7];
        fill(c, p);
        check_tag_stats(c); /* the daemon's heap answers for the pool */
        check_ctl_tag_stats(c);
        int64_t kv = daemon_tag_bytes(getpid(), "kv_cache"), w = daemon_tag_bytes(getpid(), "weights");
        int64_t d = daemon_tag_bytes(getpid(), "");
        ck_assert_int_ge(kv, 12 * MiB + 2 * MiB);
        ck_assert_int_ge(w, 4 * MiB);
        ck_assert_int_gt(d, 0);
        ck_assert_int_eq(kv + w + d, stat_of(c, NULL, "reserved_bytes.all.current"));
        check_snapshot();
        empty(c, p);
        gpumem_disconnect(c);
}
END_TEST

/* Another client process: its pools are its own, the daemon books them
 * under its pid while it lives. */
START_TEST(test_tags_child_process) {
        int go[2], ready[2];
        ck_assert_int_eq(pipe(go), 0);
        ck_assert_int_eq(pipe(ready), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                gpumem_client *c = NULL;
                void *a;
                char x = 0;
                if (gpumem_connect_heap(daemon_.socket_path, GPUMEM_HEAP_LOCAL, &c) != 0 ||
                    gpumem_pool_begin(c, "weights") != 0 || gpumem_alloc(c, 12 * MiB, 0, &a) != 0 ||
                    gpumem_pool_end(c) != 0 || write(ready[1], &x, 1) != 1 || read(go[0], &x, 1) != 1)
                        _exit(1);
                /* Garbage in its page's slot of pool "weights" (id 1) only. */
                uint8_t *page = gm_test_own_stats_page();
                if (!page)
                        _exit(2);
                memset(page + 64 + offsetof(gm_heap_stats_area_t, tags[1]), 0x7f, sizeof(gm_stats_t));
                if (write(ready[1], &x, 1) != 1 || read(go[0], &x, 1) != 1)
                        _exit(3);
                gpumem_disconnect(c);
                _exit(0);
        }
        char x;
        ck_assert_int_eq(read(ready[0], &x, 1), 1);
        ck_assert_int_eq(daemon_tag_bytes(pid, "weights"), 12 * MiB); /* its own 12 MiB segment */
        ck_assert_int_eq(daemon_tag_bytes(getpid(), "weights"), -1);  /* this process has no session */
        /* The daemon reads another process's pool from its page, and garbage there as zeros. */
        char pid_arg[16];
        snprintf(pid_arg, sizeof(pid_arg), "%d", (int) pid);
        int64_t sessions;
        ck_assert_int_eq(ctl_tag_stat("weights", "--pid", pid_arg, "allocated_bytes.all.current", &sessions), 12 * MiB);
        ck_assert_int_eq(write(go[1], &x, 1), 1);
        ck_assert_int_eq(read(ready[0], &x, 1), 1);
        ck_assert_int_eq(ctl_tag_stat("weights", "--pid", pid_arg, "allocated_bytes.all.current", &sessions), 0);
        ck_assert_int_eq(ctl_tag_stat("weights", "--pid", pid_arg, "reserved_bytes.all.peak", &sessions), 0);
        ck_assert_int_eq(sessions, 1);
        ck_assert_int_eq(daemon_tag_bytes(pid, "weights"), 12 * MiB); /* the daemon's books: its own */
        ck_assert_int_eq(write(go[1], &x, 1), 1);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        close(go[0]);
        close(go[1]);
        close(ready[0]);
        close(ready[1]);
}
END_TEST

/* Names, depth and the number of tags are bounded, on the client and on the wire. */
START_TEST(test_tags_limits) {
        gpumem_client *c = connect_mode(GPUMEM_HEAP_LOCAL);
        char name[48];
        ck_assert_int_eq(gpumem_pool_end(c), -ENOENT);
        ck_assert_int_eq(gpumem_pool_begin(c, "no spaces"), -EINVAL);
        ck_assert_int_eq(gpumem_pool_begin(c, "0123456789012345678901234567890123"), -EINVAL);
        for (int i = 0; i < 8; i++)
                ck_assert_int_eq(gpumem_pool_begin(c, "deep"), 0);
        ck_assert_int_eq(gpumem_pool_begin(c, "deep"), -E2BIG);
        for (int i = 0; i < 8; i++)
                ck_assert_int_eq(gpumem_pool_end(c), 0);
        for (int i = 1; i < 16; i++) { /* "deep" is the first of 16 names */
                snprintf(name, sizeof(name), "t%d", i);
                ck_assert_int_eq(gpumem_pool_begin(c, name), 0);
                ck_assert_int_eq(gpumem_pool_end(c), 0);
        }
        ck_assert_int_eq(gpumem_pool_begin(c, "one_too_many"), -E2BIG);
        ck_assert_int_eq(gpumem_pool_begin(c, ""), 0); /* the default needs no name */
        ck_assert_int_eq(gpumem_pool_end(c), 0);
        gpumem_disconnect(c);

        /* the daemon: a Grant naming an id past 16, a malformed name, or
         * another name for an id it knows is refused, nothing charged */
        int fd = gm_test_raw_connect(daemon_.socket_path);
        gm_test_raw_hello_local(fd);
        const struct {
                const char *tag;
                uint32_t id;
                int err;
        } bad[] = {{"kv", 17, E2BIG}, {"bad name", 1, EINVAL}, {"", 2, EINVAL}, {"kv", 0, EINVAL}};
        Gpumem__Grant g = GPUMEM__GRANT__INIT;
        g.segment_id = 1;
        g.segment_va_size = g.size = g.block_size = 2 * MiB;
        g.tag = "kv";
        g.tag_id = 1;
        int pfd = -1;
        gm_test_raw_send_body(fd, 1, GPUMEM__ENVELOPE__BODY_GRANT, &g);
        Gpumem__Envelope *e = gm_test_raw_recv_fd(fd, &pfd);
        ck_assert_ptr_nonnull(e);
        ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_GRANT_REPLY);
        if (pfd >= 0)
                close(pfd);
        gm_msg_free(e);
        g.segment_id = 2;
        g.tag = "other"; /* id 1 is "kv" */
        for (size_t i = 0; i <= sizeof(bad) / sizeof(bad[0]); i++) {
                if (i > 0) {
                        g.tag = (char *) bad[i - 1].tag;
                        g.tag_id = bad[i - 1].id;
                }
                gm_test_raw_send_body(fd, 10 + i, GPUMEM__ENVELOPE__BODY_GRANT, &g);
                e = gm_test_raw_recv_fd(fd, &pfd);
                ck_assert_ptr_nonnull(e);
                ck_assert_int_eq(e->body_case, GPUMEM__ENVELOPE__BODY_ERROR);
                ck_assert_int_eq(e->error->code, i > 0 ? bad[i - 1].err : EINVAL);
                gm_msg_free(e);
        }
        ck_assert_int_eq(my_tenant_charged(), 2 * MiB);
        close(fd);
}
END_TEST

/* A tenant's tag_quota refuses what would take a pool past it, naming the
 * pool, in both heap modes; other pools and the default are not limited. */
START_TEST(test_tags_quota) {
        gm_test_daemon_stop(&daemon_);
        char conf[128];
        snprintf(conf, sizeof(conf), "[tenant uid:%u]\ntag_quota = kv:16M,weights:64M\n", (unsigned) getuid());
        gm_test_daemon_start_config(&daemon_, "1G", NULL, conf);
        for (int mode = 0; mode < 2; mode++) {
                gpumem_client *c = connect_mode(mode ? GPUMEM_HEAP_CENTRAL : GPUMEM_HEAP_LOCAL);
                void *a, *b, *d, *o;
                ck_assert_int_eq(gpumem_pool_begin(c, "kv"), 0);
                ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &a), 0); /* its own 12 MiB segment */
                ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &b), -EDQUOT);
                ck_assert_msg(strstr(gpumem_last_error(c), "pool 'kv'") && strstr(gpumem_last_error(c), "tag_quota"),
                              "%s", gpumem_last_error(c));
                ck_assert_int_eq(gpumem_pool_end(c), 0);
                ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &d), 0); /* the default pool has no tag quota */
                ck_assert_int_eq(gpumem_pool_begin(c, "other"), 0);
                ck_assert_int_eq(gpumem_alloc(c, 12 * MiB, 0, &o), 0);
                ck_assert_int_eq(gpumem_pool_end(c), 0);
                ck_assert_int_eq(daemon_tag_bytes(getpid(), "kv"), 12 * MiB);
                ck_assert_int_eq(gpumem_free(c, a), 0);
                ck_assert_int_eq(gpumem_free(c, d), 0);
                ck_assert_int_eq(gpumem_free(c, o), 0);
                gpumem_disconnect(c);
        }
}
END_TEST

int main(void) {
        Suite *s = suite_create("tags");
        TCase *tc = tcase_create("tags");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_tags_local);
        tcase_add_test(tc, test_tags_central);
        tcase_add_test(tc, test_tags_child_process);
        tcase_add_test(tc, test_tags_limits);
        tcase_add_test(tc, test_tags_quota);
        suite_add_tcase(s, tc);
        return gm_test_run_suite(s);
}
