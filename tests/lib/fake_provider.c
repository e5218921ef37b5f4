/* See fake_provider.h. Handles are 1, 2, 3... in creation order. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fake_provider.h"

void fake_init(fake_provider_t *f, uint64_t capacity) {
        *f = (fake_provider_t){.capacity = capacity, .fail_error = -ENOMEM, .last_action = -1};
}

void fake_done(fake_provider_t *f) {
        free(f->pieces);
        free(f->seg_live);
        *f = (fake_provider_t){0};
}

/* Grows *arr (elements of `elem` bytes) to hold index `i`; the new part is
 * zero-filled when `zero`. */
static void grow(void **arr, uint64_t *cap, uint64_t i, size_t elem, bool zero) {
        uint64_t n = *cap ? *cap : 64;

        if (i < *cap)
                return;
        while (n <= i)
                n *= 2;
        *arr = realloc(*arr, n * elem);
        if (!*arr)
                abort();
        if (zero)
                memset((char *) *arr + *cap * elem, 0, (n - *cap) * elem);
        *cap = n;
}

/* One create call for n pieces of `size` bytes at offset + k * size, all or
 * nothing; handles are written only on success. */
static int create_pieces(fake_provider_t *f, uint64_t segment_id, uint64_t segment_va_size, uint64_t offset,
                         uint64_t size, uint64_t n, uint64_t *handles) {
        if (size == 0 || n == 0 || n > segment_va_size / size || offset > segment_va_size - n * size) {
                f->errors++;
                return -EINVAL;
        }
        if (f->fail_next) {
                f->fail_next--;
                return f->fail_error;
        }
        if (f->live_bytes > f->capacity || n > (f->capacity - f->live_bytes) / size)
                return -ENOMEM;
        grow((void **) &f->pieces, &f->cap_pieces, f->n_pieces + n - 1, sizeof(*f->pieces), false);
        grow((void **) &f->seg_live, &f->cap_segs, segment_id, sizeof(*f->seg_live), true);
        for (uint64_t k = 0; k < n; k++) {
                f->pieces[f->n_pieces++] = (fake_piece_t){segment_id, offset + k * size, size, true};
                handles[k] = f->n_pieces;
        }
        f->seg_live[segment_id] += n;
        f->live_handles += n;
        f->live_bytes += n * size;
        f->creates += n;
        return 0;
}

static int fake_create(void *userdata, uint64_t segment_id, uint64_t segment_va_size, uint64_t offset, uint64_t size,
                       uint64_t *ret_handle) {
        return create_pieces(userdata, segment_id, segment_va_size, offset, size, 1, ret_handle);
}

static int fake_create_run(void *userdata, uint64_t segment_id, uint64_t segment_va_size, uint64_t offset,
                           uint64_t page_size, uint64_t n_pages, uint64_t *handles) {
        fake_provider_t *f = userdata;

        f->create_runs++;
        f->run_pages_max = n_pages > f->run_pages_max ? n_pages : f->run_pages_max;
        return create_pieces(f, segment_id, segment_va_size, offset, page_size, n_pages, handles);
}

/* One piece goes back, checked against the ledger. */
static void release_piece(fake_provider_t *f, uint64_t segment_id, uint64_t offset, uint64_t size, uint64_t handle,
                          bool whole_segment) {
        fake_piece_t *p;

        f->releases++;
        f->whole_releases += whole_segment;
        if (handle == 0 || handle > f->n_pieces) {
                f->errors++;
                return;
        }
        p = &f->pieces[handle - 1];
        if (!p->live || p->segment_id != segment_id || p->offset != offset || p->size != size) {
                f->errors++;
                return;
        }
        p->live = false;
        f->live_handles--;
        f->live_bytes -= size;
        f->seg_live[segment_id]--;
        if (whole_segment != (f->seg_live[segment_id] == 0))
                f->errors++;
}

static void fake_release(void *userdata, uint64_t segment_id, uint64_t offset, uint64_t size, uint64_t handle,
                         bool whole_segment) {
        release_piece(userdata, segment_id, offset, size, handle, whole_segment);
}

