/* gm-test-client: a client process for integration tests that must run as
 * another user (under setpriv) or hold memory while the test acts.
 *
 *   gm-test-client SOCKET hold SIZE SEED   alloc SIZE, fill it from SEED, print "ready", wait for
 *                                         stdin to close, verify, free; exit 0 if intact
 *   gm-test-client SOCKET cache SIZE N     alloc N blocks of SIZE, free them (cached), print
 *                                         "ready", wait for stdin to close
 *   gm-test-client SOCKET zero SIZE        alloc SIZE and exit 0 if every byte is 0
 *   gm-test-client SOCKET try SIZE N       alloc N blocks of SIZE (kept), printing "ok" or
 *                                         "refused ERRNO MESSAGE" for each; exit 0
 *   gm-test-client SOCKET race SIZE ROUNDS alloc SIZE blocks until refused, free all, ROUNDS
 *                                         times; print "granted=G refused=R"; exit 0 if every
 *                                         refusal was -EDQUOT
 *   gm-test-client SOCKET fenced SEED 0    page reuse on a device backend: free a block, then
 *                                         allocate so that the daemon asks for the fence after
 *                                         the free (the event stays pending while
 *                                         FAKECUDA_HOLD_EVENTS holds it), print "ready"; on each
 *                                         line read allocate 32 MiB, verify every block, print
 *                                         "ok" (or "bad"); free all at EOF
 *   gm-test-client SOCKET survive SEED 0   hold a mix of blocks (some freed, cached), print
 *                                         "ready A R S" (allocated, reserved, segments); on each
 *                                         "check" line verify every block, print "stats A R S",
 *                                         allocate/verify/free more, print "ok"; free all at EOF
 *   gm-test-client SOCKET blocks N 0       alloc N blocks (sizes and streams mixed, with a stack
 *                                         naming the block), free every third, print "ready"
 *                                         and, on each line read, alloc and free one more; free
 *                                         all at EOF (snapshots)
 *   gm-test-client SOCKET pools SEED 0     page reuse: a small-pool and a large-pool segment (one
 *                                         page moved between them, a freed 6 MiB block cached
 *                                         in the large one); print "ready POOLS" (reserved bytes
 *                                         and segments per pool from the stats, segments per
 *                                         segment_type in the JSON snapshot); on each "check"
 *                                         line verify the blocks, print "pools POOLS", allocate
 *                                         6 MiB, print "reused" when it lands where the freed
 *                                         block was, else "elsewhere", free it; free all at EOF
 *   gm-test-client SOCKET tagged SEED 0    tagged pools: 12 MiB and 1 MiB in pool "kv", 4 MiB in
 *                                         "weights", 1 MiB in the default pool, filled from SEED;
 *                                         print "ready"; on each line read verify them, then
 *                                         allocate 12 MiB more in "kv" and print "kv ok" (freed
 *                                         again) or "kv refused ERRNO", then "intact" or
 *                                         "corrupt"; free all at EOF
 * Exit status 0 on success, 1 on failure (message on stderr). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "testutil.h"

/* Reserved bytes and segments per pool as the stats say, and segments per
 * segment_type in the session's JSON snapshot. */
static bool print_pools(gpumem_client *c, const char *tag) {
        static const char *const keys[] = {"reserved_bytes.large_pool.current", "reserved_bytes.small_pool.current",
                                           "segment.large_pool.current", "segment.small_pool.current"};
        int64_t v[4];
        for (int i = 0; i < 4; i++)
                if (gpumem_stat(c, keys[i], &v[i]) < 0) {
                        fprintf(stderr, "stat: %s\n", gpumem_last_error(c));
                        return false;
                }
        void *snap;
        size_t len;
        if (gpumem_snapshot(c, GPUMEM_SNAPSHOT_JSON, (uint32_t) getpid(), &snap, &len) < 0) {
                fprintf(stderr, "snapshot: %s\n", gpumem_last_error(c));
                return false;
        }
        unsigned n_large = 0, n_small = 0;
        char *text = strndup(snap, len);
        for (const char *t = text; t && (t = strstr(t, "\"segment_type\"")); t++) {
                const char *value = strchr(t + strlen("\"segment_type\""), '"');
                if (value && strncmp(value, "\"large\"", 7) == 0)
                        n_large++;
                else if (value && strncmp(value, "\"small\"", 7) == 0)
                        n_small++;
        }
        free(text);
        gpumem_buffer_free(snap);
        printf("%s %lld %lld %lld %lld snapshot %u %u\n", tag, (long long) v[0], (long long) v[1], (long long) v[2],
               (long long) v[3], n_large, n_small);
        fflush(stdout);
        return true;
}

static void wait_stdin_closed(void) {
        char buf[64];
        while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
        }
}

