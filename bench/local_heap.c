/* gpumem-bench-local: what a local heap costs, as ratios within one run.
 *
 * Against a running gpumemd (--socket), interleaved, --rounds times:
 *   core     gm_heap_alloc + gm_heap_free of --size bytes in process (the
 *            allocator core over a provider that never fails)
 *   torch    the same on the PyTorch-style peer (torch_peer.cpp, native
 *            segments), the same loop
 *   local    gpumem_alloc + gpumem_free in a local session (cached block)
 *   central  the same in a central session (one round trip + one free message)
 *   pingpong a bare 64-byte SOCK_SEQPACKET round trip between two processes
 *   step     one replay of a trace (--trace, e.g. bench/traces/train_loop.csv:
 *            ~3,000 allocations a step) in process and in a local session, in
 *            steady state (after a first warm-up replay), and the messages the
 *            local session sent the daemon during the timed replays (from the
 *            daemon's own per-session request count); also on the peer
 * Prints per round wall ns per pair (or per step) of each, and the medians
 * and ranges of the ratios local/core, local/torch, central/pingpong, step
 * local/core and step local/torch;
 * for the in-process loops also in the thread's CPU time. Each
 * in-process heap has its local counterpart in the same state: the pairs run
 * on one heap and one local session, the steps on another of each. Under
 * valgrind --tool=callgrind the functions core_pairs, torch_pairs,
 * local_pairs, central_pairs, step_core, step_torch and step_client give
 * instruction counts. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "allocator.h"
#include "gpumem/gpumem.h"
#include "ipc.h"
#include "msg.h"
#include "torch_peer.h"

#define MAX_ROUNDS 64

static uint64_t clock_ns(clockid_t clock) {
        struct timespec ts;
        clock_gettime(clock, &ts);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

/* A timed loop's start: wall time, and the calling thread's CPU time (which
 * does not count the time other jobs had the core: on a shared machine the
 * steadier figure for work done in this thread alone). */
typedef struct stamp {
        uint64_t wall, cpu;
} stamp_t;

static double last_cpu_ns; /* per unit, of the last timed loop */

static stamp_t stamp(void) {
        return (stamp_t){.wall = clock_ns(CLOCK_MONOTONIC), .cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID)};
}

/* Wall ns per unit since t0; the CPU ns per unit go to last_cpu_ns. */
static double elapsed(stamp_t t0, double units) {
        last_cpu_ns = (double) (clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0.cpu) / units;
        return (double) (clock_ns(CLOCK_MONOTONIC) - t0.wall) / units;
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;
        return (x > y) - (x < y);
}

/* ---- in process ---- */

static int core_create(void *ud, uint64_t sid, uint64_t va, uint64_t off, uint64_t size, uint64_t *ret) {
        *ret = sid;
        return 0;
}

static void core_release(void *ud, uint64_t sid, uint64_t off, uint64_t size, uint64_t h, bool whole) {
}

static gm_heap_t *core_heap(uint64_t *va_cursor) {
        gm_alloc_config_t cfg;
        gm_alloc_config_default(&cfg);
        gm_provider_t p = {.create = core_create, .release = core_release};
        gm_heap_params_t params = {.capacity = 1ull << 36, .va_cursor = va_cursor};
        gm_heap_t *h = NULL;
        return gm_heap_new(&cfg, &p, &params, &h) == 0 ? h : NULL;
}

static double core_pairs(gm_heap_t *h, size_t size, long n) {
        gm_alloc_result_t res;
        stamp_t t0 = stamp();
        for (long i = 0; i < n; i++) {
                if (gm_heap_alloc(h, size, 0, &res) < 0)
                        return -1;
                gm_heap_free(h, res.block_id, false);
        }
        return elapsed(t0, (double) n);
}

/* The PyTorch-style peer, on core_pairs' loop. */
static __attribute__((noipa)) double torch_pairs(torch_peer_t *p, size_t size, long n) {
        stamp_t t0 = stamp();
        for (long i = 0; i < n; i++)
                torch_peer_free(p, torch_peer_alloc(p, size, 0));
        return elapsed(t0, (double) n);
}

