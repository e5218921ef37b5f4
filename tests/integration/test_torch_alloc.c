/* libgpumem_torch's entry points called exactly as PyTorch's
 * CUDAPluggableAllocator calls them (size, process device ordinal, stream;
 * free with the size, device and stream of the allocation), against two real
 * gpumemd processes found through GPUMEM_SOCKET_TEMPLATE: from several
 * threads, on both devices, on refusal, with no daemon, across fork() and
 * across a daemon that goes away and comes back. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem/gpumem.h"
#include "gpumem/torch.h"
#include "msg.h"
#include "testutil.h"

#define MiB (1024ull * 1024ull)

typedef struct CUstream_st *stream_t;

static gm_test_daemon_t dev[2];
static char template_dir[256];

/* gpu0.sock and gpu1.sock in one directory, links to the two daemons'
 * sockets, and the template that names them. */
static void link_template(void) {
        snprintf(template_dir, sizeof(template_dir), "/tmp/gpumem-torch-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(template_dir));
        for (int i = 0; i < 2; i++) {
                char link[300];
                snprintf(link, sizeof(link), "%s/gpu%d.sock", template_dir, i);
                ck_assert_int_eq(symlink(dev[i].socket_path, link), 0);
        }
        char tmpl[300];
        snprintf(tmpl, sizeof(tmpl), "%s/gpu%%d.sock", template_dir);
        ck_assert_int_eq(setenv("GPUMEM_SOCKET_TEMPLATE", tmpl, 1), 0);
}

static void setup(void) {
        static const char *const second[] = {"--device", "1", NULL};
        gm_test_daemon_start(&dev[0], "512M", NULL);
        gm_test_daemon_start(&dev[1], "512M", second);
        link_template();
}

static void teardown(void) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", template_dir);
        ck_assert_int_eq(system(cmd), 0);
        for (int i = 0; i < 2; i++)
                gm_test_daemon_stop(&dev[i]);
}

static int64_t stat_of(int device, const char *name) {
        return gm_test_device_stat(dev[device].socket_path, name);
}

/* ---- many threads, two devices ---- */

#define THREADS 6
#define ROUNDS 40
#define HELD 8

typedef struct worker {
        int id;
        pthread_barrier_t *barrier;
        size_t held_bytes[2]; /* what it holds at the barrier, by device */
        char failure[768];
} worker_t;

static size_t worker_size(int id, int round, int k) {
        static const size_t sizes[] = {512, 4000, 65536, 700000, 1 * MiB + 3, 3 * MiB};
        return sizes[(size_t) (id * 7 + round * 3 + k) % (sizeof(sizes) / sizeof(sizes[0]))];
}

static void *worker_main(void *arg) {
        worker_t *w = arg;
        void *ptrs[HELD];
        size_t sizes[HELD];
        int devices[HELD];
        stream_t streams[HELD];
        for (int round = 0; round <= ROUNDS && !w->failure[0]; round++) {
                for (int k = 0; k < HELD; k++) {
                        devices[k] = (w->id + k) % 2;
                        sizes[k] = worker_size(w->id, round, k);
                        /* Stream handles are only compared (a free is on the allocation stream). */
                        streams[k] =
                                (stream_t) (uintptr_t) (k % 3 == 0 ? 0
                                                                   : 0x1000 + 16 * (unsigned) w->id + (unsigned) k % 3);
                        ptrs[k] = gpumem_torch_alloc(sizes[k], devices[k], streams[k]);
                        if (!ptrs[k]) {
                                char why[512];
                                gpumem_torch_last_refusal(devices[k], why, sizeof(why), NULL);
                                snprintf(w->failure, sizeof(w->failure), "alloc %zu on %d: %s", sizes[k], devices[k],
                                         why);
                                return NULL;
                        }
                        gm_test_fill(ptrs[k], sizes[k], (uint64_t) (w->id * 1000 + round * HELD + k));
                }
                for (int k = 0; k < HELD; k++)
                        if (!gm_test_verify(ptrs[k], sizes[k], (uint64_t) (w->id * 1000 + round * HELD + k)))
                                snprintf(w->failure, sizeof(w->failure), "block %d of round %d overwritten", k, round);
                if (round == ROUNDS) { /* the last round is held while the main thread counts */
                        for (int k = 0; k < HELD; k++)
                                w->held_bytes[devices[k]] += sizes[k];
                        pthread_barrier_wait(w->barrier);
                        pthread_barrier_wait(w->barrier);
                }
                for (int k = 0; k < HELD; k++)
                        gpumem_torch_free(ptrs[k], sizes[k], devices[k], streams[k]);
        }
        return NULL;
}

