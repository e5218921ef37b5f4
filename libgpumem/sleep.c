/* Sleep and wake of a local session (docs/sleep.md), below the heap: the
 * heap keeps every segment and block it has, and the segment table
 * (mapping.c) every segment's reserved range. Sleep gives the cached memory
 * back (the heap's release), then, after the device's queued work, copies
 * the kept blocks to host memory (one page-locked buffer where the backend
 * has one, within GPUMEM_SLEEP_PINNED_MAX; malloc'd memory for the rest)
 * and gives back every piece still mapped,
 * each segment's range staying reserved. Wake asks the daemon for the same
 * pieces at the same segment ids and offsets (they map at the same
 * addresses), waiting while quota or device is short, and copies the kept
 * data back. The heap above holds the sleeping pools (gm_heap_hold_tags():
 * they allocate nothing and release nothing) while the others go on; the
 * re-attach after a daemon restart tells the new daemon what a wake needs
 * (c->reattach_sleeping_bytes). Callers hold heap_lock. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_loader.h"
#include "local_session.h"
#include "mapping.h"
#include "pool.h"
#include "size.h"
#include "sleep.h"
#include "text.h"

/* Pieces given back together: consecutive ones of one segment (of heap tag
 * id `tag`: its wake's grant is for that pool). */
typedef struct sleep_run {
        uint64_t segment_id, va_size, offset, piece_size, n_pieces;
        unsigned tag;
} sleep_run_t;

/* A kept block's data in host memory: at `offset` in the sleep's pinned
 * buffer (pinned), else its own malloc'd `data`. */
typedef struct sleep_kept {
        uint64_t ptr, length;
        void *data;
        bool pinned;
        uint64_t offset;
} sleep_kept_t;

struct gm_sleep {
        sleep_run_t *runs;
        size_t n_runs, cap_runs;
        gm_u64map_t kept; /* block pointer -> sleep_kept_t */
        uint64_t bytes;   /* of the runs: what a wake needs */
        uint32_t held;    /* the heap tags that sleep (bit t: tag t) */
        /* The one page-locked buffer of the kept data (NULL: none), the
         * mapper it came from, and the bytes of kept data in it. */
        void *pinned;
        gm_mapper_t *pinned_mapper;
        uint64_t pinned_bytes;
};

/* Each pinned block's place in the buffer starts at a multiple of this. */
#define SLEEP_PINNED_ALIGN 256u
#define MEMINFO_PATH "/proc/meminfo"

static void sleep_kept_free(sleep_kept_t *k) {
        if (k) {
                if (!k->pinned)
                        free(k->data);
                free(k);
        }
}

static void sleep_free(struct gm_sleep *s) {
        if (!s)
                return;
        for (size_t i = 0; i < s->kept.cap; i++)
                sleep_kept_free(s->kept.values[i]);
        gm_u64map_done(&s->kept);
        if (s->pinned)
                s->pinned_mapper->ops->pinned_free(s->pinned_mapper, s->pinned);
        free(s->runs);
        free(s);
}

/* ---- what sleeps and what is kept ---- */

/* The heap tag id of a segment (a segment carries one tag; 0: the default). */
static unsigned segment_tag(const gpumem_client *c, uint64_t segment_id) {
        unsigned tag = 0;
        return gm_heap_segment_tag(gm_local_heap_core(c->heap), segment_id, &tag) == 0 ? tag : 0;
}

/* Whether `names` (NULL-terminated) holds "*" (when `star`) or the name of
 * heap tag id `tag`. */
static bool names_pool(const gpumem_client *c, const char *const *names, unsigned tag, bool star) {
        const char *name = gm_pool_name(&c->pools, tag);
        for (size_t i = 0; names && names[i]; i++)
                if ((star && strcmp(names[i], "*") == 0) || strcmp(names[i], name) == 0)
                        return true;
        return false;
}

/* Whether the data of block `b` is kept: keep_tags NULL keeps none, "*" every
 * one, else the blocks of the named pools. */
static bool block_kept(const gpumem_client *c, const block_t *b, const char *const *keep_tags) {
        return names_pool(c, keep_tags, segment_tag(c, b->segment_id), true);
}

/* Whether segment `seg` sleeps: tags NULL is every pool, else the named ones. */
static bool segment_sleeps(const gpumem_client *c, const segment_t *seg, const char *const *tags) {
        return !tags || names_pool(c, tags, segment_tag(c, seg->id), false);
}

/* The heap tags that sleep: every one for tags NULL, else those of the
 * named pools the session has used (a pool first used later is awake). */
