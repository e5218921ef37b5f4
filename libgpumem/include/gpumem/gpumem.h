/* libgpumem: the client library of gpumemd, the per-GPU memory broker.
 *
 * A gpumem_client is one session with the daemon of one GPU. Every function is
 * thread-safe and returns 0 or a negative errno:
 *   -ENOMEM      out of memory (gpumem_last_error() gives the diagnosis)
 *   -EDQUOT      the tenant's quota would be exceeded
 *   -EPERM       not allowed
 *   -EINVAL      bad argument (unknown pointer, double free, size 0, ...)
 *   -ECONNRESET  the daemon is gone
 * On the host backend a pointer is ordinary CPU memory; on cuda it is a device
 * pointer in the calling process's current CUDA context. */
#ifndef GPUMEM_GPUMEM_H
#define GPUMEM_GPUMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GPUMEM_EXPORT __attribute__((visibility("default")))
#else
#define GPUMEM_EXPORT
#endif

typedef struct gpumem_client gpumem_client;

/* Connects to the daemon at socket_path; NULL means $GPUMEM_SOCKET, else the
 * default socket of GPU 0 (the packaged daemon's /run/gpumem/gpu0.sock when it
 * exists, else the caller's own). On success *ret is a new client; no daemon
 * there is -ENOENT or -ECONNREFUSED, and gpumem_last_error(NULL) names the path. */
GPUMEM_EXPORT int gpumem_connect(const char *socket_path, gpumem_client **ret);

/* Where a session's caching allocator runs. The daemon owns the physical
 * memory, the quotas and the segment ledger in both modes. */
typedef enum gpumem_heap_mode {
        GPUMEM_HEAP_DEFAULT = 0, /* $GPUMEM_HEAP ("local" or "central") if set, else local
                                  * unless the tenant is required to be central */
        GPUMEM_HEAP_LOCAL = 1,   /* in this process: cached allocations and frees send no
                                  * message; -EPERM where the operator requires central */
        GPUMEM_HEAP_CENTRAL = 2, /* in the daemon: one round trip per allocation */
} gpumem_heap_mode;

/* gpumem_connect() with an explicit heap mode (GPUMEM_HEAP_DEFAULT: as gpumem_connect). */
GPUMEM_EXPORT int gpumem_connect_heap(const char *socket_path, gpumem_heap_mode mode, gpumem_client **ret);

/* The mode the session got: GPUMEM_HEAP_LOCAL or GPUMEM_HEAP_CENTRAL. */
GPUMEM_EXPORT gpumem_heap_mode gpumem_heap(gpumem_client *c);

/* Unmaps everything, ends the session (the daemon releases all of its memory)
 * and frees the client. Pointers from it become invalid. Accepts NULL. */
GPUMEM_EXPORT void gpumem_disconnect(gpumem_client *c);

/* Allocates at least `size` bytes for use on `stream` (0 = default stream).
 * A miss that fits only once this session's cached memory is released is
 * served after that release, as PyTorch's retry does (a central session's
 * request waits in the daemon until the library unmapped it). While
 * `stream` (a created stream or the per-thread default stream, 0x2) is
 * being captured into a CUDA graph, a cache miss gets only new memory in
 * either heap mode: one that only releasing or moving cached memory could
 * serve fails with -ENOMEM, gpumem_last_error() saying "refused during a
 * capture", and the capture stays valid. A central session asks the driver
 * about the stream on every allocation (the legacy stream 0 never). */
GPUMEM_EXPORT int gpumem_alloc(gpumem_client *c, size_t size, uint64_t stream, void **ret_ptr);

/* Frees a block; it may be reused at once by allocations on its stream.
 * Refuses unknown pointers and double frees locally with -EINVAL. */
GPUMEM_EXPORT int gpumem_free(gpumem_client *c, void *ptr);

/* Frees a block once the work queued so far on `stream` (and on every stream
 * given to gpumem_record_stream) is done. */
GPUMEM_EXPORT int gpumem_free_async(gpumem_client *c, void *ptr, uint64_t stream);

/* Marks the block as used on `stream`: a later free waits for that stream too. */
GPUMEM_EXPORT int gpumem_record_stream(gpumem_client *c, void *ptr, uint64_t stream);

