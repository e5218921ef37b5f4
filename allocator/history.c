/* The history ring and its interning tables.
 *
 * Invariants: each owner (one pid) holds its own ring of o->len > 0
 * entries, oldest first; len is the sum over owners and len <= max; the
 * owners form a max-heap by o->len (heap[0] holds the most entries), which
 * is where an entry is dropped when the bound is reached. Each slot with
 * frames holds one reference to its stack; each stack holds one reference to
 * every string its frames point at (once per frame). frame_bytes is the sum
 * of stack_bytes() and string_bytes() over the live stacks and strings. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "history.h"
#include "u64map.h"

/* Intrusive chained hash table node, first member of what it links. */
typedef struct node {
        struct node *next;
        uint64_t hash;
} node_t;

typedef struct table {
        node_t **buckets;
        size_t n_buckets; /* 0 or a power of 2 */
        size_t count;
} table_t;

typedef struct istring {
        node_t node;
        size_t refs;
        size_t len;
        char s[]; /* NUL-terminated */
} istring_t;

typedef struct stack {
        node_t node;
        size_t refs;
        uint64_t id;
        size_t n;
        gm_frame_t frames[]; /* strings point into istring_t.s */
} frame_stack_t;

typedef struct slot {
        gm_history_entry_t entry;
        frame_stack_t *stack; /* NULL = no frames */
        uint64_t seq;         /* recording order across owners */
} slot_t;

/* One process's entries: a ring, oldest first, at slots[(start + i) % cap]. */
typedef struct owner {
        uint32_t pid;
        slot_t *slots;
        size_t cap, start, len;
        size_t heap_pos; /* in gm_history.heap */
} owner_t;

struct gm_history {
        size_t len, max; /* entries of all owners together, and their bound */
        size_t frame_bytes, frame_bytes_limit;
        uint64_t next_stack_id, next_seq;
        table_t strings, stacks;
        gm_u64map_t owners; /* pid -> owner_t */
        owner_t **heap;     /* max-heap of owners by len: heap[0] holds the most entries */
        size_t n_owners, cap_owners;
};

#define FNV_OFFSET UINT64_C(0xcbf29ce484222325)
#define FNV_PRIME UINT64_C(0x100000001b3)

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
        const unsigned char *c = p;

        for (size_t i = 0; i < n; i++)
                h = (h ^ c[i]) * FNV_PRIME;
        return h;
}

static const char *nonnull(const char *s) {
        return s ? s : "";
}

static size_t string_bytes(size_t len) {
        return sizeof(istring_t) + len + 1;
}

static size_t stack_bytes(size_t n) {
        return sizeof(frame_stack_t) + n * sizeof(gm_frame_t);
}

/* The chain of table t where a node with hash h belongs (t non-empty). */
static node_t **chain(const table_t *t, uint64_t hash) {
        return &t->buckets[hash & (t->n_buckets - 1)];
}

static int table_add(table_t *t, node_t *n) {
        if (t->count >= t->n_buckets) {
                size_t nb = t->n_buckets ? 2 * t->n_buckets : 16;
                node_t **b = calloc(nb, sizeof(*b));
                table_t grown = {.buckets = b, .n_buckets = nb, .count = t->count};

                if (!b)
                        return -ENOMEM;
                for (size_t i = 0; i < t->n_buckets; i++)
                        while (t->buckets[i]) {
                                node_t *m = t->buckets[i], **c = chain(&grown, m->hash);

                                t->buckets[i] = m->next;
                                m->next = *c;
                                *c = m;
                        }
                free(t->buckets);
                *t = grown;
        }
        n->next = *chain(t, n->hash);
        *chain(t, n->hash) = n;
        t->count++;
        return 0;
}

static void table_remove(table_t *t, node_t *n) {
        node_t **c = chain(t, n->hash);

        while (*c != n)
                c = &(*c)->next;
        *c = n->next;
        t->count--;
}

static istring_t *string_of(const char *s) {
        return (istring_t *) (void *) (s - offsetof(istring_t, s));
}

