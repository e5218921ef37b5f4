/* Page reuse's stream fences: per stream a FIFO of (fence number, event). */
#include <errno.h>
#include <stdlib.h>

#include "fence.h"

void gm_fences_init(gm_fences_t *f, const gm_fence_ops_t *ops) {
        *f = (gm_fences_t){.ops = *ops};
}

void gm_fences_clear(gm_fences_t *f, bool destroy_events) {
        for (size_t i = 0; i < f->n_streams && destroy_events; i++) {
                const gm_fence_stream_t *fs = &f->streams[i];
                for (unsigned k = 0; k < fs->n; k++)
                        f->ops.destroy(f->ops.ctx, fs->event[(fs->head + k) % GM_FENCE_MARKS]);
        }
        free(f->streams);
        f->streams = NULL;
        f->n_streams = 0;
        f->n_pending = 0;
        f->n_freed = 0;
}

/* The entry of `stream`, made on first use; NULL when the table is full or
 * out of memory. */
static gm_fence_stream_t *fence_stream(gm_fences_t *f, uint64_t stream) {
        for (size_t i = 0; i < f->n_streams; i++)
                if (f->streams[i].stream == stream)
                        return &f->streams[i];
        if (f->n_streams == GM_FENCE_STREAMS)
                return NULL;
        if (!f->streams && !(f->streams = calloc(GM_FENCE_STREAMS, sizeof(*f->streams))))
                return NULL;
        f->streams[f->n_streams] = (gm_fence_stream_t){.stream = stream};
        return &f->streams[f->n_streams++];
}

static int mark(gm_fences_t *f, gm_fence_stream_t *fs, uint64_t fence) {
        uint64_t event;
        if (fence <= fs->marked)
                return 0;
        if (fs->n == GM_FENCE_MARKS)
                return -ENOSPC;
        int r = f->ops.record(f->ops.ctx, fs->stream, &event);
        if (r < 0)
                return r;
        unsigned tail = (fs->head + fs->n++) % GM_FENCE_MARKS;
        fs->fence[tail] = fence;
        fs->event[tail] = event;
        fs->marked = fence;
        f->n_pending++;
        return 0;
}

/* Pops the completed marks from the head of fs's FIFO, querying, never waiting. */
static void poll_stream(gm_fences_t *f, gm_fence_stream_t *fs) {
        while (fs->n) {
                int done = f->ops.query(f->ops.ctx, fs->event[fs->head]);
                if (done == 0)
                        break;
                if (done > 0) /* an event the driver refuses completes nothing */
                        fs->done = fs->fence[fs->head];
                f->ops.destroy(f->ops.ctx, fs->event[fs->head]);
                fs->head = (fs->head + 1) % GM_FENCE_MARKS;
                fs->n--;
                f->n_pending--;
        }
}

int gm_fences_mark(gm_fences_t *f, uint64_t stream, uint64_t fence) {
        gm_fence_stream_t *fs = fence_stream(f, stream);
        if (!fs)
                return f->streams ? -ENOSPC : -ENOMEM;
        return mark(f, fs, fence);
}

int gm_fences_fence(gm_fences_t *f, uint64_t stream, uint64_t fence, uint64_t *ret_done) {
        gm_fence_stream_t *fs = fence_stream(f, stream);
        if (!fs)
                return -ENOMEM;
        (void) mark(f, fs, fence); /* a refused mark leaves the older ones */
        poll_stream(f, fs);
        *ret_done = fs->done;
        return 0;
}

size_t gm_fences_report(gm_fences_t *f, gm_fence_done_t *out) {
        size_t n = 0;
        for (size_t i = 0; i < f->n_streams && f->n_pending; i++) {
                gm_fence_stream_t *fs = &f->streams[i];
                if (!fs->n)
                        continue;
                poll_stream(f, fs);
                if (fs->done > fs->reported) {
                        out[n++] = (gm_fence_done_t){.stream = fs->stream, .fence = fs->done};
                        fs->reported = fs->done;
                }
        }
        return n;
}

void gm_fences_freed(gm_fences_t *f, uint64_t stream) {
        gm_fence_stream_t *fs = fence_stream(f, stream);
        if (fs && !fs->freed) {
                fs->freed = true;
                f->n_freed++;
        }
}

size_t gm_fences_check_freed(gm_fences_t *f, uint64_t *out) {
        size_t n = 0;
        for (size_t i = 0; i < f->n_streams && f->n_freed; i++) {
                gm_fence_stream_t *fs = &f->streams[i];
                uint64_t event;
                if (!fs->freed)
                        continue;
                fs->freed = false;
                f->n_freed--;
                if (fs->n || f->ops.record(f->ops.ctx, fs->stream, &event) < 0)
                        continue;
                int done = f->ops.query(f->ops.ctx, event);
                f->ops.destroy(f->ops.ctx, event);
                if (done > 0)
                        out[n++] = fs->stream;
        }
        return n;
}