/* Releases this session's idle cached segments; *ret_released_bytes (may be
 * NULL) receives the bytes given back. -EBUSY, releasing nothing, while a
 * CUDA graph capture is in progress in the process (see
 * gpumem_capture_begin()): its synchronize would invalidate the capture. */
GPUMEM_EXPORT int gpumem_trim(gpumem_client *c, uint64_t *ret_released_bytes);

/* Declares that a thread of this process captures a CUDA graph from now
 * until the matching gpumem_capture_end() (declarations nest: each begin
 * takes one end). While one is open, or a local heap saw an allocation's
 * stream being captured (cuStreamIsCapturing, asked again while that block
 * lives until it says the capture ended: destroy a stream only after freeing
 * the blocks allocated on it during a capture), no session of the process
 * synchronizes the device or releases cached memory: not for the daemon's
 * Reclaim or a central session's release request (each answered once the
 * capture ends), gpumem_trim() or gpumem_sleep() (-EBUSY), nor for a local
 * heap's cache miss on another stream (it fails -ENOMEM rather than run the
 * out-of-memory ladder, garbage collection, max_split_size releases or page
 * moves). Call it before
 * cuStreamBeginCapture and gpumem_capture_end() after cuStreamEndCapture;
 * begin waits for a release already under way to finish (a Reclaim's, a
 * release request's, a trim's, a sleep's, or a local heap's own for a miss
 * on another thread: its ladder, garbage collection, max_split_size release
 * or page move, until that allocation returns). libgpumem_torch
 * calls both from PyTorch's allocate-to-pool hooks. Process-wide, for every
 * session and device; a fork child starts with none open. -EOVERFLOW past
 * INT32_MAX open declarations. */
GPUMEM_EXPORT int gpumem_capture_begin(void);

/* Ends one declared capture (gpumem_capture_begin()); what waited for it
 * runs at the service thread's next poll. -EINVAL when none is open. */
GPUMEM_EXPORT int gpumem_capture_end(void);

/* One statistic of this session by its torch.cuda.memory_stats() name, e.g.
 * "allocated_bytes.all.current". -ENOENT for an unknown name. */
GPUMEM_EXPORT int gpumem_stat(gpumem_client *c, const char *pytorch_stat_name, int64_t *ret_value);

/* Text of a gpumem error code (negative errno). Never NULL. */
GPUMEM_EXPORT const char *gpumem_strerror(int err);

/* The detailed message of the calling thread's last failure on this client
 * (e.g. the out-of-memory diagnosis); "" if none. Valid until the thread's next
 * call on the client. With NULL: why the thread's last gpumem_connect() or
 * gpumem_connect_device() failed (e.g. a refused socket directory, or the
 * daemon's session limit). */
GPUMEM_EXPORT const char *gpumem_last_error(gpumem_client *c);

/* ---- Frames, devices, statistics, snapshots, administration ----
 * The calls below speak the same requests gpumemctl does, on this client's
 * session, with the caller's kernel-verified rights: a session sees its own
 * figures and its tenant's; other tenants, other processes, the whole device,
 * history and quota changes need admin rights (uid 0 or the admin group). */

/* One frame of the allocating code's stack, for memory history. */
typedef struct gpumem_frame {
        const char *filename;
        uint32_t line;
        const char *name;
} gpumem_frame;

/* Most frames one allocation carries; further ones are dropped. */
#define GPUMEM_MAX_FRAMES 64

/* gpumem_alloc() that also passes the allocating code's stack (innermost
 * first). The daemon keeps it with the allocation's trace entry while memory
 * history is on (gpumem_history()), so snapshots show where blocks came from. */
GPUMEM_EXPORT int gpumem_alloc_frames(gpumem_client *c, size_t size, uint64_t stream, const gpumem_frame *frames,
                                      size_t n_frames, void **ret_ptr);

/* Connects to the daemon of this process's CUDA device `ordinal` (the number
 * cudaGetDevice() gives, after CUDA_VISIBLE_DEVICES). The socket is
 * $GPUMEM_SOCKET_TEMPLATE with its one %d replaced by the ordinal; without a
 * template, $GPUMEM_SOCKET for ordinal 0, else the default socket of GPU
 * `ordinal`. Where the daemon reports its GPU's UUID and the CUDA driver is
 * present, the UUID must name this process's device `ordinal`; otherwise the
 * other sockets of the template (indices 0..63) are searched for the daemon
 * that does. -ENODEV when no daemon serves the device. */
