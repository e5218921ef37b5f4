/* Allocator core cost: ns per alloc+free pair with N live blocks (N = 1k ...
 * 1M), random sizes 512 B - 256 KiB on four streams, on a provider that
 * never fails. Not a test: it prints figures. Usage: alloc_core [max_live
 * [pairs [native|expandable|reuse|all]]] (pairs: timed alloc+free pairs per
 * run, default 2000000; every run starts from the same seed, so runs
 * differing only in pairs differ only in the timed loop's tail; reuse =
 * expandable segments with gpumemd_page_reuse). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "allocator.h"

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

static uint64_t rng;

static uint64_t rnd(void) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}

static void run(uint64_t n_live, uint64_t pairs, heap_mode_t mode) {
        gm_alloc_config_t cfg;
        gm_provider_t prov = {
                .create = bench_create, .create_run = bench_create_run, .release = bench_release, .remap = bench_remap};
        uint64_t cursor = 1ULL << 40, *ids = malloc(n_live * sizeof(*ids));
        gm_heap_params_t params = {.capacity = 1ULL << 44, .va_cursor = &cursor};
        gm_alloc_result_t r;
        gm_heap_t *h;
        double t0;

        rng = 88172645463325252ULL; /* every run replays the same sequence */
        gm_alloc_config_default(&cfg);
        cfg.expandable_segments = mode != NATIVE;
        cfg.page_reuse = mode == REUSE;
        if (!ids || gm_heap_new(&cfg, &prov, &params, &h) < 0)
                exit(1);
        for (uint64_t i = 0; i < n_live; i++) {
                if (gm_heap_alloc(h, 512 + rnd() % (256 << 10), rnd() % 4, &r) < 0)
                        exit(1);
                ids[i] = r.block_id;
        }
        t0 = gm_now_ns();
        for (uint64_t i = 0; i < pairs; i++) {
                uint64_t k = rnd() % n_live;

                gm_heap_free(h, ids[k], false);
                if (gm_heap_alloc(h, 512 + rnd() % (256 << 10), rnd() % 4, &r) < 0)
                        exit(1);
                ids[k] = r.block_id;
        }
        printf("%-10s live=%-8llu %7.1f ns per alloc+free\n", mode_names[mode], (unsigned long long) n_live,
               ((double) gm_now_ns() - t0) / (double) pairs);
        gm_heap_destroy(h);
        free(ids);
}

int main(int argc, char **argv) {
        uint64_t max = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
        uint64_t pairs = argc > 2 ? strtoull(argv[2], NULL, 10) : 2000000;
        const char *only = argc > 3 ? argv[3] : "all";

        for (uint64_t n = 1000; n <= max; n *= 10)
                for (int m = 0; m < _MODE_MAX; m++)
                        if (!strcmp(only, "all") || !strcmp(only, mode_names[m]))
                                run(n, pairs, (heap_mode_t) m);
        return 0;
}
