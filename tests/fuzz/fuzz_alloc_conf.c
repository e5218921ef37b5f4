/* The PYTORCH_CUDA_ALLOC_CONF parser (allocator/alloc_conf.c), fed by
 * --alloc-conf, the config file and clients. Properties: failure is -EINVAL
 * with a one-line reason; success keeps the string verbatim in raw and
 * parsing raw again gives the same settings; the values keep their ranges. */
#include <errno.h>
#include <math.h>

#include "alloc_conf.h"
#include "fuzz.h"

static bool same(const gm_alloc_config_t *a, const gm_alloc_config_t *b) {
        return a->max_split_size == b->max_split_size && a->max_non_split_rounding == b->max_non_split_rounding &&
               memcmp(a->roundup_power2_divisions, b->roundup_power2_divisions, sizeof(a->roundup_power2_divisions)) ==
                       0 &&
               a->garbage_collection_threshold == b->garbage_collection_threshold &&
               a->per_process_memory_fraction == b->per_process_memory_fraction &&
               a->expandable_segments == b->expandable_segments &&
               a->release_lock_on_cudamalloc == b->release_lock_on_cudamalloc &&
               a->pinned_use_cuda_host_register == b->pinned_use_cuda_host_register &&
               a->pinned_num_register_threads == b->pinned_num_register_threads && strcmp(a->raw, b->raw) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 1024)
                return 0;
        char *s = fuzz_cstring(data, size);
        gm_alloc_config_t c, again;
        char err[256];
        err[0] = '\0';
        int r = gm_alloc_config_parse(s, &c, err, sizeof(err));
        if (r < 0) {
                FUZZ_ASSERT(r == -EINVAL);
                FUZZ_ASSERT(err[0] != '\0' && memchr(err, '\0', sizeof(err)));
        } else {
                FUZZ_ASSERT(strcmp(c.raw, s) == 0);
                FUZZ_ASSERT(gm_alloc_config_parse(c.raw, &again, err, sizeof(err)) == 0);
                FUZZ_ASSERT(same(&c, &again));
                FUZZ_ASSERT(c.garbage_collection_threshold >= 0.0 && c.garbage_collection_threshold < 1.0);
                FUZZ_ASSERT(c.per_process_memory_fraction >= 0.0 && c.per_process_memory_fraction <= 1.0);
                FUZZ_ASSERT(c.pinned_num_register_threads > 0 &&
                            (c.pinned_num_register_threads & (c.pinned_num_register_threads - 1)) == 0);
                for (size_t i = 0; i < GM_ROUNDUP_SLOTS; i++) {
                        uint32_t d = c.roundup_power2_divisions[i];
                        FUZZ_ASSERT((d & (d - 1)) == 0);
                }
        }
        free(s);
        return 0;
}
