/* Allocator core cost: alloc+free pairs with N live blocks (N = 1k ... 1M),
 * random sizes 512 B - 256 KiB on four streams, on a provider that never
 * fails, for the gpumemd core (`core`) and its PyTorch-style peer (`torch`,
 * torch_peer.cpp) driven through the same loop. Not a test: it prints
 * figures. Usage:
 *   alloc_core [max_live [pairs [native|expandable|reuse|all]]]
 *       the core alone, ns per pair (pairs default 2000000; reuse =
 *       expandable segments with gpumemd_page_reuse);
 *   alloc_core --impl core|torch|none LIVE PAIRS native|expandable
 *       one run (none: the loop alone); the timed loop is timed_pairs() (for callgrind's
 *       --toggle-collect: bench/compare.sh);
 *   alloc_core --interleave ROUNDS PAIRS [MAX_LIVE]
 *       wall time: core and torch at 1k and MAX_LIVE (default 1M) live,
 *       native and expandable, PAIRS pairs each per round, interleaved.
 * Every run of one instance starts from the same seed, so runs differing only
 * in pairs differ only in the timed loop's tail. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "allocator.h"
#include "clock.h"
#include "torch_peer.h"

static int bench_create(void *ud, uint64_t segment_id, uint64_t va, uint64_t offset, uint64_t size, uint64_t *ret) {
        *ret = segment_id;
        return 0;
}

static int bench_create_run(void *ud, uint64_t segment_id, uint64_t va, uint64_t offset, uint64_t page_size,
                            uint64_t n_pages, uint64_t *handles) {
        for (uint64_t k = 0; k < n_pages; k++)
                handles[k] = segment_id;
        return 0;
}

static void bench_release(void *ud, uint64_t segment_id, uint64_t offset, uint64_t size, uint64_t handle, bool whole) {
}

static int64_t bench_remap(void *ud, const uint64_t *handles, uint64_t n_pages, uint64_t from_segment,
                           uint64_t from_offset, uint64_t to_segment, uint64_t to_va_size, uint64_t to_offset,
                           uint64_t page_size, bool from_empty) {
        return (int64_t) n_pages;
}

typedef enum heap_mode { NATIVE, EXPANDABLE, REUSE, _MODE_MAX } heap_mode_t;

static const char *const mode_names[_MODE_MAX] = {"native", "expandable", "reuse"};

/* none: the loop alone (its random numbers and handle array), subtracted from
 * the other two's instruction counts by bench/compare.sh. */
typedef enum impl_kind { IMPL_CORE, IMPL_TORCH, IMPL_NONE } impl_kind_t;

/* One allocator with its live blocks and its own random sequence. */
typedef struct instance {
        impl_kind_t kind;
        heap_mode_t mode;
        uint64_t n_live;
        uint64_t rng;
        uint64_t *handles; /* core: block ids; torch: addresses */
        gm_heap_t *heap;
        torch_peer_t *peer;
        uint64_t cursor;
} instance_t;

static uint64_t rnd(instance_t *in) {
        in->rng ^= in->rng << 13;
        in->rng ^= in->rng >> 7;
        in->rng ^= in->rng << 17;
        return in->rng;
}

static uint64_t inst_alloc(instance_t *in, uint64_t size, uint64_t stream) {
        gm_alloc_result_t r;

        if (in->kind == IMPL_NONE)
                return size;
        if (in->kind == IMPL_TORCH)
                return torch_peer_alloc(in->peer, size, stream);
        if (gm_heap_alloc(in->heap, size, stream, &r) < 0)
                exit(1);
        return r.block_id;
}

static void inst_free(instance_t *in, uint64_t handle) {
        if (in->kind == IMPL_TORCH)
                torch_peer_free(in->peer, handle);
        else if (in->kind == IMPL_CORE)
                gm_heap_free(in->heap, handle, false);
}

static void inst_new(instance_t *in, impl_kind_t kind, heap_mode_t mode, uint64_t n_live) {
        gm_provider_t prov = {
                .create = bench_create, .create_run = bench_create_run, .release = bench_release, .remap = bench_remap};
        gm_alloc_config_t cfg;

        *in = (instance_t){.kind = kind, .mode = mode, .n_live = n_live, .cursor = 1ULL << 40};
        in->rng = 88172645463325252ULL; /* every run replays the same sequence */
        in->handles = malloc(n_live * sizeof(*in->handles));
        if (!in->handles)
                exit(1);
        if (kind == IMPL_TORCH)
                in->peer = torch_peer_new(mode != NATIVE);
        else if (kind == IMPL_CORE) {
                gm_heap_params_t params = {.capacity = 1ULL << 44, .va_cursor = &in->cursor};

                gm_alloc_config_default(&cfg);
                cfg.expandable_segments = mode != NATIVE;
                cfg.page_reuse = mode == REUSE;
                if (gm_heap_new(&cfg, &prov, &params, &in->heap) < 0)
                        exit(1);
        }
        for (uint64_t i = 0; i < n_live; i++) {
                uint64_t size = 512 + rnd(in) % (256 << 10);

                in->handles[i] = inst_alloc(in, size, rnd(in) % 4);
        }
}

static void inst_destroy(instance_t *in) {
        if (in->kind == IMPL_TORCH)
                torch_peer_destroy(in->peer);
        else if (in->kind == IMPL_CORE)
                gm_heap_destroy(in->heap);
        free(in->handles);
}

/* The timed loop: free a random live block, allocate a new random one. */
__attribute__((noinline)) static void timed_pairs(instance_t *in, uint64_t pairs) {
        for (uint64_t i = 0; i < pairs; i++) {
                uint64_t k = rnd(in) % in->n_live, size;

                inst_free(in, in->handles[k]);
                size = 512 + rnd(in) % (256 << 10);
                in->handles[k] = inst_alloc(in, size, rnd(in) % 4);
        }
}