START_TEST(test_threads_two_devices) {
        pthread_barrier_t barrier;
        ck_assert_int_eq(pthread_barrier_init(&barrier, NULL, THREADS + 1), 0);
        worker_t workers[THREADS] = {0};
        pthread_t threads[THREADS];
        for (int i = 0; i < THREADS; i++) {
                workers[i] = (worker_t){.id = i, .barrier = &barrier};
                ck_assert_int_eq(pthread_create(&threads[i], NULL, worker_main, &workers[i]), 0);
        }
        pthread_barrier_wait(&barrier); /* every thread holds its last round */
        int64_t want[2] = {0, 0};
        for (int i = 0; i < THREADS; i++)
                for (int d = 0; d < 2; d++)
                        want[d] += (int64_t) workers[i].held_bytes[d];
        for (int d = 0; d < 2; d++) {
                /* Each device's daemon holds exactly the bytes asked of that device. */
                ck_assert_int_eq(gm_test_wait_device_stat(dev[d].socket_path, "requested_bytes.all.current", want[d]),
                                 want[d]);
                char out[8192];
                const char *argv[] = {GPUMEMCTL_BIN, "-s", dev[d].socket_path, "clients", "--json", NULL};
                ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
                char pid[32];
                snprintf(pid, sizeof(pid), "\"pid\": %d,", (int) getpid());
                char *first = strstr(out, pid);
                ck_assert_msg(first && !strstr(first + 1, pid), "one session per device: %s", out);
        }
        pthread_barrier_wait(&barrier);
        for (int i = 0; i < THREADS; i++) {
                ck_assert_int_eq(pthread_join(threads[i], NULL), 0);
                ck_assert_msg(!workers[i].failure[0], "thread %d: %s", i, workers[i].failure);
        }
        pthread_barrier_destroy(&barrier);
        for (int d = 0; d < 2; d++) {
                ck_assert_int_eq(gm_test_wait_device_stat(dev[d].socket_path, "allocated_bytes.all.current", 0), 0);
                ck_assert_int_gt(stat_of(d, "allocation.all.allocated"), THREADS * ROUNDS);
        }
        ck_assert_int_eq(gpumem_torch_last_refusal(0, NULL, 0, NULL), 0);
        ck_assert_int_eq(gpumem_torch_last_refusal(1, NULL, 0, NULL), 0);
}
END_TEST

/* ---- refusals: NULL, a diagnosis, one line on stderr per kind ---- */

/* Runs fn with stderr going to a file; returns what it wrote. */
static void capture_stderr(void (*fn)(void), char *buf, size_t len) {
        char path[] = "/tmp/gpumem-torch-stderr-XXXXXX";
        int fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        unlink(path);
        fflush(stderr);
        int saved = dup(STDERR_FILENO);
        dup2(fd, STDERR_FILENO);
        fn();
        fflush(stderr);
        dup2(saved, STDERR_FILENO);
        close(saved);
        ssize_t n = pread(fd, buf, len - 1, 0);
        buf[n > 0 ? n : 0] = '\0';
        close(fd);
}

static void refuse_three_times(void) {
        for (int i = 0; i < 3; i++)
                ck_assert_ptr_null(gpumem_torch_alloc(1ull << 40, 1, NULL));
}

static void refuse_by_quota(void) {
        ck_assert_ptr_null(gpumem_torch_alloc(64 * MiB, 1, NULL));
}

