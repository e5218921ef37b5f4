/* Administrative and observability requests: statistics at every scope,
 * their resets, memory history, run-time allocator settings, quotas and the
 * client list (snapshots: req_snapshot.c). A tenant sees its own figures only;
 * what needs admin rights is declared here and checked once by the request
 * table. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "config.h"
#include "local.h"
#include "log.h"
#include "msg.h"
#include "req_admin.h"
#include "text.h"

/* gm_stats_foreach() names live only during the callback: they are copied. */
#define STAT_NAME_MAX 64

typedef struct stats_collect {
        char (*name_buf)[STAT_NAME_MAX];
        Gpumem__StatEntry *entries;
        Gpumem__StatEntry **ptrs;
        size_t n, cap;
        char **names; /* filter */
        size_t n_names;
} stats_collect_t;

static void collect_stat(const char *name, int64_t value, void *userdata) {
        stats_collect_t *c = userdata;
        if (c->n_names) {
                bool wanted = false;
                for (size_t i = 0; i < c->n_names && !wanted; i++)
                        wanted = strcmp(c->names[i], name) == 0;
                if (!wanted)
                        return;
        }
        if (c->n == c->cap)
                return;
        gpumem__stat_entry__init(&c->entries[c->n]);
        snprintf(c->name_buf[c->n], STAT_NAME_MAX, "%s", name);
        c->entries[c->n].name = c->name_buf[c->n];
        c->entries[c->n].value = value;
        c->ptrs[c->n] = &c->entries[c->n];
        c->n++;
}

/* Statistic names one request may ask for, at most. */
#define STATS_MAX_NAMES 1024

int gm_req_admin_check_stats(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len) {
        if (env->stats->n_names > STATS_MAX_NAMES)
                return snprintf(why, why_len, "at most %u statistic names in one request", STATS_MAX_NAMES), -E2BIG;
        if (env->stats->tagged && !gm_text_tag_valid(env->stats->tag, true))
                return snprintf(why, why_len, "a malformed pool tag (want [A-Za-z0-9_.-]{1,31})"), -EINVAL;
        return 0;
}

/* The tenant a request names, or the caller's own. */
static const char *tenant_named(const gm_request_conn_t *c, const char *name) {
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        return name && name[0] ? name : sv.tenant->name;
}

const char *gm_req_admin_for_stats(const gm_request_conn_t *c, const Gpumem__Envelope *env) {
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        const Gpumem__Stats *req = env->stats;
        if (req->scope == GPUMEM__STATS_SCOPE__STATS_SCOPE_DEVICE)
                return "reading device-wide statistics";
        if (req->scope == GPUMEM__STATS_SCOPE__STATS_SCOPE_TENANT &&
            strcmp(tenant_named(c, req->tenant), sv.tenant->name) != 0)
                return "reading another tenant's statistics";
        return NULL;
}

/* Whether session o is in the scope of stats request req from the session
 * viewed as sv (tenant t for a tenant scope). */
static bool in_stats_scope(const Gpumem__Stats *req, const gm_session_view_t *sv, const gm_tenant_t *t,
                           const gm_session_t *self, const gm_session_t *o) {
        gm_session_view_t ov;
        gm_session_view(o, &ov);
        switch (req->scope) {
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_SESSION:
                return o == self;
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_TENANT:
                return ov.tenant == t;
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_PID: /* another tenant's pid reads as one without a session */
                return (uint32_t) ov.pid == req->pid && (sv->admin || ov.tenant == sv->tenant);
        default:
                return true;
        }
}

/* The figures of pool req->tag over the live sessions of req's scope that
 * named it (their number in *ret_sessions), summed. */
static void tag_stats_in_scope(gm_request_conn_t *c, const Gpumem__Stats *req, const gm_tenant_t *t, gm_stats_t *ret,
                               uint64_t *ret_sessions) {
        gm_broker_t *b = c->rq->broker;
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        gm_stats_init(ret);
        ret->max_split_size = b->device_stats.max_split_size;
        *ret_sessions = 0;
        for (gm_session_t *o = b->sessions; o; o = gm_session_next(o)) {
                gm_stats_t one;
                if (!in_stats_scope(req, &sv, t, c->session, o) || !gm_localstats_session_tag(o, req->tag, &one))
                        continue;
                gm_localstats_add(ret, &one);
                (*ret_sessions)++;
        }
}

