/* The shared registry: named, versioned, read-only memory. A session
 * creates a staging object (charged to its tenant at once) and fills it
 * through its one writable mapping; publishing seals it where the backend
 * can (host: the memfd's write seals), numbers it (the name's highest
 * version + 1), keeps its fd in the store and the journal, and opens it for
 * the publisher. The registry owns the memory, not a session: it survives
 * the publisher's end, and goes back to the backend only once withdrawn
 * (unpublished, or its retention over) and closed by its last mapper.
 * Invariants (gm_shared_check): a tenant's charge includes its objects'
 * bytes; an object's mappers = its open records' counts, each a live
 * session's; a session's shared_opens = its open records' counts plus the
 * objects it stages; n_shared = the objects listed. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "piece.h"

const char *gm_shared_state_name(gm_shared_state_t state) {
        static const char *const names[] = {"staging", "published", "withdrawn"};
        return state <= GM_SHARED_WITHDRAWN ? names[state] : "?";
}

bool gm_shared_name_valid(const char *name) {
        size_t n = name ? strlen(name) : 0;
        if (n == 0 || n > GM_SHARED_NAME_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:/-", name[i]))
                        return false;
        return true;
}

/* A reader: "*" or a tenant name (printable, no spaces: the journal keeps
 * one a line). */
static bool reader_valid(const char *r) {
        size_t n = r ? strlen(r) : 0;
        if (n == 0 || n >= sizeof(((gm_tenant_t *) 0)->name))
                return false;
        for (size_t i = 0; i < n; i++)
                if (r[i] <= ' ' || r[i] > '~')
                        return false;
        return true;
}

void gm_shared_view(const gm_shared_t *o, gm_shared_view_t *ret) {
        *ret = (gm_shared_view_t){
                .id = o->id,
                .name = o->name,
                .version = o->version,
                .tenant = o->tenant->name,
                .size = o->phys.size,
                .state = o->state,
                .mappers = o->mappers,
                .created_unix_ms = o->created_unix_ms,
                .retention_s = o->retention_s,
                .readers = (const char *const *) o->readers,
                .n_readers = o->n_readers,
                .meta = o->meta,
                .meta_len = o->meta_len,
                .fd = o->phys.fd,
        };
}

const gm_shared_t *gm_shared_next(const gm_broker_t *b, const gm_shared_t *prev) {
        return prev ? prev->next : b->shared;
}

const gm_session_t *gm_shared_mapper_next(const gm_shared_t *o, const gm_session_t *prev, uint32_t *ret_opens) {
        if (o->stager) { /* staging: its one writable mapping */
                if (prev)
                        return NULL;
                *ret_opens = 1;
                return o->stager;
        }
        const gm_shared_open_t *so = o->opens;
        while (prev && so && so->session != prev) /* prev's first record */
                so = so->next;
        for (so = prev ? (so ? so->next : NULL) : so; so; so = so->next) {
                bool seen = false; /* a session re-attached under two ids has two records */
                for (const gm_shared_open_t *e = o->opens; e != so && !seen; e = e->next)
                        seen = e->session == so->session;
                if (seen)
                        continue;
                uint32_t opens = 0;
                for (const gm_shared_open_t *e = so; e; e = e->next)
                        opens += e->session == so->session ? e->count : 0;
                *ret_opens = opens;
                return so->session;
        }
        return NULL;
}

uint64_t gm_shared_bytes(const gm_broker_t *b) {
        uint64_t bytes = 0;
        for (const gm_shared_t *o = b->shared; o; o = o->next)
                bytes += o->phys.size;
        return bytes;
}

uint64_t gm_shared_mapped(const gm_session_t *s, uint64_t now_ms, uint64_t settle_ms, uint64_t *ret_recent) {
        uint64_t bytes = 0, recent = 0;
        for (const gm_shared_t *o = s->shared_opens ? s->broker->shared : NULL; o; o = o->next) {
                uint64_t handed_ms = o->handed_ms;
                bool maps = o->stager == s;
                for (const gm_shared_open_t *so = o->opens; so && !maps; so = so->next)
                        if (so->session == s) {
                                maps = true;
                                handed_ms = so->handed_ms;
                        }
                if (!maps)
                        continue;
                bytes += o->phys.size;
                if (now_ms < handed_ms + settle_ms)
                        recent += o->phys.size;
        }
        *ret_recent = recent;
        return bytes;
}

