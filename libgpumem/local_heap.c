/* The local heap: gm_heap_t behind a provider that asks the daemon. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "debug.h"
#include "fence.h"
#include "local_heap.h"
#include "snapshot.h"

/* The heap's create_run(): one grant for the run (create(): a run of one). */
static int provider_create_run(void *userdata, uint64_t segment_id, uint64_t segment_va_size, uint64_t offset,
                               uint64_t page_size, uint64_t n_pages, uint64_t *handles) {
        gm_local_heap_t *l = userdata;
        gm_assert(n_pages > 0);
        gm_local_heap_grant_t g = {
                .segment_id = segment_id,
                .segment_va_size = segment_va_size,
                .offset = offset,
                .size = page_size,
                .n_pieces = n_pages,
                .largest_free = gm_heap_largest_free(l->heap),
                .will_retry = !l->missed_in_capture && !l->held_for_capture &&
                              l->stats->num_alloc_retries == l->retries_before,
                .tag = l->cur_tag,
        };
        uint64_t segment_size;
        gm_heap_sizes_for(l->heap, l->cur_size, &g.block_size, &segment_size);
        gm_local_heap_end(l); /* the daemon reads the figures as of now while it decides */
        int r = l->ops.grant(l->ops.ctx, &g);
        gm_local_heap_begin(l);
        if (r == -ENOMEM || r == -EDQUOT)
                l->refused_by_daemon = true;
        if (r < 0)
                return r;
        for (uint64_t k = 0; k < n_pages; k++)
                handles[k] = ++l->last_handle;
        return 0;
}

static int provider_create(void *userdata, uint64_t segment_id, uint64_t segment_va_size, uint64_t offset,
                           uint64_t size, uint64_t *ret_handle) {
        return provider_create_run(userdata, segment_id, segment_va_size, offset, size, 1, ret_handle);
}

/* The heap's release_run(): the run goes back at once (release(): a run of one). */
static void provider_release_run(void *userdata, uint64_t segment_id, uint64_t offset, uint64_t page_size,
                                 uint64_t n_pages, const uint64_t *handles, bool whole_segment) {
        gm_local_heap_t *l = userdata;
        if (l->destroying)
                return;
        gm_local_heap_end(l); /* the page never claims more than what is still granted */
        l->ops.give_back(l->ops.ctx, segment_id, offset, page_size, n_pages, whole_segment);
        gm_local_heap_begin(l);
}

static void provider_release(void *userdata, uint64_t segment_id, uint64_t offset, uint64_t size, uint64_t handle,
                             bool whole_segment) {
        provider_release_run(userdata, segment_id, offset, size, 1, &handle, whole_segment);
}

static int64_t provider_remap(void *userdata, const uint64_t *handles, uint64_t n_pages, uint64_t from_segment,
                              uint64_t from_offset, uint64_t to_segment, uint64_t to_segment_va_size,
                              uint64_t to_offset, uint64_t page_size, bool from_segment_empty) {
        gm_local_heap_t *l = userdata;
        gm_local_heap_move_t move = {
                .from_segment = from_segment,
                .from_offset = from_offset,
                .to_segment = to_segment,
                .to_segment_va_size = to_segment_va_size,
                .to_offset = to_offset,
                .n_pages = n_pages,
                .page_size = page_size,
                .from_segment_empty = from_segment_empty,
        };
        gm_local_heap_end(l); /* the daemon may read the figures while it follows the move */
        int64_t r = l->ops.move(l->ops.ctx, &move);
        gm_local_heap_begin(l);
        return r;
}

/* The heap's stream_fence(): marks `fence` with an event unless
 * GM_FENCE_MARKS are outstanding, then pops the completed marks (querying,
 * never waiting). */
static int provider_stream_fence(void *userdata, uint64_t stream, uint64_t fence, uint64_t *ret_done) {
        gm_local_heap_t *l = userdata;
        return gm_fences_fence(&l->fences, stream, fence, ret_done);
}

/* The heap's may_release(): nothing is released or moved for a miss while
 * the allocating stream is captured, nor while another capture of the
 * process is in progress; otherwise the release starts through
 * ops.release_begin (the process's record, capture.h), so a declared capture
 * begins only after it ended (provider_release_done()). Lock order: the
 * session's heap lock, then the record's lock, never the reverse: the record
 * takes no heap lock under its own, and a declared begin waits for the
 * release holding neither. */