/* ---- through libgpumem ---- */

static double client_pairs(gpumem_client *c, size_t size, long n) {
        void *p;
        stamp_t t0 = stamp();
        for (long i = 0; i < n; i++) {
                if (gpumem_alloc(c, size, 0, &p) < 0)
                        return -1;
                gpumem_free(c, p);
        }
        return elapsed(t0, (double) n);
}

/* Separate functions, so that an instruction profile (callgrind) tells them apart. */
static __attribute__((noipa)) double local_pairs(gpumem_client *c, size_t size, long n) {
        return client_pairs(c, size, n);
}

static __attribute__((noipa)) double central_pairs(gpumem_client *c, size_t size, long n) {
        return client_pairs(c, size, n);
}

/* ---- the floor ---- */

static int pp_sock = -1;

static void pingpong_start(void) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
                exit(1);
        if (fork() == 0) {
                close(sv[0]);
                char buf[64];
                for (;;) {
                        size_t len, n_fds;
                        if (gm_ipc_recv(sv[1], buf, sizeof(buf), NULL, 0, &len, &n_fds) < 0 ||
                            gm_ipc_send(sv[1], buf, len, NULL, 0) < 0)
                                _exit(0);
                }
        }
        close(sv[1]);
        pp_sock = sv[0];
}

static double pingpong(long n) {
        char buf[64] = {0};
        stamp_t t0 = stamp();
        for (long i = 0; i < n; i++) {
                size_t len, n_fds;
                if (gm_ipc_send(pp_sock, buf, sizeof(buf), NULL, 0) < 0 ||
                    gm_ipc_recv(pp_sock, buf, sizeof(buf), NULL, 0, &len, &n_fds) < 0)
                        return -1;
        }
        return elapsed(t0, (double) n);
}

/* ---- traces ---- */

typedef struct event {
        uint64_t size;
        uint32_t slot;
        uint32_t stream;
        bool alloc;
} event_t;

typedef struct trace {
        event_t *ev;
        size_t n, n_slots, n_allocs;
} trace_t;

/* Reads "seq,action,id,size,stream" rows; ids become dense slots. Rows with
 * other actions are skipped. */
static int trace_load(const char *path, trace_t *t) {
        FILE *f = fopen(path, "re");
        if (!f)
                return -errno;
        char line[256];
        size_t cap = 0;
        uint64_t *ids = NULL;
        size_t n_ids = 0;
        while (fgets(line, sizeof(line), f)) {
                char action[32];
                unsigned long long seq, id, size, stream;
                if (sscanf(line, "%llu,%31[^,],%llu,%llu,%llu", &seq, action, &id, &size, &stream) != 5)
                        continue;
                bool alloc = strcmp(action, "alloc") == 0;
                if (!alloc && strcmp(action, "free") != 0)
                        continue;
                if (t->n == cap) {
                        cap = cap ? 2 * cap : 1024;
                        t->ev = realloc(t->ev, cap * sizeof(*t->ev));
                        ids = realloc(ids, cap * sizeof(*ids));
                }
                uint32_t slot = UINT32_MAX;
                if (alloc) {
                        slot = (uint32_t) n_ids;
                        ids[n_ids++] = id;
                        t->n_allocs++;
                } else {
                        for (size_t k = n_ids; k-- > 0 && slot == UINT32_MAX;)
                                if (ids[k] == id)
                                        slot = (uint32_t) k;
                        if (slot == UINT32_MAX)
                                continue;
                        ids[slot] = UINT64_MAX; /* the id may come back */
                }
                t->ev[t->n++] = (event_t){.size = size, .slot = slot, .stream = (uint32_t) stream, .alloc = alloc};
        }
        fclose(f);
        t->n_slots = n_ids;
        free(ids);
        return t->n ? 0 : -EINVAL;
}

/* One replay; live blocks are freed at the end, so every replay starts from
 * the same cached state. Returns ns, or -1. */