uint64_t gm_shared_charged(const gm_broker_t *b, const gm_tenant_t *t) {
        uint64_t bytes = 0;
        for (const gm_shared_t *o = b->shared; o; o = o->next)
                if (o->tenant == t)
                        bytes += o->phys.size;
        return bytes;
}

static gm_shared_t *find_id(const gm_broker_t *b, uint64_t id) {
        for (gm_shared_t *o = b->shared; o; o = o->next)
                if (o->id == id)
                        return o;
        return NULL;
}

static void free_readers(gm_shared_t *o) {
        for (size_t i = 0; i < o->n_readers; i++)
                free(o->readers[i]);
        free(o->readers);
        o->readers = NULL;
        o->n_readers = 0;
}

/* Unlinks o, uncharges it and gives its memory back (or, when the broker
 * keeps stored pieces, leaves a stored one to the next daemon). */
static void destroy(gm_broker_t *b, gm_shared_t *o) {
        gm_shared_t **op = &b->shared;
        while (*op != o)
                op = &(*op)->next;
        *op = o->next;
        b->n_shared--;
        while (o->opens) {
                gm_shared_open_t *so = o->opens;
                o->opens = so->next;
                so->session->shared_opens -= so->count;
                free(so);
        }
        if (o->stager)
                o->stager->shared_opens--;
        gm_assert(o->tenant->charged_bytes >= o->phys.size);
        o->tenant->charged_bytes -= o->phys.size;
        if (!b->keep_stored)
                gm_ledger_shared_unstore(b, o);
        else if (o->store_id)
                b->n_stored--; /* the next daemon's now */
        /* A staging object's writable mapping may outlive its session (a
         * process that kept it): its contents are cut out first (host). */
        if (o->state == GM_SHARED_STAGING && b->backend->ops->mapped && !b->stopping)
                (void) b->backend->ops->mapped(b->backend, &o->phys);
        gm_backend_release(b->backend, &o->phys);
        free_readers(o);
        free(o->meta);
        free(o);
}

/* A withdrawn object nobody maps any more is released (an adopted one once
 * the sessions that may map it had their time to re-attach). */
static void maybe_release(gm_broker_t *b, gm_shared_t *o) {
        if (o->state == GM_SHARED_WITHDRAWN && o->mappers == 0 && !o->mappers_unknown)
                destroy(b, o);
}

/* One more open of o by s, in the record of s that its client names
 * `client_id` (0: opened here, by o's id). */
static void add_open(gm_session_t *s, gm_shared_t *o, gm_shared_open_t *so, uint64_t client_id) {
        for (gm_shared_open_t *e = o->opens; e; e = e->next)
                if (e->session == s && e->client_id == client_id) {
                        free(so);
                        so = e;
                        break;
                }
        if (so->session != s) {
                *so = (gm_shared_open_t){.session = s, .client_id = client_id, .next = o->opens};
                o->opens = so;
        }
        so->count++;
        so->handed_ms = gm_now_ms();
        o->mappers++;
        s->shared_opens++;
}

static gm_shared_t *link_new(gm_broker_t *b) {
        gm_shared_t *o = calloc(1, sizeof(*o));
        if (!o)
                return NULL;
        /* Ids start at the realtime clock, so that an id a client kept from
         * the previous daemon names nothing here. */
        if (!b->next_shared_id)
                b->next_shared_id = gm_realtime_us();
        o->id = ++b->next_shared_id;
        o->next = b->shared;
        b->shared = o;
        b->n_shared++;
        return o;
}

static uint32_t max_objects(const gm_broker_t *b) {
        return b->limits.max_shared_objects ? b->limits.max_shared_objects : GM_SHARED_DEFAULT_MAX_OBJECTS;
}

