/* PyTorch's private-pool stream filter, std::function<bool(cudaStream_t)>,
 * from C: torch_filter.cpp keeps a copy and calls it. Built without a C++
 * compiler, no filter is kept and every stream is accepted. */
#ifndef GPUMEM_TORCH_FILTER_H
#define GPUMEM_TORCH_FILTER_H

#include <stdbool.h>

struct CUstream_st;

#ifdef GPUMEM_TORCH_HAVE_CXX
/* A heap copy of the std::function at `fn` (NULL for NULL or out of memory). */
void *gm_torch_filter_copy(const void *fn);
/* Whether the copied filter accepts `stream`; NULL accepts every stream. */
bool gm_torch_filter_accepts(const void *filter, struct CUstream_st *stream);
/* Destroys a copy; accepts NULL. */
void gm_torch_filter_free(void *filter);
#else
static inline void *gm_torch_filter_copy(const void *fn) {
        (void) fn;
        return NULL;
}
static inline bool gm_torch_filter_accepts(const void *filter, struct CUstream_st *stream) {
        (void) filter;
        (void) stream;
        return true;
}
static inline void gm_torch_filter_free(void *filter) {
        (void) filter;
}
#endif

#endif
