/* fakecuda: an emulated CUDA driver, built as a test-only libcuda.so.1 so that
 * CI runs the cuda backend's real code path without a GPU. It implements
 * exactly the entry points gpumemd uses, over memfd and mmap, and is as strict
 * as the driver where gpumemd could go wrong:
 *   - physical memory (cuMemCreate) is one memfd named "fakecuda-devN";
 *     exporting dups it, importing wraps a received fd (anything else is
 *     refused); an allocation lives while any process holds its handle or a
 *     mapping of it, and is charged to its device in a pool shared by every
 *     process (pool.h: FAKECUDA_POOL names the file), so free memory is
 *     device-wide as on hardware; a dead process's share is dropped;
 *   - device addresses are reserved CPU addresses the CPU cannot touch:
 *     cuMemAddressReserve is a PROT_NONE mmap, cuMemMap maps the memfd there
 *     (still PROT_NONE) and once more elsewhere, read-write, for the emulated
 *     kernels alone; cuMemMap checks address, size and offset granularity;
 *     cuMemSetAccess grants the device access; cuMemUnmap puts PROT_NONE back
 *     and takes exactly one mapped range (no holes, no sub-range);
 *   - work is asynchronous: emulated kernels (fakecuda.h: fill, verify, copy,
 *     to/from host, spin for N ms) are queued on a stream and run later by
 *     that stream's worker thread, in order; the legacy stream is ordered
 *     with blocking streams, not with CU_STREAM_NON_BLOCKING ones; an event
 *     completes when the work before it has; cuStreamSynchronize,
 *     cuEventSynchronize, cuCtxSynchronize wait and cuEventQuery and
 *     cuStreamQuery answer truthfully; unmapping (or freeing) memory that
 *     queued or running work touches makes that work fault: its context's
 *     calls return CUDA_ERROR_ILLEGAL_ADDRESS from then on (sticky) and
 *     fakecuda_usage() counts the fault, which fails the test;
 *   - cuMemcpyDtoH/HtoD copy synchronously on the current context's legacy
 *     stream, after its queued work, and fault on unmapped memory;
 *   - cuMemHostAlloc/cuMemFreeHost: page-locked host memory (any current
 *     context), counted while live; copies with it as their host side are
 *     counted too (fakecuda_usage());
 *   - stream capture (cuStreamBeginCapture in global, thread-local and
 *     relaxed modes, cuStreamEndCapture, cuStreamIsCapturing,
 *     cuThreadExchangeStreamCaptureMode) of created streams and of the
 *     calling thread's per-thread default stream (CU_STREAM_PER_THREAD, one
 *     per host thread; the legacy stream cannot be captured, and asking
 *     about it while a blocking stream captures is refused, the per-thread
 *     one being blocking): a thread that a capture forbids
 *     potentially unsafe calls gets CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED from
 *     cuMemMap, cuMemUnmap, cuMemSetAccess, cuMemAlloc, cuMemFree,
 *     cuEventQuery, cuEventSynchronize, cuStreamSynchronize, cuStreamQuery and
 *     cuCtxSynchronize, and the capture is invalidated; querying an event
 *     recorded inside a capture, synchronizing a capturing stream or using
 *     the legacy stream while a blocking stream captures is refused in every
 *     mode; captured work is not run then: the emulated kernels launched
 *     into a capture become the graph's nodes, in order, and
 *     cuGraphInstantiate + cuGraphLaunch queue them again on a stream at
 *     every replay (so a replay over memory freed and reused since shows
 *     the hazard: it overwrites the new owner's data, or faults if unmapped);
 *   - a destroyed stream or event is poisoned: any later use aborts the
 *     process (the real driver may have reused the handle);
 *   - FAKECUDA_SYNC=1, only for suites that read device memory from the CPU,
 *     runs work when it is launched and lets cuMemSetAccess make the pages
 *     CPU-accessible (the emulator as it was before it was asynchronous);
 *   - contexts: one primary context per device, a context stack per thread
 *     (set/push/pop/get); an active context costs FAKECUDA_CONTEXT_BYTES of
 *     device memory (default 8M); exclusive-process compute mode refuses a
 *     second process's context; streams and events belong to the context that
 *     was current when they were made, and cuEventRecord refuses a stream of
 *     another context; unknown stream/event handles are refused;
 *   - fork: a child of a process that called cuInit gets
 *     CUDA_ERROR_NOT_INITIALIZED from every call, cuInit included (only a new
 *     program, after exec, may initialise); reserved ranges are not inherited
 *     (MADV_DONTFORK);
 *   - cuGetProcAddress gives an entry point only at a version that has it and
 *     the signature of that version (cuCtxSynchronize from 13.0 takes a
 *     context);
 *   - CUDA_VISIBLE_DEVICES (a list of indices) reorders and hides devices.
 * Configuration (read by cuInit): FAKECUDA_DEVICE_COUNT (default 1; 0 makes
 * cuInit fail with CUDA_ERROR_NO_DEVICE), FAKECUDA_CAPACITY (bytes per device,
 * suffixes K/M/G/T, default 4G; fixed by the process that creates the pool),
 * FAKECUDA_GRANULARITY (default 2M), FAKECUDA_POOL (the shared pool file),
 * FAKECUDA_CONTEXT_BYTES, FAKECUDA_COMPUTE_MODE (default, exclusive_process,
 * prohibited), FAKECUDA_NO_VMM=1, FAKECUDA_NO_POSIX_FD=1, FAKECUDA_NO_RDMA=1
 * (device attributes and what cuMemCreate accepts),
 * FAKECUDA_FAIL_{CREATE,IMPORT,MAP,UNMAP}_AT=N (the Nth such call in this
 * process fails with FAKECUDA_FAIL_{CREATE,IMPORT,MAP,UNMAP}_ERROR, an error
 * name, default CUDA_ERROR_OUT_OF_MEMORY), FAKECUDA_FAIL_HOST_ALLOC=ERROR (read
 * at every cuMemHostAlloc, unlike the others: while set, each call fails
 * with that error, any unknown value meaning CUDA_ERROR_OUT_OF_MEMORY),
 * FAKECUDA_HOLD_EVENTS=path (while the
 * file exists events are not complete), FAKECUDA_UUID_PREFIX (hex; a device's
 * UUID is these bytes, then zeros, then the physical index in the last byte;
 * default fa4ec0da). fakecuda.h declares the queries tests make. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"
#include "pool.h"

#pragma GCC visibility push(default)
#include <cuda.h>

#define FAKE_DRIVER_VERSION 13000
#define FAKE_STACK_MAX 16
#define FAKE_STREAM_MAGIC 0x5354524du
#define FAKE_EVENT_MAGIC 0x45564e54u
#define FAKE_DEAD_MAGIC 0xdeadu
#define FAKE_GRAPH_MAGIC 0x47524150u
#define FAKE_GRAPH_EXEC_MAGIC 0x47455845u

typedef struct alloc {
        struct alloc *next;
        int fd;           /* the memfd, owned */
        size_t size;      /* bytes */
        int slot;         /* in the pool */
        bool handle_open; /* the handle was not released yet */
        int retains;      /* cuMemRetainAllocationHandle calls not yet released */
        int mappings;     /* cuMemMap ranges using it */
        bool exportable;  /* created with POSIX fd handles requested */
        bool rdma;        /* created GPUDirect-RDMA capable */
} alloc_t;

/* A reservation, a mapping (alloc set) or a cuMemAlloc block (slot set). A
 * mapping's memory is also mapped at `view`, read-write, where only emulated
 * kernels touch it (the client's pages at addr stay PROT_NONE unless
 * FAKECUDA_SYNC=1); prot is what cuMemSetAccess granted the device. */
typedef struct range {
        struct range *next;
        uintptr_t addr;
        size_t size;
        alloc_t *alloc;
        int slot;
        unsigned char *view;
        int prot;
} range_t;

/* A point in a stream's work: done once the stream completed `ticket` items. */
typedef struct mark {
        struct CUstream_st *stream;
        uint64_t ticket;
} mark_t;

typedef struct marks {
        mark_t *v;
        size_t n;
} marks_t;

/* Emulated device work (fakecuda.h's launches), run by the stream's worker
 * after `after` is done. A memory kernel runs under the driver's lock, so it
 * is atomic with cuMemUnmap; a spin sleeps without it. */
typedef enum {
        WORK_FILL,
        WORK_VERIFY,
        WORK_PATTERN,
        WORK_VERIFY_PATTERN,
        WORK_COPY,
        WORK_TO_HOST,
        WORK_FROM_HOST,
        WORK_SPIN,
        WORK_WAIT
} work_kind_t;

typedef struct work {
        struct work *next;
        work_kind_t kind;
        uintptr_t dst, src; /* device ranges [dst, +bytes) and [src, +bytes) it touches (0: none) */
        size_t bytes;
        uint64_t value; /* the byte of fill/verify, the seed of pattern/verify_pattern, ms of spin */
        void *host;     /* to_host's destination, from_host's source, verify's int result */
        marks_t after;
        bool faulted; /* memory it touches was unmapped before it ran */
} work_t;

struct CUctx_st {
        int device;                     /* ordinal */
        int refs;                       /* primary context retains; active while > 0 */
        CUresult error;                 /* sticky: a kernel faulted (CUDA_ERROR_ILLEGAL_ADDRESS) */
        struct CUstream_st *legacy;     /* the NULL / CU_STREAM_LEGACY stream, made on first use */
        struct CUstream_st *per_thread; /* CU_STREAM_PER_THREAD: one per host thread, linked by ->next */
};
struct CUstream_st {
        uint32_t magic; /* FAKE_STREAM_MAGIC; FAKE_DEAD_MAGIC once destroyed (poisoned, never freed) */
        CUcontext ctx;
        struct CUstream_st *next;
        unsigned flags;  /* CU_STREAM_NON_BLOCKING: not ordered with the legacy stream */
        bool legacy;     /* the context's NULL / CU_STREAM_LEGACY stream */
        bool per_thread; /* a CU_STREAM_PER_THREAD stream: owner's alone */
        pthread_t owner; /* per_thread: the host thread whose it is */
        work_t *head, *tail;
        uint64_t enqueued, completed;
        bool has_worker;
        /* stream capture */
        CUstreamCaptureStatus capture;
        CUstreamCaptureMode capture_mode;
        pthread_t capture_thread;
        unsigned long long capture_id;
        work_t *captured_head, *captured_tail; /* the work launched into the open capture */
};
struct CUevent_st {
        uint32_t magic; /* FAKE_EVENT_MAGIC; FAKE_DEAD_MAGIC once destroyed (poisoned, never freed) */
        CUcontext ctx;
        bool recorded;
        unsigned long long capture_id; /* recorded inside that capture (0: none) */
        marks_t marks;                 /* complete when every mark is done */
        struct CUevent_st *next;
};
struct CUgraph_st {
        uint32_t magic;
        work_t *nodes; /* the captured work, in launch order */
};
struct CUgraphExec_st {
        uint32_t magic; /* FAKE_GRAPH_EXEC_MAGIC; FAKE_DEAD_MAGIC once destroyed */
        work_t *nodes;
        struct CUgraphExec_st *next; /* destroyed: in fake.dead_graph_execs */
};

static struct {
        pthread_mutex_t lock;   /* guards everything below but the config */
        pthread_cond_t changed; /* broadcast when work is queued or completes */
        bool initialized;
        pid_t init_pid; /* the process that called cuInit: a fork child is refused */
        /* configuration, fixed by the first successful cuInit */
        int device_count;               /* visible devices */
        int physical[FAKE_MAX_DEVICES]; /* ordinal -> physical index */
        uint64_t granularity, context_bytes;
        bool no_vmm, no_posix_fd, no_rdma;
        bool sync; /* FAKECUDA_SYNC=1: work runs when launched, device memory is CPU-accessible */
        long fail_create_at, fail_import_at, fail_map_at, fail_unmap_at;
        CUresult fail_create_error, fail_import_error, fail_map_error, fail_unmap_error;
        const char *hold_events;
        unsigned char uuid_prefix[15];
        size_t uuid_prefix_len;
        /* the shared pool */
        fake_pool_t *pool;
        /* state */
        long creates, imports, maps, unmaps, event_queries, event_records, faults, capture_refusals, syncs_held;
        uint64_t next_block_id;
        unsigned long long next_capture_id;
        struct CUctx_st ctx[FAKE_MAX_DEVICES];
        alloc_t *allocs;
        range_t *reservations, *mappings, *blocks;
        range_t *host_blocks;                 /* cuMemHostAlloc memory not freed */
        long host_alloc_calls;                /* cuMemHostAlloc calls so far */
        unsigned long long pinned_copy_bytes; /* cuMemcpyDtoH/HtoD bytes with a page-locked host side */
        struct CUstream_st *streams, *dead_streams;
        struct CUevent_st *events, *dead_events;
        struct CUgraphExec_st *dead_graph_execs; /* kept, poisoned, so a later launch is caught */
} fake = {.lock = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER};