START_TEST(test_refusal_null_diagnosis_logged_once) {
        char err[8192];
        capture_stderr(refuse_three_times, err, sizeof(err));
        char why[2048];
        uint64_t n = 0;
        ck_assert_int_eq(gpumem_torch_last_refusal(1, why, sizeof(why), &n), -ENOMEM);
        ck_assert_uint_eq(n, 3);
        ck_assert_msg(strstr(why, "tried to allocate 1.00 TiB"), "diagnosis: %s", why);
        ck_assert_msg(gm_test_count(err, "refused") == 1, "one stderr report for three refusals: %s", err);
        ck_assert_ptr_nonnull(strstr(err, "cuda:1"));
        ck_assert_ptr_nonnull(strstr(err, why));                          /* the same diagnosis */
        ck_assert_int_eq(gpumem_torch_last_refusal(0, NULL, 0, NULL), 0); /* the other device is untouched */

        /* A quota refusal is another kind: reported once more. */
        char out[4096];
        const char *set[] = {GPUMEMCTL_BIN, "-s",  dev[1].socket_path, "quota", "set",
                             "uid:0",       "32M", "--runtime",        NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), set), 0);
        capture_stderr(refuse_by_quota, err, sizeof(err));
        ck_assert_int_eq(gpumem_torch_last_refusal(1, why, sizeof(why), &n), -EDQUOT);
        ck_assert_uint_eq(n, 4);
        ck_assert_msg(strstr(why, "quota"), "diagnosis: %s", why);
        ck_assert_msg(gm_test_count(err, "refused") == 1, "quota refusal reported: %s", err);

        /* Within the quota it works, and size 0 is NULL without a refusal. */
        void *p = gpumem_torch_alloc(8 * MiB, 1, NULL);
        ck_assert_ptr_nonnull(p);
        ck_assert_ptr_null(gpumem_torch_alloc(0, 1, NULL));
        gpumem_torch_free(p, 8 * MiB, 1, NULL);
        gpumem_torch_free(NULL, 0, 1, NULL);
        ck_assert_int_eq(gpumem_torch_last_refusal(1, NULL, 0, &n), -EDQUOT);
        ck_assert_uint_eq(n, 4);
}
END_TEST

START_TEST(test_no_daemon_is_null_not_hang) {
        /* Device 2 has no socket: refused at once, with the path in the message. */
        ck_assert_ptr_null(gpumem_torch_alloc(4096, 2, NULL));
        char why[2048];
        ck_assert_int_eq(gpumem_torch_last_refusal(2, why, sizeof(why), NULL), -ENODEV);
        ck_assert_msg(strstr(why, template_dir) && strstr(why, "gpu2.sock"), "diagnosis: %s", why);
        ck_assert_ptr_null(gpumem_torch_alloc(4096, -1, NULL));
        ck_assert_ptr_null(gpumem_torch_alloc(4096, GPUMEM_TORCH_MAX_DEVICES, NULL));
        gpumem_client *c;
        ck_assert_int_eq(gpumem_torch_client(2, &c), -ENODEV);
        ck_assert_ptr_nonnull(strstr(gpumem_last_error(NULL), "gpu2.sock"));
        /* A template without exactly one %d is refused, not guessed. */
        ck_assert_int_eq(setenv("GPUMEM_SOCKET_TEMPLATE", "/tmp/gpu%s.sock", 1), 0);
        ck_assert_int_eq(gpumem_connect_device(3, &c), -EINVAL);
        ck_assert_ptr_nonnull(strstr(gpumem_last_error(NULL), "GPUMEM_SOCKET_TEMPLATE"));
}
END_TEST

/* ---- fork ---- */

/* A forked child's first call starts a session of its own. On the cuda
 * backend the child cannot map device memory at all (CUDA does not survive
 * fork()): its allocation is refused with a diagnosis, never hangs, and the
 * parent's session is untouched either way. */
