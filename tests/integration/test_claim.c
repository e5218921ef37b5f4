/* Claims (issue 27): engines that size their caches from mem_get_info set
 * the memory aside with gpumem_claim() and never over-commit the device. A
 * real daemon, real client processes of their own tenants (uids, so it needs
 * root), on the backend $GPUMEM_TEST_BACKEND names (host, or the emulated
 * cuda driver). Each client is a forked child driven step by step over
 * pipes: the parent is the barrier that starts them together. */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "testutil.h"

#define MiB (1024ull * 1024ull)
#define CAPACITY (256 * MiB)
/* Blocks an engine allocates: more than 10 MiB, so each is one segment of its own size. */
#define BLOCK (16 * MiB)

static gm_test_daemon_t daemon_;

static void setup(void) {
        static const char *const args[] = {"--max-sessions", "64", NULL};
        gm_test_daemon_start_config(&daemon_, "256M", args, "park_timeout_ms = 300\n");
}

static void teardown(void) {
        gm_test_daemon_stop(&daemon_);
}

/* ---- a client process, driven over pipes ---- */

/* What the parent asks of a client, one byte each. */
enum {
        STEP_MEM_GET_INFO = 'm',  /* answers free */
        STEP_CLAIM = 'c',         /* reads the bytes, answers what was claimed */
        STEP_CLAIM_90 = 'n',      /* claims 90% of the free it saw last, answers what was claimed */
        STEP_ALLOC = 'a',         /* reads the bytes, allocates them in BLOCKs: answers the refusals (0: none) */
        STEP_ALLOC_CLAIMED = 'A', /* the same for every whole BLOCK of its last claim */
        STEP_EXIT = 'x',
};

typedef struct client {
        pid_t pid;
        int to;   /* steps */
        int from; /* answers */
} client_t;

static void put(int fd, uint64_t v) {
        if (write(fd, &v, sizeof(v)) != sizeof(v))
                _exit(3);
}

static uint64_t get(int fd) {
        uint64_t v;
        if (read(fd, &v, sizeof(v)) != sizeof(v))
                _exit(4);
        return v;
}

/* Allocates `bytes` in BLOCKs (the pointers kept until the process ends);
 * the number refused. */
static uint64_t alloc_blocks(gpumem_client *c, uint64_t bytes) {
        uint64_t refused = 0;
        for (uint64_t done = 0; done + BLOCK <= bytes; done += BLOCK) {
                void *p;
                int r = gpumem_alloc(c, BLOCK, 0, &p);
                if (r < 0) {
                        fprintf(stderr, "client %d: alloc: %s (%s)\n", (int) getpid(), gpumem_strerror(r),
                                gpumem_last_error(c));
                        refused++;
                }
        }
        return refused;
}

/* The child: connects as uid and runs the steps it is sent (answers as
 * UINT64_MAX on a failed call). Never returns. */
static void client_main(uid_t uid, int in, int out) {
        if (uid && (setgid(uid) < 0 || setuid(uid) < 0))
                _exit(2);
        gpumem_client *c;
        if (gpumem_connect(daemon_.socket_path, &c) < 0)
                _exit(5);
        put(out, 1); /* connected */
        uint64_t free_seen = 0, claimed = 0, total;
        for (;;) {
                char step;
                if (read(in, &step, 1) != 1)
                        step = STEP_EXIT;
                switch (step) {
                case STEP_MEM_GET_INFO:
                        put(out, gpumem_mem_get_info(c, &free_seen, &total) < 0 ? UINT64_MAX : free_seen);
                        break;
                case STEP_CLAIM:
                case STEP_CLAIM_90: {
                        uint64_t want = step == STEP_CLAIM ? get(in) : free_seen / 10 * 9;
                        put(out, gpumem_claim(c, want, &claimed) < 0 ? UINT64_MAX : claimed);
                        break;
                }
                case STEP_ALLOC:
                        put(out, alloc_blocks(c, get(in)));
                        break;
                case STEP_ALLOC_CLAIMED:
                        put(out, alloc_blocks(c, claimed));
                        break;
                default:
                        gpumem_disconnect(c);
                        _exit(0);
                }
        }
}

static void client_start(client_t *cl, uid_t uid) {
        int to[2], from[2];
        ck_assert(pipe(to) == 0 && pipe(from) == 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                close(to[1]);
                close(from[0]);
                client_main(uid, to[0], from[1]);
        }
        close(to[0]);
        close(from[1]);
        *cl = (client_t){.pid = pid, .to = to[1], .from = from[0]};
        uint64_t v;
        ck_assert_msg(read(cl->from, &v, sizeof(v)) == sizeof(v), "client of uid %u did not connect", (unsigned) uid);
}