int gm_shared_create(gm_session_t *s, const char *name, uint64_t size, gm_shared_view_t *ret_view) {
        gm_broker_t *b = s->broker;
        if (!s->tenant || s->ended)
                return -ESHUTDOWN;
        if (!gm_shared_name_valid(name) || size == 0)
                return -EINVAL;
        uint64_t rounded = gm_round_up(size, b->backend->granularity);
        if (rounded == 0 || rounded > b->backend->capacity || (s->tenant->quota && rounded > s->tenant->quota))
                return -EFBIG;
        for (const gm_shared_t *o = b->shared; o; o = o->next)
                if (o->stager == s && strcmp(o->name, name) == 0)
                        return -EEXIST;
        if (b->n_shared >= max_objects(b) || s->shared_opens >= GM_SHARED_OPENS_PER_SESSION)
                return -ENOSPC;
        int r = gm_piece_room_for(s, rounded, 0);
        if (r < 0)
                return r;
        gm_phys_t phys;
        r = gm_backend_create(b->backend, rounded, &phys);
        if (r < 0)
                return r;
        gm_shared_t *o = link_new(b);
        if (!o) {
                gm_backend_release(b->backend, &phys);
                return -ENOMEM;
        }
        snprintf(o->name, sizeof(o->name), "%s", name);
        o->tenant = s->tenant;
        o->phys = phys;
        o->state = GM_SHARED_STAGING;
        o->stager = s;
        o->handed_ms = gm_now_ms();
        o->created_unix_ms = gm_realtime_us() / 1000;
        s->tenant->charged_bytes += rounded;
        gm_claim_consume(s, rounded); /* its claim covers what it stages too */
        s->shared_opens++;
        gm_shared_view(o, ret_view);
        return 0;
}

static uint64_t highest_version(const gm_broker_t *b, const char *name) {
        uint64_t v = 0;
        for (const gm_shared_t *o = b->shared; o; o = o->next)
                if (o->version > v && strcmp(o->name, name) == 0)
                        v = o->version;
        for (size_t i = 0; i < b->n_ledger_shared; i++)
                if (b->ledger_shared[i].version > v && strcmp(b->ledger_shared[i].name, name) == 0)
                        v = b->ledger_shared[i].version;
        return v;
}

int gm_shared_publish(gm_session_t *s, uint64_t id, const char *const *readers, size_t n_readers, const void *meta,
                      size_t meta_len, uint32_t retention_s, gm_shared_view_t *ret_view) {
        gm_broker_t *b = s->broker;
        gm_shared_t *o = find_id(b, id);
        if (!o || o->state != GM_SHARED_STAGING || o->stager != s)
                return -ENOENT;
        if (n_readers > GM_SHARED_MAX_READERS)
                return -EINVAL;
        for (size_t i = 0; i < n_readers; i++)
                if (!reader_valid(readers[i]))
                        return -EINVAL;
        if (meta_len > GM_SHARED_META_MAX)
                return -EMSGSIZE;
        char **copy = n_readers ? calloc(n_readers, sizeof(*copy)) : NULL;
        void *meta_copy = meta_len ? malloc(meta_len) : NULL;
        gm_shared_open_t *so = calloc(1, sizeof(*so));
        bool ok = so && (!n_readers || copy) && (!meta_len || meta_copy);
        for (size_t i = 0; ok && i < n_readers; i++)
                ok = (copy[i] = strdup(readers[i])) != NULL;
        int r = ok ? 0 : -ENOMEM;
        if (r == 0 && b->backend->ops->freeze)
                r = b->backend->ops->freeze(b->backend, &o->phys);
        if (r < 0) {
                for (size_t i = 0; copy && i < n_readers; i++)
                        free(copy[i]);
                free(copy);
                free(meta_copy);
                free(so);
                return r;
        }
        if (meta_len)
                memcpy(meta_copy, meta, meta_len);
        o->readers = copy;
        o->n_readers = n_readers;
        o->meta = meta_copy;
        o->meta_len = meta_len;
        o->retention_s = retention_s;
        o->version = highest_version(b, o->name) + 1;
        o->state = GM_SHARED_PUBLISHED;
        o->created_unix_ms = gm_realtime_us() / 1000;
        o->stager = NULL;
        s->shared_opens--;
        add_open(s, o, so, 0); /* the publisher maps it read-only from now on */
        gm_ledger_shared_store(b, o);
        gm_shared_view(o, ret_view);
        return 0;
}