static double ns_per_pair(instance_t *in, uint64_t pairs) {
        double t0 = gm_now_ns();

        timed_pairs(in, pairs);
        return ((double) gm_now_ns() - t0) / (double) pairs;
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;

        return x < y ? -1 : x > y;
}

/* Median, min and max of v[0..n) (sorts v). */
static void spread(double *v, int n, double *ret_med, double *ret_min, double *ret_max) {
        qsort(v, (size_t) n, sizeof(*v), cmp_double);
        *ret_med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
        *ret_min = v[0];
        *ret_max = v[n - 1];
}

static void print_spread(const char *what, double *v, int n, const char *unit) {
        double med, lo, hi;

        spread(v, n, &med, &lo, &hi);
        printf("  %-34s %8.3f%s (%.3f-%.3f)\n", what, med, unit, lo, hi);
}

/* Core and torch at 1k and max_live, interleaved round by round (the order
 * rotates each round); prints ns/op medians, growth and core/torch ratios. */
static void interleave(int rounds, uint64_t pairs, uint64_t max_live, heap_mode_t mode) {
        enum { C_SMALL, C_BIG, T_SMALL, T_BIG, N_INST };
        static const char *const names[N_INST] = {"core 1k", "core max", "torch 1k", "torch max"};
        instance_t in[N_INST];
        double *t[N_INST], *r = malloc((size_t) rounds * sizeof(*r));

        inst_new(&in[C_SMALL], IMPL_CORE, mode, 1000);
        inst_new(&in[C_BIG], IMPL_CORE, mode, max_live);
        inst_new(&in[T_SMALL], IMPL_TORCH, mode, 1000);
        inst_new(&in[T_BIG], IMPL_TORCH, mode, max_live);
        for (int i = 0; i < N_INST; i++) {
                t[i] = malloc((size_t) rounds * sizeof(*t[i]));
                timed_pairs(&in[i], pairs / 4); /* warm up */
        }
        for (int k = 0; k < rounds; k++)
                for (int j = 0; j < N_INST; j++) {
                        int i = (j + k) % N_INST;

                        t[i][k] = ns_per_pair(&in[i], pairs) / 2;
                }
        printf("%s, %d interleaved rounds of %llu pairs, live 1000 and %llu: median (min-max)\n", mode_names[mode],
               rounds, (unsigned long long) pairs, (unsigned long long) max_live);
#define RATIO(name, a, b)                           \
        do {                                        \
                for (int k = 0; k < rounds; k++)    \
                        r[k] = t[a][k] / t[b][k];   \
                print_spread(name, r, rounds, "x"); \
        } while (0)
        RATIO("core wall growth 1k -> max", C_BIG, C_SMALL);
        RATIO("torch wall growth 1k -> max", T_BIG, T_SMALL);
        RATIO("core / torch wall, 1k", C_SMALL, T_SMALL);
        RATIO("core / torch wall, max", C_BIG, T_BIG);
#undef RATIO
        for (int i = 0; i < N_INST; i++) {
                char what[64];

                snprintf(what, sizeof(what), "%s ns/op", names[i]);
                print_spread(what, t[i], rounds, "  ");
                inst_destroy(&in[i]);
                free(t[i]);
        }
        free(r);
}

static heap_mode_t mode_of(const char *name) {
        for (int m = 0; m < _MODE_MAX; m++)
                if (!strcmp(name, mode_names[m]))
                        return (heap_mode_t) m;
        fprintf(stderr, "unknown mode %s\n", name);
        exit(2);
}

int main(int argc, char **argv) {
        instance_t in;

        if (argc == 6 && !strcmp(argv[1], "--impl")) {
                impl_kind_t kind = !strcmp(argv[2], "torch")  ? IMPL_TORCH
                                   : !strcmp(argv[2], "none") ? IMPL_NONE
                                                              : IMPL_CORE;
                heap_mode_t mode = mode_of(argv[5]);
                uint64_t pairs = strtoull(argv[4], NULL, 10);

                if (kind == IMPL_TORCH && mode == REUSE)
                        return 2;
                inst_new(&in, kind, mode, strtoull(argv[3], NULL, 10));
                printf("%s %s live=%s %.1f ns per alloc+free\n", argv[2], argv[5], argv[3], ns_per_pair(&in, pairs));
                inst_destroy(&in);
                return 0;
        }
        if (argc >= 4 && !strcmp(argv[1], "--interleave")) {
                uint64_t max = argc > 4 ? strtoull(argv[4], NULL, 10) : 1000000;

                interleave(atoi(argv[2]), strtoull(argv[3], NULL, 10), max, NATIVE);
                interleave(atoi(argv[2]), strtoull(argv[3], NULL, 10), max, EXPANDABLE);
                return 0;
        }
        uint64_t max = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
        uint64_t pairs = argc > 2 ? strtoull(argv[2], NULL, 10) : 2000000;
        const char *only = argc > 3 ? argv[3] : "all";

        for (uint64_t n = 1000; n <= max; n *= 10)
                for (int m = 0; m < _MODE_MAX; m++)
                        if (!strcmp(only, "all") || !strcmp(only, mode_names[m])) {
                                inst_new(&in, IMPL_CORE, (heap_mode_t) m, n);
                                printf("%-10s live=%-8llu %7.1f ns per alloc+free\n", mode_names[m],
                                       (unsigned long long) n, ns_per_pair(&in, pairs));
                                inst_destroy(&in);
                        }
        return 0;
}
