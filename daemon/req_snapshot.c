/* Asynchronous snapshots: see req_snapshot.h.
 *
 * A job's life: collecting (on the loop, in gm_req_snapshot_handle), waiting
 * (for its asks: local sessions' answers), rendering (its data belongs to
 * the worker; the loop touches only `conn`), done (answered and freed on
 * the loop). An ask ends answered (its bytes in `answer`), or silent (late,
 * gone, refused or invalid): then its pieces, copied at the start, stand in
 * for its blocks. Local sessions' addresses (each heap's own, from 0) are
 * moved to windows of their own above every central address.
 *
 * The bytes reach the client through a pipe (the reply's fd), written off
 * the loop: the client reads them into its own memory, so nothing the
 * daemon made stays behind in a file the client holds; the daemon keeps
 * the rendered bytes only until they are read or STREAM_TIMEOUT_MS pass.
 * Without a worker (request-layer test harnesses) they go in a sealed memfd. */
#include "req_snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "localstats.h"
#include "log.h"
#include "memfd.h"
#include "snapshot.h"
#include "text.h"

/* Local sessions' windows start here (central addresses start at 2^40 and
 * stay far below), and stay below the shared objects' segments (from 2^52;
 * every address stays below 2^53, exact in JavaScript). One session's
 * declared span is at most LOCAL_SPAN_MAX. */
#define LOCAL_BASE_MIN (1ull << 46)
#define ADDR_LIMIT GM_SNAPSHOT_SHARED_BASE
#define LOCAL_SPAN_MAX (1ull << 44)
#define WINDOW_ALIGN (2ull << 20)
/* An admin's snapshot: entries (segments + blocks + trace) at most. */
#define ADMIN_MAX_ENTRIES (64ull << 20)
/* A client's time to read its snapshot out of the pipe. */
#define STREAM_TIMEOUT_MS 30000
/* The pipe's buffer, asked of the kernel (a hint). */
#define STREAM_PIPE_BYTES (1 << 20)

typedef enum ask_state {
        ASK_WAITING,
        ASK_ANSWERED,
        ASK_SILENT, /* late, gone, refused, or an answer over its limit */
} ask_state_t;

typedef struct ask {
        gm_request_conn_t *conn; /* NULL once it ended */
        uint64_t query_id;
        uint32_t owner; /* in the job's data */
        uint32_t pid;
        ask_state_t state;
        gm_snapshot_piece_t *pieces; /* what it was granted, sorted */
        size_t n_pieces;
        char *answer; /* its bytes so far */
        size_t answer_len, answer_cap;
        bool invalid; /* its answer failed the checks (the worker's verdict) */
} ask_t;

struct gm_snapjob {
        gm_snapjobs_t *jobs;
        const gm_requests_t *rq;
        gm_request_conn_t *conn; /* the asker; NULL once it is gone */
        uint64_t request_id;
        Gpumem__SnapshotFormat wire_format;
        gm_snapshot_options_t opts;
        gm_alloc_config_t config;
        uint64_t max_entries;
        uint64_t deadline_ms;
        uint64_t local_base;
        gm_snapshot_data_t *data;
        ask_t *asks;
        size_t n_asks, n_waiting;
        uint64_t answer_bytes; /* of all its answers: at most twice answer_max_bytes */
        bool collecting;       /* still in gm_req_snapshot_handle: not finished from callbacks */
        bool rendering;
        /* The worker's results: the bytes (or, without a worker, a memfd). */
        int result;
        char *buf;
        int fd;
        uint64_t size;
        int stream_fd; /* the pipe's write end while the bytes are being read */
        uint32_t unanswered;
        gm_snapjob_t *prev, *next;
};

static void job_unlink(gm_snapjob_t *j) {
        gm_snapjobs_t *js = j->jobs;
        if (j->prev)
                j->prev->next = j->next;
        else
                js->jobs = j->next;
        if (j->next)
                j->next->prev = j->prev;
        js->n_jobs--;
}

static void job_free(gm_snapjob_t *j) {
        for (size_t i = 0; i < j->n_asks; i++) {
                free(j->asks[i].pieces);
                free(j->asks[i].answer);
        }
        free(j->asks);
        gm_snapshot_data_free(j->data);
        if (j->fd >= 0)
                close(j->fd);
        if (j->stream_fd >= 0)
                close(j->stream_fd);
        free(j->buf);
        free(j);
}

