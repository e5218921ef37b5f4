/* Orphans: the pieces a previous daemon stored, adopted from the fd store
 * after a restart and waiting for their sessions' clients; a resuming start
 * claims them (ADOPTING), the re-attach grace ends the unclaimed ones. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "piece.h"

static gm_orphan_t *orphan_find(gm_broker_t *b, const char *token) {
        for (gm_orphan_t *o = b->orphans; o; o = o->next)
                if (strcmp(o->token, token) == 0)
                        return o;
        return NULL;
}

void gm_orphan_adopt(gm_broker_t *b, const char *name, int fd) {
        const gm_ledger_shared_t *se = gm_ledger_shared_find(b, name);
        if (se) { /* a shared object's: the registry's again, not an orphan */
                int r = gm_shared_adopt(b, se, fd);
                if (r < 0) {
                        gm_host_log(b, LOG_WARNING, "Cannot adopt stored shared object '%s': %s, dropping it", se->name,
                                    strerror(-r));
                        if (b->ops.store_remove)
                                b->ops.store_remove(b->ops.userdata, name);
                }
                return;
        }
        const gm_ledger_entry_t *e = gm_ledger_find(b, name);
        if (!e || e->size == 0 || e->offset + e->size > e->va_size) {
                gm_host_log(b, LOG_WARNING, "Dropping fd '%s' from the fd store: the ledger does not know it", name);
                if (b->ops.store_remove)
                        b->ops.store_remove(b->ops.userdata, name);
                close(fd);
                return;
        }
        gm_orphan_t *o = orphan_find(b, e->token);
        if (!o && (o = calloc(1, sizeof(*o)))) {
                snprintf(o->token, sizeof(o->token), "%s", e->token);
                o->uid = (uid_t) e->uid;
                o->next = b->orphans;
                b->orphans = o;
        }
        gm_piece_t *p = NULL;
        int r = -ENOMEM;
        if (o)
                r = gm_piece_adopt(b, fd, e, &p);
        else
                close(fd);
        if (r < 0) {
                gm_host_log(b, LOG_WARNING, "Cannot adopt stored segment '%s': %s, dropping it", name, strerror(-r));
                if (b->ops.store_remove)
                        b->ops.store_remove(b->ops.userdata, name);
                gm_ledger_forget(b, e->store_id);
                return;
        }
        if (p->tag && gm_session_tags_name(&o->tags, p->tag, e->tag_name) < 0)
                p->tag = 0; /* the journal gives the id two names: the default pool */
        p->orphan = o;
        p->next = o->pieces;
        o->pieces = p;
        o->bytes += p->phys.size;
}

void gm_orphan_adopt_done(gm_broker_t *b, uint64_t now_ms) {
        gm_shared_adopt_done(b);
        uint64_t adopted = 0, bytes = 0;
        for (gm_orphan_t *o = b->orphans; o; o = o->next)
                for (gm_piece_t *p = o->pieces; p; p = p->next) {
                        adopted++;
                        bytes += p->phys.size;
                }
        /* Journal entries whose fd did not come back (or was never stored) are
         * records: their clients' mappings are all that holds that memory. */
        size_t n_records = 0;
        for (size_t i = 0; i < b->n_ledger; i++) {
                bool found = false;
                for (gm_orphan_t *o = b->orphans; o && !found; o = o->next)
                        for (gm_piece_t *p = o->pieces; p && !found; p = p->next)
                                found = p->store_id == b->ledger[i].store_id;
                if (!found)
                        b->ledger[n_records++] = b->ledger[i];
        }
        free(b->records);
        b->records = n_records ? b->ledger : NULL;
        b->n_records = n_records;
        if (!n_records)
                free(b->ledger);
        b->ledger = NULL;
        b->n_ledger = 0;
        b->orphans_deadline_ms = now_ms + b->limits.reattach_grace_ms;
        if (adopted)
                gm_host_log(b, LOG_NOTICE,
                            "adopted %" PRIu64 " stored segments (%" PRIu64 " bytes) of the previous daemon; their "
                            "clients have %u ms to re-attach",
                            adopted, bytes, b->limits.reattach_grace_ms);
}

static void orphan_free(gm_broker_t *b, gm_orphan_t *o) {
        while (o->pieces) {
                gm_piece_t *p = o->pieces;
                o->pieces = p->next;
                p->next = NULL;
                gm_piece_destroy(b, p);
        }
        free(o);
}

void gm_orphan_free_all(gm_broker_t *b) {
        while (b->orphans) {
                gm_orphan_t *o = b->orphans;
                b->orphans = o->next;
                orphan_free(b, o);
        }
}

void gm_orphan_expire(gm_broker_t *b, uint64_t now_ms, bool all) {
        if ((!b->orphans && !b->n_known_tokens && !b->n_records) || (!all && now_ms < b->orphans_deadline_ms))
                return;
        gm_ledger_forget_sessions(b, !all);
        while (b->orphans) {
                gm_orphan_t *o = b->orphans;
                b->orphans = o->next;
                if (!all)
                        gm_host_log(b, LOG_NOTICE,
                                    "no client re-attached session %.8s... in time: releasing %" PRIu64 " bytes",
                                    o->token, o->bytes);
                orphan_free(b, o);
        }
}

/* A resuming start: the orphan with that token becomes s's adopting pieces. */
int gm_orphan_claim(gm_session_t *s, const char *token) {
        gm_broker_t *b = s->broker;
        if (!gm_ledger_token_valid(token))
                return -EINVAL;
        for (gm_session_t *o = b->sessions; o; o = o->next)
                if (o != s && !o->ended && strcmp(o->token, token) == 0)
                        return -EBUSY;
        gm_orphan_t **op = &b->orphans;
        while (*op && strcmp((*op)->token, token) != 0)
                op = &(*op)->next;
        /* Only what the previous daemon journaled, by the same uid: a made-up
         * token (or another user's) claims nothing. */
        gm_known_token_t *known = gm_ledger_known_token_find(b, token);
        if (!*op && !known)
                return -ENOENT;
        if (known && known->uid != s->uid)
                return -EPERM;
        if (known)
                gm_ledger_known_token_remove(b, known);
        if (*op) {
                gm_orphan_t *o = *op;
                if (o->uid != s->uid)
                        return -EPERM;
                *op = o->next;
                while (o->pieces) {
                        gm_piece_t *p = o->pieces;
                        o->pieces = p->next;
                        p->orphan = NULL;
                        if (p->tag && gm_session_tags_name(&s->tags, p->tag, o->tags.names[p->tag]) < 0)
                                p->tag = 0;
                        gm_piece_attach(s, p, GM_PIECE_ADOPTING);
                        p->queue = s->adopting;
                        s->adopting = p;
                }
                free(o);
        }
        snprintf(s->token, sizeof(s->token), "%s", token);
        s->reattaching = true;
        s->reattach_items = 0;
        return 0;
}