/* Returns the interned copy of s with one more reference, or NULL (-ENOMEM). */
static const char *string_ref(gm_history_t *h, const char *s) {
        size_t len = strlen(s);
        uint64_t hash = hash_bytes(FNV_OFFSET, s, len);
        istring_t *is;

        for (node_t *n = h->strings.n_buckets ? *chain(&h->strings, hash) : NULL; n; n = n->next) {
                is = (istring_t *) n;
                if (n->hash == hash && is->len == len && memcmp(is->s, s, len) == 0) {
                        is->refs++;
                        return is->s;
                }
        }
        is = malloc(string_bytes(len));
        if (!is)
                return NULL;
        *is = (istring_t){.node.hash = hash, .refs = 1, .len = len};
        memcpy(is->s, s, len + 1);
        if (table_add(&h->strings, &is->node) < 0) {
                free(is);
                return NULL;
        }
        h->frame_bytes += string_bytes(len);
        return is->s;
}

static void string_unref(gm_history_t *h, const char *s) {
        istring_t *is = string_of(s);

        if (--is->refs > 0)
                return;
        table_remove(&h->strings, &is->node);
        h->frame_bytes -= string_bytes(is->len);
        free(is);
}

static frame_stack_t *stack_unref(gm_history_t *h, frame_stack_t *st) {
        if (!st || --st->refs > 0)
                return NULL;
        if (st->id) /* ids are given once the stack is in the table */
                table_remove(&h->stacks, &st->node);
        for (size_t i = 0; i < st->n; i++) {
                string_unref(h, st->frames[i].filename);
                string_unref(h, st->frames[i].name);
        }
        h->frame_bytes -= stack_bytes(st->n);
        free(st);
        return NULL;
}

static uint64_t stack_hash(const gm_frame_t *frames, size_t n) {
        uint64_t hash = FNV_OFFSET;

        for (size_t i = 0; i < n; i++) {
                const char *file = nonnull(frames[i].filename), *name = nonnull(frames[i].name);

                hash = hash_bytes(hash, file, strlen(file) + 1);
                hash = hash_bytes(hash, &frames[i].line, sizeof(frames[i].line));
                hash = hash_bytes(hash, name, strlen(name) + 1);
        }
        return hash;
}

static bool stack_equal(const frame_stack_t *st, const gm_frame_t *frames, size_t n) {
        if (st->n != n)
                return false;
        for (size_t i = 0; i < n; i++)
                if (st->frames[i].line != frames[i].line ||
                    strcmp(st->frames[i].filename, nonnull(frames[i].filename)) != 0 ||
                    strcmp(st->frames[i].name, nonnull(frames[i].name)) != 0)
                        return false;
        return true;
}

/* Stores *ret = the interned stack for frames with one more reference, or
 * NULL when interning it would pass the byte limit. */
static int stack_ref(gm_history_t *h, const gm_frame_t *frames, size_t n, frame_stack_t **ret) {
        uint64_t hash = stack_hash(frames, n);
        frame_stack_t *st;

        for (node_t *m = h->stacks.n_buckets ? *chain(&h->stacks, hash) : NULL; m; m = m->next) {
                st = (frame_stack_t *) m;
                if (m->hash == hash && stack_equal(st, frames, n)) {
                        st->refs++;
                        *ret = st;
                        return 0;
                }
        }
        if (n > (SIZE_MAX - sizeof(frame_stack_t)) / sizeof(gm_frame_t) || stack_bytes(n) > h->frame_bytes_limit) {
                *ret = NULL;
                return 0;
        }
        st = malloc(stack_bytes(n));
        if (!st)
                return -ENOMEM;
        *st = (frame_stack_t){.node.hash = hash, .refs = 1};
        h->frame_bytes += stack_bytes(0);
        /* Intern frame by frame; st->n counts the frames holding references,
         * so stack_unref() undoes a partial build. */
        for (; st->n < n; st->n++) {
                gm_frame_t *f = &st->frames[st->n];

                f->line = frames[st->n].line;
                f->filename = string_ref(h, nonnull(frames[st->n].filename));
                if (!f->filename) {
                        stack_unref(h, st);
                        return -ENOMEM;
                }
                f->name = string_ref(h, nonnull(frames[st->n].name));
                if (!f->name) {
                        string_unref(h, f->filename);
                        stack_unref(h, st);
                        return -ENOMEM;
                }
                h->frame_bytes += sizeof(gm_frame_t);
        }
        if (h->frame_bytes > h->frame_bytes_limit) {
                *ret = stack_unref(h, st);
                return 0;
        }
        if (table_add(&h->stacks, &st->node) < 0) {
                stack_unref(h, st);
                return -ENOMEM;
        }
        st->id = ++h->next_stack_id;
        *ret = st;
        return 0;
}