/* ---- the worker (off the loop): only the job's own data ---- */

static void copy_bytes(void *dst, size_t len, const void *src) {
        memcpy(dst, src, len);
}

static uint64_t entries_of(const gm_snapshot_data_t *d) {
        return gm_snapshot_data_blocks(d) + gm_snapshot_data_traces(d);
}

/* Adds one ask: its answer when it holds, else its pieces, marked. */
static int add_ask(gm_snapjob_t *j, ask_t *a, uint64_t *base) {
        uint64_t span = 0, used = entries_of(j->data);
        int r = -EBADMSG;
        if (*base >= ADDR_LIMIT)
                return -E2BIG;
        if (a->state == ASK_ANSWERED) {
                gm_snapshot_answer_limits_t lim = {
                        .pieces = a->pieces,
                        .n_pieces = a->n_pieces,
                        .max_va_span = ADDR_LIMIT - *base < LOCAL_SPAN_MAX ? ADDR_LIMIT - *base : LOCAL_SPAN_MAX,
                        .max_blocks = used < j->max_entries ? j->max_entries - used : 0,
                        .pid = a->pid,
                };
                r = gm_snapshot_data_add_answer(j->data, a->owner, a->answer, a->answer_len, &lim, *base, &span);
                if (r == -ENOMEM)
                        return r;
                a->invalid = r < 0;
        }
        if (r < 0) {
                j->unanswered++;
                gm_snapshot_data_set_blocks_unknown(j->data, a->owner);
                r = gm_snapshot_data_add_pieces(j->data, a->owner, a->pieces, a->n_pieces, *base, &span);
                if (r < 0)
                        return r;
        }
        *base += (span + WINDOW_ALIGN - 1) / WINDOW_ALIGN * WINDOW_ALIGN + WINDOW_ALIGN;
        return 0;
}

static void render_job(void *arg) {
        gm_snapjob_t *j = arg;
        uint64_t base = j->local_base;
        int r = 0;
        for (size_t i = 0; i < j->n_asks && r == 0; i++) {
                r = add_ask(j, &j->asks[i], &base);
                free(j->asks[i].answer);
                j->asks[i].answer = NULL;
        }
        size_t len = 0;
        if (r == 0)
                r = gm_snapshot_render(j->data, &j->opts, &j->buf, &len);
        j->data = gm_snapshot_data_free(j->data);
        j->size = len;
        j->result = r;
}

/* Writes the bytes into the pipe until they are read, the reader goes, or
 * the deadline passes (the client then sees a short snapshot). */
static void stream_job(void *arg) {
        gm_snapjob_t *j = arg;
        uint64_t deadline = gm_now_ms() + STREAM_TIMEOUT_MS;
        size_t at = 0;
        while (at < j->size) {
                ssize_t n = write(j->stream_fd, j->buf + at, j->size - at);
                if (n > 0) {
                        at += (size_t) n;
                        continue;
                }
                uint64_t now = gm_now_ms();
                if (n == 0 || (errno != EAGAIN && errno != EINTR) || now >= deadline)
                        break;
                struct pollfd p = {.fd = j->stream_fd, .events = POLLOUT};
                poll(&p, 1, (int) (deadline - now));
        }
        close(j->stream_fd);
        j->stream_fd = -1;
}

static void stream_done(void *arg) {
        gm_snapjob_t *j = arg;
        job_unlink(j);
        job_free(j);
}

/* The reply's fd: a pipe the worker fills (its write end kept in the job),
 * or, without a worker, a memfd. */
static int reply_fd(gm_snapjob_t *j, int *ret_fd) {
        if (!j->rq->queue_work)
                return gm_memfd_sealed("gpumem-snapshot", j->size, copy_bytes, j->buf, ret_fd);
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
                return -errno;
        fcntl(p[1], F_SETPIPE_SZ, STREAM_PIPE_BYTES); /* fewer wake-ups; the default also works */
        if (fcntl(p[1], F_SETFL, O_NONBLOCK) < 0) {
                int r = -errno;
                close(p[0]);
                close(p[1]);
                return r;
        }
        j->stream_fd = p[1];
        *ret_fd = p[0];
        return 0;
}