int gm_req_admin_stats(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Stats *req = env->stats;
        gm_broker_t *b = c->rq->broker;
        gm_session_t *s = c->session;
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        gm_stats_t scratch;
        const gm_stats_t *st = NULL;
        uint64_t sessions = 0, claimed = 0;
        gm_localstats_refresh(c->rq);
        switch (req->scope) {
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_SESSION:
                if (gm_localstats_session(s)) {
                        st = gm_localstats_session(s);
                } else {
                        gm_stats_init(&scratch);
                        scratch.max_split_size = b->device_stats.max_split_size;
                        st = &scratch;
                }
                sessions = 1;
                claimed = sv.claim_bytes;
                break;
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_DEVICE:
                gm_localstats_device_stats(c->rq, &scratch);
                gm_stats_subtract_accumulated(&scratch, &b->device_shown_base);
                st = &scratch;
                sessions = b->n_sessions;
                claimed = b->claimed_bytes;
                break;
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_TENANT: {
                const char *name = tenant_named(c, req->tenant);
                gm_tenant_t *t = gm_tenant_find(b, name);
                if (!t)
                        return gm_request_error(c, request_id, ENOENT, "no tenant '%s'", name), 0;
                gm_localstats_tenant_stats(c->rq, t, &scratch);
                gm_stats_subtract_accumulated(&scratch, &t->shown_base);
                st = &scratch;
                sessions = t->sessions;
                claimed = t->claimed_bytes;
                break;
        }
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_PID:
                gm_stats_init(&scratch);
                scratch.max_split_size = b->device_stats.max_split_size;
                for (gm_session_t *o = b->sessions; o; o = gm_session_next(o)) {
                        gm_session_view_t ov;
                        gm_session_view(o, &ov);
                        /* Another tenant's pid reads as a pid without a session:
                         * a non-admin learns nothing of who holds sessions. */
                        if ((uint32_t) ov.pid != req->pid || !gm_localstats_session(o) ||
                            (!sv.admin && ov.tenant != sv.tenant))
                                continue;
                        gm_localstats_add(&scratch, gm_localstats_session(o));
                        sessions++;
                        claimed += ov.claim_bytes;
                }
                st = &scratch;
                break;
        default:
                return gm_request_error(c, request_id, EINVAL, "unknown statistics scope"), 0;
        }
        if (req->tagged) {
                const gm_tenant_t *t = req->scope == GPUMEM__STATS_SCOPE__STATS_SCOPE_TENANT
                                               ? gm_tenant_find(b, tenant_named(c, req->tenant))
                                               : NULL;
                tag_stats_in_scope(c, req, t, &scratch, &sessions);
                st = &scratch;
        }
        enum { MAX_STATS = 160 };
        static char names[MAX_STATS][STAT_NAME_MAX];
        Gpumem__StatEntry entries[MAX_STATS];
        Gpumem__StatEntry *ptrs[MAX_STATS];
        stats_collect_t collect = {
                .name_buf = names,
                .entries = entries,
                .ptrs = ptrs,
                .cap = MAX_STATS,
                .names = req->names,
                .n_names = req->n_names,
        };
        gm_stats_foreach(st, collect_stat, &collect);
        Gpumem__StatsReply reply = GPUMEM__STATS_REPLY__INIT;
        reply.n_stats = collect.n;
        reply.stats = ptrs;
        reply.device = c->rq->broker->backend->device;
        reply.capacity = c->rq->broker->backend->capacity;
        reply.sessions = sessions;
        reply.claimed = claimed;
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_STATS_REPLY;
        out.stats_reply = &reply;
        gm_request_send(c, request_id, &out, NULL, 0);
        return 0;
}

const char *gm_req_admin_for_reset_stats(const gm_request_conn_t *c, const Gpumem__Envelope *env) {
        switch (env->reset_stats->scope) {
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_DEVICE:
                return "resetting device statistics";
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_TENANT:
                return "resetting tenant statistics";
        default:
                return NULL;
        }
}