bool gm_shared_admits(const gm_shared_t *o, const gm_tenant_t *t) {
        if (t == o->tenant)
                return true;
        for (size_t i = 0; i < o->n_readers; i++)
                if (strcmp(o->readers[i], "*") == 0 || strcmp(o->readers[i], t->name) == 0)
                        return true;
        return false;
}

/* s opens o (its client names it client_id; 0: o's id): -EACCES when o's
 * readers do not admit s's tenant, -ENOSPC past s's opens. */
static int open_for(gm_session_t *s, gm_shared_t *o, uint64_t client_id) {
        if (!gm_shared_admits(o, s->tenant))
                return -EACCES;
        if (s->shared_opens >= GM_SHARED_OPENS_PER_SESSION)
                return -ENOSPC;
        gm_shared_open_t *so = calloc(1, sizeof(*so));
        if (!so)
                return -ENOMEM;
        add_open(s, o, so, client_id);
        return 0;
}

int gm_shared_open(gm_session_t *s, const char *name, uint64_t version, gm_shared_view_t *ret_view) {
        gm_broker_t *b = s->broker;
        if (!s->tenant || s->ended)
                return -ESHUTDOWN;
        if (!gm_shared_name_valid(name))
                return -EINVAL;
        gm_shared_t *found = NULL;
        for (gm_shared_t *o = b->shared; o; o = o->next)
                if (o->state == GM_SHARED_PUBLISHED && strcmp(o->name, name) == 0 &&
                    (version ? o->version == version : (!found || o->version > found->version)))
                        found = o;
        if (!found)
                return -ENOENT;
        int r = open_for(s, found, 0);
        if (r == 0)
                gm_shared_view(found, ret_view);
        return r;
}

int gm_shared_reattach(gm_session_t *s, uint64_t client_id, const char *name, uint64_t version, uint64_t size) {
        gm_broker_t *b = s->broker;
        if (!s->tenant || s->ended)
                return -ESHUTDOWN;
        if (!gm_shared_name_valid(name) || !version || !client_id)
                return -EINVAL;
        gm_shared_t *found = NULL;
        for (gm_shared_t *o = b->shared; o && !found; o = o->next)
                if (o->mappers_unknown && o->version == version && o->phys.size == size && strcmp(o->name, name) == 0)
                        found = o;
        return found ? open_for(s, found, client_id) : -ENOENT;
}

/* The link to s's open record of o that its client names `client_id`
 * (0: o's own id), or NULL. */
static gm_shared_open_t **open_link(gm_shared_t *o, const gm_session_t *s, uint64_t client_id) {
        for (gm_shared_open_t **sp = &o->opens; *sp; sp = &(*sp)->next)
                if ((*sp)->session == s && (*sp)->client_id == client_id)
                        return sp;
        return NULL;
}

int gm_shared_close(gm_session_t *s, uint64_t id) {
        gm_broker_t *b = s->broker;
        gm_shared_t *o = find_id(b, id);
        if (o && o->state == GM_SHARED_STAGING) {
                if (o->stager != s)
                        return -ENOENT;
                destroy(b, o); /* abandoned before it was published */
                return 0;
        }
        gm_shared_open_t **sp = o ? open_link(o, s, 0) : NULL;
        if (!sp) /* a re-attached open, named by the previous daemon's id */
                for (o = b->shared; o && !(sp = open_link(o, s, id)); o = o->next)
                        ;
        if (!sp)
                return -ENOENT;
        gm_shared_open_t *so = *sp;
        so->count--;
        o->mappers--;
        s->shared_opens--;
        if (so->count == 0) {
                *sp = so->next;
                free(so);
        }
        maybe_release(b, o);
        return 0;
}