/* ---- the owners' max-heap by number of entries ---- */

static void heap_set(gm_history_t *h, size_t pos, owner_t *o) {
        h->heap[pos] = o;
        o->heap_pos = pos;
}

static void heap_up(gm_history_t *h, size_t pos) {
        owner_t *o = h->heap[pos];
        while (pos > 0 && h->heap[(pos - 1) / 2]->len < o->len) {
                heap_set(h, pos, h->heap[(pos - 1) / 2]);
                pos = (pos - 1) / 2;
        }
        heap_set(h, pos, o);
}

static void heap_down(gm_history_t *h, size_t pos) {
        owner_t *o = h->heap[pos];
        for (;;) {
                size_t child = 2 * pos + 1;
                if (child >= h->n_owners)
                        break;
                if (child + 1 < h->n_owners && h->heap[child + 1]->len > h->heap[child]->len)
                        child++;
                if (h->heap[child]->len <= o->len)
                        break;
                heap_set(h, pos, h->heap[child]);
                pos = child;
        }
        heap_set(h, pos, o);
}

/* Forgets an owner with no entries left. */
static void owner_remove(gm_history_t *h, owner_t *o) {
        size_t pos = o->heap_pos;
        gm_u64map_remove(&h->owners, o->pid);
        h->n_owners--;
        if (pos < h->n_owners) {
                owner_t *moved = h->heap[h->n_owners];
                heap_set(h, pos, moved);
                heap_up(h, pos);
                heap_down(h, moved->heap_pos);
        }
        free(o->slots);
        free(o);
}

/* The owner of pid's entries, created when absent (NULL: -ENOMEM). */
static owner_t *owner_get(gm_history_t *h, uint32_t pid) {
        owner_t *o = gm_u64map_get(&h->owners, pid);
        if (o)
                return o;
        if (h->n_owners == h->cap_owners) {
                size_t cap = h->cap_owners ? 2 * h->cap_owners : 8;
                owner_t **heap = realloc(h->heap, cap * sizeof(*heap));
                if (!heap)
                        return NULL;
                h->heap = heap;
                h->cap_owners = cap;
        }
        o = calloc(1, sizeof(*o));
        if (!o || gm_u64map_put(&h->owners, pid, o) < 0) {
                free(o);
                return NULL;
        }
        o->pid = pid;
        heap_set(h, h->n_owners++, o);
        heap_up(h, o->heap_pos);
        return o;
}

/* Drops the oldest entry of owner o (which has one); o may be freed. */
static void drop_oldest_of(gm_history_t *h, owner_t *o) {
        stack_unref(h, o->slots[o->start].stack);
        o->start = (o->start + 1) % o->cap;
        o->len--;
        h->len--;
        if (o->len == 0)
                owner_remove(h, o);
        else
                heap_down(h, o->heap_pos);
}

/* Drops one entry of the owner holding the most: one busy process never
 * evicts the entries of the others while it holds more than they do. */
static void drop_one(gm_history_t *h) {
        drop_oldest_of(h, h->heap[0]);
}

/* Makes room for one more entry in o's ring. */
static int owner_grow(owner_t *o) {
        if (o->len < o->cap)
                return 0;
        size_t cap = o->cap ? 2 * o->cap : 16;
        if (cap > SIZE_MAX / sizeof(slot_t))
                return -ENOMEM;
        slot_t *slots = malloc(cap * sizeof(*slots));
        if (!slots)
                return -ENOMEM;
        for (size_t i = 0; i < o->len; i++)
                slots[i] = o->slots[(o->start + i) % o->cap];
        free(o->slots);
        o->slots = slots;
        o->cap = cap;
        o->start = 0;
        return 0;
}