int gm_req_admin_reset_stats(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__ResetStats *req = env->reset_stats;
        gm_broker_t *b = c->rq->broker;
        gm_session_t *s = c->session;
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        gm_stats_t *st = NULL;
        gm_localstats_refresh(c->rq); /* the local sessions' part as of now */
        switch (req->scope) {
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_SESSION:
                if (sv.heap)
                        st = gm_heap_stats_mut(sv.heap);
                else if (c->local) /* its heap (in the client) reset its own; these are the daemon's */
                        st = &c->local->exact;
                break;
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_DEVICE:
                /* Counters Prometheus may scrape never go back: resetting the
                 * device's or a tenant's accumulated figures is a view offset
                 * (central heaps' and local sessions' together) that replies
                 * subtract; peaks restart from the current values. */
                if (req->peak) {
                        gm_stats_reset_peak(&b->device_stats);
                        gm_stats_reset_peak(&c->rq->local->device);
                }
                if (req->accumulated)
                        gm_localstats_device_stats(c->rq, &b->device_shown_base);
                return gm_request_ok(c, request_id);
        case GPUMEM__STATS_SCOPE__STATS_SCOPE_TENANT: {
                gm_tenant_t *t = gm_tenant_find(b, req->tenant ? req->tenant : "");
                if (!t)
                        return gm_request_error(c, request_id, ENOENT, "no tenant '%s'", req->tenant), 0;
                gm_localstats_tenant_t *lt = gm_localstats_tenant(c->rq, t->name);
                if (req->peak) {
                        gm_stats_reset_peak(&t->stats);
                        if (lt)
                                gm_stats_reset_peak(&lt->stats);
                }
                if (req->accumulated)
                        gm_localstats_tenant_stats(c->rq, t, &t->shown_base);
                return gm_request_ok(c, request_id);
        }
        default:
                return gm_request_error(c, request_id, EINVAL, "cannot reset statistics of that scope"), 0;
        }
        if (st && req->peak)
                gm_stats_reset_peak(st);
        if (st && req->accumulated)
                gm_stats_reset_accumulated(st);
        if (c->local)
                gm_localstats_refresh_conn(c); /* the figures shown: the page's with the exact ones laid over */
        return gm_request_ok(c, request_id);
}

/* ---- memory history ---- */

/* Whether a request is for the caller's own history: a non-admin's session
 * (an administration tool's connection has none to record). An admin's is
 * for the device's, as before. */
static bool own_history(const gm_request_conn_t *c) {
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        return !sv.admin && !sv.admin_conn;
}

const char *gm_req_admin_for_history(const gm_request_conn_t *c, const Gpumem__Envelope *env) {
        if (own_history(c))
                return NULL; /* anyone may record its own, as in PyTorch */
        return env->history_control->status_only ? "reading the state of memory history" : "controlling memory history";
}

int gm_req_admin_check_history(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len) {
        if (env->history_control->max_entries > GM_HISTORY_MAX_ENTRIES)
                return snprintf(why, why_len, "at most %u history entries", GM_HISTORY_MAX_ENTRIES), -EINVAL;
        return 0;
}

/* A non-admin session's HistoryControl: its own history, on, off or its state. */
static int own_history_control(gm_request_conn_t *c, uint64_t request_id, const Gpumem__HistoryControl *req) {
        if (!req->status_only) {
                int r = gm_session_history(c->session, req->enabled, req->max_entries);
                if (r < 0)
                        return gm_request_error(c, request_id, r, "cannot set up memory history: %s", strerror(-r)), 0;
        }
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        if (!req->status_only)
                log_debug("session %llu: its own memory history %s (max %zu entries)", (unsigned long long) sv.id,
                          sv.history ? "on" : "off", sv.history_max_entries);
        Gpumem__HistoryReply reply = GPUMEM__HISTORY_REPLY__INIT;
        reply.enabled = sv.history != NULL;
        reply.max_entries = sv.history_max_entries;
        reply.entries = sv.history ? gm_history_len(sv.history) : 0; /* a local heap counts its own */
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_HISTORY_REPLY;
        out.history_reply = &reply;
        gm_request_send(c, request_id, &out, NULL, 0);
        return 0;
}