START_TEST(test_fork_child_gets_its_own_session) {
        bool cuda = strcmp(gm_test_backend(), "cuda") == 0;
        void *p = gpumem_torch_alloc(2 * MiB, 0, NULL);
        ck_assert_ptr_nonnull(p);
        gm_test_fill(p, 2 * MiB, 7);
        int up[2], down[2];
        ck_assert_int_eq(pipe(up), 0);
        ck_assert_int_eq(pipe(down), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                void *q = gpumem_torch_alloc(3 * MiB, 0, NULL);
                bool ok = cuda ? !q && gpumem_torch_last_refusal(0, NULL, 0, NULL) < 0 : q != NULL;
                if (q)
                        gm_test_fill(q, 3 * MiB, 9);
                char line = ok ? 'y' : 'n', go;
                ok = write(up[1], &line, 1) == 1 && read(down[0], &go, 1) == 1 && ok;
                if (q) {
                        ok = ok && gm_test_verify(q, 3 * MiB, 9);
                        gpumem_torch_free(q, 3 * MiB, 0, NULL);
                }
                /* The parent's pointer is not the child's: refused, not freed. */
                gpumem_torch_free(p, 2 * MiB, 0, NULL);
                ok = ok && gpumem_torch_last_refusal(0, NULL, 0, NULL) == -EINVAL;
                _exit(ok ? 0 : 1);
        }
        char line = 0;
        ck_assert_int_eq(read(up[0], &line, 1), 1);
        ck_assert_int_eq(line, 'y');
        /* The child holds its block in a session of its own. */
        char out[8192], want[64];
        const char *argv[] = {GPUMEMCTL_BIN, "-s", dev[0].socket_path, "clients", "--json", NULL};
        ck_assert_int_eq(gm_test_run(out, sizeof(out), argv), 0);
        snprintf(want, sizeof(want), "\"pid\": %d,", (int) pid);
        ck_assert_msg(cuda || strstr(out, want), "no session of the child %d: %s", (int) pid, out);
        ck_assert_int_eq(stat_of(0, "requested_bytes.all.current"), (int64_t) ((cuda ? 2 : 5) * MiB));
        ck_assert_int_eq(write(down[1], "g", 1), 1);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
        /* The child's session ended with it; the parent's block is intact and its own. */
        ck_assert_int_eq(gm_test_wait_device_stat(dev[0].socket_path, "requested_bytes.all.current", 2 * MiB), 2 * MiB);
        ck_assert(gm_test_verify(p, 2 * MiB, 7));
        gpumem_torch_free(p, 2 * MiB, 0, NULL);
        ck_assert_int_eq(gm_test_wait_device_stat(dev[0].socket_path, "allocated_bytes.all.current", 0), 0);
        ck_assert_int_eq(gpumem_torch_last_refusal(0, NULL, 0, NULL), 0);
        for (int i = 0; i < 2; i++) {
                close(up[i]);
                close(down[i]);
        }
}
END_TEST

/* ---- the daemon goes away and comes back ---- */

/* The daemon stops and starts again under a session of heap mode `heap`
 * ("central" or "local"). */
static void daemon_gone_then_back(const char *heap) {
        ck_assert_int_eq(setenv("GPUMEM_HEAP", heap, 1), 0);
        ck_assert_int_eq(setenv("GPUMEM_RECONNECT_TIMEOUT_MS", "300", 1), 0);
        bool local = strcmp(heap, "local") == 0;
        void *p = gpumem_torch_alloc(1 * MiB, 0, NULL); /* one 2 MiB segment of the small pool */
        ck_assert_ptr_nonnull(p);
        dev[0].keep_dir = true;
        gm_test_daemon_stop(&dev[0]);
        char why[2048];
        uint64_t refusals = 0;
        if (local) {
                /* The heap is in this process: its cache still serves without the daemon. */
                void *cached = gpumem_torch_alloc(1 * MiB, 0, NULL);
                ck_assert_msg(cached != NULL, "cached allocation: %s",
                              (gpumem_torch_last_refusal(0, why, sizeof(why), NULL), why));
                gm_test_fill(cached, 1 * MiB, 3);
                ck_assert(gm_test_verify(cached, 1 * MiB, 3));
                gpumem_torch_free(cached, 1 * MiB, 0, NULL);
                gpumem_torch_last_refusal(0, NULL, 0, &refusals);
        }
        /* No daemon: memory the heap must ask for is refused within the
         * re-attach window, never a hang, and the refusal says why. */
        ck_assert_ptr_null(gpumem_torch_alloc(local ? 5 * MiB : 1 * MiB, 0, NULL));
        uint64_t count = 0;
        int err = gpumem_torch_last_refusal(0, why, sizeof(why), &count);
        ck_assert_msg(err == -ENODEV || err == -ECONNRESET, "refusal %d: %s", err, why);
        ck_assert_msg(strstr(why, "gpumemd"), "refusal without a diagnosis: %s", why);
        ck_assert_uint_eq(count, refusals + 1);
        /* The daemon is back: the next allocation is a new session. */
        gm_test_daemon_launch(&dev[0], "256M", NULL);
        dev[0].keep_dir = false;
        void *q = gpumem_torch_alloc(5 * MiB, 0, NULL);
        ck_assert_msg(q != NULL, "after the restart: %s", (gpumem_torch_last_refusal(0, why, sizeof(why), NULL), why));
        ck_assert_int_eq(stat_of(0, "requested_bytes.all.current"), (int64_t) (5 * MiB));
        /* The old pointer went with the old session: its free is quiet. */
        uint64_t before, after;
        gpumem_torch_last_refusal(0, NULL, 0, &before);
        gpumem_torch_free(p, 1 * MiB, 0, NULL);
        gpumem_torch_last_refusal(0, NULL, 0, &after);
        ck_assert_uint_eq(before, after);
        gpumem_torch_free(q, 5 * MiB, 0, NULL);
        ck_assert_int_eq(gm_test_wait_device_stat(dev[0].socket_path, "allocated_bytes.all.current", 0), 0);
}

