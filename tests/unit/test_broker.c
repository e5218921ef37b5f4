/* The broker in process, on a fake backend and a fake host: quotas, reclaim
 * and parking (central allocations and local sessions' grants alike, with
 * unresponsive clients), release batches, grants without a heap, a reply that
 * could not be built, re-attach and ledger replay. gm_broker_check() runs after every
 * step (CHECK), and a deliberately broken invariant must be caught. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker-internal.h"
#include "piece.h"
#include "clock.h"
#include "testutil.h"

#define MiB (1ull << 20)

/* ---- a fake backend: real fds (of /dev/null), counted bytes ---- */

static unsigned create_fails_in_; /* the backend create that many calls from now fails with -EIO (0: none) */

static int fake_create(gm_backend_t *b, uint64_t size, gm_phys_t *ret) {
        if (create_fails_in_ && --create_fails_in_ == 0)
                return -EIO;
        if (size > b->capacity - b->in_use)
                return -ENOMEM;
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        b->in_use += size;
        *ret = (gm_phys_t){.fd = fd, .size = size, .handle = 0};
        return 0;
}

static void fake_release(gm_backend_t *b, gm_phys_t *phys) {
        ck_assert_uint_ge(b->in_use, phys->size);
        b->in_use -= phys->size;
        ck_assert_int_eq(close(phys->fd), 0);
        phys->fd = -1;
}

static int fake_adopt(gm_backend_t *b, int fd, uint64_t size, gm_phys_t *ret) {
        b->in_use += size;
        *ret = (gm_phys_t){.fd = fd, .size = size, .handle = 0};
        return 0;
}

static int fake_mem_info(gm_backend_t *b, uint64_t *ret_free, uint64_t *ret_total) {
        *ret_free = b->capacity - b->in_use;
        *ret_total = b->capacity;
        return 0;
}

static void fake_destroy(gm_backend_t *b) {
}

/* Per piece, as the host backend answers: nobody maps what was given back. */
static int fake_mapped(gm_backend_t *b, const gm_phys_t *phys) {
        return 0;
}

/* As the host backend's seals: -EBUSY while freeze_busy_ (a writable
 * mapping left somewhere). */
static bool freeze_busy_;
static int fake_freeze(gm_backend_t *b, const gm_phys_t *phys) {
        return freeze_busy_ ? -EBUSY : 0;
}

static const gm_backend_ops_t fake_backend_ops = {
        .name = "fake",
        .caps = &gm_kind_cuda_caps, /* frees need stream fences, as on a device */
        .create = fake_create,
        .release = fake_release,
        .adopt = fake_adopt,
        .mem_info = fake_mem_info,
        .mapped = fake_mapped,
        .freeze = fake_freeze,
        .destroy = fake_destroy,
};

/* The same backend with a driver's per-process figure (as NVML gives on
 * cuda) instead of a per-piece answer: figure_ for pid figure_pid_. */
static uint64_t figure_;
static pid_t figure_pid_;

static int fake_process_bytes(gm_backend_t *b, int pid, uint64_t *ret_bytes) {
        *ret_bytes = pid == (int) figure_pid_ ? figure_ : 0;
        return 0;
}

static const gm_backend_ops_t figured_backend_ops = {
        .name = "fake-figured",
        .caps = &gm_kind_cuda_caps,
        .create = fake_create,
        .release = fake_release,
        .adopt = fake_adopt,
        .process_bytes = fake_process_bytes,
        .mem_info = fake_mem_info,
        .destroy = fake_destroy,
};

/* ---- a fake host: what the daemon would send, store and log ---- */

#define MAX_RELEASES 64
#define MAX_RANGES 64
#define MAX_DONE 16
#define MAX_STORED 64

typedef struct sent_release {
        gm_session_t *session;
        uint64_t id;
        size_t n;
        gm_release_range_t ranges[MAX_RANGES];
} sent_release_t;

typedef struct host {
        sent_release_t releases[MAX_RELEASES];
        size_t n_releases;
        struct {
                gm_session_t *session;
                uint64_t request_id;
                gm_outcome_t outcome;
        } done[MAX_DONE];
        size_t n_done;
        struct {
                char name[GM_STORE_NAME_MAX];
                int fd; /* a duplicate: the store's own reference */
        } stored[MAX_STORED];
        size_t n_stored;
        unsigned removed_unknown; /* store removals of names never stored */
        char last_log[1024];
        struct {
                gm_session_t *session;
                uint64_t id, bytes;
        } reclaims[MAX_RELEASES];
        size_t n_reclaims;
        struct {
                const gm_session_t *session;
                uint64_t active; /* what its client's page says is in use */
        } views[8];
        size_t n_views;
        int unresponsive; /* markings minus recoveries */
} host_t;

static int host_send_release(void *userdata, gm_session_t *s, uint64_t release_id, const gm_release_range_t *ranges,
                             size_t n) {
        host_t *h = userdata;
        ck_assert_uint_lt(h->n_releases, MAX_RELEASES);
        ck_assert_uint_le(n, MAX_RANGES);
        sent_release_t *r = &h->releases[h->n_releases++];
        r->session = s;
        r->id = release_id;
        r->n = n;
        memcpy(r->ranges, ranges, n * sizeof(*ranges));
        return 0;
}

static void host_alloc_done(void *userdata, gm_session_t *s, uint64_t request_id, const gm_outcome_t *out) {
        host_t *h = userdata;
        ck_assert_uint_lt(h->n_done, MAX_DONE);
        h->done[h->n_done].session = s;
        h->done[h->n_done].request_id = request_id;
        h->done[h->n_done].outcome = *out;
        h->n_done++;
        if (out->kind == GM_OUTCOME_REPLY)
                gm_session_central_pieces_sent(s); /* as the daemon does once the reply is out */
}

static int host_send_reclaim(void *userdata, gm_session_t *s, uint64_t reclaim_id, uint64_t bytes) {
        host_t *h = userdata;
        ck_assert_uint_lt(h->n_reclaims, MAX_RELEASES);
        h->reclaims[h->n_reclaims].session = s;
        h->reclaims[h->n_reclaims].id = reclaim_id;
        h->reclaims[h->n_reclaims].bytes = bytes;
        h->n_reclaims++;
        return 0;
}

static void host_client_view(void *userdata, const gm_session_t *s, gm_client_view_t *ret) {
        host_t *h = userdata;
        *ret = (gm_client_view_t){0};
        for (size_t i = 0; i < h->n_views; i++)
                if (h->views[i].session == s)
                        ret->session_active = ret->session_allocated = h->views[i].active;
}

static void host_unresponsive(void *userdata, gm_session_t *s, bool unresponsive) {
        host_t *h = userdata;
        ck_assert_int_eq(s->unresponsive, unresponsive);
        h->unresponsive += unresponsive ? 1 : -1;
}

static int host_store_add(void *userdata, int fd, const char *name) {
        host_t *h = userdata;
        ck_assert_uint_lt(h->n_stored, MAX_STORED);
        snprintf(h->stored[h->n_stored].name, sizeof(h->stored[0].name), "%s", name);
        h->stored[h->n_stored].fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        ck_assert_int_ge(h->stored[h->n_stored].fd, 0);
        h->n_stored++;
        return 0;
}

static void host_store_remove(void *userdata, const char *name) {
        host_t *h = userdata;
        for (size_t i = 0; i < h->n_stored; i++)
                if (strcmp(h->stored[i].name, name) == 0) {
                        close(h->stored[i].fd);
                        h->stored[i] = h->stored[--h->n_stored];
                        return;
                }
        h->removed_unknown++;
}

static void host_log(void *userdata, int priority, const char *message) {
        host_t *h = userdata;
        snprintf(h->last_log, sizeof(h->last_log), "%s", message);
}

/* ---- fixture ---- */

static gm_backend_t backend_;
static host_t host_;
static gm_broker_t *b_;
static char dir_[64], ledger_[128];

#define CHECK(b)                                                                     \
        do {                                                                         \
                char why_[512];                                                      \
                int n_ = gm_broker_check((b), why_, sizeof(why_));                   \
                ck_assert_msg(n_ == 0, "%d broker invariants broken: %s", n_, why_); \
        } while (0)

static gm_broker_t *broker_new(const char *alloc_conf, uint32_t store_max) {
        gm_alloc_config_t conf;
        char err[256];
        ck_assert_int_eq(gm_alloc_config_parse(alloc_conf, &conf, err, sizeof(err)), 0);
        gm_broker_params_t params = {
                .backend = &backend_,
                .alloc_config = &conf,
                .limits =
                        {
                                .max_blocks_per_session = 1000,
                                .max_parked_per_session = 8,
                                .park_timeout_ms = 60000,
                                .release_timeout_ms = 60000,
                                .reattach_grace_ms = 60000,
                                .max_reattach_items = 1000,
                                .max_ranges_per_release = 2,
                        },
                .ops =
                        {
                                .send_release = host_send_release,
                                .alloc_done = host_alloc_done,
                                .send_reclaim = host_send_reclaim,
                                .client_view = host_client_view,
                                .unresponsive = host_unresponsive,
                                .store_add = host_store_add,
                                .store_remove = host_store_remove,
                                .log = host_log,
                                .userdata = &host_,
                        },
                .store_max = store_max,
        };
        gm_broker_t *b;
        ck_assert_int_eq(gm_broker_new(&params, &b), 0);
        CHECK(b);
        return b;
}