static double step_core(gm_heap_t *h, const trace_t *t, uint64_t *slots) {
        stamp_t t0 = stamp();
        for (size_t i = 0; i < t->n; i++) {
                const event_t *e = &t->ev[i];
                gm_alloc_result_t res;
                if (e->alloc) {
                        if (gm_heap_alloc(h, e->size, e->stream, &res) < 0)
                                return -1;
                        slots[e->slot] = res.block_id;
                } else if (slots[e->slot]) {
                        gm_heap_free(h, slots[e->slot], false);
                        slots[e->slot] = 0;
                }
        }
        for (size_t i = 0; i < t->n_slots; i++)
                if (slots[i]) {
                        gm_heap_free(h, slots[i], false);
                        slots[i] = 0;
                }
        return elapsed(t0, 1);
}

/* step_core's replay on the peer. */
static __attribute__((noipa)) double step_torch(torch_peer_t *p, const trace_t *t, uint64_t *slots) {
        stamp_t t0 = stamp();
        for (size_t i = 0; i < t->n; i++) {
                const event_t *e = &t->ev[i];
                if (e->alloc)
                        slots[e->slot] = torch_peer_alloc(p, e->size, e->stream);
                else if (slots[e->slot]) {
                        torch_peer_free(p, slots[e->slot]);
                        slots[e->slot] = 0;
                }
        }
        for (size_t i = 0; i < t->n_slots; i++)
                if (slots[i]) {
                        torch_peer_free(p, slots[i]);
                        slots[i] = 0;
                }
        return elapsed(t0, 1);
}

static double step_client(gpumem_client *c, const trace_t *t, void **slots) {
        stamp_t t0 = stamp();
        for (size_t i = 0; i < t->n; i++) {
                const event_t *e = &t->ev[i];
                if (e->alloc) {
                        if (gpumem_alloc(c, e->size, e->stream, &slots[e->slot]) < 0) {
                                fprintf(stderr, "trace event %zu: %s\n", i, gpumem_last_error(c));
                                return -1;
                        }
                } else if (slots[e->slot]) {
                        gpumem_free(c, slots[e->slot]);
                        slots[e->slot] = NULL;
                }
        }
        for (size_t i = 0; i < t->n_slots; i++)
                if (slots[i]) {
                        gpumem_free(c, slots[i]);
                        slots[i] = NULL;
                }
        return elapsed(t0, 1);
}

/* Packets the daemon received from this process's local session (its own
 * count, through an admin connection). */
static int64_t daemon_requests(const char *socket_path) {
        int fd;
        if (gm_ipc_connect(socket_path, &fd) < 0)
                return -1;
        Gpumem__Hello hello = GPUMEM__HELLO__INIT;
        hello.protocol_version = GM_PROTOCOL_VERSION;
        hello.admin = true;
        Gpumem__Clients cl = GPUMEM__CLIENTS__INIT;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = 1;
        env.body_case = GPUMEM__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        int64_t total = -1;
        uint8_t *buf = malloc(1 << 20);
        size_t len, n_fds;
        Gpumem__Envelope *reply = NULL;
        if (gm_msg_send(fd, &env, NULL, 0, 1 << 16) == 0 && gm_ipc_recv(fd, buf, 1 << 20, NULL, 0, &len, &n_fds) == 0) {
                env.request_id = 2;
                env.body_case = GPUMEM__ENVELOPE__BODY_CLIENTS;
                env.clients = &cl;
                if (gm_msg_send(fd, &env, NULL, 0, 1 << 16) == 0 &&
                    gm_ipc_recv(fd, buf, 1 << 20, NULL, 0, &len, &n_fds) == 0 && gm_msg_unpack(buf, len, &reply) == 0 &&
                    reply->body_case == GPUMEM__ENVELOPE__BODY_CLIENTS_REPLY) {
                        total = 0;
                        for (size_t i = 0; i < reply->clients_reply->n_clients; i++)
                                if (reply->clients_reply->clients[i]->pid == (uint32_t) getpid() &&
                                    strcmp(reply->clients_reply->clients[i]->heap_mode, "local") == 0)
                                        total += (int64_t) reply->clients_reply->clients[i]->requests;
                }
        }
        gm_msg_free(reply);
        free(buf);
        close(fd);
        return total;
}