int main(int argc, char **argv) {
        if (argc < 4) {
                fprintf(stderr, "usage: gm-test-client SOCKET hold|cache|zero|race ARGS\n");
                return 2;
        }
        gpumem_client *c;
        int r = gpumem_connect(argv[1], &c);
        if (r < 0) {
                fprintf(stderr, "connect: %s\n", gpumem_strerror(r));
                return 1;
        }
        const char *cmd = argv[2];
        size_t size = strtoull(argv[3], NULL, 10);
        int status = 0;
        if (strcmp(cmd, "hold") == 0 && argc == 5) {
                void *p;
                uint64_t seed = strtoull(argv[4], NULL, 10);
                if ((r = gpumem_alloc(c, size, 0, &p)) < 0) {
                        fprintf(stderr, "alloc: %s\n", gpumem_last_error(c));
                        return 1;
                }
                gm_test_fill(p, size, seed);
                printf("ready\n");
                fflush(stdout);
                wait_stdin_closed();
                status = gm_test_verify(p, size, seed) ? 0 : 1;
                gpumem_free(c, p);
        } else if (strcmp(cmd, "cache") == 0 && argc == 5) {
                int n = atoi(argv[4]);
                void **p = calloc((size_t) n, sizeof(*p));
                for (int i = 0; i < n; i++)
                        if ((r = gpumem_alloc(c, size, 0, &p[i])) < 0) {
                                fprintf(stderr, "alloc: %s\n", gpumem_last_error(c));
                                return 1;
                        }
                for (int i = 0; i < n; i++) {
                        gm_test_fill(p[i], size, 0xabababab); /* bytes another tenant must never see */
                        gpumem_free(c, p[i]);
                }
                free(p);
                printf("ready\n");
                fflush(stdout);
                wait_stdin_closed();
        } else if (strcmp(cmd, "try") == 0 && argc == 5) {
                for (int i = 0, n = atoi(argv[4]); i < n; i++) {
                        void *p;
                        if ((r = gpumem_alloc(c, size, 0, &p)) < 0)
                                printf("refused %d %s\n", -r, gpumem_last_error(c));
                        else
                                printf("ok\n");
                }
                fflush(stdout);
        } else if (strcmp(cmd, "zero") == 0) {
                void *p;
                if ((r = gpumem_alloc(c, size, 0, &p)) < 0) {
                        fprintf(stderr, "alloc: %s\n", gpumem_last_error(c));
                        return 1;
                }
                size_t dirty = gm_test_first_nonzero(p, size);
                if (dirty != size) {
                        fprintf(stderr, "byte %zu is not 0: memory was not fresh\n", dirty);
                        status = 1;
                }
                gpumem_free(c, p);
        } else if (strcmp(cmd, "race") == 0 && argc == 5) {
                int rounds = atoi(argv[4]);
                long granted = 0, refused = 0;
                void *held[256];
                for (int round = 0; round < rounds && status == 0; round++) {
                        int n = 0;
                        while (n < 256) {
                                r = gpumem_alloc(c, size, 0, &held[n]);
                                if (r == -EDQUOT) {
                                        refused++;
                                        break;
                                }
                                if (r < 0) {
                                        fprintf(stderr, "alloc: %s: %s\n", gpumem_strerror(r), gpumem_last_error(c));
                                        status = 1;
                                        break;
                                }
                                gm_test_fill(held[n], 1, 1); /* touched (by a kernel on cuda) */
                                n++;
                                granted++;
                        }
                        while (n > 0)
                                gpumem_free(c, held[--n]);
                }
                printf("granted=%ld refused=%ld\n", granted, refused);
        } else if (strcmp(cmd, "fenced") == 0 && argc == 5) {
                enum { HALF = 16u << 20, WHOLE = 32u << 20, MORE = 8 };
                void *a, *b, *big, *more[MORE];
                uint64_t seed = size;
                int n_more = 0;
                if (gpumem_alloc(c, HALF, 0, &a) < 0 || gpumem_alloc(c, HALF, 0, &b) < 0) {
                        fprintf(stderr, "alloc: %s\n", gpumem_last_error(c));
                        return 1;
                }
                gm_test_fill(b, HALF, seed);
                gpumem_free(c, a);
                if (gpumem_alloc(c, WHOLE, 0, &big) < 0) { /* a's fence is asked for, and marked */
                        fprintf(stderr, "alloc: %s\n", gpumem_last_error(c));
                        return 1;
                }
                gm_test_fill(big, WHOLE, seed + 1);
                printf("ready\n");
                fflush(stdout);
                char line[64];
                while (n_more < MORE && fgets(line, sizeof(line), stdin)) {
                        bool ok = gpumem_alloc(c, WHOLE, 0, &more[n_more]) == 0;
                        if (!ok)
                                fprintf(stderr, "alloc after restart: %s\n", gpumem_last_error(c));
                        else
                                gm_test_fill(more[n_more++], WHOLE, seed + 2);
                        ok = ok && gm_test_verify(b, HALF, seed) && gm_test_verify(big, WHOLE, seed + 1);
                        for (int k = 0; k < n_more; k++)
                                ok = ok && gm_test_verify(more[k], WHOLE, seed + 2);
                        printf("%s\n", ok ? "ok" : "bad");
                        fflush(stdout);
                }
                while (n_more > 0)
                        gpumem_free(c, more[--n_more]);
                gpumem_free(c, big);
                gpumem_free(c, b);
        } else if (strcmp(cmd, "survive") == 0) {
                static const size_t sizes[] = {1000,      300000, 900000, 3u << 20, 12u << 20,
                                               25u << 20, 4096,   600000, 5u << 20, 12u << 20};
                enum { N = sizeof(sizes) / sizeof(sizes[0]) };
                void *p[N];
                uint64_t seed = size;
                for (int i = 0; i < N; i++) {
                        if ((r = gpumem_alloc(c, sizes[i], (uint64_t) (i % 2), &p[i])) < 0) {
                                fprintf(stderr, "alloc: %s\n", gpumem_last_error(c));
                                return 1;
                        }
                        gm_test_fill(p[i], sizes[i], seed + (uint64_t) i);
                }
                gpumem_free(c, p[1]); /* cached, split */
                gpumem_free(c, p[4]); /* a whole idle segment */
                p[1] = p[4] = NULL;
                int64_t a, rsv, seg;
                gpumem_stat(c, "allocated_bytes.all.current", &a);
                gpumem_stat(c, "reserved_bytes.all.current", &rsv);
                gpumem_stat(c, "segment.all.current", &seg);
                printf("ready %lld %lld %lld\n", (long long) a, (long long) rsv, (long long) seg);
                fflush(stdout);
                char line[64];
                size_t n = 0;
                ssize_t got;
                while ((got = read(STDIN_FILENO, line + n, 1)) == 1) {
                        if (line[n] != '\n' && n + 1 < sizeof(line)) {
                                n++;
                                continue;
                        }
                        n = 0;
                        bool intact = true;
                        for (int i = 0; i < N; i++)
                                if (p[i] && !gm_test_verify(p[i], sizes[i], seed + (uint64_t) i))
                                        intact = false;
                        if ((r = gpumem_stat(c, "allocated_bytes.all.current", &a)) < 0 ||
                            gpumem_stat(c, "reserved_bytes.all.current", &rsv) < 0 ||
                            gpumem_stat(c, "segment.all.current", &seg) < 0) {
                                fprintf(stderr, "stat: %s\n", gpumem_last_error(c));
                                return 1;
                        }
                        printf("stats %lld %lld %lld\n", (long long) a, (long long) rsv, (long long) seg);
                        void *q[2];
                        bool more = true;
                        for (int k = 0; k < 2; k++) {
                                if (gpumem_alloc(c, 7u << 20, 0, &q[k]) < 0) {
                                        fprintf(stderr, "alloc after restart: %s\n", gpumem_last_error(c));
                                        more = false;
                                        q[k] = NULL;
                                        continue;
                                }
                                gm_test_fill(q[k], 7u << 20, 77 + (uint64_t) k);
                        }
                        for (int k = 0; k < 2; k++)
                                if (q[k]) {
                                        more = more && gm_test_verify(q[k], 7u << 20, 77 + (uint64_t) k);
                                        gpumem_free(c, q[k]);
                                }
                        printf("%s\n", intact && more ? "ok" : "bad");
                        fflush(stdout);
                }
                for (int i = 0; i < N; i++)
                        if (p[i])
                                gpumem_free(c, p[i]);
        } else if (strcmp(cmd, "pools") == 0 && argc == 5) {
                /* Four 1 MiB small-pool blocks on two 2 MiB pages; the top
                 * page's two are freed, so the first large request takes that
                 * page (page reuse moves it to the large-pool segment) and
                 * maps two new ones; a second 6 MiB block is freed (cached,
                 * mapped, in the large pool). */
                enum { SMALL = 1u << 20, LARGE = 6u << 20 };
                void *small[4], *large, *cached;
                uint64_t seed = size;
                for (int i = 0; i < 4; i++)
                        if (gpumem_alloc(c, SMALL, 0, &small[i]) < 0) {
                                fprintf(stderr, "alloc: %s\n", gpumem_last_error(c));
                                return 1;
                        }
                gpumem_free(c, small[2]);
                gpumem_free(c, small[3]);
                if (gpumem_alloc(c, LARGE, 0, &large) < 0 || gpumem_alloc(c, LARGE, 0, &cached) < 0) {
                        fprintf(stderr, "alloc: %s\n", gpumem_last_error(c));
                        return 1;
                }
                gm_test_fill(small[0], SMALL, seed);
                gm_test_fill(small[1], SMALL, seed + 1);
                gm_test_fill(large, LARGE, seed + 2);
                gpumem_free(c, cached);
                if (!print_pools(c, "ready"))
                        return 1;
                char line[64];
                while (fgets(line, sizeof(line), stdin)) {
                        bool intact = gm_test_verify(small[0], SMALL, seed) &&
                                      gm_test_verify(small[1], SMALL, seed + 1) &&
                                      gm_test_verify(large, LARGE, seed + 2);
                        if (!print_pools(c, "pools"))
                                return 1;
                        void *again;
                        if (gpumem_alloc(c, LARGE, 0, &again) < 0) {
                                fprintf(stderr, "alloc after restart: %s\n", gpumem_last_error(c));
                                return 1;
                        }
                        gm_test_fill(again, LARGE, seed + 3);
                        intact = intact && gm_test_verify(again, LARGE, seed + 3) &&
                                 gm_test_verify(large, LARGE, seed + 2);
                        printf("%s %s\n", again == cached ? "reused" : "elsewhere", intact ? "intact" : "corrupt");
                        fflush(stdout);
                        gpumem_free(c, again);
                }
                gpumem_free(c, large);
                gpumem_free(c, small[0]);
                gpumem_free(c, small[1]);
        } else if (strcmp(cmd, "tagged") == 0 && argc == 5) {
                static const char *const pools[] = {"kv", "kv", "weights", NULL};
                static const size_t sizes[] = {12u << 20, 1u << 20, 4u << 20, 1u << 20};
                void *p[4];
                uint64_t seed = size;
                for (int i = 0; i < 4; i++) {
                        if (pools[i])
                                gpumem_pool_begin(c, pools[i]);
                        r = gpumem_alloc(c, sizes[i], 0, &p[i]);
                        if (pools[i])
                                gpumem_pool_end(c);
                        if (r < 0) {
                                fprintf(stderr, "alloc: %s\n", gpumem_last_error(c));
                                return 1;
                        }
                        gm_test_fill(p[i], sizes[i], seed + (uint64_t) i);
                }
                printf("ready\n");
                fflush(stdout);
                char line[64];
                while (fgets(line, sizeof(line), stdin)) {
                        bool intact = true;
                        for (int i = 0; i < 4; i++)
                                intact = intact && gm_test_verify(p[i], sizes[i], seed + (uint64_t) i);
                        void *more;
                        gpumem_pool_begin(c, "kv");
                        r = gpumem_alloc(c, 12u << 20, 0, &more);
                        gpumem_pool_end(c);
                        if (r == 0) {
                                printf("kv ok\n");
                                gpumem_free(c, more);
                        } else {
                                printf("kv refused %d\n", -r);
                        }
                        printf("%s\n", intact ? "intact" : "corrupt");
                        fflush(stdout);
                }
                for (int i = 0; i < 4; i++)
                        gpumem_free(c, p[i]);
        } else if (strcmp(cmd, "blocks") == 0 && argc == 5) {
                static const size_t mixed[] = {512, 3000, 700000, 3u << 20, 1000, 40000};
                static const size_t small[] = {512, 1024, 3000, 512, 1500, 4000}; /* many blocks */
                size_t n = size;
                const size_t *sizes = n <= 1000 ? mixed : small;
                void **p = calloc(n ? n : 1, sizeof(*p));
                for (size_t i = 0; i < n; i++) {
                        char name[32];
                        snprintf(name, sizeof(name), "block_%zu", i % 7);
                        const gpumem_frame frames[2] = {
                                {.filename = "model.py", .line = (uint32_t) (i % 7), .name = name},
                                {.filename = "train.py", .line = 1, .name = "main"}};
                        if ((r = gpumem_alloc_frames(c, sizes[i % 6], (uint64_t) (i % 3 == 1), frames, 2, &p[i])) < 0) {
                                fprintf(stderr, "alloc: %s\n", gpumem_last_error(c));
                                return 1;
                        }
                }
                for (size_t i = 0; i < n; i += 3) {
                        gpumem_free(c, p[i]);
                        p[i] = NULL;
                }
                printf("ready\n");
                fflush(stdout);
                char line[64];
                while (fgets(line, sizeof(line), stdin)) {
                        void *q;
                        if (gpumem_alloc(c, 5000, 0, &q) == 0)
                                gpumem_free(c, q);
                        printf("ok\n");
                        fflush(stdout);
                }
                for (size_t i = 0; i < n; i++)
                        if (p[i])
                                gpumem_free(c, p[i]);
                free(p);
        } else {
                fprintf(stderr, "bad command\n");
                status = 2;
        }
        gpumem_disconnect(c);
        return status;
}