static void setup(void) {
        backend_ = (gm_backend_t){.ops = &fake_backend_ops, .capacity = 256 * MiB, .granularity = 2 * MiB};
        memset(&host_, 0, sizeof(host_));
        create_fails_in_ = 0;
        freeze_busy_ = false;
        snprintf(dir_, sizeof(dir_), "/tmp/gm-broker-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(dir_));
        snprintf(ledger_, sizeof(ledger_), "%s/ledger", dir_);
        b_ = broker_new(NULL, 0);
}

static void teardown(void) {
        b_ = gm_broker_free(b_);
        ck_assert_uint_eq(backend_.in_use, 0); /* nothing leaked */
        for (size_t i = 0; i < host_.n_stored; i++)
                close(host_.stored[i].fd);
        unlink(ledger_);
        rmdir(dir_);
}

static gm_session_t *session(gm_broker_t *b, uid_t uid, const char *tenant) {
        gm_session_params_t params = {.pid = 100 + (pid_t) uid, .uid = uid};
        gm_session_t *s;
        ck_assert_int_eq(gm_session_new(b, &params, &s), 0);
        ck_assert_int_eq(gm_session_start(s, tenant, NULL), 0);
        CHECK(b);
        return s;
}

/* An allocation that must be answered at once; returns the block id. */
static uint64_t alloc_ok(gm_session_t *s, uint64_t size) {
        gm_outcome_t out;
        gm_broker_alloc(s, 1, size, 0, NULL, 0, &out);
        ck_assert_msg(out.kind == GM_OUTCOME_REPLY, "alloc of %llu: kind %d: %s", (unsigned long long) size, out.kind,
                      out.message);
        gm_session_central_pieces_sent(s);
        CHECK(s->broker);
        return out.alloc.block_id;
}

/* What the client of local session `s` says it uses of its pieces. */
static void client_uses(const gm_session_t *s, uint64_t active) {
        for (size_t i = 0; i < host_.n_views; i++)
                if (host_.views[i].session == s) {
                        host_.views[i].active = active;
                        return;
                }
        ck_assert_uint_lt(host_.n_views, 8);
        host_.views[host_.n_views].session = s;
        host_.views[host_.n_views++].active = active;
}

static gm_session_t *local_session(gm_broker_t *b, uid_t uid, const char *tenant) {
        gm_session_t *s = session(b, uid, tenant);
        ck_assert_int_eq(gm_session_local_enable(s), 0);
        CHECK(b);
        return s;
}

/* A grant of a whole segment of `size` bytes. */
static gm_grant_t whole(uint64_t segment_id, uint64_t size) {
        return (gm_grant_t){.piece = {.segment_id = segment_id, .segment_va_size = size, .size = size},
                            .block_size = size};
}

static const gm_piece_t *grant_ok(gm_session_t *s, uint64_t segment_id, uint64_t size) {
        gm_outcome_t out;
        gm_grant_t g = whole(segment_id, size);
        gm_broker_grant(s, 1, &g, &out);
        ck_assert_msg(out.kind == GM_OUTCOME_REPLY, "grant of %llu: kind %d: %s", (unsigned long long) size, out.kind,
                      out.message);
        ck_assert_uint_eq(out.n_pieces, 1);
        ck_assert(out.pieces[0]->granted);
        CHECK(s->broker);
        return out.pieces[0];
}

static void return_whole(gm_session_t *s, uint64_t segment_id, uint64_t size) {
        gm_release_range_t r = {.segment_id = segment_id, .offset = 0, .length = size};
        size_t bad = 99;
        ck_assert_uint_eq(gm_broker_return_pieces(s, &r, 1, &bad), 0);
        CHECK(s->broker);
}

/* A tick past every parked request's timeout (the timeout is restored). */
static void expire_parked(void) {
        gm_broker_limits_t limits = b_->limits, expired = limits;
        expired.park_timeout_ms = 0;
        gm_broker_set_limits(b_, &expired);
        gm_broker_tick(b_, gm_now_ms());
        gm_broker_set_limits(b_, &limits);
        CHECK(b_);
}

static void ack_all(gm_session_t *s) {
        for (size_t i = 0; i < host_.n_releases; i++)
                if (host_.releases[i].session == s && host_.releases[i].id) {
                        ck_assert_int_eq(gm_broker_release_ack(s, host_.releases[i].id, NULL, 0), 0);
                        host_.releases[i].id = 0;
                        CHECK(s->broker);
                }
}

/* ---- tests ---- */

START_TEST(test_quota_refuses_and_charges_exactly) {
        gm_tenant_t *t = gm_tenant_get(b_, "team");
        ck_assert_ptr_nonnull(t);
        gm_tenant_set_quota(t, GM_QUOTA_CONFIG, true, 40 * MiB);
        ck_assert_str_eq(gm_tenant_quota_source(t), "config");
        gm_tenant_set_quota(t, GM_QUOTA_RUNTIME, true, 0); /* explicitly unlimited wins */
        ck_assert_uint_eq(t->quota, 0);
        gm_tenant_set_quota(t, GM_QUOTA_RUNTIME, false, 0);
        ck_assert_uint_eq(t->quota, 40 * MiB);

        gm_session_t *a = session(b_, 1000, "team"), *c = session(b_, 1001, "team");
        alloc_ok(a, 20 * MiB); /* a 20 MiB segment */
        ck_assert_uint_eq(t->charged_bytes, 20 * MiB);
        alloc_ok(c, 20 * MiB);
        ck_assert_uint_eq(t->charged_bytes, 40 * MiB);
        ck_assert_uint_eq(t->sessions, 2);

        gm_outcome_t out;
        gm_broker_alloc(c, 7, 20 * MiB, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(out.error, -EDQUOT);
        ck_assert_msg(strstr(out.message, "team") && strstr(out.message, "quota"), "message: %s", out.message);
        CHECK(b_);

        /* A size beyond the device, and size 0, are refused with their own errors. */
        gm_broker_alloc(c, 8, 1ull << 40, 0, NULL, 0, &out);
        ck_assert_int_eq(out.error, -ENOMEM);
        ck_assert_ptr_nonnull(strstr(out.message, "capacity"));
        gm_broker_alloc(c, 9, 0, 0, NULL, 0, &out);
        ck_assert_int_eq(out.error, -EINVAL);
        CHECK(b_);

        gm_session_free(a);
        CHECK(b_);
        ck_assert_uint_eq(t->charged_bytes, 20 * MiB);
        ck_assert_uint_eq(t->sessions, 1);
        ck_assert_uint_eq(backend_.in_use, 20 * MiB);
}
END_TEST

START_TEST(test_reclaim_parks_until_the_ack) {
        backend_.capacity = 40 * MiB;
        gm_session_t *idle = session(b_, 1000, "a"), *busy = session(b_, 1001, "b");
        uint64_t blk = alloc_ok(idle, 20 * MiB);
        alloc_ok(idle, 20 * MiB);
        ck_assert_int_eq(gm_session_central_free_block(idle, blk, false), 0); /* cached in idle's heap */
        CHECK(b_);

        /* The device is full: idle is asked for its cache, busy waits. */
        gm_outcome_t out;
        gm_broker_alloc(busy, 42, 20 * MiB, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        CHECK(b_);
        ck_assert_uint_eq(host_.n_releases, 1);
        ck_assert_ptr_eq(host_.releases[0].session, idle);
        ck_assert_uint_eq(host_.releases[0].n, 1);
        ck_assert(host_.releases[0].ranges[0].whole_segment);
        ck_assert_uint_eq(b_->releasing_bytes, 20 * MiB);
        ck_assert_uint_eq(idle->tenant->charged_bytes, 40 * MiB); /* still charged until the ack */
        ck_assert_uint_eq(busy->n_parked, 1);

        /* A later request of the same session queues behind it. */
        gm_broker_alloc(busy, 43, 1 * MiB, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        ck_assert_uint_eq(busy->n_parked, 2);
        CHECK(b_);

        ack_all(idle);
        ck_assert_uint_eq(idle->tenant->charged_bytes, 20 * MiB);
        /* 42 fits now; 43 then finds the device full with no help coming. */
        ck_assert_uint_eq(host_.n_done, 2);
        ck_assert_uint_eq(host_.done[0].request_id, 42);
        ck_assert_int_eq(host_.done[0].outcome.kind, GM_OUTCOME_REPLY);
        ck_assert_uint_eq(host_.done[1].request_id, 43);
        ck_assert_int_eq(host_.done[1].outcome.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(host_.done[1].outcome.error, -ENOMEM);
        ck_assert_uint_eq(busy->tenant->charged_bytes, 20 * MiB);
        ck_assert_uint_eq(busy->n_parked, 0);

        /* An unknown ack is refused. */
        ck_assert_int_eq(gm_broker_release_ack(idle, 999, NULL, 0), -ENOENT);

        /* Past the park timeout, the tick refuses what still waits. */
        for (const gm_piece_t *p = idle->pieces; p; p = p->next)
                ck_assert_int_eq(p->state, GM_PIECE_LIVE);
        ck_assert_uint_eq(gm_heap_live_blocks(idle->heap), 1);
        gm_session_central_trim(idle); /* nothing cached: the live block stays */
        gm_broker_alloc(busy, 44, 20 * MiB, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE); /* nobody can help */
        uint64_t second = host_.done[0].outcome.alloc.block_id;
        ck_assert_int_eq(gm_session_central_free_block(busy, second, false), 0);
        gm_session_t *third = session(b_, 1002, "c");
        gm_broker_alloc(third, 45, 20 * MiB, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK); /* busy's cache is on its way */
        CHECK(b_);
        expire_parked();
        ck_assert_uint_eq(host_.n_done, 3);
        ck_assert_uint_eq(host_.done[2].request_id, 45);
        ck_assert_int_eq(host_.done[2].outcome.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(host_.done[2].outcome.error, -ENOMEM);
        ck_assert_uint_eq(third->n_parked, 0);
        ack_all(busy);
        ck_assert_uint_eq(busy->tenant->charged_bytes, 0);
}
END_TEST

/* An allocation on a stream its client captures (Alloc.capturing): its
 * heap's ladder releases none of the session's own cache (its release
 * would reach the capturing client), other sessions are asked instead and
 * the request parks with the flag kept; once their memory is back it gets
 * new memory, its cache still where it was. */
START_TEST(test_capturing_alloc_keeps_its_own_cache) {
        backend_.capacity = 50 * MiB;
        gm_session_t *idle = session(b_, 1000, "a"), *cap = session(b_, 1001, "b");
        ck_assert_int_eq(gm_session_central_free_block(idle, alloc_ok(idle, 20 * MiB), false), 0);
        ck_assert_int_eq(gm_session_central_free_block(cap, alloc_ok(cap, 20 * MiB), false), 0);
        CHECK(b_);

        gm_outcome_t out;
        gm_broker_alloc_tagged(cap, 42, 30 * MiB, 7, "", true, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        CHECK(b_);
        ck_assert_uint_eq(host_.n_releases, 1); /* idle's cache only */
        ck_assert_ptr_eq(host_.releases[0].session, idle);
        ck_assert_ptr_null(cap->rel_head);
        ck_assert_int_eq(gm_heap_stats(cap->heap)->reserved_bytes[GM_STAT_ALL].current, 20 * MiB);
        ck_assert_uint_eq(cap->n_parked, 1);
        ck_assert(cap->parked->rq.capturing);

        ack_all(idle);
        ck_assert_uint_eq(host_.n_done, 1);
        ck_assert_int_eq(host_.done[0].outcome.kind, GM_OUTCOME_REPLY);
        ck_assert_uint_eq(host_.n_releases, 1);
        ck_assert_int_eq(gm_heap_stats(cap->heap)->reserved_bytes[GM_STAT_ALL].current, 50 * MiB);
        ck_assert_int_eq(gm_heap_stats(cap->heap)->allocated_bytes[GM_STAT_ALL].current, 30 * MiB);
        CHECK(b_);

        /* The same miss not captured (another stream: the cached block does
         * not serve it): the ladder gives the own cache back, asked of its
         * client at once, and the request waits for the acknowledgement. */
        gm_broker_alloc_tagged(cap, 43, 20 * MiB, 8, "", false, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        ck_assert_ptr_null(cap->rel_head);
        ck_assert_uint_eq(host_.n_releases, 2);
        ck_assert_ptr_eq(host_.releases[1].session, cap);
        ck_assert_int_eq(gm_heap_stats(cap->heap)->reserved_bytes[GM_STAT_ALL].current, 30 * MiB);
        CHECK(b_);
        ack_all(cap);
        ck_assert_uint_eq(host_.n_done, 2);
        ck_assert_int_eq(host_.done[1].outcome.kind, GM_OUTCOME_REPLY);
        ck_assert_int_eq(gm_heap_stats(cap->heap)->reserved_bytes[GM_STAT_ALL].current, 50 * MiB);
}
END_TEST

/* A miss that fits only once the session's own cached segments are
 * released (2 x 20 MiB cached, 50 MiB device, 30 MiB asked; PyTorch frees
 * its cache and serves it): the request parks on its own ReleaseRequest and
 * is served at the ReleaseAck, with one retry counted and no OOM (nor a
 * reclaim wait: no other session's memory was awaited). A release
 * never acknowledged refuses it at park_timeout_ms, saying so. */
START_TEST(test_miss_waits_for_its_own_cache_release) {
        backend_.capacity = 50 * MiB;
        gm_session_t *s = session(b_, 1000, "a");
        uint64_t x = alloc_ok(s, 20 * MiB), y = alloc_ok(s, 20 * MiB);
        ck_assert_int_eq(gm_session_central_free_block(s, x, false), 0);
        ck_assert_int_eq(gm_session_central_free_block(s, y, false), 0);

        gm_outcome_t out;
        gm_broker_alloc(s, 42, 30 * MiB, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        CHECK(b_);
        ck_assert_uint_eq(host_.n_releases, 1); /* its own two segments, sent at once */
        ck_assert_ptr_eq(host_.releases[0].session, s);
        ck_assert_uint_eq(s->releasing_bytes, 40 * MiB);
        ck_assert_uint_eq(s->tenant->charged_bytes, 40 * MiB); /* until the client unmapped them */
        ack_all(s);
        ck_assert_uint_eq(host_.n_done, 1);
        ck_assert_uint_eq(host_.done[0].request_id, 42);
        ck_assert_int_eq(host_.done[0].outcome.kind, GM_OUTCOME_REPLY);
        ck_assert_uint_eq(s->tenant->charged_bytes, 30 * MiB);
        const gm_stats_t *st = gm_heap_stats(s->heap);
        ck_assert_int_eq(st->num_alloc_retries, 1);
        ck_assert_int_eq(st->num_reclaim_waits, 0); /* its own ladder: no other session's memory */
        ck_assert_int_eq(st->num_ooms, 0);

        /* Its 30 MiB cached again; 40 fits only once it is released, and
         * the client never acknowledges: refused at the park timeout. */
        ck_assert_int_eq(gm_session_central_free_block(s, host_.done[0].outcome.alloc.block_id, false), 0);
        gm_broker_alloc(s, 43, 40 * MiB, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        ck_assert_uint_eq(host_.n_releases, 2);
        expire_parked();
        ck_assert_uint_eq(host_.n_done, 2);
        ck_assert_int_eq(host_.done[1].outcome.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(host_.done[1].outcome.error, -ENOMEM);
        ck_assert_msg(strstr(host_.done[1].outcome.message,
                             "30.00 MiB of this session's own cache was released, but its client has not "
                             "acknowledged unmapping it (ReleaseAck)"),
                      "%s", host_.done[1].outcome.message);
        ck_assert_uint_eq(s->tenant->charged_bytes, 30 * MiB);
        ack_all(s);
        ck_assert_uint_eq(s->tenant->charged_bytes, 0);
}
END_TEST

START_TEST(test_unacknowledged_release_is_asked_again) {
        gm_session_t *s = session(b_, 1000, "a");
        uint64_t blk = alloc_ok(s, 20 * MiB);
        ck_assert_int_eq(gm_session_central_free_block(s, blk, false), 0);
        ck_assert_uint_eq(gm_session_central_trim(s), 20 * MiB);
        CHECK(b_);
        ck_assert_uint_eq(host_.n_releases, 1);
        gm_broker_limits_t limits = b_->limits;
        limits.release_timeout_ms = 0;
        gm_broker_set_limits(b_, &limits);
        gm_broker_tick(b_, gm_now_ms() + 1);
        CHECK(b_);
        ck_assert_uint_eq(host_.n_releases, 2); /* the same release again */
        ck_assert_uint_eq(host_.releases[1].id, host_.releases[0].id);
        ck_assert_ptr_nonnull(strstr(host_.last_log, "has not acknowledged"));
        ck_assert_uint_eq(s->tenant->charged_bytes, 20 * MiB);
        host_.releases[1].id = 0;
        ack_all(s);
        ck_assert_uint_eq(s->tenant->charged_bytes, 0);
        ck_assert_uint_eq(backend_.in_use, 0);
}
END_TEST

/* One release of a fresh 20 MiB segment of s, trimmed; its id. `counted`:
 * the driver counts the client's mapping of it in its figure. */
static uint64_t release_one(gm_session_t *s, bool counted) {
        uint64_t blk = alloc_ok(s, 20 * MiB);
        if (counted)
                figure_ += 20 * MiB; /* its client maps it */
        ck_assert_int_eq(gm_session_central_free_block(s, blk, false), 0);
        size_t before = host_.n_releases;
        ck_assert_uint_eq(gm_session_central_trim(s), 20 * MiB);
        ck_assert_uint_eq(host_.n_releases, before + 1);
        return host_.releases[before].id;
}

/* A fresh broker on the figured backend and one session (local or central)
 * of tenant "a" whose process the driver gives `figure` bytes (its context
 * and its own allocations). */
static gm_session_t *figured_session(bool local, uint64_t figure) {
        b_ = gm_broker_free(b_);
        backend_.ops = &figured_backend_ops;
        b_ = broker_new(NULL, 0);
        gm_session_t *s = local ? local_session(b_, 1000, "a") : session(b_, 1000, "a");
        figure_pid_ = s->pid;
        figure_ = figure;
        return s;
}

/* Where the backend cannot tell per piece, the driver's per-process figure
 * decides: memory shown to have left the process is released; a process
 * whose figure keeps what it acknowledged (once one release has shown the
 * driver counting mappings) is a liar, and its memory stays charged while the
 * driver lists the process; anything else stays charged until the session
 * ends (issue #17: the client's word alone is not taken). */
START_TEST(test_release_checked_by_process_figure) {
        gm_session_t *s = figured_session(false, 300 * MiB);
        gm_tenant_t *t = s->tenant;

        /* A driver that does not count what a process maps: nothing shows the
         * release, so it stays charged (held, not a liar). */
        uint64_t id = release_one(s, false);
        ck_assert_int_eq(gm_broker_release_ack(s, id, NULL, 0), 0);
        ck_assert(!b_->driver_attributes_mappings && !s->lied);
        ck_assert_uint_eq(t->charged_bytes, 20 * MiB);
        ck_assert_uint_eq(t->release_unverified_bytes, 20 * MiB);
        ck_assert_uint_eq(s->release_unverified_bytes, 20 * MiB);
        ck_assert_uint_eq(backend_.in_use, 20 * MiB);
        ck_assert_ptr_nonnull(strstr(host_.last_log, "stays charged until the session ends"));
        CHECK(b_);

        /* An honest acknowledgement shows the figure dropping: released at
         * once (and the driver shown to count mappings); the held one stays. */
        id = release_one(s, true);
        figure_ -= 20 * MiB;
        ck_assert_int_eq(gm_broker_release_ack(s, id, NULL, 0), 0);
        ck_assert(b_->driver_attributes_mappings && !s->lied);
        ck_assert_uint_eq(t->charged_bytes, 20 * MiB);
        ck_assert_uint_eq(t->release_unverified_bytes, 20 * MiB);

        /* Other allocations of the process meanwhile, or part of it kept: the
         * figure dropped by less than was acknowledged. Held, not a liar. */
        id = release_one(s, true);
        figure_ -= 20 * MiB;
        figure_ += 8 * MiB;
        ck_assert_int_eq(gm_broker_release_ack(s, id, NULL, 0), 0);
        ck_assert(!s->lied);
        ck_assert_uint_eq(t->charged_bytes, 40 * MiB);
        ck_assert_uint_eq(t->release_unverified_bytes, 40 * MiB);
        CHECK(b_);

        /* A liar: its figure keeps all it acknowledged. */
        id = release_one(s, true);
        ck_assert_int_eq(gm_broker_release_ack(s, id, NULL, 0), -EBUSY);
        ck_assert(s->lied);
        ck_assert_ptr_nonnull(strstr(host_.last_log, "the driver still counts"));
        ck_assert_uint_eq(t->release_unverified_bytes, 40 * MiB);
        gm_session_end(s);
        CHECK(b_);
        /* A liar's memory, held unverified or not, stays while its process
         * holds device memory. */
        ck_assert_uint_eq(t->release_unverified_bytes, 0);
        ck_assert_uint_eq(t->charged_bytes, 60 * MiB);
        ck_assert_uint_eq(backend_.in_use, 60 * MiB);
        gm_broker_tick(b_, gm_now_ms());
        ck_assert_uint_eq(t->charged_bytes, 60 * MiB);
        figure_ = 0; /* it exited */
        gm_broker_tick(b_, gm_now_ms());
        CHECK(b_);
        ck_assert_uint_eq(t->charged_bytes, 0);
        ck_assert_uint_eq(backend_.in_use, 0);
        gm_session_free(s);

        /* An honest session's held release ends with the session. */
        s = session(b_, 1000, "a");
        figure_pid_ = s->pid;
        figure_ = 300 * MiB;
        b_->driver_attributes_mappings = false;
        id = release_one(s, false);
        ck_assert_int_eq(gm_broker_release_ack(s, id, NULL, 0), 0);
        ck_assert_uint_eq(t->charged_bytes, 20 * MiB);
        gm_session_end(s);
        CHECK(b_);
        ck_assert_uint_eq(t->charged_bytes, 0);
        ck_assert_uint_eq(t->release_unverified_bytes, 0);
        ck_assert_uint_eq(backend_.in_use, 0);
        gm_session_free(s);
        backend_.ops = &fake_backend_ops;
}
END_TEST

/* A release asked while an earlier one of the same process is under way
 * (its client unmapped, its ack not in yet) is judged against the earlier
 * one's reference: a reading then would be short of the first release's
 * bytes, and the second honest ack would look kept. */
START_TEST(test_release_during_release_keeps_reference) {
        gm_session_t *s = figured_session(false, 300 * MiB);
        gm_tenant_t *t = s->tenant;
        b_->driver_attributes_mappings = true; /* confirmed before: a kept release would read as a lie */
        uint64_t a = alloc_ok(s, 20 * MiB), c = alloc_ok(s, 20 * MiB);
        figure_ += 40 * MiB; /* its client maps both */
        ck_assert_int_eq(gm_session_central_free_block(s, a, false), 0);
        ck_assert_uint_eq(gm_session_central_trim(s), 20 * MiB);
        uint64_t first = host_.releases[host_.n_releases - 1].id;
        figure_ -= 20 * MiB; /* the client unmaps the first; its ack is on the way */
        ck_assert_int_eq(gm_session_central_free_block(s, c, false), 0);
        ck_assert_uint_eq(gm_session_central_trim(s), 20 * MiB);
        uint64_t second = host_.releases[host_.n_releases - 1].id;
        ck_assert_uint_ne(first, second);
        ck_assert_int_eq(gm_broker_release_ack(s, first, NULL, 0), 0);
        figure_ -= 20 * MiB;
        ck_assert_int_eq(gm_broker_release_ack(s, second, NULL, 0), 0);
        CHECK(b_);
        ck_assert(!s->lied);
        ck_assert_uint_eq(t->release_unverified_bytes, 0);
        ck_assert_uint_eq(t->charged_bytes, 0);
        gm_session_end(s);
        gm_session_free(s);
        backend_.ops = &fake_backend_ops;
}
END_TEST

/* A release's reference noted while another segment's reply is on its way
 * to the same process (sent, not mapped yet) is short of that segment: the
 * honest ack then reads as grown by it. Growth up to the memory in flight is
 * held, not taken for a lie; beyond it, a lie is still caught. */
START_TEST(test_release_with_reply_in_flight_not_a_lie) {
        gm_session_t *s = figured_session(false, 300 * MiB);
        gm_tenant_t *t = s->tenant;
        b_->driver_attributes_mappings = true;
        uint64_t a = alloc_ok(s, 20 * MiB);
        figure_ += 20 * MiB;                /* mapped */
        uint64_t c = alloc_ok(s, 20 * MiB); /* its reply is on the way: not mapped yet */
        ck_assert_int_eq(gm_session_central_free_block(s, a, false), 0);
        ck_assert_uint_eq(gm_session_central_trim(s), 20 * MiB);
        uint64_t id = host_.releases[host_.n_releases - 1].id;
        figure_ += 20 * MiB; /* the client maps c, */
        figure_ -= 20 * MiB; /* unmaps a and acknowledges */
        ck_assert_int_eq(gm_broker_release_ack(s, id, NULL, 0), 0);
        CHECK(b_);
        ck_assert(!s->lied);
        ck_assert_uint_eq(t->release_unverified_bytes, 20 * MiB);
        ck_assert_uint_eq(t->charged_bytes, 40 * MiB);

        /* Nothing else in flight: an honest ack is gone, a kept one a lie. */
        uint64_t d = alloc_ok(s, 20 * MiB);
        figure_ += 20 * MiB; /* mapped */
        ck_assert_int_eq(gm_session_central_free_block(s, c, false), 0);
        ck_assert_uint_eq(gm_session_central_trim(s), 20 * MiB);
        id = host_.releases[host_.n_releases - 1].id;
        figure_ -= 20 * MiB; /* unmaps c */
        ck_assert_int_eq(gm_broker_release_ack(s, id, NULL, 0), 0);
        ck_assert(!s->lied);
        ck_assert_uint_eq(t->release_unverified_bytes, 20 * MiB); /* a's, as before */
        ck_assert_uint_eq(t->charged_bytes, 40 * MiB);
        ck_assert_int_eq(gm_session_central_free_block(s, d, false), 0);
        ck_assert_uint_eq(gm_session_central_trim(s), 20 * MiB);
        id = host_.releases[host_.n_releases - 1].id;
        ck_assert_int_eq(gm_broker_release_ack(s, id, NULL, 0), -EBUSY); /* still mapped */
        ck_assert(s->lied);
        gm_session_end(s);
        figure_ = 0;
        gm_broker_tick(b_, gm_now_ms());
        CHECK(b_);
        ck_assert_uint_eq(t->charged_bytes, 0);
        gm_session_free(s);
        backend_.ops = &fake_backend_ops;
}
END_TEST

/* A local session's returned pieces are checked as releases are, against
 * the reference noted at its first Grant. */
START_TEST(test_return_checked_by_process_figure) {
        gm_session_t *s = figured_session(true, 100 * MiB);
        gm_tenant_t *t = s->tenant;

        /* Honest: mapped, unmapped, returned: the figure shows it gone. */
        grant_ok(s, 1, 20 * MiB);
        return_whole(s, 1, 20 * MiB);
        ck_assert(b_->driver_attributes_mappings && !s->lied);
        ck_assert_uint_eq(t->charged_bytes, 0);
        ck_assert_uint_eq(backend_.in_use, 0);

        /* Its own allocations meanwhile: the figure did not drop by all of
         * it. Held until the session ends, not a liar. */
        grant_ok(s, 2, 20 * MiB);
        figure_ += 8 * MiB;
        return_whole(s, 2, 20 * MiB);
        ck_assert(!s->lied);
        ck_assert_uint_eq(t->charged_bytes, 20 * MiB);
        ck_assert_uint_eq(t->release_unverified_bytes, 20 * MiB);
        ck_assert_int_eq(s->grants.bytes.current, 0);
        figure_ -= 8 * MiB;

        /* Kept all of it (still mapped): a lie, though an honest return is
         * held meanwhile. */
        grant_ok(s, 3, 20 * MiB);
        figure_ += 20 * MiB;
        gm_release_range_t r = {.segment_id = 3, .offset = 0, .length = 20 * MiB};
        size_t bad = 99;
        ck_assert_uint_eq(gm_broker_return_pieces(s, &r, 1, &bad), 0);
        CHECK(b_);
        ck_assert(s->lied);
        ck_assert_uint_eq(t->charged_bytes, 40 * MiB);
        gm_session_end(s);
        CHECK(b_);
        ck_assert_uint_eq(t->charged_bytes, 40 * MiB); /* a liar's: while its process holds device memory */
        figure_ = 0;
        gm_broker_tick(b_, gm_now_ms());
        CHECK(b_);
        ck_assert_uint_eq(t->charged_bytes, 0);
        ck_assert_uint_eq(backend_.in_use, 0);
        gm_session_free(s);
        backend_.ops = &fake_backend_ops;
}
END_TEST

/* Issue #25, the audit: a return believed on the figure (right at that
 * instant) is audited again on the tick; the process mapping it again (it
 * kept the fds) is charged as audited bytes against its tenant's quota (its
 * grants refused past it, naming them) and the device, until the figure
 * drops; at most
 * GM_AUDIT_SESSIONS_PER_TICK sessions a tick, each every audit_interval_ms;
 * a trusted tenant is not audited, and its unverifiable returns are released
 * at once (issue #23). */
/* A local session whose 20 MiB return its process's figure showed gone,
 * audited every second. */
static gm_session_t *audited_session(void) {
        gm_session_t *s = figured_session(true, 100 * MiB);
        gm_broker_limits_t limits = b_->limits;
        limits.audit_interval_ms = 1000;
        gm_broker_set_limits(b_, &limits);
        grant_ok(s, 1, 20 * MiB);
        return_whole(s, 1, 20 * MiB); /* believed: its figure shows it gone */
        ck_assert(b_->driver_attributes_mappings && !s->lied);
        return s;
}

START_TEST(test_audit_finds_memory_taken_back) {
        gm_session_t *s = audited_session();
        gm_tenant_t *t = s->tenant;
        uint64_t now = gm_now_ms();
        gm_broker_tick(b_, now);
        CHECK(b_);
        ck_assert_uint_eq(t->audited_bytes, 0);
        ck_assert_uint_eq(b_->audit_checks, 1);

        figure_ += 20 * MiB;           /* imports and maps the fd it kept */
        gm_broker_tick(b_, now + 500); /* not due yet */
        ck_assert_uint_eq(t->audited_bytes, 0);
        gm_broker_tick(b_, now + 1000);
        CHECK(b_);
        ck_assert_uint_eq(t->audited_bytes, 20 * MiB);
        ck_assert_uint_eq(b_->audited_bytes, 20 * MiB);
        ck_assert_uint_eq(t->audit_catches, 1);
        ck_assert_uint_eq(t->charged_bytes, 0);
        ck_assert_ptr_nonnull(strstr(host_.last_log, "maps 20.00 MiB of the memory it gave back"));
        gm_tenant_set_quota(t, GM_QUOTA_CONFIG, true, 21 * MiB);
        gm_outcome_t out;
        gm_grant_t g = whole(2, 2 * MiB); /* 0 charged + 20 audited + 2 > 21 */
        gm_broker_grant(s, 9, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(out.error, -EDQUOT);
        ck_assert_ptr_nonnull(strstr(out.message, "20.00 MiB more is device memory this tenant's clients gave back"));
        gm_tenant_set_quota(t, GM_QUOTA_CONFIG, false, 0);
        /* Another tenant's quota and the device count it too. */
        gm_session_t *other = local_session(b_, 1001, "b");
        uint64_t room = backend_.capacity - 20 * MiB;
        g = whole(1, room + 2 * MiB);
        gm_broker_grant(other, 10, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(out.error, -ENOMEM);

        figure_ -= 20 * MiB; /* lets go of it */
        gm_broker_tick(b_, now + 2000);
        CHECK(b_);
        ck_assert_uint_eq(t->audited_bytes, 0);
        ck_assert_uint_eq(b_->audited_bytes, 0);
        grant_ok(s, 3, 2 * MiB);

        /* Trusted: not audited. */
        gm_tenant_set_release_check(t, true, GM_RELEASE_CHECK_TRUST);
        figure_ += 20 * MiB;
        gm_broker_tick(b_, now + 3000);
        ck_assert_uint_eq(t->audited_bytes, 0);
        figure_ -= 20 * MiB;
        gm_session_free(other);
        gm_session_free(s);
        CHECK(b_);

        /* The bound: twelve sessions due, eight audited a tick, the rest next. */
        gm_tenant_set_release_check(t, false, GM_RELEASE_CHECK_VERIFY);
        gm_session_t *many[12];
        for (int i = 0; i < 12; i++) {
                many[i] = local_session(b_, 2000 + (uid_t) i, "a");
                many[i]->audit_based = true;
                many[i]->audit_released = MiB;
        }
        uint64_t checks = b_->audit_checks;
        gm_broker_tick(b_, now + 10000);
        ck_assert_uint_eq(b_->audit_checks - checks, GM_AUDIT_SESSIONS_PER_TICK);
        gm_broker_tick(b_, now + 10100);
        ck_assert_uint_eq(b_->audit_checks - checks, 12);
        gm_broker_tick(b_, now + 10200);
        ck_assert_uint_eq(b_->audit_checks - checks, 12);
        for (int i = 0; i < 12; i++)
                gm_session_free(many[i]);
        CHECK(b_);
        backend_.ops = &fake_backend_ops;
}
END_TEST

/* Issue #23: release_check = trust takes the client's word where the figure
 * cannot verify (here a driver not shown to count mappings): released at
 * once; verify holds it. */
START_TEST(test_trust_releases_unverifiable_return) {
        gm_session_t *s = figured_session(true, 100 * MiB);
        gm_tenant_t *t = s->tenant;
        grant_ok(s, 1, 20 * MiB);
        figure_ += 8 * MiB; /* its own allocation: the figure did not drop by it */
        return_whole(s, 1, 20 * MiB);
        ck_assert_uint_eq(t->release_unverified_bytes, 20 * MiB); /* verify: held */
        gm_tenant_set_release_check(t, true, GM_RELEASE_CHECK_TRUST);
        ck_assert_str_eq(gm_release_check_name(gm_tenant_release_check(b_, t)), "trust");
        grant_ok(s, 2, 20 * MiB);
        return_whole(s, 2, 20 * MiB);
        ck_assert_uint_eq(t->release_unverified_bytes, 20 * MiB); /* the new one released at once */
        ck_assert_uint_eq(t->charged_bytes, 20 * MiB);
        gm_release_check_t check;
        ck_assert_int_eq(gm_release_check_parse("verify", &check), 0);
        ck_assert_int_eq(check, GM_RELEASE_CHECK_VERIFY);
        ck_assert_int_eq(gm_release_check_parse("Trust", &check), -EINVAL);
        gm_session_free(s);
        CHECK(b_);
        backend_.ops = &fake_backend_ops;
}
END_TEST

/* Issue #17, the local reference: a give-back announced by a ReturnIntent
 * is checked against the figure of that moment, so device memory the process
 * allocated itself since its first Grant (noted before) is no lie; while the
 * intent is open neither a Reclaim (sent after the client unmapped, before
 * its return came) nor a second intent renews it. Here the figure counts
 * what the client maps, as a driver does. */
START_TEST(test_return_intent_notes_reference) {
        gm_session_t *s = figured_session(true, 100 * MiB);
        gm_tenant_t *t = s->tenant;
        gm_session_t *central = session(b_, 1001, "a");
        ck_assert_int_eq(gm_session_local_open_return_intent(central), -EPROTO);
        grant_ok(s, 1, 20 * MiB);
        grant_ok(s, 2, 20 * MiB);
        figure_ += 40 * MiB;
        figure_ -= 20 * MiB; /* unmaps piece 1 and returns it: gone, the driver shown counting mappings */
        return_whole(s, 1, 20 * MiB);
        ck_assert(b_->driver_attributes_mappings && !s->lied);
        ck_assert_uint_eq(t->charged_bytes, 20 * MiB);

        figure_ += 30 * MiB; /* its own allocations: kernels, library handles */
        ck_assert_int_eq(gm_session_local_open_return_intent(s), 0);
        ck_assert(s->return_intent_open);
        CHECK(b_);
        ck_assert_int_eq(gm_session_local_open_return_intent(s), -EBUSY);
        figure_ -= 20 * MiB; /* it unmaps piece 2 */
        client_uses(s, 0);
        gm_outcome_t out; /* the device is full: s is sent a Reclaim while its return is on the way */
        gm_broker_alloc(central, 7, 240 * MiB, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        ck_assert_uint_eq(host_.n_reclaims, 1);
        ck_assert_ptr_eq(host_.reclaims[0].session, s);
        return_whole(s, 2, 20 * MiB);
        gm_session_local_close_return_intent(s);
        ck_assert(!s->lied && !s->return_intent_open);
        ck_assert_uint_eq(t->release_unverified_bytes, 0);
        ck_assert_uint_eq(backend_.in_use, 240 * MiB); /* the waiting allocation got it */
        gm_session_end(central);
        gm_session_free(central);
        ck_assert_uint_eq(t->charged_bytes, 0);
        CHECK(b_);

        /* A liar announcing its return is caught as before. */
        grant_ok(s, 3, 20 * MiB);
        figure_ += 20 * MiB;
        ck_assert_int_eq(gm_session_local_open_return_intent(s), 0);
        return_whole(s, 3, 20 * MiB); /* still mapped */
        ck_assert(s->lied);
        ck_assert_uint_eq(t->charged_bytes, 20 * MiB);
        gm_session_end(s);
        figure_ = 0;
        gm_broker_tick(b_, gm_now_ms());
        CHECK(b_);
        ck_assert_uint_eq(t->charged_bytes, 0);
        gm_session_free(s);
        backend_.ops = &fake_backend_ops;
}
END_TEST

/* A release covering more pieces of an expandable segment than one request
 * carries: the piece flagged whole_segment travels in the last batch only. */
START_TEST(test_whole_segment_travels_last) {
        b_ = gm_broker_free(b_);
        b_ = broker_new("expandable_segments:True", 0);
        gm_session_t *s = session(b_, 1000, "a");
        uint64_t blk = alloc_ok(s, 100 * MiB); /* five 20 MiB pages */
        ck_assert_uint_eq(backend_.in_use, 100 * MiB);
        ck_assert_int_eq(gm_session_central_free_block(s, blk, false), 0);
        ck_assert_uint_eq(gm_session_central_trim(s), 100 * MiB);
        CHECK(b_);
        ck_assert_uint_eq(host_.n_releases, 3); /* 2 + 2 + 1 ranges */
        size_t pieces = 0;
        for (size_t i = 0; i < host_.n_releases; i++)
                for (size_t j = 0; j < host_.releases[i].n; j++) {
                        pieces++;
                        bool last = i + 1 == host_.n_releases && j + 1 == host_.releases[i].n;
                        ck_assert_msg(host_.releases[i].ranges[j].whole_segment == last,
                                      "release %zu range %zu: whole_segment %d", i, j,
                                      host_.releases[i].ranges[j].whole_segment);
                }
        ck_assert_uint_eq(pieces, 5);
        ack_all(s);
        ck_assert_uint_eq(backend_.in_use, 0);
}
END_TEST

/* A central allocation refused with `err`, leaving nothing made, listed or charged. */
static void refused_with_nothing_made(gm_session_t *s, uint64_t size, int err) {
        gm_outcome_t out;
        gm_broker_alloc(s, 1, size, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(out.error, err);
        CHECK(s->broker);
        ck_assert_uint_eq(s->tenant->charged_bytes, 0);
        ck_assert_uint_eq(backend_.in_use, 0);
        ck_assert_ptr_null(gm_session_central_new_pieces(s));
}

/* A central page-reuse heap creates a run of 2 MiB pages through one
 * provider call, all or nothing: a run past the quota is refused with
 * nothing made or charged, a backend failure part way gives back what it
 * made, and a run that fits is 8 new pieces for the reply. */
START_TEST(test_central_run_all_or_nothing) {
        b_ = gm_broker_free(b_);
        b_ = broker_new("expandable_segments:True,gpumemd_page_reuse:True", 0);
        gm_tenant_t *t = gm_tenant_get(b_, "a");
        gm_tenant_set_quota(t, GM_QUOTA_RUNTIME, true, 20 * MiB);
        gm_session_t *s = session(b_, 1000, "a");

        refused_with_nothing_made(s, 32 * MiB, -EDQUOT);
        create_fails_in_ = 5; /* the fifth of 8 pages */
        refused_with_nothing_made(s, 16 * MiB, -EIO);
        ck_assert_int_eq(create_fails_in_, 0);

        alloc_ok(s, 16 * MiB);
        ck_assert_uint_eq(t->charged_bytes, 16 * MiB);
        ck_assert_uint_eq(backend_.in_use, 16 * MiB);
        size_t n = 0;
        for (const gm_piece_t *p = s->pieces; p; p = p->next) {
                ck_assert_uint_eq(p->phys.size, 2 * MiB);
                ck_assert(p->in_heap);
                n++;
        }
        ck_assert_uint_eq(n, 8);
}
END_TEST

/* What a client-side heap is granted: pieces without a daemon-side heap. */
START_TEST(test_grant_without_a_heap) {
        gm_tenant_t *t = gm_tenant_get(b_, "local");
        gm_tenant_set_quota(t, GM_QUOTA_RUNTIME, true, 6 * MiB);
        gm_session_t *s = session(b_, 1000, "local");
        gm_piece_t *p, *q;
        gm_piece_spec_t spec = {.segment_id = 1, .segment_va_size = 8 * MiB, .offset = 0, .size = 2 * MiB};
        ck_assert_int_eq(gm_piece_create(s, &spec, &p), 0);
        CHECK(b_);
        spec.offset = 2 * MiB;
        ck_assert_int_eq(gm_piece_create(s, &spec, &q), 0);
        CHECK(b_);
        ck_assert_ptr_eq(gm_session_central_new_pieces(s), p); /* creation order */
        ck_assert_ptr_eq(gm_session_central_new_pieces(s)->queue, q);
        ck_assert_uint_eq(t->charged_bytes, 4 * MiB);
        spec.offset = 4 * MiB;
        spec.size = 4 * MiB;
        gm_piece_t *r;
        ck_assert_int_eq(gm_piece_create(s, &spec, &r), -EDQUOT);
        spec.offset = 6 * MiB; /* beyond the segment */
        ck_assert_int_eq(gm_piece_create(s, &spec, &r), -EINVAL);
        CHECK(b_);
        gm_session_central_pieces_sent(s);
        ck_assert_ptr_eq(gm_piece_find(s, 1, 2 * MiB), q);
        ck_assert_ptr_null(gm_piece_find(s, 1, 4 * MiB));

        /* Sent: released only through the client's ack. */
        gm_piece_release(s, p, false);
        gm_piece_release(s, q, true);
        CHECK(b_);
        ck_assert_uint_eq(t->charged_bytes, 4 * MiB);
        gm_session_flush_releases(s);
        CHECK(b_);
        ck_assert_uint_eq(host_.n_releases, 1);
        ck_assert_uint_eq(host_.releases[0].n, 2);
        ck_assert(!host_.releases[0].ranges[0].whole_segment && host_.releases[0].ranges[1].whole_segment);
        ack_all(s);
        ck_assert_uint_eq(t->charged_bytes, 0);

        /* Never sent: released at once. */
        spec = (gm_piece_spec_t){.segment_id = 2, .segment_va_size = 2 * MiB, .offset = 0, .size = 2 * MiB};
        ck_assert_int_eq(gm_piece_create(s, &spec, &p), 0);
        gm_piece_release(s, p, true);
        CHECK(b_);
        ck_assert_ptr_null(gm_session_central_new_pieces(s));
        ck_assert_uint_eq(backend_.in_use, 0);

        /* A grant held when the session ends goes back with it. */
        ck_assert_int_eq(gm_piece_create(s, &spec, &p), 0);
        gm_session_central_pieces_sent(s);
        gm_session_end(s);
        CHECK(b_);
        ck_assert_uint_eq(backend_.in_use, 0);
        ck_assert_uint_eq(t->charged_bytes, 0);
}
END_TEST

/* A run of pages is granted all or nothing: a quota or the device too small
 * for the whole run refuses it with nothing charged or made, a backend
 * failure part way gives back what it made, a malformed run is refused at
 * once, and a run that fits is n pieces in order in one reply. */
START_TEST(test_grant_run_all_or_nothing) {
        backend_.capacity = 40 * MiB;
        gm_tenant_t *t = gm_tenant_get(b_, "r");
        gm_tenant_set_quota(t, GM_QUOTA_RUNTIME, true, 20 * MiB);
        gm_session_t *s = local_session(b_, 1000, "r");
        gm_grant_t g = {.piece = {.segment_id = 1, .segment_va_size = 64 * MiB, .offset = 0, .size = 2 * MiB},
                        .n_pieces = 16};
        gm_outcome_t out;

        gm_broker_grant(s, 1, &g, &out); /* 32 MiB at a 20 MiB quota */
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(out.error, -EDQUOT);
        ck_assert_msg(strstr(out.message, "quota"), "message: %s", out.message);
        CHECK(b_);
        ck_assert_uint_eq(t->charged_bytes, 0);
        ck_assert_uint_eq(backend_.in_use, 0);
        ck_assert_uint_eq(s->grants.pieces, 0);
        ck_assert_ptr_null(s->pieces);

        g.n_pieces = 8;
        gm_broker_grant(s, 2, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REPLY);
        ck_assert_uint_eq(out.n_pieces, 8);
        for (size_t k = 0; k < 8; k++) {
                ck_assert_uint_eq(out.pieces[k]->segment_id, 1);
                ck_assert_uint_eq(out.pieces[k]->offset, k * 2 * MiB);
                ck_assert(out.pieces[k]->granted);
        }
        CHECK(b_);
        ck_assert_uint_eq(t->charged_bytes, 16 * MiB);
        ck_assert_uint_eq(s->grants.pieces, 8);
        ck_assert_int_eq(s->grants.segments.current, 1);

        /* Malformed: overlapping a granted piece, past the segment, unaligned, too many. */
        static const struct {
                uint64_t offset, n;
                const char *why;
        } bad[] = {{14 * MiB, 2, "already granted"},
                   {60 * MiB, 4, "outside"},
                   {17 * MiB, 2, "granularity"},
                   {16 * MiB, GM_MAX_GRANT_PIECES + 1, "too many"}};
        gm_tenant_set_quota(t, GM_QUOTA_RUNTIME, true, 0); /* unlimited */
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                gm_grant_t m = g;
                m.piece.offset = bad[i].offset;
                m.n_pieces = bad[i].n;
                gm_broker_grant(s, 3, &m, &out);
                ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
                ck_assert_int_eq(out.error, -EINVAL);
                ck_assert_msg(strstr(out.message, bad[i].why), "%zu: %s", i, out.message);
        }

        /* The device: 24 MiB left, a run of 26 MiB is refused whole. */
        g.piece.offset = 16 * MiB;
        g.n_pieces = 13;
        gm_broker_grant(s, 4, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(out.error, -ENOMEM);
        /* The backend fails on the third piece of four: the two made go back. */
        create_fails_in_ = 3;
        g.n_pieces = 4;
        gm_broker_grant(s, 5, &g, &out);
        ck_assert_int_eq(create_fails_in_, 0);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(out.error, -EIO);
        CHECK(b_);
        ck_assert_uint_eq(t->charged_bytes, 16 * MiB);
        ck_assert_uint_eq(backend_.in_use, 16 * MiB);
        ck_assert_uint_eq(s->grants.pieces, 8);
        ck_assert_ptr_null(gm_piece_find(s, 1, 16 * MiB));
        gm_broker_grant(s, 6, &g, &out); /* the same run now fits */
        ck_assert_int_eq(out.kind, GM_OUTCOME_REPLY);
        ck_assert_uint_eq(out.n_pieces, 4);
        ck_assert_uint_eq(backend_.in_use, 24 * MiB);
        ck_assert_int_eq(s->grants.segments.current, 1);
        CHECK(b_);
}
END_TEST

/* The daemon could not build a reply: the block goes back, and the segment
 * created for it still reaches the client with the next reply. */
START_TEST(test_alloc_undo_keeps_new_pieces_for_the_next_reply) {
        gm_session_t *s = session(b_, 1000, "a");
        gm_outcome_t out;
        gm_broker_alloc(s, 1, 1 * MiB, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REPLY);
        const gm_piece_t *p = gm_session_central_new_pieces(s);
        ck_assert_ptr_nonnull(p);
        uint64_t seg = p->segment_id;
        gm_session_central_alloc_undo(s, out.alloc.block_id);
        CHECK(b_);
        ck_assert_int_eq(gm_session_central_free_block(s, out.alloc.block_id, false), -ENOENT); /* already back */
        ck_assert_int_eq(gm_heap_stats(s->heap)->allocated_bytes[GM_STAT_ALL].current, 0);
        gm_broker_alloc(s, 2, 1 * MiB, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REPLY);
        ck_assert_uint_eq(out.alloc.segment_id, seg);
        ck_assert_ptr_eq(gm_session_central_new_pieces(s), p); /* still to be sent */
        gm_session_central_pieces_sent(s);
        CHECK(b_);
}
END_TEST

/* Issue #17 item 7: a client that creates and gives back a segment over and
 * over once grew the journal by a line pair a cycle until the next start
 * (~670 MB an hour on /run). It is compacted at run time, and what it says
 * is still exactly what is live. */
START_TEST(test_ledger_compacted_while_churning) {
        b_ = gm_broker_free(b_);
        b_ = broker_new(NULL, 16);
        ck_assert_int_eq(gm_ledger_open(b_, ledger_), 0);
        gm_orphan_adopt_done(b_, gm_now_ms());
        gm_session_t *s = session(b_, 1000, "a");
        alloc_ok(s, 1 * MiB); /* one segment stays live throughout */
        off_t largest = 0;
        for (int i = 0; i < 10000; i++) {
                uint64_t blk = alloc_ok(s, 20 * MiB); /* a fresh 20 MiB segment, stored */
                ck_assert_int_eq(gm_session_central_free_block(s, blk, false), 0);
                gm_session_central_trim(s);
                gm_session_flush_releases(s);
                ack_all(s); /* released: its store entry is dead */
                host_.n_releases = 0;
                struct stat st;
                ck_assert_int_eq(stat(ledger_, &st), 0);
                if (st.st_size > largest)
                        largest = st.st_size;
        }
        CHECK(b_);
        ck_assert_uint_eq(b_->n_stored, 1);
        /* 10,000 cycles of two lines each (~90 bytes) were ~900 KB. */
        ck_assert_msg(largest < 64 * 1024, "journal grew to %lld bytes", (long long) largest);

        /* A restart from it finds exactly the live segment. */
        b_->keep_stored = true;
        b_ = gm_broker_free(b_);
        b_ = broker_new(NULL, 16);
        ck_assert_int_eq(gm_ledger_open(b_, ledger_), 0);
        ck_assert_uint_eq(host_.n_stored, 1);
        gm_orphan_adopt(b_, host_.stored[0].name, fcntl(host_.stored[0].fd, F_DUPFD_CLOEXEC, 3));
        gm_orphan_adopt_done(b_, gm_now_ms());
        CHECK(b_);
        ck_assert_uint_eq(backend_.in_use, 2 * MiB);
        gm_orphan_expire(b_, gm_now_ms(), true);
        CHECK(b_);
}
END_TEST

/* A restart: pieces stored by one broker come back to the next through the
 * ledger; the client re-attaches with its token; an unclaimed one expires. */
START_TEST(test_ledger_replay_and_reattach) {
        const char *why = NULL;
        b_ = gm_broker_free(b_);
        b_ = broker_new(NULL, 16);
        ck_assert_int_eq(gm_ledger_open(b_, ledger_), 0);
        gm_orphan_adopt_done(b_, gm_now_ms());
        gm_ledger_runtime_quota(b_, "a", 100 * MiB);
        gm_tenant_set_quota(gm_tenant_get(b_, "a"), GM_QUOTA_RUNTIME, true, 100 * MiB);
        gm_session_t *s = session(b_, 1000, "a"), *gone = session(b_, 1001, "b");
        uint64_t blk = alloc_ok(s, 20 * MiB), live = alloc_ok(s, 1 * MiB); /* a 20 and a 2 MiB segment */
        ck_assert_int_eq(gm_session_central_free_block(s, blk, false), 0);
        alloc_ok(gone, 1 * MiB);
        ck_assert_uint_eq(host_.n_stored, 3);
        ck_assert_uint_eq(b_->n_stored, 3);
        char token[GM_TOKEN_LEN + 1];
        snprintf(token, sizeof(token), "%s", s->token);
        uint64_t seg_small = 0, seg_large = 0;
        for (const gm_piece_t *p = s->pieces; p; p = p->next)
                *(p->phys.size == 2 * MiB ? &seg_small : &seg_large) = p->segment_id;

        /* Stopping with a store: the pieces outlive the broker. */
        b_->keep_stored = true;
        b_ = gm_broker_free(b_);
        ck_assert_uint_eq(backend_.in_use, 0);
        ck_assert_uint_eq(host_.n_stored, 3);

        /* The next broker: the ledger names the stored fds, the quota is back. */
        b_ = broker_new(NULL, 16);
        ck_assert_int_eq(gm_ledger_open(b_, ledger_), 0);
        ck_assert_uint_eq(gm_tenant_find(b_, "a")->quota, 100 * MiB);
        for (size_t i = 0; i < host_.n_stored; i++) {
                gm_orphan_adopt(b_, host_.stored[i].name, fcntl(host_.stored[i].fd, F_DUPFD_CLOEXEC, 3));
                CHECK(b_);
        }
        gm_orphan_adopt(b_, "seg-00000000ff", open("/dev/null", O_RDONLY | O_CLOEXEC)); /* unknown: dropped */
        ck_assert_uint_eq(host_.removed_unknown, 1);
        gm_orphan_adopt_done(b_, gm_now_ms());
        CHECK(b_);
        ck_assert_uint_eq(backend_.in_use, 24 * MiB);
        ck_assert_uint_eq(b_->n_stored, 3);

        /* Another uid cannot claim it; a bad token is refused. */
        gm_session_params_t params = {.pid = 7, .uid = 1001};
        gm_session_t *thief;
        ck_assert_int_eq(gm_session_new(b_, &params, &thief), 0);
        ck_assert_int_eq(gm_session_start(thief, "b", token), -EPERM);
        ck_assert_int_eq(gm_session_start(thief, "b", "not-a-token"), -EINVAL);
        gm_session_free(thief);
        CHECK(b_);

        params.uid = 1000;
        gm_session_t *r;
        ck_assert_int_eq(gm_session_new(b_, &params, &r), 0);
        ck_assert_int_eq(gm_session_start(r, "a", token), 0);
        ck_assert(r->reattaching);
        CHECK(b_);
        ck_assert_uint_eq(r->tenant->charged_bytes, 0); /* charged as the client vouches for it */
        ck_assert_int_eq(gm_reattach_count(r, 2), 0);
        gm_reattach_range_t small = {.offset = 0, .length = 2 * MiB};
        ck_assert_int_eq(gm_reattach_segment(r, seg_small, 2 * MiB, 0, &small, 1, &why), 0);
        CHECK(b_);
        ck_assert_uint_eq(r->tenant->charged_bytes, 2 * MiB);
        ck_assert_int_eq(gm_reattach_block(r, live, seg_small, 0, 1 * MiB, 1 * MiB, false), 0);
        /* The client no longer holds the large segment: it is released at the end. */
        ck_assert_int_eq(gm_reattach_finish(r, &(gm_reattach_state_t){0}, &(uint64_t){0}), 0);
        CHECK(b_);
        ck_assert(!r->reattaching);
        ck_assert_uint_eq(r->tenant->charged_bytes, 2 * MiB);
        ck_assert_uint_eq(backend_.in_use, 4 * MiB); /* the other session's orphan waits */
        ck_assert_int_eq(gm_session_central_free_block(r, live, false), 0);
        CHECK(b_);
        (void) seg_large;

        /* The other session's client never comes back. */
        gm_orphan_expire(b_, gm_now_ms() + 60001, false);
        CHECK(b_);
        ck_assert_ptr_nonnull(strstr(host_.last_log, "no client re-attached"));
        ck_assert_uint_eq(backend_.in_use, 2 * MiB);
        gm_session_free(r);
        CHECK(b_);
        ck_assert_uint_eq(host_.n_stored, 0);
        ck_assert_uint_eq(b_->n_stored, 0);
}
END_TEST

/* The coordinates of s's piece of `size` bytes. */
static gm_reattach_range_t piece_of_size(const gm_session_t *s, uint64_t size, uint64_t *ret_segment) {
        for (const gm_piece_t *p = s->pieces; p; p = p->next)
                if (p->phys.size == size) {
                        *ret_segment = p->segment_id;
                        return (gm_reattach_range_t){.offset = p->offset, .length = p->phys.size};
                }
        ck_abort_msg("no piece of %llu bytes", (unsigned long long) size);
        return (gm_reattach_range_t){0};
}

/* Without a store, a client's report re-registers its memory (unbacked), but
 * only for a session the journal names, by the same uid, piece by piece as
 * the journal recorded that session's, within its quota and the device.
 * Issue #17 item 2: any made-up token (then any made-up segment under a
 * real one) once claimed anything. */
START_TEST(test_reattach_without_store_is_unbacked) {
        const char *why = NULL;
        b_ = gm_broker_free(b_);
        b_ = broker_new(NULL, 0);
        ck_assert_int_eq(gm_ledger_open(b_, ledger_), 0);
        gm_orphan_adopt_done(b_, gm_now_ms());
        gm_session_t *old = session(b_, 1000, "a");
        alloc_ok(old, 20 * MiB);
        alloc_ok(old, 48 * MiB);
        ck_assert_uint_eq(b_->n_recorded, 2);
        uint64_t seg_small, seg_big;
        gm_reattach_range_t small = piece_of_size(old, 20 * MiB, &seg_small),
                            big = piece_of_size(old, 48 * MiB, &seg_big);
        char token[GM_TOKEN_LEN + 1];
        snprintf(token, sizeof(token), "%s", old->token);
        gm_session_t *other = session(b_, 1000, "a"); /* a session of the same user, with memory of its own */
        alloc_ok(other, 12 * MiB);
        uint64_t seg_other;
        gm_reattach_range_t theirs = piece_of_size(other, 12 * MiB, &seg_other);
        b_->stopping = true; /* as a daemon that stops (or dies): the session stays claimable */
        b_ = gm_broker_free(b_);

        b_ = broker_new(NULL, 0);
        ck_assert_int_eq(gm_ledger_open(b_, ledger_), 0);
        gm_orphan_adopt_done(b_, gm_now_ms());
        ck_assert_uint_eq(b_->n_records, 3);
        gm_tenant_set_quota(gm_tenant_get(b_, "a"), GM_QUOTA_CONFIG, true, 64 * MiB);
        gm_session_params_t params = {.pid = 7, .uid = 1000};
        gm_session_t *r;
        char made_up[GM_TOKEN_LEN + 1];
        gm_ledger_token_new(made_up);
        ck_assert_int_eq(gm_session_new(b_, &params, &r), 0);
        ck_assert_int_eq(gm_session_start(r, "a", made_up), -ENOENT);
        gm_session_free(r);
        params.uid = 1001; /* the real token, another user */
        ck_assert_int_eq(gm_session_new(b_, &params, &r), 0);
        ck_assert_int_eq(gm_session_start(r, "b", token), -EPERM);
        gm_session_free(r);
        CHECK(b_);

        params.uid = 1000;
        ck_assert_int_eq(gm_session_new(b_, &params, &r), 0);
        ck_assert_int_eq(gm_session_start(r, "a", token), 0);
        /* Made-up segments under the real token: none the journal gave it. */
        gm_reattach_range_t whole = {.offset = 0, .length = 20 * MiB};
        ck_assert_int_eq(gm_reattach_segment(r, seg_small + seg_big + 100, 20 * MiB, 0, &whole, 1, &why), -ENOENT);
        gm_reattach_range_t part = {.offset = small.offset, .length = small.length / 2};
        ck_assert_int_eq(gm_reattach_segment(r, seg_small, 20 * MiB, 0, &part, 1, &why), -ENOENT);
        ck_assert_int_eq(gm_reattach_segment(r, seg_other, theirs.length, 0, &theirs, 1, &why), -ENOENT);
        gm_piece_spec_t granted = {.segment_id = seg_other, .segment_va_size = theirs.length, .size = theirs.length};
        gm_piece_t *gp;
        ck_assert_int_eq(gm_reattach_grant(r, &granted, &gp), -EPROTO); /* not a local session */
        r->local = true;                                                /* as a local heap's report: the same refusal */
        ck_assert_int_eq(gm_reattach_grant(r, &granted, &gp), -ENOENT);
        r->local = false;
        CHECK(b_);
        ck_assert_uint_eq(b_->unbacked_bytes, 0);
        ck_assert_uint_eq(r->tenant->charged_bytes, 0);

        ck_assert_int_eq(gm_reattach_segment(r, seg_small, 20 * MiB, 0, &small, 1, &why), 0);
        CHECK(b_);
        ck_assert_uint_eq(b_->unbacked_bytes, 20 * MiB);
        ck_assert_uint_eq(gm_piece_reserved(b_), 20 * MiB);
        ck_assert_int_eq(gm_reattach_segment(r, seg_small, 20 * MiB, 0, &small, 1, &why), -ENOENT); /* once */
        ck_assert_int_eq(gm_reattach_segment(r, seg_big, 48 * MiB, 0, &big, 1, &why), -EDQUOT);     /* 68 > 64 MiB */
        CHECK(b_);
        gm_tenant_set_quota(r->tenant, GM_QUOTA_CONFIG, false, 0);
        backend_.capacity = 64 * MiB;
        ck_assert_int_eq(gm_reattach_segment(r, seg_big, 48 * MiB, 0, &big, 1, &why), -ENOMEM); /* the device */
        backend_.capacity = 256 * MiB;
        CHECK(b_);
        ck_assert_int_eq(gm_reattach_segment(r, seg_big, 48 * MiB, 0, &big, 1, &why), 0);
        ck_assert_int_eq(gm_reattach_finish(r, &(gm_reattach_state_t){0}, &(uint64_t){0}), 0);
        CHECK(b_);
        ck_assert_uint_eq(r->tenant->charged_bytes, 68 * MiB);
        ck_assert_uint_eq(b_->n_records, 1); /* the other session's, until it comes back or the grace ends */
        gm_session_end(r);
        CHECK(b_);
        ck_assert_uint_eq(b_->unbacked_bytes, 0);
        gm_orphan_expire(b_, gm_now_ms() + 60001, false);
        ck_assert_uint_eq(b_->n_records, 0);

        /* Its end is journaled: the token cannot be claimed again, and no
         * record is left to claim. */
        b_ = gm_broker_free(b_);
        b_ = broker_new(NULL, 0);
        ck_assert_int_eq(gm_ledger_open(b_, ledger_), 0);
        gm_orphan_adopt_done(b_, gm_now_ms());
        ck_assert_uint_eq(b_->n_records, 0);
        ck_assert_int_eq(gm_session_new(b_, &params, &r), 0);
        ck_assert_int_eq(gm_session_start(r, "a", token), -ENOENT);
        gm_session_free(r);
}
END_TEST

/* A broker after a restart over the journal (no fd store) with `n_records`
 * claimable records, and the session of uid 1000 resuming `token`. */
static gm_session_t *resume_from_journal(const char *alloc_conf, const char *token, size_t n_records) {
        b_ = broker_new(alloc_conf, 0);
        ck_assert_int_eq(gm_ledger_open(b_, ledger_), 0);
        gm_orphan_adopt_done(b_, gm_now_ms());
        CHECK(b_);
        ck_assert_uint_eq(b_->n_records, n_records);
        gm_session_params_t params = {.pid = 7, .uid = 1000};
        gm_session_t *r;
        ck_assert_int_eq(gm_session_new(b_, &params, &r), 0);
        ck_assert_int_eq(gm_session_start(r, "a", token), 0);
        return r;
}

/* Journal lines no daemon writes are not records anyone can claim: id 0
 * (a piece's "not journaled"), an empty range, one outside its segment, a
 * bad token. */
START_TEST(test_ledger_skips_impossible_records) {
        const char *why = NULL;
        b_ = gm_broker_free(b_);
        const char *t = "0123456789abcdef0123456789abcdef";
        FILE *f = fopen(ledger_, "we");
        ck_assert_ptr_nonnull(f);
        fprintf(f, "t %s 1000\n", t);
        fprintf(f, "+ 0 %s 1000 1 0 2097152 2097152\n", t);
        fprintf(f, "+ 2 %s 1000 1 0 0 2097152\n", t);
        fprintf(f, "+ 3 %s 1000 1 2097152 2097152 2097152\n", t);
        fprintf(f, "+ 4 %s 1000 1 4096 18446744073709551615 2097152\n", t);
        fprintf(f, "+ 5 0123 1000 1 0 2097152 2097152\n");
        fprintf(f, "+ 6 %s 1000 1 0 2097152 2097152\n", t);
        fclose(f);
        gm_session_t *r = resume_from_journal(NULL, t, 1);
        gm_reattach_range_t whole = {.offset = 0, .length = 2 * MiB};
        ck_assert_int_eq(gm_reattach_segment(r, 1, 2 * MiB, 0, &whole, 1, &why), 0); /* line 6's */
        ck_assert_int_eq(gm_reattach_finish(r, &(gm_reattach_state_t){0}, &(uint64_t){0}), 0);
        CHECK(b_);
        gm_session_free(r);
}
END_TEST

/* The whole journal, NUL-terminated (malloc'd). */
static char *read_ledger(void) {
        FILE *f = fopen(ledger_, "re");
        ck_assert_ptr_nonnull(f);
        char *text = calloc(1, 1 << 16);
        size_t n = fread(text, 1, (1 << 16) - 1, f);
        text[n] = '\0';
        fclose(f);
        return text;
}

/* Page reuse gives both pools 2 MiB pages: the journal records each page's
 * pool, at its creation and at its new place when it moves (a page taken
 * from a small-pool hole by a large request), for records with no stored
 * handle too; the next broker restores each segment in its pool. Issue #16:
 * the pool was inferred from the page size (the large-pool segment came back
 * in the small pool) and a moved record kept its old place (its client's
 * report no longer matched it). */
START_TEST(test_ledger_keeps_pools_through_moves) {
        const char *why = NULL;
        const char *conf = "expandable_segments:True,gpumemd_page_reuse:True";
        static gm_backend_ops_t synchronous_ops; /* frees are synchronous, as on the host backend: pages move */
        synchronous_ops = fake_backend_ops;
        synchronous_ops.caps = &gm_kind_host_caps;
        backend_.ops = &synchronous_ops;
        b_ = gm_broker_free(b_);
        b_ = broker_new(conf, 0);
        ck_assert_int_eq(gm_ledger_open(b_, ledger_), 0);
        gm_orphan_adopt_done(b_, gm_now_ms());
        gm_session_t *s = session(b_, 1000, "a");
        uint64_t small[4];
        for (int i = 0; i < 4; i++)
                small[i] = alloc_ok(s, 1 * MiB); /* two small-pool pages */
        ck_assert_int_eq(gm_session_central_free_block(s, small[2], false), 0);
        ck_assert_int_eq(gm_session_central_free_block(s, small[3], false), 0);
        alloc_ok(s, 6 * MiB); /* takes the top small-pool page, maps two more */
        gm_page_reuse_info_t reuse;
        gm_heap_page_reuse(s->heap, &reuse);
        ck_assert_uint_eq(reuse.pages_moved, 1);
        const gm_stats_t *st = gm_heap_stats(s->heap);
        ck_assert_int_eq(st->reserved_bytes[GM_STAT_LARGE_POOL].current, 6 * MiB);
        ck_assert_int_eq(st->reserved_bytes[GM_STAT_SMALL_POOL].current, 2 * MiB);

        /* Each record's last line names its piece's place now and that segment's pool. */
        enum { MAX_SEGS = 4, MAX_PAGES = 8 };
        struct {
                uint64_t id, va_size;
                bool small_pool;
                gm_reattach_range_t pages[MAX_PAGES];
                size_t n_pages;
        } segs[MAX_SEGS] = {{0}};
        size_t n_segs = 0;
        char *text = read_ledger();
        for (const gm_piece_t *p = s->pieces; p; p = p->next) {
                bool small_pool;
                ck_assert_int_eq(gm_heap_segment_pool(s->heap, p->segment_id, &small_pool), 0);
                char line[256];
                snprintf(line, sizeof(line), "+ %llu %s 1000 %llu %llu %llu %llu %s\n",
                         (unsigned long long) p->record_id, s->token, (unsigned long long) p->segment_id,
                         (unsigned long long) p->offset, (unsigned long long) p->phys.size,
                         (unsigned long long) p->segment_va_size, small_pool ? "small" : "large");
                ck_assert_msg(strstr(text, line), "no '%s' in the journal:\n%s", line, text);
                size_t k = 0;
                while (k < n_segs && segs[k].id != p->segment_id)
                        k++;
                if (k == n_segs) {
                        ck_assert_uint_lt(n_segs, MAX_SEGS);
                        segs[n_segs++].id = p->segment_id;
                }
                segs[k].va_size = p->segment_va_size;
                segs[k].small_pool = small_pool;
                ck_assert_uint_lt(segs[k].n_pages, MAX_PAGES);
                segs[k].pages[segs[k].n_pages++] = (gm_reattach_range_t){.offset = p->offset, .length = p->phys.size};
        }
        free(text);
        ck_assert_uint_eq(n_segs, 2);
        char token[GM_TOKEN_LEN + 1];
        snprintf(token, sizeof(token), "%s", s->token);
        b_->stopping = true; /* a daemon that dies: the session stays claimable */
        b_ = gm_broker_free(b_);

        gm_session_t *r = resume_from_journal(conf, token, segs[0].n_pages + segs[1].n_pages);
        for (size_t k = 0; k < n_segs; k++)
                ck_assert_int_eq(
                        gm_reattach_segment(r, segs[k].id, segs[k].va_size, 0, segs[k].pages, segs[k].n_pages, &why),
                        0);
        ck_assert_int_eq(gm_reattach_finish(r, &(gm_reattach_state_t){0}, &(uint64_t){0}), 0);
        CHECK(b_);
        for (size_t k = 0; k < n_segs; k++) {
                bool small_pool;
                ck_assert_int_eq(gm_heap_segment_pool(r->heap, segs[k].id, &small_pool), 0);
                ck_assert_int_eq(small_pool, segs[k].small_pool);
        }
        st = gm_heap_stats(r->heap);
        ck_assert_int_eq(st->reserved_bytes[GM_STAT_LARGE_POOL].current, 6 * MiB);
        ck_assert_int_eq(st->reserved_bytes[GM_STAT_SMALL_POOL].current, 2 * MiB);
        ck_assert_ptr_null(why);
        gm_session_free(r);
        CHECK(b_);
}
END_TEST

/* "+" lines with and without a pool (a journal of a daemon that recorded
 * none: the page size tells, as before); the pool a segment's records name
 * is the one it is restored in, and records that name both pools are
 * refused with the reason. A line with anything else after its numbers, or
 * with no newline (torn), is no record. */
START_TEST(test_ledger_pool_records) {
#define TOKEN "0123456789abcdef0123456789abcdef"
        static const char journal[] = "t " TOKEN " 1000\n"
                                      "+ 1 " TOKEN " 1000 1 0 2097152 67108864 large\n"
                                      "+ 2 " TOKEN " 1000 1 2097152 2097152 67108864 large\n"
                                      "+ 3 " TOKEN " 1000 2 0 2097152 67108864\n"
                                      "+ 4 " TOKEN " 1000 3 0 2097152 67108864 small\n"
                                      "+ 5 " TOKEN " 1000 3 2097152 2097152 67108864 large\n"
                                      "+ 6 " TOKEN " 1000 4 0 2097152 67108864 huge\n"
                                      "+ 7 " TOKEN " 1000 4 2097152 2097152 67108864 large junk\n"
                                      "+ 8 " TOKEN " 1000 4 4194304 2097152 67108864 lar";
        const char *why = NULL;
        b_ = gm_broker_free(b_);
        FILE *f = fopen(ledger_, "we");
        ck_assert_ptr_nonnull(f);
        fputs(journal, f);
        fclose(f);
        gm_session_t *r = resume_from_journal("expandable_segments:True,gpumemd_page_reuse:True", TOKEN, 5);
#undef TOKEN
        gm_reattach_range_t two[2] = {{.offset = 0, .length = 2 * MiB}, {.offset = 2 * MiB, .length = 2 * MiB}};
        ck_assert_int_eq(gm_reattach_segment(r, 1, 64 * MiB, 0, two, 2, &why), 0);
        ck_assert_int_eq(gm_reattach_segment(r, 2, 64 * MiB, 0, two, 1, &why), 0);
        ck_assert_ptr_null(why);
        ck_assert_int_eq(gm_reattach_segment(r, 3, 64 * MiB, 0, two, 2, &why), -EINVAL);
        ck_assert_ptr_nonnull(why);
        ck_assert_ptr_nonnull(strstr(why, "both pools"));
        ck_assert_uint_eq(b_->n_records, 2); /* given back: still claimable, still refused */
        why = NULL;
        ck_assert_int_eq(gm_reattach_segment(r, 3, 64 * MiB, 0, two, 1, &why), 0); /* its small page alone */
        ck_assert_int_eq(gm_reattach_segment(r, 4, 64 * MiB, 0, two, 1, &why), -ENOENT);
        ck_assert_int_eq(gm_reattach_finish(r, &(gm_reattach_state_t){0}, &(uint64_t){0}), 0);
        CHECK(b_);
        bool small_pool;
        ck_assert_int_eq(gm_heap_segment_pool(r->heap, 1, &small_pool), 0);
        ck_assert(!small_pool);
        ck_assert_int_eq(gm_heap_segment_pool(r->heap, 2, &small_pool), 0);
        ck_assert(small_pool); /* no pool recorded: inferred from its 2 MiB pages */
        const gm_stats_t *st = gm_heap_stats(r->heap);
        ck_assert_int_eq(st->reserved_bytes[GM_STAT_LARGE_POOL].current, 4 * MiB);
        ck_assert_int_eq(st->reserved_bytes[GM_STAT_SMALL_POOL].current, 4 * MiB);
        gm_session_free(r);
        CHECK(b_);
}
END_TEST

/* Local sessions' grants park and wake up as central allocations do: one
 * FIFO per session, retried when memory comes back (ReturnPieces, then the
 * ReclaimAck), a central request waiting on a local session's cache. */
START_TEST(test_grants_park_until_reclaimed) {
        backend_.capacity = 60 * MiB;
        gm_session_t *idle = local_session(b_, 1000, "a");
        gm_session_t *busy = local_session(b_, 1001, "b");
        gm_session_t *central = session(b_, 1002, "c");
        grant_ok(idle, 1, 20 * MiB);
        grant_ok(idle, 2, 20 * MiB);
        grant_ok(idle, 3, 20 * MiB);
        ck_assert_uint_eq(idle->grants.pieces, 3);
        ck_assert_int_eq(idle->grants.segments.current, 3);
        client_uses(idle, 20 * MiB); /* 40 MiB cached in its client's heap */
        client_uses(busy, 60 * MiB); /* all it will get is in use */

        /* A malformed grant is refused at once, without asking anyone. */
        gm_outcome_t out;
        gm_grant_t g = whole(2, 20 * MiB);
        gm_broker_grant(idle, 9, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(out.error, -EINVAL);
        ck_assert_ptr_nonnull(strstr(out.message, "already granted"));
        ck_assert_uint_eq(host_.n_reclaims, 0);

        /* The device is full: idle's client is asked (Reclaim), the grant waits. */
        g = whole(1, 20 * MiB);
        gm_broker_grant(busy, 41, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        CHECK(b_);
        ck_assert_uint_eq(host_.n_reclaims, 1);
        ck_assert_ptr_eq(host_.reclaims[0].session, idle);
        ck_assert_uint_eq(host_.reclaims[0].bytes, 40 * MiB);
        ck_assert_uint_eq(idle->reclaim.id, host_.reclaims[0].id);
        g = whole(2, 20 * MiB);
        gm_broker_grant(busy, 42, &g, &out); /* behind the first, in order */
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        g = whole(3, 20 * MiB);
        gm_broker_grant(busy, 43, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        ck_assert_uint_eq(busy->n_parked, 3);
        /* A central allocation waits on the same Reclaim. */
        gm_broker_alloc(central, 50, 20 * MiB, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        ck_assert_uint_eq(host_.n_reclaims, 1); /* one Reclaim at a time */
        CHECK(b_);

        /* A stale ack is refused; a returned piece that was never granted too. */
        ck_assert_int_eq(gm_reclaim_ack(idle, 777, 0), -ENOENT);
        gm_release_range_t bogus = {.segment_id = 9, .offset = 0, .length = 20 * MiB};
        size_t first_bad = 99;
        ck_assert_uint_eq(gm_broker_return_pieces(idle, &bogus, 1, &first_bad), 1);
        ck_assert_uint_eq(first_bad, 0);
        ck_assert_uint_eq(host_.n_done, 0);

        /* The client gives one segment back: the oldest waiting grant gets it. */
        client_uses(idle, 20 * MiB);
        return_whole(idle, 2, 20 * MiB);
        ck_assert_uint_eq(host_.n_done, 1);
        ck_assert_uint_eq(host_.done[0].request_id, 41);
        ck_assert_int_eq(host_.done[0].outcome.kind, GM_OUTCOME_REPLY);
        ck_assert_ptr_nonnull(host_.done[0].outcome.pieces[0]);
        ck_assert_uint_eq(busy->n_parked, 2);
        ck_assert_uint_eq(busy->tenant->charged_bytes, 20 * MiB);
        ck_assert_int_eq(idle->grants.segments.current, 2);
        return_whole(idle, 3, 20 * MiB);
        ck_assert_uint_eq(host_.n_done, 2);
        ck_assert_uint_eq(host_.done[1].request_id, 42);
        ck_assert_int_eq(host_.done[1].outcome.kind, GM_OUTCOME_REPLY);

        /* Its ack: nothing more is coming, the rest is refused. */
        ck_assert_int_eq(gm_reclaim_ack(idle, host_.reclaims[0].id, 40 * MiB), 0);
        CHECK(b_);
        ck_assert_uint_eq(host_.n_done, 4);
        bool seen_43 = false, seen_50 = false;
        for (size_t i = 2; i < 4; i++) {
                ck_assert_int_eq(host_.done[i].outcome.kind, GM_OUTCOME_REFUSE);
                ck_assert_int_eq(host_.done[i].outcome.error, -ENOMEM);
                seen_43 |= host_.done[i].request_id == 43;
                seen_50 |= host_.done[i].request_id == 50;
        }
        ck_assert(seen_43 && seen_50);
        ck_assert_uint_eq(busy->n_parked + central->n_parked, 0);
        ck_assert_uint_eq(idle->reclaim.id, 0);

        /* An admin trim asks local sessions too. */
        client_uses(busy, 0);
        ck_assert_uint_eq(gm_reclaim_trim(b_, "b"), 40 * MiB);
        ck_assert_uint_eq(host_.n_reclaims, 2);
        ck_assert_ptr_eq(host_.reclaims[1].session, busy);
        CHECK(b_);
}
END_TEST

/* A waiting grant times out with the diagnosis; a session that ends while
 * its grants wait takes them (and its pieces) with it. */
START_TEST(test_grant_timeout_and_end_while_parked) {
        backend_.capacity = 40 * MiB;
        gm_tenant_set_quota(gm_tenant_get(b_, "q"), GM_QUOTA_CONFIG, true, 40 * MiB);
        gm_session_t *holder = local_session(b_, 1000, "q");
        gm_session_t *waiter = local_session(b_, 1001, "q");
        grant_ok(holder, 1, 20 * MiB);
        grant_ok(waiter, 1, 20 * MiB);
        client_uses(holder, 0);
        /* Quota pressure asks only the tenant's own sessions. */
        gm_outcome_t out;
        gm_grant_t g = whole(2, 20 * MiB);
        gm_broker_grant(waiter, 7, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        ck_assert_uint_eq(host_.n_reclaims, 1);
        CHECK(b_);
        expire_parked();
        ck_assert_uint_eq(host_.n_done, 1);
        ck_assert_int_eq(host_.done[0].outcome.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(host_.done[0].outcome.error, -EDQUOT);
        ck_assert_msg(strstr(host_.done[0].outcome.message, "quota"), "message: %s", host_.done[0].outcome.message);

        /* Waiting again (the Reclaim is still out), then gone. */
        gm_broker_grant(waiter, 8, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        g = whole(3, 20 * MiB);
        gm_broker_grant(waiter, 9, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        ck_assert_uint_eq(waiter->n_parked, 2);
        gm_session_free(waiter);
        CHECK(b_);
        ck_assert_uint_eq(host_.n_done, 1);
        ck_assert_uint_eq(backend_.in_use, 20 * MiB);
        ck_assert_uint_eq(gm_tenant_find(b_, "q")->charged_bytes, 20 * MiB);
        /* The holder ends with its Reclaim out: nothing is left. */
        gm_session_end(holder);
        CHECK(b_);
        ck_assert_uint_eq(holder->reclaim.id, 0);
        ck_assert_uint_eq(backend_.in_use, 0);
}
END_TEST

/* Sleep and wake (docs/sleep.md): the sleep record is bounded by what the
 * session holds; a wake's grant parks with nothing asked back, is granted
 * when another tenant returns memory, and is refused after its own wait_ms
 * (not park_timeout_ms). */
START_TEST(test_sleep_record_and_waiting_grant) {
        backend_.capacity = 40 * MiB;
        gm_session_t *sleeper = local_session(b_, 1000, "s");
        gm_session_t *other = local_session(b_, 1001, "o");
        grant_ok(sleeper, 1, 20 * MiB);
        ck_assert_int_eq(gm_session_local_sleep_state(sleeper, true, 20 * MiB + 1), -EINVAL);
        ck_assert_int_eq(gm_session_local_sleep_state(sleeper, true, 20 * MiB), 0);
        ck_assert_int_eq(gm_session_local_sleep_state(sleeper, true, 20 * MiB), -EBUSY);
        CHECK(b_);
        return_whole(sleeper, 1, 20 * MiB);
        ck_assert(sleeper->sleep.asleep && sleeper->sleep.bytes == 20 * MiB);
        grant_ok(other, 1, 40 * MiB); /* the neighbour takes the whole device */
        client_uses(other, 40 * MiB);

        gm_outcome_t out;
        gm_grant_t g = whole(1, 20 * MiB);
        gm_broker_grant(sleeper, 7, &g, &out); /* a plain grant: nothing is on its way, refused */
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        g.wait_for_memory = true;
        g.wait_ms = 60000;
        gm_broker_grant(sleeper, 8, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        CHECK(b_);
        gm_broker_tick(b_, gm_now_ms()); /* within its wait: still parked */
        ck_assert_uint_eq(host_.n_done, 0);
        return_whole(other, 1, 40 * MiB); /* memory comes back: granted */
        ck_assert_uint_eq(host_.n_done, 1);
        ck_assert_int_eq(host_.done[0].outcome.kind, GM_OUTCOME_REPLY);
        ck_assert_uint_eq(gm_tenant_find(b_, "s")->charged_bytes, 20 * MiB);
        ck_assert_int_eq(gm_session_local_sleep_state(sleeper, false, 0), 0);
        CHECK(b_);

        /* Its wait_ms, not park_timeout_ms, decides when it is refused. */
        grant_ok(other, 2, 20 * MiB);
        client_uses(other, 20 * MiB);
        g = whole(2, 20 * MiB);
        g.wait_for_memory = true;
        g.wait_ms = 1;
        gm_broker_grant(sleeper, 9, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        usleep(5000);
        gm_broker_tick(b_, gm_now_ms());
        ck_assert_uint_eq(host_.n_done, 2);
        ck_assert_int_eq(host_.done[1].outcome.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(host_.done[1].outcome.error, -ENOMEM);
        CHECK(b_);
        gm_session_end(sleeper);
        gm_session_end(other);
        CHECK(b_);
}
END_TEST

/* A client that answers no release request for unresponsive_timeout_ms is
 * not waited for: what waits for it is refused at once with its pid named,
 * nothing new waits for it, its memory stays charged, and it is responsive
 * again once it answers. Central and local alike. */
START_TEST(test_unresponsive_client_is_not_waited_for) {
        backend_.capacity = 40 * MiB;
        gm_broker_limits_t limits = b_->limits;
        limits.unresponsive_timeout_ms = 5000;
        gm_broker_set_limits(b_, &limits);
        gm_session_t *stopped = session(b_, 1000, "a");
        gm_session_t *lstopped = local_session(b_, 1001, "l");
        gm_session_t *busy = session(b_, 1002, "b");
        gm_session_t *lbusy = local_session(b_, 1003, "lb");
        uint64_t blk = alloc_ok(stopped, 20 * MiB);
        ck_assert_int_eq(gm_session_central_free_block(stopped, blk, false), 0);
        grant_ok(lstopped, 1, 20 * MiB);
        client_uses(lstopped, 0);

        gm_outcome_t out;
        gm_broker_alloc(busy, 1, 20 * MiB, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        gm_grant_t g = whole(1, 20 * MiB);
        gm_broker_grant(lbusy, 2, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_PARK);
        ck_assert_uint_eq(host_.n_releases, 1);
        ck_assert_uint_eq(host_.n_reclaims, 1);
        ck_assert_uint_ne(stopped->owing_since_ms, 0);
        ck_assert_uint_ne(lstopped->owing_since_ms, 0);
        CHECK(b_);

        /* Before the bound nothing changes. */
        gm_broker_tick(b_, gm_now_ms() + 1000);
        ck_assert_uint_eq(host_.n_done, 0);
        ck_assert(!stopped->unresponsive && !lstopped->unresponsive);

        /* Past it: both are unresponsive, the waiting requests are refused now. */
        gm_broker_tick(b_, gm_now_ms() + 6000);
        CHECK(b_);
        ck_assert(stopped->unresponsive && lstopped->unresponsive);
        ck_assert_int_eq(host_.unresponsive, 2);
        ck_assert_uint_eq(host_.n_done, 2);
        char pid[32];
        for (size_t i = 0; i < 2; i++) {
                const gm_outcome_t *o = &host_.done[i].outcome;
                ck_assert_int_eq(o->kind, GM_OUTCOME_REFUSE);
                ck_assert_int_eq(o->error, -ENOMEM);
                ck_assert_msg(strstr(o->message, "unresponsive session"), "message: %s", o->message);
                snprintf(pid, sizeof(pid), "pid %d", (int) stopped->pid);
                ck_assert_msg(strstr(o->message, pid), "message: %s", o->message);
                snprintf(pid, sizeof(pid), "pid %d", (int) lstopped->pid);
                ck_assert_msg(strstr(o->message, pid), "message: %s", o->message);
        }
        /* New requests do not wait, and nobody is asked again. */
        gm_broker_alloc(busy, 3, 20 * MiB, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        gm_broker_grant(lbusy, 4, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        gm_broker_limits_t quick = b_->limits;
        quick.release_timeout_ms = 0;
        gm_broker_set_limits(b_, &quick);
        gm_broker_tick(b_, gm_now_ms() + 7000);
        gm_broker_set_limits(b_, &limits);
        ck_assert_uint_eq(host_.n_releases, 1);
        ck_assert_uint_eq(host_.n_reclaims, 1);
        /* The memory stays charged: its processes still map it. */
        ck_assert_uint_eq(stopped->tenant->charged_bytes, 20 * MiB);
        ck_assert_uint_eq(lstopped->tenant->charged_bytes, 20 * MiB);
        gm_tenant_view_t *views;
        size_t n_views;
        ck_assert_int_eq(gm_broker_tenant_views(b_, &views, &n_views), 0);
        uint32_t marked = 0;
        for (size_t i = 0; i < n_views; i++)
                marked += views[i].unresponsive;
        free(views);
        ck_assert_uint_eq(marked, 2);
        CHECK(b_);

        /* Continued, they answer: responsive again, and the memory is used. */
        ack_all(stopped);
        ck_assert(!stopped->unresponsive);
        ck_assert_uint_eq(stopped->owing_since_ms, 0);
        return_whole(lstopped, 1, 20 * MiB);
        ck_assert_int_eq(gm_reclaim_ack(lstopped, host_.reclaims[0].id, 20 * MiB), 0);
        ck_assert(!lstopped->unresponsive);
        ck_assert_int_eq(host_.unresponsive, 0);
        alloc_ok(busy, 20 * MiB);
        grant_ok(lbusy, 1, 20 * MiB);
        CHECK(b_);
}
END_TEST

START_TEST(test_checker_catches_broken_books) {
        gm_session_t *s = session(b_, 1000, "a");
        alloc_ok(s, 2 * MiB);
        char why[256];
        s->tenant->charged_bytes += 1;
        ck_assert_int_gt(gm_broker_check(b_, why, sizeof(why)), 0);
        ck_assert_msg(strstr(why, "tenant 'a' charged"), "why: %s", why);
        s->tenant->charged_bytes -= 1;
        backend_.in_use += 4096;
        ck_assert_int_gt(gm_broker_check(b_, why, sizeof(why)), 0);
        ck_assert_msg(strstr(why, "backend in use"), "why: %s", why);
        backend_.in_use -= 4096;
        s->releasing_bytes = 1;
        ck_assert_int_gt(gm_broker_check(b_, why, sizeof(why)), 0);
        s->releasing_bytes = 0;
        s->return_intent_open = true;
        ck_assert_int_gt(gm_broker_check(b_, why, sizeof(why)), 0);
        ck_assert_msg(strstr(why, "a return intent open in a central session"), "why: %s", why);
        s->return_intent_open = false;
        CHECK(b_);
        gm_session_t *l = local_session(b_, 1001, "l");
        grant_ok(l, 1, 2 * MiB);
        l->grants.pieces++;
        ck_assert_int_gt(gm_broker_check(b_, why, sizeof(why)), 0);
        ck_assert_msg(strstr(why, "granted"), "why: %s", why);
        l->grants.pieces--;
        gm_stat_update(&l->grants.segments, 1);
        ck_assert_int_gt(gm_broker_check(b_, why, sizeof(why)), 0);
        gm_stat_update(&l->grants.segments, -1);
        l->unresponsive = true;
        ck_assert_int_gt(gm_broker_check(b_, why, sizeof(why)), 0);
        l->unresponsive = false;
        CHECK(b_);
}
END_TEST

START_TEST(test_tenant_views_and_persistent_quotas) {
        gm_tenant_set_quota(gm_tenant_get(b_, "zeta"), GM_QUOTA_PERSISTENT, true, 5 * MiB);
        gm_tenant_set_quota(gm_tenant_get(b_, "alpha"), GM_QUOTA_PERSISTENT, true, 7 * MiB);
        ck_assert_int_eq(gm_tenant_quotas_save(b_, dir_), 0);
        gm_session_t *s = session(b_, 1000, "alpha");
        uint64_t blk = alloc_ok(s, 1 * MiB);
        ck_assert_int_eq(gm_session_central_free_block(s, blk, false), 0);
        gm_tenant_view_t *v;
        size_t n;
        ck_assert_int_eq(gm_broker_tenant_views(b_, &v, &n), 0);
        ck_assert_uint_eq(n, 2);
        ck_assert_str_eq(v[0].tenant->name, "alpha");
        ck_assert_uint_eq(v[0].largest_free, 2 * MiB);
        ck_assert_str_eq(v[1].tenant->name, "zeta");
        free(v);
        gm_session_free(s);

        gm_broker_t *other = broker_new(NULL, 0);
        ck_assert_int_eq(gm_tenant_quotas_load(other, dir_), 0);
        ck_assert_uint_eq(gm_tenant_find(other, "alpha")->quota, 7 * MiB);
        ck_assert_str_eq(gm_tenant_quota_source(gm_tenant_find(other, "zeta")), "persistent");
        gm_broker_free(other);
        char path[160];
        snprintf(path, sizeof(path), "%s/quotas", dir_);
        unlink(path);
}
END_TEST

START_TEST(test_set_quota_saves_or_keeps_the_old) {
        ck_assert_int_eq(gm_ledger_open(b_, ledger_), 0);
        ck_assert_int_eq(gm_broker_set_quota(b_, "t", false, 9 * MiB, dir_), 0);
        ck_assert_uint_eq(gm_tenant_find(b_, "t")->quota, 9 * MiB);
        /* A save that fails keeps the old persistent quota. */
        ck_assert_int_lt(gm_broker_set_quota(b_, "t", false, 1 * MiB, "/proc/gm-no-such-dir"), 0);
        ck_assert_uint_eq(gm_tenant_find(b_, "t")->quota, 9 * MiB);
        /* A runtime one wins, and comes back from the ledger. */
        ck_assert_int_eq(gm_broker_set_quota(b_, "t", true, 3 * MiB, NULL), 0);
        ck_assert_str_eq(gm_tenant_quota_source(gm_tenant_find(b_, "t")), "runtime");
        CHECK(b_);
        gm_broker_t *next = broker_new(NULL, 0);
        ck_assert_int_eq(gm_ledger_open(next, ledger_), 0);
        ck_assert_int_eq(gm_tenant_quotas_load(next, dir_), 0);
        gm_tenant_t *t = gm_tenant_find(next, "t");
        ck_assert_uint_eq(t->quota, 3 * MiB);
        ck_assert_uint_eq(t->quota_by_source[GM_QUOTA_PERSISTENT], 9 * MiB);
        gm_broker_free(next);
        char path[160];
        snprintf(path, sizeof(path), "%s/quotas", dir_);
        unlink(path);
}
END_TEST

/* Tagged pools: each session's pool bytes are its charged pieces' (checked
 * by gm_broker_check() after every step), a Grant's id keeps its name, at
 * most 16 names, and a tenant's tag_quota refuses a piece past it, naming
 * the pool. */
START_TEST(test_tagged_pool_books) {
        gm_tag_quota_t q[GM_TENANT_MAX_TAG_QUOTAS];
        size_t n = 0;
        ck_assert_int_eq(gm_tag_quotas_parse("kv:16M,weights:1G", q, &n), 0);
        ck_assert_uint_eq(n, 2);
        ck_assert_str_eq(q[0].tag, "kv");
        ck_assert_uint_eq(q[1].bytes, 1ull << 30);
        ck_assert_int_eq(gm_tag_quotas_parse("kv:16M,kv:1G", q, &n), -EINVAL);
        ck_assert_int_eq(gm_tag_quotas_parse("kv:0", q, &n), -EINVAL);
        ck_assert_int_eq(gm_tag_quotas_parse("bad tag:1G", q, &n), -EINVAL);
        ck_assert_int_eq(gm_tag_quotas_parse(":1G", q, &n), -EINVAL);
        ck_assert_int_eq(gm_tag_quotas_parse("kv:16M", q, &n), 0);
        gm_tenant_set_tag_quotas(gm_tenant_get(b_, "r"), q, n);

        gm_session_t *s = local_session(b_, 1000, "r");
        gm_outcome_t out;
        gm_grant_t g = whole(1, 8 * MiB);
        g.tag = "kv";
        g.tag_id = 1;
        gm_broker_grant(s, 1, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REPLY);
        CHECK(b_);
        ck_assert_uint_eq(s->tags.bytes[1], 8 * MiB);
        g = whole(2, 12 * MiB); /* 20 MiB in kv: past its 16 MiB */
        g.tag = "kv";
        g.tag_id = 1;
        gm_broker_grant(s, 2, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(out.error, -EDQUOT);
        ck_assert_msg(strstr(out.message, "pool 'kv'"), "message: %s", out.message);
        g.tag = "other"; /* id 1 is kv's */
        gm_broker_grant(s, 3, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(out.error, -EINVAL);
        g.tag = "weights";
        g.tag_id = 2;
        gm_broker_grant(s, 4, &g, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REPLY);
        grant_ok(s, 3, 2 * MiB); /* the default pool */
        CHECK(b_);
        gm_session_view_t v;
        gm_session_view(s, &v);
        ck_assert_uint_eq(v.tags->bytes[0], 2 * MiB);
        ck_assert_uint_eq(v.tags->bytes[2], 12 * MiB);
        ck_assert_str_eq(v.tags->names[2], "weights");
        ck_assert_uint_eq(gm_tenant_tag_charged(b_, s->tenant, "kv"), 8 * MiB);
        /* a refusal at the tenant's quota names its biggest pools */
        gm_tenant_set_quota(s->tenant, GM_QUOTA_RUNTIME, true, 24 * MiB);
        g = whole(4, 4 * MiB);
        gm_broker_grant(s, 5, &g, &out);
        ck_assert_int_eq(out.error, -EDQUOT);
        ck_assert_msg(strstr(out.message, "biggest pools: 'weights' 12.00 MiB, 'kv' 8.00 MiB, 'default' 2.00 MiB."),
                      "message: %s", out.message);
        gm_tenant_set_quota(s->tenant, GM_QUOTA_RUNTIME, false, 0);
        return_whole(s, 1, 8 * MiB);
        ck_assert_uint_eq(s->tags.bytes[1], 0);

        /* central: the broker numbers the names, 16 at most */
        gm_session_t *c = session(b_, 1001, "r");
        char name[16];
        for (int i = 0; i < GM_SESSION_MAX_TAGS; i++) {
                snprintf(name, sizeof(name), "t%d", i);
                gm_broker_alloc_tagged(c, 10 + (uint64_t) i, 4096, 0, name, false, NULL, 0, &out);
                ck_assert_msg(out.kind == GM_OUTCOME_REPLY, "%s: %s", name, out.message);
                gm_broker_commit(c, &out);
                CHECK(b_);
        }
        ck_assert_uint_eq(c->tags.bytes[16], 2 * MiB); /* its own small segment */
        gm_broker_alloc_tagged(c, 30, 4096, 0, "one_too_many", false, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(out.error, -E2BIG);
        gm_broker_alloc_tagged(c, 31, 4096, 0, "bad name", false, NULL, 0, &out);
        ck_assert_int_eq(out.error, -EINVAL);
        gm_session_free(c);
        gm_session_free(s);
        CHECK(b_);
}
END_TEST

START_TEST(test_alloc_conf_reaches_stats_everywhere) {
        gm_session_t *s = session(b_, 1000, "a");
        alloc_ok(s, 1 * MiB);
        gm_alloc_config_t conf;
        char err[128];
        ck_assert_int_eq(gm_alloc_config_parse("max_split_size_mb:64", &conf, err, sizeof(err)), 0);
        gm_broker_set_alloc_config(b_, &conf);
        ck_assert_int_eq(b_->device_stats.max_split_size, 64 * MiB);
        ck_assert_int_eq(s->tenant->stats.max_split_size, 64 * MiB);
        ck_assert_int_eq(gm_tenant_get(b_, "new")->stats.max_split_size, 64 * MiB);
        CHECK(b_);
}
END_TEST

/* ---- the shared registry ---- */

/* Create, publish, open by another tenant, the publisher's end, unpublish
 * and the last close: charged once, to the publisher's tenant, until the
 * memory is back; the books hold after every step. */
/* A fresh broker over the journal, with a store, after a restart with
 * nothing stored. */
static void restart_with_store(void) {
        b_ = gm_broker_free(b_);
        b_ = broker_new(NULL, 16);
        ck_assert_int_eq(gm_ledger_open(b_, ledger_), 0);
        gm_orphan_adopt_done(b_, gm_now_ms());
}

START_TEST(test_shared_books) {
        gm_session_t *pub = session(b_, 1000, "a"), *rd = session(b_, 1001, "b"), *other = session(b_, 1002, "c");
        gm_shared_view_t v;
        ck_assert_int_eq(gm_shared_create(pub, "bad name", MiB, &v), -EINVAL);
        ck_assert_int_eq(gm_shared_create(pub, "w", 0, &v), -EINVAL);
        ck_assert_int_eq(gm_shared_create(pub, "w", 1024 * MiB, &v), -EFBIG);
        ck_assert_int_eq(gm_shared_create(pub, "model/w:1", 3 * MiB, &v), 0);
        CHECK(b_);
        ck_assert_uint_eq(v.size, 4 * MiB); /* whole granules */
        ck_assert_int_eq(v.state, GM_SHARED_STAGING);
        ck_assert_uint_eq(gm_tenant_find(b_, "a")->charged_bytes, 4 * MiB);
        ck_assert_uint_eq(backend_.in_use, 4 * MiB);
        ck_assert_int_eq(gm_shared_open(rd, "model/w:1", 0, &v), -ENOENT); /* not published yet */
        uint64_t id = v.id;
        const char *readers[] = {"b"};
        ck_assert_int_eq(gm_shared_publish(rd, id, readers, 1, NULL, 0, 0, &v), -ENOENT); /* not its own */
        const char *bad[] = {"has space"};
        ck_assert_int_eq(gm_shared_publish(pub, id, bad, 1, NULL, 0, 0, &v), -EINVAL);
        ck_assert_int_eq(gm_shared_publish(pub, id, readers, 1, "meta", 4, 0, &v), 0);
        CHECK(b_);
        ck_assert_uint_eq(v.version, 1);
        ck_assert_uint_eq(v.mappers, 1); /* the publisher maps it read-only */
        ck_assert_uint_eq(v.meta_len, 4);

        ck_assert_int_eq(gm_shared_open(other, "model/w:1", 0, &v), -EACCES);
        ck_assert_int_eq(gm_shared_open(rd, "model/w:1", 2, &v), -ENOENT);
        ck_assert_int_eq(gm_shared_open(rd, "model/w:1", 0, &v), 0);
        ck_assert_int_eq(gm_shared_open(rd, "model/w:1", 1, &v), 0);
        CHECK(b_);
        ck_assert_uint_eq(v.mappers, 3);
        ck_assert_uint_eq(gm_tenant_find(b_, "b")->charged_bytes, 0); /* charged once, to the publisher */

        /* The publisher goes; the object stays. */
        gm_session_free(pub);
        CHECK(b_);
        ck_assert_uint_eq(gm_tenant_find(b_, "a")->charged_bytes, 4 * MiB);
        ck_assert_int_eq(gm_shared_unpublish(rd, "model/w:1", 0), -EPERM); /* not its tenant's, not an admin */

        /* A second version; unpublish by the publisher's tenant. */
        gm_session_t *pub2 = session(b_, 1000, "a");
        ck_assert_int_eq(gm_shared_create(pub2, "model/w:1", MiB, &v), 0);
        ck_assert_int_eq(gm_shared_create(pub2, "model/w:1", MiB, &v), -EEXIST);
        ck_assert_int_eq(gm_shared_publish(pub2, v.id, NULL, 0, NULL, 0, 0, &v), 0);
        ck_assert_uint_eq(v.version, 2);
        ck_assert_int_eq(gm_shared_open(rd, "model/w:1", 2, &v), -EACCES); /* the publisher's tenant only */
        ck_assert_uint_eq(gm_tenant_find(b_, "a")->charged_bytes, 6 * MiB);
        ck_assert_int_eq(gm_shared_close(pub2, v.id), 0);
        ck_assert_int_eq(gm_shared_close(pub2, v.id), -ENOENT);
        CHECK(b_);
        ck_assert_int_eq(gm_shared_unpublish(pub2, "model/w:1", 0), 0);
        CHECK(b_);
        /* Version 2 had no mapper: gone; version 1 waits for rd's two opens. */
        ck_assert_uint_eq(gm_tenant_find(b_, "a")->charged_bytes, 4 * MiB);
        ck_assert_int_eq(gm_shared_open(rd, "model/w:1", 0, &v), -ENOENT);
        ck_assert_int_eq(gm_shared_close(rd, id), 0);
        CHECK(b_);
        ck_assert_uint_eq(gm_tenant_find(b_, "a")->charged_bytes, 4 * MiB);
        gm_session_free(rd); /* its last open goes with it */
        CHECK(b_);
        ck_assert_uint_eq(gm_tenant_find(b_, "a")->charged_bytes, 0);
        ck_assert_uint_eq(backend_.in_use, 0);

        /* A staging object dies with its session; the quota counts it. */
        gm_tenant_set_quota(gm_tenant_get(b_, "a"), GM_QUOTA_CONFIG, true, 8 * MiB);
        ck_assert_int_eq(gm_shared_create(pub2, "x", 10 * MiB, &v), -EFBIG);
        ck_assert_int_eq(gm_shared_create(pub2, "x", 6 * MiB, &v), 0);
        ck_assert_int_eq(gm_shared_create(pub2, "y", 4 * MiB, &v), -EDQUOT);
        gm_session_free(pub2);
        CHECK(b_);
        ck_assert_uint_eq(gm_tenant_find(b_, "a")->charged_bytes, 0);
        ck_assert_ptr_null(gm_shared_next(b_, NULL));
        gm_session_free(other);
}
END_TEST

/* A published object survives the broker (its fd stored, its entry and side
 * file journalled) and comes back published, with readers and meta; its
 * unpublish after the restart gives the memory back. Retention withdraws. */
START_TEST(test_shared_survives_restart) {
        restart_with_store();
        gm_session_t *pub = session(b_, 1000, "a");
        gm_shared_view_t v;
        ck_assert_int_eq(gm_shared_create(pub, "weights", 2 * MiB, &v), 0);
        const char *readers[] = {"*"};
        ck_assert_int_eq(gm_shared_publish(pub, v.id, readers, 1, "layout", 6, 0, &v), 0);
        ck_assert_int_eq(gm_shared_create(pub, "short", 2 * MiB, &v), 0);
        ck_assert_int_eq(gm_shared_publish(pub, v.id, NULL, 0, NULL, 0, 1, &v), 0);
        ck_assert_uint_eq(host_.n_stored, 2);
        CHECK(b_);
        b_->keep_stored = true;
        b_ = gm_broker_free(b_);
        ck_assert_uint_eq(backend_.in_use, 0);

        b_ = broker_new(NULL, 16);
        ck_assert_int_eq(gm_ledger_open(b_, ledger_), 0);
        for (size_t i = 0; i < host_.n_stored; i++)
                gm_orphan_adopt(b_, host_.stored[i].name, fcntl(host_.stored[i].fd, F_DUPFD_CLOEXEC, 3));
        gm_orphan_adopt_done(b_, gm_now_ms());
        CHECK(b_);
        ck_assert_ptr_null(b_->orphans); /* the registry's, not orphans */
        ck_assert_uint_eq(gm_tenant_find(b_, "a")->charged_bytes, 4 * MiB);
        gm_session_t *rd = session(b_, 1001, "b");
        ck_assert_int_eq(gm_shared_open(rd, "weights", 0, &v), 0);
        ck_assert_uint_eq(v.version, 1);
        ck_assert_uint_eq(v.meta_len, 6);
        ck_assert_mem_eq(v.meta, "layout", 6);
        ck_assert_uint_eq(v.n_readers, 1);
        ck_assert_str_eq(v.readers[0], "*");
        ck_assert_int_eq(v.state, GM_SHARED_PUBLISHED);
        CHECK(b_);

        /* A re-attaching session's report: an adopted object with that name,
         * version and size, its tenant admitted; closed by the old id. */
        gm_session_t *back = session(b_, 1002, "c");
        ck_assert_int_eq(gm_shared_reattach(back, 777, "weights", 1, 4 * MiB), -ENOENT); /* not its size */
        ck_assert_int_eq(gm_shared_reattach(back, 777, "weights", 2, 2 * MiB), -ENOENT);
        ck_assert_int_eq(gm_shared_reattach(back, 777, "short", 1, 2 * MiB), -EACCES);
        ck_assert_int_eq(gm_shared_reattach(back, 777, "weights", 1, 2 * MiB), 0);
        ck_assert_int_eq(gm_shared_reattach(back, 777, "weights", 1, 2 * MiB), 0); /* two handles */
        CHECK(b_);
        ck_assert_int_eq(gm_shared_close(back, 777), 0);
        ck_assert_int_eq(gm_shared_close(back, v.id), -ENOENT); /* it knows the object by 777 */
        CHECK(b_);
        gm_session_free(back); /* drops the other */
        CHECK(b_);

        /* Retention: withdrawn once over, released with no mapper once the
         * re-attach window is over (until then a mapper may come back). */
        gm_shared_expire(b_, gm_realtime_us() / 1000 + 2000);
        CHECK(b_);
        ck_assert_uint_eq(gm_tenant_find(b_, "a")->charged_bytes, 4 * MiB);
        b_->orphans_deadline_ms = gm_now_ms(); /* the window ends */
        gm_shared_expire(b_, gm_realtime_us() / 1000 + 2000);
        CHECK(b_);
        ck_assert_uint_eq(gm_tenant_find(b_, "a")->charged_bytes, 2 * MiB);
        back = session(b_, 1003, "c");
        ck_assert_int_eq(gm_shared_reattach(back, 1, "weights", 1, 2 * MiB), -ENOENT); /* window over */
        gm_session_free(back);
        gm_session_t *admin = session(b_, 0, "root");
        admin->admin = true;
        ck_assert_int_eq(gm_shared_unpublish(admin, "weights", 1), 0);
        CHECK(b_);
        ck_assert_uint_eq(gm_tenant_find(b_, "a")->charged_bytes, 2 * MiB); /* rd maps it still */
        ck_assert_int_eq(gm_shared_close(rd, v.id), 0);
        CHECK(b_);
        ck_assert_uint_eq(gm_tenant_find(b_, "a")->charged_bytes, 0);
        ck_assert_uint_eq(host_.n_stored, 0);
        gm_session_free(rd);
        gm_session_free(admin);
        CHECK(b_);
        /* Nothing shared is left in the journal. */
        b_ = gm_broker_free(b_);
        b_ = broker_new(NULL, 16);
        ck_assert_int_eq(gm_ledger_open(b_, ledger_), 0);
        ck_assert_uint_eq(b_->n_ledger_shared, 0);
        gm_orphan_adopt_done(b_, gm_now_ms());
}
END_TEST

/* The process figure of a session that maps a shared object shows the
 * object: it is the daemon's memory, not memory the session took back, so
 * the audit does not charge it. */
START_TEST(test_shared_mapping_is_not_audited) {
        gm_session_t *s = audited_session();
        gm_tenant_t *t = s->tenant;
        gm_session_t *pub = session(b_, 1001, "b");
        gm_shared_view_t v;
        ck_assert_int_eq(gm_shared_create(pub, "w", 8 * MiB, &v), 0);
        const char *all[] = {"*"};
        ck_assert_int_eq(gm_shared_publish(pub, v.id, all, 1, NULL, 0, 0, &v), 0);
        ck_assert_int_eq(gm_shared_open(s, "w", 0, &v), 0);
        figure_ += 8 * MiB; /* maps the object */
        uint64_t now = gm_now_ms();
        gm_broker_tick(b_, now + 1000);
        gm_broker_tick(b_, now + 2000);
        CHECK(b_);
        ck_assert_uint_eq(t->audited_bytes, 0);
        ck_assert_uint_eq(t->charged_bytes, 0);
        ck_assert_int_eq(gm_shared_close(s, v.id), 0);
        figure_ -= 8 * MiB;
        gm_session_free(pub);
        CHECK(b_);
}
END_TEST

/* A claim covers what its session stages; a publish refused while a
 * writable mapping is left; the checker sees a registry's broken books. */
START_TEST(test_shared_checker) {
        gm_session_t *pub = session(b_, 1000, "a");
        gm_shared_view_t v;
        uint64_t claimed;
        ck_assert_int_eq(gm_broker_claim(pub, 10 * MiB, &claimed), 0);
        ck_assert_int_eq(gm_shared_create(pub, "w", MiB, &v), 0);
        ck_assert_uint_eq(pub->claim_bytes, 8 * MiB); /* a staging object is taken from its claim */
        CHECK(b_);
        ck_assert_int_eq(gm_shared_publish(pub, v.id, NULL, 0, NULL, 0, 0, &v), 0);
        char why[256];
        b_->shared->mappers++;
        ck_assert_int_gt(gm_broker_check(b_, why, sizeof(why)), 0);
        ck_assert_ptr_nonnull(strstr(why, "mappers"));
        b_->shared->mappers--;
        gm_tenant_find(b_, "a")->charged_bytes -= MiB;
        ck_assert_int_gt(gm_broker_check(b_, why, sizeof(why)), 0);
        gm_tenant_find(b_, "a")->charged_bytes += MiB;
        CHECK(b_);
        /* A writable mapping left: the publish is refused, the object stays
         * staging (unnumbered, not openable), and publishes once it is gone. */
        ck_assert_int_eq(gm_shared_create(pub, "busy", MiB, &v), 0);
        freeze_busy_ = true;
        ck_assert_int_eq(gm_shared_publish(pub, v.id, NULL, 0, "m", 1, 0, &v), -EBUSY);
        freeze_busy_ = false;
        CHECK(b_);
        ck_assert_int_eq(gm_shared_open(pub, "busy", 0, &v), -ENOENT);
        ck_assert_int_eq(gm_shared_publish(pub, v.id, NULL, 0, "m", 1, 0, &v), 0);
        ck_assert_uint_eq(v.version, 1);
        CHECK(b_);
        gm_session_free(pub);
        ck_assert_int_eq(gm_shared_unpublish(session(b_, 0, "a"), "busy", 0), 0);
        ck_assert_int_eq(gm_shared_unpublish(session(b_, 0, "a"), "w", 0), 0);
        CHECK(b_);
}
END_TEST

/* Claims: set aside at once, taken for everyone else (refusals say so),
 * consumed by the claimant's new pieces (local grants and central segments
 * alike), lapsing at 0 and with the session; the checker keeps the books. */
START_TEST(test_claims) {
        backend_.capacity = 128 * MiB;
        gm_session_t *a = local_session(b_, 1000, "a"), *b = local_session(b_, 1001, "b");
        gm_session_t *c = session(b_, 1002, "c"); /* central */
        uint64_t claimed = 7;
        ck_assert_int_eq(gm_broker_claim(a, 129 * MiB, &claimed), -EINVAL);
        ck_assert_uint_eq(claimed, 7);
        ck_assert_int_eq(gm_broker_claim(a, 100 * MiB, &claimed), 0);
        ck_assert_uint_eq(claimed, 100 * MiB);
        ck_assert_int_eq(gm_broker_claim(b, 100 * MiB, &claimed), 0);
        ck_assert_uint_eq(claimed, 28 * MiB); /* only what a left */
        CHECK(b_);
        ck_assert_uint_eq(gm_broker_room(a), 100 * MiB);
        ck_assert_uint_eq(gm_broker_room(c), 0);
        gm_outcome_t out;
        gm_broker_alloc(c, 1, 512 * 1024, 0, NULL, 0, &out);
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(out.error, -ENOMEM);
        ck_assert_msg(strstr(out.message, "128.00 MiB of what is free is claimed"), "message: %s", out.message);
        CHECK(b_);

        grant_ok(a, 1, 64 * MiB); /* inside its claim */
        ck_assert_uint_eq(a->claim_bytes, 36 * MiB);
        grant_ok(b, 1, 28 * MiB);
        ck_assert_uint_eq(b->claim_bytes, 0);
        ck_assert_uint_eq(b_->claimed_bytes, 36 * MiB);
        ck_assert_int_eq(gm_broker_claim(a, 0, &claimed), 0); /* lapses */
        ck_assert_uint_eq(claimed, 0);
        ck_assert_uint_eq(b_->claimed_bytes, 0);
        CHECK(b_);

        ck_assert_int_eq(gm_broker_claim(c, 30 * MiB, &claimed), 0);
        ck_assert_uint_eq(claimed, 30 * MiB);
        client_uses(a, 64 * MiB); /* no cache anywhere to reclaim */
        client_uses(b, 28 * MiB);
        gm_grant_t g = whole(2, 8 * MiB);
        gm_broker_grant(a, 2, &g, &out); /* 36 MiB free, 30 of it claimed */
        ck_assert_int_eq(out.kind, GM_OUTCOME_REFUSE);
        ck_assert_int_eq(out.error, -ENOMEM);
        alloc_ok(c, 4 * MiB); /* a 20 MiB segment, taken from its claim */
        ck_assert_uint_eq(c->claim_bytes, 10 * MiB);
        ck_assert_uint_eq(gm_tenant_find(b_, "c")->claimed_bytes, 10 * MiB);
        b_->claimed_bytes++; /* a broken book is caught */
        ck_assert_int_gt(gm_broker_check(b_, NULL, 0), 0);
        b_->claimed_bytes--;
        gm_session_end(c);
        ck_assert_uint_eq(b_->claimed_bytes, 0);
        ck_assert_uint_eq(gm_tenant_find(b_, "c")->claimed_bytes, 0);
        CHECK(b_);
}
END_TEST

static Suite *broker_suite(void) {
        Suite *s = suite_create("broker");
        TCase *tc = tcase_create("core");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_test(tc, test_quota_refuses_and_charges_exactly);
        tcase_add_test(tc, test_grant_run_all_or_nothing);
        tcase_add_test(tc, test_claims);
        tcase_add_test(tc, test_central_run_all_or_nothing);
        tcase_add_test(tc, test_reclaim_parks_until_the_ack);
        tcase_add_test(tc, test_capturing_alloc_keeps_its_own_cache);
        tcase_add_test(tc, test_miss_waits_for_its_own_cache_release);
        tcase_add_test(tc, test_unacknowledged_release_is_asked_again);
        tcase_add_test(tc, test_whole_segment_travels_last);
        tcase_add_test(tc, test_grant_without_a_heap);
        tcase_add_test(tc, test_grants_park_until_reclaimed);
        tcase_add_test(tc, test_grant_timeout_and_end_while_parked);
        tcase_add_test(tc, test_sleep_record_and_waiting_grant);
        tcase_add_test(tc, test_unresponsive_client_is_not_waited_for);
        tcase_add_test(tc, test_alloc_undo_keeps_new_pieces_for_the_next_reply);
        tcase_add_test(tc, test_ledger_replay_and_reattach);
        tcase_add_test(tc, test_ledger_compacted_while_churning);
        tcase_add_test(tc, test_reattach_without_store_is_unbacked);
        tcase_add_test(tc, test_ledger_skips_impossible_records);
        tcase_add_test(tc, test_ledger_keeps_pools_through_moves);
        tcase_add_test(tc, test_ledger_pool_records);
        tcase_add_test(tc, test_release_checked_by_process_figure);
        tcase_add_test(tc, test_return_checked_by_process_figure);
        tcase_add_test(tc, test_return_intent_notes_reference);
        tcase_add_test(tc, test_audit_finds_memory_taken_back);
        tcase_add_test(tc, test_trust_releases_unverifiable_return);
        tcase_add_test(tc, test_release_during_release_keeps_reference);
        tcase_add_test(tc, test_release_with_reply_in_flight_not_a_lie);
        tcase_add_test(tc, test_checker_catches_broken_books);
        tcase_add_test(tc, test_tenant_views_and_persistent_quotas);
        tcase_add_test(tc, test_set_quota_saves_or_keeps_the_old);
        tcase_add_test(tc, test_alloc_conf_reaches_stats_everywhere);
        tcase_add_test(tc, test_shared_books);
        tcase_add_test(tc, test_shared_survives_restart);
        tcase_add_test(tc, test_shared_checker);
        tcase_add_test(tc, test_shared_mapping_is_not_audited);
        tcase_add_test(tc, test_tagged_pool_books);
        suite_add_tcase(s, tc);
        return s;
}

int main(void) {
        return gm_test_run_suite(broker_suite());
}