/* ---- back on the loop ---- */

static void job_done(void *arg) {
        gm_snapjob_t *j = arg;
        gm_snapjobs_t *js = j->jobs;
        for (size_t i = 0; i < j->n_asks; i++) {
                const ask_t *a = &j->asks[i];
                if (a->state == ASK_ANSWERED && !a->invalid)
                        js->counters.answered++;
                else if (a->invalid)
                        js->counters.invalid++;
                else
                        js->counters.unanswered++;
        }
        if (j->result == -EFBIG || j->result == -E2BIG)
                js->counters.refused++;
        if (j->conn && j->result < 0) {
                if (j->result == -EFBIG)
                        gm_request_error(j->conn, j->request_id, EFBIG,
                                         "the snapshot is larger than %llu bytes, the limit for non-admins "
                                         "(snapshot_max_bytes); narrow it with --pid",
                                         (unsigned long long) j->opts.max_bytes);
                else if (j->result == -E2BIG)
                        gm_request_error(j->conn, j->request_id, E2BIG,
                                         "the snapshot has more than %llu entries, the limit for non-admins "
                                         "(snapshot_max_entries); narrow it with --pid",
                                         (unsigned long long) j->max_entries);
                else
                        gm_request_error(j->conn, j->request_id, -j->result, "snapshot failed: %s",
                                         strerror(-j->result));
        } else if (j->conn && (j->result = reply_fd(j, &j->fd)) < 0) {
                gm_request_error(j->conn, j->request_id, -j->result, "snapshot failed: %s", strerror(-j->result));
        } else if (j->conn) {
                Gpumem__SnapshotReply reply = GPUMEM__SNAPSHOT_REPLY__INIT;
                reply.format = j->wire_format;
                reply.size = j->size;
                reply.local_asked = (uint32_t) j->n_asks;
                reply.local_unanswered = j->unanswered;
                Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
                out.body_case = GPUMEM__ENVELOPE__BODY_SNAPSHOT_REPLY;
                out.snapshot_reply = &reply;
                if (gm_request_send(j->conn, j->request_id, &out, &j->fd, 1) == 0) {
                        js->counters.sent++;
                        js->counters.bytes += j->size;
                }
                close(j->fd);
                j->fd = -1;
                j->conn = NULL; /* the connection may ask again; the job still counts against max_jobs */
                /* It stays listed until its bytes are read. */
                if (j->stream_fd >= 0 && j->rq->queue_work(j->rq->userdata, stream_job, stream_done, j) == 0)
                        return;
        }
        job_unlink(j);
        job_free(j);
}

/* Every ask is in (or the deadline passed): render it. */
static void job_finish(const gm_requests_t *rq, gm_snapjob_t *j) {
        for (size_t i = 0; i < j->n_asks; i++)
                if (j->asks[i].state == ASK_WAITING)
                        j->asks[i].state = ASK_SILENT;
        j->n_waiting = 0;
        j->rendering = true;
        if (!rq->queue_work || rq->queue_work(rq->userdata, render_job, job_done, j) < 0) {
                render_job(j); /* no worker here: render on the loop */
                job_done(j);
        }
}

/* ---- the request ---- */

static int cmp_piece(const void *a, const void *b) {
        const gm_snapshot_piece_t *x = a, *y = b;
        if (x->segment_id != y->segment_id)
                return (x->segment_id > y->segment_id) - (x->segment_id < y->segment_id);
        return (x->offset > y->offset) - (x->offset < y->offset);
}

/* A local session's LIVE pieces (what it was granted), sorted. */
static int copy_pieces(const gm_session_view_t *s, ask_t *a) {
        size_t n = 0;
        for (const gm_piece_t *p = s->pieces; p; p = p->next)
                n += p->state == GM_PIECE_LIVE;
        a->pieces = calloc(n + 1, sizeof(*a->pieces));
        if (!a->pieces)
                return -ENOMEM;
        for (const gm_piece_t *p = s->pieces; p; p = p->next)
                if (p->state == GM_PIECE_LIVE)
                        a->pieces[a->n_pieces++] = (gm_snapshot_piece_t){.segment_id = p->segment_id,
                                                                         .va_size = p->segment_va_size,
                                                                         .offset = p->offset,
                                                                         .size = p->phys.size};
        if (a->n_pieces > 1)
                qsort(a->pieces, a->n_pieces, sizeof(*a->pieces), cmp_piece);
        return 0;
}

