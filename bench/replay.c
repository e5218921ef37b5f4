/* gpumem-replay: replays allocation traces through gpumemd's allocator and
 * prints one JSON object per trace on stdout.
 *
 * In process (default) each trace runs on a fresh gm_heap_t over the in-memory
 * test provider (tests/lib/fake_provider.c) with --capacity bytes; gm_heap_check()
 * runs at the end (and every N events with --check) and the provider's ledger
 * must balance. With page reuse (gpumemd_page_reuse:True) the page moves are
 * counted, and one extra, untimed-for-ns_per_op run times every allocation
 * to compare those that moved pages with those that did not. With --socket
 * the same events go through a running gpumemd via libgpumem, one session per
 * run.
 *
 * A trace is read and validated completely before it is replayed, so the timed
 * loop does no parsing: every allocation gets a dense slot, and every free
 * names the slot of its allocation. Exit status: 0 ok, 1 integrity violation
 * or replay failure, 2 usage error or malformed trace. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "allocator.h"
#include "fake_provider.h"
#include "gpumem/gpumem.h"
#include "json.h"
#include "size.h"
#include "u64map.h"

#define EXIT_VIOLATION 1
#define EXIT_USAGE 2
#define SKIPPED UINT32_MAX /* idmap value of a skipped (size 0) allocation */

typedef struct event {
        uint64_t size;   /* requested bytes of the allocation (a free repeats it) */
        uint32_t slot;   /* the allocation this event creates or frees */
        uint32_t stream; /* renamed: 0 stays 0, others become 1, 2, ... by first use */
        bool alloc;
} event_t;

typedef struct trace {
        const char *path;
        const char *format; /* "csv" or "rmm" */
        event_t *events;
        size_t n_events, cap_events;
        uint32_t n_slots;
        uint64_t skipped; /* rows not replayed: RMM allocate failures, size-0 allocations and their frees */
} trace_t;

typedef struct options {
        const char *alloc_conf;
        gm_alloc_config_t config;
        uint64_t capacity;
        const char *socket;
        uint64_t check_every; /* 0 = only at the end */
        unsigned runs;
} options_t;

typedef struct move_timing {
        uint64_t moving_allocs, other_allocs; /* allocations that moved pages / that did not */
        double moving_ns, other_ns;           /* their summed wall times */
} move_timing_t;

typedef struct result {
        int64_t peak_requested, peak_allocated, peak_reserved;
        int64_t num_alloc_retries, num_ooms;
        uint64_t allocs; /* allocation events replayed */
        uint64_t failed_allocs;
        gm_page_reuse_info_t reuse; /* in process only */
        move_timing_t moves;        /* the timing run's, with page reuse */
        double ns;                  /* median over the runs of the replay loop's wall time */
        int violations;             /* summed over the runs */
} result_t;

/* A trace's uint64 ids (pointers, stream values) to a uint32, over the
 * common map (values stored as integers in the pointer slot). */
typedef gm_u64map_t idmap_t;

static bool idmap_get(const idmap_t *m, uint64_t key, uint32_t *ret_value) {
        void *v;
        if (!gm_u64map_find(m, key, &v))
                return false;
        *ret_value = (uint32_t) (uintptr_t) v;
        return true;
}

static int idmap_put(idmap_t *m, uint64_t key, uint32_t value) {
        return gm_u64map_put(m, key, (void *) (uintptr_t) value);
}

static void idmap_remove(idmap_t *m, uint64_t key) {
        gm_u64map_remove(m, key);
}

static void idmap_done(idmap_t *m) {
        gm_u64map_done(m);
}

