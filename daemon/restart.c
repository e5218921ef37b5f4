/* Restarts that lose nothing.
 *
 * Clients' data never depends on this process: their mappings hold the
 * memory. What must survive is the ledger. Every piece of physical memory is
 * handed to systemd's fd store as "seg-<store id>" (short: every name of the
 * store comes back in one LISTEN_FDNAMES variable), and an append-only journal
 * next to the socket (<socket>.ledger) says whose each one is ("+ id token uid
 * segment offset size va_size", "- id"); it also keeps runtime quotas
 * ("q tenant bytes"). After a restart (crash or upgrade) the pieces come back
 * through LISTEN_FDS as orphans, and
 * each client that reconnects with its session token re-attaches: it reports
 * the segments and blocks it holds, the pieces it names are adopted, the heap
 * is rebuilt, and pointers, data and accounting carry on. Without systemd a
 * client's report alone re-registers its memory (accounted, with no handle
 * here: the client's mapping is the only reference). Orphans no client claims
 * within reattach_grace_ms are released. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "daemon.h"
#include "log.h"
#include "sd.h"

typedef struct gm_orphan {
        char token[GM_TOKEN_LEN + 1];
        uid_t uid;
        gm_piece_t *pieces;
        uint64_t bytes;
        struct gm_orphan *next;
} gm_orphan_t;

void gm_session_new_token(char token[GM_TOKEN_LEN + 1]) {
        uint8_t raw[GM_TOKEN_LEN / 2];
        size_t got = 0;
        while (got < sizeof(raw)) {
                ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);
                if (n > 0)
                        got += (size_t) n;
                else if (errno != EINTR)
                        abort(); /* no kernel randomness: nothing safe to hand out */
        }
        for (size_t i = 0; i < sizeof(raw); i++)
                snprintf(token + 2 * i, 3, "%02x", raw[i]);
}

typedef struct gm_ledger_entry {
        uint64_t store_id;
        char token[GM_TOKEN_LEN + 1];
        unsigned uid;
        uint64_t segment_id, offset, size, va_size;
} gm_ledger_entry_t;

static void store_name(uint64_t store_id, char *buf, size_t len) {
        snprintf(buf, len, "%s%010" PRIx64, GM_SD_SEGMENT_PREFIX, store_id);
}

/* One journal line; a short write (disk full) only weakens what a restart can
 * restore, so it is logged, not fatal. */
