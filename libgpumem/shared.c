/* Shared objects, the client's side (gpumem.h, "shared objects"): each
 * object is its own reservation, never a heap segment. A staging object is
 * mapped read-write (its fd kept, so a refused publish can map it again);
 * publishing syncs the device, unmaps it and maps what the daemon hands back
 * read-only at the same address; an opened one is mapped read-only. The
 * daemon counts this session as a mapper until the close. Stands on the
 * session (session.h), the segment table's device sync (mapping.h) and the
 * connection (conn.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mapping.h"
#include "session.h"

struct gpumem_shared {
        gm_shared_held_t held; /* listed in c->shared_held once published or opened */
        bool listed;
        uint64_t object_id; /* the daemon's */
        uint64_t base;      /* its reservation here */
        uint64_t size;
        uint64_t version; /* 0 while staging */
        int staging_fd;   /* staging: a copy of its memory's fd, to map it again (else -1) */
        bool mapped;
        void *meta;
        size_t meta_len;
};

/* s holds an open of a published object (s->held.name set): re-attaches
 * report it. */
static void held_list(gpumem_client *c, gpumem_shared *s) {
        if (!s->version)
                return; /* its reply was not taken: nothing to report */
        s->held.object_id = s->object_id;
        s->held.version = s->version;
        s->held.size = s->size;
        pthread_mutex_lock(&c->lock);
        s->held.next = c->shared_held;
        c->shared_held = &s->held;
        s->listed = true;
        pthread_mutex_unlock(&c->lock);
}

static void held_unlist(gpumem_client *c, gpumem_shared *s) {
        if (!s->listed)
                return;
        pthread_mutex_lock(&c->lock);
        gm_shared_held_t **hp = &c->shared_held;
        while (*hp && *hp != &s->held)
                hp = &(*hp)->next;
        if (*hp)
                *hp = s->held.next;
        s->listed = false;
        pthread_mutex_unlock(&c->lock);
}

static void shared_free(gpumem_client *c, gpumem_shared *s) {
        held_unlist(c, s);
        if (s->mapped)
                c->mapper->ops->unmap(c->mapper, s->base, 0, s->size);
        if (s->base)
                c->mapper->ops->unreserve(c->mapper, s->base, s->size);
        if (s->staging_fd >= 0)
                close(s->staging_fd);
        free(s->meta);
        free(s);
}

/* Sends SharedClose for object_id (errors are the daemon's to log). */
static void send_close(gpumem_client *c, uint64_t object_id) {
        Gpumem__SharedClose sc = GPUMEM__SHARED_CLOSE__INIT;
        sc.object_id = object_id;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_SHARED_CLOSE;
        env.shared_close = &sc;
        Gpumem__Envelope *reply = NULL;
        if (gm_conn_call_expect(c, &env, NULL, GPUMEM__ENVELOPE__BODY_OK, &reply) == 0)
                gm_msg_free(reply);
}

/* Sends env, whose reply must be `want` with one fd (*ret_fd). */
static int call_with_fd(gpumem_client *c, Gpumem__Envelope *env, Gpumem__Envelope__BodyCase want,
                        Gpumem__Envelope **ret_reply, int *ret_fd) {
        Gpumem__Envelope *reply = NULL;
        int fd = -1;
        int r = gm_conn_call_fd(c, env, NULL, &reply, &fd);
        if (r < 0)
                return r;
        if (reply->body_case != want || fd < 0) {
                if (fd >= 0)
                        close(fd);
                gm_msg_free(reply);
                return gm_conn_set_error(c, -EPROTO, "gpumem: unexpected reply to a shared object request");
        }
        *ret_reply = reply;
        *ret_fd = fd;
        return 0;
}

/* Maps fd (consumed) at s's reservation, read-only or read-write. */
static int map_object(gpumem_client *c, gpumem_shared *s, int fd, bool read_only) {
        const gm_mapper_ops_t *ops = c->mapper->ops;
        if (read_only && !ops->map_read) {
                close(fd);
                return gm_conn_set_error(c, -EOPNOTSUPP, "gpumem: this memory kind cannot map read-only");
        }
        int r = (read_only ? ops->map_read : ops->map)(c->mapper, s->base, 0, s->size, fd);
        if (r < 0)
                return gm_conn_set_error(c, r, "gpumem: cannot map shared object: %s", strerror(-r));
        s->mapped = true;
        return 0;
}

