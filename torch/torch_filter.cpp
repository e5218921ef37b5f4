// PyTorch's private-pool stream filter from C: beginAllocateToPool passes a
// std::function<bool(cudaStream_t)> by value (the caller's temporary, by
// address under the Itanium C++ ABI), which this file copies, calls and
// destroys. Only libstdc++ is needed, not PyTorch's headers.
#include <functional>
#include <new>

extern "C" {
#include "torch_filter.h"
}

using stream_filter = std::function<bool(CUstream_st *)>;

void *gm_torch_filter_copy(const void *fn) {
        if (!fn)
                return nullptr;
        return new (std::nothrow) stream_filter(*static_cast<const stream_filter *>(fn));
}

bool gm_torch_filter_accepts(const void *filter, CUstream_st *stream) {
        if (!filter)
                return true;
        const stream_filter &f = *static_cast<const stream_filter *>(filter);
        try {
                return f && f(stream);
        } catch (...) { // a filter that fails accepts nothing: the allocation stays out of the pool
                return false;
        }
}

void gm_torch_filter_free(void *filter) {
        delete static_cast<stream_filter *>(filter);
}