START_TEST(test_daemon_gone_then_back_central) {
        daemon_gone_then_back("central");
}
END_TEST

START_TEST(test_daemon_gone_then_back_local) {
        daemon_gone_then_back("local");
}
END_TEST

/* ---- record_stream, empty_cache, the session handle ---- */

START_TEST(test_record_stream_and_empty_cache) {
        /* Streams any CUDA context has: the legacy default and the per-thread one. */
        stream_t s1 = NULL, s2 = (stream_t) (uintptr_t) 0x2 /* CU_STREAM_PER_THREAD */;
        void *p = gpumem_torch_alloc(4 * MiB, 1, s1);
        ck_assert_ptr_nonnull(p);
        gpumem_torch_record_stream(p, s2);
        gpumem_torch_free(p, 4 * MiB, 1, s1);
        ck_assert_int_eq(gm_test_wait_device_stat(dev[1].socket_path, "allocated_bytes.all.current", 0), 0);
        /* cuda: the block stays active until the event on s2 completes. */
        ck_assert_int_eq(gm_test_wait_device_stat(dev[1].socket_path, "active_bytes.all.current", 0), 0);
        ck_assert_int_gt(stat_of(1, "reserved_bytes.all.current"), 0); /* cached */
        gpumem_torch_empty_cache();
        ck_assert_int_eq(gm_test_wait_device_stat(dev[1].socket_path, "reserved_bytes.all.current", 0), 0);
        gpumem_client *c = NULL, *again = NULL;
        ck_assert_int_eq(gpumem_torch_client(1, &c), 0);
        ck_assert_int_eq(gpumem_torch_client(1, &again), 0);
        ck_assert_ptr_eq(c, again); /* one session per device */
        int64_t v;
        ck_assert_int_eq(gpumem_stat(c, "num_device_free", &v), 0);
        ck_assert_int_ge(v, 1);
}
END_TEST

/* ---- memory fraction, private pools ---- */

START_TEST(test_memory_fraction_limits_the_process) {
        gpumem_torch_set_memory_fraction(0.25, 1); /* of 512 MiB: 128 MiB */
        void *a = gpumem_torch_alloc(100 * MiB, 1, NULL);
        ck_assert_ptr_nonnull(a);
        ck_assert_ptr_null(gpumem_torch_alloc(40 * MiB, 1, NULL));
        char why[2048];
        ck_assert_int_eq(gpumem_torch_last_refusal(1, why, sizeof(why), NULL), -ENOMEM);
        ck_assert_msg(strstr(why, "memory fraction 0.25"), "diagnosis: %s", why);
        void *other = gpumem_torch_alloc(200 * MiB, 0, NULL); /* another device has no limit */
        ck_assert_ptr_nonnull(other);
        gpumem_torch_free(a, 100 * MiB, 1, NULL);
        void *b = gpumem_torch_alloc(40 * MiB, 1, NULL); /* the freed bytes count no more */
        ck_assert_ptr_nonnull(b);
        gpumem_torch_set_memory_fraction(7.0, 1); /* out of range: ignored */
        ck_assert_ptr_null(gpumem_torch_alloc(100 * MiB, 1, NULL));
        gpumem_torch_set_memory_fraction(1.0, 1); /* no limit */
        void *c = gpumem_torch_alloc(100 * MiB, 1, NULL);
        ck_assert_ptr_nonnull(c);
        gpumem_torch_free(b, 40 * MiB, 1, NULL);
        gpumem_torch_free(c, 100 * MiB, 1, NULL);
        gpumem_torch_free(other, 200 * MiB, 0, NULL);
}
END_TEST

