/* gpumem-engine: two inference engines sharing one GPU through gpumemd, the
 * walk-through of docs/inference.md. `publish` loads "weights" (a
 * deterministic pattern) into a shared object and publishes it; `run` starts
 * engines A and B (each its own process, and its own tenant with --users),
 * which open the weights read-only, size their KV caches from
 * gpumem_mem_get_info() and gpumem_claim() started together, allocate them
 * in the "kv_cache" pool and fill them; A sleeps keeping its KV data, B grows
 * into the freed memory and gives it back, A wakes and finds every KV block
 * at its address with its data. Each step prints one line with its figures;
 * the exit status is 0 only if every check held.
 *
 * Memory is touched with loads and stores on the host backend, and through
 * the CUDA driver's cuMemcpyHtoD_v2/cuMemcpyDtoH_v2 on cuda (libcuda.so.1,
 * or $GPUMEM_LIBCUDA, loaded at run time), so one binary runs on both. Uses
 * only the public API. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2 */
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem/gpumem.h"

#define MiB ((uint64_t) 1 << 20)
/* A KV block: above 10 MiB, so each is one segment of its own size. */
#define KV_BLOCK (16 * MiB)
#define MAX_KV_BLOCKS 4096
/* The tagged pool KV blocks come from (docs/tags.md). */
#define KV_TAG "kv_cache"
#define WEIGHTS_SEED UINT64_C(0x5eed0001)
#define WAKE_TIMEOUT_MS 30000

/* ---- memory access: host loads and stores, or the CUDA driver's copies ---- */

typedef int cu_result;
typedef unsigned long long cu_deviceptr;
typedef void *cu_context;

static struct {
        bool cuda;
        cu_result (*init)(unsigned flags);
        cu_result (*device_get)(int *dev, int ordinal);
        cu_result (*primary_ctx_retain)(cu_context *ctx, int dev);
        cu_result (*ctx_push)(cu_context ctx);
        cu_result (*htod)(cu_deviceptr dst, const void *src, size_t n);
        cu_result (*dtoh)(void *dst, cu_deviceptr src, size_t n);
} mem;

static bool driver_symbol(void *lib, const char *name, void *ret_fn) {
        void *fn = dlsym(lib, name);
        if (!fn)
                fprintf(stderr, "gpumem-engine: the CUDA driver lacks %s\n", name);
        else
                memcpy(ret_fn, &fn, sizeof(fn));
        return fn != NULL;
}

/* Asks the daemon at socket_path (NULL: the default) for its memory kind;
 * on cuda loads the driver and makes CUDA device 0's primary context current
 * on this thread, the context libgpumem maps into. Once per process. */
static int memory_open(const char *socket_path) {
        char path[4096];
        int r = 0;
        if (!socket_path)
                r = gpumem_admin_socket(-1, path, sizeof(path)); /* as gpumem_connect(NULL) picks it */
        else if ((size_t) snprintf(path, sizeof(path), "%s", socket_path) >= sizeof(path))
                r = -ENAMETOOLONG;
        gpumem_admin *a = NULL;
        if (r >= 0)
                r = gpumem_admin_new(path, "gpumem-engine", &a);
        if (r >= 0)
                r = gpumem_admin_connect(a);
        if (r < 0) {
                fprintf(stderr, "gpumem-engine: %s: %s\n", path, a ? gpumem_admin_error(a) : gpumem_strerror(r));
                gpumem_admin_free(a);
                return r;
        }
        mem.cuda = strcmp(gpumem_admin_backend(a), "cuda") == 0;
        gpumem_admin_free(a);
        if (!mem.cuda)
                return 0;
        const char *driver = getenv("GPUMEM_LIBCUDA");
        void *lib = dlopen(driver && *driver ? driver : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
                fprintf(stderr, "gpumem-engine: cannot load the CUDA driver: %s\n", dlerror());
                return -ENOENT;
        }
        if (!driver_symbol(lib, "cuInit", &mem.init) || !driver_symbol(lib, "cuDeviceGet", &mem.device_get) ||
            !driver_symbol(lib, "cuDevicePrimaryCtxRetain", &mem.primary_ctx_retain) ||
            !driver_symbol(lib, "cuCtxPushCurrent_v2", &mem.ctx_push) ||
            !driver_symbol(lib, "cuMemcpyHtoD_v2", &mem.htod) || !driver_symbol(lib, "cuMemcpyDtoH_v2", &mem.dtoh))
                return -ENOSYS;
        int dev;
        cu_context ctx;
        cu_result cr = mem.init(0);
        if (cr == 0)
                cr = mem.device_get(&dev, 0);
        if (cr == 0)
                cr = mem.primary_ctx_retain(&ctx, dev);
        if (cr == 0)
                cr = mem.ctx_push(ctx);
        if (cr != 0) {
                fprintf(stderr, "gpumem-engine: CUDA device 0: driver error %d\n", cr);
                return -EIO;
        }
        return 0;
}