/* The process's name as read at connect (escaped), else the client's. */
static void command_of(const gm_session_view_t *s, const gm_request_conn_t *oc, char *buf, size_t len) {
        if (oc && oc->command[0])
                snprintf(buf, len, "%s", oc->command);
        else
                gm_text_escape(s->name, buf, len);
}

static bool in_view(const gm_session_view_t *viewer, const gm_session_view_t *o, uint32_t pid) {
        return !o->ended && o->tenant && !o->admin_conn && (viewer->admin || o->tenant == viewer->tenant) &&
               (!pid || (uint32_t) o->pid == pid);
}

/* Sends one local session its query; false when its connection is gone. */
static bool send_query(gm_snapjobs_t *js, ask_t *a) {
        Gpumem__SnapshotQuery q = GPUMEM__SNAPSHOT_QUERY__INIT;
        q.query_id = a->query_id;
        q.max_bytes = js->limits.answer_max_bytes;
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_SNAPSHOT_QUERY;
        out.snapshot_query = &q;
        return gm_request_send(a->conn, 0, &out, NULL, 0) == 0;
}

/* The shared objects the viewer may see (an admin all, others those their
 * tenant published or may open), each once, with the mapping sessions in
 * view (with a pid: only objects that process maps, and only it). */
static int collect_shared(gm_snapjob_t *j, const gm_broker_t *b, const gm_session_view_t *viewer, uint32_t pid) {
        gm_snapshot_mapper_t *mappers = NULL;
        size_t cap = 0;
        int r = 0;
        for (const gm_shared_t *o = gm_shared_next(b, NULL); o && r == 0; o = gm_shared_next(b, o)) {
                if (!viewer->admin && (!viewer->tenant || !gm_shared_admits(o, viewer->tenant)))
                        continue;
                gm_shared_view_t v;
                gm_shared_view(o, &v);
                size_t n = 0;
                uint32_t opens;
                for (const gm_session_t *s = gm_shared_mapper_next(o, NULL, &opens); s && r == 0;
                     s = gm_shared_mapper_next(o, s, &opens)) {
                        gm_session_view_t mv;
                        gm_session_view((gm_session_t *) s, &mv);
                        if (!in_view(viewer, &mv, pid))
                                continue;
                        if (n == cap) {
                                gm_snapshot_mapper_t *grown = realloc(mappers, (cap ? 2 * cap : 16) * sizeof(*grown));
                                if (!grown) {
                                        r = -ENOMEM;
                                        break;
                                }
                                mappers = grown;
                                cap = cap ? 2 * cap : 16;
                        }
                        mappers[n++] = (gm_snapshot_mapper_t){
                                .pid = (uint32_t) mv.pid, .session_id = mv.id, .tenant = mv.tenant->name};
                }
                if (r < 0 || (pid && n == 0))
                        continue;
                const gm_snapshot_shared_t rec = {.name = v.name,
                                                  .version = v.version,
                                                  .tenant = v.tenant,
                                                  .state = gm_shared_state_name(v.state),
                                                  .size = v.size,
                                                  .mappers = mappers,
                                                  .n_mappers = n};
                r = gm_snapshot_data_add_shared(j->data, &rec);
        }
        free(mappers);
        return r;
}

/* Copies what the loop owns (central heaps, the device's trace and each
 * session's own, local sessions' pieces) and asks the local sessions. The
 * device's trace is whole only for an admin asking for the whole device;
 * anyone else gets the entries of the live sessions in view, so an ended
 * session's entries are never shown to another tenant (the entries record
 * a pid, not a tenant). -ESRCH: a --pid that names no session in view. */