static bool provider_may_release(void *userdata, uint64_t stream) {
        gm_local_heap_t *l = userdata;
        gm_assert(!l->releasing); /* one miss per allocation */
        l->missed_in_capture = l->ops.capturing && l->ops.capturing(l->ops.ctx, stream) == 1;
        l->held_for_capture = !l->missed_in_capture && l->ops.release_begin && !l->ops.release_begin(l->ops.ctx);
        l->releasing = !l->missed_in_capture && !l->held_for_capture && l->ops.release_begin;
        return !l->missed_in_capture && !l->held_for_capture;
}

/* The heap's release_done(): the miss's releases are over (the allocation
 * returns next, on every path): the release provider_may_release() started
 * ends. */
static void provider_release_done(void *userdata) {
        gm_local_heap_t *l = userdata;
        if (!l->releasing)
                return;
        l->releasing = false;
        l->ops.release_end(l->ops.ctx);
}

/* Records the heap's events in its trace ring while history is on. */
static void provider_trace(void *userdata, int action, uint64_t addr, uint64_t size, uint64_t stream) {
        gm_local_heap_t *l = userdata;
        if (!l->history)
                return;
        gm_history_entry_t e = {.action = action,
                                .addr = addr,
                                .size = size,
                                .stream = stream,
                                .time_us = gm_realtime_us(),
                                .pid = l->pid};
        bool with_frames = action == GM_TRACE_ALLOC || action == GM_TRACE_OOM;
        /* A failed record only loses this entry; allocation goes on. */
        gm_history_record(l->history, &e, with_frames ? l->cur_frames : NULL, with_frames ? l->n_cur_frames : 0);
}

int gm_local_heap_new(const char *alloc_conf, uint64_t capacity, uint64_t granularity, gm_statpage_t *page,
                      const gm_local_heap_ops_t *ops, gm_local_heap_t **ret_local, char *err, size_t err_len) {
        gm_alloc_config_t cfg;
        int r = gm_alloc_config_parse(alloc_conf, &cfg, err, err_len);
        if (r < 0)
                return r;
        /* The page holds the heap's figures, and its pools' where it has room. */
        bool tag_room = page && page->payload_size == sizeof(gm_heap_stats_area_t);
        if (page && !tag_room && page->payload_size != sizeof(gm_stats_t))
                return -EPROTO;
        gm_local_heap_t *l = calloc(1, sizeof(*l));
        if (!l)
                return -ENOMEM;
        gm_assert(!ops->release_begin == !ops->release_end); /* a release that starts ends */
        l->ops = *ops;
        l->page = page;
        l->config = cfg;
        gm_fences_init(&l->fences, &(gm_fence_ops_t){.record = ops->event_record,
                                                     .query = ops->event_query,
                                                     .destroy = ops->event_destroy,
                                                     .ctx = ops->ctx});
        gm_provider_t provider = {
                .create = provider_create,
                .create_run = provider_create_run,
                .release = provider_release,
                .release_run = provider_release_run,
                .trace = provider_trace,
                .remap = ops->move ? provider_remap : NULL,
                .stream_fence = ops->move && ops->event_record ? provider_stream_fence : NULL,
                .may_release = ops->capturing ? provider_may_release : NULL,
                .release_done = ops->capturing ? provider_release_done : NULL,
                .userdata = l,
        };
        gm_heap_params_t params = {.capacity = capacity,
                                   .va_cursor = &l->va_cursor,
                                   .granularity = granularity,
                                   .stats = page ? gm_statpage_payload(page) : NULL,
                                   .tag_stats = tag_room ? ((gm_heap_stats_area_t *) gm_statpage_payload(page))->tags
                                                         : NULL};
        gm_local_heap_begin(l);
        r = gm_heap_new(&cfg, &provider, &params, &l->heap);
        gm_local_heap_end(l);
        if (r < 0) {
                free(l);
                return r;
        }
        l->stats = gm_heap_stats(l->heap);
        gm_local_heap_check(l);
        *ret_local = l;
        return 0;
}

