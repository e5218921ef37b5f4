// Compile-time check (g++ -fsyntax-only, with CUDA's cuda_runtime_api.h): the
// entry points of gpumem/torch.h have exactly the types through which
// torch/csrc/cuda/CUDAPluggableAllocator.h calls a pluggable allocator, and
// gpumem/torch.h's stream type is CUDA's cudaStream_t.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <type_traits>

#include "gpumem/torch.h"

static_assert(std::is_same<decltype(&gpumem_torch_alloc), void *(*) (size_t, int, cudaStream_t)>::value,
              "alloc_fn must be void *(size_t, int, cudaStream_t)");
static_assert(std::is_same<decltype(&gpumem_torch_free), void (*)(void *, size_t, int, cudaStream_t)>::value,
              "free_fn must be void (void *, size_t, int, cudaStream_t)");
// The optional hooks a C++ user may set on the allocator object.
static_assert(std::is_same<decltype(&gpumem_torch_record_stream), void (*)(void *, cudaStream_t)>::value,
              "record_stream_fn must be void (void *, cudaStream_t)");
static_assert(std::is_same<decltype(&gpumem_torch_empty_cache), void (*)()>::value, "reset_fn must be void ()");
// memory.py's docstring spells the size ssize_t: the same width, passed the same way.
static_assert(sizeof(ssize_t) == sizeof(size_t), "ssize_t and size_t differ in width");

// What CUDAPluggableAllocator stores them in.
[[maybe_unused]] static const std::function<void *(size_t, int, cudaStream_t)> alloc_fn = gpumem_torch_alloc;
[[maybe_unused]] static const std::function<void(void *, size_t, int, cudaStream_t)> free_fn = gpumem_torch_free;
