/* libgpumem_torch: PyTorch's CUDAPluggableAllocator entry points over
 * libgpumem, one session per process device.
 *
 * A device's slot is created on first use and its sessions live as long as
 * the process: PyTorch may free a pointer at any time, even from a thread
 * that never allocated, so a session is never disconnected under it. A
 * session whose daemon is gone for good (the re-attach window passed) is
 * retired, kept only for the frees of the pointers it handed out, and the
 * next allocation connects anew. `lock` of a slot guards its fields, never a
 * call into libgpumem: allocations on one device run in parallel.
 *
 * A slot also keeps what PyTorch's extra hooks set: the memory fraction
 * (enforced here on `held_bytes`, the bytes handed out plus those private
 * pools keep) and the private pools of CUDA graphs. A pool's blocks are
 * tagged by address in `tags`; freed while the pool lives they stay in the
 * pool's `kept` list, out of libgpumem's reach, until every graph that
 * began allocating to it (`uses`) has released it. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "gpumem/gpumem.h"
#include "gpumem/torch.h"
#include "torch_filter.h"

/* Sessions of one device whose daemon went away, kept for frees, at most. */
#define MAX_RETIRED 8
/* Distinct kinds (error codes) of refusal written to stderr per device. */
#define MAX_LOGGED_KINDS 8

/* Private pools of one device, at most (PyTorch has one per live graph). */
#define MAX_POOLS 64

/* A block a live pool keeps for its own reuse. */
typedef struct kept_block {
        void *ptr;
        size_t size;
        struct CUstream_st *stream; /* the stream it was freed on */
        bool reusable;              /* false once used on another stream (record_stream) */
} kept_block_t;

typedef struct pool {
        bool used; /* this entry holds a pool */
        gpumem_torch_pool_id id;
        unsigned uses;   /* begin_allocate_to_pool calls not yet released (graphs sharing it) */
        bool allocating; /* between begin and end allocate_to_pool */
        bool released;   /* the last release_pool came: kept blocks are gone, tags drain */
        void *filter;    /* a copy of PyTorch's stream filter; NULL accepts every stream */
        kept_block_t *kept;
        size_t n_kept, cap_kept;
        size_t n_tags; /* its blocks handed out, not yet freed */
} pool_t;

/* A block handed out from a pool: which pool, its size, whether another
 * stream used it. Open addressing on the address; ptr NULL is empty,
 * TOMBSTONE a removed entry. */
typedef struct tag {
        void *ptr;
        size_t size;
        uint16_t pool;
        bool other_stream;
} tag_t;
#define TOMBSTONE ((void *) (uintptr_t) 1)

typedef struct slot {
        pthread_mutex_t lock;
        gpumem_client *client; /* NULL until first use, or after it was retired */
        gpumem_client *retired[MAX_RETIRED];
        size_t n_retired;
        int last_err; /* of the last refusal; 0: none */
        char last_refusal[2048];
        uint64_t refusals;
        int logged[MAX_LOGGED_KINDS];
        size_t n_logged;
        bool limited;        /* a memory fraction below 1 is set */
        uint64_t limit;      /* its bytes (0 for fraction 0: nothing more is handed out) */
        double fraction;     /* what set it; 1 when none is */
        uint64_t held_bytes; /* handed out plus kept by pools */
        pool_t pools[MAX_POOLS];
        size_t n_allocating; /* pools allocating now: 0 keeps the fast path free of pool work */
        tag_t *tags;
        size_t cap_tags, n_tags_used; /* used counts tombstones too */
} slot_t;