GPUMEM_EXPORT int gpumem_connect_device(int ordinal, gpumem_client **ret);

/* Whose figures a call is about. */
typedef enum gpumem_scope {
        GPUMEM_SCOPE_SESSION = 0, /* this client's session */
        GPUMEM_SCOPE_DEVICE = 1,  /* every session on the GPU (admin) */
        GPUMEM_SCOPE_TENANT = 2,  /* one tenant; NULL or "" is the caller's own */
        GPUMEM_SCOPE_PID = 3,     /* every session of one process */
} gpumem_scope;

/* Every torch.cuda.memory_stats() statistic of one scope, taken at one moment. */
typedef struct gpumem_stats gpumem_stats;

/* Takes the statistics of `scope` (`tenant` for GPUMEM_SCOPE_TENANT, `pid`
 * for GPUMEM_SCOPE_PID; ignored otherwise). Free *ret with gpumem_stats_free(). */
GPUMEM_EXPORT int gpumem_stats_get(gpumem_client *c, gpumem_scope scope, const char *tenant, uint32_t pid,
                                   gpumem_stats **ret);
/* Accepts NULL. */
GPUMEM_EXPORT void gpumem_stats_free(gpumem_stats *s);
/* Number of statistics; they are sorted by name as memory_stats() sorts them. */
GPUMEM_EXPORT size_t gpumem_stats_count(const gpumem_stats *s);
/* Name and value of statistic i (< count); NULL and 0 past the end. */
GPUMEM_EXPORT const char *gpumem_stats_name(const gpumem_stats *s, size_t i);
GPUMEM_EXPORT int64_t gpumem_stats_value(const gpumem_stats *s, size_t i);
/* One statistic by name; -ENOENT when the set has none of that name. */
GPUMEM_EXPORT int gpumem_stats_find(const gpumem_stats *s, const char *name, int64_t *ret_value);
/* The daemon's device index, its capacity in bytes and the sessions counted. */
GPUMEM_EXPORT int gpumem_stats_device(const gpumem_stats *s);
GPUMEM_EXPORT uint64_t gpumem_stats_capacity(const gpumem_stats *s);
GPUMEM_EXPORT uint64_t gpumem_stats_sessions(const gpumem_stats *s);
/* torch.cuda.memory_summary(device, abbreviated) of the set: the text
 * `gpumemctl stats` prints. *ret_text is NUL-terminated; free it with
 * gpumem_buffer_free(). */
GPUMEM_EXPORT int gpumem_stats_summary(const gpumem_stats *s, bool abbreviated, char **ret_text);

/* reset_peak_memory_stats() (peak) and reset_accumulated_memory_stats()
 * (accumulated) for the session, or a tenant or the device (admin). */
GPUMEM_EXPORT int gpumem_reset_stats(gpumem_client *c, gpumem_scope scope, const char *tenant, bool peak,
                                     bool accumulated);

/* Releases idle cached memory: `tenant` NULL is this session only (as
 * gpumem_trim()); a tenant's name, or "*" for every tenant, needs admin rights.
 * *ret_released_bytes (may be NULL) receives the bytes given back. */
GPUMEM_EXPORT int gpumem_trim_tenant(gpumem_client *c, const char *tenant, uint64_t *ret_released_bytes);

typedef enum gpumem_snapshot_format {
        GPUMEM_SNAPSHOT_PICKLE = 0, /* what torch.cuda.memory._dump_snapshot() writes */
        GPUMEM_SNAPSHOT_JSON = 1,
        GPUMEM_SNAPSHOT_PICKLE_1_13 = 2, /* PyTorch 1.13's memory_snapshot(): a bare list of segments */
} gpumem_snapshot_format;

/* A torch.cuda.memory._snapshot() of the caller's tenant (of the whole device
 * with admin rights), narrowed to process `pid` unless it is 0. Local
 * sessions are asked for their blocks; one that does not answer within the
 * daemon's snapshot_answer_timeout_ms appears with its segments only. *ret_data
 * (*ret_len bytes) is the caller's; free it with gpumem_buffer_free(). */
GPUMEM_EXPORT int gpumem_snapshot(gpumem_client *c, gpumem_snapshot_format format, uint32_t pid, void **ret_data,
                                  size_t *ret_len);

typedef struct gpumem_history_state {
        bool enabled;
        uint64_t max_entries; /* bound of the trace ring */
        uint64_t entries;     /* entries recorded now */
} gpumem_history_state;