int gm_req_admin_history(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__HistoryControl *req = env->history_control;
        gm_broker_t *b = c->rq->broker;
        if (own_history(c))
                return own_history_control(c, request_id, req);
        if (!req->status_only) {
                gm_session_view_t sv;
                gm_session_view(c->session, &sv);
                int r = gm_broker_history(b, req->enabled, req->max_entries);
                if (r < 0)
                        return gm_request_error(c, request_id, r, "cannot set up memory history: %s", strerror(-r)), 0;
                log_info("memory history %s (max %zu entries) by pid %d", b->history ? "on" : "off",
                         b->history_max_entries, (int) sv.pid);
                gm_local_push_history(c->rq); /* local heaps keep their own trace */
        }
        Gpumem__HistoryReply reply = GPUMEM__HISTORY_REPLY__INIT;
        reply.enabled = b->history != NULL;
        reply.max_entries = b->history_max_entries;
        reply.entries = b->history ? gm_history_len(b->history) : 0;
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_HISTORY_REPLY;
        out.history_reply = &reply;
        gm_request_send(c, request_id, &out, NULL, 0);
        return 0;
}

/* ---- allocator settings at run time ---- */

const char *gm_req_admin_for_alloc_conf(const gm_request_conn_t *c, const Gpumem__Envelope *env) {
        return env->alloc_conf->set ? "changing allocator settings" : NULL;
}

int gm_req_admin_alloc_conf(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        const Gpumem__AllocConf *req = env->alloc_conf;
        gm_broker_t *b = c->rq->broker;
        if (req->set) {
                gm_alloc_config_t cfg;
                char err[256] = "";
                int r = gm_alloc_config_parse(req->conf, &cfg, err, sizeof(err));
                if (r < 0)
                        return gm_request_error(c, request_id, EINVAL, "invalid alloc_conf '%s': %s",
                                                req->conf ? req->conf : "", err),
                               0;
                gm_broker_set_alloc_config(b, &cfg);
                char raw[2 * sizeof(cfg.raw)];
                log_notice("allocator settings changed by pid %d: '%s'", (int) sv.pid,
                           gm_text_escape(cfg.raw, raw, sizeof(raw)));
        }
        Gpumem__AllocConfReply reply = GPUMEM__ALLOC_CONF_REPLY__INIT;
        reply.conf = b->alloc_config.raw;
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_ALLOC_CONF_REPLY;
        out.alloc_conf_reply = &reply;
        gm_request_send(c, request_id, &out, NULL, 0);
        return 0;
}

/* ---- quotas and clients ---- */

static void tenant_info(const gm_requests_t *d, const gm_tenant_t *t, Gpumem__TenantInfo *info) {
        gm_stats_t st;
        gm_localstats_tenant_stats(d, t, &st);
        gpumem__tenant_info__init(info);
        info->tenant = (char *) t->name;
        info->quota = t->quota;
        info->quota_source = (char *) gm_tenant_quota_source(t);
        info->charged = t->charged_bytes;
        info->release_unverified = t->release_unverified_bytes;
        info->release_check = (char *) gm_release_check_name(gm_tenant_release_check(d->broker, t));
        info->audited = t->audited_bytes;
        info->claimed = t->claimed_bytes;
        info->allocated = (uint64_t) st.allocated_bytes[GM_STAT_ALL].current;
        int64_t cached = st.reserved_bytes[GM_STAT_ALL].current - st.active_bytes[GM_STAT_ALL].current;
        info->cached = cached > 0 ? (uint64_t) cached : 0;
        info->sessions = t->sessions;
}

const char *gm_req_admin_for_quota(const gm_request_conn_t *c, const Gpumem__Envelope *env) {
        return env->quota->op == GPUMEM__QUOTA_OP__QUOTA_OP_SET ? "setting quotas" : NULL;
}

