/* The history ring and its interning tables.
 *
 * Invariants: the ring holds `len` entries at slots[(start + i) % cap] for
 * i in [0, len), oldest first, with len <= max and len <= cap. Each slot with
 * frames holds one reference to its stack; each stack holds one reference to
 * every string its frames point at (once per frame). frame_bytes is the sum
 * of stack_bytes() and string_bytes() over the live stacks and strings. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "history.h"

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
} slot_t;

struct gm_history {
        slot_t *slots;
        size_t cap, start, len, max;
        size_t frame_bytes, frame_bytes_limit;
        uint64_t next_stack_id;
        table_t strings, stacks;
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

static void drop_oldest(gm_history_t *h) {
        stack_unref(h, h->slots[h->start].stack);
        h->start = (h->start + 1) % h->cap;
        h->len--;
}

/* Moves the newest `keep` (<= len, <= new_cap) entries into storage of new_cap
 * slots, oldest at 0, dropping the others. Changes nothing on failure. */
static int relayout(gm_history_t *h, size_t new_cap, size_t keep) {
        slot_t *slots = NULL;

        if (new_cap > SIZE_MAX / sizeof(*slots))
                return -ENOMEM;
        if (new_cap > 0 && !(slots = malloc(new_cap * sizeof(*slots))))
                return -ENOMEM;
        while (h->len > keep)
                drop_oldest(h);
        for (size_t i = 0; i < h->len; i++)
                slots[i] = h->slots[(h->start + i) % h->cap];
        free(h->slots);
        h->slots = slots;
        h->cap = new_cap;
        h->start = 0;
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
        free(h->slots);
        free(h->strings.buckets);
        free(h->stacks.buckets);
        free(h);
        return NULL;
}

int gm_history_set_max(gm_history_t *h, size_t max_entries) {
        if (h->cap > max_entries) {
                size_t keep = h->len < max_entries ? h->len : max_entries;
                int r = relayout(h, keep, keep);

                if (r < 0)
                        return r;
        }
        h->max = max_entries;
        return 0;
}

int gm_history_record(gm_history_t *h, const gm_history_entry_t *e, const gm_frame_t *frames, size_t n_frames) {
        frame_stack_t *st = NULL;
        slot_t *s;
        int r;

        if (h->max == 0)
                return 0;
        if (h->len == h->max)
                drop_oldest(h);
        else if (h->len == h->cap) {
                size_t new_cap = h->cap ? 2 * h->cap : 16;

                if (new_cap > h->max || new_cap < h->cap)
                        new_cap = h->max;
                if ((r = relayout(h, new_cap, h->len)) < 0)
                        return r;
        }
        if (n_frames > 0 && (r = stack_ref(h, frames, n_frames, &st)) < 0)
                return r;
        s = &h->slots[(h->start + h->len) % h->cap];
        s->entry = *e;
        s->entry.frames_id = st ? st->id : 0;
        s->stack = st;
        h->len++;
        return 0;
}

void gm_history_foreach(const gm_history_t *h, gm_history_visit_fn fn, void *userdata) {
        for (size_t i = 0; i < h->len; i++) {
                const slot_t *s = &h->slots[(h->start + i) % h->cap];

                if (s->stack)
                        fn(&s->entry, s->stack->frames, s->stack->n, userdata);
                else
                        fn(&s->entry, NULL, 0, userdata);
        }
}

void gm_history_clear(gm_history_t *h) {
        while (h->len > 0)
                drop_oldest(h);
}

size_t gm_history_len(const gm_history_t *h) {
        return h->len;
}

size_t gm_history_frame_bytes(const gm_history_t *h) {
        return h->frame_bytes;
}
