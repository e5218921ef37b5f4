/* The Samples request: the rings diag.c keeps (each session's samples and
 * the device's refusals) read back, as one sealed memfd. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "diag.h"
#include "localstats.h"
#include "memfd.h"
#include "metrics.h"
#include "req_samples.h"

/* The reply's size limit: a SampleSet is far smaller (sessions x 240 samples). */
#define SAMPLES_REPLY_MAX (256u << 20)
static const char *tenant_asked(const Gpumem__Samples *req) {
        return req->tenant && req->tenant[0] ? req->tenant : NULL;
}

const char *gm_req_samples_admin_for(const gm_request_conn_t *c, const Gpumem__Envelope *env) {
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        const char *t = tenant_asked(env->samples);
        return t && strcmp(t, sv.tenant->name) != 0 ? "reading another tenant's samples" : NULL;
}

static bool visible(const gm_session_view_t *caller, const gm_session_view_t *o, const Gpumem__Samples *req) {
        if (o->ended || !o->tenant || o->admin_conn || !o->owned)
                return false;
        if (!caller->admin && o->tenant != caller->tenant)
                return false;
        const char *t = tenant_asked(req);
        return (!req->pid || (uint32_t) o->pid == req->pid) && (!t || strcmp(t, o->tenant->name) == 0);
}

/* Packs one session's samples ending within the window; -ENOMEM. */
static int fill_session(const gm_session_view_t *o, uint64_t since_ms, Gpumem__SessionSamples *ss,
                        uint64_t **ret_values) {
        const gm_diag_session_t *d = o->owned;
        size_t first = 0;
        while (first < d->ring.n && gm_sample_ring_at(&d->ring, first)->until_ms < since_ms)
                first++;
        size_t n = d->ring.n - first;
        uint64_t *v = calloc(n ? n * GM_SAMPLE_FIELDS : 1, sizeof(*v));
        if (!v)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                gm_sample_pack(gm_sample_ring_at(&d->ring, first + i), v + i * GM_SAMPLE_FIELDS);
        gpumem__session_samples__init(ss);
        ss->session_id = o->id;
        ss->pid = (uint32_t) o->pid;
        ss->tenant = (char *) o->tenant->name;
        ss->unit = (char *) o->unit;
        ss->name = (char *) o->name;
        ss->heap_mode = o->local ? "local" : "central";
        ss->stride = GM_SAMPLE_FIELDS;
        ss->n_samples = n * GM_SAMPLE_FIELDS;
        ss->samples = v;
        ss->last_refusal_ms = d->last_refusal_ms;
        *ret_values = v;
        return 0;
}

/* The refusals within the window; another tenant's are anonymous to a non-admin. */
static size_t fill_refusals(const gm_request_conn_t *c, uint64_t since_ms, Gpumem__RefusalEvent *evs,
                            Gpumem__RefusalEvent **ptrs) {
        const gm_refusal_ring_t *ring = &c->rq->broker->refusals;
        const gm_session_t *s = c->session;
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        size_t k = 0;
        for (size_t i = 0; i < ring->n; i++) {
                const gm_refusal_t *r = gm_refusal_ring_at(ring, i);
                if (r->t_ms < since_ms)
                        continue;
                bool shown = sv.admin || strcmp(r->tenant, sv.tenant->name) == 0;
                Gpumem__RefusalEvent *e = &evs[k];
                gpumem__refusal_event__init(e);
                e->t_ms = r->t_ms;
                e->session_id = shown ? r->session_id : 0;
                e->pid = shown ? r->pid : 0;
                e->tenant = shown ? (char *) r->tenant : "";
                e->reason = (char *) gm_metrics_reason_name((gm_oom_reason_t) r->reason);
                e->size = r->size;
                ptrs[k++] = e;
        }
        return k;
}

static void pack_set(void *dst, size_t len, const void *set) {
        (void) len; /* gpumem__sample_set__get_packed_size's */
        gpumem__sample_set__pack(set, dst);
}