/* Parses all of `s` as an unsigned number in `base` (10 or 16; "0x" allowed for 16). */
static bool parse_u64(const char *s, int base, uint64_t *ret_value) {
        unsigned long long v;
        char *end;

        if (base == 16 && (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')))
                s += 2;
        if (!*s || !(base == 16 ? strchr("0123456789abcdefABCDEF", *s) : strchr("0123456789", *s)))
                return false;
        errno = 0;
        v = strtoull(s, &end, base);
        if (errno || *end)
                return false;
        *ret_value = v;
        return true;
}

/* A stream is hexadecimal with a 0x prefix (RMM logs pointers), else decimal. */
static bool parse_stream(const char *s, uint64_t *ret_value) {
        return parse_u64(s, s[0] == '0' && (s[1] == 'x' || s[1] == 'X') ? 16 : 10, ret_value);
}

/* Splits `line` in place at commas into at most `max` trimmed fields; returns the count. */
static size_t split_fields(char *line, char **fields, size_t max) {
        size_t n = 0;

        for (char *p = line;; p++) {
                char *end = strchr(p, ',');

                if (n == max)
                        return max + 1;
                if (end)
                        *end = '\0';
                while (*p == ' ' || *p == '\t')
                        p++;
                fields[n] = p;
                for (char *e = p + strlen(p); e > p && strchr(" \t\r\n", e[-1]); e--)
                        e[-1] = '\0';
                n++;
                if (!end)
                        return n;
                p = end;
        }
}

static int bad_line(const trace_t *t, size_t lineno, const char *what, const char *field) {
        fprintf(stderr, "gpumem-replay: %s:%zu: %s%s%s%s\n", t->path, lineno, what, field ? " '" : "",
                field ? field : "", field ? "'" : "");
        return -EINVAL;
}

static int push_event(trace_t *t, event_t ev) {
        if (t->n_events == t->cap_events) {
                size_t cap = t->cap_events ? 2 * t->cap_events : 4096;
                event_t *e = realloc(t->events, cap * sizeof(*e));

                if (!e)
                        return -ENOMEM;
                t->events = e;
                t->cap_events = cap;
        }
        t->events[t->n_events++] = ev;
        return 0;
}

typedef struct parser {
        trace_t *t;
        idmap_t live;    /* trace id -> event index of its live allocation (SKIPPED: size 0) */
        idmap_t streams; /* stream value -> renamed stream */
} parser_t;

/* One allocation or free of a trace, validated against the live set. */
static int add_row(parser_t *p, size_t lineno, bool alloc, uint64_t id, uint64_t size, uint64_t stream) {
        trace_t *t = p->t;
        uint32_t idx, renamed;
        event_t ev;
        int r;

        if (t->n_events >= SKIPPED)
                return bad_line(t, lineno, "too many events", NULL);
        if (!alloc) {
                if (!idmap_get(&p->live, id, &idx))
                        return bad_line(t, lineno, "free of an id that is not live", NULL);
                idmap_remove(&p->live, id);
                if (idx == SKIPPED) {
                        t->skipped++;
                        return 0;
                }
                ev = t->events[idx];
                ev.alloc = false;
                return push_event(t, ev);
        }
        if (idmap_get(&p->live, id, &idx))
                return bad_line(t, lineno, "allocation of an id that is still live", NULL);
        if (size == 0) { /* PyTorch hands out no block for size 0 */
                t->skipped++;
                return idmap_put(&p->live, id, SKIPPED);
        }
        if (!idmap_get(&p->streams, stream, &renamed)) {
                renamed = stream == 0 ? 0 : (uint32_t) p->streams.len + 1;
                r = idmap_put(&p->streams, stream, renamed);
                if (r < 0)
                        return r;
        }
        r = idmap_put(&p->live, id, (uint32_t) t->n_events);
        if (r < 0)
                return r;
        return push_event(t, (event_t){.size = size, .slot = t->n_slots++, .stream = renamed, .alloc = true});
}

/* Our CSV: seq,action,id,size[,stream]. */
static int parse_csv_row(parser_t *p, size_t lineno, char **f, size_t n, size_t ncols) {
        uint64_t seq, id, size = 0, stream = 0; /* a free may leave size empty */
        bool alloc;

        if (n != ncols)
                return bad_line(p->t, lineno, ncols == 5 ? "expected 5 fields" : "expected 4 fields", NULL);
        if (!parse_u64(f[0], 10, &seq))
                return bad_line(p->t, lineno, "bad seq", f[0]);
        if (strcmp(f[1], "alloc") != 0 && strcmp(f[1], "free") != 0)
                return bad_line(p->t, lineno, "action must be alloc or free, not", f[1]);
        alloc = f[1][0] == 'a';
        if (!parse_u64(f[2], 10, &id))
                return bad_line(p->t, lineno, "bad id", f[2]);
        if (!parse_u64(f[3], 10, &size) && !(!alloc && f[3][0] == '\0'))
                return bad_line(p->t, lineno, "bad size", f[3]);
        if (ncols == 5 && !parse_stream(f[4], &stream))
                return bad_line(p->t, lineno, "bad stream", f[4]);
        return add_row(p, lineno, alloc, id, size, stream);
}

/* RMM's logging_resource_adaptor: Thread,Time,Action,Pointer,Size,Stream. */
static int parse_rmm_row(parser_t *p, size_t lineno, char **f, size_t n) {
        uint64_t ptr, size, stream;
        bool alloc;

        if (n != 6)
                return bad_line(p->t, lineno, "expected 6 fields", NULL);
        if (!f[0][0] || !f[1][0])
                return bad_line(p->t, lineno, "empty Thread or Time", NULL);
        if (strcmp(f[2], "allocate failure") == 0) {
                p->t->skipped++;
                return 0;
        }
        alloc = strcmp(f[2], "allocate") == 0;
        if (!alloc && strcmp(f[2], "free") != 0 && strcmp(f[2], "deallocate") != 0)
                return bad_line(p->t, lineno, "action must be allocate, free or allocate failure, not", f[2]);
        if (!parse_u64(f[3], 16, &ptr))
                return bad_line(p->t, lineno, "bad pointer", f[3]);
        if (!parse_u64(f[4], 10, &size))
                return bad_line(p->t, lineno, "bad size", f[4]);
        if (!parse_stream(f[5], &stream))
                return bad_line(p->t, lineno, "bad stream", f[5]);
        if (ptr == 0) { /* allocate(0) may log a null pointer; freeing null is a no-op */
                if (alloc && size != 0)
                        return bad_line(p->t, lineno, "null pointer for a non-empty allocation", NULL);
                p->t->skipped++;
                return 0;
        }
        return add_row(p, lineno, alloc, ptr, size, stream);
}

static void trace_done(trace_t *t) {
        free(t->events);
        *t = (trace_t){0};
}

/* Reads and validates a whole trace; on failure reports the line on stderr.
 * On success the caller owns *ret_trace (trace_done()). */
static int trace_load(const char *path, trace_t *ret_trace) {
        trace_t trace = {.path = path}, *t = &trace;
        parser_t p = {.t = t};
        char *line = NULL, *f[8];
        size_t len = 0, lineno = 0, ncols = 0;
        FILE *in;
        int r = 0;

        in = fopen(path, "re");
        if (!in) {
                r = -errno;
                fprintf(stderr, "gpumem-replay: %s: %s\n", path, strerror(-r));
                return r;
        }
        while (getline(&line, &len, in) >= 0) {
                size_t n;

                lineno++;
                n = split_fields(line, f, 7);
                if (n == 1 && f[0][0] == '\0')
                        continue;
                if (!t->format) {
                        if (lineno == 1 && strncmp(f[0], "\xef\xbb\xbf", 3) == 0)
                                f[0] += 3;
                        if (n == 6 && !strcmp(f[0], "Thread") && !strcmp(f[1], "Time") && !strcmp(f[2], "Action") &&
                            !strcmp(f[3], "Pointer") && !strcmp(f[4], "Size") && !strcmp(f[5], "Stream")) {
                                t->format = "rmm";
                        } else if ((n == 4 || (n == 5 && !strcmp(f[4], "stream"))) && !strcmp(f[0], "seq") &&
                                   !strcmp(f[1], "action") && !strcmp(f[2], "id") && !strcmp(f[3], "size")) {
                                t->format = "csv";
                                ncols = n;
                        } else {
                                r = bad_line(t, lineno,
                                             "unknown header: expected seq,action,id,size[,stream] or "
                                             "Thread,Time,Action,Pointer,Size,Stream",
                                             NULL);
                                break;
                        }
                        continue;
                }
                r = ncols ? parse_csv_row(&p, lineno, f, n, ncols) : parse_rmm_row(&p, lineno, f, n);
                if (r < 0)
                        break;
        }
        if (r == 0 && ferror(in)) {
                fprintf(stderr, "gpumem-replay: %s: read error\n", path);
                r = -EIO;
        }
        if (r == 0 && !t->format) {
                fprintf(stderr, "gpumem-replay: %s: empty file: no header\n", path);
                r = -EINVAL;
        }
        if (r == -ENOMEM)
                fprintf(stderr, "gpumem-replay: %s: out of memory\n", path);
        free(line);
        fclose(in);
        idmap_done(&p.live);
        idmap_done(&p.streams);
        if (r < 0)
                trace_done(t);
        else
                *ret_trace = trace;
        return r;
}

static int violation(const trace_t *t, const char *what, long long a, long long b) {
        fprintf(stderr, "gpumem-replay: %s: violation: %s (%lld vs %lld)\n", t->path, what, a, b);
        return 1;
}

/* One in-process run on a fresh heap: stores the wall time of the replay loop
 * (heap checks excluded) in *ret_ns, the run's figures in r, and adds its
 * integrity violations to r->violations. With `timing`, every allocation is
 * timed on its own into r->moves (and *ret_ns carries that overhead). Fails
 * only when the heap does (not on a refused allocation, which is counted). */
static int replay_heap(const trace_t *t, const options_t *o, bool timing, result_t *r, double *ret_ns) {
        uint64_t cursor = 1ULL << 40, *ids = calloc(t->n_slots ? t->n_slots : 1, sizeof(*ids));
        gm_heap_params_t params = {.capacity = o->capacity, .va_cursor = &cursor};
        int64_t live_requested = 0, live_blocks = 0;
        fake_provider_t fake;
        gm_provider_t prov;
        const gm_stats_t *st;
        gm_heap_t *h;
        double ns = 0, t0;
        int e;

        if (!ids)
                return -ENOMEM;
        fake_init(&fake, o->capacity);
        fake.no_overlap_check = true; /* gm_heap_check() sees doubly mapped pages */
        prov = fake_provider(&fake);
        prov.trace = NULL; /* nothing to record: keeps the timed path lean */
        e = gm_heap_new(&o->config, &prov, &params, &h);
        if (e < 0) {
                free(ids);
                fake_done(&fake);
                return e;
        }
        t0 = gm_now_ns();
        for (size_t i = 0; i < t->n_events; i++) {
                const event_t *ev = &t->events[i];
                gm_alloc_result_t res;

                if (o->check_every && i > 0 && i % o->check_every == 0) {
                        int bad;

                        ns += gm_now_ns() - t0;
                        bad = gm_heap_check(h);
                        if (bad)
                                r->violations += violation(t, "gm_heap_check during replay", bad, 0);
                        t0 = gm_now_ns();
                }
                if (!ev->alloc) {
                        if (!ids[ev->slot])
                                continue; /* its allocation failed */
                        e = gm_heap_free(h, ids[ev->slot], false);
                        if (e < 0)
                                break;
                        live_requested -= (int64_t) ev->size;
                        live_blocks--;
                        continue;
                }
                r->allocs++;
                if (timing) {
                        uint64_t moved = r->reuse.pages_moved;
                        double a0 = (double) gm_now_ns();

                        e = gm_heap_alloc(h, ev->size, ev->stream, &res);
                        a0 = (double) gm_now_ns() - a0;
                        gm_heap_page_reuse(h, &r->reuse);
                        if (r->reuse.pages_moved != moved) {
                                r->moves.moving_allocs++;
                                r->moves.moving_ns += a0;
                        } else {
                                r->moves.other_allocs++;
                                r->moves.other_ns += a0;
                        }
                } else
                        e = gm_heap_alloc(h, ev->size, ev->stream, &res);
                if (e == -ENOMEM || e == -EDQUOT) {
                        r->failed_allocs++;
                        e = 0;
                        continue;
                }
                if (e < 0)
                        break;
                ids[ev->slot] = res.block_id;
                live_requested += (int64_t) ev->size;
                live_blocks++;
        }
        ns += gm_now_ns() - t0;
        st = gm_heap_stats(h);
        r->peak_requested = st->requested_bytes[GM_STAT_ALL].peak;
        r->peak_allocated = st->allocated_bytes[GM_STAT_ALL].peak;
        r->peak_reserved = st->reserved_bytes[GM_STAT_ALL].peak;
        r->num_alloc_retries = st->num_alloc_retries;
        r->num_ooms = st->num_ooms;
        gm_heap_page_reuse(h, &r->reuse);
        if (e == 0 && r->reuse.pages_moved != fake.remaps)
                r->violations += violation(t, "pages moved != provider's remaps", (long long) r->reuse.pages_moved,
                                           (long long) fake.remaps);
        if (e == 0) {
                int bad = gm_heap_check(h);

                if (bad)
                        r->violations += violation(t, "gm_heap_check at the end", bad, 0);
                if (st->requested_bytes[GM_STAT_ALL].current != live_requested)
                        r->violations += violation(t, "requested_bytes.all.current != live requested bytes",
                                                   st->requested_bytes[GM_STAT_ALL].current, live_requested);
                if (st->allocation[GM_STAT_ALL].current != live_blocks ||
                    gm_heap_live_blocks(h) != (uint64_t) live_blocks)
                        r->violations += violation(t, "allocation.all.current != live blocks",
                                                   st->allocation[GM_STAT_ALL].current, live_blocks);
                if (st->reserved_bytes[GM_STAT_ALL].current != (int64_t) fake.live_bytes)
                        r->violations +=
                                violation(t, "reserved_bytes.all.current != provider's live bytes",
                                          st->reserved_bytes[GM_STAT_ALL].current, (long long) fake.live_bytes);
        }
        gm_heap_destroy(h);
        if (e == 0 && (fake.errors || fake.live_handles))
                r->violations += violation(t, "provider ledger after destroy: errors, live handles",
                                           (long long) fake.errors, (long long) fake.live_handles);
        fake_done(&fake);
        free(ids);
        if (e == 0)
                *ret_ns = ns;
        return e;
}

static int client_stat(gpumem_client *c, const char *name, int64_t *ret_value) {
        int e = gpumem_stat(c, name, ret_value);

        if (e < 0)
                fprintf(stderr, "gpumem-replay: gpumem_stat(%s): %s\n", name, gpumem_strerror(e));
        return e;
}

/* One run through a daemon session; same contract as replay_heap(). */
static int replay_socket(const trace_t *t, const options_t *o, result_t *r, double *ret_ns) {
        void **ptrs = calloc(t->n_slots ? t->n_slots : 1, sizeof(*ptrs));
        int64_t live_requested = 0, current = 0;
        gpumem_client *c;
        double t0, ns;
        int e;

        if (!ptrs)
                return -ENOMEM;
        e = gpumem_connect(o->socket, &c);
        if (e < 0) {
                fprintf(stderr, "gpumem-replay: cannot connect to %s: %s\n", o->socket, gpumem_strerror(e));
                free(ptrs);
                return e;
        }
        t0 = gm_now_ns();
        for (size_t i = 0; i < t->n_events && e == 0; i++) {
                const event_t *ev = &t->events[i];

                if (!ev->alloc) {
                        if (ptrs[ev->slot]) {
                                e = gpumem_free(c, ptrs[ev->slot]);
                                ptrs[ev->slot] = NULL;
                                live_requested -= (int64_t) ev->size;
                        }
                        continue;
                }
                r->allocs++;
                e = gpumem_alloc(c, ev->size, ev->stream, &ptrs[ev->slot]);
                if (e == 0)
                        live_requested += (int64_t) ev->size;
                if (e == -ENOMEM || e == -EDQUOT) {
                        r->failed_allocs++;
                        e = 0;
                }
        }
        ns = gm_now_ns() - t0;
        if (e < 0)
                fprintf(stderr, "gpumem-replay: %s: %s: %s\n", t->path, gpumem_strerror(e), gpumem_last_error(c));
        if (e == 0)
                e = client_stat(c, "requested_bytes.all.peak", &r->peak_requested);
        if (e == 0)
                e = client_stat(c, "allocated_bytes.all.peak", &r->peak_allocated);
        if (e == 0)
                e = client_stat(c, "reserved_bytes.all.peak", &r->peak_reserved);
        if (e == 0)
                e = client_stat(c, "num_alloc_retries", &r->num_alloc_retries);
        if (e == 0)
                e = client_stat(c, "num_ooms", &r->num_ooms);
        if (e == 0)
                e = client_stat(c, "requested_bytes.all.current", &current);
        if (e == 0 && current != live_requested)
                r->violations += violation(t, "session requested_bytes.all.current != live requested bytes", current,
                                           live_requested);
        gpumem_disconnect(c);
        free(ptrs);
        if (e == 0)
                *ret_ns = ns;
        return e;
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;

        return (x > y) - (x < y);
}

/* Runs the trace o->runs times; r gets the last run's figures and the median time. */
static int replay(const trace_t *t, const options_t *o, result_t *ret_result) {
        double *times = calloc(o->runs, sizeof(*times));
        result_t r = {0};
        int e = 0;

        if (!times)
                return -ENOMEM;
        for (unsigned k = 0; k < o->runs && e == 0; k++) {
                int violations = r.violations;

                r = (result_t){.violations = violations};
                e = o->socket ? replay_socket(t, o, &r, &times[k]) : replay_heap(t, o, false, &r, &times[k]);
        }
        if (e == 0 && !o->socket && o->config.page_reuse) {
                result_t timed = {0};
                double ignored;

                e = replay_heap(t, o, true, &timed, &ignored);
                r.moves = timed.moves;
                r.violations += timed.violations;
        }
        if (e == 0) {
                qsort(times, o->runs, sizeof(*times), cmp_double);
                r.ns = o->runs % 2 ? times[o->runs / 2] : (times[o->runs / 2 - 1] + times[o->runs / 2]) / 2;
                *ret_result = r;
        }
        free(times);
        return e;
}

static void print_json_string(const char *s) {
        gm_json_print_string(stdout, s);
}

static double per(double total, uint64_t n) {
        return n ? total / (double) n : 0.0;
}

/* null unless page reuse is configured (in process); else the heap's move
 * counters and the timing run's mean allocation times with and without moves. */
static void print_page_reuse(const options_t *o, const result_t *r) {
        const gm_page_reuse_info_t *u = &r->reuse;

        if (o->socket || !o->config.page_reuse) {
                printf("null");
                return;
        }
        printf("{\"active\":%s,\"pages_moved\":%llu,\"ranges_moved\":%llu,\"allocs_with_moves\":%llu",
               u->active ? "true" : "false", (unsigned long long) u->pages_moved, (unsigned long long) u->ranges_moved,
               (unsigned long long) u->allocs_with_moves);
        printf(",\"moves_per_1k_allocs\":%.2f,\"refused_busy\":%llu,\"remap_failures\":%llu",
               1000.0 * per((double) u->pages_moved, r->allocs), (unsigned long long) u->refused_busy,
               (unsigned long long) u->remap_failures);
        printf(",\"moving_alloc_ns\":%.1f,\"other_alloc_ns\":%.1f,\"moving_allocs_ns_total\":%.0f}",
               per(r->moves.moving_ns, r->moves.moving_allocs), per(r->moves.other_ns, r->moves.other_allocs),
               r->moves.moving_ns);
}

static void print_result(const trace_t *t, const options_t *o, const result_t *r) {
        const char *base = strrchr(t->path, '/');

        printf("{\"trace\":");
        print_json_string(base ? base + 1 : t->path);
        printf(",\"format\":\"%s\",\"target\":\"%s\",\"alloc_conf\":", t->format, o->socket ? "socket" : "heap");
        if (o->socket)
                printf("null,\"capacity_bytes\":null");
        else {
                print_json_string(o->alloc_conf);
                printf(",\"capacity_bytes\":%llu", (unsigned long long) o->capacity);
        }
        printf(",\"events\":%zu,\"skipped\":%llu,\"failed_allocs\":%llu", t->n_events, (unsigned long long) t->skipped,
               (unsigned long long) r->failed_allocs);
        printf(",\"peak_requested_bytes\":%lld,\"peak_allocated_bytes\":%lld,\"peak_reserved_bytes\":%lld",
               (long long) r->peak_requested, (long long) r->peak_allocated, (long long) r->peak_reserved);
        if (r->peak_requested > 0)
                printf(",\"fragmentation\":%.4f", (double) r->peak_reserved / (double) r->peak_requested);
        else
                printf(",\"fragmentation\":null");
        printf(",\"allocs\":%llu,\"page_reuse\":", (unsigned long long) r->allocs);
        print_page_reuse(o, r);
        printf(",\"num_alloc_retries\":%lld,\"num_ooms\":%lld,\"runs\":%u,\"ns_per_op\":%.1f,\"violations\":%d}\n",
               (long long) r->num_alloc_retries, (long long) r->num_ooms, o->runs,
               t->n_events ? r->ns / (double) t->n_events : 0.0, r->violations);
        fflush(stdout);
}

static void usage(FILE *out) {
        fprintf(out, "Usage: gpumem-replay [OPTIONS] TRACE...\n"
                     "Replays allocation traces through gpumemd's allocator; one JSON line per trace.\n"
                     "Traces: CSV 'seq,action,id,size[,stream]' (alloc|free) or RMM's replay log\n"
                     "'Thread,Time,Action,Pointer,Size,Stream', told apart by the header line.\n"
                     "  -a, --alloc-conf STR   PYTORCH_CUDA_ALLOC_CONF-style settings (in process); with\n"
                     "                         gpumemd_page_reuse:True the JSON's page_reuse has the moves\n"
                     "  -C, --capacity BYTES   provider capacity in process (8G, 512M; default 80G)\n"
                     "  -s, --socket PATH      replay through the gpumemd listening on PATH\n"
                     "  -c, --check N          also run gm_heap_check() every N events (in process)\n"
                     "  -r, --runs N           replay each trace N times; ns_per_op is the median (default 1)\n"
                     "  -h, --help             this text\n"
                     "Exit status: 0 ok, 1 integrity violation or replay failure, 2 usage or trace error.\n");
}

static int parse_options(int argc, char **argv, options_t *o) {
        static const struct option longopts[] = {
                {"alloc-conf", required_argument, NULL, 'a'},
                {"capacity", required_argument, NULL, 'C'},
                {"socket", required_argument, NULL, 's'},
                {"check", required_argument, NULL, 'c'},
                {"runs", required_argument, NULL, 'r'},
                {"help", no_argument, NULL, 'h'},
                {0},
        };
        char err[256] = "";
        uint64_t v;
        int ch;

        *o = (options_t){.alloc_conf = "", .capacity = 80ULL << 30, .runs = 1};
        while ((ch = getopt_long(argc, argv, "a:C:s:c:r:h", longopts, NULL)) >= 0)
                switch (ch) {
                case 'a':
                        o->alloc_conf = optarg;
                        break;
                case 'C':
                        if (gm_parse_size(optarg, &o->capacity) < 0 || o->capacity == 0) {
                                fprintf(stderr, "gpumem-replay: invalid --capacity '%s'\n", optarg);
                                return -EINVAL;
                        }
                        break;
                case 's':
                        o->socket = optarg;
                        break;
                case 'c':
                case 'r':
                        if (!parse_u64(optarg, 10, &v) || v == 0 || (ch == 'r' && v > 1000)) {
                                fprintf(stderr, "gpumem-replay: invalid --%s '%s'\n", ch == 'c' ? "check" : "runs",
                                        optarg);
                                return -EINVAL;
                        }
                        if (ch == 'c')
                                o->check_every = v;
                        else
                                o->runs = (unsigned) v;
                        break;
                case 'h':
                        usage(stdout);
                        exit(0);
                default:
                        usage(stderr);
                        return -EINVAL;
                }
        if (optind >= argc) {
                usage(stderr);
                return -EINVAL;
        }
        if (o->socket && (o->alloc_conf[0] || o->check_every)) {
                fprintf(stderr, "gpumem-replay: --alloc-conf and --check apply in process only; the daemon has "
                                "its own alloc_conf\n");
                return -EINVAL;
        }
        if (gm_alloc_config_parse(o->alloc_conf, &o->config, err, sizeof(err)) < 0) {
                fprintf(stderr, "gpumem-replay: invalid --alloc-conf '%s': %s\n", o->alloc_conf, err);
                return -EINVAL;
        }
        return 0;
}

int main(int argc, char **argv) {
        options_t o;
        int status = 0;

        if (parse_options(argc, argv, &o) < 0)
                return EXIT_USAGE;
        for (int i = optind; i < argc; i++) {
                trace_t t = {0};
                result_t r = {0};
                int e = trace_load(argv[i], &t);

                if (e < 0)
                        return EXIT_USAGE;
                e = replay(&t, &o, &r);
                if (e < 0) {
                        fprintf(stderr, "gpumem-replay: %s: replay failed: %s\n", t.path, strerror(-e));
                        trace_done(&t);
                        return EXIT_VIOLATION;
                }
                print_result(&t, &o, &r);
                if (r.violations)
                        status = EXIT_VIOLATION;
                trace_done(&t);
        }
        return status;
}
