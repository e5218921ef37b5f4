/* Backend selection and helpers shared by every backend. */
#include "backend.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Formats into reterr when the caller gave one (reterr_len > 0). */
static void set_err(char *reterr, size_t reterr_len, const char *fmt, ...) {
        if (!reterr || reterr_len == 0)
                return;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(reterr, reterr_len, fmt, ap);
        va_end(ap);
}

bool gm_backend_kind_known(const char *kind) {
        return strcmp(kind, "auto") == 0 || strcmp(kind, "cuda") == 0 || strcmp(kind, "host") == 0;
}

int gm_backend_open(const gm_backend_options_t *opts, gm_backend_t **ret_backend, char *reterr, size_t reterr_len) {
        const char *kind = opts->kind ? opts->kind : "auto";
        if (strcmp(kind, "host") == 0)
                return gm_backend_host_open(opts, ret_backend, reterr, reterr_len);
        if (strcmp(kind, "cuda") == 0)
                return gm_backend_cuda_open(opts, ret_backend, reterr, reterr_len);
        if (strcmp(kind, "auto") != 0) {
                set_err(reterr, reterr_len, "unknown backend '%s' (expected " GM_BACKEND_KINDS ")", kind);
                return -EINVAL;
        }

        char cuda_err[256] = "";
        int r = gm_backend_cuda_open(opts, ret_backend, cuda_err, sizeof(cuda_err));
        if (r == 0) {
                set_err(reterr, reterr_len, "cuda device %d usable; using cuda", opts->device);
                return 0;
        }
        char host_err[256] = "";
        r = gm_backend_host_open(opts, ret_backend, host_err, sizeof(host_err));
        if (r < 0)
                set_err(reterr, reterr_len, "cuda backend unavailable (%s); host backend failed too (%s)", cuda_err,
                        host_err);
        else
                set_err(reterr, reterr_len, "cuda backend unavailable (%s); using host", cuda_err);
        return r;
}

gm_backend_t *gm_backend_close(gm_backend_t *b) {
        if (b)
                b->ops->destroy(b);
        return NULL;
}

const char *gm_backend_last_error(const gm_backend_t *b) {
        return b && b->ops->last_error ? b->ops->last_error() : "";
}

uint64_t gm_round_up(uint64_t size, uint64_t granularity) {
        assert(granularity > 0);
        uint64_t rem = size % granularity;
        if (rem == 0)
                return size;
        uint64_t add = granularity - rem;
        return size > UINT64_MAX - add ? 0 : size + add;
}

#ifndef GPUMEM_HAVE_CUDA
int gm_backend_cuda_open(const gm_backend_options_t *opts, gm_backend_t **ret_backend, char *reterr,
                         size_t reterr_len) {
        set_err(reterr, reterr_len,
                "this gpumemd was built without the cuda backend: cuda.h was not found at build time");
        return -ENOSYS;
}
#endif