/* Turns the session's own memory history (its trace in snapshots, frames
 * included) on or off, with no rights needed, as PyTorch's is per process;
 * with admin rights the daemon's trace ring of the whole device instead.
 * Turning it off clears it, as in PyTorch. max_entries 0 keeps the current
 * bound (one's own: at most 1000000, silently). *ret_state (may be NULL)
 * receives the state after the call. */
GPUMEM_EXPORT int gpumem_history(gpumem_client *c, bool enabled, uint64_t max_entries, gpumem_history_state *ret_state);

/* One session on the daemon, as `gpumemctl clients` lists it. */
typedef struct gpumem_client_info {
        uint64_t session_id;
        uint32_t pid;
        uint32_t uid;
        const char *tenant;
        const char *unit; /* systemd unit; "" if none */
        const char *name; /* what the client calls itself (not trusted) */
        uint64_t reserved_bytes;
        uint64_t allocated_bytes;
        uint64_t cached_bytes;
        uint64_t segments;
        uint64_t releasing_bytes; /* asked back, not yet acknowledged (still charged) */
        bool control;             /* a gpumemctl-style connection holding no memory */
        const char *heap;         /* "local" (its heap runs in the client) or "central" */
        bool stats_page_invalid;  /* local: its statistics page failed the daemon's bounds (figures as zero) */
        uint64_t requests;        /* packets the daemon received from it */
        bool asleep;              /* local: asleep (gpumem_sleep()): its memory went back, its addresses stay */
        uint64_t sleeping_bytes;  /* asleep: what its wake needs */
} gpumem_client_info;

/* The sessions the caller may see (its tenant's; every one for an admin).
 * *ret_list (*ret_n entries, strings inside) is one buffer: free it with
 * gpumem_buffer_free(). */
GPUMEM_EXPORT int gpumem_list_clients(gpumem_client *c, gpumem_client_info **ret_list, size_t *ret_n);

/* One tenant's quota and use, as `gpumemctl quota list` shows it. */
typedef struct gpumem_tenant_info {
        const char *tenant;
        uint64_t quota;           /* effective quota in bytes; 0 = none */
        const char *quota_source; /* "runtime", "persistent", "config" or "none" */
        uint64_t charged_bytes;   /* reserved by all its sessions, releases awaiting ack included */
        uint64_t allocated_bytes;
        uint64_t cached_bytes;
        uint32_t sessions;
} gpumem_tenant_info;

/* Quotas: tenant NULL lists every tenant the caller may see, a name gives that
 * one. One buffer, as gpumem_list_clients(). */
GPUMEM_EXPORT int gpumem_quota_list(gpumem_client *c, const char *tenant, gpumem_tenant_info **ret_list, size_t *ret_n);
/* Sets a tenant's quota (admin); 0 removes it. Persistent (kept in the
 * daemon's state directory) unless `runtime`. */
GPUMEM_EXPORT int gpumem_quota_set(gpumem_client *c, const char *tenant, uint64_t bytes, bool runtime);

/* torch.cuda.mem_get_info(): *ret_total is the daemon's capacity; *ret_free
 * what this session could still be given: the capacity less the device's
 * reserved bytes (as far as the caller may see them: else less its tenant's),
 * and no more than the tenant's quota leaves. Unconsumed claims
 * (gpumem_claim()) of other sessions count as taken (as far as the caller
 * may see them), this session's own claim as free. */
GPUMEM_EXPORT int gpumem_mem_get_info(gpumem_client *c, uint64_t *ret_free, uint64_t *ret_total);

/* Frees a buffer this library returned. Accepts NULL. */
GPUMEM_EXPORT void gpumem_buffer_free(void *buf);

/* ---- sleep and wake ---- */