static uint32_t sleeping_tags(const gpumem_client *c, const char *const *tags) {
        uint32_t mask = tags ? 0 : GM_HEAP_ALL_TAGS;
        for (size_t i = 0; tags && tags[i]; i++) {
                unsigned id;
                if (gm_pool_find(&c->pools, tags[i], &id) == 0 && id < GM_HEAP_MAX_TAGS)
                        mask |= 1u << id;
        }
        return mask;
}

/* What a re-attach reports of the sleep (0: awake, or nothing given back yet). */
static void sleep_report(gpumem_client *c, uint64_t bytes) {
        pthread_mutex_lock(&c->lock);
        c->reattach_sleeping_bytes = bytes;
        pthread_mutex_unlock(&c->lock);
}

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? -1 : x > y;
}

static int add_run(struct gm_sleep *s, const segment_t *seg, unsigned tag, uint64_t offset, uint64_t n) {
        if (s->n_runs == s->cap_runs) {
                size_t cap = s->cap_runs ? 2 * s->cap_runs : 8;
                sleep_run_t *runs = realloc(s->runs, cap * sizeof(*runs));
                if (!runs)
                        return -ENOMEM;
                s->runs = runs;
                s->cap_runs = cap;
        }
        s->runs[s->n_runs++] = (sleep_run_t){.segment_id = seg->id,
                                             .va_size = seg->va_size,
                                             .offset = offset,
                                             .piece_size = seg->piece_size,
                                             .n_pieces = n,
                                             .tag = tag};
        s->bytes += n * seg->piece_size;
        return 0;
}

/* The runs of the mapped pieces of one segment, in offset order. */
static int segment_runs(const gpumem_client *c, struct gm_sleep *s, const segment_t *seg) {
        uint64_t *offsets = malloc(seg->n_pieces * sizeof(*offsets));
        if (!offsets)
                return -ENOMEM;
        memcpy(offsets, seg->pieces, seg->n_pieces * sizeof(*offsets));
        qsort(offsets, seg->n_pieces, sizeof(*offsets), cmp_u64);
        int r = 0;
        for (size_t i = 0; i < seg->n_pieces && r == 0;) {
                size_t n = 1;
                while (i + n < seg->n_pieces && offsets[i + n] == offsets[i] + n * seg->piece_size)
                        n++;
                r = add_run(s, seg, segment_tag(c, seg->id), offsets[i], n);
                i += n;
        }
        free(offsets);
        return r;
}