int gm_req_admin_check_quota(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len) {
        const Gpumem__Quota *req = env->quota;
        if (req->op == GPUMEM__QUOTA_OP__QUOTA_OP_SET && !gm_tenant_name_valid(tenant_named(c, req->tenant)))
                return snprintf(why, why_len, "invalid tenant name"), -EINVAL; /* what the config accepts */
        return 0;
}

/* Sets a quota from a request; 0, or refused (answered). A persistent quota
 * replaces the tenant's runtime one at once (which would hide it until the
 * daemon restarts): what was set is what is in force. */
static int set_quota(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Quota *req, const char *name) {
        gm_session_view_t sv;
        gm_session_view(c->session, &sv);
        const char *state_dir = c->rq->config->state_dir;
        const gm_tenant_t *t = gm_tenant_find(c->rq->broker, name);
        bool replaces_runtime = !req->runtime && t && t->quota_set[GM_QUOTA_RUNTIME];
        uint64_t runtime_bytes = replaces_runtime ? t->quota_by_source[GM_QUOTA_RUNTIME] : 0;
        int r = gm_broker_set_quota(c->rq->broker, name, req->runtime, req->bytes, state_dir);
        if (r == -ENOSPC)
                return gm_request_error(c, request_id, r, "too many tenants"), r;
        if (r == -ENOMEM)
                return gm_request_error(c, request_id, r, "out of memory"), r;
        if (r < 0)
                return gm_request_error(c, request_id, r, "cannot save the quota in '%s': %s",
                                        state_dir ? state_dir : "(no state directory)", strerror(-r)),
                       r;
        char replaced[96] = "";
        if (replaces_runtime) {
                (void) gm_broker_set_quota(c->rq->broker, name, true, 0, state_dir); /* journaled as removed */
                snprintf(replaced, sizeof(replaced), ", replacing its runtime quota of %llu bytes",
                         (unsigned long long) runtime_bytes);
        }
        log_notice("quota of tenant '%s' set to %llu bytes (%s) by pid %d%s", name, (unsigned long long) req->bytes,
                   req->runtime ? "runtime" : "persistent", (int) sv.pid, replaced);
        return 0;
}

int gm_req_admin_quota(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__Quota *req = env->quota;
        gm_broker_t *b = c->rq->broker;
        gm_session_t *s = c->session;
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        const char *name = tenant_named(c, req->tenant);
        if (req->op == GPUMEM__QUOTA_OP__QUOTA_OP_SET && set_quota(c, request_id, req, name) < 0)
                return 0;
        gm_localstats_refresh(c->rq);
        size_t n = b->n_tenants;
        Gpumem__TenantInfo *infos = calloc(n ? n : 1, sizeof(*infos));
        Gpumem__TenantInfo **ptrs = calloc(n ? n : 1, sizeof(*ptrs));
        if (!infos || !ptrs) {
                free(infos);
                free(ptrs);
                return gm_request_error(c, request_id, ENOMEM, "out of memory"), 0;
        }
        size_t k = 0;
        bool list = req->op == GPUMEM__QUOTA_OP__QUOTA_OP_LIST;
        for (gm_tenant_t *t = b->tenants; t; t = t->next) {
                if (!list && strcmp(t->name, name) != 0)
                        continue;
                if (!sv.admin && t != sv.tenant)
                        continue; /* a tenant sees its own figures only */
                tenant_info(c->rq, t, &infos[k]);
                ptrs[k] = &infos[k];
                k++;
        }
        if (!list && k == 0) {
                free(infos);
                free(ptrs);
                return gm_request_error(c, request_id, sv.admin ? ENOENT : EPERM,
                                        sv.admin ? "no tenant '%s'" : "tenant '%s' is not yours to see", name),
                       0;
        }
        Gpumem__QuotaReply reply = GPUMEM__QUOTA_REPLY__INIT;
        reply.n_tenants = k;
        reply.tenants = ptrs;
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_QUOTA_REPLY;
        out.quota_reply = &reply;
        gm_request_send(c, request_id, &out, NULL, 0);
        free(infos);
        free(ptrs);
        return 0;
}

/* One session's tagged pools on the wire: every named pool and the default
 * (only once it has named pools), with their charged bytes. */