static void fake_release_run(void *userdata, uint64_t segment_id, uint64_t offset, uint64_t page_size, uint64_t n_pages,
                             const uint64_t *handles, bool whole_segment) {
        fake_provider_t *f = userdata;

        f->release_runs++;
        if (n_pages == 0)
                f->errors++;
        for (uint64_t k = 0; k < n_pages; k++)
                release_piece(f, segment_id, offset + k * page_size, page_size, handles[k],
                              whole_segment && k + 1 == n_pages);
}

/* Whether a live piece other than `handle` covers [offset, offset+size) of segment_id. */
static bool overlaps_live(const fake_provider_t *f, uint64_t handle, uint64_t segment_id, uint64_t offset,
                          uint64_t size) {
        for (uint64_t i = 0; i < f->n_pieces; i++) {
                const fake_piece_t *p = &f->pieces[i];

                if (i + 1 != handle && p->live && p->segment_id == segment_id && p->offset < offset + size &&
                    offset < p->offset + p->size)
                        return true;
        }
        return false;
}

/* Moves the pages of the run in order, checking each against the ledger;
 * remap_fail_next fails a whole call, remap_fail_at one page (the run stops
 * there). */
static int64_t fake_remap(void *userdata, const uint64_t *handles, uint64_t n_pages, uint64_t from_segment,
                          uint64_t from_offset, uint64_t to_segment, uint64_t to_segment_va_size, uint64_t to_offset,
                          uint64_t page_size, bool from_segment_empty) {
        fake_provider_t *f = userdata;
        uint64_t limit = n_pages, k;

        f->remap_calls++;
        if (n_pages == 0 || to_offset + n_pages * page_size > to_segment_va_size) {
                f->errors++;
                return -EINVAL;
        }
        grow((void **) &f->seg_live, &f->cap_segs, to_segment, sizeof(*f->seg_live), true);
        if (f->remap_fail_next) {
                f->remap_fail_next--;
                limit = 0;
        } else if (f->remap_fail_at > f->remaps && f->remap_fail_at - f->remaps <= n_pages) {
                limit = f->remap_fail_at - f->remaps - 1;
        }
        for (k = 0; k < limit; k++) {
                uint64_t handle = handles[k], to = to_offset + k * page_size;
                fake_piece_t *p = handle - 1 < f->n_pieces ? &f->pieces[handle - 1] : NULL; /* handle 0 wraps */

                if (!p || !p->live || p->segment_id != from_segment || p->offset != from_offset + k * page_size ||
                    p->size != page_size ||
                    (!f->no_overlap_check && overlaps_live(f, handle, to_segment, to, page_size))) {
                        f->errors++;
                        break;
                }
                p->segment_id = to_segment;
                p->offset = to;
        }
        f->seg_live[from_segment] -= k;
        f->seg_live[to_segment] += k;
        f->remaps += k;
        if (k == n_pages && from_segment_empty != (f->seg_live[from_segment] == 0))
                f->errors++;
        return k ? (int64_t) k : -EIO;
}

static int fake_stream_fence(void *userdata, uint64_t stream, uint64_t fence, uint64_t *ret_done) {
        fake_provider_t *f = userdata;

        f->stream_queries++;
        if (stream >= FAKE_STREAMS) {
                *ret_done = fence;
                return 0;
        }
        if (fence < f->fence_marked[stream])
                f->errors++;
        f->fence_marked[stream] = fence;
        if (!f->busy[stream])
                f->fence_done[stream] = fence;
        *ret_done = f->fence_done[stream];
        return 0;
}

void fake_progress(fake_provider_t *f, uint64_t stream) {
        f->fence_done[stream] = f->fence_marked[stream];
}

static void fake_trace(void *userdata, int action, uint64_t addr, uint64_t size, uint64_t stream) {
        fake_provider_t *f = userdata;

        if (action < 0 || action >= _GM_TRACE_ACTION_MAX) {
                f->errors++;
                return;
        }
        f->traces[action]++;
        f->last_action = action;
        f->last_addr = addr;
        f->last_size = size;
        f->last_stream = stream;
}

gm_provider_t fake_provider(fake_provider_t *f) {
        return (gm_provider_t){
                .create = fake_create,
                .create_run = fake_create_run,
                .release = fake_release,
                .release_run = fake_release_run,
                .trace = fake_trace,
                .remap = fake_remap,
                .stream_fence = fake_stream_fence,
                .userdata = f,
        };
}