static _Thread_local CUcontext stack[FAKE_STACK_MAX];
static _Thread_local int depth;

static void unlock(pthread_mutex_t **m) {
        pthread_mutex_unlock(*m);
}
#define LOCKED()                                                                \
        pthread_mutex_t *locked_ __attribute__((cleanup(unlock))) = &fake.lock; \
        pthread_mutex_lock(locked_)
/* A fork()ed child of an initialised process cannot use the driver. */
#define REQUIRE_INIT()                                              \
        do {                                                        \
                if (!fake.initialized || fake.init_pid != getpid()) \
                        return CUDA_ERROR_NOT_INITIALIZED;          \
        } while (0)

static const struct {
        CUresult code;
        const char *name, *text;
} errors[] = {
        {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
        {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
        {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
        {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
        {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
        {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
        {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
        {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
        {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
        {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
        {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
        {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
        {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
        {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE",
         "CUDA-capable device(s) is/are busy or unavailable"},
        {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation is not permitted in this state"},
        {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
         "operation not permitted when stream is capturing"},
        {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
         "operation failed due to a previous error during capture"},
        {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
         "operation would make the legacy stream depend on a capturing blocking stream"},
        {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
         "attempt to terminate a thread-local capture sequence from another thread"},
        {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

/* ---- configuration ---- */

static bool env_size(const char *name, uint64_t dflt, uint64_t *ret) {
        const char *s = getenv(name);
        if (!s || !*s) {
                *ret = dflt;
                return true;
        }
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || end == s)
                return false;
        unsigned shift = 0;
        switch (*end) {
        case 'K':
        case 'k':
                shift = 10;
                end++;
                break;
        case 'M':
        case 'm':
                shift = 20;
                end++;
                break;
        case 'G':
        case 'g':
                shift = 30;
                end++;
                break;
        case 'T':
        case 't':
                shift = 40;
                end++;
                break;
        }
        if (shift && *end == 'i')
                end++;
        if (*end == 'B')
                end++;
        if (*end || (shift && v > (UINT64_MAX >> shift)))
                return false;
        *ret = (uint64_t) v << shift;
        return true;
}

static bool env_error(const char *name, CUresult *ret) {
        const char *s = getenv(name);
        if (!s || !*s) {
                *ret = CUDA_ERROR_OUT_OF_MEMORY;
                return true;
        }
        for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
                if (strcmp(errors[i].name, s) == 0) {
                        *ret = errors[i].code;
                        return true;
                }
        return false;
}

static bool parse_hex(const char *s, unsigned char *bytes, size_t max, size_t *ret_len) {
        size_t n = 0;
        for (; s[0] && s[1]; s += 2) {
                char pair[3] = {s[0], s[1], 0};
                char *end;
                unsigned long v = strtoul(pair, &end, 16);
                if (*end || n == max)
                        return false;
                bytes[n++] = (unsigned char) v;
        }
        if (*s)
                return false;
        *ret_len = n;
        return true;
}

static bool env_flag(const char *name) {
        const char *s = getenv(name);
        return s && *s && strcmp(s, "0") != 0;
}

static bool parse_compute_mode(uint32_t *ret) {
        const char *s = getenv("FAKECUDA_COMPUTE_MODE");
        if (!s || !*s || strcmp(s, "default") == 0)
                *ret = CU_COMPUTEMODE_DEFAULT;
        else if (strcmp(s, "exclusive_process") == 0)
                *ret = CU_COMPUTEMODE_EXCLUSIVE_PROCESS;
        else if (strcmp(s, "prohibited") == 0)
                *ret = CU_COMPUTEMODE_PROHIBITED;
        else
                return false;
        return true;
}

/* CUDA_VISIBLE_DEVICES: indices, separated by commas; the list ends at the
 * first entry that is not a valid index (as the driver does). */
static void visible_devices(int physical_count) {
        const char *s = getenv("CUDA_VISIBLE_DEVICES");
        fake.device_count = 0;
        if (!s) {
                for (int i = 0; i < physical_count; i++)
                        fake.physical[fake.device_count++] = i;
                return;
        }
        while (*s && fake.device_count < FAKE_MAX_DEVICES) {
                char *end;
                long v = strtol(s, &end, 10);
                if (end == s || v < 0 || v >= physical_count)
                        return;
                fake.physical[fake.device_count++] = (int) v;
                s = *end == ',' ? end + 1 : end;
                if (*end != ',')
                        return;
        }
}

static bool pool_open(uint64_t capacity, int physical_count, uint32_t compute_mode) {
        const char *path = getenv("FAKECUDA_POOL");
        int fd = -1;
        if (path && *path) {
                fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
                if (fd < 0 || flock(fd, LOCK_EX) < 0)
                        goto fail;
                struct stat st;
                if (fstat(fd, &st) < 0 ||
                    (st.st_size < (off_t) sizeof(fake_pool_t) && ftruncate(fd, sizeof(fake_pool_t)) < 0))
                        goto fail;
                if (st.st_uid == geteuid())
                        fchmod(fd, 0666); /* one device for every user's processes */
        }
        void *p = mmap(NULL, sizeof(fake_pool_t), PROT_READ | PROT_WRITE,
                       fd >= 0 ? MAP_SHARED : MAP_PRIVATE | MAP_ANONYMOUS, fd, 0);
        if (p == MAP_FAILED)
                goto fail;
        fake_pool_t *pool = p;
        if (pool->magic != FAKE_POOL_MAGIC) {
                memset(pool, 0, sizeof(*pool));
                pthread_mutexattr_t attr;
                pthread_mutexattr_init(&attr);
                pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
                pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
                pthread_mutex_init(&pool->lock, &attr);
                pthread_mutexattr_destroy(&attr);
                pool->device_count = (uint32_t) physical_count;
                pool->compute_mode = compute_mode;
                for (int i = 0; i < FAKE_MAX_DEVICES; i++)
                        pool->capacity[i] = capacity;
                pool->magic = FAKE_POOL_MAGIC;
        }
        if (fd >= 0) { /* the creation lock (the mapping keeps the file open: unlock explicitly) */
                flock(fd, LOCK_UN);
                close(fd);
        }
        fake.pool = pool;
        return true;
fail:
        if (fd >= 0)
                close(fd);
        return false;
}

static bool configure(void) {
        uint64_t count, capacity, fail_create, fail_import, fail_map, fail_unmap;
        uint32_t compute_mode;
        const char *prefix = getenv("FAKECUDA_UUID_PREFIX");
        if (!env_size("FAKECUDA_DEVICE_COUNT", 1, &count) || count > FAKE_MAX_DEVICES ||
            !env_size("FAKECUDA_CAPACITY", 4ull << 30, &capacity) ||
            !env_size("FAKECUDA_GRANULARITY", 2ull << 20, &fake.granularity) || fake.granularity == 0 ||
            fake.granularity % (uint64_t) sysconf(_SC_PAGESIZE) != 0 ||
            !env_size("FAKECUDA_CONTEXT_BYTES", 8ull << 20, &fake.context_bytes) ||
            !env_size("FAKECUDA_FAIL_CREATE_AT", 0, &fail_create) ||
            !env_size("FAKECUDA_FAIL_IMPORT_AT", 0, &fail_import) || !env_size("FAKECUDA_FAIL_MAP_AT", 0, &fail_map) ||
            !env_size("FAKECUDA_FAIL_UNMAP_AT", 0, &fail_unmap) ||
            !env_error("FAKECUDA_FAIL_CREATE_ERROR", &fake.fail_create_error) ||
            !env_error("FAKECUDA_FAIL_IMPORT_ERROR", &fake.fail_import_error) ||
            !env_error("FAKECUDA_FAIL_MAP_ERROR", &fake.fail_map_error) ||
            !env_error("FAKECUDA_FAIL_UNMAP_ERROR", &fake.fail_unmap_error) || !parse_compute_mode(&compute_mode) ||
            !parse_hex(prefix ? prefix : "fa4ec0da", fake.uuid_prefix, sizeof(fake.uuid_prefix), &fake.uuid_prefix_len))
                return false;
        fake.no_vmm = env_flag("FAKECUDA_NO_VMM");
        fake.no_posix_fd = env_flag("FAKECUDA_NO_POSIX_FD");
        fake.no_rdma = env_flag("FAKECUDA_NO_RDMA");
        fake.sync = env_flag("FAKECUDA_SYNC");
        fake.fail_create_at = (long) fail_create;
        fake.fail_import_at = (long) fail_import;
        fake.fail_map_at = (long) fail_map;
        fake.fail_unmap_at = (long) fail_unmap;
        fake.hold_events = getenv("FAKECUDA_HOLD_EVENTS");
        if (!pool_open(capacity, (int) count, compute_mode))
                return false;
        visible_devices((int) count);
        for (int i = 0; i < FAKE_MAX_DEVICES; i++)
                fake.ctx[i].device = i;
        return true;
}

/* ---- the shared pool (callers hold fake.lock) ---- */

static void pool_lock(void) {
        if (pthread_mutex_lock(&fake.pool->lock) == EOWNERDEAD) /* its holder died: the pool is consistent */
                pthread_mutex_consistent(&fake.pool->lock);
}

static void pool_unlock(void) {
        pthread_mutex_unlock(&fake.pool->lock);
}

static bool alive(int32_t pid) {
        return fake_pool_alive(pid);
}

static void slot_free(fake_pool_t *pool, fake_slot_t *s) {
        pool->in_use[s->device] -= s->size;
        pool->allocations[s->device]--;
        memset(s, 0, sizeof(*s));
}

/* Drops what dead processes held. Caller holds the pool lock. */
static void pool_sweep(void) {
        fake_pool_t *pool = fake.pool;
        for (int i = 0; i < FAKE_POOL_SLOTS; i++) {
                fake_slot_t *s = &pool->slots[i];
                if (!s->ino)
                        continue;
                bool held = false;
                for (int h = 0; h < FAKE_POOL_HOLDERS; h++) {
                        if (s->holders[h].pid && !alive(s->holders[h].pid))
                                s->holders[h] = (fake_holder_t){0};
                        held |= s->holders[h].pid != 0;
                }
                if (!held)
                        slot_free(pool, s);
        }
        for (int i = 0; i < FAKE_POOL_CONTEXTS; i++) {
                fake_ctx_use_t *c = &pool->contexts[i];
                if (c->pid && !alive(c->pid)) {
                        pool->in_use[c->device] -= c->bytes;
                        *c = (fake_ctx_use_t){0};
                }
        }
}

/* Whether `size` more bytes fit device `physical` (sweeping once if not). */
static bool pool_fits(int physical, uint64_t size) {
        fake_pool_t *pool = fake.pool;
        if (size <= pool->capacity[physical] - pool->in_use[physical])
                return true;
        pool_sweep();
        return size <= pool->capacity[physical] - pool->in_use[physical];
}

/* Adds this process as a holder of the allocation `ino`, creating its slot
 * (charged to `physical`) if there is none. Returns the slot or -1. Caller
 * holds the pool lock. */
static int slot_hold(uint64_t ino, uint64_t size, int physical) {
        fake_pool_t *pool = fake.pool;
        int found = -1, empty = -1;
        for (int i = 0; i < FAKE_POOL_SLOTS && found < 0; i++) {
                if (pool->slots[i].ino == ino)
                        found = i;
                else if (!pool->slots[i].ino && empty < 0)
                        empty = i;
        }
        if (found < 0) {
                if (empty < 0)
                        return -1;
                found = empty;
                pool->slots[found] = (fake_slot_t){.ino = ino, .size = size, .device = physical};
                pool->in_use[physical] += size;
                pool->allocations[physical]++;
        }
        fake_slot_t *s = &pool->slots[found];
        int32_t pid = getpid();
        for (int h = 0; h < FAKE_POOL_HOLDERS; h++)
                if (s->holders[h].pid == pid) {
                        s->holders[h].refs++;
                        return found;
                }
        for (int h = 0; h < FAKE_POOL_HOLDERS; h++)
                if (!s->holders[h].pid) {
                        s->holders[h] = (fake_holder_t){.pid = pid, .refs = 1};
                        return found;
                }
        return -1;
}

/* This process lets go of one hold on `slot`. */
static void slot_drop(int slot) {
        pool_lock();
        fake_slot_t *s = &fake.pool->slots[slot];
        bool held = false;
        for (int h = 0; h < FAKE_POOL_HOLDERS; h++) {
                if (s->holders[h].pid == getpid() && --s->holders[h].refs == 0)
                        s->holders[h] = (fake_holder_t){0};
                held |= s->holders[h].pid != 0;
        }
        if (!held)
                slot_free(fake.pool, s);
        pool_unlock();
}

/* ---- bookkeeping ---- */

static bool valid_device(CUdevice dev) {
        return dev >= 0 && dev < fake.device_count;
}

static int physical(CUdevice dev) {
        return fake.physical[dev];
}

static CUcontext current_ctx(void) {
        return depth > 0 && stack[depth - 1] && stack[depth - 1]->refs > 0 ? stack[depth - 1] : NULL;
}

static bool valid_ctx(CUcontext ctx) {
        return ctx >= &fake.ctx[0] && ctx < &fake.ctx[FAKE_MAX_DEVICES] && ctx->refs > 0;
}

static bool special_stream(CUstream s) {
        return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

/* A use of a destroyed stream or event is a bug the real driver does not
 * catch (the handle may be another object by then): fail loudly. */
static void poisoned(const char *what, const void *handle) {
        fprintf(stderr, "fakecuda: use of %s %p after it was destroyed\n", what, handle);
        abort();
}

static struct CUstream_st *stream_new(CUcontext ctx, unsigned flags, bool legacy) {
        struct CUstream_st *s = calloc(1, sizeof(*s));
        if (s)
                *s = (struct CUstream_st){.magic = FAKE_STREAM_MAGIC, .ctx = ctx, .flags = flags, .legacy = legacy};
        return s;
}

/* The calling thread's per-thread default stream of ctx, made on first
 * use (the driver's: each host thread has its own); NULL out of memory. */
static struct CUstream_st *per_thread_stream(CUcontext ctx) {
        for (struct CUstream_st *x = ctx->per_thread; x; x = x->next)
                if (pthread_equal(x->owner, pthread_self()))
                        return x;
        struct CUstream_st *x = stream_new(ctx, 0, false);
        if (!x)
                return NULL;
        x->per_thread = true;
        x->owner = pthread_self();
        x->next = ctx->per_thread;
        ctx->per_thread = x;
        return x;
}

/* The stream a handle names: a special stream is the current context's
 * (made on first use; the per-thread one the calling thread's); NULL for
 * an unknown one or without a context. A destroyed stream aborts. */
static struct CUstream_st *find_stream(CUstream s) {
        if (special_stream(s)) {
                CUcontext ctx = current_ctx();
                if (!ctx)
                        return NULL;
                if (s == CU_STREAM_PER_THREAD)
                        return per_thread_stream(ctx);
                if (!ctx->legacy)
                        ctx->legacy = stream_new(ctx, 0, true);
                return ctx->legacy;
        }
        for (struct CUstream_st *x = fake.streams; x; x = x->next)
                if (x == s)
                        return valid_ctx(x->ctx) ? x : NULL;
        for (struct CUstream_st *x = fake.dead_streams; x; x = x->next)
                if (x == s)
                        poisoned("stream", s);
        return NULL;
}

/* The context a stream belongs to: a special stream is the current
 * context's. NULL for an unknown stream. */
static CUcontext stream_ctx(CUstream s) {
        struct CUstream_st *x = find_stream(s);
        return x ? x->ctx : NULL;
}

static struct CUevent_st *find_event(CUevent e) {
        for (struct CUevent_st *x = fake.events; x; x = x->next)
                if (x == e && x->magic == FAKE_EVENT_MAGIC)
                        return x;
        for (struct CUevent_st *x = fake.dead_events; x; x = x->next)
                if (x == e)
                        poisoned("event", e);
        return NULL;
}

static alloc_t *find_alloc(CUmemGenericAllocationHandle handle) {
        for (alloc_t *a = fake.allocs; a; a = a->next)
                if ((uintptr_t) a == handle && (a->handle_open || a->retains > 0))
                        return a;
        return NULL;
}

/* Frees the allocation here once neither its handle nor a mapping uses it;
 * the device memory goes when no process holds it. */
static void alloc_maybe_free(alloc_t *a) {
        if (a->handle_open || a->retains > 0 || a->mappings > 0)
                return;
        for (alloc_t **p = &fake.allocs; *p; p = &(*p)->next)
                if (*p == a) {
                        *p = a->next;
                        break;
                }
        close(a->fd);
        slot_drop(a->slot);
        free(a);
}

static alloc_t *alloc_new(int fd, size_t size, int slot, bool exportable, bool rdma) {
        alloc_t *a = calloc(1, sizeof(*a));
        if (!a)
                return NULL;
        *a = (alloc_t){.next = fake.allocs,
                       .fd = fd,
                       .size = size,
                       .slot = slot,
                       .handle_open = true,
                       .exportable = exportable,
                       .rdma = rdma};
        fake.allocs = a;
        return a;
}

static range_t *range_add(range_t **list, uintptr_t addr, size_t size, alloc_t *a) {
        range_t *r = calloc(1, sizeof(*r));
        if (!r)
                return NULL;
        *r = (range_t){.next = *list, .addr = addr, .size = size, .alloc = a, .slot = -1};
        *list = r;
        return r;
}

static range_t **range_find(range_t **list, uintptr_t addr) {
        for (; *list; list = &(*list)->next)
                if ((*list)->addr == addr)
                        return list;
        return NULL;
}

static bool overlaps(const range_t *r, uintptr_t addr, size_t size) {
        return r->addr < addr + size && addr < r->addr + r->size;
}

/* Bytes of [addr, +size) covered by mappings; -1 if one sticks out. */
static long long mapped_bytes(uintptr_t addr, size_t size) {
        long long n = 0;
        for (range_t *r = fake.mappings; r; r = r->next) {
                if (!overlaps(r, addr, size))
                        continue;
                if (r->addr < addr || r->addr + r->size > addr + size)
                        return -1;
                n += (long long) r->size;
        }
        return n;
}

static bool inside_reservation(uintptr_t addr, size_t size) {
        for (range_t *r = fake.reservations; r; r = r->next)
                if (addr >= r->addr && addr + size <= r->addr + r->size)
                        return true;
        return false;
}

static bool prop_valid(const CUmemAllocationProp *prop) {
        return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
               prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && valid_device(prop->location.id) &&
               (prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE ||
                prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) &&
               prop->allocFlags.compressionType == 0 && prop->allocFlags.usage == 0;
}

/* Turns [addr, +size) back into reserved, inaccessible, not inherited pages. */
static void reserve_pages(uintptr_t addr, size_t size) {
        mmap((void *) addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        madvise((void *) addr, size, MADV_DONTFORK);
}

static bool events_held(void) {
        return fake.hold_events && access(fake.hold_events, F_OK) == 0;
}

/* Synchronizing waits while FAKECUDA_HOLD_SYNC names an existing file (work
 * that takes long), without holding the driver's lock; it counts as held
 * (fakecuda_usage()'s syncs_held) meanwhile. */
static void wait_sync_hold(void) {
        const char *hold = getenv("FAKECUDA_HOLD_SYNC");
        if (!hold || access(hold, F_OK) != 0)
                return;
        pthread_mutex_lock(&fake.lock);
        fake.syncs_held++;
        pthread_mutex_unlock(&fake.lock);
        while (access(hold, F_OK) == 0)
                nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        pthread_mutex_lock(&fake.lock);
        fake.syncs_held--;
        pthread_mutex_unlock(&fake.lock);
}

/* ---- streams, events and emulated device work ----
 * Every stream has a FIFO of work that its own worker thread runs later, in
 * order (FAKECUDA_SYNC=1 runs it at launch instead); an event is a set of
 * marks (a stream and how much of its work must be done). The legacy stream
 * (NULL, CU_STREAM_LEGACY) is ordered with every blocking stream of its
 * context, both ways; a CU_STREAM_NON_BLOCKING stream with none. The
 * per-thread default stream is one blocking stream per context and host
 * thread, as on the driver (CU_STREAM_PER_THREAD names the caller's). */

static _Thread_local CUstreamCaptureMode thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

/* Every stream of this process (live, destroyed but draining, special),
 * those of `ctx` only when ctx is set; *ret is malloc'ed. */
static size_t streams_of(CUcontext ctx, struct CUstream_st ***ret) {
        size_t n = 0, cap = FAKE_MAX_DEVICES;
        for (int pass = 0; pass < 2; pass++)
                for (struct CUstream_st *x = pass ? fake.dead_streams : fake.streams; x; x = x->next)
                        cap++;
        for (int i = 0; i < FAKE_MAX_DEVICES; i++)
                for (struct CUstream_st *x = fake.ctx[i].per_thread; x; x = x->next)
                        cap++;
        struct CUstream_st **v = calloc(cap, sizeof(*v));
        for (int pass = 0; v && pass < 2; pass++)
                for (struct CUstream_st *x = pass ? fake.dead_streams : fake.streams; x; x = x->next)
                        if (!ctx || x->ctx == ctx)
                                v[n++] = x;
        for (int i = 0; v && i < FAKE_MAX_DEVICES; i++) {
                struct CUctx_st *c = &fake.ctx[i];
                if (ctx && c != ctx)
                        continue;
                if (c->legacy)
                        v[n++] = c->legacy;
                for (struct CUstream_st *x = c->per_thread; x; x = x->next)
                        v[n++] = x;
        }
        *ret = v;
        return v ? n : 0;
}

static bool marks_done(const marks_t *m) {
        for (size_t i = 0; i < m->n; i++)
                if (m->v[i].stream->completed < m->v[i].ticket)
                        return false;
        return true;
}

/* Adds "the work queued on x so far" (nothing when it is done already). */
static void marks_add(marks_t *m, struct CUstream_st *x) {
        if (!x || x->completed == x->enqueued)
                return;
        mark_t *v = realloc(m->v, (m->n + 1) * sizeof(*v));
        if (!v)
                abort(); /* a test process out of memory */
        m->v = v;
        m->v[m->n++] = (mark_t){.stream = x, .ticket = x->enqueued};
}

/* What work queued next on x waits for besides x's own: on the legacy
 * stream, every blocking stream of its context; on a blocking stream, the
 * legacy stream. */
static marks_t marks_ordered_before(struct CUstream_st *x) {
        marks_t m = {0};
        if (x->legacy) {
                struct CUstream_st **v;
                size_t n = streams_of(x->ctx, &v);
                for (size_t i = 0; i < n; i++)
                        if (v[i] != x && !(v[i]->flags & CU_STREAM_NON_BLOCKING))
                                marks_add(&m, v[i]);
                free(v);
        } else if (!(x->flags & CU_STREAM_NON_BLOCKING)) {
                marks_add(&m, x->ctx->legacy);
        }
        return m;
}

/* What a record on, or synchronize of, x waits for: its work so far and what that was ordered after. */
static marks_t marks_of_point(struct CUstream_st *x) {
        marks_t m = marks_ordered_before(x);
        marks_add(&m, x);
        return m;
}

static void wait_marks(marks_t *m) {
        while (!marks_done(m))
                pthread_cond_wait(&fake.changed, &fake.lock);
        free(m->v);
        *m = (marks_t){0};
}

/* ---- emulated kernels over device memory (caller holds the lock) ---- */

/* Where device address `addr` is readable (prot) by a kernel, and how many of
 * *len bytes from there lie in the same mapping; NULL if not mapped so. */
static unsigned char *device_view(uintptr_t addr, size_t *len, int prot) {
        for (range_t *r = fake.mappings; r; r = r->next)
                if (addr >= r->addr && addr - r->addr < r->size) {
                        if ((r->prot & prot) != prot)
                                return NULL;
                        size_t left = r->size - (addr - r->addr);
                        *len = *len < left ? *len : left;
                        return r->view + (addr - r->addr);
                }
        for (range_t *r = fake.blocks; r; r = r->next) /* cuMemAlloc memory: CPU memory here */
                if (addr >= r->addr && addr - r->addr < r->size) {
                        size_t left = r->size - (addr - r->addr);
                        *len = *len < left ? *len : left;
                        return (unsigned char *) addr;
                }
        return NULL;
}

static bool device_accessible(uintptr_t addr, size_t bytes, int prot) {
        while (bytes) {
                size_t len = bytes;
                if (!device_view(addr, &len, prot))
                        return false;
                addr += len;
                bytes -= len;
        }
        return true;
}

/* Copies between device memory and a buffer; false (nothing copied) if the
 * range is not all mapped with the access it needs. */
static bool device_copy(uintptr_t addr, void *buf, size_t bytes, bool to_device) {
        if (!device_accessible(addr, bytes, to_device ? PROT_WRITE : PROT_READ))
                return false;
        for (unsigned char *b = buf; bytes;) {
                size_t len = bytes;
                unsigned char *v = device_view(addr, &len, PROT_NONE);
                memcpy(to_device ? (void *) v : (void *) b, to_device ? (void *) b : (void *) v, len);
                addr += len;
                b += len;
                bytes -= len;
        }
        return true;
}

static uint64_t splitmix(uint64_t *x) {
        uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

/* The bytes of tests/lib/testutil.c's gm_test_fill(). */
static void pattern(unsigned char *buf, size_t n, uint64_t seed) {
        for (size_t i = 0; i < n / 8; i++) {
                uint64_t w = splitmix(&seed);
                memcpy(buf + 8 * i, &w, 8);
        }
        for (size_t i = n & ~(size_t) 7; i < n; i++)
                buf[i] = (uint8_t) seed;
}

/* Runs one memory kernel; false when it touches memory that is not mapped
 * for it (the kernel faults). */
static bool work_run_memory(work_t *w) {
        if (w->kind == WORK_TO_HOST)
                return device_copy(w->src, w->host, w->bytes, false);
        if (w->kind == WORK_FROM_HOST)
                return device_copy(w->dst, w->host, w->bytes, true);
        unsigned char *buf = malloc(w->bytes ? w->bytes : 1), *want = NULL;
        bool ok = buf != NULL;
        switch (w->kind) {
        case WORK_FILL:
                memset(buf, (int) w->value, w->bytes);
                ok = ok && device_copy(w->dst, buf, w->bytes, true);
                break;
        case WORK_PATTERN:
                pattern(buf, w->bytes, w->value);
                ok = ok && device_copy(w->dst, buf, w->bytes, true);
                break;
        case WORK_COPY:
                ok = ok && device_accessible(w->dst, w->bytes, PROT_WRITE) &&
                     device_copy(w->src, buf, w->bytes, false) && device_copy(w->dst, buf, w->bytes, true);
                break;
        case WORK_VERIFY:
        case WORK_VERIFY_PATTERN:
                want = malloc(w->bytes ? w->bytes : 1);
                ok = ok && want && device_copy(w->src, buf, w->bytes, false);
                if (ok && w->kind == WORK_VERIFY)
                        memset(want, (int) w->value, w->bytes);
                else if (ok)
                        pattern(want, w->bytes, w->value);
                if (ok)
                        *(int *) w->host = memcmp(buf, want, w->bytes) == 0;
                break;
        default:
                break;
        }
        free(buf);
        free(want);
        return ok;
}

/* A kernel that faulted: the context is lost (sticky), as on hardware. */
static void work_fault(struct CUstream_st *x, work_t *w, const char *why) {
        fprintf(stderr,
                "fakecuda: kernel %d on stream %p over [%#lx, +%zu) / [%#lx, +%zu) faulted: %s "
                "(CUDA_ERROR_ILLEGAL_ADDRESS from now on)\n",
                (int) w->kind, (void *) x, (unsigned long) w->dst, w->bytes, (unsigned long) w->src, w->bytes, why);
        x->ctx->error = CUDA_ERROR_ILLEGAL_ADDRESS;
        fake.faults++;
}

/* Runs the head of x's queue (lock held; a spin sleeps without it) and
 * retires it. */
static void work_run_head(struct CUstream_st *x) {
        work_t *w = x->head;
        if (w->faulted || x->ctx->error) {
                /* nothing runs in a lost context */
        } else if (w->kind == WORK_SPIN) {
                pthread_mutex_unlock(&fake.lock);
                nanosleep(&(struct timespec){.tv_sec = (time_t) (w->value / 1000),
                                             .tv_nsec = (long) (w->value % 1000) * 1000000},
                          NULL);
                pthread_mutex_lock(&fake.lock);
        } else if (w->kind != WORK_WAIT && !work_run_memory(w)) {
                work_fault(x, w, "its memory is not mapped with access for the device");
        }
        x->head = w->next;
        if (!x->head)
                x->tail = NULL;
        x->completed++;
        free(w->after.v);
        free(w);
        pthread_cond_broadcast(&fake.changed);
}

static void *stream_worker(void *arg) {
        struct CUstream_st *x = arg;
        pthread_mutex_lock(&fake.lock);
        for (;;) {
                while (!x->head || !marks_done(&x->head->after))
                        pthread_cond_wait(&fake.changed, &fake.lock);
                work_run_head(x);
        }
        return NULL;
}

/* Queues w on x after what x's work is ordered after (and also_after, may be
 * NULL); FAKECUDA_SYNC runs it now. */
static CUresult work_queue(struct CUstream_st *x, work_t *w, const marks_t *also_after) {
        w->after = marks_ordered_before(x);
        for (size_t i = 0; also_after && i < also_after->n; i++)
                if (also_after->v[i].stream->completed < also_after->v[i].ticket) {
                        mark_t *v = realloc(w->after.v, (w->after.n + 1) * sizeof(*v));
                        if (!v)
                                abort();
                        w->after.v = v;
                        w->after.v[w->after.n++] = also_after->v[i];
                }
        if (x->tail)
                x->tail->next = w;
        else
                x->head = w;
        x->tail = w;
        x->enqueued++;
        if (fake.sync) {
                wait_marks(&w->after);
                while (x->head)
                        work_run_head(x);
                return CUDA_SUCCESS;
        }
        if (!x->has_worker) {
                pthread_t t;
                pthread_attr_t attr;
                pthread_attr_init(&attr);
                pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
                if (pthread_create(&t, &attr, stream_worker, x) != 0)
                        abort();
                pthread_attr_destroy(&attr);
                x->has_worker = true;
        }
        pthread_cond_broadcast(&fake.changed);
        return CUDA_SUCCESS;
}

/* Unmapping memory that queued or running work touches: that work faults
 * when it runs, and its context is lost. */
static void fault_users(uintptr_t addr, size_t size) {
        struct CUstream_st **v;
        size_t n = streams_of(NULL, &v);
        for (size_t i = 0; i < n; i++)
                for (work_t *w = v[i]->head; w; w = w->next) {
                        bool touches = (w->dst && w->dst < addr + size && addr < w->dst + w->bytes) ||
                                       (w->src && w->src < addr + size && addr < w->src + w->bytes);
                        if (touches && !w->faulted) {
                                w->faulted = true;
                                work_fault(v[i], w, "cuMemUnmap of memory it uses before it completed");
                        }
                }
        free(v);
}

/* ---- graph nodes: the work launched into a capture ---- */

static void graph_nodes_free(work_t *nodes) {
        while (nodes) {
                work_t *next = nodes->next;
                free(nodes);
                nodes = next;
        }
}

/* Appends w (its kernel alone: no ordering marks) to x's open capture. */
static CUresult graph_append(struct CUstream_st *x, work_t *w) {
        w->next = NULL;
        if (x->captured_tail)
                x->captured_tail->next = w;
        else
                x->captured_head = w;
        x->captured_tail = w;
        return CUDA_SUCCESS;
}

/* A copy of the nodes' kernels; NULL (and *ret_ok false) without memory. */
static work_t *graph_nodes_copy(const work_t *nodes, bool *ret_ok) {
        work_t *head = NULL, **tail = &head;
        *ret_ok = true;
        for (const work_t *n = nodes; n; n = n->next) {
                work_t *w = calloc(1, sizeof(*w));
                if (!w) {
                        graph_nodes_free(head);
                        *ret_ok = false;
                        return NULL;
                }
                *w = (work_t){.kind = n->kind,
                              .dst = n->dst,
                              .src = n->src,
                              .bytes = n->bytes,
                              .value = n->value,
                              .host = n->host};
                *tail = w;
                tail = &w->next;
        }
        return head;
}

/* ---- stream capture ---- */

/* Ends the captures that make a potentially unsafe call by this thread
 * illegal (cuThreadExchangeStreamCaptureMode's rules) and says whether there
 * were any: the call then fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED. */
static bool capture_forbids_unsafe(const char *call) {
        if (thread_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
                return false;
        struct CUstream_st **v;
        size_t n = streams_of(NULL, &v);
        bool refused = false;
        for (size_t i = 0; i < n; i++) {
                struct CUstream_st *x = v[i];
                if (x->capture == CU_STREAM_CAPTURE_STATUS_NONE)
                        continue;
                bool mine = pthread_equal(x->capture_thread, pthread_self());
                if ((mine && x->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
                    (!mine && thread_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                     x->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
                        x->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
                        refused = true;
                }
        }
        free(v);
        if (refused) {
                fake.capture_refusals++;
                fprintf(stderr, "fakecuda: %s during a stream capture that forbids it: the capture is invalidated\n",
                        call);
        }
        return refused;
}
#define UNSAFE_DURING_CAPTURE(call)                                   \
        do {                                                          \
                if (capture_forbids_unsafe(call))                     \
                        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; \
        } while (0)

/* Invalidates the captures of ctx's blocking streams when the legacy stream
 * is used (an implicit dependency); whether there were any. */
static bool capture_implicit(struct CUstream_st *x) {
        if (!x->legacy)
                return false;
        struct CUstream_st **v;
        size_t n = streams_of(x->ctx, &v);
        bool any = false;
        for (size_t i = 0; i < n; i++)
                if (v[i]->capture != CU_STREAM_CAPTURE_STATUS_NONE && !(v[i]->flags & CU_STREAM_NON_BLOCKING)) {
                        v[i]->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
                        any = true;
                }
        free(v);
        if (any)
                fake.capture_refusals++;
        return any;
}

/* Whether any stream of ctx (every context when NULL) is capturing; those
 * captures are invalidated when `invalidate`. */
static bool ctx_capturing(CUcontext ctx, bool invalidate) {
        struct CUstream_st **v;
        size_t n = streams_of(ctx, &v);
        bool any = false;
        for (size_t i = 0; i < n; i++)
                if (v[i]->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
                        any = true;
                        if (invalidate)
                                v[i]->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
                }
        free(v);
        if (any && invalidate)
                fake.capture_refusals++;
        return any;
}

/* The capture an event was recorded in, still open; NULL if none. */
static struct CUstream_st *event_capture(const struct CUevent_st *e) {
        if (!e->capture_id)
                return NULL;
        struct CUstream_st **v;
        size_t n = streams_of(NULL, &v), i = 0;
        while (i < n && !(v[i]->capture != CU_STREAM_CAPTURE_STATUS_NONE && v[i]->capture_id == e->capture_id))
                i++;
        struct CUstream_st *x = i < n ? v[i] : NULL;
        free(v);
        return x;
}

#define STICKY(ctx)                          \
        do {                                 \
                if ((ctx) && (ctx)->error)   \
                        return (ctx)->error; \
        } while (0)

static CUresult stream_lookup_error(CUstream stream) {
        return special_stream(stream) ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_HANDLE;
}

CUresult CUDAAPI cuStreamCreate(CUstream *stream, unsigned int flags) {
        LOCKED();
        REQUIRE_INIT();
        CUcontext ctx = current_ctx();
        if (!ctx)
                return CUDA_ERROR_INVALID_CONTEXT;
        STICKY(ctx);
        if (flags & ~(unsigned) CU_STREAM_NON_BLOCKING)
                return CUDA_ERROR_INVALID_VALUE;
        struct CUstream_st *s = stream ? stream_new(ctx, flags, false) : NULL;
        if (!s)
                return CUDA_ERROR_OUT_OF_MEMORY;
        s->next = fake.streams;
        fake.streams = s;
        *stream = s;
        return CUDA_SUCCESS;
}

/* Work queued on a destroyed stream still completes (as on the driver); the
 * handle is poisoned. */
CUresult CUDAAPI cuStreamDestroy(CUstream stream) {
        LOCKED();
        REQUIRE_INIT();
        if (!special_stream(stream))
                (void) find_stream(stream); /* aborts on a second destroy */
        for (struct CUstream_st **p = &fake.streams; *p; p = &(*p)->next)
                if (*p == stream) {
                        *p = stream->next;
                        stream->magic = FAKE_DEAD_MAGIC;
                        stream->capture = CU_STREAM_CAPTURE_STATUS_NONE;
                        stream->next = fake.dead_streams;
                        fake.dead_streams = stream;
                        return CUDA_SUCCESS;
                }
        return CUDA_ERROR_INVALID_HANDLE;
}

CUresult CUDAAPI cuStreamGetCtx(CUstream stream, CUcontext *ctx) {
        LOCKED();
        REQUIRE_INIT();
        CUcontext c = stream_ctx(stream);
        if (!c)
                return stream_lookup_error(stream);
        *ctx = c;
        return CUDA_SUCCESS;
}

/* The stream a synchronize or query waits on, after the checks both make:
 * a lost context, a capturing stream (whose capture is invalidated), the
 * legacy stream under a capture, a call the captures forbid. */
static CUresult stream_to_wait(CUstream stream, const char *call, struct CUstream_st **ret) {
        struct CUstream_st *x = find_stream(stream);
        if (!x)
                return stream_lookup_error(stream);
        STICKY(x->ctx);
        if (x->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
                x->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
                fake.capture_refusals++;
                return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        if (capture_implicit(x))
                return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        UNSAFE_DURING_CAPTURE(call);
        *ret = x;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream stream) {
        {
                LOCKED();
                REQUIRE_INIT();
                struct CUstream_st *x;
                CUresult r = stream_to_wait(stream, "cuStreamSynchronize", &x);
                if (r != CUDA_SUCCESS)
                        return r;
                marks_t m = marks_of_point(x);
                wait_marks(&m);
                STICKY(x->ctx);
        }
        wait_sync_hold(); /* work that takes long, held by a test */
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamQuery(CUstream stream) {
        LOCKED();
        REQUIRE_INIT();
        struct CUstream_st *x;
        CUresult r = stream_to_wait(stream, "cuStreamQuery", &x);
        if (r != CUDA_SUCCESS)
                return r;
        marks_t m = marks_of_point(x);
        bool done = marks_done(&m);
        free(m.v);
        return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult CUDAAPI cuStreamBeginCapture(CUstream stream, CUstreamCaptureMode mode) {
        LOCKED();
        REQUIRE_INIT();
        if (special_stream(stream) && stream != CU_STREAM_PER_THREAD) /* the legacy stream cannot be captured */
                return current_ctx() ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_ERROR_INVALID_CONTEXT;
        struct CUstream_st *x = find_stream(stream);
        if (!x)
                return CUDA_ERROR_INVALID_HANDLE;
        STICKY(x->ctx);
        if (mode > CU_STREAM_CAPTURE_MODE_RELAXED)
                return CUDA_ERROR_INVALID_VALUE;
        if (x->capture != CU_STREAM_CAPTURE_STATUS_NONE)
                return CUDA_ERROR_ILLEGAL_STATE;
        x->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        x->capture_mode = mode;
        x->capture_thread = pthread_self();
        x->capture_id = ++fake.next_capture_id;
        return CUDA_SUCCESS;
}

/* The graph holds the work launched into the capture (see graph_append). */
CUresult CUDAAPI cuStreamEndCapture(CUstream stream, CUgraph *graph) {
        LOCKED();
        REQUIRE_INIT();
        struct CUstream_st *x = special_stream(stream) && stream != CU_STREAM_PER_THREAD ? NULL : find_stream(stream);
        if (!x || !graph)
                return !x ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
        if (x->capture == CU_STREAM_CAPTURE_STATUS_NONE)
                return CUDA_ERROR_ILLEGAL_STATE;
        if (x->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(x->capture_thread, pthread_self()))
                return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
        bool invalidated = x->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED;
        x->capture = CU_STREAM_CAPTURE_STATUS_NONE;
        work_t *nodes = x->captured_head;
        x->captured_head = x->captured_tail = NULL;
        *graph = NULL;
        struct CUgraph_st *g = invalidated ? NULL : calloc(1, sizeof(*g));
        if (!g) {
                graph_nodes_free(nodes);
                return invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_ERROR_OUT_OF_MEMORY;
        }
        g->magic = FAKE_GRAPH_MAGIC;
        g->nodes = nodes;
        *graph = g;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status) {
        LOCKED();
        REQUIRE_INIT();
        struct CUstream_st *x = find_stream(stream);
        if (!x || !status)
                return !x ? stream_lookup_error(stream) : CUDA_ERROR_INVALID_VALUE;
        if (x->legacy) { /* asking about the legacy stream while a blocking stream captures is itself illegal */
                if (ctx_capturing(x->ctx, false))
                        return capture_implicit(x), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        }
        *status = x->capture;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
        if (!mode || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
                return CUDA_ERROR_INVALID_VALUE;
        CUstreamCaptureMode old = thread_capture_mode;
        thread_capture_mode = *mode;
        *mode = old;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphDestroy(CUgraph graph) {
        if (!graph || graph->magic != FAKE_GRAPH_MAGIC)
                return CUDA_ERROR_INVALID_VALUE;
        graph->magic = FAKE_DEAD_MAGIC;
        graph_nodes_free(graph->nodes);
        free(graph);
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventCreate(CUevent *event, unsigned int flags) {
        LOCKED();
        REQUIRE_INIT();
        CUcontext ctx = current_ctx();
        if (!ctx)
                return CUDA_ERROR_INVALID_CONTEXT;
        STICKY(ctx);
        struct CUevent_st *e = event ? calloc(1, sizeof(*e)) : NULL;
        if (!e)
                return CUDA_ERROR_OUT_OF_MEMORY;
        *e = (struct CUevent_st){.magic = FAKE_EVENT_MAGIC, .ctx = ctx, .next = fake.events};
        fake.events = e;
        *event = e;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent event, CUstream stream) {
        LOCKED();
        REQUIRE_INIT();
        struct CUevent_st *e = find_event(event);
        struct CUstream_st *x = find_stream(stream);
        if (!e || !x)
                return !e || !special_stream(stream) ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_CONTEXT;
        /* "hStream and hEvent must be from the same context" */
        if (x->ctx != e->ctx)
                return CUDA_ERROR_INVALID_HANDLE;
        STICKY(x->ctx);
        if (capture_implicit(x))
                return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        free(e->marks.v);
        e->marks = (marks_t){0};
        e->recorded = true;
        e->capture_id = x->capture != CU_STREAM_CAPTURE_STATUS_NONE ? x->capture_id : 0;
        if (!e->capture_id)
                e->marks = marks_of_point(x);
        fake.event_records++;
        return CUDA_SUCCESS;
}

/* Refuses a query of an event recorded in an open capture (in any mode),
 * invalidating that capture. */
static bool event_in_capture(struct CUevent_st *e) {
        struct CUstream_st *x = event_capture(e);
        if (x) {
                x->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
                fake.capture_refusals++;
        }
        return x != NULL;
}

CUresult CUDAAPI cuEventQuery(CUevent event) {
        LOCKED();
        REQUIRE_INIT();
        struct CUevent_st *e = find_event(event);
        if (!e)
                return CUDA_ERROR_INVALID_HANDLE;
        fake.event_queries++;
        STICKY(e->ctx);
        if (event_in_capture(e))
                return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        UNSAFE_DURING_CAPTURE("cuEventQuery");
        if (!e->recorded)
                return CUDA_SUCCESS;
        return events_held() || !marks_done(&e->marks) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventSynchronize(CUevent event) {
        LOCKED();
        REQUIRE_INIT();
        struct CUevent_st *e = find_event(event);
        if (!e)
                return CUDA_ERROR_INVALID_HANDLE;
        STICKY(e->ctx);
        if (event_in_capture(e))
                return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        UNSAFE_DURING_CAPTURE("cuEventSynchronize");
        while (e->recorded && (events_held() || !marks_done(&e->marks))) {
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_nsec += 1000000;
                if (until.tv_nsec >= 1000000000) {
                        until.tv_sec++;
                        until.tv_nsec -= 1000000000;
                }
                pthread_cond_timedwait(&fake.changed, &fake.lock, &until); /* the hold file is polled */
                if (e->magic != FAKE_EVENT_MAGIC)
                        poisoned("event", e); /* destroyed while another thread waits on it */
        }
        STICKY(e->ctx);
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
        LOCKED();
        REQUIRE_INIT();
        struct CUevent_st *e = find_event(event);
        struct CUstream_st *x = find_stream(stream);
        if (!e || !x || flags != 0)
                return !e || !x ? stream_lookup_error(stream) : CUDA_ERROR_INVALID_VALUE;
        STICKY(x->ctx);
        if (x->capture != CU_STREAM_CAPTURE_STATUS_NONE || event_capture(e))
                return CUDA_SUCCESS; /* a captured dependency: nothing runs now */
        if (capture_implicit(x))
                return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        work_t *w = calloc(1, sizeof(*w));
        if (!w)
                return CUDA_ERROR_OUT_OF_MEMORY;
        w->kind = WORK_WAIT;
        return work_queue(x, w, &e->marks);
}

CUresult CUDAAPI cuEventDestroy(CUevent event) {
        LOCKED();
        REQUIRE_INIT();
        (void) find_event(event); /* aborts on a second destroy */
        for (struct CUevent_st **p = &fake.events; *p; p = &(*p)->next)
                if (*p == event) {
                        *p = event->next;
                        event->magic = FAKE_DEAD_MAGIC;
                        event->next = fake.dead_events;
                        fake.dead_events = event;
                        return CUDA_SUCCESS;
                }
        return CUDA_ERROR_INVALID_HANDLE;
}

/* ---- graphs: captured work replayed ---- */

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
        LOCKED();
        REQUIRE_INIT();
        if (!exec || !graph || graph->magic != FAKE_GRAPH_MAGIC || flags != 0)
                return CUDA_ERROR_INVALID_VALUE;
        struct CUgraphExec_st *e = calloc(1, sizeof(*e));
        bool ok = e != NULL;
        work_t *nodes = ok ? graph_nodes_copy(graph->nodes, &ok) : NULL;
        if (!ok) {
                free(e);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *e = (struct CUgraphExec_st){.magic = FAKE_GRAPH_EXEC_MAGIC, .nodes = nodes};
        *exec = e;
        return CUDA_SUCCESS;
}

/* Queues the graph's kernels on `stream`, in order, after its work so far
 * (or, into a capture of that stream, as its nodes). */
CUresult CUDAAPI cuGraphLaunch(CUgraphExec exec, CUstream stream) {
        LOCKED();
        REQUIRE_INIT();
        if (!exec || exec->magic != FAKE_GRAPH_EXEC_MAGIC) {
                fprintf(stderr, "fakecuda: cuGraphLaunch of a destroyed or unknown graph exec %p\n", (void *) exec);
                abort();
        }
        struct CUstream_st *x = find_stream(stream);
        if (!x)
                return stream_lookup_error(stream);
        STICKY(x->ctx);
        if (x->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
                return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        if (capture_implicit(x))
                return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        bool ok;
        work_t *w = graph_nodes_copy(exec->nodes, &ok);
        if (!ok)
                return CUDA_ERROR_OUT_OF_MEMORY;
        while (w) {
                work_t *next = w->next;
                w->next = NULL;
                CUresult r =
                        x->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE ? graph_append(x, w) : work_queue(x, w, NULL);
                if (r != CUDA_SUCCESS) {
                        graph_nodes_free(next);
                        return r;
                }
                w = next;
        }
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec exec) {
        LOCKED();
        if (!exec || exec->magic != FAKE_GRAPH_EXEC_MAGIC)
                return CUDA_ERROR_INVALID_VALUE;
        exec->magic = FAKE_DEAD_MAGIC; /* poisoned, never freed: a later launch aborts */
        graph_nodes_free(exec->nodes);
        exec->nodes = NULL;
        exec->next = fake.dead_graph_execs;
        fake.dead_graph_execs = exec;
        return CUDA_SUCCESS;
}

/* ---- what tests launch (fakecuda.h) ---- */

static int launch(void *stream, work_kind_t kind, uint64_t dst, uint64_t src, size_t bytes, uint64_t value,
                  void *host) {
        LOCKED();
        REQUIRE_INIT();
        struct CUstream_st *x = find_stream((CUstream) stream);
        if (!x)
                return stream_lookup_error((CUstream) stream);
        STICKY(x->ctx);
        if (x->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
                return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        if (capture_implicit(x))
                return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        work_t *w = calloc(1, sizeof(*w));
        if (!w)
                return CUDA_ERROR_OUT_OF_MEMORY;
        *w = (work_t){.kind = kind, .dst = dst, .src = src, .bytes = bytes, .value = value, .host = host};
        if (x->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE)
                return graph_append(x, w); /* a node of the graph: it runs at each replay */
        return work_queue(x, w, NULL);
}

int fakecuda_launch_fill(void *stream, uint64_t dst, size_t bytes, unsigned char value) {
        return launch(stream, WORK_FILL, dst, 0, bytes, value, NULL);
}

int fakecuda_launch_verify(void *stream, uint64_t src, size_t bytes, unsigned char value, int *ret_ok) {
        return launch(stream, WORK_VERIFY, 0, src, bytes, value, ret_ok);
}

int fakecuda_launch_pattern(void *stream, uint64_t dst, size_t bytes, uint64_t seed) {
        return launch(stream, WORK_PATTERN, dst, 0, bytes, seed, NULL);
}

int fakecuda_launch_verify_pattern(void *stream, uint64_t src, size_t bytes, uint64_t seed, int *ret_ok) {
        return launch(stream, WORK_VERIFY_PATTERN, 0, src, bytes, seed, ret_ok);
}

int fakecuda_launch_copy(void *stream, uint64_t dst, uint64_t src, size_t bytes) {
        return launch(stream, WORK_COPY, dst, src, bytes, 0, NULL);
}

int fakecuda_launch_to_host(void *stream, void *dst, uint64_t src, size_t bytes) {
        return launch(stream, WORK_TO_HOST, 0, src, bytes, 0, dst);
}

int fakecuda_launch_from_host(void *stream, uint64_t dst, const void *src, size_t bytes) {
        return launch(stream, WORK_FROM_HOST, dst, 0, bytes, 0, (void *) src);
}

int fakecuda_launch_spin(void *stream, unsigned ms) {
        return launch(stream, WORK_SPIN, 0, 0, 0, ms, NULL);
}

/* The context that runs work on memory at `addr` synchronously: the active
 * primary context of the mapping's device; NULL if none is active. */
static CUcontext context_of(uint64_t addr) {
        for (range_t *r = fake.mappings; r; r = r->next)
                if (addr >= r->addr && addr - r->addr < r->size)
                        for (int d = 0; d < fake.device_count; d++)
                                if (physical(d) == fake.pool->slots[r->alloc->slot].device && fake.ctx[d].refs > 0)
                                        return &fake.ctx[d];
        return NULL;
}

/* Queues `w` on ctx's legacy stream (made on first use) and waits for it;
 * the context's sticky error, if any, after. Caller holds the lock. */
static CUresult legacy_run_wait(CUcontext ctx, work_t *w) {
        if (!ctx->legacy && !(ctx->legacy = stream_new(ctx, 0, true))) {
                free(w);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        work_queue(ctx->legacy, w, NULL);
        marks_t m = marks_of_point(ctx->legacy);
        wait_marks(&m);
        return ctx->error ? ctx->error : CUDA_SUCCESS;
}

/* A kernel run on the legacy stream of the memory's device and waited for
 * (cudaMemset's way); without an active context it runs here and now. */
static int run_sync(work_kind_t kind, uint64_t addr, size_t bytes, uint64_t value, int *ok) {
        LOCKED();
        REQUIRE_INIT();
        CUcontext ctx = context_of(addr);
        work_t *w = calloc(1, sizeof(*w));
        if (!w)
                return CUDA_ERROR_OUT_OF_MEMORY;
        bool write = kind == WORK_PATTERN;
        *w = (work_t){.kind = kind,
                      .dst = write ? addr : 0,
                      .src = write ? 0 : addr,
                      .bytes = bytes,
                      .value = value,
                      .host = ok};
        if (!ctx) {
                bool ran = work_run_memory(w);
                free(w);
                return ran ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        STICKY(ctx);
        return legacy_run_wait(ctx, w);
}

/* Whether [p, +bytes) lies in one cuMemHostAlloc block. */
static bool host_pinned(const void *p, size_t bytes) {
        uintptr_t a = (uintptr_t) p;
        for (range_t *r = fake.host_blocks; r; r = r->next)
                if (a >= r->addr && a - r->addr <= r->size && bytes <= r->size - (a - r->addr))
                        return true;
        return false;
}

/* cuMemcpyDtoH/HtoD: synchronous copies on the current context's legacy
 * stream, after the work queued there (and the blocking streams it is
 * ordered with); device memory that is not mapped with the access the copy
 * needs (PROT_NONE after cuMemUnmap, no cuMemSetAccess) makes it fault. */
static CUresult memcpy_sync(work_kind_t kind, uint64_t device, void *host, size_t bytes) {
        LOCKED();
        REQUIRE_INIT();
        CUcontext ctx = current_ctx();
        if (!ctx)
                return CUDA_ERROR_INVALID_CONTEXT;
        STICKY(ctx);
        UNSAFE_DURING_CAPTURE(kind == WORK_TO_HOST ? "cuMemcpyDtoH" : "cuMemcpyHtoD");
        work_t *w = calloc(1, sizeof(*w));
        if (!w)
                return CUDA_ERROR_OUT_OF_MEMORY;
        bool to_host = kind == WORK_TO_HOST;
        if (host_pinned(host, bytes))
                fake.pinned_copy_bytes += bytes;
        *w = (work_t){
                .kind = kind, .dst = to_host ? 0 : device, .src = to_host ? device : 0, .bytes = bytes, .host = host};
        return legacy_run_wait(ctx, w);
}

CUresult CUDAAPI cuMemcpyDtoH(void *dst_host, CUdeviceptr src_device, size_t bytes) {
        return memcpy_sync(WORK_TO_HOST, src_device, dst_host, bytes);
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst_device, const void *src_host, size_t bytes) {
        return memcpy_sync(WORK_FROM_HOST, dst_device, (void *) src_host, bytes);
}

int fakecuda_device_pattern(uint64_t dst, size_t bytes, uint64_t seed) {
        return run_sync(WORK_PATTERN, dst, bytes, seed, NULL);
}

int fakecuda_device_verify_pattern(uint64_t src, size_t bytes, uint64_t seed, int *ret_ok) {
        return run_sync(WORK_VERIFY_PATTERN, src, bytes, seed, ret_ok);
}

int fakecuda_device_verify(uint64_t src, size_t bytes, unsigned char value, int *ret_ok) {
        return run_sync(WORK_VERIFY, src, bytes, value, ret_ok);
}

bool fakecuda_is_device_pointer(const void *p) {
        LOCKED();
        size_t len = 1;
        return fake.initialized && device_view((uintptr_t) p, &len, PROT_NONE) != NULL;
}

/* ---- initialization, errors, devices ---- */

/* A fork() while a stream's worker holds the lock must not leave the child's
 * copy locked (the child is refused every call, but must get to say so). */
static void fork_prepare(void) {
        pthread_mutex_lock(&fake.lock);
}
static void fork_parent(void) {
        pthread_mutex_unlock(&fake.lock);
}
static void fork_child(void) {
        pthread_mutex_init(&fake.lock, NULL);
        pthread_cond_init(&fake.changed, NULL);
}
__attribute__((constructor)) static void fake_atfork(void) {
        pthread_atfork(fork_prepare, fork_parent, fork_child);
}

CUresult CUDAAPI cuInit(unsigned int flags) {
        LOCKED();
        if (flags != 0)
                return CUDA_ERROR_INVALID_VALUE;
        if (fake.initialized)
                return fake.init_pid == getpid() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
        if (!configure())
                return CUDA_ERROR_INVALID_VALUE;
        if (fake.device_count == 0)
                return CUDA_ERROR_NO_DEVICE;
        fake.init_pid = getpid();
        fake.initialized = true;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int *version) {
        if (!version)
                return CUDA_ERROR_INVALID_VALUE;
        *version = FAKE_DRIVER_VERSION;
        return CUDA_SUCCESS;
}

static CUresult error_lookup(CUresult error, bool name, const char **str) {
        for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
                if (errors[i].code == error) {
                        *str = name ? errors[i].name : errors[i].text;
                        return CUDA_SUCCESS;
                }
        *str = NULL;
        return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **str) {
        return error_lookup(error, true, str);
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **str) {
        return error_lookup(error, false, str);
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
        LOCKED();
        REQUIRE_INIT();
        *count = fake.device_count;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
        LOCKED();
        REQUIRE_INIT();
        if (!valid_device(ordinal))
                return CUDA_ERROR_INVALID_DEVICE;
        *device = ordinal;
        return CUDA_SUCCESS;
}

/* cuda.h names this cuDeviceGetUuid_v2; the 9.2 entry point has the same
 * signature. */
CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
        LOCKED();
        REQUIRE_INIT();
        if (!valid_device(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        memset(uuid->bytes, 0, sizeof(uuid->bytes));
        memcpy(uuid->bytes, fake.uuid_prefix, fake.uuid_prefix_len);
        uuid->bytes[15] = (char) physical(dev);
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
        LOCKED();
        REQUIRE_INIT();
        if (!valid_device(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        *bytes = fake.pool->capacity[physical(dev)];
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
        LOCKED();
        REQUIRE_INIT();
        if (!valid_device(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        if (!pi)
                return CUDA_ERROR_INVALID_VALUE;
        switch (attrib) {
        case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
                *pi = !fake.no_vmm;
                return CUDA_SUCCESS;
        case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
                *pi = !fake.no_vmm && !fake.no_posix_fd;
                return CUDA_SUCCESS;
        case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
                *pi = !fake.no_vmm && !fake.no_rdma;
                return CUDA_SUCCESS;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
                *pi = (int) fake.pool->compute_mode;
                return CUDA_SUCCESS;
        default:
                return CUDA_ERROR_INVALID_VALUE; /* not emulated: a caller must not depend on it */
        }
}

/* ---- contexts ---- */

/* Makes device `dev`'s primary context active in this process: charged to
 * the device, refused under compute modes that forbid it. */
static CUresult ctx_activate(CUdevice dev) {
        fake_pool_t *pool = fake.pool;
        int phys = physical(dev);
        CUresult r = CUDA_SUCCESS;
        pool_lock();
        if (pool->compute_mode == CU_COMPUTEMODE_PROHIBITED) {
                r = CUDA_ERROR_DEVICE_UNAVAILABLE;
                goto out;
        }
        pool_sweep();
        int empty = -1;
        for (int i = 0; i < FAKE_POOL_CONTEXTS; i++) {
                fake_ctx_use_t *c = &pool->contexts[i];
                if (!c->pid && empty < 0)
                        empty = i;
                if (c->pid && c->pid != getpid() && c->device == phys &&
                    pool->compute_mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS) {
                        r = CUDA_ERROR_DEVICE_UNAVAILABLE;
                        goto out;
                }
        }
        if (empty < 0 || !pool_fits(phys, fake.context_bytes)) {
                r = CUDA_ERROR_OUT_OF_MEMORY;
                goto out;
        }
        pool->contexts[empty] = (fake_ctx_use_t){.pid = getpid(), .device = phys, .bytes = fake.context_bytes};
        pool->in_use[phys] += fake.context_bytes;
out:
        pool_unlock();
        return r;
}

static void ctx_deactivate(CUdevice dev) {
        fake_pool_t *pool = fake.pool;
        pool_lock();
        for (int i = 0; i < FAKE_POOL_CONTEXTS; i++) {
                fake_ctx_use_t *c = &pool->contexts[i];
                if (c->pid == getpid() && c->device == physical(dev)) {
                        pool->in_use[c->device] -= c->bytes;
                        *c = (fake_ctx_use_t){0};
                        break;
                }
        }
        pool_unlock();
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
        LOCKED();
        REQUIRE_INIT();
        if (!valid_device(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        if (fake.ctx[dev].refs == 0) {
                CUresult r = ctx_activate(dev);
                if (r != CUDA_SUCCESS)
                        return r;
                fake.ctx[dev].error = CUDA_SUCCESS; /* a new context: an old one's loss is not its own */
        }
        fake.ctx[dev].refs++;
        *ctx = &fake.ctx[dev];
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
        LOCKED();
        REQUIRE_INIT();
        if (!valid_device(dev))
                return CUDA_ERROR_INVALID_DEVICE;
        if (fake.ctx[dev].refs == 0)
                return CUDA_ERROR_INVALID_CONTEXT;
        if (--fake.ctx[dev].refs == 0)
                ctx_deactivate(dev);
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
        LOCKED();
        REQUIRE_INIT();
        if (ctx && !valid_ctx(ctx))
                return CUDA_ERROR_INVALID_CONTEXT;
        if (!ctx) {
                if (depth > 0)
                        depth--;
        } else if (depth == 0) {
                stack[depth++] = ctx;
        } else {
                stack[depth - 1] = ctx;
        }
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *ctx) {
        LOCKED();
        REQUIRE_INIT();
        if (!ctx)
                return CUDA_ERROR_INVALID_VALUE;
        *ctx = depth > 0 ? stack[depth - 1] : NULL;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) {
        LOCKED();
        REQUIRE_INIT();
        if (!valid_ctx(ctx))
                return CUDA_ERROR_INVALID_CONTEXT;
        if (depth == FAKE_STACK_MAX)
                return CUDA_ERROR_OUT_OF_MEMORY;
        stack[depth++] = ctx;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *ctx) {
        LOCKED();
        REQUIRE_INIT();
        if (depth == 0)
                return CUDA_ERROR_INVALID_CONTEXT;
        depth--;
        if (ctx)
                *ctx = stack[depth];
        return CUDA_SUCCESS;
}

/* Waits for every stream of the context, non-blocking ones included. */
static CUresult ctx_synchronize(CUcontext ctx) {
        LOCKED();
        REQUIRE_INIT();
        if (!valid_ctx(ctx))
                return CUDA_ERROR_INVALID_CONTEXT;
        STICKY(ctx);
        if (ctx_capturing(ctx, true))
                return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        UNSAFE_DURING_CAPTURE("cuCtxSynchronize");
        struct CUstream_st **v;
        size_t n = streams_of(ctx, &v);
        marks_t m = {0};
        for (size_t i = 0; i < n; i++)
                marks_add(&m, v[i]);
        free(v);
        wait_marks(&m);
        STICKY(ctx);
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize(void) {
        CUresult r = ctx_synchronize(current_ctx());
        if (r == CUDA_SUCCESS)
                wait_sync_hold();
        return r;
}

CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
        CUresult r = ctx_synchronize(ctx);
        if (r == CUDA_SUCCESS)
                wait_sync_hold();
        return r;
}

CUresult CUDAAPI cuMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
        LOCKED();
        REQUIRE_INIT();
        CUcontext ctx = current_ctx();
        if (!ctx)
                return CUDA_ERROR_INVALID_CONTEXT;
        int phys = physical(ctx->device);
        pool_lock();
        pool_sweep();
        *free_bytes = fake.pool->capacity[phys] - fake.pool->in_use[phys];
        *total_bytes = fake.pool->capacity[phys];
        pool_unlock();
        return CUDA_SUCCESS;
}

/* ---- virtual memory management ---- */

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option) {
        LOCKED();
        REQUIRE_INIT();
        if (!granularity || !prop_valid(prop))
                return CUDA_ERROR_INVALID_VALUE;
        *granularity = fake.granularity;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags) {
        LOCKED();
        REQUIRE_INIT();
        if (!handle || !prop_valid(prop) || flags != 0 || size == 0 || size % fake.granularity != 0)
                return CUDA_ERROR_INVALID_VALUE;
        bool exportable = prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        if (fake.no_vmm || (exportable && fake.no_posix_fd))
                return CUDA_ERROR_NOT_SUPPORTED;
        if (prop->allocFlags.gpuDirectRDMACapable && fake.no_rdma)
                return CUDA_ERROR_INVALID_VALUE;
        if (++fake.creates == fake.fail_create_at)
                return fake.fail_create_error;
        int phys = physical(prop->location.id);
        char name[32];
        snprintf(name, sizeof(name), "fakecuda-dev%d", phys);
        int fd = memfd_create(name, MFD_CLOEXEC);
        struct stat st;
        if (fd < 0 || ftruncate(fd, (off_t) size) < 0 || fstat(fd, &st) < 0) {
                if (fd >= 0)
                        close(fd);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        pool_lock();
        int slot = pool_fits(phys, size) ? slot_hold((uint64_t) st.st_ino, size, phys) : -1;
        pool_unlock();
        alloc_t *a = slot >= 0 ? alloc_new(fd, size, slot, exportable, prop->allocFlags.gpuDirectRDMACapable) : NULL;
        if (!a) {
                if (slot >= 0)
                        slot_drop(slot);
                close(fd);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *handle = (uintptr_t) a;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
        LOCKED();
        REQUIRE_INIT();
        alloc_t *a = find_alloc(handle);
        if (!a)
                return CUDA_ERROR_INVALID_VALUE;
        if (a->retains > 0)
                a->retains--;
        else
                a->handle_open = false;
        alloc_maybe_free(a);
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType type, unsigned long long flags) {
        LOCKED();
        REQUIRE_INIT();
        alloc_t *a = find_alloc(handle);
        if (!shareable || !a || flags != 0 || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !a->exportable)
                return CUDA_ERROR_INVALID_VALUE;
        /* Deliberately without CLOEXEC: the real driver promises none. */
        int fd = dup(a->fd);
        if (fd < 0)
                return CUDA_ERROR_OUT_OF_MEMORY;
        *(int *) shareable = fd;
        return CUDA_SUCCESS;
}

/* The physical device of an exported allocation; -1 if `fd` is none. */
static int exported_device(int fd) {
        char path[64], target[128];
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        if (n <= 0)
                return -1;
        target[n] = '\0';
        int dev;
        if (sscanf(target, "/memfd:fakecuda-dev%d", &dev) != 1 || dev < 0 || dev >= FAKE_MAX_DEVICES)
                return -1;
        return dev;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                                CUmemAllocationHandleType type) {
        LOCKED();
        REQUIRE_INIT();
        if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
                return CUDA_ERROR_INVALID_VALUE;
        if (++fake.imports == fake.fail_import_at)
                return fake.fail_import_error;
        int fd = (int) (intptr_t) os_handle;
        struct stat st;
        int phys = exported_device(fd);
        if (phys < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
            (uint64_t) st.st_size % fake.granularity != 0)
                return CUDA_ERROR_INVALID_HANDLE;
        int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (own < 0)
                return CUDA_ERROR_OUT_OF_MEMORY;
        pool_lock();
        int slot = slot_hold((uint64_t) st.st_ino, (uint64_t) st.st_size, phys); /* it exists: no capacity check */
        pool_unlock();
        alloc_t *a = slot >= 0 ? alloc_new(own, (size_t) st.st_size, slot, true, false) : NULL;
        if (!a) {
                if (slot >= 0)
                        slot_drop(slot);
                close(own);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *handle = (uintptr_t) a;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
        LOCKED();
        REQUIRE_INIT();
        if (alignment == 0)
                alignment = fake.granularity;
        if (!ptr || size == 0 || size % fake.granularity != 0 || alignment % fake.granularity != 0)
                return CUDA_ERROR_INVALID_VALUE;
        size_t span = size + alignment;
        char *raw = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw == MAP_FAILED)
                return CUDA_ERROR_OUT_OF_MEMORY;
        uintptr_t start = ((uintptr_t) raw + alignment - 1) / alignment * alignment;
        if (start > (uintptr_t) raw)
                munmap(raw, start - (uintptr_t) raw);
        munmap((void *) (start + size), (uintptr_t) raw + span - (start + size));
        madvise((void *) start, size, MADV_DONTFORK);
        if (!range_add(&fake.reservations, start, size, NULL)) {
                munmap((void *) start, size);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *ptr = start;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
        LOCKED();
        REQUIRE_INIT();
        range_t **p = range_find(&fake.reservations, ptr);
        if (!p || (*p)->size != size || mapped_bytes(ptr, size) != 0)
                return CUDA_ERROR_INVALID_VALUE;
        range_t *r = *p;
        *p = r->next;
        munmap((void *) r->addr, r->size);
        free(r);
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
        LOCKED();
        REQUIRE_INIT();
        if (++fake.maps == fake.fail_map_at)
                return fake.fail_map_error;
        STICKY(current_ctx());
        UNSAFE_DURING_CAPTURE("cuMemMap");
        alloc_t *a = find_alloc(handle);
        /* Address, size and offset in granules, the range inside the allocation. */
        if (!a || flags != 0 || size == 0 || size % fake.granularity != 0 || ptr % fake.granularity != 0 ||
            offset % fake.granularity != 0 || offset > a->size || size > a->size - offset ||
            !inside_reservation(ptr, size) || mapped_bytes(ptr, size) != 0)
                return CUDA_ERROR_INVALID_VALUE;
        void *view = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, (off_t) offset);
        if (view == MAP_FAILED)
                return CUDA_ERROR_OUT_OF_MEMORY;
        madvise(view, size, MADV_DONTFORK);
        if (mmap((void *) ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, (off_t) offset) == MAP_FAILED) {
                munmap(view, size);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        madvise((void *) ptr, size, MADV_DONTFORK);
        range_t *r = range_add(&fake.mappings, ptr, size, a);
        if (!r) {
                munmap(view, size);
                reserve_pages(ptr, size);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        r->view = view;
        a->mappings++;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
        LOCKED();
        REQUIRE_INIT();
        STICKY(current_ctx());
        UNSAFE_DURING_CAPTURE("cuMemSetAccess");
        if (!desc || count == 0 || size == 0 || mapped_bytes(ptr, size) != (long long) size)
                return CUDA_ERROR_INVALID_VALUE;
        int prot = PROT_NONE;
        for (size_t i = 0; i < count; i++) {
                if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(desc[i].location.id))
                        return CUDA_ERROR_INVALID_DEVICE;
                /* No peer access is emulated: only the memory's own device. */
                for (range_t *r = fake.mappings; r; r = r->next)
                        if (overlaps(r, ptr, size) &&
                            fake.pool->slots[r->alloc->slot].device != physical(desc[i].location.id))
                                return CUDA_ERROR_INVALID_DEVICE;
                if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ)
                        prot |= PROT_READ;
                else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                        prot |= PROT_READ | PROT_WRITE;
                else if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE)
                        return CUDA_ERROR_INVALID_VALUE;
        }
        /* The device's access; the CPU's only in synchronous mode. */
        if (fake.sync && mprotect((void *) ptr, size, prot) < 0)
                return CUDA_ERROR_INVALID_VALUE;
        for (range_t *r = fake.mappings; r; r = r->next)
                if (overlaps(r, ptr, size))
                        r->prot = prot;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
        LOCKED();
        REQUIRE_INIT();
        UNSAFE_DURING_CAPTURE("cuMemUnmap");
        if (++fake.unmaps == fake.fail_unmap_at)
                return fake.fail_unmap_error;
        /* Exactly one mapped range, as cuMemMap made it. */
        range_t **p = range_find(&fake.mappings, ptr);
        if (!p || (*p)->size != size)
                return CUDA_ERROR_INVALID_VALUE;
        range_t *r = *p;
        fault_users(r->addr, r->size);
        munmap(r->view, r->size);
        reserve_pages(r->addr, r->size);
        *p = r->next;
        r->alloc->mappings--;
        alloc_maybe_free(r->alloc);
        free(r);
        return CUDA_SUCCESS;
}

/* The handle of the mapping that holds `addr`, once more (released with
 * cuMemRelease like any other). */
CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
        LOCKED();
        REQUIRE_INIT();
        for (range_t *r = fake.mappings; handle && r; r = r->next)
                if ((uintptr_t) addr >= r->addr && (uintptr_t) addr - r->addr < r->size) {
                        r->alloc->retains++;
                        *handle = (uintptr_t) r->alloc;
                        return CUDA_SUCCESS;
                }
        return CUDA_ERROR_INVALID_VALUE;
}

/* ---- classic allocation (what the GPU check compares against) ---- */

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t size) {
        LOCKED();
        REQUIRE_INIT();
        CUcontext ctx = current_ctx();
        if (!ctx)
                return CUDA_ERROR_INVALID_CONTEXT;
        if (!dptr || size == 0)
                return CUDA_ERROR_INVALID_VALUE;
        STICKY(ctx);
        UNSAFE_DURING_CAPTURE("cuMemAlloc");
        int phys = physical(ctx->device);
        /* A block is a pool slot of its own, named outside the inode space. */
        uint64_t id = (1ull << 63) | ((uint64_t) getpid() << 32) | ++fake.next_block_id;
        pool_lock();
        int slot = pool_fits(phys, size) ? slot_hold(id, size, phys) : -1;
        pool_unlock();
        if (slot < 0)
                return CUDA_ERROR_OUT_OF_MEMORY;
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        range_t *r = p == MAP_FAILED ? NULL : range_add(&fake.blocks, (uintptr_t) p, size, NULL);
        if (!r) {
                if (p != MAP_FAILED)
                        munmap(p, size);
                slot_drop(slot);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        r->slot = slot;
        *dptr = (uintptr_t) p;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) {
        LOCKED();
        REQUIRE_INIT();
        UNSAFE_DURING_CAPTURE("cuMemFree");
        range_t **p = range_find(&fake.blocks, dptr);
        if (!p)
                return CUDA_ERROR_INVALID_VALUE;
        range_t *r = *p;
        fault_users(r->addr, r->size);
        *p = r->next;
        munmap((void *) r->addr, r->size);
        slot_drop(r->slot);
        free(r);
        return CUDA_SUCCESS;
}

/* ---- page-locked host memory ---- */

/* The error FAKECUDA_FAIL_HOST_ALLOC names (CUDA_SUCCESS when unset): read
 * at every call, so one process can switch it between sleeps. */
static CUresult host_alloc_failure(void) {
        const char *s = getenv("FAKECUDA_FAIL_HOST_ALLOC");
        CUresult r = CUDA_SUCCESS;
        if (s && *s && !env_error("FAKECUDA_FAIL_HOST_ALLOC", &r))
                r = CUDA_ERROR_OUT_OF_MEMORY;
        return r;
}

/* Page-locked host memory: populated anonymous memory (the driver pins it
 * itself, outside RLIMIT_MEMLOCK), any current context (PORTABLE or not, the
 * emulator has one address space), counted until cuMemFreeHost. */
CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
        LOCKED();
        REQUIRE_INIT();
        CUcontext ctx = current_ctx();
        if (!ctx)
                return CUDA_ERROR_INVALID_CONTEXT;
        if (!pp || bytesize == 0 ||
            (Flags &
             ~(unsigned) (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)))
                return CUDA_ERROR_INVALID_VALUE;
        STICKY(ctx);
        UNSAFE_DURING_CAPTURE("cuMemHostAlloc");
        fake.host_alloc_calls++;
        CUresult fail = host_alloc_failure();
        if (fail != CUDA_SUCCESS)
                return fail;
        void *p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        range_t *r = p == MAP_FAILED ? NULL : range_add(&fake.host_blocks, (uintptr_t) p, bytesize, NULL);
        if (!r) {
                if (p != MAP_FAILED)
                        munmap(p, bytesize);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *pp = p;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFreeHost(void *p) {
        LOCKED();
        REQUIRE_INIT();
        UNSAFE_DURING_CAPTURE("cuMemFreeHost");
        range_t **at = range_find(&fake.host_blocks, (uintptr_t) p);
        if (!at)
                return CUDA_ERROR_INVALID_VALUE;
        range_t *r = *at;
        *at = r->next;
        munmap((void *) r->addr, r->size);
        free(r);
        return CUDA_SUCCESS;
}

/* ---- what tests ask (fakecuda.h) ---- */

static long count_ranges(const range_t *r) {
        long n = 0;
        for (; r; r = r->next)
                n++;
        return n;
}

int fakecuda_usage(fakecuda_usage_t *ret) {
        LOCKED();
        if (!fake.initialized || fake.init_pid != getpid())
                return -1;
        fakecuda_usage_t u = {
                .stack_depth = depth, .event_queries = fake.event_queries, .event_records = fake.event_records};
        for (alloc_t *a = fake.allocs; a; a = a->next)
                if (a->handle_open || a->retains > 0) {
                        u.handles++;
                        u.rdma_handles += a->rdma;
                }
        u.mappings = count_ranges(fake.mappings);
        u.reservations = count_ranges(fake.reservations);
        u.blocks = count_ranges(fake.blocks);
        u.host_allocations = count_ranges(fake.host_blocks);
        for (range_t *r = fake.host_blocks; r; r = r->next)
                u.host_bytes += r->size;
        u.host_alloc_calls = fake.host_alloc_calls;
        u.pinned_copy_bytes = fake.pinned_copy_bytes;
        u.faults = fake.faults;
        u.capture_refusals = fake.capture_refusals;
        u.syncs_held = fake.syncs_held;
        for (struct CUstream_st *s = fake.streams; s; s = s->next)
                u.streams++;
        for (struct CUevent_st *e = fake.events; e; e = e->next)
                u.events++;
        for (int i = 0; i < FAKE_MAX_DEVICES; i++)
                u.contexts += fake.ctx[i].refs;
        *ret = u;
        return 0;
}

int fakecuda_device_usage(int device, uint64_t *ret_bytes, uint64_t *ret_allocations) {
        LOCKED();
        if (!fake.initialized || device < 0 || device >= FAKE_MAX_DEVICES)
                return -1;
        pool_lock();
        pool_sweep();
        *ret_bytes = fake.pool->in_use[device];
        *ret_allocations = fake.pool->allocations[device];
        pool_unlock();
        return 0;
}

int fakecuda_process_usage(int device, int pid, uint64_t *ret_bytes) {
        LOCKED();
        if (!fake.initialized || device < 0 || device >= FAKE_MAX_DEVICES)
                return -1;
        uint64_t n = 0;
        pool_lock();
        pool_sweep();
        for (int i = 0; i < FAKE_POOL_CONTEXTS; i++)
                if (fake.pool->contexts[i].pid == pid && fake.pool->contexts[i].device == device)
                        n += fake.pool->contexts[i].bytes;
        for (int i = 0; i < FAKE_POOL_SLOTS; i++) {
                const fake_slot_t *s = &fake.pool->slots[i];
                if (!s->ino || s->device != device)
                        continue;
                for (int h = 0; h < FAKE_POOL_HOLDERS; h++)
                        if (s->holders[h].pid == pid)
                                n += s->size;
        }
        pool_unlock();
        *ret_bytes = n;
        return 0;
}

/* ---- entry point lookup ---- */

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status);

/* Each row: a name, the CUDA version that introduced this signature, the
 * function. A lookup gets the newest row not newer than the version asked. */
static const struct {
        const char *name;
        int version;
        void *fn;
} entry_points[] = {
#define ENTRY(name, version) \
        { #name, version, (void *) name }
        ENTRY(cuInit, 2000),
        ENTRY(cuDriverGetVersion, 2020),
        ENTRY(cuGetProcAddress, 12000),
        ENTRY(cuGetErrorName, 6000),
        ENTRY(cuGetErrorString, 6000),
        ENTRY(cuDeviceGet, 2000),
        ENTRY(cuDeviceGetCount, 2000),
        {"cuDeviceGetUuid", 9020, (void *) cuDeviceGetUuid},
        ENTRY(cuDeviceGetAttribute, 2000),
        ENTRY(cuDeviceTotalMem, 3020),
        ENTRY(cuDevicePrimaryCtxRetain, 7000),
        ENTRY(cuDevicePrimaryCtxRelease, 11000),
        ENTRY(cuCtxSetCurrent, 4000),
        ENTRY(cuCtxGetCurrent, 4000),
        ENTRY(cuCtxPushCurrent, 4000),
        ENTRY(cuCtxPopCurrent, 4000),
        {"cuCtxSynchronize", 2000, (void *) cuCtxSynchronize},
        {"cuCtxSynchronize", 13000, (void *) cuCtxSynchronize_v2},
        ENTRY(cuMemGetInfo, 3020),
        ENTRY(cuMemGetAllocationGranularity, 10020),
        ENTRY(cuMemCreate, 10020),
        ENTRY(cuMemRelease, 10020),
        ENTRY(cuMemExportToShareableHandle, 10020),
        ENTRY(cuMemImportFromShareableHandle, 10020),
        ENTRY(cuMemAddressReserve, 10020),
        ENTRY(cuMemAddressFree, 10020),
        ENTRY(cuMemMap, 10020),
        ENTRY(cuMemUnmap, 10020),
        ENTRY(cuMemSetAccess, 10020),
        ENTRY(cuMemcpyDtoH, 3020),
        ENTRY(cuMemcpyHtoD, 3020),
        ENTRY(cuMemRetainAllocationHandle, 11000),
        ENTRY(cuStreamCreate, 2000),
        ENTRY(cuStreamDestroy, 4000),
        ENTRY(cuStreamGetCtx, 9020),
        ENTRY(cuStreamSynchronize, 2000),
        ENTRY(cuEventCreate, 2000),
        ENTRY(cuEventRecord, 2000),
        ENTRY(cuEventQuery, 2000),
        ENTRY(cuEventSynchronize, 2000),
        ENTRY(cuEventDestroy, 4000),
        ENTRY(cuStreamQuery, 2000),
        ENTRY(cuStreamWaitEvent, 3020),
        {"cuStreamBeginCapture", 10010, (void *) cuStreamBeginCapture},
        ENTRY(cuStreamEndCapture, 10000),
        ENTRY(cuStreamIsCapturing, 10000),
        ENTRY(cuThreadExchangeStreamCaptureMode, 10010),
        ENTRY(cuGraphDestroy, 10000),
        {"cuGraphInstantiate", 11040, (void *) cuGraphInstantiateWithFlags},
        ENTRY(cuGraphInstantiateWithFlags, 11040),
        ENTRY(cuGraphLaunch, 10000),
        ENTRY(cuGraphExecDestroy, 10000),
        ENTRY(cuMemAlloc, 3020),
        ENTRY(cuMemFree, 3020),
        ENTRY(cuMemHostAlloc, 2020),
        ENTRY(cuMemFreeHost, 2000),
#undef ENTRY
};

/* Whether FAKECUDA_HIDE, a comma-separated list, names `symbol`: a driver
 * that lacks it. */
static bool hidden(const char *symbol) {
        const char *hide = getenv("FAKECUDA_HIDE");
        size_t len = strlen(symbol);
        for (const char *h = hide ? strstr(hide, symbol) : NULL; h; h = strstr(h + 1, symbol))
                if ((h == hide || h[-1] == ',') && (h[len] == ',' || h[len] == '\0'))
                        return true;
        return false;
}

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status) {
        if (!symbol || !pfn ||
            flags > (CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
                return CUDA_ERROR_INVALID_VALUE;
        bool known = false;
        int best = -1;
        for (size_t i = 0; !hidden(symbol) && i < sizeof(entry_points) / sizeof(entry_points[0]); i++) {
                if (strcmp(entry_points[i].name, symbol) != 0)
                        continue;
                known = true;
                if (entry_points[i].version <= version)
                        best = (int) i;
        }
        *pfn = best >= 0 ? entry_points[best].fn : NULL;
        if (status)
                *status = best >= 0 ? CU_GET_PROC_ADDRESS_SUCCESS
                          : known   ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                    : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return best >= 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

#ifdef FAKE_NVML
/* ---- fakenvml: the same source built as a test-only libnvidia-ml.so.1 ----
 * It reads the shared pool (FAKECUDA_POOL; without one nvmlInit fails as
 * with no driver loaded), so a process sees device-wide figures without a
 * CUDA context, as with NVML on hardware. */
typedef struct nvmlMemory {
        unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct fake_nvml_device *nvmlDevice_t;
typedef struct nvmlProcessInfo {
        unsigned int pid;
        unsigned long long usedGpuMemory;
        unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
enum {
        NVML_SUCCESS = 0,
        NVML_ERROR_UNINITIALIZED = 1,
        NVML_ERROR_INVALID_ARGUMENT = 2,
        NVML_ERROR_NOT_FOUND = 6,
        NVML_ERROR_INSUFFICIENT_SIZE = 7,
        NVML_ERROR_DRIVER_NOT_LOADED = 9
};

int nvmlInit_v2(void);
int nvmlShutdown(void);
const char *nvmlErrorString(int result);
int nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device);
int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos);

int nvmlInit_v2(void) {
        LOCKED();
        const char *pool = getenv("FAKECUDA_POOL");
        if (!pool || !*pool)
                return NVML_ERROR_DRIVER_NOT_LOADED;
        if (!fake.initialized) {
                if (!configure())
                        return NVML_ERROR_DRIVER_NOT_LOADED;
                fake.init_pid = getpid();
                fake.initialized = true;
        }
        return NVML_SUCCESS;
}

int nvmlShutdown(void) {
        return NVML_SUCCESS;
}

const char *nvmlErrorString(int result) {
        switch (result) {
        case NVML_SUCCESS:
                return "Success";
        case NVML_ERROR_UNINITIALIZED:
                return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT:
                return "Invalid Argument";
        case NVML_ERROR_NOT_FOUND:
                return "Not Found";
        case NVML_ERROR_DRIVER_NOT_LOADED:
                return "Driver Not Loaded";
        default:
                return "Unknown Error";
        }
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" of a physical device (NVML
 * ignores CUDA_VISIBLE_DEVICES). */
int nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
        LOCKED();
        if (!fake.initialized)
                return NVML_ERROR_UNINITIALIZED;
        if (!uuid || !device)
                return NVML_ERROR_INVALID_ARGUMENT;
        for (uint32_t d = 0; d < fake.pool->device_count; d++) {
                unsigned char b[16] = {0};
                memcpy(b, fake.uuid_prefix, fake.uuid_prefix_len);
                b[15] = (unsigned char) d;
                char text[64];
                snprintf(text, sizeof(text), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
                         b[15]);
                if (strcasecmp(text, uuid) == 0) {
                        *device = (nvmlDevice_t) (uintptr_t) (d + 1);
                        return NVML_SUCCESS;
                }
        }
        return NVML_ERROR_NOT_FOUND;
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
        LOCKED();
        uintptr_t d = (uintptr_t) device;
        if (!fake.initialized)
                return NVML_ERROR_UNINITIALIZED;
        if (!memory || d == 0 || d > fake.pool->device_count)
                return NVML_ERROR_INVALID_ARGUMENT;
        pool_lock();
        pool_sweep();
        memory->total = fake.pool->capacity[d - 1];
        memory->used = fake.pool->in_use[d - 1];
        memory->free = memory->total - memory->used;
        pool_unlock();
        return NVML_SUCCESS;
}

/* Adds `bytes` to pid's entry of the list (a new one at the end). */
static void fake_nvml_add(nvmlProcessInfo_t *list, unsigned int *n, unsigned int cap, int32_t pid, uint64_t bytes) {
        for (unsigned int i = 0; i < *n; i++)
                if (list[i].pid == (unsigned int) pid) {
                        list[i].usedGpuMemory += bytes;
                        return;
                }
        if (*n < cap)
                list[(*n)++] = (nvmlProcessInfo_t){.pid = (unsigned int) pid, .usedGpuMemory = bytes};
}

/* Every live process with a context or memory on the device, and its bytes:
 * its context's, and every allocation it holds by handle or mapping (each
 * holder counts an allocation whole, as the driver attributes a mapping to
 * the process that maps it). With FAKENVML_NO_PROCESS_MEMORY=1 the bytes are
 * NVML_VALUE_NOT_AVAILABLE, as drivers that keep them from a container give. */
int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos) {
        LOCKED();
        uintptr_t d = (uintptr_t) device;
        if (!fake.initialized)
                return NVML_ERROR_UNINITIALIZED;
        if (!count || (*count && !infos) || d == 0 || d > fake.pool->device_count)
                return NVML_ERROR_INVALID_ARGUMENT;
        enum { MAX = FAKE_POOL_CONTEXTS + 256 };
        static nvmlProcessInfo_t list[MAX];
        unsigned int n = 0;
        int device_index = (int) d - 1;
        pool_lock();
        pool_sweep();
        for (int i = 0; i < FAKE_POOL_CONTEXTS; i++) {
                const fake_ctx_use_t *c = &fake.pool->contexts[i];
                if (c->pid && c->device == device_index && fake_pool_alive(c->pid))
                        fake_nvml_add(list, &n, MAX, c->pid, c->bytes);
        }
        for (int i = 0; i < FAKE_POOL_SLOTS; i++) {
                const fake_slot_t *sl = &fake.pool->slots[i];
                for (int h = 0; sl->ino && sl->device == device_index && h < FAKE_POOL_HOLDERS; h++)
                        if (sl->holders[h].pid && fake_pool_alive(sl->holders[h].pid))
                                fake_nvml_add(list, &n, MAX, sl->holders[h].pid, sl->size);
        }
        pool_unlock();
        if (*count < n) {
                *count = n;
                return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        const char *hidden = getenv("FAKENVML_NO_PROCESS_MEMORY");
        for (unsigned int i = 0; hidden && strcmp(hidden, "1") == 0 && i < n; i++)
                list[i].usedGpuMemory = ~0ull; /* NVML_VALUE_NOT_AVAILABLE */
        memcpy(infos, list, n * sizeof(*infos));
        *count = n;
        return NVML_SUCCESS;
}
#endif