static gpumem_shared *shared_new(gpumem_client *c, const char *name, uint64_t object_id, uint64_t size) {
        gpumem_shared *s = calloc(1, sizeof(*s));
        if (!s)
                return NULL;
        snprintf(s->held.name, sizeof(s->held.name), "%s", name);
        s->object_id = object_id;
        s->size = size;
        s->staging_fd = -1;
        if (size == 0 || size % c->mapper->granularity != 0 || c->mapper->ops->reserve(c->mapper, size, &s->base) < 0) {
                free(s);
                return NULL;
        }
        return s;
}

int gpumem_shared_create(gpumem_client *c, const char *name, uint64_t size, gpumem_shared **ret, void **ret_ptr) {
        if (!c || !name || !ret || !ret_ptr)
                return -EINVAL;
        int r = gm_session_ensure_own(c);
        if (r < 0)
                return r;
        Gpumem__SharedCreate sc = GPUMEM__SHARED_CREATE__INIT;
        sc.name = (char *) name;
        sc.size = size;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_SHARED_CREATE;
        env.shared_create = &sc;
        Gpumem__Envelope *reply = NULL;
        int fd = -1;
        if ((r = call_with_fd(c, &env, GPUMEM__ENVELOPE__BODY_SHARED_CREATE_REPLY, &reply, &fd)) < 0)
                return r;
        uint64_t object_id = reply->shared_create_reply->object_id;
        gpumem_shared *s = shared_new(c, name, object_id, reply->shared_create_reply->size);
        gm_msg_free(reply);
        if (s)
                s->staging_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (!s || s->staging_fd < 0 || (r = map_object(c, s, fd, false)) < 0) {
                if (!s || s->staging_fd < 0) {
                        close(fd);
                        r = gm_conn_set_error(c, -ENOMEM, "gpumem: no room to map shared object '%s'", name);
                }
                if (s)
                        shared_free(c, s);
                send_close(c, object_id); /* given up */
                return r;
        }
        *ret = s;
        *ret_ptr = (void *) (uintptr_t) s->base;
        return 0;
}

/* Takes a SharedObjectReply's figures and meta into s. */
static int take_object(gpumem_client *c, gpumem_shared *s, const Gpumem__SharedObjectReply *o) {
        void *meta = NULL;
        if (o->meta.len && !(meta = malloc(o->meta.len)))
                return gm_conn_set_error(c, -ENOMEM, "gpumem: out of memory");
        if (o->meta.len)
                memcpy(meta, o->meta.data, o->meta.len);
        free(s->meta);
        s->meta = meta;
        s->meta_len = o->meta.len;
        s->version = o->version;
        return 0;
}

int gpumem_shared_publish(gpumem_client *c, gpumem_shared *s, const char *const *readers, const void *meta,
                          size_t meta_len, uint32_t retention_s, uint64_t *ret_version) {
        if (!c || !s || s->version || s->staging_fd < 0 || (meta_len && !meta))
                return -EINVAL;
        int r = gm_session_ensure_own(c);
        if (r < 0)
                return r;
        size_t n_readers = 0;
        while (readers && readers[n_readers])
                n_readers++;
        /* The device's work on it is done before the writable mapping goes. */
        gm_mapping_sync_device(c);
        if (s->mapped && (r = c->mapper->ops->unmap(c->mapper, s->base, 0, s->size)) < 0)
                return gm_conn_set_error(c, r, "gpumem: cannot unmap the staging object: %s", strerror(-r));
        s->mapped = false;
        Gpumem__SharedPublish sp = GPUMEM__SHARED_PUBLISH__INIT;
        sp.object_id = s->object_id;
        sp.readers = (char **) readers;
        sp.n_readers = n_readers;
        sp.meta.data = (uint8_t *) meta;
        sp.meta.len = meta_len;
        sp.retention_s = retention_s;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_SHARED_PUBLISH;
        env.shared_publish = &sp;
        Gpumem__Envelope *reply = NULL;
        int fd = -1;
        if ((r = call_with_fd(c, &env, GPUMEM__ENVELOPE__BODY_SHARED_OBJECT_REPLY, &reply, &fd)) < 0) {
                /* Still staging: writable here again. */
                int copy = fcntl(s->staging_fd, F_DUPFD_CLOEXEC, 0);
                if (copy >= 0)
                        map_object(c, s, copy, false);
                return r;
        }
        r = take_object(c, s, reply->shared_object_reply);
        gm_msg_free(reply);
        close(s->staging_fd);
        s->staging_fd = -1;
        held_list(c, s); /* the daemon counts it open from here on */
        if (r < 0)
                close(fd);
        if (r < 0 || (r = map_object(c, s, fd, true)) < 0)
                return r; /* published, but not mapped here: close the handle */
        if (ret_version)
                *ret_version = s->version;
        return 0;
}