static int collect(gm_snapjob_t *j, const gm_request_conn_t *c, const Gpumem__Snapshot *req, bool *ret_everything) {
        gm_broker_t *b = c->rq->broker;
        gm_snapjobs_t *js = c->rq->snapjobs;
        const gm_session_t *s = c->session;
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        size_t n_local = 0, n_in_view = 0;
        bool everything = sv.admin && !req->pid;
        for (gm_session_t *o = b->sessions; o; o = gm_session_next(o)) {
                gm_session_view_t ov;
                gm_session_view(o, &ov);
                const gm_request_conn_t *oc = gm_session_userdata(o);
                if (!in_view(&sv, &ov, req->pid))
                        continue;
                n_in_view++;
                n_local += oc && oc->local;
        }
        if (req->pid && n_in_view == 0)
                return -ESRCH;
        j->asks = calloc(n_local + 1, sizeof(*j->asks));
        if (!j->asks)
                return -ENOMEM;
        for (gm_session_t *o = b->sessions; o; o = gm_session_next(o)) {
                gm_session_view_t ov;
                gm_session_view(o, &ov);
                gm_request_conn_t *oc = gm_session_userdata(o);
                if (!in_view(&sv, &ov, req->pid) || (!ov.heap && !(oc && oc->local)))
                        continue;
                /* What it recorded of its own (gm_session_history()): its entries only. */
                int r = gm_snapshot_data_add_history(j->data, ov.history, false);
                if (r < 0)
                        return r;
                char command[64];
                command_of(&ov, oc, command, sizeof(command));
                const char *tag_names[GM_SESSION_MAX_TAGS + 1]; /* its heap's tag ids are its pools' ids */
                for (size_t id = 0; id <= GM_SESSION_MAX_TAGS; id++)
                        tag_names[id] = ov.tags->names[id];
                gm_snapshot_owner_t owner = {.pid = (uint32_t) ov.pid,
                                             .tenant = ov.tenant->name,
                                             .command = command,
                                             .session_id = ov.id,
                                             .tag_names = tag_names,
                                             .n_tag_names = GM_SESSION_MAX_TAGS + 1};
                uint32_t idx;
                r = gm_snapshot_data_add_owner(j->data, &owner, &idx);
                if (r < 0)
                        return r;
                if (ov.heap) {
                        if ((r = gm_snapshot_data_add_heap(j->data, idx, ov.heap)) < 0)
                                return r;
                        if (entries_of(j->data) > j->max_entries)
                                return -E2BIG;
                        continue;
                }
                ask_t *a = &j->asks[j->n_asks++];
                *a = (ask_t){.conn = oc, .query_id = ++js->next_query_id, .owner = idx, .pid = (uint32_t) ov.pid};
                if ((r = copy_pieces(&ov, a)) < 0)
                        return r;
        }
        int r = gm_snapshot_data_add_history(j->data, b->history, !everything);
        if (r == 0)
                r = collect_shared(j, b, &sv, req->pid);
        if (r == 0 && entries_of(j->data) > j->max_entries)
                r = -E2BIG;
        *ret_everything = everything;
        return r;
}

static gm_snapshot_format_t format_of(Gpumem__SnapshotFormat f) {
        switch (f) {
        case GPUMEM__SNAPSHOT_FORMAT__SNAPSHOT_FORMAT_JSON:
                return GM_SNAPSHOT_JSON;
        case GPUMEM__SNAPSHOT_FORMAT__SNAPSHOT_FORMAT_PICKLE_1_13:
                return GM_SNAPSHOT_PICKLE_1_13;
        default:
                return GM_SNAPSHOT_PICKLE;
        }
}

static gm_snapshot_category_t category_of(Gpumem__SnapshotCategory c) {
        switch (c) {
        case GPUMEM__SNAPSHOT_CATEGORY__SNAPSHOT_CATEGORY_TENANT:
                return GM_SNAPSHOT_CATEGORY_TENANT;
        case GPUMEM__SNAPSHOT_CATEGORY__SNAPSHOT_CATEGORY_PID:
                return GM_SNAPSHOT_CATEGORY_PID;
        case GPUMEM__SNAPSHOT_CATEGORY__SNAPSHOT_CATEGORY_TAG:
                return GM_SNAPSHOT_CATEGORY_TAG;
        default:
                return GM_SNAPSHOT_CATEGORY_NONE;
        }
}

static bool conn_has_job(const gm_snapjobs_t *js, const gm_request_conn_t *c) {
        for (const gm_snapjob_t *j = js->jobs; j; j = j->next)
                if (j->conn == c)
                        return true;
        return false;
}