static void client_send(client_t *cl, char step) {
        ck_assert_int_eq(write(cl->to, &step, 1), 1);
}

static void client_send_value(client_t *cl, char step, uint64_t v) {
        client_send(cl, step);
        ck_assert_int_eq(write(cl->to, &v, sizeof(v)), sizeof(v));
}

static uint64_t client_answer(client_t *cl) {
        uint64_t v;
        ck_assert_int_eq(read(cl->from, &v, sizeof(v)), sizeof(v));
        ck_assert_msg(v != UINT64_MAX, "client %d: the call failed", (int) cl->pid);
        return v;
}

/* One step and its answer. */
static uint64_t client_do(client_t *cl, char step) {
        client_send(cl, step);
        return client_answer(cl);
}

static uint64_t client_do_value(client_t *cl, char step, uint64_t v) {
        client_send_value(cl, step, v);
        return client_answer(cl);
}

/* Ends the client (its session, and so its claim, with it) and waits until
 * the daemon has ended its session. */
static void client_finish(client_t *cl, uid_t uid) {
        client_send(cl, STEP_EXIT);
        int status;
        ck_assert_int_eq(waitpid(cl->pid, &status, 0), cl->pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "client %d exited with %d", (int) cl->pid, status);
        close(cl->to);
        close(cl->from);
        char tenant[32];
        snprintf(tenant, sizeof(tenant), "uid:%u", (unsigned) uid);
        for (int i = 0; i < 1000 && gm_test_tenant_sessions(daemon_.socket_path, tenant) != 0; i++)
                usleep(10000);
}

/* ---- the daemon's books, through the admin API ---- */

static gpumem_admin *admin(void) {
        gpumem_admin *a;
        ck_assert_int_eq(gpumem_admin_new(daemon_.socket_path, "test_claim", &a), 0);
        return a;
}

static gpumem_tenant_usage tenant_usage(const char *tenant) {
        gpumem_admin *a = admin();
        gpumem_tenant_usage *list;
        size_t n;
        ck_assert_int_eq(gpumem_admin_quota(a, GPUMEM_QUOTA_GET, tenant, 0, false, &list, &n), 0);
        ck_assert_uint_eq(n, 1);
        gpumem_tenant_usage u = list[0];
        u.info.tenant = u.info.quota_source = u.release_check = NULL; /* in the buffer freed here */
        gpumem_buffer_free(list);
        gpumem_admin_free(a);
        return u;
}

static void set_quota(const char *tenant, uint64_t bytes) {
        gpumem_admin *a = admin();
        gpumem_tenant_usage *list;
        size_t n;
        ck_assert_int_eq(gpumem_admin_quota(a, GPUMEM_QUOTA_SET, tenant, bytes, true, &list, &n), 0);
        gpumem_buffer_free(list);
        gpumem_admin_free(a);
}

/* The claimed bytes `gpumemctl clients --json` shows for a pid (UINT64_MAX: no session of it). */
static uint64_t claimed_of(pid_t pid) {
        static char out[65536];
        const char *argv[] = {GPUMEMCTL_BIN, "-s", daemon_.socket_path, "clients", "--json", NULL};
        if (gm_test_run(out, sizeof(out), argv) != 0)
                return UINT64_MAX;
        char key[64];
        snprintf(key, sizeof(key), "\"pid\": %d,", (int) pid);
        const char *at = strstr(out, key);
        at = at ? strstr(at, "\"claimed_bytes\": ") : NULL;
        return at ? strtoull(at + strlen("\"claimed_bytes\": "), NULL, 10) : UINT64_MAX;
}

static uint64_t ctl_claimed_of(pid_t pid) {
        uint64_t claimed = claimed_of(pid);
        ck_assert_msg(claimed != UINT64_MAX, "pid %d not in gpumemctl clients", (int) pid);
        return claimed;
}

/* SIGKILLs the daemon and starts a new one of `capacity` on the same socket
 * (no fd store: the journal and the clients' reports), then waits until the
 * session of `pid` has re-attached with a claim of `claimed` bytes. */
static void restart_until_claimed(const char *capacity, pid_t pid, uint64_t claimed) {
        static const char *const args[] = {"--max-sessions", "64", NULL};
        ck_assert_int_eq(kill(daemon_.pid, SIGKILL), 0);
        ck_assert_int_eq(waitpid(daemon_.pid, NULL, 0), daemon_.pid);
        gm_test_daemon_launch(&daemon_, capacity, args);
        uint64_t now = UINT64_MAX;
        for (int i = 0; i < 1000 && (now = claimed_of(pid)) != claimed; i++)
                usleep(10000);
        ck_assert_msg(now == claimed, "pid %d re-attached with a claim of %" PRIu64 ", not %" PRIu64, (int) pid, now,
                      claimed);
}