/* Context switches of every thread of this process so far (voluntary and
 * not): a round trip's wake-ups, whatever the load. */
static uint64_t context_switches(void) {
        uint64_t total = 0;
        DIR *dir = opendir("/proc/self/task");
        struct dirent *e;
        while (dir && (e = readdir(dir))) {
                if (e->d_name[0] == '.')
                        continue;
                char path[300], line[128];
                snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
                FILE *f = fopen(path, "re");
                while (f && fgets(line, sizeof(line), f)) {
                        unsigned long long v;
                        if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1 ||
                            sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1)
                                total += v;
                }
                if (f)
                        fclose(f);
        }
        if (dir)
                closedir(dir);
        return total;
}

static void summary(const char *what, double *v, int n) {
        qsort(v, (size_t) n, sizeof(*v), cmp_double);
        printf("%-28s median %.3f  range %.3f .. %.3f  (%d rounds)\n", what, v[n / 2], v[0], v[n - 1], n);
}

int main(int argc, char **argv) {
        const char *socket_path = NULL, *trace_path = NULL;
        size_t size = 4096;
        long pairs = 200000, rt_pairs = 20000;
        int rounds = 7;
        static const struct option opts[] = {
                {"socket", required_argument, NULL, 's'}, {"size", required_argument, NULL, 'z'},
                {"pairs", required_argument, NULL, 'n'},  {"rounds", required_argument, NULL, 'r'},
                {"trace", required_argument, NULL, 't'},  {0}};
        for (int ch; (ch = getopt_long(argc, argv, "s:z:n:r:t:", opts, NULL)) != -1;) {
                switch (ch) {
                case 's':
                        socket_path = optarg;
                        break;
                case 'z':
                        size = strtoull(optarg, NULL, 10);
                        break;
                case 'n':
                        pairs = atol(optarg);
                        rt_pairs = pairs / 10 > 0 ? pairs / 10 : 1;
                        break;
                case 'r':
                        rounds = atoi(optarg);
                        break;
                case 't':
                        trace_path = optarg;
                        break;
                default:
                        fprintf(stderr, "usage: gpumem-bench-local --socket PATH [--size B] [--pairs N] [--rounds R] "
                                        "[--trace CSV]\n");
                        return 2;
                }
        }
        if (!socket_path || rounds < 1 || rounds > MAX_ROUNDS || pairs < 100)
                return 2;
        gpumem_client *local = NULL, *local_step = NULL, *central = NULL;
        if (gpumem_connect_heap(socket_path, GPUMEM_HEAP_LOCAL, &local) < 0 ||
            gpumem_connect_heap(socket_path, GPUMEM_HEAP_LOCAL, &local_step) < 0 ||
            gpumem_connect_heap(socket_path, GPUMEM_HEAP_CENTRAL, &central) < 0) {
                fprintf(stderr, "cannot connect to %s\n", socket_path);
                return 1;
        }
        uint64_t va = 0, va2 = 0;
        gm_heap_t *heap = core_heap(&va), *step_heap = core_heap(&va2);
        trace_t t = {0};
        if (trace_path && trace_load(trace_path, &t) < 0) {
                fprintf(stderr, "cannot read trace %s\n", trace_path);
                return 2;
        }
        uint64_t *core_slots = calloc(t.n_slots + 1, sizeof(*core_slots));
        uint64_t *torch_slots = calloc(t.n_slots + 1, sizeof(*torch_slots));
        torch_peer_t *peer = torch_peer_new(false), *step_peer = torch_peer_new(false);
        void **client_slots = calloc(t.n_slots + 1, sizeof(*client_slots));
        pingpong_start();
        /* warm-up: segments, page faults, caches */
        core_pairs(heap, size, pairs / 10);
        torch_pairs(peer, size, pairs / 10);
        local_pairs(local, size, pairs / 10);
        central_pairs(central, size, rt_pairs / 10);
        pingpong(rt_pairs / 10);
        if (t.n && (step_core(step_heap, &t, core_slots) < 0 || step_torch(step_peer, &t, torch_slots) < 0 ||
                    step_client(local_step, &t, client_slots) < 0)) {
                fprintf(stderr, "trace replay failed\n");
                return 1;
        }
        int64_t requests_before = t.n ? daemon_requests(socket_path) : 0;
        double r_local[MAX_ROUNDS], r_torch[MAX_ROUNDS], r_central[MAX_ROUNDS], r_step[MAX_ROUNDS];
        double r_step_torch[MAX_ROUNDS];
        double c_local[MAX_ROUNDS], c_torch[MAX_ROUNDS], c_step[MAX_ROUNDS]; /* the same in thread CPU time */
        uint64_t cs_central = 0, cs_pingpong = 0;
        printf("# round  core_ns  torch_ns  local_ns  central_ns  pingpong_ns%s\n",
               t.n ? "  step_core_us  step_torch_us  step_local_us" : "");
        for (int k = 0; k < rounds; k++) {
                double core = core_pairs(heap, size, pairs), core_cpu = last_cpu_ns;
                double tor = torch_pairs(peer, size, pairs), tor_cpu = last_cpu_ns;
                double loc = local_pairs(local, size, pairs), loc_cpu = last_cpu_ns;
                uint64_t cs0 = context_switches();
                double cen = central_pairs(central, size, rt_pairs);
                uint64_t cs1 = context_switches();
                double pp = pingpong(rt_pairs);
                cs_central += cs1 - cs0;
                cs_pingpong += context_switches() - cs1;
                double sc = t.n ? step_core(step_heap, &t, core_slots) : 0, sc_cpu = last_cpu_ns;
                double st = t.n ? step_torch(step_peer, &t, torch_slots) : 0;
                double sl = t.n ? step_client(local_step, &t, client_slots) : 0, sl_cpu = last_cpu_ns;
                if (core < 0 || tor < 0 || loc < 0 || cen < 0 || pp < 0 || sc < 0 || st < 0 || sl < 0) {
                        fprintf(stderr, "round %d failed\n", k);
                        return 1;
                }
                printf("%7d %8.1f %9.1f %9.1f %11.1f %12.1f", k, core, tor, loc, cen, pp);
                if (t.n)
                        printf(" %13.1f %14.1f %14.1f", sc / 1e3, st / 1e3, sl / 1e3);
                printf("\n");
                r_local[k] = loc / core;
                c_local[k] = loc_cpu / core_cpu;
                r_torch[k] = loc / tor;
                c_torch[k] = loc_cpu / tor_cpu;
                r_step_torch[k] = t.n ? sl / st : 0;
                c_step[k] = t.n ? sl_cpu / sc_cpu : 0;
                r_central[k] = cen / pp;
                r_step[k] = t.n ? sl / sc : 0;
        }
        int64_t requests_after = t.n ? daemon_requests(socket_path) : 0;
        summary("local / core (pair)", r_local, rounds);
        summary("local / core (pair), CPU time", c_local, rounds);
        summary("local / torch (pair)", r_torch, rounds);
        summary("local / torch (pair), CPU time", c_torch, rounds);
        summary("central / pingpong (pair)", r_central, rounds);
        printf("context switches in this process per central pair %.2f, per ping-pong %.2f\n",
               (double) cs_central / ((double) rt_pairs * rounds), (double) cs_pingpong / ((double) rt_pairs * rounds));
        if (t.n) {
                printf("# trace: %zu events, %zu allocations per step\n", t.n, t.n_allocs);
                summary("step local / in process", r_step, rounds);
                summary("step local / in process, CPU", c_step, rounds);
                summary("step local / torch", r_step_torch, rounds);
                printf("daemon messages per step after the first: %.2f (%" PRId64 " in %d steps)\n",
                       (double) (requests_after - requests_before) / rounds, requests_after - requests_before, rounds);
        }
        gpumem_disconnect(local);
        gpumem_disconnect(local_step);
        gpumem_disconnect(central);
        gm_heap_destroy(heap);
        gm_heap_destroy(step_heap);
        torch_peer_destroy(peer);
        torch_peer_destroy(step_peer);
        close(pp_sock);
        while (wait(NULL) > 0) {
        }
        return 0;
}