/* Withdraws o: nobody opens it any more; released once unmapped. */
static void withdraw(gm_broker_t *b, gm_shared_t *o) {
        o->state = GM_SHARED_WITHDRAWN;
        gm_ledger_shared_unstore(b, o); /* no next daemon adopts it */
        maybe_release(b, o);
}

int gm_shared_unpublish(gm_session_t *s, const char *name, uint64_t version) {
        gm_broker_t *b = s->broker;
        if (!s->tenant || s->ended)
                return -ESHUTDOWN;
        if (!gm_shared_name_valid(name))
                return -EINVAL;
        bool any = false, refused = false;
        for (gm_shared_t *o = b->shared; o; o = o->next)
                if (o->state == GM_SHARED_PUBLISHED && strcmp(o->name, name) == 0 &&
                    (!version || o->version == version)) {
                        if (o->tenant != s->tenant && !s->admin)
                                refused = true;
                        else
                                any = true;
                }
        if (refused)
                return -EPERM; /* all or nothing */
        if (!any)
                return -ENOENT;
        for (gm_shared_t *o = b->shared, *next; o; o = next) {
                next = o->next;
                if (o->state == GM_SHARED_PUBLISHED && strcmp(o->name, name) == 0 &&
                    (!version || o->version == version))
                        withdraw(b, o);
        }
        return 0;
}

void gm_shared_session_ended(gm_session_t *s) {
        gm_broker_t *b = s->broker;
        for (gm_shared_t *o = b->shared, *next; o && s->shared_opens; o = next) {
                next = o->next;
                if (o->stager == s) {
                        destroy(b, o);
                        continue;
                }
                bool opened = false; /* in one record or more (re-attached ones by their old ids) */
                for (gm_shared_open_t **sp = &o->opens; *sp;) {
                        gm_shared_open_t *so = *sp;
                        if (so->session != s) {
                                sp = &so->next;
                                continue;
                        }
                        *sp = so->next;
                        o->mappers -= so->count;
                        s->shared_opens -= so->count;
                        free(so);
                        opened = true;
                }
                if (opened)
                        maybe_release(b, o);
        }
        gm_assert(s->shared_opens == 0);
}

void gm_shared_expire(gm_broker_t *b, uint64_t now_unix_ms) {
        bool window_over = gm_now_ms() >= b->orphans_deadline_ms; /* the re-attach window */
        for (gm_shared_t *o = b->shared, *next; o; o = next) {
                next = o->next;
                if (o->mappers_unknown && window_over) {
                        o->mappers_unknown = false; /* whoever did not re-attach does not map it */
                        maybe_release(b, o);
                        continue;
                }
                if (o->state == GM_SHARED_PUBLISHED && o->retention_s &&
                    now_unix_ms >= o->created_unix_ms + (uint64_t) o->retention_s * 1000) {
                        gm_host_log(b, LOG_NOTICE, "shared object '%s' version %" PRIu64 ": retention over, withdrawn",
                                    o->name, o->version);
                        withdraw(b, o);
                }
        }
}

void gm_shared_free_all(gm_broker_t *b) {
        while (b->shared)
                destroy(b, b->shared);
        free(b->ledger_shared);
        b->ledger_shared = NULL;
        b->n_ledger_shared = 0;
}