int gpumem_shared_open(gpumem_client *c, const char *name, uint64_t version, gpumem_shared **ret) {
        if (!c || !name || !ret)
                return -EINVAL;
        int r = gm_session_ensure_own(c);
        if (r < 0)
                return r;
        Gpumem__SharedOpen so = GPUMEM__SHARED_OPEN__INIT;
        so.name = (char *) name;
        so.version = version;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_SHARED_OPEN;
        env.shared_open = &so;
        Gpumem__Envelope *reply = NULL;
        int fd = -1;
        if ((r = call_with_fd(c, &env, GPUMEM__ENVELOPE__BODY_SHARED_OBJECT_REPLY, &reply, &fd)) < 0)
                return r;
        const Gpumem__SharedObjectReply *o = reply->shared_object_reply;
        uint64_t object_id = o->object_id;
        gpumem_shared *s = shared_new(c, name, object_id, o->size);
        r = s ? take_object(c, s, o) : gm_conn_set_error(c, -ENOMEM, "gpumem: no room to map '%s'", name);
        gm_msg_free(reply);
        if (r < 0)
                close(fd);
        if (r < 0 || (r = map_object(c, s, fd, true)) < 0) {
                if (s)
                        shared_free(c, s);
                send_close(c, object_id);
                return r;
        }
        held_list(c, s);
        *ret = s;
        return 0;
}

const void *gpumem_shared_ptr(const gpumem_shared *s) {
        return s && s->mapped ? (const void *) (uintptr_t) s->base : NULL;
}

uint64_t gpumem_shared_size(const gpumem_shared *s) {
        return s ? s->size : 0;
}

uint64_t gpumem_shared_version(const gpumem_shared *s) {
        return s ? s->version : 0;
}

int gpumem_shared_meta(const gpumem_shared *s, const void **ret_meta, size_t *ret_len) {
        if (!s || !ret_meta || !ret_len)
                return -EINVAL;
        *ret_meta = s->meta;
        *ret_len = s->meta_len;
        return 0;
}

void gpumem_shared_close(gpumem_client *c, gpumem_shared *s) {
        if (!c || !s)
                return;
        uint64_t object_id = s->object_id;
        shared_free(c, s);
        if (gm_session_ensure_own(c) == 0)
                send_close(c, object_id);
}

int gpumem_shared_unpublish(gpumem_client *c, const char *name, uint64_t version) {
        if (!c || !name)
                return -EINVAL;
        int r = gm_session_ensure_own(c);
        if (r < 0)
                return r;
        Gpumem__SharedUnpublish su = GPUMEM__SHARED_UNPUBLISH__INIT;
        su.name = (char *) name;
        su.version = version;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_SHARED_UNPUBLISH;
        env.shared_unpublish = &su;
        Gpumem__Envelope *reply = NULL;
        if ((r = gm_conn_call_expect(c, &env, NULL, GPUMEM__ENVELOPE__BODY_OK, &reply)) < 0)
                return r;
        gm_msg_free(reply);
        return 0;
}