int gm_history_new(size_t max_entries, size_t frame_bytes_limit, gm_history_t **ret_history) {
        gm_history_t *h = calloc(1, sizeof(*h));

        if (!h)
                return -ENOMEM;
        h->max = max_entries;
        h->frame_bytes_limit = frame_bytes_limit;
        *ret_history = h;
        return 0;
}

gm_history_t *gm_history_free(gm_history_t *h) {
        if (!h)
                return NULL;
        gm_history_clear(h);
        gm_u64map_done(&h->owners);
        free(h->heap);
        free(h->strings.buckets);
        free(h->stacks.buckets);
        free(h);
        return NULL;
}

int gm_history_set_max(gm_history_t *h, size_t max_entries) {
        while (h->len > max_entries)
                drop_one(h);
        h->max = max_entries;
        return 0;
}

int gm_history_record(gm_history_t *h, const gm_history_entry_t *e, const gm_frame_t *frames, size_t n_frames) {
        frame_stack_t *st = NULL;
        int r;

        if (h->max == 0)
                return 0;
        owner_t *o = owner_get(h, e->pid);
        if (!o)
                return -ENOMEM;
        if ((r = owner_grow(o)) < 0) {
                if (o->len == 0)
                        owner_remove(h, o);
                return r;
        }
        if (n_frames > 0 && (r = stack_ref(h, frames, n_frames, &st)) < 0) {
                if (o->len == 0)
                        owner_remove(h, o);
                return r;
        }
        slot_t *s = &o->slots[(o->start + o->len) % o->cap];
        s->entry = *e;
        s->entry.frames_id = st ? st->id : 0;
        s->stack = st;
        s->seq = h->next_seq++;
        o->len++;
        h->len++;
        heap_up(h, o->heap_pos);
        if (h->len > h->max)
                drop_one(h); /* may be o's own oldest: it holds the most */
        return 0;
}

static void visit(const slot_t *s, gm_history_visit_fn fn, void *userdata) {
        if (s->stack)
                fn(&s->entry, s->stack->frames, s->stack->n, userdata);
        else
                fn(&s->entry, NULL, 0, userdata);
}

/* A merge cursor: the next entry of one owner. */
typedef struct cursor {
        const owner_t *o;
        size_t i;
} cursor_t;

static uint64_t cursor_seq(const cursor_t *c) {
        return c->o->slots[(c->o->start + c->i) % c->o->cap].seq;
}

static void cursor_down(cursor_t *heap, size_t n, size_t pos) {
        cursor_t c = heap[pos];
        for (;;) {
                size_t child = 2 * pos + 1;
                if (child >= n)
                        break;
                if (child + 1 < n && cursor_seq(&heap[child + 1]) < cursor_seq(&heap[child]))
                        child++;
                if (cursor_seq(&heap[child]) >= cursor_seq(&c))
                        break;
                heap[pos] = heap[child];
                pos = child;
        }
        heap[pos] = c;
}

void gm_history_foreach(const gm_history_t *h, gm_history_visit_fn fn, void *userdata) {
        size_t n = h->n_owners;
        cursor_t *heap = n > 1 ? malloc(n * sizeof(*heap)) : NULL;

        if (!heap) { /* one owner, or no memory for the merge: owner by owner */
                for (size_t k = 0; k < n; k++)
                        for (size_t i = 0; i < h->heap[k]->len; i++)
                                visit(&h->heap[k]->slots[(h->heap[k]->start + i) % h->heap[k]->cap], fn, userdata);
                return;
        }
        for (size_t k = 0; k < n; k++)
                heap[k] = (cursor_t){.o = h->heap[k]};
        for (size_t k = n / 2; k-- > 0;)
                cursor_down(heap, n, k);
        while (n > 0) {
                const owner_t *o = heap[0].o;
                visit(&o->slots[(o->start + heap[0].i) % o->cap], fn, userdata);
                if (++heap[0].i == o->len)
                        heap[0] = heap[--n];
                if (n > 0)
                        cursor_down(heap, n, 0);
        }
        free(heap);
}

void gm_history_clear(gm_history_t *h) {
        while (h->n_owners > 0)
                drop_one(h);
}

size_t gm_history_len(const gm_history_t *h) {
        return h->len;
}

size_t gm_history_frame_bytes(const gm_history_t *h) {
        return h->frame_bytes;
}