/* Gives this session's physical memory back to the device while keeping
 * every address reservation: blocks stay allocated and their pointers stay
 * valid. Cached (free) memory is released outright. The data of allocated
 * blocks in `keep_tags` (NULL-terminated; NULL: none; {"*", NULL}: all) is
 * copied to host memory first (the bytes each allocation asked for): on
 * cuda into one page-locked buffer (cuMemHostAlloc: the copies run at the
 * bus's bandwidth), up to GPUMEM_SLEEP_PINNED_MAX bytes (default: half of
 * MemAvailable at the sleep), the rest, and all of it when the driver has no
 * page-locked memory left, in ordinary (pageable) host memory.
 * `tags` (NULL-terminated, 1 to 16 pool names, "" the default pool; NULL:
 * every pool) chooses which pools sleep (-EINVAL for a malformed name); the
 * others stay mapped. Work queued on the device
 * must be done first (the call synchronizes the device). Local sessions only
 * (-EOPNOTSUPP for central); -EALREADY when asleep; -EBUSY, releasing
 * nothing, while a CUDA graph capture is in progress in the process (see
 * gpumem_capture_begin()): its synchronize would invalidate the capture.
 * *ret_released_bytes (may be NULL): the bytes given back. While asleep,
 * gpumem_alloc() in a sleeping pool fails with -EAGAIN ("pool 'NAME' is
 * asleep: gpumem_wake() first"; a pool first used after the sleep is awake);
 * the other pools allocate, free and release their cache (gpumem_trim(),
 * the daemon's reclaims) as before, the sleeping pools' cache stays.
 * gpumem_free() of a sleeping block is allowed (its kept data is dropped).
 * Memory of a sleeping block must not be touched. A daemon restart while
 * asleep keeps the sleep: the session re-attaches asleep (its re-attach
 * tells the new daemon what a wake needs) and gpumem_wake() works as
 * before. */
GPUMEM_EXPORT int gpumem_sleep(gpumem_client *c, const char *const *tags, const char *const *keep_tags,
                               uint64_t *ret_released_bytes);
/* Maps new memory at the same addresses and restores the kept data (other
 * blocks hold undefined bytes). Waits while quota or device is short, up to
 * timeout_ms (0: the daemon's park_timeout_ms); -ENOMEM (or -EDQUOT) with
 * the diagnosis in gpumem_last_error() when it runs out: then whatever was
 * granted went back, the session is still asleep and wake may be called
 * again. 0 at once when awake. */
GPUMEM_EXPORT int gpumem_wake(gpumem_client *c, uint32_t timeout_ms);
/* Bytes a wake needs (0 when awake). */
GPUMEM_EXPORT uint64_t gpumem_sleeping_bytes(gpumem_client *c);
/* Of the data a sleep keeps, the bytes in page-locked host memory (0 when
 * awake, on the host backend, or when pinning failed or was bounded to 0). */
GPUMEM_EXPORT uint64_t gpumem_sleeping_pinned_bytes(gpumem_client *c);

/* ---- claims ---- */

/* Sets aside up to `bytes` of the device for this session, atomically: *ret_claimed is what was
 * set aside, min(bytes, what this session could still be given now) -- never more than the
 * device's capacity less what others hold or have claimed, nor more than the tenant's quota
 * leaves. The claim is consumed as the session is granted memory (a grant is taken from it
 * first, and a grant inside the claim is never refused for lack of device memory or quota),
 * counts against the quota and the device for everyone else (mem_get_info of other sessions no
 * longer offers it), shows in stats, and lapses at the session's end or with
 * gpumem_claim(c, 0, ...), not at a daemon restart: the re-attach re-sends what is left of it,
 * set aside again as far as the new daemon has it free (less when it cannot give it all; the
 * session's mem_get_info shows the claim that stands). A new claim replaces the old one. Nothing is reclaimed for a claim:
 * other sessions' idle cache is not counted as free. -EINVAL: `bytes` is more than the
 * daemon's capacity. */
GPUMEM_EXPORT int gpumem_claim(gpumem_client *c, uint64_t bytes, uint64_t *ret_claimed);
/* The unconsumed claims of a statistics set's scope as the daemon counts them (the session's,
 * its tenant's, a pid's or the device's); 0 for a local session's own set, which is read in
 * the process. */
GPUMEM_EXPORT uint64_t gpumem_stats_claimed(const gpumem_stats *s);
/* ---- tagged pools ---- */

/* Allocations this thread makes on `c` until gpumem_pool_end() carry tag
 * `tag` and come from that tag's own pool: a block is carved only from
 * segments of its tag, so a tag's memory can be counted, limited and put to
 * sleep as a whole. Scopes nest (a stack of at most 8 per thread); the empty
 * tag "" is the default pool. -EINVAL for a malformed name
 * ([A-Za-z0-9_.-]{1,31}), -E2BIG past the depth or past max_tags distinct
 * tags per session (16), -ENOBUFS when this thread has scopes open on four
 * other clients. */
