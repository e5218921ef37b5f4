/* libgpumem_torch: PyTorch's CUDAPluggableAllocator entry points over
 * libgpumem, one session per process device.
 *
 * A device's slot is created on first use and its sessions live as long as
 * the process: PyTorch may free a pointer at any time, even from a thread
 * that never allocated, so a session is never disconnected under it. A
 * session whose daemon is gone for good (the re-attach window passed) is
 * retired, kept only for the frees of the pointers it handed out, and the
 * next allocation connects anew. `lock` of a slot guards its fields, never a
 * call into libgpumem: allocations on one device run in parallel. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem/gpumem.h"
#include "gpumem/torch.h"

/* Sessions of one device whose daemon went away, kept for frees, at most. */
#define MAX_RETIRED 8
/* Distinct kinds (error codes) of refusal written to stderr per device. */
#define MAX_LOGGED_KINDS 8

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

void gpumem_torch_free(void *ptr, size_t size, int device, struct CUstream_st *stream) {
        if (!ptr || device < 0 || device >= GPUMEM_TORCH_MAX_DEVICES)
                return;
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
