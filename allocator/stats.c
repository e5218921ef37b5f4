/* memory_stats() / memory_summary() over gm_stats_t.
 *
 * One table, `groups`, names every key family with its offset in gm_stats_t.
 * It is sorted by name, and since '.' sorts before '_' and every letter,
 * walking it family by family (pools and fields in sorted order too) yields
 * the flattened keys in exactly the order of sorted(memory_stats()). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "stats.h"

typedef enum group_kind {
        GROUP_POOLED,  /* gm_stat_t[_GM_STAT_TYPE_MAX]: "<name>.<pool>.<field>" */
        GROUP_SINGLE,  /* one gm_stat_t: "<name>.<field>" */
        GROUP_COUNTER, /* int64_t cleared by reset_accumulated: "<name>" */
        GROUP_SETTING, /* int64_t never reset: "<name>" */
} group_kind_t;

typedef struct group {
        const char *name;
        group_kind_t kind;
        size_t offset;     /* in gm_stats_t */
        int summary_row;   /* 1-based row order in memory_summary(); 0 = not shown */
        const char *label; /* memory_summary() label */
        bool bytes;        /* summary cells in B/KiB/MiB..., else counts */
} group_t;

#define POOLED(n, row, lbl, b) \
        { #n, GROUP_POOLED, offsetof(gm_stats_t, n), row, lbl, b }
#define SINGLE(n, row, lbl) \
        { #n, GROUP_SINGLE, offsetof(gm_stats_t, n), row, lbl, false }
#define SCALAR(n, kind) \
        { #n, kind, offsetof(gm_stats_t, n), 0, NULL, false }

static const group_t groups[] = {
        POOLED(active, 7, "Active allocs", false),
        POOLED(active_bytes, 2, "Active memory", true),
        POOLED(allocated_bytes, 1, "Allocated memory", true),
        POOLED(allocation, 6, "Allocations", false),
        POOLED(inactive_split, 9, "Non-releasable allocs", false),
        POOLED(inactive_split_bytes, 5, "Non-releasable memory", true),
        SCALAR(max_split_size, GROUP_SETTING),
        SCALAR(num_alloc_retries, GROUP_COUNTER),
        SCALAR(num_device_alloc, GROUP_COUNTER),
        SCALAR(num_device_free, GROUP_COUNTER),
        SCALAR(num_ooms, GROUP_COUNTER),
        SCALAR(num_reclaim_waits, GROUP_COUNTER),
        SCALAR(num_sync_all_streams, GROUP_COUNTER),
        SINGLE(oversize_allocations, 10, "Oversize allocations"),
        SINGLE(oversize_segments, 11, "Oversize GPU segments"),
        POOLED(requested_bytes, 3, "Requested memory", true),
        POOLED(reserved_bytes, 4, "GPU reserved memory", true),
        POOLED(segment, 8, "GPU reserved segments", false),
};
#define N_GROUPS (sizeof(groups) / sizeof(groups[0]))
#define N_SUMMARY_ROWS 11

/* Sorted by name. */
static const struct {
        const char *name;
        gm_stat_type_t type;
} pools[] = {
        {"all", GM_STAT_ALL},
        {"large_pool", GM_STAT_LARGE_POOL},
        {"small_pool", GM_STAT_SMALL_POOL},
};

/* Sorted by name. */
static const struct {
        const char *name;
        size_t offset;
} fields[] = {
        {"allocated", offsetof(gm_stat_t, allocated)},
        {"current", offsetof(gm_stat_t, current)},
        {"freed", offsetof(gm_stat_t, freed)},
        {"peak", offsetof(gm_stat_t, peak)},
};

static int64_t value_at(const gm_stats_t *s, size_t offset) {
        int64_t v;

        memcpy(&v, (const char *) s + offset, sizeof(v));
        return v;
}

static gm_stat_t *stat_at(gm_stats_t *s, const group_t *g, gm_stat_type_t type) {
        return (gm_stat_t *) ((char *) s + g->offset) + type;
}

static const gm_stat_t *cstat_at(const gm_stats_t *s, const group_t *g, gm_stat_type_t type) {
        return (const gm_stat_t *) ((const char *) s + g->offset) + type;
}

/* Calls fn(name, offset of its int64_t, ctx) for every key in sorted order
 * until fn returns true; returns whether it stopped early. */
typedef bool (*key_fn)(const char *name, size_t offset, void *ctx);

static bool for_each_key(key_fn fn, void *ctx) {
        char name[64];

        for (size_t g = 0; g < N_GROUPS; g++) {
                const group_t *grp = &groups[g];
                size_t n_pools = grp->kind == GROUP_POOLED ? sizeof(pools) / sizeof(pools[0]) : 1;

                if (grp->kind == GROUP_COUNTER || grp->kind == GROUP_SETTING) {
                        if (fn(grp->name, grp->offset, ctx))
                                return true;
                        continue;
                }
                for (size_t p = 0; p < n_pools; p++)
                        for (size_t f = 0; f < sizeof(fields) / sizeof(fields[0]); f++) {
                                size_t off = grp->offset + fields[f].offset;

                                if (grp->kind == GROUP_POOLED) {
                                        snprintf(name, sizeof(name), "%s.%s.%s", grp->name, pools[p].name,
                                                 fields[f].name);
                                        off += (size_t) pools[p].type * sizeof(gm_stat_t);
                                } else
                                        snprintf(name, sizeof(name), "%s.%s", grp->name, fields[f].name);
                                if (fn(name, off, ctx))
                                        return true;
                        }
        }
        return false;
}

void gm_stats_init(gm_stats_t *s) {
        memset(s, 0, sizeof(*s));
        s->max_split_size = -1;
}

/* Applies fn to every gm_stat_t of s (pooled and single). */
static void for_each_stat(gm_stats_t *s, void (*fn)(gm_stat_t *stat)) {
        for (size_t g = 0; g < N_GROUPS; g++) {
                if (groups[g].kind == GROUP_POOLED)
                        for (int t = 0; t < _GM_STAT_TYPE_MAX; t++)
                                fn(stat_at(s, &groups[g], (gm_stat_type_t) t));
                else if (groups[g].kind == GROUP_SINGLE)
                        fn(stat_at(s, &groups[g], GM_STAT_ALL));
        }
}

static void reset_peak(gm_stat_t *stat) {
        stat->peak = stat->current;
}

static void reset_accumulated(gm_stat_t *stat) {
        stat->allocated = 0;
        stat->freed = 0;
}

void gm_stats_reset_peak(gm_stats_t *s) {
        for_each_stat(s, reset_peak);
}

void gm_stats_reset_accumulated(gm_stats_t *s) {
        for_each_stat(s, reset_accumulated);
        for (size_t g = 0; g < N_GROUPS; g++)
                if (groups[g].kind == GROUP_COUNTER)
                        memset((char *) s + groups[g].offset, 0, sizeof(int64_t));
}

void gm_stats_subtract_accumulated(gm_stats_t *s, const gm_stats_t *base) {
        for (size_t g = 0; g < N_GROUPS; g++) {
                const group_t *grp = &groups[g];
                if (grp->kind == GROUP_COUNTER) {
                        int64_t v = value_at(s, grp->offset) - value_at(base, grp->offset);
                        memcpy((char *) s + grp->offset, &v, sizeof(v));
                        continue;
                }
                if (grp->kind == GROUP_SETTING)
                        continue;
                size_t n = grp->kind == GROUP_POOLED ? _GM_STAT_TYPE_MAX : 1;
                for (size_t t = 0; t < n; t++) {
                        stat_at(s, grp, (gm_stat_type_t) t)->allocated -=
                                cstat_at(base, grp, (gm_stat_type_t) t)->allocated;
                        stat_at(s, grp, (gm_stat_type_t) t)->freed -= cstat_at(base, grp, (gm_stat_type_t) t)->freed;
                }
        }
}

typedef struct visit_ctx {
        const gm_stats_t *stats;
        gm_stats_visit_fn fn;
        void *userdata;
} visit_ctx_t;

static bool visit_key(const char *name, size_t offset, void *ctx) {
        visit_ctx_t *v = ctx;

        v->fn(name, value_at(v->stats, offset), v->userdata);
        return false;
}

void gm_stats_foreach(const gm_stats_t *s, gm_stats_visit_fn fn, void *userdata) {
        visit_ctx_t v = {.stats = s, .fn = fn, .userdata = userdata};

        for_each_key(visit_key, &v);
}

typedef struct find_ctx {
        const char *name;
        size_t offset;
} find_ctx_t;

static bool match_key(const char *name, size_t offset, void *ctx) {
        find_ctx_t *f = ctx;

        if (strcmp(name, f->name) != 0)
                return false;
        f->offset = offset;
        return true;
}

/* The offset of key `name`'s int64_t in gm_stats_t, or -ENOENT. */
static int find_key(const char *name, size_t *ret_offset) {
        find_ctx_t f = {.name = name};

        if (!name || !for_each_key(match_key, &f))
                return -ENOENT;
        *ret_offset = f.offset;
        return 0;
}

int gm_stats_get(const gm_stats_t *s, const char *name, int64_t *ret_value) {
        size_t off;
        int r = find_key(name, &off);

        if (r < 0)
                return r;
        *ret_value = value_at(s, off);
        return 0;
}

int gm_stats_set(gm_stats_t *s, const char *name, int64_t value) {
        size_t off;
        int r = find_key(name, &off);

        if (r < 0)
                return r;
        memcpy((char *) s + off, &value, sizeof(value));
        return 0;
}

/* Python's floor division (memory_summary() uses //). */
static int64_t floor_div(int64_t a, int64_t b) {
        int64_t q = a / b;

        return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* One 10-character summary cell (wider only for huge values, as in Python):
 * the unit advances while the reference value (the `all` row of the column)
 * is at least 768 KiB (bytes) or 750 K (counts). The reference is tracked as
 * a double after the first division, as Python's `/=` does. */
static void format_cell(char *out, size_t out_len, int64_t value, int64_t ref, bool bytes) {
        static const char *const byte_units[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
        static const char *const count_units[] = {" ", "K", "M"};
        const char *const *units = bytes ? byte_units : count_units;
        size_t n_units = bytes ? 6 : 3, u = 0;
        int64_t base = bytes ? 1024 : 1000;
        double threshold = bytes ? 768.0 * 1024 : 750.0 * 1000, pref = (double) ref;

        while (u + 1 < n_units && pref >= threshold) {
                value = floor_div(value, base);
                pref /= (double) base;
                u++;
        }
        if (bytes)
                snprintf(out, out_len, "%6" PRId64 " %s", value, units[u]);
        else
                snprintf(out, out_len, "%7" PRId64 " %s ", value, units[u]);
}

typedef struct out {
        char *buf;
        size_t len, cap;
        bool overflow;
} out_t;

/* Appends "|<formatted line>|\n". */
__attribute__((format(printf, 2, 3))) static void put_line(out_t *o, const char *fmt, ...) {
        char line[256];
        va_list ap;
        int n;

        va_start(ap, fmt);
        n = vsnprintf(line, sizeof(line), fmt, ap);
        va_end(ap);
        if (n < 0 || (size_t) n >= sizeof(line))
                n = (int) sizeof(line) - 1;
        if (o->overflow || o->len + (size_t) n + 3 >= o->cap) {
                o->overflow = true;
                return;
        }
        o->len += (size_t) snprintf(o->buf + o->len, o->cap - o->len, "|%s|\n", line);
}

static void put_row(out_t *o, const char *label, const gm_stat_t *st, const gm_stat_t *ref, bool bytes) {
        char c[32], p[32], a[32], f[32];

        format_cell(c, sizeof(c), st->current, ref->current, bytes);
        format_cell(p, sizeof(p), st->peak, ref->peak, bytes);
        format_cell(a, sizeof(a), st->allocated, ref->allocated, bytes);
        format_cell(f, sizeof(f), st->freed, ref->freed, bytes);
        put_line(o, " %-21s | %s | %s | %s | %s ", label, c, p, a, f);
}

int gm_stats_summary(const gm_stats_t *s, int device, bool abbreviated, char *buf, size_t buf_len) {
        static const char eq[] = "===========================================================================";
        static const char dash[] = "---------------------------------------------------------------------------";
        out_t o = {.buf = buf, .cap = buf_len};

        _Static_assert(sizeof(eq) == 76 && sizeof(dash) == 76, "summary rows are 75 characters");
        put_line(&o, "%s", eq);
        put_line(&o, " %16s PyTorch CUDA memory summary, device ID %-17d ", "", device);
        put_line(&o, "%s", dash);
        put_line(&o, "  %9s CUDA OOMs: %-12" PRId64 " | %6s cudaMalloc retries: %-8" PRId64 "  ", "", s->num_ooms, "",
                 s->num_alloc_retries);
        put_line(&o, "%s", eq);
        put_line(&o, "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");
        for (int row = 1; row <= N_SUMMARY_ROWS; row++)
                for (size_t g = 0; g < N_GROUPS; g++) {
                        const group_t *grp = &groups[g];
                        const gm_stat_t *all = cstat_at(s, grp, GM_STAT_ALL);

                        if (grp->summary_row != row)
                                continue;
                        put_line(&o, "%s", dash);
                        put_row(&o, grp->label, all, all, grp->bytes);
                        if (grp->kind == GROUP_POOLED && !abbreviated) {
                                put_row(&o, "      from large pool", cstat_at(s, grp, GM_STAT_LARGE_POOL), all,
                                        grp->bytes);
                                put_row(&o, "      from small pool", cstat_at(s, grp, GM_STAT_SMALL_POOL), all,
                                        grp->bytes);
                        }
                }
        put_line(&o, "%s", eq);
        if (o.overflow)
                return -ENOSPC;
        return (int) o.len;
}
