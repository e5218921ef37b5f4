/* What a test may ask the emulated driver beyond the CUDA API: the driver
 * objects this process still holds (every cuda-backend test asserts none are
 * left at its end) and the device-wide figures of the shared pool. Resolve
 * them with dlsym() on the loaded emulator (dlopen(..., RTLD_NOLOAD)). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fakecuda_usage {
        long handles;      /* allocation handles not released (cuMemCreate/Import) */
        long mappings;     /* cuMemMap ranges not unmapped */
        long reservations; /* cuMemAddressReserve ranges not freed */
        long blocks;       /* cuMemAlloc blocks not freed */
        long streams, events;
        long contexts;              /* primary contexts retained and not released */
        long rdma_handles;          /* of `handles`, those created GPUDirect-RDMA capable */
        long stack_depth;           /* the calling thread's context stack */
        long event_queries;         /* cuEventQuery calls so far (how hard pending events are polled) */
        long event_records;         /* cuEventRecord calls so far */
        long faults;                /* kernels that faulted (their memory unmapped under them): a test failure */
        long capture_refusals;      /* calls refused because a stream capture forbids them (capture invalidated) */
        long host_allocations;      /* cuMemHostAlloc blocks not freed (cuMemFreeHost) */
        uint64_t host_bytes;        /* their bytes: page-locked host memory this process holds */
        long host_alloc_calls;      /* cuMemHostAlloc calls so far, failed ones included */
        uint64_t pinned_copy_bytes; /* cuMemcpyDtoH/HtoD bytes so far whose host side was page-locked */
        long syncs_held;            /* synchronizing calls now held by FAKECUDA_HOLD_SYNC (work that takes long) */
} fakecuda_usage_t;

/* This process's driver objects. 0, or -1 before cuInit. */
typedef int (*fakecuda_usage_fn)(fakecuda_usage_t *ret);
/* Device-wide bytes in use on physical device `device` (allocations of every
 * live process, their contexts, cuMemAlloc blocks) after dropping dead
 * holders; *ret_allocations is the number of live allocations. */
typedef int (*fakecuda_device_usage_fn)(int device, uint64_t *ret_bytes, uint64_t *ret_allocations);
/* Bytes the process `pid` holds on `device` (its contexts and what it alone
 * keeps alive), as nvidia-smi's per-process used memory. */
typedef int (*fakecuda_process_usage_fn)(int device, int pid, uint64_t *ret_bytes);

/* Emulated device work: a kernel queued on `stream` (a CUstream: NULL,
 * CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or one made by cuStreamCreate) that
 * the stream's worker runs later, in stream order, over device memory (the
 * only way to touch it: the CPU cannot, unless FAKECUDA_SYNC=1). Memory it
 * touches that is unmapped before it ran makes it fault: the context's calls
 * return CUDA_ERROR_ILLEGAL_ADDRESS from then on and fakecuda_usage() counts
 * the fault. Each returns a CUresult. fill/verify use one byte value;
 * pattern/verify_pattern the bytes of tests/lib's gm_test_fill(seed);
 * verify's *ret_ok (host memory) is 1 or 0 once the kernel ran; to_host and
 * from_host copy between device and host memory when they run; spin runs
 * for `ms` milliseconds touching nothing (work that takes long). */
typedef int (*fakecuda_launch_fill_fn)(void *stream, uint64_t dst, size_t bytes, unsigned char value);
typedef int (*fakecuda_launch_verify_fn)(void *stream, uint64_t src, size_t bytes, unsigned char value, int *ret_ok);
typedef int (*fakecuda_launch_pattern_fn)(void *stream, uint64_t dst, size_t bytes, uint64_t seed);
typedef int (*fakecuda_launch_verify_pattern_fn)(void *stream, uint64_t src, size_t bytes, uint64_t seed, int *ret_ok);
typedef int (*fakecuda_launch_copy_fn)(void *stream, uint64_t dst, uint64_t src, size_t bytes);
typedef int (*fakecuda_launch_to_host_fn)(void *stream, void *dst, uint64_t src, size_t bytes);
typedef int (*fakecuda_launch_from_host_fn)(void *stream, uint64_t dst, const void *src, size_t bytes);
typedef int (*fakecuda_launch_spin_fn)(void *stream, unsigned ms);
/* Synchronous forms (cudaMemset's way): on the legacy stream of the memory's
 * device, waited for (run at once when no context of it is active). */
typedef int (*fakecuda_device_pattern_fn)(uint64_t dst, size_t bytes, uint64_t seed);
typedef int (*fakecuda_device_verify_pattern_fn)(uint64_t src, size_t bytes, uint64_t seed, int *ret_ok);
typedef int (*fakecuda_device_verify_fn)(uint64_t src, size_t bytes, unsigned char value, int *ret_ok);
/* Whether `p` is mapped device memory of this process (or a cuMemAlloc block). */
typedef bool (*fakecuda_is_device_pointer_fn)(const void *p);

/* The emulator's definitions (tests do not link it: use dlsym). */
int fakecuda_launch_fill(void *stream, uint64_t dst, size_t bytes, unsigned char value);
int fakecuda_launch_verify(void *stream, uint64_t src, size_t bytes, unsigned char value, int *ret_ok);
int fakecuda_launch_pattern(void *stream, uint64_t dst, size_t bytes, uint64_t seed);
int fakecuda_launch_verify_pattern(void *stream, uint64_t src, size_t bytes, uint64_t seed, int *ret_ok);
int fakecuda_launch_copy(void *stream, uint64_t dst, uint64_t src, size_t bytes);
int fakecuda_launch_to_host(void *stream, void *dst, uint64_t src, size_t bytes);
int fakecuda_launch_from_host(void *stream, uint64_t dst, const void *src, size_t bytes);
int fakecuda_launch_spin(void *stream, unsigned ms);
int fakecuda_device_pattern(uint64_t dst, size_t bytes, uint64_t seed);
int fakecuda_device_verify_pattern(uint64_t src, size_t bytes, uint64_t seed, int *ret_ok);
int fakecuda_device_verify(uint64_t src, size_t bytes, unsigned char value, int *ret_ok);
bool fakecuda_is_device_pointer(const void *p);
int fakecuda_usage(fakecuda_usage_t *ret);
int fakecuda_device_usage(int device, uint64_t *ret_bytes, uint64_t *ret_allocations);
int fakecuda_process_usage(int device, int pid, uint64_t *ret_bytes);