int gm_local_heap_set_config(gm_local_heap_t *l, const char *alloc_conf, char *err, size_t err_len) {
        gm_alloc_config_t cfg;
        int r = gm_alloc_config_parse(alloc_conf, &cfg, err, err_len);
        if (r < 0)
                return r;
        gm_local_heap_begin(l);
        gm_heap_set_config(l->heap, &cfg);
        gm_local_heap_end(l);
        gm_local_heap_check(l);
        l->config = cfg;
        return 0;
}

gm_local_heap_t *gm_local_heap_destroy(gm_local_heap_t *l) {
        if (!l)
                return NULL;
        l->destroying = true;
        /* The page may be gone already (a fork()ed child never maps it): the
         * teardown counts into the heap's own storage. */
        gm_heap_move_stats(l->heap, NULL, false);
        gm_heap_destroy(l->heap);
        gm_fences_clear(&l->fences, true);
        gm_history_free(l->history);
        free(l);
        return NULL;
}

uint64_t gm_local_heap_release_cached(gm_local_heap_t *l) {
        gm_local_heap_begin(l);
        uint64_t released = gm_heap_release_cached(l->heap);
        gm_local_heap_end(l);
        gm_local_heap_check(l);
        return released;
}

void gm_local_heap_hold_tags(gm_local_heap_t *l, uint32_t mask) {
        gm_heap_hold_tags(l->heap, mask);
        gm_local_heap_check(l);
}

int gm_local_heap_stat(const gm_local_heap_t *l, const char *name, int64_t *ret_value) {
        return gm_stats_get(gm_heap_stats(l->heap), name, ret_value);
}

int gm_local_heap_tag_stat(const gm_local_heap_t *l, unsigned tag, const char *name, int64_t *ret_value) {
        gm_stats_t st;
        int r = gm_heap_tag_stats(l->heap, tag, &st);

        return r < 0 ? r : gm_stats_get(&st, name, ret_value);
}

const gm_stats_t *gm_local_heap_stats(const gm_local_heap_t *l) {
        return gm_heap_stats(l->heap);
}

void gm_local_heap_reset_stats(gm_local_heap_t *l, bool peak, bool accumulated) {
        gm_local_heap_begin(l);
        if (peak)
                gm_stats_reset_peak(gm_heap_stats_mut(l->heap));
        if (accumulated)
                gm_stats_reset_accumulated(gm_heap_stats_mut(l->heap));
        gm_local_heap_end(l);
        gm_local_heap_check(l);
}

bool gm_local_heap_refused_by_daemon(const gm_local_heap_t *l) {
        return l->refused_by_daemon;
}

bool gm_local_heap_missed_in_capture(const gm_local_heap_t *l) {
        return l->missed_in_capture;
}

bool gm_local_heap_held_for_capture(const gm_local_heap_t *l) {
        return l->held_for_capture;
}

const gm_heap_t *gm_local_heap_core(const gm_local_heap_t *l) {
        return l->heap;
}

int gm_local_heap_history(gm_local_heap_t *l, bool enabled, uint64_t max_entries, uint32_t pid) {
        l->pid = pid;
        if (!enabled) {
                l->history = gm_history_free(l->history); /* off clears the ring, as in PyTorch */
                return 0;
        }
        if (l->history)
                return gm_history_set_max(l->history, max_entries);
        return gm_history_new(max_entries, GM_LOCAL_HISTORY_FRAME_BYTES, &l->history);
}

const gm_history_t *gm_local_heap_history_ring(const gm_local_heap_t *l) {
        return l->history;
}

int gm_local_heap_snapshot(const gm_local_heap_t *l, const gm_local_heap_owner_t *owner, bool json, char **ret_buf,
                           size_t *ret_len) {
        gm_snapshot_heap_t heap = {
                .heap = l->heap, .pid = owner->pid, .tenant = owner->tenant, .session_id = owner->session_id};
        gm_snapshot_source_t src = {
                .device = owner->device,
                .heaps = &heap,
                .n_heaps = 1,
                .history = l->history,
                .only_heap_pids = true,
                .config = &l->config,
        };
        return gm_snapshot_write(&src, json ? GM_SNAPSHOT_JSON : GM_SNAPSHOT_PICKLE, ret_buf, ret_len);
}