GPUMEM_EXPORT int gpumem_pool_begin(gpumem_client *c, const char *tag);
/* Closes this thread's innermost scope on `c`; -ENOENT when none is open. */
GPUMEM_EXPORT int gpumem_pool_end(gpumem_client *c);
/* The tag this thread's allocations on `c` carry now ("" for none). */
GPUMEM_EXPORT const char *gpumem_pool_current(gpumem_client *c);
/* A PyTorch statistic of one tag's pool (as gpumem_stat(); names as there):
 * the figures of its blocks and segments; the num_* counters are the
 * session's only and read 0 here. A valid tag no scope used yet reads 0.
 * A local session answers from its own heap, a central one asks the
 * daemon's (one request). */
GPUMEM_EXPORT int gpumem_stat_tag(gpumem_client *c, const char *tag, const char *pytorch_stat_name, int64_t *ret_value);

/* ---- shared objects ---- */

/* Named, versioned, read-only memory one session fills and publishes and any
 * session of an admitted tenant maps (docs/shared.md). The daemon owns it:
 * charged once, to the publisher's tenant, it outlives the publisher and a
 * daemon restart, until unpublished (or its retention ended) and closed by
 * its last mapper. A handle is used by one thread at a time; close every
 * handle before gpumem_disconnect(). */
typedef struct gpumem_shared gpumem_shared;

/* Makes a writable staging object `name` ([A-Za-z0-9_.:/-]{1,127}) of `size`
 * bytes (rounded up to the granularity) for this session to fill (charged to
 * the caller's tenant at once); *ret_ptr is its device address, mapped
 * read-write here only. -EDQUOT, -ENOMEM, -ENOSPC (max_shared_objects),
 * -EFBIG (larger than the tenant's quota or the device), -EEXIST. */
GPUMEM_EXPORT int gpumem_shared_create(gpumem_client *c, const char *name, uint64_t size, gpumem_shared **ret,
                                       void **ret_ptr);
/* Commits it: the caller's writable mapping goes (after the device's work on
 * it is done), the memory becomes immutable, version = the name's previous
 * highest + 1. `readers`: NULL-terminated tenant names admitted to open it
 * ("*" every tenant; NULL: the publisher's tenant only). `meta`: an opaque
 * blob of at most 1 MiB (and one packet: max_packet) kept with it (a tensor
 * layout). retention_s 0: until unpublished. Afterwards the handle is as one
 * from gpumem_shared_open() (mapped read-only here, at the same address on
 * host). -EBUSY: a writable mapping of it remains elsewhere (it stays a
 * staging object, mapped read-write again). */
GPUMEM_EXPORT int gpumem_shared_publish(gpumem_client *c, gpumem_shared *s, const char *const *readers,
                                        const void *meta, size_t meta_len, uint32_t retention_s, uint64_t *ret_version);
/* Maps published object `name` (version 0: the newest) read-only; -ENOENT,
 * -EACCES when the caller's tenant is not admitted. */
GPUMEM_EXPORT int gpumem_shared_open(gpumem_client *c, const char *name, uint64_t version, gpumem_shared **ret);
/* Its address here, size in bytes, version (0 while staging). */
GPUMEM_EXPORT const void *gpumem_shared_ptr(const gpumem_shared *s);
GPUMEM_EXPORT uint64_t gpumem_shared_size(const gpumem_shared *s);
GPUMEM_EXPORT uint64_t gpumem_shared_version(const gpumem_shared *s);
/* The meta blob kept with it (NULL, 0 when none); valid until close. */
GPUMEM_EXPORT int gpumem_shared_meta(const gpumem_shared *s, const void **ret_meta, size_t *ret_len);
/* Unmaps it here (the device's work on it must be done) and frees the
 * handle; a staging object is given up. Accepts NULL. */
GPUMEM_EXPORT void gpumem_shared_close(gpumem_client *c, gpumem_shared *s);
/* Withdraws name@version (0: every version) so nobody can open it again; its
 * memory goes back to the device when the last mapper closes. The
 * publisher's tenant or an admin (-EPERM); -ENOENT. */
GPUMEM_EXPORT int gpumem_shared_unpublish(gpumem_client *c, const char *name, uint64_t version);

#ifdef __cplusplus
}
#endif

#include <gpumem/admin.h> /* the administration connection gpumemctl uses */

#endif