typedef struct client_tags {
        Gpumem__TagBytes bytes[GM_SESSION_MAX_TAGS + 1];
        Gpumem__TagBytes *ptrs[GM_SESSION_MAX_TAGS + 1];
} client_tags_t;

static void client_tags_fill(client_tags_t *ct, const gm_session_tags_t *t, Gpumem__ClientInfo *ci) {
        if (!t || t->n == 0)
                return;
        for (unsigned id = 0; id <= t->n; id++) {
                if (id && !t->names[id][0])
                        continue;
                Gpumem__TagBytes *tb = &ct->bytes[ci->n_tags];
                gpumem__tag_bytes__init(tb);
                tb->tag = (char *) t->names[id];
                tb->bytes = t->bytes[id];
                ct->ptrs[ci->n_tags++] = tb;
        }
        ci->tags = ct->ptrs;
}

int gm_req_admin_clients(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        gm_broker_t *b = c->rq->broker;
        gm_session_t *s = c->session;
        gm_session_view_t sv;
        gm_session_view(s, &sv);
        Gpumem__ClientInfo *infos = calloc(b->n_sessions + 1, sizeof(*infos));
        Gpumem__ClientInfo **ptrs = calloc(b->n_sessions + 1, sizeof(*ptrs));
        client_tags_t *tags = calloc(b->n_sessions + 1, sizeof(*tags));
        if (!infos || !ptrs || !tags) {
                free(infos);
                free(ptrs);
                free(tags);
                return gm_request_error(c, request_id, ENOMEM, "out of memory"), 0;
        }
        size_t k = 0;
        gm_localstats_refresh(c->rq);
        for (gm_session_t *o = b->sessions; o && k <= b->n_sessions; o = gm_session_next(o)) {
                gm_session_view_t ov;
                gm_session_view(o, &ov);
                if (ov.ended || !ov.tenant || (!sv.admin && ov.tenant != sv.tenant))
                        continue;
                Gpumem__ClientInfo *ci = &infos[k];
                gpumem__client_info__init(ci);
                ci->session_id = ov.id;
                ci->pid = (uint32_t) ov.pid;
                ci->uid = (uint32_t) ov.uid;
                ci->tenant = ov.tenant->name;
                ci->unit = (char *) ov.unit;
                ci->name = (char *) ov.name;
                ci->admin = ov.admin_conn;
                ci->releasing = ov.releasing_bytes;
                ci->release_unverified = ov.release_unverified_bytes;
                ci->asleep = ov.sleep.asleep;
                ci->sleeping_bytes = ov.sleep.bytes;
                ci->claimed = ov.claim_bytes;
                const gm_request_conn_t *oc = gm_session_userdata(o);
                ci->heap_mode = oc && oc->local ? "local" : "central";
                ci->stats_page_invalid = gm_localstats_page_invalid(o);
                ci->requests = oc ? oc->requests : 0;
                ci->unresponsive = ov.unresponsive;
                ci->unresponsive_ms = ov.unresponsive ? gm_now_ms() - ov.owing_since_ms : 0;
                ci->command = oc ? (char *) oc->command : "";
                client_tags_fill(&tags[k], ov.tags, ci);
                const gm_stats_t *st = gm_localstats_session(o);
                if (st) {
                        ci->reserved = (uint64_t) st->reserved_bytes[GM_STAT_ALL].current;
                        ci->allocated = (uint64_t) st->allocated_bytes[GM_STAT_ALL].current;
                        ci->cached = (uint64_t) (st->reserved_bytes[GM_STAT_ALL].current -
                                                 st->active_bytes[GM_STAT_ALL].current);
                        ci->segments = (uint64_t) st->segment[GM_STAT_ALL].current;
                }
                ptrs[k] = ci;
                k++;
        }
        Gpumem__ClientsReply reply = GPUMEM__CLIENTS_REPLY__INIT;
        reply.n_clients = k;
        reply.clients = ptrs;
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_CLIENTS_REPLY;
        out.clients_reply = &reply;
        gm_request_send(c, request_id, &out, NULL, 0);
        free(infos);
        free(ptrs);
        free(tags);
        return 0;
}
