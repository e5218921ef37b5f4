// gpumem_torch_malloc: gpumem_torch_alloc with an out-of-memory PyTorch can
// see. CUDAPluggableAllocator::malloc does not check alloc_fn's result, so a
// NULL becomes a tensor at address 0; an exception thrown here unwinds
// through PyTorch's C++ (its own caching allocator throws from the same
// place) to the Python binding, which turns it into a Python exception.
// Built against PyTorch's headers (GPUMEM_TORCH_C10) it throws
// c10::OutOfMemoryError, which Python sees as torch.OutOfMemoryError; without
// them a std::runtime_error, which PyTorch's bindings raise as RuntimeError
// with the same message.
#include <cstdio>
#include <stdexcept>
#include <string>

#ifdef GPUMEM_TORCH_C10
#include <c10/util/Exception.h>
#endif

#include "gpumem/torch.h"

void *gpumem_torch_malloc(size_t size, int device, CUstream_st *stream) {
        void *ptr = gpumem_torch_alloc(size, device, stream);
        if (ptr || size == 0)
                return ptr;
        char diagnosis[2048] = "";
        bool in_range = device >= 0 && device < GPUMEM_TORCH_MAX_DEVICES; /* others are kept as device 0's */
        int err = gpumem_torch_last_refusal(in_range ? device : 0, diagnosis, sizeof(diagnosis), nullptr);
        char head[160];
        std::snprintf(head, sizeof(head), "CUDA out of memory. gpumemd refused %zu bytes on cuda:%d (%s): ", size,
                      device, gpumem_strerror(err));
        std::string msg = std::string(head) + diagnosis;
#ifdef GPUMEM_TORCH_C10
        TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
#endif
        throw std::runtime_error(msg);
}
