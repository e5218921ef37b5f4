// Compile-time check (g++ -fsyntax-only, with CUDA's cuda_runtime_api.h): the
// entry points of gpumem/torch.h have exactly the types through which
// torch/csrc/cuda/CUDAPluggableAllocator.h calls a pluggable allocator, and
// gpumem/torch.h's stream type is CUDA's cudaStream_t.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <type_traits>
#include <utility>

#include "gpumem/torch.h"

static_assert(std::is_same<decltype(&gpumem_torch_alloc), void *(*) (size_t, int, cudaStream_t)>::value,
              "alloc_fn must be void *(size_t, int, cudaStream_t)");
static_assert(std::is_same<decltype(&gpumem_torch_free), void (*)(void *, size_t, int, cudaStream_t)>::value,
              "free_fn must be void (void *, size_t, int, cudaStream_t)");
// The optional hooks a C++ user may set on the allocator object.
static_assert(std::is_same<decltype(&gpumem_torch_record_stream), void (*)(void *, cudaStream_t)>::value,
              "record_stream_fn must be void (void *, cudaStream_t)");
static_assert(std::is_same<decltype(&gpumem_torch_empty_cache), void (*)()>::value, "reset_fn must be void ()");
static_assert(std::is_same<decltype(&gpumem_torch_malloc), void *(*) (size_t, int, cudaStream_t)>::value,
              "gpumem_torch_malloc is an alloc_fn");
// torch/csrc/cuda/Module.cpp's setters: set_memory_fraction_fn void(double, int);
// set_end_allocate_to_pool_fn and set_release_pool void(int, c10::cuda::MempoolId_t).
static_assert(std::is_same<decltype(&gpumem_torch_set_memory_fraction), void (*)(double, int)>::value,
              "memory_fraction_fn must be void (double, int)");
static_assert(std::is_same<decltype(&gpumem_torch_end_allocate_to_pool), void (*)(int, gpumem_torch_pool_id)>::value,
              "end_allocate_to_pool_fn must be void (int, MempoolId_t)");
static_assert(std::is_same<decltype(&gpumem_torch_release_pool), void (*)(int, gpumem_torch_pool_id)>::value,
              "release_pool must be void (int, MempoolId_t)");
// MempoolId_t is std::pair<CaptureId_t, CaptureId_t> (unsigned long long): the
// same size and alignment, trivially copyable both, so passed the same way.
using mempool_id = std::pair<unsigned long long, unsigned long long>;
static_assert(sizeof(mempool_id) == sizeof(gpumem_torch_pool_id) &&
                      alignof(mempool_id) == alignof(gpumem_torch_pool_id),
              "gpumem_torch_pool_id must be laid out as MempoolId_t");
static_assert(std::is_trivially_copy_constructible<mempool_id>::value &&
                      std::is_trivially_destructible<mempool_id>::value,
              "MempoolId_t goes in registers");
// set_begin_allocate_to_pool passes its std::function<bool(cudaStream_t)> by
// value, a non-trivial type, so by the address of the caller's copy: const void *.
static_assert(!std::is_trivially_copy_constructible<std::function<bool(cudaStream_t)>>::value,
              "the stream filter goes by address");
static_assert(std::is_same<decltype(&gpumem_torch_begin_allocate_to_pool),
                           void (*)(int, gpumem_torch_pool_id, const void *)>::value,
              "begin_allocate_to_pool takes (int, MempoolId_t, the filter's address)");
// memory.py's docstring spells the size ssize_t: the same width, passed the same way.
static_assert(sizeof(ssize_t) == sizeof(size_t), "ssize_t and size_t differ in width");

// What CUDAPluggableAllocator stores them in.
[[maybe_unused]] static const std::function<void *(size_t, int, cudaStream_t)> alloc_fn = gpumem_torch_alloc;
[[maybe_unused]] static const std::function<void(void *, size_t, int, cudaStream_t)> free_fn = gpumem_torch_free;