#define ENGINE_A 65534
#define ENGINE_B 65533
#define THIRD 65532

/* Two engines started together: both see the same free memory, both claim
 * 90% of it at once; the daemon sets aside what is there for the first and
 * only the rest for the second, and both allocate what they were given. */
START_TEST(test_two_engines_never_over_commit) {
        client_t e[2];
        client_start(&e[0], ENGINE_A);
        client_start(&e[1], ENGINE_B);
        uint64_t free_seen[2], claimed[2];
        /* The barrier: both measure before either claims. */
        for (int i = 0; i < 2; i++)
                client_send(&e[i], STEP_MEM_GET_INFO);
        for (int i = 0; i < 2; i++)
                free_seen[i] = client_answer(&e[i]);
        ck_assert_uint_eq(free_seen[0], CAPACITY);
        ck_assert_uint_eq(free_seen[1], CAPACITY);
        for (int i = 0; i < 2; i++)
                client_send(&e[i], STEP_CLAIM_90);
        for (int i = 0; i < 2; i++)
                claimed[i] = client_answer(&e[i]);
        ck_assert_uint_le(claimed[0] + claimed[1], CAPACITY);
        int second = claimed[0] < claimed[1] ? 0 : 1;
        ck_assert_uint_lt(claimed[second], free_seen[second]);
        ck_assert_uint_eq(claimed[!second], free_seen[!second] / 10 * 9); /* the first got all it asked */
        ck_assert_uint_eq(claimed[second], CAPACITY - claimed[!second]);  /* the second the rest */
        ck_assert_uint_eq(ctl_claimed_of(e[second].pid), claimed[second]);
        /* Both allocate what they were given, at once: nothing is refused. */
        for (int i = 0; i < 2; i++)
                client_send(&e[i], STEP_ALLOC_CLAIMED);
        for (int i = 0; i < 2; i++)
                ck_assert_uint_eq(client_answer(&e[i]), 0);
        char tenant[2][32];
        uint64_t held = 0;
        for (int i = 0; i < 2; i++) {
                snprintf(tenant[i], sizeof(tenant[i]), "uid:%d", i ? ENGINE_B : ENGINE_A);
                gpumem_tenant_usage u = tenant_usage(tenant[i]);
                ck_assert_uint_eq(u.info.charged_bytes, claimed[i] / BLOCK * BLOCK);
                ck_assert_uint_eq(u.claimed_bytes, claimed[i] % BLOCK); /* what is left of the claim */
                held += u.info.charged_bytes + u.claimed_bytes;
        }
        ck_assert_uint_le(held, CAPACITY);
        for (int i = 0; i < 2; i++)
                client_finish(&e[i], i ? ENGINE_B : ENGINE_A);
        for (int i = 0; i < 2; i++)
                ck_assert_uint_eq(tenant_usage(tenant[i]).claimed_bytes, 0);
}
END_TEST

/* A third tenant's request that would eat into a claim is refused while the
 * claim stands, and granted once it lapses (claimed 0, or the session ends). */
START_TEST(test_third_tenant_refused_while_claim_stands) {
        client_t engine, third;
        client_start(&engine, ENGINE_A);
        client_start(&third, THIRD);
        ck_assert_uint_eq(client_do_value(&engine, STEP_CLAIM, 200 * MiB), 200 * MiB);
        ck_assert_uint_eq(client_do(&third, STEP_MEM_GET_INFO), CAPACITY - 200 * MiB); /* no longer offered */
        /* 3 blocks fit in what is left, the fourth would eat into the claim. */
        ck_assert_uint_eq(client_do_value(&third, STEP_ALLOC, 4 * BLOCK), 1);
        ck_assert_uint_eq(client_do_value(&engine, STEP_CLAIM, 0), 0); /* the claim lapses */
        ck_assert_uint_eq(client_do_value(&third, STEP_ALLOC, 4 * BLOCK), 0);
        /* A new claim takes only what is free now: nothing is reclaimed for it. */
        uint64_t left = CAPACITY - 7 * BLOCK;
        ck_assert_uint_eq(client_do_value(&engine, STEP_CLAIM, 200 * MiB), left);
        ck_assert_uint_eq(client_do(&third, STEP_MEM_GET_INFO), 0);
        ck_assert_uint_eq(client_do_value(&third, STEP_ALLOC, BLOCK), 1);
        client_finish(&engine, ENGINE_A); /* its claim lapses with its session */
        ck_assert_uint_eq(client_do(&third, STEP_MEM_GET_INFO), left);
        ck_assert_uint_eq(client_do_value(&third, STEP_ALLOC, BLOCK), 0);
        client_finish(&third, THIRD);
}
END_TEST