/* The pieces that sleep: every mapped piece of the segments that do. */
static int sleep_collect_runs(gpumem_client *c, struct gm_sleep *s, const char *const *tags) {
        for (size_t i = 0; i < c->segments.cap; i++) {
                const segment_t *seg = c->segments.values[i];
                int r = seg && seg->n_pieces && segment_sleeps(c, seg, tags) ? segment_runs(c, s, seg) : 0;
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Half of MemAvailable now (0 when it cannot be read: nothing pinned). */
static uint64_t half_available(void) {
        FILE *f = fopen(MEMINFO_PATH, "re");
        char line[128];
        unsigned long long kib = 0;
        while (f && fgets(line, sizeof(line), f))
                if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
                        break;
        if (f)
                fclose(f);
        return kib / 2 * 1024;
}

/* The most kept bytes a sleep puts in page-locked memory:
 * GPUMEM_SLEEP_PINNED_MAX (a size; 0 pins nothing), else half of
 * MemAvailable at the sleep. */
static int pinned_max(gpumem_client *c, uint64_t *ret_max) {
        const char *env = getenv("GPUMEM_SLEEP_PINNED_MAX");
        if (!env || !*env) {
                *ret_max = half_available();
                return 0;
        }
        uint64_t max;
        if (gm_parse_size(env, &max) < 0)
                return gm_conn_set_error(c, -EINVAL, "gpumem: GPUMEM_SLEEP_PINNED_MAX=%s is not a size", env);
        *ret_max = max;
        return 0;
}

/* The kept blocks, each with its place: in the pinned buffer while the
 * places fit under the bound (`pin`: the backend has page-locked memory),
 * else a malloc'd buffer of its own later. *ret_pinned_size: the buffer's size. */
static int sleep_place_blocks(gpumem_client *c, struct gm_sleep *s, const char *const *keep_tags, bool pin,
                              uint64_t *ret_pinned_size) {
        uint64_t max = 0, size = 0;
        int r = keep_tags ? pinned_max(c, &max) : 0;
        for (size_t i = 0; r == 0 && keep_tags && i < c->blocks.cap; i++) {
                const block_t *b = c->blocks.values[i];
                if (!b || !block_kept(c, b, keep_tags))
                        continue;
                if (!c->mapper->ops->copy_to_host)
                        return gm_conn_set_error(c, -EOPNOTSUPP, "gpumem: the %s backend cannot copy memory to host",
                                                 c->mapper->ops->backend);
                sleep_kept_t *k = calloc(1, sizeof(*k));
                if (!k || gm_u64map_put(&s->kept, c->blocks.keys[i], k) < 0) {
                        free(k);
                        return gm_conn_set_error(c, -ENOMEM, "gpumem: out of host memory");
                }
                *k = (sleep_kept_t){.ptr = c->blocks.keys[i], .length = b->requested};
                uint64_t place = (k->length + SLEEP_PINNED_ALIGN - 1) / SLEEP_PINNED_ALIGN * SLEEP_PINNED_ALIGN;
                if (pin && k->length && place <= max - size) {
                        k->pinned = true;
                        k->offset = size;
                        size += place;
                }
        }
        *ret_pinned_size = size;
        return r;
}

/* Copies the kept blocks' bytes (what the application asked for) to host
 * memory: one page-locked buffer for those placed in it when the backend
 * has such memory (cuda: the copies run at the bus's bandwidth), malloc'd
 * memory for the rest and for all of them when pinning fails (silently:
 * gpumem_sleeping_pinned_bytes() tells). */
static int sleep_keep_blocks(gpumem_client *c, struct gm_sleep *s, const char *const *keep_tags) {
        const gm_mapper_ops_t *ops = c->mapper->ops;
        uint64_t pinned_size = 0;
        int r = sleep_place_blocks(c, s, keep_tags, ops->pinned_alloc != NULL, &pinned_size);
        if (r < 0)
                return r;
        if (pinned_size && ops->pinned_alloc(c->mapper, pinned_size, &s->pinned) == 0)
                s->pinned_mapper = c->mapper;
        else
                s->pinned = NULL; /* out of page-locked memory, or none: every block pageable */
        for (size_t i = 0; i < s->kept.cap; i++) {
                sleep_kept_t *k = s->kept.values[i];
                if (!k)
                        continue;
                k->pinned = k->pinned && s->pinned;
                if (k->pinned) {
                        k->data = (char *) s->pinned + k->offset;
                        s->pinned_bytes += k->length;
                } else if (!(k->data = malloc(k->length ? k->length : 1))) {
                        return gm_conn_set_error(c, -ENOMEM, "gpumem: out of host memory keeping %" PRIu64 " bytes",
                                                 k->length);
                }
                r = ops->copy_to_host(c->mapper, k->data, k->ptr, k->length);
                if (r < 0)
                        return gm_conn_set_error(c, r, "gpumem: cannot copy a kept block to host memory: %s",
                                                 gm_cuda_last_error());
        }
        return 0;
}

/* Tells the daemon the session sleeps (needing `bytes` to wake; the pools
 * `tags`, NULL: all) or woke. */
static int sleep_tell(gpumem_client *c, bool asleep, uint64_t bytes, const char *const *tags) {
        Gpumem__SleepState ss = GPUMEM__SLEEP_STATE__INIT;
        ss.asleep = asleep;
        ss.sleeping_bytes = bytes;
        while (tags && tags[ss.n_tags])
                ss.n_tags++;
        ss.tags = (char **) tags;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.body_case = GPUMEM__ENVELOPE__BODY_SLEEP_STATE;
        env.sleep_state = &ss;
        Gpumem__Envelope *reply = NULL;
        int r = gm_conn_call_expect(c, &env, NULL, GPUMEM__ENVELOPE__BODY_OK, &reply);
        gm_msg_free(reply);
        return r;
}

/* Gives runs [0, n) back, their segments' ranges staying reserved. */
static void sleep_give_back(gpumem_client *c, const struct gm_sleep *s, size_t n) {
        for (size_t i = 0; i < n; i++) {
                const sleep_run_t *run = &s->runs[i];
                gm_local_session_give_back(c, run->segment_id, run->offset, run->piece_size, run->n_pieces);
        }
}

/* ---- the calls ---- */

int gm_sleep_check_tags(gpumem_client *c, const char *const *tags, const char *const *keep_tags) {
        size_t n = 0;
        for (; tags && tags[n]; n++)
                if (!gm_text_tag_valid(tags[n], true))
                        return gm_conn_set_error(c, -EINVAL, "gpumem: sleep: '%s' is not a pool's tag", tags[n]);
        if (tags && (n == 0 || n > GM_SLEEP_MAX_TAGS))
                return gm_conn_set_error(c, -EINVAL, "gpumem: sleep: name 1 to %d pools (NULL: every pool)",
                                         GM_SLEEP_MAX_TAGS);
        for (size_t i = 0; keep_tags && keep_tags[i]; i++)
                if (strcmp(keep_tags[i], "*") != 0 && !gm_text_tag_valid(keep_tags[i], true))
                        return gm_conn_set_error(c, -EINVAL, "gpumem: sleep: '%s' is not a pool's tag", keep_tags[i]);
        return 0;
}

int gm_sleep_enter(gpumem_client *c, const char *const *tags, const char *const *keep_tags,
                   uint64_t *ret_released_bytes) {
        if (c->sleep)
                return gm_conn_set_error(c, -EALREADY, "gpumem: the session is asleep already");
        if (c->kept_bytes)
                return gm_conn_set_error(c, -EBUSY,
                                         "gpumem: cannot sleep: %" PRIu64
                                         " bytes the driver refused to unmap are still mapped",
                                         c->kept_bytes);
        struct gm_sleep *s = calloc(1, sizeof(*s));
        if (!s)
                return gm_conn_set_error(c, -ENOMEM, "gpumem: out of host memory");
        uint64_t released = gm_local_session_release_cached(c);
        gm_mapping_sync_device(c); /* the kept data is final and nothing uses what goes */
        c->local_frees_synced = c->local_frees;
        int r = sleep_collect_runs(c, s, tags);
        if (r == -ENOMEM)
                r = gm_conn_set_error(c, r, "gpumem: out of host memory");
        if (r == 0)
                r = sleep_keep_blocks(c, s, keep_tags);
        if (r == 0)
                r = sleep_tell(c, true, s->bytes, tags);
        if (r < 0) {
                sleep_free(s);
                return r;
        }
        sleep_give_back(c, s, s->n_runs);
        s->held = sleeping_tags(c, tags);
        gm_local_heap_hold_tags(c->heap, s->held);
        c->sleep = s;
        sleep_report(c, s->bytes);
        *ret_released_bytes = released + s->bytes;
        return 0;
}

int gm_sleep_wake(gpumem_client *c, uint32_t timeout_ms) {
        struct gm_sleep *s = c->sleep;
        if (!s)
                return 0;
        size_t done = 0;
        int r = 0;
        for (; done < s->n_runs && r == 0; done += r == 0) {
                const sleep_run_t *run = &s->runs[done];
                gm_local_heap_grant_t g = {.segment_id = run->segment_id,
                                           .segment_va_size = run->va_size,
                                           .offset = run->offset,
                                           .size = run->piece_size,
                                           .n_pieces = run->n_pieces,
                                           .tag = run->tag};
                r = gm_local_session_regrant(c, &g, timeout_ms);
        }
        if (r < 0) {
                /* All or nothing: what came goes back, and the session sleeps on. */
                char why[1024];
                snprintf(why, sizeof(why), "%s", gm_conn_last_error(c));
                sleep_give_back(c, s, done);
                char need[32];
                return gm_conn_set_error(c, r, "gpumem: cannot wake (%s needed; still asleep: gpumem_wake() again): %s",
                                         gm_format_size(s->bytes, need, sizeof(need)), why[0] ? why : strerror(-r));
        }
        int err = 0;
        for (size_t i = 0; i < s->kept.cap; i++) {
                const sleep_kept_t *k = s->kept.values[i];
                int cr = k ? c->mapper->ops->copy_from_host(c->mapper, k->ptr, k->data, k->length) : 0;
                if (cr < 0 && err == 0)
                        err = gm_conn_set_error(c, cr, "gpumem: woke, but a kept block could not be copied back: %s",
                                                gm_cuda_last_error());
        }
        c->sleep = NULL;
        sleep_free(s);
        gm_local_heap_hold_tags(c->heap, 0);
        sleep_report(c, 0); /* its pieces are granted again: a re-attach reports them */
        r = sleep_tell(c, false, 0, NULL);
        return err ? err : r;
}

uint64_t gm_sleep_bytes(const gpumem_client *c) {
        return c->sleep ? c->sleep->bytes : 0;
}

uint64_t gm_sleep_pinned_bytes(const gpumem_client *c) {
        return c->sleep ? c->sleep->pinned_bytes : 0;
}

/* A dropped pinned block's place stays in the buffer until the wake. */
void gm_sleep_drop_kept(gpumem_client *c, uint64_t ptr) {
        if (!c->sleep)
                return;
        sleep_kept_t *k = gm_u64map_remove(&c->sleep->kept, ptr);
        if (k && k->pinned)
                c->sleep->pinned_bytes -= k->length;
        sleep_kept_free(k);
}

void gm_sleep_forget(gpumem_client *c) {
        sleep_free(c->sleep);
        c->sleep = NULL;
        c->reattach_sleeping_bytes = 0;
}
