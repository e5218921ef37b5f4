/* Snapshots made without blocking the loop. A Snapshot request becomes a
 * job: the central heaps and the device's trace ring are copied at once
 * (allocator/snapshot.h's gm_snapshot_data_t), every local session in view
 * is sent a SnapshotQuery, and the job waits until all have answered
 * (SnapshotAnswer packets) or its deadline passes. It is then rendered off
 * the loop (the host's queue_work), and answered: a local session that did
 * not answer in time, or whose answer failed the checks, appears with its
 * granted segments only, marked. Answers are untrusted: bounded in size,
 * validated against what the session was granted, and never touch quotas
 * or statistics. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "metrics.h"
#include "request.h"

typedef struct gm_snapshot_limits {
        uint32_t answer_timeout_ms; /* a local session's time to answer */
        uint64_t user_max_bytes;    /* a non-admin's snapshot file, at most (0: no limit) */
        uint64_t user_max_entries;  /* segments + blocks + trace entries in a non-admin's (0: no limit) */
        uint64_t answer_max_bytes;  /* one local session's answer, at most */
        uint32_t max_jobs;          /* snapshots under way at once (one per connection) */
} gm_snapshot_limits_t;

#define GM_SNAPSHOT_DEFAULT_LIMITS                                \
        ((gm_snapshot_limits_t){.answer_timeout_ms = 1000,        \
                                .user_max_bytes = 256ull << 20,   \
                                .user_max_entries = 1000000,      \
                                .answer_max_bytes = 512ull << 20, \
                                .max_jobs = 4})

typedef struct gm_snapjob gm_snapjob_t;

struct gm_snapjobs {
        gm_snapjob_t *jobs; /* under way */
        uint32_t n_jobs;
        uint64_t next_query_id;
        gm_snapshot_limits_t limits;
        gm_snapshot_counters_t counters;
};

/* The Snapshot request (table handler). */
int gm_req_snapshot_handle(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
/* A local session's SnapshotAnswer packet (table handler). */
int gm_req_snapshot_answer(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env);
/* Periodic: jobs whose deadline passed are rendered with what came. */
void gm_req_snapshot_tick(const gm_requests_t *rq, uint64_t now_ms);
/* A connection ends: its jobs lose their asker, its answers are not awaited. */
void gm_req_snapshot_conn_end(gm_request_conn_t *c);
/* At stop: frees jobs that wait for answers (those being rendered finish). */
void gm_req_snapshot_free_all(const gm_requests_t *rq);