/* A claim lapses only at its session's end: after a daemon SIGKILL and
 * restart the re-attached session re-sends what is left of it (consumed
 * here by its allocations), the new daemon sets it aside again, a third
 * tenant is not offered it and is refused what would eat into it, and the
 * engine allocates all of it. */
START_TEST(test_claim_survives_restart) {
        client_t engine, third;
        client_start(&engine, ENGINE_A);
        ck_assert_uint_eq(client_do_value(&engine, STEP_CLAIM, 200 * MiB), 200 * MiB);
        ck_assert_uint_eq(client_do_value(&engine, STEP_ALLOC, 2 * BLOCK), 0);
        ck_assert_uint_eq(ctl_claimed_of(engine.pid), 200 * MiB - 2 * BLOCK);
        restart_until_claimed("256M", engine.pid, 200 * MiB - 2 * BLOCK);
        char tenant[32];
        snprintf(tenant, sizeof(tenant), "uid:%d", ENGINE_A);
        gpumem_tenant_usage u = tenant_usage(tenant);
        ck_assert_uint_eq(u.info.charged_bytes, 2 * BLOCK); /* what it held came back with it */
        ck_assert_uint_eq(u.claimed_bytes, 200 * MiB - 2 * BLOCK);

        client_start(&third, THIRD);
        uint64_t left = CAPACITY - 200 * MiB;
        ck_assert_uint_eq(client_do(&third, STEP_MEM_GET_INFO), left);           /* the claim is not offered */
        ck_assert_uint_eq(client_do_value(&third, STEP_ALLOC, left + BLOCK), 1); /* the last block would eat into it */
        ck_assert_uint_eq(client_do(&engine, STEP_MEM_GET_INFO), CAPACITY - 5 * BLOCK);    /* its claim is its own */
        ck_assert_uint_eq(client_do_value(&engine, STEP_ALLOC, 200 * MiB - 2 * BLOCK), 0); /* all of it, inside */
        client_finish(&third, THIRD);
        client_finish(&engine, ENGINE_A);
        ck_assert_uint_eq(tenant_usage(tenant).claimed_bytes, 0);
}
END_TEST

/* A new daemon that cannot give the whole claim back (a smaller device)
 * sets aside what it can: the session's claim is that smaller figure (shown
 * by gpumemctl, mem_get_info and the daemon's log), and the client knows
 * it: the next restart re-sends the smaller claim, not the first. */
START_TEST(test_claim_restored_smaller) {
        client_t engine;
        client_start(&engine, ENGINE_A);
        ck_assert_uint_eq(client_do_value(&engine, STEP_CLAIM, 200 * MiB), 200 * MiB);
        restart_until_claimed("128M", engine.pid, 128 * MiB);
        ck_assert_uint_eq(client_do(&engine, STEP_MEM_GET_INFO), 128 * MiB);
        char out[8192];
        const char *grep[] = {"/bin/grep", "-c", "re-attached with a claim of 209715200 bytes: 134217728 are free",
                              daemon_.log_path, NULL};
        ck_assert_msg(gm_test_run(out, sizeof(out), grep) == 0, "the daemon's log says nothing of the smaller claim");
        restart_until_claimed("256M", engine.pid, 128 * MiB);
        ck_assert_uint_eq(client_do(&engine, STEP_MEM_GET_INFO), CAPACITY); /* its own claim, and the rest free */
        client_finish(&engine, ENGINE_A);
}
END_TEST

/* A child forked after its parent claimed starts a session of its own that
 * claims nothing, and a restart keeps it so: only the parent's claim is
 * re-sent. (Host only: on cuda a forked child has no session.) */
