/* Restarts that lose nothing.
 *
 * Clients' data never depends on this process: their mappings hold the
 * memory. What must survive is the ledger. Every piece of physical memory is
 * handed to the host's fd store (systemd's, through ops->store_add) as
 * "seg-<store id>" (short: every name of the store comes back in one
 * LISTEN_FDNAMES variable), and an append-only journal (<socket>.ledger) says
 * whose each one is ("+ id token uid segment offset size va_size [pool]
 * [tID:NAME]", "- id"; the pool, "small" or "large", of a page of a central
 * heap's expandable segment: with page reuse both pools have 2 MiB pages, so
 * only the journal tells; the tagged pool, its session's id and name of it,
 * of a piece outside the default pool); it also keeps runtime quotas ("q tenant bytes"). After
 * a restart (crash or upgrade) the pieces come back as orphans, and each
 * client that reconnects with its session token re-attaches: it reports the
 * segments and blocks it holds, the pieces it names are adopted, the heap is
 * rebuilt (each segment in the pool its records name), and pointers, data
 * and accounting carry on. The client reports no pool: only a session the
 * journal names can re-attach, so the journal always has the say. A piece with no handle in the store (no
 * store, a full one) is journaled all the same: after a restart that record
 * is what the client's report must match, piece by piece, to re-register the
 * memory (accounted, with no handle here: the client's mapping is the only
 * reference); a segment the journal does not give that session is refused.
 * Orphans and records no client claims within reattach_grace_ms are released. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "books.h"
#include "text.h"

void gm_ledger_token_new(char token[GM_TOKEN_LEN + 1]) {
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

bool gm_ledger_token_valid(const char *t) {
        if (!t || strlen(t) != GM_TOKEN_LEN)
                return false;
        for (size_t i = 0; i < GM_TOKEN_LEN; i++)
                if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f')))
                        return false;
        return true;
}

/* Whether a "+" line names a piece a daemon could have journaled: an id
 * (0 means "none" in a piece), a session token, and a non-empty range inside
 * its segment. */
static bool entry_valid(const gm_ledger_entry_t *e) {
        return e->store_id != 0 && gm_ledger_token_valid(e->token) && e->size != 0 && e->offset + e->size > e->offset &&
               e->offset + e->size <= e->va_size;
}

/* The store id in a stored fd's name (GM_STORE_PREFIX + hex digits). */
static bool store_id_of(const char *name, uint64_t *ret_id) {
        int end = 0;
        size_t prefix = strlen(GM_STORE_PREFIX);
        return strncmp(name, GM_STORE_PREFIX, prefix) == 0 &&
               sscanf(name + prefix, "%" SCNx64 "%n", ret_id, &end) == 1 && name[prefix + (size_t) end] == '\0';
}

static void store_name(uint64_t store_id, char *buf, size_t len) {
        snprintf(buf, len, "%s%010" PRIx64, GM_STORE_PREFIX, store_id);
}

/* One journal line; a short write (disk full) only weakens what a restart can
 * restore, so it is logged, not fatal. */
