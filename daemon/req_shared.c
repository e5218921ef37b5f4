/* Shared objects' requests (table handlers). Decoding only: the objects,
 * their charge, mappers and journal are the broker's shared registry
 * (broker.h, "shared objects"). Every reply that hands the memory over
 * carries a copy of the registry's fd; the client maps it read-write
 * (staging) or read-only (published). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "req_shared.h"

/* The client's text for a registry refusal. */
static const char *why_refused(int r) {
        switch (r) {
        case -EINVAL:
                return "invalid name, size or reader";
        case -EEXIST:
                return "this session stages that name already";
        case -EDQUOT:
                return "the tenant's quota is full";
        case -ENOMEM:
                return "the device is full";
        case -ENOSPC:
                return "too many shared objects (max_shared_objects) or opens in this session";
        case -EFBIG:
                return "larger than the tenant's quota or the device";
        case -ENOENT:
                return "no such shared object";
        case -EACCES:
                return "the object's readers do not admit this tenant";
        case -EPERM:
                return "only the publisher's tenant or an admin may unpublish it";
        case -EBUSY:
                return "a writable mapping of it remains: unmap it first";
        case -EMSGSIZE:
                return "meta exceeds 1 MiB";
        default:
                return strerror(-r);
        }
}

static int refuse(gm_request_conn_t *c, uint64_t request_id, int r, const char *what) {
        return gm_request_error(c, request_id, r, "%s: %s", what, why_refused(r)), 0;
}

int gm_req_shared_check(const gm_request_conn_t *c, const Gpumem__Envelope *env, char *why, size_t why_len) {
        const char *name = NULL;
        switch (env->body_case) {
        case GPUMEM__ENVELOPE__BODY_SHARED_CREATE:
                name = env->shared_create->name;
                break;
        case GPUMEM__ENVELOPE__BODY_SHARED_OPEN:
                name = env->shared_open->name;
                break;
        case GPUMEM__ENVELOPE__BODY_SHARED_UNPUBLISH:
                name = env->shared_unpublish->name;
                break;
        case GPUMEM__ENVELOPE__BODY_SHARED_LIST:
                if (!env->shared_list->name[0] && env->shared_list->version) {
                        snprintf(why, why_len, "a version needs a name");
                        return -EINVAL;
                }
                if (!env->shared_list->name[0])
                        return 0;
                name = env->shared_list->name;
                break;
        case GPUMEM__ENVELOPE__BODY_SHARED_PUBLISH:
                if (env->shared_publish->n_readers > GM_SHARED_MAX_READERS) {
                        snprintf(why, why_len, "at most %u readers", GM_SHARED_MAX_READERS);
                        return -E2BIG;
                }
                if (env->shared_publish->meta.len > GM_SHARED_META_MAX) {
                        snprintf(why, why_len, "meta exceeds %u bytes", GM_SHARED_META_MAX);
                        return -EMSGSIZE;
                }
                return 0;
        default:
                return 0;
        }
        if (!gm_shared_name_valid(name)) {
                snprintf(why, why_len, "a shared object's name is 1 to %u of [A-Za-z0-9_.:/-]", GM_SHARED_NAME_MAX);
                return -EINVAL;
        }
        return 0;
}

int gm_req_shared_create(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        gm_shared_view_t v;
        int r = gm_shared_create(c->session, env->shared_create->name, env->shared_create->size, &v);
        if (r < 0)
                return refuse(c, request_id, r, "SharedCreate");
        Gpumem__SharedCreateReply reply = GPUMEM__SHARED_CREATE_REPLY__INIT;
        reply.object_id = v.id;
        reply.size = v.size;
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_SHARED_CREATE_REPLY;
        out.shared_create_reply = &reply;
        if (gm_request_send(c, request_id, &out, &v.fd, 1) < 0)
                gm_shared_close(c->session, v.id); /* never reached the client */
        return 0;
}

/* SharedObjectReply for a published object the session now maps: its fd
 * with it. A failed send drops the open again. */
static int answer_object(gm_request_conn_t *c, uint64_t request_id, const gm_shared_view_t *v) {
        Gpumem__SharedObjectReply reply = GPUMEM__SHARED_OBJECT_REPLY__INIT;
        reply.object_id = v->id;
        reply.name = (char *) v->name;
        reply.version = v->version;
        reply.size = v->size;
        reply.meta.data = (uint8_t *) v->meta;
        reply.meta.len = v->meta_len;
        reply.tenant = (char *) v->tenant;
        Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
        out.body_case = GPUMEM__ENVELOPE__BODY_SHARED_OBJECT_REPLY;
        out.shared_object_reply = &reply;
        uint64_t id = v->id;
        if (gm_request_send(c, request_id, &out, &v->fd, 1) < 0)
                gm_shared_close(c->session, id);
        return 0;
}

int gm_req_shared_publish(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__SharedPublish *p = env->shared_publish;
        gm_shared_view_t v;
        int r = gm_shared_publish(c->session, p->object_id, (const char *const *) p->readers, p->n_readers,
                                  p->meta.data, p->meta.len, p->retention_s, &v);
        if (r < 0)
                return refuse(c, request_id, r, "SharedPublish");
        return answer_object(c, request_id, &v);
}

int gm_req_shared_open(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        gm_shared_view_t v;
        int r = gm_shared_open(c->session, env->shared_open->name, env->shared_open->version, &v);
        if (r < 0)
                return refuse(c, request_id, r, "SharedOpen");
        return answer_object(c, request_id, &v);
}

