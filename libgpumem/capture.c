/* The process's captures in progress (capture.h): one record under one
 * mutex. `releasing` counts the releases under way; a declared capture
 * begins only when it is 0, and a release starts only when no capture is in
 * progress, so a declared capture never overlaps a release that synchronizes
 * the device. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "capture.h"
#include "debug.h"

static struct {
        pthread_mutex_t lock;
        pthread_cond_t released; /* signalled when `releasing` drops to 0 */
        int32_t declared;        /* declared captures open */
        int32_t releasing;       /* releases under way */
        uint64_t streams[GM_CAPTURE_MAX_STREAMS];
        uint32_t blocks[GM_CAPTURE_MAX_STREAMS]; /* live blocks noted on streams[i], at least 1 */
        uint32_t n_streams;                      /* noted streams, distinct, in streams[0 .. n_streams) */
} rec = {.lock = PTHREAD_MUTEX_INITIALIZER, .released = PTHREAD_COND_INITIALIZER};

atomic_uint gm_capture_open_;

/* Publishes how many captures are open (declared + noted streams) for
 * gm_capture_any(). Caller holds the lock. */
static void publish_locked(void) {
        atomic_store_explicit(&gm_capture_open_, (unsigned) rec.declared + rec.n_streams, memory_order_relaxed);
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* A fork child has none of its parent's other threads: no capture of theirs,
 * no release of theirs under way. */
static void fork_child(void) {
        pthread_mutex_init(&rec.lock, NULL);
        pthread_cond_init(&rec.released, NULL);
        rec.declared = rec.releasing = 0;
        rec.n_streams = 0;
        publish_locked();
}

static void register_fork(void) {
        pthread_atfork(NULL, NULL, fork_child);
}

static void lock(void) {
        pthread_once(&fork_once, register_fork);
        pthread_mutex_lock(&rec.lock);
}

int gm_capture_begin(void) {
        lock();
        while (rec.releasing > 0)
                pthread_cond_wait(&rec.released, &rec.lock);
        int r = rec.declared < INT32_MAX ? 0 : -EOVERFLOW;
        rec.declared += r == 0;
        publish_locked();
        pthread_mutex_unlock(&rec.lock);
        return r;
}

int gm_capture_end(void) {
        lock();
        int r = rec.declared > 0 ? 0 : -EINVAL;
        rec.declared -= r == 0;
        publish_locked();
        pthread_mutex_unlock(&rec.lock);
        return r;
}

/* Where `stream` is noted, or n_streams. Caller holds the lock. */
static uint32_t find_locked(uint64_t stream) {
        uint32_t i = 0;
        while (i < rec.n_streams && rec.streams[i] != stream)
                i++;
        return i;
}

/* Forgets noted stream i. Caller holds the lock. */
static void forget_locked(uint32_t i) {
        rec.n_streams--;
        rec.streams[i] = rec.streams[rec.n_streams];
        rec.blocks[i] = rec.blocks[rec.n_streams];
        publish_locked();
}

bool gm_capture_note_block(uint64_t stream) {
        lock();
        uint32_t i = find_locked(stream);
        bool noted = i < rec.n_streams ? rec.blocks[i] < UINT32_MAX : i < GM_CAPTURE_MAX_STREAMS;
        if (noted && i == rec.n_streams) {
                rec.streams[i] = stream;
                rec.blocks[i] = 0;
                rec.n_streams++;
        }
        if (noted)
                rec.blocks[i]++;
        publish_locked();
        pthread_mutex_unlock(&rec.lock);
        return noted;
}

void gm_capture_unnote_block(uint64_t stream) {
        lock();
        uint32_t i = find_locked(stream);
        if (i < rec.n_streams && --rec.blocks[i] == 0)
                forget_locked(i);
        pthread_mutex_unlock(&rec.lock);
}

void gm_capture_forget_stream(uint64_t stream) {
        if (!gm_capture_any()) /* nothing noted: every uncaptured miss asks, most with nothing open */
                return;
        lock();
        uint32_t i = find_locked(stream);
        if (i < rec.n_streams)
                forget_locked(i);
        pthread_mutex_unlock(&rec.lock);
}

bool gm_capture_noted(void) {
        lock();
        bool noted = rec.n_streams > 0;
        pthread_mutex_unlock(&rec.lock);
        return noted;
}

/* Forgets the noted streams `query` says capture no more; whether a capture
 * is in progress. Caller holds the lock. */
static bool in_progress_locked(gm_capture_query_fn query, void *ctx) {
        for (uint32_t i = 0; query && i < rec.n_streams;) {
                if (query(ctx, rec.streams[i]) == 1)
                        i++;
                else
                        forget_locked(i);
        }
        return rec.declared > 0 || rec.n_streams > 0;
}

bool gm_capture_in_progress(gm_capture_query_fn query, void *ctx) {
        lock();
        bool busy = in_progress_locked(query, ctx);
        pthread_mutex_unlock(&rec.lock);
        return busy;
}

bool gm_capture_release_begin(gm_capture_query_fn query, void *ctx) {
        lock();
        bool busy = in_progress_locked(query, ctx);
        if (!busy) {
                gm_assert(rec.releasing < INT32_MAX); /* one per thread at most */
                rec.releasing++;
        }
        pthread_mutex_unlock(&rec.lock);
        return !busy;
}

void gm_capture_release_end(void) {
        lock();
        gm_assert(rec.releasing > 0); /* paired with a gm_capture_release_begin() that returned true */
        if (--rec.releasing == 0)
                pthread_cond_broadcast(&rec.released);
        pthread_mutex_unlock(&rec.lock);
}

void gm_capture_check(void) {
        lock();
        gm_assert(rec.declared >= 0 && rec.releasing >= 0);
        gm_assert(rec.n_streams <= GM_CAPTURE_MAX_STREAMS);
        /* gm_capture_any() reads what is open */
        gm_assert(atomic_load_explicit(&gm_capture_open_, memory_order_relaxed) ==
                  (unsigned) rec.declared + rec.n_streams);
        for (uint32_t i = 0; i < rec.n_streams; i++) {
                gm_assert(rec.blocks[i] > 0); /* a stream is noted only while a noted block on it lives */
                for (uint32_t k = i + 1; k < rec.n_streams; k++)
                        gm_assert(rec.streams[i] != rec.streams[k]); /* distinct */
        }
        pthread_mutex_unlock(&rec.lock);
}