START_TEST(test_pool_blocks_not_reused_outside_the_pool) {
        const gpumem_torch_pool_id graph = {7, 0};
        stream_t s = NULL, side = (stream_t) (uintptr_t) 0x2;
        gpumem_torch_begin_allocate_to_pool(1, graph, NULL);
        void *p = gpumem_torch_alloc(4 * MiB, 1, s);
        ck_assert_ptr_nonnull(p);
        gpumem_torch_end_allocate_to_pool(1, graph);
        gpumem_torch_free(p, 4 * MiB, 1, s); /* a replay may still write it: kept by the pool */
        ck_assert_uint_eq(gpumem_torch_pool_kept_bytes(1), 4 * MiB);
        ck_assert_int_eq(stat_of(1, "allocated_bytes.all.current"), (int64_t) (4 * MiB));
        void *eager = gpumem_torch_alloc(4 * MiB, 1, s); /* outside the pool: another block */
        ck_assert_ptr_nonnull(eager);
        ck_assert_ptr_ne(eager, p);

        /* The pool allocating again (a second capture) reuses its own block on
         * its stream, not on another one. */
        gpumem_torch_begin_allocate_to_pool(1, graph, NULL);
        void *elsewhere = gpumem_torch_alloc(4 * MiB, 1, side);
        ck_assert_ptr_ne(elsewhere, p);
        void *again = gpumem_torch_alloc(2 * MiB, 1, s);
        ck_assert_ptr_eq(again, p);
        ck_assert_uint_eq(gpumem_torch_pool_kept_bytes(1), 0);
        gpumem_torch_free(again, 2 * MiB, 1, s);
        gpumem_torch_free(elsewhere, 4 * MiB, 1, side);
        gpumem_torch_end_allocate_to_pool(1, graph);
        ck_assert_uint_eq(gpumem_torch_pool_kept_bytes(1), 8 * MiB);

        /* Released by both captures, its blocks go back to libgpumem; only the
         * eager one stays. */
        gpumem_torch_release_pool(1, graph);
        gpumem_torch_release_pool(1, graph);
        ck_assert_uint_eq(gpumem_torch_pool_kept_bytes(1), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(dev[1].socket_path, "allocated_bytes.all.current", 4 * MiB),
                         (int64_t) (4 * MiB));
        gpumem_torch_release_pool(1, graph); /* once more, or unknown: ignored */
        gpumem_torch_free(eager, 4 * MiB, 1, s);
        ck_assert_int_eq(gm_test_wait_device_stat(dev[1].socket_path, "allocated_bytes.all.current", 0), 0);
}
END_TEST

START_TEST(test_pool_block_in_use_at_release_and_record_stream) {
        const gpumem_torch_pool_id graph = {9, 1};
        stream_t s = NULL, side = (stream_t) (uintptr_t) 0x2;
        gpumem_torch_begin_allocate_to_pool(1, graph, NULL);
        void *used_elsewhere = gpumem_torch_alloc(4 * MiB, 1, s);
        void *live = gpumem_torch_alloc(4 * MiB, 1, s);
        ck_assert_ptr_nonnull(used_elsewhere);
        ck_assert_ptr_nonnull(live);
        gpumem_torch_record_stream(used_elsewhere, side);
        gpumem_torch_free(used_elsewhere, 4 * MiB, 1, s);
        void *fresh = gpumem_torch_alloc(4 * MiB, 1, s); /* the side stream may still use it: not reused */
        ck_assert_ptr_ne(fresh, used_elsewhere);
        gpumem_torch_end_allocate_to_pool(1, graph);
        gpumem_torch_release_pool(1, graph);
        ck_assert_uint_eq(gpumem_torch_pool_kept_bytes(1), 0);
        /* Blocks still in use at release go back to libgpumem when freed. */
        gpumem_torch_free(live, 4 * MiB, 1, s);
        gpumem_torch_free(fresh, 4 * MiB, 1, s);
        ck_assert_uint_eq(gpumem_torch_pool_kept_bytes(1), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(dev[1].socket_path, "allocated_bytes.all.current", 0), 0);
        /* The same id after release is a new pool. */
        gpumem_torch_begin_allocate_to_pool(1, graph, NULL);
        void *p = gpumem_torch_alloc(MiB, 1, s);
        gpumem_torch_end_allocate_to_pool(1, graph);
        gpumem_torch_free(p, MiB, 1, s);
        ck_assert_uint_eq(gpumem_torch_pool_kept_bytes(1), MiB);
        gpumem_torch_release_pool(1, graph);
        ck_assert_int_eq(gm_test_wait_device_stat(dev[1].socket_path, "allocated_bytes.all.current", 0), 0);
}
END_TEST