int gm_req_snapshot_handle(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        const Gpumem__Snapshot *req = env->snapshot;
        gm_snapjobs_t *js = c->rq->snapjobs;
        gm_broker_t *b = c->rq->broker;
        bool admin = sv.admin;
        if (!js)
                return gm_request_error(c, request_id, EOPNOTSUPP, "snapshots are not available here"), 0;
        if (js->n_jobs >= js->limits.max_jobs || conn_has_job(js, c)) {
                js->counters.refused++;
                return gm_request_error(c, request_id, EBUSY, "%u snapshots are under way; try again",
                                        (unsigned) js->n_jobs),
                       0;
        }
        gm_snapjob_t *j = calloc(1, sizeof(*j));
        if (!j || gm_snapshot_data_new(&j->data) < 0) {
                free(j);
                return gm_request_error(c, request_id, ENOMEM, "out of memory"), 0;
        }
        j->jobs = js;
        j->rq = c->rq;
        j->conn = c;
        j->fd = -1;
        j->stream_fd = -1;
        j->request_id = request_id;
        j->wire_format = req->format;
        j->config = b->alloc_config;
        j->max_entries = admin || !js->limits.user_max_entries ? ADMIN_MAX_ENTRIES : js->limits.user_max_entries;
        j->opts = (gm_snapshot_options_t){
                .device = b->backend->device,
                .format = format_of(req->format),
                .category = category_of(req->category),
                .process_frames = req->category != GPUMEM__SNAPSHOT_CATEGORY__SNAPSHOT_CATEGORY_NONE,
                .now_us = gm_realtime_us(),
                .max_bytes = admin ? 0 : js->limits.user_max_bytes,
                .config = &j->config,
        };
        uint64_t top = b->va_cursor + (1ull << 30);
        j->local_base = top > LOCAL_BASE_MIN ? top / WINDOW_ALIGN * WINDOW_ALIGN : LOCAL_BASE_MIN;
        j->collecting = true;
        j->next = js->jobs;
        if (js->jobs)
                js->jobs->prev = j;
        js->jobs = j;
        js->n_jobs++;
        bool everything;
        int r = collect(j, c, req, &everything);
        if (r < 0) {
                uint64_t max_entries = j->max_entries;
                job_unlink(j);
                job_free(j);
                if (r == -E2BIG) {
                        js->counters.refused++;
                        return gm_request_error(c, request_id, E2BIG,
                                                "the snapshot has more than %llu entries, the limit for non-admins "
                                                "(snapshot_max_entries); narrow it with --pid",
                                                (unsigned long long) max_entries),
                               0;
                }
                if (r == -ESRCH) /* another tenant's pid reads as one without a session */
                        return gm_request_error(c, request_id, ESRCH, "--pid %u names no session on this daemon",
                                                (unsigned) req->pid),
                               0;
                return gm_request_error(c, request_id, r, "snapshot failed: %s", strerror(-r)), 0;
        }
        j->deadline_ms = gm_now_ms() + js->limits.answer_timeout_ms;
        j->n_waiting = j->n_asks;
        for (size_t i = 0; i < j->n_asks; i++)
                if (!send_query(js, &j->asks[i]) && j->asks[i].state == ASK_WAITING) {
                        j->asks[i].state = ASK_SILENT;
                        j->n_waiting--;
                }
        j->collecting = false;
        if (!j->conn) { /* the asker went while its queries went out */
                job_unlink(j);
                job_free(j);
        } else if (j->n_waiting == 0) {
                job_finish(c->rq, j);
        }
        return 0;
}

/* ---- answers ---- */

static ask_t *ask_find(gm_snapjobs_t *js, const gm_request_conn_t *c, uint64_t query_id, gm_snapjob_t **ret_job) {
        for (gm_snapjob_t *j = js->jobs; j; j = j->next) {
                if (j->rendering)
                        continue;
                for (size_t i = 0; i < j->n_asks; i++)
                        if (j->asks[i].conn == c && j->asks[i].query_id == query_id &&
                            j->asks[i].state == ASK_WAITING) {
                                *ret_job = j;
                                return &j->asks[i];
                        }
        }
        return NULL;
}

