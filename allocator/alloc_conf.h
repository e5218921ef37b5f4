/* Allocator configuration in PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GM_ROUNDUP_SLOTS 16

typedef struct gm_alloc_config {
        uint64_t max_split_size;                             /* bytes; UINT64_MAX = unlimited */
        uint64_t max_non_split_rounding;                     /* bytes; default 20 MiB */
        uint32_t roundup_power2_divisions[GM_ROUNDUP_SLOTS]; /* 0 = off */
        double garbage_collection_threshold;                 /* 0 = off */
        double per_process_memory_fraction;                  /* 0 or 1 = no limit */
        bool expandable_segments;
        bool page_reuse;                    /* gpumemd_page_reuse (gpumemd extension; needs expandable_segments) */
        bool release_lock_on_cudamalloc;    /* accepted for compatibility; no effect */
        bool pinned_use_cuda_host_register; /* accepted; no effect */
        uint32_t pinned_num_register_threads;
        char raw[512]; /* the last settings string, verbatim */
} gm_alloc_config_t;

/* PyTorch's defaults. */
void gm_alloc_config_default(gm_alloc_config_t *ret_config);

/* Parses `conf` ("key:value,key:value"; NULL or "" = defaults) with PyTorch's
 * validation. On failure returns -EINVAL and writes a one-line reason into
 * reterr (if not NULL); *ret_config is written only on success. */
int gm_alloc_config_parse(const char *conf, gm_alloc_config_t *ret_config, char *reterr, size_t reterr_len);