static void ledger_append(gm_daemon_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ledger_append(gm_daemon_t *d, const char *fmt, ...) {
        if (d->ledger_fd < 0)
                return;
        char line[256];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(line, sizeof(line), fmt, ap);
        va_end(ap);
        if (n <= 0 || (size_t) n >= sizeof(line) || write(d->ledger_fd, line, (size_t) n) != n)
                log_warning("Failed to write the ledger journal '%s', a restart may lose track of memory",
                            d->ledger_path);
}

void gm_ledger_runtime_quota(gm_daemon_t *d, const char *tenant, uint64_t bytes) {
        ledger_append(d, "q %s %" PRIu64 "\n", tenant, bytes);
}

void gm_piece_store(const gm_session_t *s, gm_piece_t *p) {
        gm_daemon_t *d = s->daemon;
        if (!gm_sd_notify_available() || p->phys.fd < 0 || d->ledger_fd < 0)
                return;
        if (d->n_stored >= GM_SD_FDSTORE_MAX) {
                log_debug("fd store full (%u): segment %" PRIu64 " of session %llu is kept by its client only",
                          d->n_stored, p->segment_id, (unsigned long long) s->id);
                return;
        }
        uint64_t id = ++d->next_store_id;
        char name[32]; /* "seg-" and 10 hex digits fit the store's limit until id 2^40 */
        store_name(id, name, sizeof(name));
        ledger_append(d, "+ %" PRIu64 " %s %u %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", id, s->token,
                      (unsigned) s->cred.uid, p->segment_id, p->offset, p->phys.size, p->segment_va_size);
        int r = gm_sd_fdstore_add(p->phys.fd, name);
        if (r < 0) {
                log_warning_errno(r, "Failed to keep segment '%s' in the fd store, it will not survive a restart",
                                  name);
                ledger_append(d, "- %" PRIu64 "\n", id);
                return;
        }
        p->store_id = id;
        d->n_stored++;
}

static void unstore(gm_daemon_t *d, gm_piece_t *p) {
        if (!p->store_id)
                return;
        char name[32]; /* "seg-" and 10 hex digits fit the store's limit until id 2^40 */
        store_name(p->store_id, name, sizeof(name));
        gm_sd_fdstore_remove(name);
        ledger_append(d, "- %" PRIu64 "\n", p->store_id);
        p->store_id = 0;
        d->n_stored--;
}

void gm_piece_unstore(const gm_session_t *s, gm_piece_t *p) {
        unstore(s->daemon, p);
}

static bool token_valid(const char *t) {
        if (!t || strlen(t) != GM_TOKEN_LEN)
                return false;
        for (size_t i = 0; i < GM_TOKEN_LEN; i++)
                if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f')))
                        return false;
        return true;
}

/* Reads the journal into d->ledger (the live "+" entries), applies runtime
 * quotas, and rewrites it compactly. */
int gm_ledger_open(gm_daemon_t *d) {
        snprintf(d->ledger_path, sizeof(d->ledger_path), "%s.ledger", d->opts.socket_path);
        FILE *f = fopen(d->ledger_path, "re");
        size_t cap = 0;
        char line[512];
        while (f && fgets(line, sizeof(line), f)) {
                gm_ledger_entry_t e = {0};
                char tenant[64];
                uint64_t v;
                if (sscanf(line, "+ %" SCNu64 " %32s %u %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64, &e.store_id,
                           e.token, &e.uid, &e.segment_id, &e.offset, &e.size, &e.va_size) == 7) {
                        if (d->n_ledger == cap) {
                                cap = cap ? 2 * cap : 64;
                                gm_ledger_entry_t *n = realloc(d->ledger, cap * sizeof(*n));
                                if (!n)
                                        break;
                                d->ledger = n;
                        }
                        d->ledger[d->n_ledger++] = e;
                        if (e.store_id > d->next_store_id)
                                d->next_store_id = e.store_id;
                } else if (sscanf(line, "- %" SCNu64, &v) == 1) {
                        for (size_t i = 0; i < d->n_ledger; i++)
                                if (d->ledger[i].store_id == v) {
                                        d->ledger[i] = d->ledger[--d->n_ledger];
                                        break;
                                }
                } else if (sscanf(line, "q %63s %" SCNu64, tenant, &v) == 2) {
                        gm_tenant_t *t = gm_tenant_get(d, tenant);
                        if (t)
                                gm_tenant_set_quota(t, GM_QUOTA_RUNTIME, v != 0, v);
                } /* anything else (a torn last line after a crash) is skipped */
        }
        if (f)
                fclose(f);
        /* Compact: what is live now, written to a new file that replaces the old. */
        char tmp[sizeof(d->ledger_path) + 8];
        snprintf(tmp, sizeof(tmp), "%s.new", d->ledger_path);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        d->ledger_fd = fd;
        for (const gm_tenant_t *t = d->tenants; t; t = t->next)
                if (t->quota_set[GM_QUOTA_RUNTIME])
                        gm_ledger_runtime_quota(d, t->name, t->quota_by_source[GM_QUOTA_RUNTIME]);
        for (size_t i = 0; i < d->n_ledger; i++) {
                const gm_ledger_entry_t *e = &d->ledger[i];
                ledger_append(d, "+ %" PRIu64 " %s %u %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", e->store_id,
                              e->token, e->uid, e->segment_id, e->offset, e->size, e->va_size);
        }
        close(fd);
        d->ledger_fd = -1;
        if (rename(tmp, d->ledger_path) < 0) {
                int r = -errno;
                unlink(tmp);
                return r;
        }
        d->ledger_fd = open(d->ledger_path, O_WRONLY | O_APPEND | O_CLOEXEC);
        return d->ledger_fd < 0 ? -errno : 0;
}

void gm_ledger_close(gm_daemon_t *d) {
        if (d->ledger_fd >= 0)
                close(d->ledger_fd);
        d->ledger_fd = -1;
        free(d->ledger);
        d->ledger = NULL;
        d->n_ledger = 0;
}

static const gm_ledger_entry_t *ledger_find(const gm_daemon_t *d, const char *name) {
        uint64_t id;
        int end = 0;
        size_t prefix = strlen(GM_SD_SEGMENT_PREFIX);
        if (strncmp(name, GM_SD_SEGMENT_PREFIX, prefix) != 0 ||
            sscanf(name + prefix, "%" SCNx64 "%n", &id, &end) != 1 || name[prefix + (size_t) end] != '\0')
                return NULL;
        for (size_t i = 0; i < d->n_ledger; i++)
                if (d->ledger[i].store_id == id)
                        return &d->ledger[i];
        return NULL;
}

static gm_orphan_t *orphan_find(gm_daemon_t *d, const char *token) {
        for (gm_orphan_t *o = d->orphans; o; o = o->next)
                if (strcmp(o->token, token) == 0)
                        return o;
        return NULL;
}

void gm_restart_adopt(gm_daemon_t *d, gm_sd_named_fd_t *segments, size_t n) {
        uint64_t adopted = 0, bytes = 0;
        for (size_t i = 0; i < n; i++) {
                gm_sd_named_fd_t *nf = &segments[i];
                const gm_ledger_entry_t *e = ledger_find(d, nf->name);
                if (!e || e->size == 0 || e->offset + e->size > e->va_size) {
                        log_warning("Dropping fd '%s' from the fd store: the ledger does not know it", nf->name);
                        gm_sd_fdstore_remove(nf->name);
                        continue; /* closed by gm_sd_fds_done() */
                }
                gm_orphan_t *o = orphan_find(d, e->token);
                if (!o && (o = calloc(1, sizeof(*o)))) {
                        snprintf(o->token, sizeof(o->token), "%s", e->token);
                        o->uid = (uid_t) e->uid;
                        o->next = d->orphans;
                        d->orphans = o;
                }
                gm_piece_t *p = o ? calloc(1, sizeof(*p)) : NULL;
                int r = p ? d->backend->ops->adopt(d->backend, nf->fd, e->size, &p->phys) : -ENOMEM;
                if (!p)
                        close(nf->fd);
                nf->fd = -1; /* consumed */
                if (r < 0) {
                        log_warning("Cannot adopt stored segment '%s': %s, dropping it", nf->name, strerror(-r));
                        free(p);
                        gm_sd_fdstore_remove(nf->name);
                        ledger_append(d, "- %" PRIu64 "\n", e->store_id);
                        continue;
                }
                p->segment_id = e->segment_id;
                p->offset = e->offset;
                p->segment_va_size = e->va_size;
                p->store_id = e->store_id;
                d->n_stored++;
                p->next = o->pieces;
                o->pieces = p;
                o->bytes += p->phys.size;
                adopted++;
                bytes += p->phys.size;
        }
        /* Journal entries whose fd did not come back are gone. */
        for (size_t i = 0; i < d->n_ledger; i++) {
                bool found = false;
                for (gm_orphan_t *o = d->orphans; o && !found; o = o->next)
                        for (gm_piece_t *p = o->pieces; p && !found; p = p->next)
                                found = p->store_id == d->ledger[i].store_id;
                if (!found)
                        ledger_append(d, "- %" PRIu64 "\n", d->ledger[i].store_id);
        }
        free(d->ledger);
        d->ledger = NULL;
        d->n_ledger = 0;
        d->orphans_deadline_ms = gm_now_ms() + d->opts.limits.reattach_grace_ms;
        if (adopted)
                log_notice("adopted %" PRIu64 " stored segments (%" PRIu64 " bytes) of the previous daemon; their "
                           "clients have %u ms to re-attach",
                           adopted, bytes, d->opts.limits.reattach_grace_ms);
}

/* Releases one adopted piece nobody claimed. */
static void piece_drop(gm_daemon_t *d, gm_piece_t *p) {
        unstore(d, p);
        gm_backend_release(d->backend, &p->phys);
        free(p);
}

void gm_restart_expire(gm_daemon_t *d, bool all) {
        if (!d->orphans || (!all && gm_now_ms() < d->orphans_deadline_ms))
                return;
        while (d->orphans) {
                gm_orphan_t *o = d->orphans;
                d->orphans = o->next;
                if (!all)
                        log_notice("no client re-attached session %.8s... in time: releasing %" PRIu64 " bytes",
                                   o->token, o->bytes);
                while (o->pieces) {
                        gm_piece_t *p = o->pieces;
                        o->pieces = p->next;
                        if (all && d->keep_stored) {
                                /* Stopping under systemd: the store keeps them for the next daemon. */
                                gm_backend_release(d->backend, &p->phys);
                                free(p);
                        } else {
                                piece_drop(d, p);
                        }
                }
                free(o);
        }
}

int gm_restart_claim(gm_session_t *s, const char *token) {
        gm_daemon_t *d = s->daemon;
        if (!token_valid(token))
                return -EINVAL;
        for (gm_session_t *o = d->sessions; o; o = o->next)
                if (o != s && !o->closing && strcmp(o->token, token) == 0)
                        return -EBUSY;
        gm_orphan_t **op = &d->orphans;
        while (*op && strcmp((*op)->token, token) != 0)
                op = &(*op)->next;
        if (*op) {
                gm_orphan_t *o = *op;
                if (o->uid != s->cred.uid)
                        return -EPERM;
                *op = o->next;
                s->adopting = o->pieces;
                free(o);
        }
        snprintf(s->token, sizeof(s->token), "%s", token);
        s->reattaching = true;
        s->reattach_items = 0;
        return 0;
}

/* The piece behind one mapped range a client reports: the adopted one with
 * the same coordinates, or (no fd store) an accounted piece with no handle. */
static gm_piece_t *claim_piece(gm_session_t *s, uint64_t segment_id, uint64_t va_size, uint64_t offset,
                               uint64_t length) {
        for (gm_piece_t **pp = &s->adopting; *pp; pp = &(*pp)->next) {
                gm_piece_t *p = *pp;
                if (p->segment_id == segment_id && p->offset == offset && p->phys.size == length &&
                    p->segment_va_size == va_size) {
                        *pp = p->next;
                        p->next = NULL;
                        return p;
                }
        }
        /* Memory nobody can vouch for is believed only while it fits the device. */
        gm_backend_t *b = s->daemon->backend;
        if (length > b->capacity || b->in_use > b->capacity - length)
                return NULL;
        gm_piece_t *p = calloc(1, sizeof(*p));
        if (!p)
                return NULL;
        p->segment_id = segment_id;
        p->segment_va_size = va_size;
        p->offset = offset;
        p->phys = (gm_phys_t){.fd = -1, .size = length, .handle = 0};
        s->daemon->backend->in_use += length; /* the client's mapping holds it */
        return p;
}

/* Puts a claimed piece back where it came from after a refused claim. */
static void unclaim_piece(gm_session_t *s, gm_piece_t *p) {
        if (p->phys.fd < 0) {
                s->daemon->backend->in_use -= p->phys.size;
                free(p);
                return;
        }
        p->next = s->adopting;
        s->adopting = p;
}

static int reattach_segment(gm_session_t *s, gm_heap_t *heap, const Gpumem__ReattachSegment *seg) {
        enum { MAX_PIECES = 1 << 16 };
        if (seg->n_mapped == 0 || seg->n_mapped > MAX_PIECES)
                return -EINVAL;
        gm_restore_piece_t *rp = calloc(seg->n_mapped, sizeof(*rp));
        gm_piece_t **claimed = calloc(seg->n_mapped, sizeof(*claimed));
        int r = rp && claimed ? 0 : -ENOMEM;
        for (size_t i = 0; i < seg->n_mapped && r == 0; i++) {
                const Gpumem__Range *m = seg->mapped[i];
                if (m->length == 0 || m->offset + m->length < m->offset || m->offset + m->length > seg->va_size) {
                        r = -EINVAL;
                        break;
                }
                claimed[i] = claim_piece(s, seg->segment_id, seg->va_size, m->offset, m->length);
                if (!claimed[i]) {
                        r = -ENOMEM;
                        break;
                }
                claimed[i]->client_mapped = true;
                rp[i] = (gm_restore_piece_t){
                        .offset = m->offset, .size = m->length, .handle = (uint64_t) (uintptr_t) claimed[i]};
        }
        if (r == 0)
                r = gm_heap_restore_segment(heap, seg->segment_id, seg->va_size, seg->stream, rp, seg->n_mapped);
        for (size_t i = 0; i < seg->n_mapped; i++) {
                if (!claimed || !claimed[i])
                        continue;
                if (r < 0)
                        unclaim_piece(s, claimed[i]);
                else
                        s->tenant->charged_bytes += claimed[i]->phys.size;
        }
        free(rp);
        free(claimed);
        return r;
}

int gm_restart_reattach(gm_session_t *s, uint64_t request_id, const Gpumem__Reattach *req) {
        gm_daemon_t *d = s->daemon;
        if (!s->reattaching) {
                gm_session_send_error(s, request_id, EPROTO, "gpumemd: Reattach without a resuming Hello");
                return -EPROTO;
        }
        s->reattach_items += req->n_segments + req->n_blocks;
        if (s->reattach_items > d->opts.limits.max_reattach_items) {
                gm_session_send_error(s, request_id, E2BIG, "gpumemd: re-attach reports too much");
                return -E2BIG;
        }
        gm_heap_t *heap = NULL;
        int r = s->local ? (req->n_blocks ? -EINVAL : 0) : gm_session_heap(s, &heap);
        for (size_t i = 0; i < req->n_segments && r == 0 && s->local; i++) /* its heap stayed in the client */
                for (size_t k = 0; k < req->segments[i]->n_mapped && r == 0; k++) {
                        const Gpumem__ReattachSegment *seg = req->segments[i];
                        const Gpumem__Range *m = seg->mapped[k];
                        gm_piece_t *p = m->length && m->offset + m->length >= m->offset &&
                                                        m->offset + m->length <= seg->va_size
                                                ? claim_piece(s, seg->segment_id, seg->va_size, m->offset, m->length)
                                                : NULL;
                        r = p ? gm_local_adopt(s, p) : -EINVAL;
                        if (r < 0 && p)
                                unclaim_piece(s, p);
                }
        for (size_t i = 0; i < req->n_segments && r == 0 && !s->local; i++)
                r = reattach_segment(s, heap, req->segments[i]);
        for (size_t i = 0; i < req->n_blocks && r == 0; i++) {
                const Gpumem__ReattachBlock *b = req->blocks[i];
                r = gm_heap_restore_block(heap, b->block_id, b->segment_id, b->offset, b->size, b->requested_size,
                                          b->pending_free);
        }
        if (r == 0 && req->last && heap)
                r = gm_heap_restore_finish(heap);
        if (r < 0) {
                /* A report that contradicts itself ends the session; its memory
                 * is released (the client starts over). */
                gm_session_send_error(s, request_id, -r, "gpumemd: re-attach refused: %s", strerror(-r));
                return r;
        }
        if (!req->last)
                return 0;
        s->reattaching = false;
        uint64_t dropped = 0;
        while (s->adopting) { /* stored pieces the client does not hold (e.g. a reply it never got) */
                gm_piece_t *p = s->adopting;
                s->adopting = p->next;
                dropped += p->phys.size;
                piece_drop(d, p);
        }
        const gm_stats_t *st = gm_session_stats(s);
        if (!st)
                return gm_session_reply_ok(s, request_id);
        log_notice("session %llu (pid %d) re-attached: %" PRId64 " bytes reserved, %" PRId64 " allocated in %" PRId64
                   " blocks%s",
                   (unsigned long long) s->id, (int) s->cred.pid, st->reserved_bytes[GM_STAT_ALL].current,
                   st->allocated_bytes[GM_STAT_ALL].current, st->active[GM_STAT_ALL].current,
                   dropped ? "; unclaimed stored memory released" : "");
        return gm_session_reply_ok(s, request_id);
}
