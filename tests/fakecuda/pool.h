/* The emulated devices' memory, shared by every process that uses fakecuda
 * (and read by fakenvml and the stand-in nvidia-smi): a small file named by
 * FAKECUDA_POOL, mapped MAP_SHARED and locked with flock(). Without
 * FAKECUDA_POOL a process gets a private pool (figures are then its own).
 *
 * Like physical memory on a GPU, an allocation is freed when the last process
 * holding it (by handle or mapping) lets go or dies: each allocation is one
 * slot, named by its memfd's inode, with the processes that hold it; a dead
 * holder (gone or a zombie) is dropped at the next sweep. Active contexts are
 * charged per process too, as on hardware.
 *
 * Layout version 1 (scripts/gpu-check/nvidia-smi reads it with Python's
 * struct module: keep both in step). */
#pragma once

#include <stdint.h>

#define FAKE_POOL_MAGIC 0x316c6f6f70656b66ull /* "fkepool1" */
#define FAKE_MAX_DEVICES 16
#define FAKE_POOL_SLOTS 16384
#define FAKE_POOL_HOLDERS 6
#define FAKE_POOL_CONTEXTS 256

typedef struct fake_holder {
        int32_t pid;
        int32_t refs; /* the process's handles and mappings of the allocation, as alloc_t counts them */
} fake_holder_t;

typedef struct fake_slot {
        uint64_t ino;    /* the memfd's inode; 0 = free slot */
        uint64_t size;   /* bytes */
        int32_t device;
        int32_t pad;
        fake_holder_t holders[FAKE_POOL_HOLDERS];
} fake_slot_t;

typedef struct fake_ctx_use {
        int32_t pid;    /* 0 = free entry */
        int32_t device;
        uint64_t bytes; /* charged while the process's primary context is active */
} fake_ctx_use_t;

typedef struct fake_pool {
        uint64_t magic;
        uint32_t device_count;
        uint32_t compute_mode;                 /* CUcomputemode of every device */
        uint64_t capacity[FAKE_MAX_DEVICES];   /* total bytes of each device */
        uint64_t in_use[FAKE_MAX_DEVICES];     /* allocations + contexts + cuMemAlloc blocks */
        uint64_t allocations[FAKE_MAX_DEVICES];
        fake_ctx_use_t contexts[FAKE_POOL_CONTEXTS];
        fake_slot_t slots[FAKE_POOL_SLOTS];
} fake_pool_t;
