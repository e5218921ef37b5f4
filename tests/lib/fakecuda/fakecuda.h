/* What a test may ask the emulated driver beyond the CUDA API: the driver
 * objects this process still holds (every cuda-backend test asserts none are
 * left at its end) and the device-wide figures of the shared pool. Resolve
 * them with dlsym() on the loaded emulator (dlopen(..., RTLD_NOLOAD)). */
#pragma once

#include <stdint.h>

typedef struct fakecuda_usage {
        long handles;      /* allocation handles not released (cuMemCreate/Import) */
        long mappings;     /* cuMemMap ranges not unmapped */
        long reservations; /* cuMemAddressReserve ranges not freed */
        long blocks;       /* cuMemAlloc blocks not freed */
        long streams, events;
        long contexts;      /* primary contexts retained and not released */
        long rdma_handles;  /* of `handles`, those created GPUDirect-RDMA capable */
        long stack_depth;   /* the calling thread's context stack */
        long event_queries; /* cuEventQuery calls so far (how hard pending events are polled) */
        long event_records; /* cuEventRecord calls so far */
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

/* The emulator's definitions (tests do not link it: use dlsym). */
int fakecuda_usage(fakecuda_usage_t *ret);
int fakecuda_device_usage(int device, uint64_t *ret_bytes, uint64_t *ret_allocations);
int fakecuda_process_usage(int device, int pid, uint64_t *ret_bytes);