static int memory_write(void *dst, const void *src, size_t n) {
        if (!mem.cuda) {
                memcpy(dst, src, n);
                return 0;
        }
        return mem.htod((cu_deviceptr) (uintptr_t) dst, src, n) == 0 ? 0 : -EIO;
}

static int memory_read(void *dst, const void *src, size_t n) {
        if (!mem.cuda) {
                memcpy(dst, src, n);
                return 0;
        }
        return mem.dtoh(dst, (cu_deviceptr) (uintptr_t) src, n) == 0 ? 0 : -EIO;
}

/* ---- the pattern: word i of a region seeded `seed` ---- */

static uint64_t pattern_word(uint64_t seed, uint64_t i) {
        uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

#define CHUNK_WORDS ((size_t) (1 * MiB) / sizeof(uint64_t))

/* Writes the pattern over `bytes` (a multiple of 8) at p. */
static int pattern_fill(void *p, size_t bytes, uint64_t seed) {
        static uint64_t chunk[CHUNK_WORDS];
        for (size_t done = 0; done < bytes; done += sizeof(chunk)) {
                size_t n = bytes - done < sizeof(chunk) ? bytes - done : sizeof(chunk);
                for (size_t w = 0; w < n / sizeof(uint64_t); w++)
                        chunk[w] = pattern_word(seed, done / sizeof(uint64_t) + w);
                int r = memory_write((char *) p + done, chunk, n);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* 1 when the `bytes` at p hold the pattern, 0 when a word differs. */
static int pattern_check(const void *p, size_t bytes, uint64_t seed) {
        static uint64_t chunk[CHUNK_WORDS];
        for (size_t done = 0; done < bytes; done += sizeof(chunk)) {
                size_t n = bytes - done < sizeof(chunk) ? bytes - done : sizeof(chunk);
                int r = memory_read(chunk, (const char *) p + done, n);
                if (r < 0)
                        return r;
                for (size_t w = 0; w < n / sizeof(uint64_t); w++)
                        if (chunk[w] != pattern_word(seed, done / sizeof(uint64_t) + w))
                                return 0;
        }
        return 1;
}

/* ---- publish: the weights, loaded once ---- */

static int publish(const char *socket_path, const char *name, uint64_t bytes) {
        gpumem_client *c;
        int r = memory_open(socket_path);
        if (r < 0)
                return 1;
        if ((r = gpumem_connect(socket_path, &c)) < 0) {
                fprintf(stderr, "gpumem-engine publish: %s\n", gpumem_last_error(NULL));
                return 1;
        }
        gpumem_shared *s = NULL;
        void *p;
        char meta[128];
        uint64_t version = 0;
        const char *const readers[] = {"*", NULL};
        int meta_len = snprintf(meta, sizeof(meta), "gpumem-engine weights bytes=%" PRIu64 " seed=%" PRIu64, bytes,
                                WEIGHTS_SEED);
        if ((r = gpumem_shared_create(c, name, bytes, &s, &p)) < 0 || (r = pattern_fill(p, bytes, WEIGHTS_SEED)) < 0 ||
            (r = gpumem_shared_publish(c, s, readers, meta, (size_t) meta_len, 0, &version)) < 0) {
                fprintf(stderr, "gpumem-engine publish: %s: %s (%s)\n", name, gpumem_strerror(r), gpumem_last_error(c));
                gpumem_shared_close(c, s);
                gpumem_disconnect(c);
                return 1;
        }
        printf("publish: weights '%s' version %" PRIu64 ": %" PRIu64 " MiB loaded once (%" PRIu64
               " B mapped), readable by every tenant; this process exits, the weights stay\n",
               name, version, bytes / MiB, gpumem_shared_size(s));
        gpumem_shared_close(c, s);
        gpumem_disconnect(c);
        return 0;
}

/* ---- an engine, driven step by step by `run` ---- */

/* What `run` asks of an engine, one byte each; the engine answers its
 * status (0: the check held) and one figure. */
enum {
        STEP_OPEN = 'o',    /* maps the weights read-only and verifies them; figure: version */
        STEP_MEASURE = 'm', /* mem_get_info; figure: free */
        STEP_CLAIM = 'c',   /* claims 90% of what it measured, allocates and fills its KV cache; figure: claimed */
        STEP_SLEEP = 's',   /* sleeps keeping its KV data; figure: bytes released */
        STEP_GROW = 'g',    /* one allocation that could not fit before, verified, freed, trimmed; figure: its size */
        STEP_WAKE = 'w',    /* wakes, verifies every KV block at its address and the weights; figure: blocks */
        STEP_EXIT = 'x',
};

typedef struct engine {
        char id;
        const char *name;
        gpumem_client *c;
        gpumem_shared *weights;
        uint64_t weights_bytes, weights_seed;
        void *kv[MAX_KV_BLOCKS];
        size_t n_kv;
        uint64_t seen_free;  /* mem_get_info's free at its measure */
        uint64_t free_after; /* mem_get_info's free once its KV cache was allocated */
} engine_t;

static uint64_t kv_seed(const engine_t *e, size_t block) {
        return ((uint64_t) (unsigned char) e->id << 32) | block;
}

static int verify_weights(engine_t *e) {
        return pattern_check(gpumem_shared_ptr(e->weights), e->weights_bytes, e->weights_seed);
}

static int step_open(engine_t *e, uint64_t *ret_figure) {
        int r = gpumem_shared_open(e->c, e->name, 0, &e->weights);
        const void *meta;
        size_t len;
        char text[128] = "";
        if (r >= 0 && (r = gpumem_shared_meta(e->weights, &meta, &len)) >= 0 && len < sizeof(text))
                memcpy(text, meta, len);
        if (r < 0 ||
            sscanf(text, "gpumem-engine weights bytes=%" SCNu64 " seed=%" SCNu64, &e->weights_bytes,
                   &e->weights_seed) != 2 ||
            e->weights_bytes > gpumem_shared_size(e->weights) || e->weights_bytes % sizeof(uint64_t) != 0) {
                printf("engine %c: open '%s': %s\n", e->id, e->name,
                       r < 0 ? gpumem_last_error(e->c) : "not its weights");
                return 1;
        }
        int ok = verify_weights(e);
        printf("engine %c: opened weights '%s' version %" PRIu64 " read-only at %p: %" PRIu64 " MiB %s\n", e->id,
               e->name, gpumem_shared_version(e->weights), gpumem_shared_ptr(e->weights), e->weights_bytes / MiB,
               ok == 1 ? "as published" : "DIFFER from what was published");
        *ret_figure = gpumem_shared_version(e->weights);
        return ok == 1 ? 0 : 1;
}

static int step_measure(engine_t *e, uint64_t *ret_figure) {
        uint64_t total;
        int r = gpumem_mem_get_info(e->c, &e->seen_free, &total);
        if (r < 0) {
                printf("engine %c: mem_get_info: %s\n", e->id, gpumem_last_error(e->c));
                return 1;
        }
        printf("engine %c: mem_get_info: %" PRIu64 " MiB free of %" PRIu64 " MiB\n", e->id, e->seen_free / MiB,
               total / MiB);
        *ret_figure = e->seen_free;
        return 0;
}

static int step_claim(engine_t *e, uint64_t *ret_figure) {
        uint64_t claimed, total;
        int r = gpumem_claim(e->c, e->seen_free / 10 * 9, &claimed);
        if (r < 0) {
                printf("engine %c: claim: %s\n", e->id, gpumem_last_error(e->c));
                return 1;
        }
        size_t want = claimed / KV_BLOCK < MAX_KV_BLOCKS ? claimed / KV_BLOCK : MAX_KV_BLOCKS;
        if ((r = gpumem_pool_begin(e->c, KV_TAG)) < 0) {
                printf("engine %c: pool %s: %s\n", e->id, KV_TAG, gpumem_strerror(r));
                return 1;
        }
        for (; e->n_kv < want; e->n_kv++)
                if ((r = gpumem_alloc(e->c, KV_BLOCK, 0, &e->kv[e->n_kv])) < 0 ||
                    (r = pattern_fill(e->kv[e->n_kv], KV_BLOCK, kv_seed(e, e->n_kv))) < 0)
                        break;
        gpumem_pool_end(e->c);
        int64_t tagged = 0;
        gpumem_stat_tag(e->c, KV_TAG, "reserved_bytes.all.current", &tagged);
        if (r >= 0)
                r = gpumem_mem_get_info(e->c, &e->free_after, &total);
        printf("engine %c: claimed %" PRIu64 " MiB (90%% of %" PRIu64 " MiB seen): %zu KV blocks of %" PRIu64
               " MiB in pool '%s' (%" PRId64 " MiB), written; %" PRIu64 " MiB free now%s%s\n",
               e->id, claimed / MiB, e->seen_free / MiB, e->n_kv, KV_BLOCK / MiB, KV_TAG, tagged / (int64_t) MiB,
               e->free_after / MiB, r < 0 ? ": REFUSED " : "", r < 0 ? gpumem_last_error(e->c) : "");
        *ret_figure = claimed;
        return r < 0 ? 1 : 0;
}

static int step_sleep(engine_t *e, uint64_t *ret_figure) {
        const char *const keep[] = {KV_TAG, NULL};
        uint64_t released = 0;
        int r = gpumem_sleep(e->c, NULL, keep, &released);
        printf("engine %c: sleep keeping '%s': %s%" PRIu64 " MiB back to the device, %" PRIu64
               " MiB to wake, %zu KV addresses reserved\n",
               e->id, KV_TAG, r < 0 ? gpumem_last_error(e->c) : "", released / MiB, gpumem_sleeping_bytes(e->c) / MiB,
               e->n_kv);
        *ret_figure = released;
        return r < 0 || released == 0 ? 1 : 0;
}

static int step_wake(engine_t *e, uint64_t *ret_figure) {
        int r = gpumem_wake(e->c, WAKE_TIMEOUT_MS);
        size_t same = 0;
        for (size_t i = 0; r >= 0 && i < e->n_kv; i++)
                if (pattern_check(e->kv[i], KV_BLOCK, kv_seed(e, i)) == 1)
                        same++;
        int weights = r < 0 ? 0 : verify_weights(e);
        printf("engine %c: woke%s%s: %zu of %zu KV blocks hold their data at the same addresses; weights %s\n", e->id,
               r < 0 ? ": " : "", r < 0 ? gpumem_last_error(e->c) : "", same, e->n_kv,
               weights == 1 ? "read as published" : "DIFFER");
        *ret_figure = same;
        return r < 0 || same != e->n_kv || weights != 1 ? 1 : 0;
}

static int step_grow(engine_t *e, uint64_t *ret_figure) {
        uint64_t free_now, total, released = 0;
        int r = gpumem_mem_get_info(e->c, &free_now, &total);
        uint64_t grow = free_now / 10 * 9 / KV_BLOCK * KV_BLOCK;
        void *p = NULL;
        int ok = 0;
        if (r >= 0 && grow > e->free_after && (r = gpumem_alloc(e->c, grow, 0, &p)) >= 0 &&
            (r = pattern_fill(p, grow, kv_seed(e, MAX_KV_BLOCKS))) >= 0)
                ok = pattern_check(p, grow, kv_seed(e, MAX_KV_BLOCKS));
        if (p)
                gpumem_free(e->c, p);
        if (p && r >= 0)
                r = gpumem_trim(e->c, &released);
        printf("engine %c: grew by %" PRIu64 " MiB in one allocation (%" PRIu64 " MiB free, %" PRIu64
               " MiB before the sleep): %s; freed, %" PRIu64 " MiB trimmed back\n",
               e->id, grow / MiB, free_now / MiB, e->free_after / MiB,
               r < 0                   ? gpumem_last_error(e->c)
               : grow <= e->free_after ? "NOT more than before"
               : ok == 1               ? "verified"
                                       : "DIFFERS",
               released / MiB);
        *ret_figure = grow;
        return r >= 0 && ok == 1 && released >= grow ? 0 : 1;
}

static void step_exit(engine_t *e) {
        for (size_t i = 0; i < e->n_kv; i++)
                gpumem_free(e->c, e->kv[i]);
        gpumem_shared_close(e->c, e->weights);
        gpumem_disconnect(e->c);
}

static void put(int fd, uint64_t v) {
        if (write(fd, &v, sizeof(v)) != (ssize_t) sizeof(v))
                _exit(3);
}

static bool get(int fd, uint64_t *ret_v) {
        return read(fd, ret_v, sizeof(*ret_v)) == (ssize_t) sizeof(*ret_v);
}

static const struct {
        char step;
        int (*run)(engine_t *e, uint64_t *ret_figure);
} engine_steps[] = {
        {STEP_OPEN, step_open},   {STEP_MEASURE, step_measure}, {STEP_CLAIM, step_claim},
        {STEP_SLEEP, step_sleep}, {STEP_GROW, step_grow},       {STEP_WAKE, step_wake},
};

/* An engine process: answers steps from `from` on `to` until STEP_EXIT. */
static int engine_main(char id, const char *socket_path, const char *name, int from, int to) {
        static engine_t e;
        e.id = id;
        e.name = name;
        if (memory_open(socket_path) < 0)
                return 1;
        if (gpumem_connect_heap(socket_path, GPUMEM_HEAP_LOCAL, &e.c) < 0) {
                printf("engine %c: connect: %s\n", id, gpumem_last_error(NULL));
                return 1;
        }
        for (;;) {
                char step;
                if (read(from, &step, 1) != 1)
                        step = STEP_EXIT;
                uint64_t figure = 0;
                int failed;
                size_t k = 0;
                while (k < sizeof(engine_steps) / sizeof(engine_steps[0]) && engine_steps[k].step != step)
                        k++;
                if (k == sizeof(engine_steps) / sizeof(engine_steps[0])) { /* STEP_EXIT, or `run` is gone */
                        step_exit(&e);
                        return 0;
                }
                failed = engine_steps[k].run(&e, &figure);
                fflush(stdout);
                put(to, (uint64_t) failed);
                put(to, figure);
        }
}

/* ---- run: the walk-through ---- */

typedef struct engine_proc {
        char id;
        pid_t pid;
        int to, from;
} engine_proc_t;

/* Drops to `user` (a name or a uid; NULL: stays) and its groups. */
static int become(const char *user) {
        if (!user)
                return 0;
        char *end;
        unsigned long uid = strtoul(user, &end, 10);
        struct passwd *pw = *end ? getpwnam(user) : getpwuid((uid_t) uid);
        uid_t u = pw ? pw->pw_uid : (uid_t) uid;
        gid_t g = pw ? pw->pw_gid : (gid_t) uid;
        if ((*end && !pw) || setgroups(0, NULL) < 0 || setgid(g) < 0 || setuid(u) < 0) {
                fprintf(stderr, "gpumem-engine: cannot run as %s: %s\n", user,
                        pw || !*end ? strerror(errno) : "no such user");
                return -EPERM;
        }
        return 0;
}

static int spawn(engine_proc_t *p, char id, const char *user, const char *socket_path, const char *name) {
        int down[2], up[2];
        if (pipe2(down, O_CLOEXEC) < 0 || pipe2(up, O_CLOEXEC) < 0)
                return -errno;
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                close(down[1]);
                close(up[0]);
                _exit(become(user) < 0 ? 1 : engine_main(id, socket_path, name, down[0], up[1]));
        }
        close(down[0]);
        close(up[1]);
        *p = (engine_proc_t){.id = id, .pid = pid, .to = down[1], .from = up[0]};
        return 0;
}

/* Asks engine p for a step; false (reported) when it failed or is gone. */
static bool ask(engine_proc_t *p, char step, uint64_t *ret_figure) {
        uint64_t failed = 1, figure = 0;
        bool answered = write(p->to, &step, 1) == 1 && get(p->from, &failed) && get(p->from, &figure);
        if (!answered)
                fprintf(stderr, "gpumem-engine: engine %c did not answer step '%c'\n", p->id, step);
        *ret_figure = figure;
        return answered && failed == 0;
}

/* ask() of both engines, A first; false when either failed. */
static bool ask_both(engine_proc_t *a, engine_proc_t *b, char step, uint64_t *ret_a, uint64_t *ret_b) {
        bool ok_a = ask(a, step, ret_a);
        bool ok_b = ask(b, step, ret_b);
        return ok_a && ok_b;
}

static int run(const char *socket_path, const char *name, const char *user_a, const char *user_b) {
        signal(SIGPIPE, SIG_IGN); /* an engine that died is seen by ask() */
        engine_proc_t a, b;
        if (spawn(&a, 'A', user_a, socket_path, name) < 0 || spawn(&b, 'B', user_b, socket_path, name) < 0) {
                fprintf(stderr, "gpumem-engine: cannot start the engines: %s\n", strerror(errno));
                return 1;
        }
        uint64_t v, free_a = 0, free_b = 0, claim_a = 0, claim_b = 0;
        bool ok = ask_both(&a, &b, STEP_OPEN, &v, &v);
        /* Both measure before either claims: they start together. */
        ok = ok && ask_both(&a, &b, STEP_MEASURE, &free_a, &free_b);
        ok = ok && ask_both(&a, &b, STEP_CLAIM, &claim_a, &claim_b);
        if (ok) {
                bool fits = claim_a + claim_b <= (free_a > free_b ? free_a : free_b);
                printf("run: the claims add up to %" PRIu64 " MiB of the %" PRIu64 " MiB both saw free: %s\n",
                       (claim_a + claim_b) / MiB, free_a / MiB, fits ? "nothing over-committed" : "OVER-COMMITTED");
                ok = fits;
        }
        ok = ok && ask(&a, STEP_SLEEP, &v);
        ok = ok && ask(&b, STEP_GROW, &v);
        ok = ok && ask(&a, STEP_WAKE, &v);
        close(a.to);
        close(b.to);
        int status_a = -1, status_b = -1;
        waitpid(a.pid, &status_a, 0);
        waitpid(b.pid, &status_b, 0);
        ok = ok && WIFEXITED(status_a) && WEXITSTATUS(status_a) == 0 && WIFEXITED(status_b) &&
             WEXITSTATUS(status_b) == 0;
        printf("run: %s\n", ok ? "every check held" : "a check FAILED");
        return ok ? 0 : 1;
}

static void usage(FILE *f) {
        fprintf(f, "Usage: gpumem-engine [-s SOCKET] publish NAME [MIB]\n"
                   "       gpumem-engine [-s SOCKET] run NAME [USER_A USER_B]\n"
                   "publish loads MIB (default 64) MiB of weights into the shared object NAME and publishes it for\n"
                   "every tenant. run starts engines A and B (as USER_A and USER_B: their own tenants; needs root)\n"
                   "that open NAME read-only, size their KV caches with mem_get_info and claim, then A sleeps, B\n"
                   "grows into the freed memory and gives it back, and A wakes (docs/inference.md). SOCKET: the\n"
                   "daemon's (default $GPUMEM_SOCKET, else GPU 0's default socket).\n");
}

int main(int argc, char **argv) {
        const char *socket_path = NULL;
        int i = 1;
        if (argc > 2 && strcmp(argv[1], "-s") == 0) {
                socket_path = argv[2];
                i = 3;
        }
        if (argc > i && (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)) {
                usage(stdout);
                return 0;
        }
        setvbuf(stdout, NULL, _IOLBF, 0);
        if (argc - i >= 2 && argc - i <= 3 && strcmp(argv[i], "publish") == 0) {
                char *end = NULL;
                unsigned long long mib = argc - i == 3 ? strtoull(argv[i + 2], &end, 10) : 64;
                if ((end && *end) || mib < 1 || mib > (1ull << 24)) {
                        fprintf(stderr, "gpumem-engine: MIB: expected a whole number from 1 to %llu\n", 1ull << 24);
                        return 2;
                }
                return publish(socket_path, argv[i + 1], mib * MiB);
        }
        if ((argc - i == 2 || argc - i == 4) && strcmp(argv[i], "run") == 0)
                return run(socket_path, argv[i + 1], argc - i == 4 ? argv[i + 2] : NULL,
                           argc - i == 4 ? argv[i + 3] : NULL);
        usage(stderr);
        return 2;
}
