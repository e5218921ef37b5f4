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

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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
        uint64_t ino;  /* the memfd's inode; 0 = free slot */
        uint64_t size; /* bytes */
        int32_t device;
        int32_t pad;
        fake_holder_t holders[FAKE_POOL_HOLDERS];
} fake_slot_t;

typedef struct fake_ctx_use {
        int32_t pid; /* 0 = free entry */
        int32_t device;
        uint64_t bytes; /* charged while the process's primary context is active */
} fake_ctx_use_t;

typedef struct fake_pool {
        uint64_t magic;
        uint32_t device_count;
        uint32_t compute_mode;               /* CUcomputemode of every device */
        uint64_t capacity[FAKE_MAX_DEVICES]; /* total bytes of each device */
        uint64_t in_use[FAKE_MAX_DEVICES];   /* allocations + contexts + cuMemAlloc blocks */
        uint64_t allocations[FAKE_MAX_DEVICES];
        fake_ctx_use_t contexts[FAKE_POOL_CONTEXTS];
        fake_slot_t slots[FAKE_POOL_SLOTS];
        pthread_mutex_t lock; /* last, so readers' offsets do not depend on its size */
} fake_pool_t;

/* A process that exited (or is a zombie) holds no device memory. */
static inline bool fake_pool_alive(int32_t pid) {
        if (pid == getpid())
                return true;
        if (kill(pid, 0) < 0 && errno == ESRCH)
                return false;
        char path[64], buf[256];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return errno != ENOENT;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
                return true;
        buf[n] = '\0';
        const char *paren = strrchr(buf, ')');
        return !(paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

/* Bytes live processes hold on `device`; those of the calling process are
 * left out when `skip_self`. */
static inline uint64_t fake_pool_live_bytes(const fake_pool_t *pool, int device, bool skip_self) {
        uint64_t n = 0;
        int32_t self = getpid();
        for (int i = 0; i < FAKE_POOL_CONTEXTS; i++) {
                const fake_ctx_use_t *c = &pool->contexts[i];
                if (c->pid && c->device == device && !(skip_self && c->pid == self) && fake_pool_alive(c->pid))
                        n += c->bytes;
        }
        for (int i = 0; i < FAKE_POOL_SLOTS; i++) {
                const fake_slot_t *s = &pool->slots[i];
                bool held = false;
                for (int h = 0; s->ino && s->device == device && h < FAKE_POOL_HOLDERS && !held; h++)
                        held = s->holders[h].pid && !(skip_self && s->holders[h].pid == self) &&
                               fake_pool_alive(s->holders[h].pid);
                n += held ? s->size : 0;
        }
        return n;
}