int gm_req_shared_close(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        int r = gm_shared_close(c->session, env->shared_close->object_id);
        if (r < 0)
                return refuse(c, request_id, r, "SharedClose");
        return gm_request_ok(c, request_id);
}

int gm_req_shared_unpublish(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        int r = gm_shared_unpublish(c->session, env->shared_unpublish->name, env->shared_unpublish->version);
        if (r < 0)
                return refuse(c, request_id, r, "SharedUnpublish");
        return gm_request_ok(c, request_id);
}

/* ---- listing ---- */

/* Room one object's entry takes in a reply, at most (readers included). */
static size_t info_bytes(const gm_shared_view_t *v, size_t n_sessions) {
        size_t n = 64 + strlen(v->name) + strlen(v->tenant) + 24 * n_sessions;
        for (size_t i = 0; i < v->n_readers; i++)
                n += 4 + strlen(v->readers[i]);
        return n;
}

/* The sessions mapping o, into *ret (malloc'd; NULL when none). */
static int list_mappers(const gm_shared_t *o, Gpumem__SharedMapper ***ret, size_t *ret_n) {
        size_t n = 0;
        uint32_t opens;
        for (const gm_session_t *s = gm_shared_mapper_next(o, NULL, &opens); s; s = gm_shared_mapper_next(o, s, &opens))
                n++;
        Gpumem__SharedMapper **ptrs = n ? calloc(n, sizeof(*ptrs)) : NULL;
        Gpumem__SharedMapper *ms = n ? calloc(n, sizeof(*ms)) : NULL;
        if (n && (!ptrs || !ms)) {
                free(ptrs);
                free(ms);
                return -ENOMEM;
        }
        size_t k = 0;
        for (const gm_session_t *s = gm_shared_mapper_next(o, NULL, &opens); s && k < n;
             s = gm_shared_mapper_next(o, s, &opens)) {
                gm_session_view_t sv;
                gm_session_view((gm_session_t *) s, &sv);
                gpumem__shared_mapper__init(&ms[k]);
                ms[k].session_id = sv.id;
                ms[k].pid = (uint32_t) sv.pid;
                ms[k].tenant = sv.tenant ? sv.tenant->name : "";
                ms[k].opens = opens;
                ptrs[k] = &ms[k];
                k++;
        }
        *ret = ptrs;
        *ret_n = k;
        return 0;
}

int gm_req_shared_list(gm_request_conn_t *c, uint64_t request_id, const Gpumem__Envelope *env) {
        const Gpumem__SharedList *q = env->shared_list;
        const gm_broker_t *b = c->rq->broker;
        gm_session_view_t caller;
        gm_session_view(c->session, &caller);
        bool named = q->name[0] != '\0';
        size_t n = 0;
        for (const gm_shared_t *o = gm_shared_next(b, NULL); o; o = gm_shared_next(b, o))
                n++;
        Gpumem__SharedInfo *infos = n ? calloc(n, sizeof(*infos)) : NULL;
        Gpumem__SharedInfo **ptrs = n ? calloc(n, sizeof(*ptrs)) : NULL;
        int r = !n || (infos && ptrs) ? 0 : -ENOMEM;
        size_t k = 0, room = c->rq->config->max_packet / 2, used = 0;
        bool truncated = false;
        /* Newest first: a listing that does not fit leaves the oldest out. */
        for (const gm_shared_t *o = gm_shared_next(b, NULL); o && r == 0 && k < n; o = gm_shared_next(b, o)) {
                gm_shared_view_t v;
                gm_shared_view(o, &v);
                if ((!caller.admin && (!caller.tenant || !gm_shared_admits(o, caller.tenant))) ||
                    (named && (strcmp(v.name, q->name) != 0 || (q->version && v.version != q->version))))
                        continue;
                Gpumem__SharedInfo *e = &infos[k];
                gpumem__shared_info__init(e);
                if (named)
                        r = list_mappers(o, &e->sessions, &e->n_sessions);
                if (r < 0)
                        break;
                size_t bytes = info_bytes(&v, e->n_sessions);
                if (used + bytes > room) {
                        truncated = true;
                        free(e->sessions ? e->sessions[0] : NULL);
                        free(e->sessions);
                        break;
                }
                used += bytes;
                e->object_id = v.id;
                e->name = (char *) v.name;
                e->version = v.version;
                e->tenant = (char *) v.tenant;
                e->size = v.size;
                e->state = (char *) gm_shared_state_name(v.state);
                e->mappers = v.mappers;
                e->created_unix_ms = v.created_unix_ms;
                e->retention_s = v.retention_s;
                e->readers = (char **) v.readers;
                e->n_readers = v.n_readers;
                e->meta_len = v.meta_len;
                ptrs[k++] = e;
        }
        if (r == 0) {
                Gpumem__SharedListReply reply = GPUMEM__SHARED_LIST_REPLY__INIT;
                reply.objects = ptrs;
                reply.n_objects = k;
                reply.truncated = truncated;
                Gpumem__Envelope out = GPUMEM__ENVELOPE__INIT;
                out.body_case = GPUMEM__ENVELOPE__BODY_SHARED_LIST_REPLY;
                out.shared_list_reply = &reply;
                (void) gm_request_send(c, request_id, &out, NULL, 0);
        } else {
                gm_request_error(c, request_id, r, "SharedList: %s", strerror(-r));
        }
        for (size_t i = 0; i < k; i++)
                if (infos[i].sessions) {
                        free(infos[i].sessions[0]);
                        free(infos[i].sessions);
                }
        free(infos);
        free(ptrs);
        return 0;
}