int gm_shared_adopt(gm_broker_t *b, const gm_ledger_shared_t *e, int fd) {
        if (!gm_shared_name_valid(e->name)) {
                close(fd);
                return -EINVAL;
        }
        gm_tenant_t *t = gm_tenant_get(b, e->tenant);
        char **readers = NULL;
        size_t n_readers = 0;
        void *meta = NULL;
        size_t meta_len = 0;
        int r = t ? gm_ledger_shared_load(b, e->store_id, &readers, &n_readers, &meta, &meta_len) : -ENOMEM;
        if (r < 0) {
                close(fd);
                return r;
        }
        gm_phys_t phys;
        r = b->backend->ops->adopt(b->backend, fd, e->size, &phys); /* consumes fd */
        gm_shared_t *o = r == 0 ? link_new(b) : NULL;
        if (!o) {
                if (r == 0) {
                        gm_backend_release(b->backend, &phys);
                        r = -ENOMEM;
                }
                for (size_t i = 0; i < n_readers; i++)
                        free(readers[i]);
                free(readers);
                free(meta);
                return r;
        }
        snprintf(o->name, sizeof(o->name), "%s", e->name);
        o->version = e->version;
        o->tenant = t;
        o->phys = phys;
        o->state = GM_SHARED_PUBLISHED;
        o->created_unix_ms = e->created_unix_ms;
        o->retention_s = e->retention_s;
        o->readers = readers;
        o->n_readers = n_readers;
        o->meta = meta;
        o->meta_len = meta_len;
        o->store_id = e->store_id;
        o->mappers_unknown = true; /* until the re-attach window ends */
        b->n_stored++;
        t->charged_bytes += phys.size;
        return 0;
}

void gm_shared_adopt_done(gm_broker_t *b) {
        for (size_t i = 0; i < b->n_ledger_shared; i++) {
                bool found = false;
                for (const gm_shared_t *o = b->shared; o && !found; o = o->next)
                        found = o->store_id == b->ledger_shared[i].store_id;
                if (!found) /* its memory did not come back: nothing to map */
                        gm_ledger_shared_forget(b, b->ledger_shared[i].store_id);
        }
        free(b->ledger_shared);
        b->ledger_shared = NULL;
        b->n_ledger_shared = 0;
}

void gm_shared_check(const gm_broker_t *b, gm_checker_t *c, uint64_t *backed, uint32_t *stored) {
        uint32_t n = 0;
        for (const gm_shared_t *o = b->shared; o; o = o->next) {
                n++;
                *backed += o->phys.size;
                if (o->store_id)
                        (*stored)++;
                uint32_t mappers = 0;
                for (const gm_shared_open_t *so = o->opens; so; so = so->next) {
                        mappers += so->count;
                        if (so->count == 0 || so->session->ended)
                                gm_check_violation(c, "shared object %" PRIu64 ": an open of an ended session", o->id);
                }
                if (mappers != o->mappers)
                        gm_check_violation(c, "shared object %" PRIu64 " counts %u mappers, its opens %u", o->id,
                                           o->mappers, mappers);
                if ((o->state == GM_SHARED_STAGING) != (o->stager != NULL) || (o->stager && o->stager->ended))
                        gm_check_violation(c, "shared object %" PRIu64 ": staging without a live session", o->id);
                if (o->state == GM_SHARED_WITHDRAWN && ((o->mappers == 0 && !o->mappers_unknown) || o->store_id))
                        gm_check_violation(c, "shared object %" PRIu64 ": withdrawn, yet kept", o->id);
                if ((o->state == GM_SHARED_PUBLISHED) != (o->version != 0) && o->state != GM_SHARED_WITHDRAWN)
                        gm_check_violation(c, "shared object %" PRIu64 ": version %" PRIu64 " while %s", o->id,
                                           o->version, gm_shared_state_name(o->state));
        }
        if (n != b->n_shared)
                gm_check_violation(c, "%u shared objects listed, %u counted", n, b->n_shared);
        for (const gm_session_t *s = b->sessions; s; s = s->next) {
                uint32_t opens = 0;
                for (const gm_shared_t *o = b->shared; o; o = o->next) {
                        opens += o->stager == s;
                        for (const gm_shared_open_t *so = o->opens; so; so = so->next)
                                opens += so->session == s ? so->count : 0;
                }
                if (opens != s->shared_opens)
                        gm_check_violation(c, "session %" PRIu64 " counts %u shared opens, the registry %u", s->id,
                                           s->shared_opens, opens);
        }
}