static int send_set(gm_request_conn_t *c, uint64_t request_id, const Gpumem__SampleSet *set) {
        size_t len = gpumem__sample_set__get_packed_size(set);
        if (len > SAMPLES_REPLY_MAX)
                return gm_request_error(c, request_id, E2BIG, "too many samples for one reply: narrow it down"), 0;
        int fd = -1;
        int r = gm_memfd_sealed("gpumem-samples", len, pack_set, set, &fd);
        if (r < 0)
                return gm_request_error(c, request_id, r, "cannot send the samples: %s", strerror(-r)), 0;
        Gpumem__SamplesReply reply = GPUMEM__SAMPLES_REPLY__INIT;
        reply.size = len;
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_SAMPLES_REPLY;
        out.samples_reply = &reply;
        gm_request_send(c, request_id, &out, &fd, 1);
        close(fd);
        return 0;
}

int gm_req_samples_handle(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Samples *req = env->samples;
        gm_broker_t *b = c->rq->broker;
        gm_session_t *s = c->session;
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        uint64_t now = gm_now_ms();
        uint64_t since = req->window_ms && req->window_ms < now ? now - req->window_ms : 0;
        gm_localstats_refresh(c->rq);
        gm_diag_tick(c->rq, now); /* the figures as of this request */

        Gpumem__SampleSet set = GPUMEM__SAMPLE_SET__INIT;
        Gpumem__SessionSamples *sess = calloc(b->n_sessions + 1, sizeof(*sess));
        Gpumem__SessionSamples **sess_ptrs = calloc(b->n_sessions + 1, sizeof(*sess_ptrs));
        uint64_t **values = calloc(b->n_sessions + 1, sizeof(*values));
        Gpumem__RefusalEvent *evs = calloc(GM_REFUSALS_CAP, sizeof(*evs));
        Gpumem__RefusalEvent **ev_ptrs = calloc(GM_REFUSALS_CAP, sizeof(*ev_ptrs));
        int r = sess && sess_ptrs && values && evs && ev_ptrs ? 0 : -ENOMEM;
        size_t n = 0;
        for (gm_session_t *o = b->sessions; o && r == 0 && n <= b->n_sessions; o = gm_session_next(o)) {
                gm_session_view_t ov;
                gm_session_view(o, &ov);
                if (!visible(&sv, &ov, req))
                        continue;
                r = fill_session(&ov, since, &sess[n], &values[n]);
                if (r == 0) {
                        sess_ptrs[n] = &sess[n];
                        n++;
                }
        }
        if (r == 0) {
                gm_stats_t st;
                if (sv.admin)
                        gm_localstats_device_stats(c->rq, &st);
                else
                        gm_localstats_tenant_stats(c->rq, sv.tenant, &st);
                uint64_t device_free = 0, device_total = 0;
                gm_reclaim_device_view(b, &device_free, &device_total);
                set.now_ms = now;
                set.period_ms = GM_SAMPLE_PERIOD_MS;
                set.capacity = b->backend->capacity;
                set.device_free = device_free;
                set.reserved = gm_diag_positive(st.reserved_bytes[GM_STAT_ALL].current);
                set.allocated = gm_diag_positive(st.allocated_bytes[GM_STAT_ALL].current);
                set.refusals_total = b->refusals.total;
                set.device_scope = sv.admin;
                set.n_sessions = n;
                set.sessions = sess_ptrs;
                set.n_refusals = fill_refusals(c, since, evs, ev_ptrs);
                set.refusals = ev_ptrs;
                send_set(c, request_id, &set);
        } else {
                gm_request_error(c, request_id, ENOMEM, "out of memory");
        }
        for (size_t i = 0; values && i < n; i++)
                free(values[i]);
        free(values);
        free(sess);
        free(sess_ptrs);
        free(evs);
        free(ev_ptrs);
        return 0;
}