START_TEST(test_claim_not_inherited_by_fork) {
        if (strcmp(gm_test_backend(), "host") != 0)
                return;
        gpumem_client *c;
        ck_assert_int_eq(gpumem_connect(daemon_.socket_path, &c), 0);
        uint64_t claimed = 0, free_now, total;
        ck_assert_int_eq(gpumem_claim(c, 64 * MiB, &claimed), 0);
        int to[2], from[2];
        ck_assert(pipe(to) == 0 && pipe(from) == 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) { /* its first call opens its own session; each step allocates and frees a block */
                char step;
                void *p;
                close(to[1]);
                close(from[0]);
                while (read(to[0], &step, 1) == 1 && step == STEP_ALLOC)
                        put(from[1], gpumem_alloc(c, 4096, 0, &p) < 0 || gpumem_free(c, p) < 0);
                _exit(0);
        }
        client_t child = {.pid = pid, .to = to[1], .from = from[0]};
        close(to[0]);
        close(from[1]);
        ck_assert_uint_eq(client_do(&child, STEP_ALLOC), 0);
        ck_assert_uint_eq(ctl_claimed_of(pid), 0);
        restart_until_claimed("256M", getpid(), 64 * MiB);
        ck_assert_uint_eq(client_do(&child, STEP_ALLOC), 0); /* re-attached by then */
        ck_assert_uint_eq(ctl_claimed_of(pid), 0);
        ck_assert_int_eq(gpumem_mem_get_info(c, &free_now, &total), 0);
        ck_assert_uint_eq(free_now, CAPACITY - 2 * MiB); /* the child's cached block, nobody else's claim */
        gpumem_disconnect(c);
        client_send(&child, STEP_EXIT);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exited with %d", status);
        close(child.to);
        close(child.from);
}
END_TEST

/* A claim counts against its tenant's quota: it is bounded by what the quota
 * leaves, and the tenant's other sessions can no longer take it. */
START_TEST(test_quota_counts_claims) {
        char tenant[32];
        snprintf(tenant, sizeof(tenant), "uid:%d", ENGINE_A);
        set_quota(tenant, 64 * MiB);
        client_t first, other;
        client_start(&first, ENGINE_A);
        client_start(&other, ENGINE_A);
        ck_assert_uint_eq(client_do_value(&first, STEP_CLAIM, 200 * MiB), 64 * MiB);
        ck_assert_uint_eq(client_do(&first, STEP_MEM_GET_INFO), 64 * MiB); /* its own claim is its to use */
        ck_assert_uint_eq(client_do(&other, STEP_MEM_GET_INFO), 0);
        ck_assert_uint_eq(client_do_value(&other, STEP_ALLOC, BLOCK), 1);
        ck_assert_uint_eq(client_do_value(&other, STEP_CLAIM, BLOCK), 0);
        gpumem_tenant_usage u = tenant_usage(tenant);
        ck_assert_uint_eq(u.claimed_bytes, 64 * MiB);
        ck_assert_uint_eq(u.info.charged_bytes, 0);
        ck_assert_uint_eq(client_do(&first, STEP_ALLOC_CLAIMED), 0); /* all of it, inside the claim */
        u = tenant_usage(tenant);
        ck_assert_uint_eq(u.claimed_bytes, 0);
        ck_assert_uint_eq(u.info.charged_bytes, 64 * MiB);
        client_finish(&first, ENGINE_A);
        client_finish(&other, ENGINE_A);
        set_quota(tenant, 0);
}
END_TEST

/* What the wire refuses: a claim beyond the capacity. */
START_TEST(test_claim_beyond_capacity_refused) {
        gpumem_client *c;
        ck_assert_int_eq(gpumem_connect(daemon_.socket_path, &c), 0);
        uint64_t claimed = 7;
        ck_assert_int_eq(gpumem_claim(c, CAPACITY + 1, &claimed), -EINVAL);
        ck_assert_uint_eq(claimed, 7); /* written only on success */
        ck_assert_ptr_nonnull(strstr(gpumem_last_error(c), "capacity"));
        ck_assert_int_eq(gpumem_claim(c, CAPACITY, &claimed), 0);
        ck_assert_uint_eq(claimed, CAPACITY);
        ck_assert_int_eq(gpumem_claim(NULL, 1, &claimed), -EINVAL);
        ck_assert_int_eq(gpumem_claim(c, 1, NULL), -EINVAL);
        gpumem_disconnect(c);
}
END_TEST

int main(void) {
        Suite *s = suite_create("claim");
        TCase *tc = tcase_create("claim");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        if (geteuid() == 0) { /* clients of their own tenants */
                tcase_add_test(tc, test_two_engines_never_over_commit);
                tcase_add_test(tc, test_third_tenant_refused_while_claim_stands);
                tcase_add_test(tc, test_quota_counts_claims);
                tcase_add_test(tc, test_claim_survives_restart);
                tcase_add_test(tc, test_claim_restored_smaller);
        } else {
                fprintf(stderr, "test_claim: not root: the tests with clients of other uids are skipped\n");
        }
        tcase_add_test(tc, test_claim_beyond_capacity_refused);
        tcase_add_test(tc, test_claim_not_inherited_by_fork);
        suite_add_tcase(s, tc);
        return gm_test_run_suite(s);
}