/* The ask is over (answered or silent). Returns whether that completed the
 * job (then rendered, perhaps already freed). */
static bool ask_over(const gm_requests_t *rq, gm_snapjob_t *j, ask_t *a, ask_state_t state) {
        if (state == ASK_SILENT) {
                free(a->answer);
                a->answer = NULL;
                a->answer_len = a->answer_cap = 0;
        }
        a->state = state;
        if (--j->n_waiting > 0 || j->collecting || !j->conn)
                return false;
        job_finish(rq, j);
        return true;
}

int gm_req_snapshot_answer(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__SnapshotAnswer *ans = env->snapshot_answer;
        gm_snapjobs_t *js = c->rq->snapjobs;
        gm_snapjob_t *j = NULL;
        ask_t *a = js && c->local ? ask_find(js, c, ans->query_id, &j) : NULL;
        if (!a)
                return 0; /* late (its job went on without it) or never asked: dropped */
        uint64_t limit = js->limits.answer_max_bytes;
        if (ans->refused || ans->total_size > limit || ans->data.len > ans->total_size - a->answer_len ||
            ans->data.len > 2 * limit - j->answer_bytes) {
                gm_session_view_t sv;
                gm_session_view(c->session, &sv);
                if (!ans->refused)
                        log_warning("session %llu (pid %u): snapshot answer over its %llu bytes, ignored",
                                    (unsigned long long) sv.id, a->pid, (unsigned long long) limit);
                ask_over(c->rq, j, a, ASK_SILENT);
                return 0;
        }
        if (ans->data.len > 0) {
                if (a->answer_cap - a->answer_len < ans->data.len) {
                        /* Grows by doubling, never past the declared total. */
                        size_t cap = a->answer_cap ? a->answer_cap : 65536;
                        while (cap - a->answer_len < ans->data.len)
                                cap *= 2;
                        if (cap > ans->total_size)
                                cap = ans->total_size;
                        char *p = realloc(a->answer, cap);
                        if (!p) {
                                ask_over(c->rq, j, a, ASK_SILENT);
                                return 0;
                        }
                        a->answer = p;
                        a->answer_cap = cap;
                }
                memcpy(a->answer + a->answer_len, ans->data.data, ans->data.len);
                a->answer_len += ans->data.len;
                j->answer_bytes += ans->data.len;
        }
        if (ans->last)
                ask_over(c->rq, j, a, a->answer_len == ans->total_size ? ASK_ANSWERED : ASK_SILENT);
        return 0;
}

/* ---- the daemon's callbacks ---- */

void gm_req_snapshot_tick(const gm_requests_t *rq, uint64_t now_ms) {
        gm_snapjobs_t *js = rq->snapjobs;
        if (!js)
                return;
        for (gm_snapjob_t *j = js->jobs, *next; j; j = next) {
                next = j->next;
                if (!j->rendering && !j->collecting && now_ms >= j->deadline_ms)
                        job_finish(rq, j);
        }
}

void gm_req_snapshot_conn_end(gm_request_conn_t *c) {
        gm_snapjobs_t *js = c->rq ? c->rq->snapjobs : NULL;
        if (!js)
                return;
        for (gm_snapjob_t *j = js->jobs, *next; j; j = next) {
                next = j->next;
                if (j->conn == c) {
                        j->conn = NULL;
                        if (!j->rendering && !j->collecting) {
                                job_unlink(j);
                                job_free(j);
                                continue;
                        }
                }
                if (j->rendering)
                        continue;
                for (size_t i = 0; i < j->n_asks; i++)
                        if (j->asks[i].conn == c) {
                                j->asks[i].conn = NULL;
                                if (j->asks[i].state == ASK_WAITING && ask_over(c->rq, j, &j->asks[i], ASK_SILENT))
                                        break; /* j is rendering, or gone */
                        }
        }
}

void gm_req_snapshot_free_all(const gm_requests_t *rq) {
        gm_snapjobs_t *js = rq->snapjobs;
        if (!js)
                return;
        for (gm_snapjob_t *j = js->jobs, *next; j; j = next) {
                next = j->next;
                if (!j->rendering) {
                        job_unlink(j);
                        job_free(j);
                }
        }
}