static slot_t slots[GPUMEM_TORCH_MAX_DEVICES] = {
        [0 ... GPUMEM_TORCH_MAX_DEVICES - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};

static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static gpumem_frame_hook hook_fn;
static void *hook_userdata;

/* fork(): no slot lock may be held by a thread that does not exist in the
 * child. The child's sessions become its own on their next call (libgpumem). */
static void fork_prepare(void) {
        pthread_mutex_lock(&hook_lock);
        for (size_t i = 0; i < GPUMEM_TORCH_MAX_DEVICES; i++)
                pthread_mutex_lock(&slots[i].lock);
}

static void fork_parent(void) {
        for (size_t i = GPUMEM_TORCH_MAX_DEVICES; i-- > 0;)
                pthread_mutex_unlock(&slots[i].lock);
        pthread_mutex_unlock(&hook_lock);
}

static void fork_child(void) {
        for (size_t i = 0; i < GPUMEM_TORCH_MAX_DEVICES; i++)
                pthread_mutex_init(&slots[i].lock, NULL);
        pthread_mutex_init(&hook_lock, NULL);
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void register_atfork(void) {
        pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* Keeps a refusal of `what` ("allocation of N bytes") for
 * gpumem_torch_last_refusal() and writes it to stderr the first time its kind
 * occurs on the device. An out-of-range device is kept as device 0's. */
static void refuse(int device, const char *what, int err, const char *detail) {
        slot_t *s = &slots[device >= 0 && device < GPUMEM_TORCH_MAX_DEVICES ? device : 0];
        if (!detail || !*detail)
                detail = gpumem_strerror(err);
        pthread_mutex_lock(&s->lock);
        s->refusals++;
        s->last_err = err;
        snprintf(s->last_refusal, sizeof(s->last_refusal), "%s", detail);
        bool seen = false;
        for (size_t i = 0; i < s->n_logged && !seen; i++)
                seen = s->logged[i] == err;
        bool log = !seen && s->n_logged < MAX_LOGGED_KINDS;
        if (log)
                s->logged[s->n_logged++] = err;
        pthread_mutex_unlock(&s->lock);
        const char *quiet = getenv("GPUMEM_TORCH_QUIET");
        if (log && !(quiet && strcmp(quiet, "1") == 0))
                fprintf(stderr,
                        "gpumem: cuda:%d: %s refused (%s): %s\n"
                        "gpumem: (further refusals of this kind are counted, not printed; "
                        "gpumem.last_refusal() reads the latest)\n",
                        device, what, gpumem_strerror(err), detail);
}

/* The slot's current session, connecting it when there is none. */
static int slot_client(int device, gpumem_client **ret) {
        pthread_once(&atfork_once, register_atfork);
        slot_t *s = &slots[device];
        pthread_mutex_lock(&s->lock);
        int r = 0;
        if (!s->client)
                r = gpumem_connect_device(device, &s->client);
        if (r == 0)
                *ret = s->client;
        pthread_mutex_unlock(&s->lock);
        return r;
}

/* Moves a session whose daemon is gone to the retired ones (unless another
 * thread did already). */
static void slot_retire(int device, gpumem_client *c) {
        slot_t *s = &slots[device];
        pthread_mutex_lock(&s->lock);
        if (s->client == c) {
                s->client = NULL;
                if (s->n_retired == MAX_RETIRED) { /* the oldest one's pointers are lost with it */
                        memmove(s->retired, s->retired + 1, (MAX_RETIRED - 1) * sizeof(s->retired[0]));
                        s->n_retired--;
                }
                s->retired[s->n_retired++] = c;
        }
        pthread_mutex_unlock(&s->lock);
}

int gpumem_torch_client(int device, gpumem_client **ret) {
        if (device < 0 || device >= GPUMEM_TORCH_MAX_DEVICES || !ret)
                return -EINVAL;
        return slot_client(device, ret);
}

static size_t take_frames(gpumem_frame *frames) {
        pthread_mutex_lock(&hook_lock);
        gpumem_frame_hook fn = hook_fn;
        void *userdata = hook_userdata;
        pthread_mutex_unlock(&hook_lock);
        if (!fn)
                return 0;
        size_t n = fn(userdata, frames, GPUMEM_MAX_FRAMES);
        return n < GPUMEM_MAX_FRAMES ? n : GPUMEM_MAX_FRAMES;
}

/* ---- private pools and their tags (callers hold the slot's lock) ---- */

static size_t tag_hash(const void *ptr, size_t cap) {
        uint64_t h = (uint64_t) (uintptr_t) ptr * 0x9e3779b97f4a7c15ull;
        return (size_t) (h >> 17) & (cap - 1);
}

/* The index of ptr's tag, or -1. */
static ssize_t tag_find(const slot_t *s, const void *ptr) {
        if (!s->cap_tags)
                return -1;
        for (size_t i = tag_hash(ptr, s->cap_tags), n = 0; n < s->cap_tags; i = (i + 1) & (s->cap_tags - 1), n++) {
                if (!s->tags[i].ptr)
                        return -1;
                if (s->tags[i].ptr == ptr)
                        return (ssize_t) i;
        }
        return -1;
}

static void tag_insert(tag_t *tags, size_t cap, tag_t t) {
        size_t i = tag_hash(t.ptr, cap);
        while (tags[i].ptr && tags[i].ptr != TOMBSTONE)
                i = (i + 1) & (cap - 1);
        tags[i] = t;
}

/* Tags ptr as a block of pool `pool`; -ENOMEM leaves the table as it was. */
static int tag_put(slot_t *s, void *ptr, size_t size, size_t pool) {
        if ((s->n_tags_used + 1) * 2 > s->cap_tags) { /* at most half full, tombstones included */
                size_t cap = s->cap_tags ? s->cap_tags * 2 : 256;
                tag_t *tags = calloc(cap, sizeof(*tags));
                if (!tags)
                        return -ENOMEM;
                size_t used = 0;
                for (size_t i = 0; i < s->cap_tags; i++)
                        if (s->tags[i].ptr && s->tags[i].ptr != TOMBSTONE) {
                                tag_insert(tags, cap, s->tags[i]);
                                used++;
                        }
                free(s->tags);
                s->tags = tags;
                s->cap_tags = cap;
                s->n_tags_used = used;
        }
        tag_insert(s->tags, s->cap_tags, (tag_t){.ptr = ptr, .size = size, .pool = (uint16_t) pool});
        s->n_tags_used++;
        s->pools[pool].n_tags++;
        return 0;
}

static bool pool_id_eq(gpumem_torch_pool_id a, gpumem_torch_pool_id b) {
        return a.first == b.first && a.second == b.second;
}

/* The live (not released) pool `id`, or NULL. */
static pool_t *pool_find(slot_t *s, gpumem_torch_pool_id id) {
        for (size_t i = 0; i < MAX_POOLS; i++)
                if (s->pools[i].used && !s->pools[i].released && pool_id_eq(s->pools[i].id, id))
                        return &s->pools[i];
        return NULL;
}

/* Forgets a released pool once none of its blocks is handed out. */
static void pool_drop_if_drained(pool_t *p) {
        if (p->released && p->n_tags == 0) {
                gm_torch_filter_free(p->filter);
                free(p->kept);
                *p = (pool_t){0};
        }
}

static void pool_stop_allocating(slot_t *s, pool_t *p) {
        if (p->allocating) {
                p->allocating = false;
                s->n_allocating--;
                gm_torch_filter_free(p->filter);
                p->filter = NULL;
        }
}

/* The allocating pool whose filter accepts `stream` (its index), or -1. */
static ssize_t pool_route(slot_t *s, struct CUstream_st *stream) {
        for (size_t i = 0; i < MAX_POOLS && s->n_allocating; i++)
                if (s->pools[i].used && s->pools[i].allocating && gm_torch_filter_accepts(s->pools[i].filter, stream))
                        return (ssize_t) i;
        return -1;
}

/* A kept block of pool `pool` for `size` bytes on `stream` (the smallest
 * that fits), moved to the handed-out ones; NULL if none fits. */
static void *pool_reuse(slot_t *s, size_t pool, size_t size, struct CUstream_st *stream) {
        pool_t *p = &s->pools[pool];
        size_t best = p->n_kept;
        for (size_t i = 0; i < p->n_kept; i++) {
                kept_block_t *k = &p->kept[i];
                if (k->reusable && k->stream == stream && k->size >= size &&
                    (best == p->n_kept || k->size < p->kept[best].size))
                        best = i;
        }
        if (best == p->n_kept)
                return NULL;
        kept_block_t k = p->kept[best];
        if (tag_put(s, k.ptr, k.size, pool) < 0)
                return NULL;
        p->kept[best] = p->kept[--p->n_kept];
        return k.ptr;
}

static int pool_keep(pool_t *p, kept_block_t k) {
        if (p->n_kept == p->cap_kept) {
                size_t cap = p->cap_kept ? p->cap_kept * 2 : 16;
                kept_block_t *kept = realloc(p->kept, cap * sizeof(*kept));
                if (!kept)
                        return -ENOMEM;
                p->kept = kept;
                p->cap_kept = cap;
        }
        p->kept[p->n_kept++] = k;
        return 0;
}

static void held_sub(slot_t *s, uint64_t bytes) {
        s->held_bytes = s->held_bytes > bytes ? s->held_bytes - bytes : 0;
}

/* Claims `size` bytes of the memory fraction; false (and a diagnosis in msg)
 * when they would pass it. */
static bool held_claim(slot_t *s, size_t size, char *msg, size_t len) {
        if (s->limited && s->held_bytes + size > s->limit) {
                snprintf(msg, len,
                         "gpumem: out of memory allocating %zu bytes: over this process's memory fraction %.3g "
                         "(%llu bytes; %llu held; torch.cuda.set_per_process_memory_fraction)",
                         size, s->fraction, (unsigned long long) s->limit, (unsigned long long) s->held_bytes);
                return false;
        }
        s->held_bytes += size;
        return true;
}

static void *slot_alloc(int device, size_t size, struct CUstream_st *stream, const char *what);

void *gpumem_torch_alloc(size_t size, int device, struct CUstream_st *stream) {
        if (size == 0)
                return NULL; /* what PyTorch's own allocator gives for 0 bytes */
        char what[64];
        snprintf(what, sizeof(what), "allocation of %zu bytes", size);
        if (device < 0 || device >= GPUMEM_TORCH_MAX_DEVICES) {
                char msg[128];
                snprintf(msg, sizeof(msg), "gpumem: device %d is outside 0..%d", device, GPUMEM_TORCH_MAX_DEVICES - 1);
                refuse(device, what, -EINVAL, msg);
                return NULL;
        }
        slot_t *s = &slots[device];
        ssize_t pool = -1;
        gpumem_torch_pool_id pool_id = {0};
        char msg[256];
        pthread_mutex_lock(&s->lock);
        if (s->n_allocating) {
                pool = pool_route(s, stream);
                void *kept = pool >= 0 ? pool_reuse(s, (size_t) pool, size, stream) : NULL;
                if (kept) {
                        pthread_mutex_unlock(&s->lock);
                        return kept; /* a pool's own block: no call into libgpumem */
                }
                if (pool >= 0)
                        pool_id = s->pools[pool].id;
        }
        bool claimed = held_claim(s, size, msg, sizeof(msg));
        pthread_mutex_unlock(&s->lock);
        if (!claimed) {
                refuse(device, what, -ENOMEM, msg);
                return NULL;
        }
        void *ptr = slot_alloc(device, size, stream, what);
        pthread_mutex_lock(&s->lock);
        if (!ptr)
                held_sub(s, size);
        else if (pool >= 0 && s->pools[pool].used && !s->pools[pool].released && pool_id_eq(s->pools[pool].id, pool_id))
                (void) tag_put(s, ptr, size, (size_t) pool); /* untagged (no memory) it is an ordinary block */
        pthread_mutex_unlock(&s->lock);
        return ptr;
}

/* A new block from libgpumem (reconnecting once if the daemon went away);
 * NULL after refuse(). */
static void *slot_alloc(int device, size_t size, struct CUstream_st *stream, const char *what) {
        gpumem_frame frames[GPUMEM_MAX_FRAMES];
        size_t n_frames = take_frames(frames); /* before any lock: the hook may wait for Python's */
        for (int attempt = 0;; attempt++) {
                gpumem_client *c = NULL; /* set by slot_client on success; gcc -O3 cannot tell */
                int r = slot_client(device, &c);
                if (r < 0) {
                        refuse(device, what, r, gpumem_last_error(NULL));
                        return NULL;
                }
                void *ptr;
                r = gpumem_alloc_frames(c, size, (uint64_t) (uintptr_t) stream, frames, n_frames, &ptr);
                if (r == 0)
                        return ptr;
                if (r == -ECONNRESET && attempt == 0) {
                        slot_retire(device, c); /* its daemon is gone for good: a new session */
                        continue;
                }
                refuse(device, what, r, gpumem_last_error(c));
                return NULL;
        }
}

/* The sessions of a device that may own a pointer, current first. Returns how
 * many it wrote into out (MAX_RETIRED + 1 places). */
static size_t slot_sessions(int device, gpumem_client **out) {
        slot_t *s = &slots[device];
        size_t n = 0;
        pthread_mutex_lock(&s->lock);
        if (s->client)
                out[n++] = s->client;
        for (size_t i = s->n_retired; i-- > 0;)
                out[n++] = s->retired[i];
        pthread_mutex_unlock(&s->lock);
        return n;
}

static void slot_free(int device, void *ptr, size_t size, struct CUstream_st *stream);

void gpumem_torch_free(void *ptr, size_t size, int device, struct CUstream_st *stream) {
        if (!ptr || device < 0 || device >= GPUMEM_TORCH_MAX_DEVICES)
                return;
        slot_t *s = &slots[device];
        pthread_mutex_lock(&s->lock);
        ssize_t t = tag_find(s, ptr);
        if (t >= 0) {
                tag_t tag = s->tags[t];
                s->tags[t].ptr = TOMBSTONE;
                pool_t *p = &s->pools[tag.pool];
                p->n_tags--;
                size = tag.size; /* a reused block may be larger than PyTorch asked for */
                if (!p->released && pool_keep(p, (kept_block_t){.ptr = ptr,
                                                                .size = tag.size,
                                                                .stream = stream,
                                                                .reusable = !tag.other_stream}) == 0) {
                        pthread_mutex_unlock(&s->lock);
                        return; /* kept for the pool until release_pool */
                }
                pool_drop_if_drained(p);
        }
        held_sub(s, size);
        pthread_mutex_unlock(&s->lock);
        slot_free(device, ptr, size, stream);
}

/* Gives ptr back to whichever of the device's sessions handed it out. */
static void slot_free(int device, void *ptr, size_t size, struct CUstream_st *stream) {
        gpumem_client *sessions[MAX_RETIRED + 1];
        size_t n = slot_sessions(device, sessions);
        int r = -EINVAL;
        const char *detail = "";
        for (size_t i = 0; i < n && r == -EINVAL; i++) {
                r = gpumem_free_async(sessions[i], ptr, (uint64_t) (uintptr_t) stream);
                detail = gpumem_last_error(sessions[i]);
        }
        if (r == -ECONNRESET)
                return; /* its session is gone: the daemon took the memory back with it */
        if (r < 0) {
                char what[80];
                snprintf(what, sizeof(what), "free of %p (%zu bytes)", ptr, size);
                refuse(device, what, r, detail);
        }
}

void gpumem_torch_record_stream(void *ptr, struct CUstream_st *stream) {
        for (int d = 0; d < GPUMEM_TORCH_MAX_DEVICES && ptr; d++) {
                slot_t *s = &slots[d];
                pthread_mutex_lock(&s->lock);
                ssize_t t = tag_find(s, ptr);
                if (t >= 0)
                        s->tags[t].other_stream = true; /* not reused inside its pool: kept until release */
                pthread_mutex_unlock(&s->lock);
                gpumem_client *sessions[MAX_RETIRED + 1];
                size_t n = slot_sessions(d, sessions);
                for (size_t i = 0; i < n; i++)
                        if (gpumem_record_stream(sessions[i], ptr, (uint64_t) (uintptr_t) stream) != -EINVAL)
                                return;
        }
}

void gpumem_torch_empty_cache(void) {
        for (int d = 0; d < GPUMEM_TORCH_MAX_DEVICES; d++) {
                pthread_mutex_lock(&slots[d].lock);
                gpumem_client *c = slots[d].client;
                pthread_mutex_unlock(&slots[d].lock);
                if (c)
                        gpumem_trim(c, NULL); /* best effort, as PyTorch's */
        }
}

int gpumem_torch_last_refusal(int device, char *buf, size_t len, uint64_t *ret_count) {
        if (device < 0 || device >= GPUMEM_TORCH_MAX_DEVICES)
                return -EINVAL;
        slot_t *s = &slots[device];
        pthread_mutex_lock(&s->lock);
        int err = s->last_err;
        if (buf && len)
                snprintf(buf, len, "%s", s->last_refusal);
        if (ret_count)
                *ret_count = s->refusals;
        pthread_mutex_unlock(&s->lock);
        return err;
}

void gpumem_torch_set_frame_hook(gpumem_frame_hook hook, void *userdata) {
        pthread_mutex_lock(&hook_lock);
        hook_fn = hook;
        hook_userdata = userdata;
        pthread_mutex_unlock(&hook_lock);
}

void gpumem_torch_set_memory_fraction(double fraction, int device) {
        if (device < 0 || device >= GPUMEM_TORCH_MAX_DEVICES || !(fraction >= 0.0 && fraction <= 1.0))
                return;
        gpumem_client *c = NULL;
        uint64_t free_bytes = 0, total = 0;
        int r = slot_client(device, &c);
        if (r == 0)
                r = gpumem_mem_get_info(c, &free_bytes, &total);
        if (r < 0) {
                refuse(device, "memory fraction", r, gpumem_last_error(c));
                return;
        }
        slot_t *s = &slots[device];
        pthread_mutex_lock(&s->lock);
        s->fraction = fraction;
        s->limited = fraction < 1.0;
        s->limit = s->limited ? (uint64_t) (fraction * (double) total) : 0;
        pthread_mutex_unlock(&s->lock);
}

double gpumem_torch_memory_fraction(int device) {
        if (device < 0 || device >= GPUMEM_TORCH_MAX_DEVICES)
                return 1.0;
        slot_t *s = &slots[device];
        pthread_mutex_lock(&s->lock);
        double fraction = s->limited ? s->fraction : 1.0;
        pthread_mutex_unlock(&s->lock);
        return fraction;
}

void gpumem_torch_begin_allocate_to_pool(int device, gpumem_torch_pool_id id, const void *filter) {
        if (device < 0 || device >= GPUMEM_TORCH_MAX_DEVICES)
                return;
        void *copy = gm_torch_filter_copy(filter);
        slot_t *s = &slots[device];
        pthread_mutex_lock(&s->lock);
        pool_t *p = pool_find(s, id);
        for (size_t i = 0; i < MAX_POOLS && !p; i++)
                if (!s->pools[i].used) {
                        p = &s->pools[i];
                        *p = (pool_t){.used = true, .id = id};
                }
        if (p) {
                p->uses++; /* another graph shares it: it lives until each has released it */
                pool_stop_allocating(s, p);
                p->filter = copy;
                p->allocating = true;
                s->n_allocating++;
                copy = NULL;
        }
        pthread_mutex_unlock(&s->lock);
        if (!p) /* no pool entry left: its allocations stay ordinary ones */
                refuse(device, "private pool", -ENOSPC, "gpumem: more than 64 private pools on the device");
        gm_torch_filter_free(copy);
}

void gpumem_torch_end_allocate_to_pool(int device, gpumem_torch_pool_id id) {
        if (device < 0 || device >= GPUMEM_TORCH_MAX_DEVICES)
                return;
        slot_t *s = &slots[device];
        pthread_mutex_lock(&s->lock);
        pool_t *p = pool_find(s, id);
        if (p)
                pool_stop_allocating(s, p);
        pthread_mutex_unlock(&s->lock);
}

void gpumem_torch_release_pool(int device, gpumem_torch_pool_id id) {
        if (device < 0 || device >= GPUMEM_TORCH_MAX_DEVICES)
                return;
        slot_t *s = &slots[device];
        pthread_mutex_lock(&s->lock);
        pool_t *p = pool_find(s, id);
        kept_block_t *kept = NULL;
        size_t n_kept = 0;
        if (p && --p->uses == 0) { /* the last graph that used it is gone */
                pool_stop_allocating(s, p);
                kept = p->kept;
                n_kept = p->n_kept;
                p->kept = NULL;
                p->n_kept = p->cap_kept = 0;
                p->released = true;
                for (size_t i = 0; i < n_kept; i++)
                        held_sub(s, kept[i].size);
                pool_drop_if_drained(p);
        }
        pthread_mutex_unlock(&s->lock);
        for (size_t i = 0; i < n_kept; i++)
                slot_free(device, kept[i].ptr, kept[i].size, kept[i].stream);
        free(kept);
}

uint64_t gpumem_torch_pool_kept_bytes(int device) {
        if (device < 0 || device >= GPUMEM_TORCH_MAX_DEVICES)
                return 0;
        slot_t *s = &slots[device];
        uint64_t bytes = 0;
        pthread_mutex_lock(&s->lock);
        for (size_t i = 0; i < MAX_POOLS; i++)
                for (size_t k = 0; k < s->pools[i].n_kept; k++)
                        bytes += s->pools[i].kept[k].size;
        pthread_mutex_unlock(&s->lock);
        return bytes;
}

int gpumem_torch_oom_mode(void) {
        return GPUMEM_TORCH_OOM_MODE;
}