/* Two graphs sharing one pool (torch.cuda.graph(pool=g1.pool()),
 * make_graphed_callables): PyTorch calls begin_allocate_to_pool once per
 * capture and release_pool once per graph reset; the blocks the pool keeps
 * are the second graph's too, so the first reset must not give them back. */
START_TEST(test_pool_shared_by_two_graphs_lives_until_both_release) {
        const gpumem_torch_pool_id shared = {0, 42};
        stream_t s = NULL;
        gpumem_torch_begin_allocate_to_pool(1, shared, NULL); /* graph 1 */
        void *t1 = gpumem_torch_alloc(4 * MiB, 1, s);
        ck_assert_ptr_nonnull(t1);
        gpumem_torch_free(t1, 4 * MiB, 1, s); /* a temporary of graph 1: its replays write it */
        gpumem_torch_end_allocate_to_pool(1, shared);
        gpumem_torch_begin_allocate_to_pool(1, shared, NULL); /* graph 2, the same pool */
        void *t2 = gpumem_torch_alloc(4 * MiB, 1, s);
        ck_assert_ptr_eq(t2, t1); /* graph 2 reuses graph 1's block, as PyTorch's pools do */
        gpumem_torch_free(t2, 4 * MiB, 1, s);
        gpumem_torch_end_allocate_to_pool(1, shared);

        gpumem_torch_release_pool(1, shared); /* graph 1 reset: graph 2 still replays into t1 */
        ck_assert_uint_eq(gpumem_torch_pool_kept_bytes(1), 4 * MiB);
        void *eager = gpumem_torch_alloc(4 * MiB, 1, s);
        ck_assert_ptr_nonnull(eager);
        ck_assert_ptr_ne(eager, t1);
        ck_assert_int_eq(stat_of(1, "allocated_bytes.all.current"), (int64_t) (8 * MiB));

        gpumem_torch_release_pool(1, shared); /* graph 2 reset: the pool is gone */
        ck_assert_uint_eq(gpumem_torch_pool_kept_bytes(1), 0);
        ck_assert_int_eq(gm_test_wait_device_stat(dev[1].socket_path, "allocated_bytes.all.current", 4 * MiB),
                         (int64_t) (4 * MiB));
        gpumem_torch_free(eager, 4 * MiB, 1, s);
        ck_assert_int_eq(gm_test_wait_device_stat(dev[1].socket_path, "allocated_bytes.all.current", 0), 0);
}
END_TEST

/* torch.cuda.set_per_process_memory_fraction accepts 0 (its range is 0~1):
 * nothing more is handed out on the device, as PyTorch's own allocator. */
START_TEST(test_memory_fraction_zero_refuses_everything) {
        ck_assert(gpumem_torch_memory_fraction(1) == 1.0);
        gpumem_torch_set_memory_fraction(0.0, 1);
        ck_assert(gpumem_torch_memory_fraction(1) == 0.0);
        ck_assert_ptr_null(gpumem_torch_alloc(4096, 1, NULL));
        char why[2048];
        ck_assert_int_eq(gpumem_torch_last_refusal(1, why, sizeof(why), NULL), -ENOMEM);
        ck_assert_msg(strstr(why, "memory fraction 0 "), "diagnosis: %s", why);
        gpumem_torch_set_memory_fraction(-0.5, 1); /* outside [0, 1]: ignored */
        ck_assert(gpumem_torch_memory_fraction(1) == 0.0);
        gpumem_torch_set_memory_fraction(1.0, 1);
        ck_assert(gpumem_torch_memory_fraction(1) == 1.0);
        void *p = gpumem_torch_alloc(4096, 1, NULL);
        ck_assert_ptr_nonnull(p);
        gpumem_torch_free(p, 4096, 1, NULL);
}
END_TEST