static void ledger_append(gm_broker_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ledger_append(gm_broker_t *b, const char *fmt, ...) {
        if (b->ledger_fd < 0)
                return;
        char line[256];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(line, sizeof(line), fmt, ap);
        va_end(ap);
        if (n <= 0 || (size_t) n >= sizeof(line) || write(b->ledger_fd, line, (size_t) n) != n)
                gm_host_log(b, LOG_WARNING,
                            "Failed to write the ledger journal '%s', a restart may lose track of memory",
                            b->ledger_path);
        else
                b->ledger_lines++;
}

static const char *const POOL_NAMES[] = {[GM_POOL_SMALL] = "small", [GM_POOL_LARGE] = "large"};

static void append_piece(gm_broker_t *b, const gm_ledger_entry_t *e) {
        bool pool = e->pool == GM_POOL_SMALL || e->pool == GM_POOL_LARGE;
        char tag[48] = "";
        if (e->tag)
                snprintf(tag, sizeof(tag), " t%u:%s", e->tag, e->tag_name);
        ledger_append(b, "+ %" PRIu64 " %s %u %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "%s%s%s\n", e->store_id,
                      e->token, e->uid, e->segment_id, e->offset, e->size, e->va_size, pool ? " " : "",
                      pool ? POOL_NAMES[e->pool] : "", tag);
}

/* The " tID:NAME" at the end of a "+" line (newline included): a tag id
 * 1 .. GM_SESSION_MAX_TAGS and a valid name. */
static bool parse_tag(const char *rest, gm_ledger_entry_t *e) {
        int end = 0;
        if (sscanf(rest, " t%u:%31[A-Za-z0-9_.-]%n", &e->tag, e->tag_name, &end) != 2 || end == 0 ||
            strcmp(rest + end, "\n") != 0)
                return false;
        return e->tag >= 1 && e->tag <= GM_SESSION_MAX_TAGS && gm_text_tag_valid(e->tag_name, false);
}

/* A "+" line as append_piece() writes it, newline included (a torn last
 * line is no record), with or without the pool and the tag (older daemons
 * wrote neither). */
static bool parse_piece(const char *line, gm_ledger_entry_t *e) {
        int end = 0;
        if (sscanf(line, "+ %" SCNu64 " %32s %u %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 "%n", &e->store_id,
                   e->token, &e->uid, &e->segment_id, &e->offset, &e->size, &e->va_size, &end) != 7 ||
            end == 0)
                return false;
        const char *rest = line + end;
        e->pool = GM_POOL_UNKNOWN;
        e->tag = 0;
        e->tag_name[0] = '\0';
        for (int pool = GM_POOL_SMALL; pool <= GM_POOL_LARGE; pool++) {
                size_t len = strlen(POOL_NAMES[pool]);
                if (rest[0] == ' ' && strncmp(rest + 1, POOL_NAMES[pool], len) == 0 &&
                    (rest[1 + len] == '\n' || rest[1 + len] == ' ')) {
                        e->pool = (gm_piece_pool_t) pool;
                        rest += 1 + len;
                        break;
                }
        }
        return strcmp(rest, "\n") == 0 || parse_tag(rest, e);
}

/* The pool of p's segment where the session's central heap is the only
 * one to know it: a page of an expandable segment. An ordinary segment's
 * size tells its pool, and a local session's pools are its client's heap's,
 * which outlives the daemon. */
static gm_piece_pool_t heap_pool(const gm_session_t *s, const gm_piece_t *p) {
        bool small;
        if (!s || !s->heap || (p->offset == 0 && p->phys.size == p->segment_va_size) ||
            gm_heap_segment_pool(s->heap, p->segment_id, &small) < 0)
                return GM_POOL_UNKNOWN;
        return small ? GM_POOL_SMALL : GM_POOL_LARGE;
}

/* p's journal entry (id: its store or record id), owned by `token`/`uid`. */
gm_ledger_entry_t gm_ledger_piece_entry(const gm_piece_t *p, uint64_t id, const char *token, uid_t uid) {
        gm_ledger_entry_t e = {
                .store_id = id,
                .uid = (unsigned) uid,
                .segment_id = p->segment_id,
                .offset = p->offset,
                .size = p->phys.size,
                .va_size = p->segment_va_size,
                .pool = p->pool,
        };
        snprintf(e.token, sizeof(e.token), "%s", token);
        /* The pool's name: its session's, or while an orphan its journal's. */
        const gm_session_tags_t *tags = p->session ? &p->session->tags : p->orphan ? &p->orphan->tags : NULL;
        if (p->tag && tags && tags->names[p->tag][0]) {
                e.tag = p->tag;
                snprintf(e.tag_name, sizeof(e.tag_name), "%s", tags->names[p->tag]);
        }
        return e;
}

void gm_ledger_runtime_quota(gm_broker_t *b, const char *tenant, uint64_t bytes) {
        ledger_append(b, "q %s %" PRIu64 "\n", tenant, bytes);
}

#define LEDGER_SLACK_LINES 256

static void append_shared(gm_broker_t *b, const gm_ledger_shared_t *e) {
        ledger_append(b, "o %" PRIu64 " %" PRIu64 " %" PRIu64 " %u %" PRIu64 " %s %s\n", e->store_id, e->version,
                      e->size, e->retention_s, e->created_unix_ms, e->tenant, e->name);
}

static gm_ledger_shared_t shared_entry(const gm_shared_t *o) {
        gm_ledger_shared_t e = {
                .store_id = o->store_id,
                .version = o->version,
                .size = o->phys.size,
                .created_unix_ms = o->created_unix_ms,
                .retention_s = o->retention_s,
        };
        snprintf(e.name, sizeof(e.name), "%s", o->name);
        snprintf(e.tenant, sizeof(e.tenant), "%s", o->tenant->name);
        return e;
}

/* Journals every live piece of `pieces` (linked by ->next) with its owner's
 * token and uid. */
static void append_live(gm_broker_t *b, const gm_piece_t *pieces, const char *token, uid_t uid) {
        for (const gm_piece_t *p = pieces; p; p = p->next)
                if (p->store_id || p->record_id) {
                        gm_ledger_entry_t e =
                                gm_ledger_piece_entry(p, p->store_id ? p->store_id : p->record_id, token, uid);
                        append_piece(b, &e);
                }
}

/* Writes what is live now (runtime quotas, then the entries read at open, or
 * once adoption is done the stored pieces of sessions and orphans) to a new
 * file that replaces the journal. On failure the old journal stays in use. */
static int ledger_rewrite(gm_broker_t *b) {
        char tmp[sizeof(b->ledger_path) + 8];
        snprintf(tmp, sizeof(tmp), "%s.new", b->ledger_path);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        int old_fd = b->ledger_fd;
        b->ledger_fd = fd;
        b->ledger_lines = 0;
        for (const gm_tenant_t *t = b->tenants; t; t = t->next)
                if (t->quota_set[GM_QUOTA_RUNTIME])
                        gm_ledger_runtime_quota(b, t->name, t->quota_by_source[GM_QUOTA_RUNTIME]);
        for (size_t i = 0; i < b->n_known_tokens; i++)
                ledger_append(b, "t %s %u\n", b->known_tokens[i].token, (unsigned) b->known_tokens[i].uid);
        for (size_t i = 0; i < b->n_ledger; i++)
                append_piece(b, &b->ledger[i]);
        for (size_t i = 0; i < b->n_records; i++)
                append_piece(b, &b->records[i]);
        for (const gm_session_t *s = b->sessions; s; s = s->next) {
                if (s->token[0] && s->tenant && !s->ended)
                        ledger_append(b, "t %s %u\n", s->token, (unsigned) s->uid);
                append_live(b, s->pieces, s->token, s->uid);
        }
        for (const gm_orphan_t *o = b->orphans; o; o = o->next)
                append_live(b, o->pieces, o->token, o->uid);
        for (size_t i = 0; i < b->n_ledger_shared; i++)
                append_shared(b, &b->ledger_shared[i]);
        for (const gm_shared_t *o = b->shared; o; o = o->next)
                if (o->store_id) {
                        gm_ledger_shared_t e = shared_entry(o);
                        append_shared(b, &e);
                }
        int r = fsync(fd) < 0 ? -errno : 0;
        close(fd);
        b->ledger_fd = old_fd;
        if (r == 0 && rename(tmp, b->ledger_path) < 0)
                r = -errno;
        if (r < 0) {
                unlink(tmp);
                return r;
        }
        fd = open(b->ledger_path, O_WRONLY | O_APPEND | O_CLOEXEC);
        if (old_fd >= 0)
                close(old_fd);
        b->ledger_fd = fd;
        return fd < 0 ? -errno : 0;
}

/* After a journal line that makes an earlier one dead: when dead lines make
 * the journal more than twice what is live (plus some slack), it is
 * rewritten once adoption is done, so a churning client cannot grow it
 * without bound (amortised: a rewrite per LEDGER_SLACK_LINES lines at least). */
static void ledger_maybe_compact(gm_broker_t *b) {
        uint64_t live = b->n_stored + b->n_recorded + b->n_records + b->n_tenants + b->n_sessions + b->n_known_tokens +
                        b->n_ledger_shared;
        if (b->ledger_fd >= 0 && !b->ledger && b->ledger_lines > 2 * live + LEDGER_SLACK_LINES) {
                int r = ledger_rewrite(b);
                if (r < 0)
                        gm_host_log(b, LOG_WARNING, "Failed to compact the ledger journal '%s': %s", b->ledger_path,
                                    strerror(-r));
        }
}

/* A stored piece is gone. */
void gm_ledger_forget(gm_broker_t *b, uint64_t store_id) {
        ledger_append(b, "- %" PRIu64 "\n", store_id);
        ledger_maybe_compact(b);
}

gm_known_token_t *gm_ledger_known_token_find(gm_broker_t *b, const char *token) {
        for (size_t i = 0; i < b->n_known_tokens; i++)
                if (strcmp(b->known_tokens[i].token, token) == 0)
                        return &b->known_tokens[i];
        return NULL;
}

void gm_ledger_known_token_remove(gm_broker_t *b, gm_known_token_t *k) {
        *k = b->known_tokens[--b->n_known_tokens];
}

void gm_ledger_session_started(gm_broker_t *b, const gm_session_t *s) {
        ledger_append(b, "t %s %u\n", s->token, (unsigned) s->uid);
}

void gm_ledger_session_ended(gm_broker_t *b, const gm_session_t *s) {
        if (b->stopping || !s->token[0] || !s->tenant)
                return;
        ledger_append(b, "e %s\n", s->token);
        ledger_maybe_compact(b);
}

void gm_ledger_store(gm_broker_t *b, const gm_session_t *s, gm_piece_t *p) {
        if (p->phys.fd < 0 || b->ledger_fd < 0)
                return;
        p->pool = heap_pool(s, p);
        gm_ledger_entry_t e = gm_ledger_piece_entry(p, ++b->next_store_id, s->token, s->uid);
        append_piece(b, &e);
        bool store = b->ops.store_add && b->store_max;
        if (store && b->n_stored >= b->store_max) {
                gm_host_log(b, LOG_DEBUG,
                            "fd store full (%u): segment %" PRIu64 " of session %" PRIu64 " is kept by its client only",
                            b->n_stored, p->segment_id, s->id);
                store = false;
        }
        if (store) {
                char name[GM_STORE_NAME_MAX];
                store_name(e.store_id, name, sizeof(name));
                int r = b->ops.store_add(b->ops.userdata, p->phys.fd, name);
                if (r == 0) {
                        p->store_id = e.store_id;
                        b->n_stored++;
                        return;
                }
                gm_host_log(b, LOG_WARNING,
                            "Failed to keep segment '%s' in the fd store, only its client keeps it over a restart: %s",
                            name, strerror(-r));
        }
        /* Journaled only: what the client may claim back after a restart. */
        p->record_id = e.store_id;
        b->n_recorded++;
}

void gm_ledger_unstore(gm_broker_t *b, gm_piece_t *p) {
        if (p->record_id) {
                uint64_t record_id = p->record_id;
                p->record_id = 0;
                gm_assert(b->n_recorded > 0);
                b->n_recorded--;
                if (!b->stopping) /* else its client may claim it from the next daemon */
                        gm_ledger_forget(b, record_id);
        }
        if (!p->store_id)
                return;
        uint64_t store_id = p->store_id;
        char name[GM_STORE_NAME_MAX];
        store_name(p->store_id, name, sizeof(name));
        if (b->ops.store_remove)
                b->ops.store_remove(b->ops.userdata, name);
        p->store_id = 0;
        gm_assert(b->n_stored > 0);
        b->n_stored--;
        gm_ledger_forget(b, store_id);
}

void gm_ledger_moved(gm_broker_t *b, gm_piece_t *p) {
        uint64_t id = p->store_id ? p->store_id : p->record_id; /* a record is claimed by its place too */
        if (!id || !p->session)
                return;
        p->pool = heap_pool(p->session, p); /* the pool of the segment it moved to */
        gm_ledger_entry_t e = gm_ledger_piece_entry(p, id, p->session->token, p->session->uid);
        /* The new entry first: a reader's "-" drops the oldest entry of an id. */
        append_piece(b, &e);
        gm_ledger_forget(b, id);
}

/* An "o" line as append_shared() writes it, newline included. */
static bool parse_shared(const char *line, gm_ledger_shared_t *e) {
        int end = 0;
        *e = (gm_ledger_shared_t){0};
        if (sscanf(line, "o %" SCNu64 " %" SCNu64 " %" SCNu64 " %u %" SCNu64 " %63s %127s%n", &e->store_id, &e->version,
                   &e->size, &e->retention_s, &e->created_unix_ms, e->tenant, e->name, &end) != 7 ||
            strcmp(line + end, "\n") != 0)
                return false;
        return e->store_id != 0 && e->version != 0 && e->size != 0; /* the name: checked at adoption */
}

/* A side file's path: the journal's, ".o" and up to 16 hex digits. */
#define SIDE_PATH_LEN (sizeof(((gm_broker_t *) 0)->ledger_path) + 24)

static void shared_side_path(const gm_broker_t *b, uint64_t store_id, char *buf, size_t len) {
        snprintf(buf, len, "%s.o%010" PRIx64, b->ledger_path, store_id);
}

/* The side file: "readers N\n", N names a line, "meta LEN\n", LEN bytes;
 * written whole (a new file renamed over) before the "o" line. */
static int shared_side_write(const gm_broker_t *b, const gm_shared_t *o) {
        char path[SIDE_PATH_LEN], tmp[sizeof(path) + 8];
        shared_side_path(b, o->store_id, path, sizeof(path));
        snprintf(tmp, sizeof(tmp), "%s.new", path);
        FILE *f = fopen(tmp, "we");
        if (!f)
                return -errno;
        fprintf(f, "readers %zu\n", o->n_readers);
        for (size_t i = 0; i < o->n_readers; i++)
                fprintf(f, "%s\n", o->readers[i]);
        fprintf(f, "meta %zu\n", o->meta_len);
        if (o->meta_len)
                fwrite(o->meta, 1, o->meta_len, f);
        int r = ferror(f) || fflush(f) != 0 || fsync(fileno(f)) < 0 ? -EIO : 0;
        if (fclose(f) != 0 && r == 0)
                r = -EIO;
        if (r == 0 && rename(tmp, path) < 0)
                r = -errno;
        if (r < 0)
                unlink(tmp);
        return r;
}

int gm_ledger_shared_load(gm_broker_t *b, uint64_t store_id, char ***ret_readers, size_t *ret_n_readers,
                          void **ret_meta, size_t *ret_meta_len) {
        char path[SIDE_PATH_LEN], line[128];
        shared_side_path(b, store_id, path, sizeof(path));
        FILE *f = fopen(path, "re");
        if (!f)
                return -errno;
        size_t n = 0, meta_len = 0, got = 0;
        char **readers = NULL;
        void *meta = NULL;
        int r = fgets(line, sizeof(line), f) && sscanf(line, "readers %zu", &n) == 1 && n <= GM_SHARED_MAX_READERS
                        ? 0
                        : -EINVAL;
        if (r == 0 && n && !(readers = calloc(n, sizeof(*readers))))
                r = -ENOMEM;
        for (; r == 0 && got < n; got++) {
                size_t len;
                if (!fgets(line, sizeof(line), f) || (len = strlen(line)) < 2 || line[len - 1] != '\n')
                        r = -EINVAL;
                else if (line[len - 1] = '\0', !(readers[got] = strdup(line)))
                        r = -ENOMEM;
        }
        if (r == 0 && !(fgets(line, sizeof(line), f) && sscanf(line, "meta %zu", &meta_len) == 1 &&
                        meta_len <= GM_SHARED_META_MAX))
                r = -EINVAL;
        if (r == 0 && meta_len && !(meta = malloc(meta_len)))
                r = -ENOMEM;
        if (r == 0 && meta_len && fread(meta, 1, meta_len, f) != meta_len)
                r = -EINVAL;
        fclose(f);
        if (r < 0) {
                for (size_t i = 0; readers && i < n; i++)
                        free(readers[i]);
                free(readers);
                free(meta);
                return r;
        }
        *ret_readers = readers;
        *ret_n_readers = n;
        *ret_meta = meta;
        *ret_meta_len = meta_len;
        return 0;
}

void gm_ledger_shared_store(gm_broker_t *b, gm_shared_t *o) {
        if (b->ledger_fd < 0 || !b->ops.store_add || !b->store_max)
                return;
        if (b->n_stored >= b->store_max) {
                gm_host_log(b, LOG_WARNING, "fd store full (%u): shared object '%s' will not survive a restart",
                            b->n_stored, o->name);
                return;
        }
        o->store_id = ++b->next_store_id;
        char name[GM_STORE_NAME_MAX];
        store_name(o->store_id, name, sizeof(name));
        int r = shared_side_write(b, o);
        if (r == 0)
                r = b->ops.store_add(b->ops.userdata, o->phys.fd, name);
        if (r < 0) {
                char path[SIDE_PATH_LEN];
                shared_side_path(b, o->store_id, path, sizeof(path));
                unlink(path);
                gm_host_log(b, LOG_WARNING, "Failed to keep shared object '%s' over a restart: %s", o->name,
                            strerror(-r));
                o->store_id = 0;
                return;
        }
        b->n_stored++;
        gm_ledger_shared_t e = shared_entry(o);
        append_shared(b, &e);
}

void gm_ledger_shared_forget(gm_broker_t *b, uint64_t store_id) {
        char path[SIDE_PATH_LEN];
        shared_side_path(b, store_id, path, sizeof(path));
        unlink(path);
        gm_ledger_forget(b, store_id);
}

void gm_ledger_shared_unstore(gm_broker_t *b, gm_shared_t *o) {
        if (!o->store_id)
                return;
        uint64_t store_id = o->store_id;
        char name[GM_STORE_NAME_MAX];
        store_name(store_id, name, sizeof(name));
        if (b->ops.store_remove)
                b->ops.store_remove(b->ops.userdata, name);
        o->store_id = 0;
        gm_assert(b->n_stored > 0);
        b->n_stored--;
        gm_ledger_shared_forget(b, store_id);
}

const gm_ledger_shared_t *gm_ledger_shared_find(const gm_broker_t *b, const char *name) {
        uint64_t id;
        if (!store_id_of(name, &id))
                return NULL;
        for (size_t i = 0; i < b->n_ledger_shared; i++)
                if (b->ledger_shared[i].store_id == id)
                        return &b->ledger_shared[i];
        return NULL;
}

/* Reads the journal into b->ledger (the live "+" entries), applies runtime
 * quotas, and rewrites it compactly. */
int gm_ledger_open(gm_broker_t *b, const char *path) {
        if (strlen(path) >= sizeof(b->ledger_path))
                return -ENAMETOOLONG;
        snprintf(b->ledger_path, sizeof(b->ledger_path), "%s", path);
        FILE *f = fopen(b->ledger_path, "re");
        size_t cap = 0, known_cap = 0, shared_cap = 0;
        char line[512], token[GM_TOKEN_LEN + 1];
        gm_ledger_shared_t se;
        unsigned uid;
        while (f && fgets(line, sizeof(line), f)) {
                gm_ledger_entry_t e = {0};
                char tenant[64];
                uint64_t v;
                if (parse_piece(line, &e)) {
                        if (!entry_valid(&e))
                                continue; /* what no daemon writes: nobody can claim it */
                        if (b->n_ledger == cap) {
                                cap = cap ? 2 * cap : 64;
                                gm_ledger_entry_t *n = realloc(b->ledger, cap * sizeof(*n));
                                if (!n)
                                        break;
                                b->ledger = n;
                        }
                        b->ledger[b->n_ledger++] = e;
                        if (e.store_id > b->next_store_id)
                                b->next_store_id = e.store_id;
                } else if (parse_shared(line, &se)) {
                        if (b->n_ledger_shared == shared_cap) {
                                shared_cap = shared_cap ? 2 * shared_cap : 16;
                                gm_ledger_shared_t *n = realloc(b->ledger_shared, shared_cap * sizeof(*n));
                                if (!n)
                                        break;
                                b->ledger_shared = n;
                        }
                        b->ledger_shared[b->n_ledger_shared++] = se;
                        if (se.store_id > b->next_store_id)
                                b->next_store_id = se.store_id;
                } else if (sscanf(line, "- %" SCNu64, &v) == 1) {
                        for (size_t i = 0; i < b->n_ledger; i++)
                                if (b->ledger[i].store_id == v) {
                                        b->ledger[i] = b->ledger[--b->n_ledger];
                                        break;
                                }
                        for (size_t i = 0; i < b->n_ledger_shared; i++)
                                if (b->ledger_shared[i].store_id == v) {
                                        b->ledger_shared[i] = b->ledger_shared[--b->n_ledger_shared];
                                        break;
                                }
                } else if (sscanf(line, "t %32s %u", token, &uid) == 2 && gm_ledger_token_valid(token)) {
                        if (!gm_ledger_known_token_find(b, token) && b->n_known_tokens == known_cap) {
                                known_cap = known_cap ? 2 * known_cap : 64;
                                gm_known_token_t *n = realloc(b->known_tokens, known_cap * sizeof(*n));
                                if (!n)
                                        break;
                                b->known_tokens = n;
                        }
                        if (!gm_ledger_known_token_find(b, token)) {
                                gm_known_token_t *k = &b->known_tokens[b->n_known_tokens++];
                                snprintf(k->token, sizeof(k->token), "%s", token);
                                k->uid = (uid_t) uid;
                        }
                } else if (sscanf(line, "e %32s", token) == 1) {
                        gm_known_token_t *k = gm_ledger_known_token_find(b, token);
                        if (k)
                                gm_ledger_known_token_remove(b, k);
                } else if (sscanf(line, "q %63s %" SCNu64, tenant, &v) == 2) {
                        gm_tenant_t *t = gm_tenant_get(b, tenant);
                        if (t)
                                gm_tenant_set_quota(t, GM_QUOTA_RUNTIME, v != 0, v);
                } /* anything else (a torn last line after a crash) is skipped */
        }
        if (f)
                fclose(f);
        return ledger_rewrite(b);
}

void gm_ledger_close(gm_broker_t *b) {
        if (b->ledger_fd >= 0)
                close(b->ledger_fd);
        b->ledger_fd = -1;
        free(b->ledger);
        b->ledger = NULL;
        b->n_ledger = 0;
        free(b->known_tokens);
        b->known_tokens = NULL;
        b->n_known_tokens = 0;
        free(b->records);
        b->records = NULL;
        b->n_records = 0;
}

const gm_ledger_entry_t *gm_ledger_find(const gm_broker_t *b, const char *name) {
        uint64_t id;
        if (!store_id_of(name, &id))
                return NULL;
        for (size_t i = 0; i < b->n_ledger; i++)
                if (b->ledger[i].store_id == id)
                        return &b->ledger[i];
        return NULL;
}

/* The previous daemon's record of a piece of the session with `token`, with
 * spec's coordinates; NULL when it has none. */
gm_ledger_entry_t *gm_ledger_record_find(gm_broker_t *b, const char *token, const gm_piece_spec_t *spec) {
        for (size_t i = 0; i < b->n_records; i++) {
                gm_ledger_entry_t *e = &b->records[i];
                if (e->segment_id == spec->segment_id && e->offset == spec->offset && e->size == spec->size &&
                    e->va_size == spec->segment_va_size && strcmp(e->token, token) == 0)
                        return e;
        }
        return NULL;
}

void gm_ledger_forget_sessions(gm_broker_t *b, bool journal) {
        b->n_known_tokens = 0; /* their sessions are not coming back */
        for (size_t i = 0; i < b->n_records && journal; i++)
                ledger_append(b, "- %" PRIu64 "\n", b->records[i].store_id);
        free(b->records);
        b->records = NULL;
        b->n_records = 0;
}