START_TEST(test_oom_mode_is_reported) {
        int mode = gpumem_torch_oom_mode();
        ck_assert_int_ge(mode, GPUMEM_TORCH_OOM_NULL);
        ck_assert_int_le(mode, GPUMEM_TORCH_OOM_C10);
}
END_TEST

/* ---- CUDA_VISIBLE_DEVICES: the ordinal is matched by UUID ---- */

/* The UUID a daemon names in its hello ("" if none). */
static void daemon_uuid(const char *socket_path, char *buf, size_t len) {
        int fd = gm_test_raw_connect(socket_path);
        Gpumem__Envelope *reply = gm_test_raw_hello_reply(fd, true, "test", NULL);
        ck_assert_int_eq(reply->body_case, GPUMEM__ENVELOPE__BODY_HELLO_REPLY);
        snprintf(buf, len, "%s", reply->hello_reply->device_uuid ? reply->hello_reply->device_uuid : "");
        gm_msg_free(reply);
        close(fd);
}

START_TEST(test_visible_devices_find_the_daemon_by_uuid) {
        if (strcmp(gm_test_backend(), "cuda") != 0)
                return; /* the host backend has no UUIDs: the template's index is the device */
        char uuid[64];
        daemon_uuid(dev[1].socket_path, uuid, sizeof(uuid));
        if (!uuid[0]) {
                fprintf(stderr, "test_visible_devices_find_the_daemon_by_uuid: the daemon names no GPU UUID; "
                                "nothing to match\n");
                return;
        }
        /* Only physical device 1 is visible: it is this process's device 0,
         * whose daemon is gpu1.sock although the template says gpu0.sock. */
        ck_assert_int_eq(setenv("CUDA_VISIBLE_DEVICES", "1", 1), 0);
        void *p = gpumem_torch_alloc(6 * MiB, 0, NULL);
        char why[2048];
        ck_assert_msg(p != NULL, "refused: %s", (gpumem_torch_last_refusal(0, why, sizeof(why), NULL), why));
        ck_assert_int_eq(stat_of(1, "requested_bytes.all.current"), (int64_t) (6 * MiB));
        ck_assert_int_eq(stat_of(0, "requested_bytes.all.current"), 0);
        gpumem_torch_free(p, 6 * MiB, 0, NULL);
        /* Process device 1 does not exist here: no daemon is its, none is guessed. */
        ck_assert_ptr_null(gpumem_torch_alloc(4096, 1, NULL));
        ck_assert_int_eq(gpumem_torch_last_refusal(1, why, sizeof(why), NULL), -ENODEV);
        ck_assert_msg(strstr(why, "serves another GPU"), "diagnosis: %s", why);
}
END_TEST

static Suite *torch_suite(void) {
        Suite *s = suite_create("torch");
        TCase *tc = tcase_create("entry points");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_threads_two_devices);
        tcase_add_test(tc, test_refusal_null_diagnosis_logged_once);
        tcase_add_test(tc, test_no_daemon_is_null_not_hang);
        tcase_add_test(tc, test_fork_child_gets_its_own_session);
        tcase_add_test(tc, test_daemon_gone_then_back_central);
        tcase_add_test(tc, test_daemon_gone_then_back_local);
        tcase_add_test(tc, test_record_stream_and_empty_cache);
        tcase_add_test(tc, test_visible_devices_find_the_daemon_by_uuid);
        tcase_add_test(tc, test_memory_fraction_limits_the_process);
        tcase_add_test(tc, test_pool_blocks_not_reused_outside_the_pool);
        tcase_add_test(tc, test_pool_block_in_use_at_release_and_record_stream);
        tcase_add_test(tc, test_pool_shared_by_two_graphs_lives_until_both_release);
        tcase_add_test(tc, test_memory_fraction_zero_refuses_everything);
        tcase_add_test(tc, test_oom_mode_is_reported);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        SRunner *sr = srunner_create(torch_suite());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
