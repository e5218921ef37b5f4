/* gpumemctl diagnose, top and status: the daemon's sample rings
 * (gpumem_admin_samples()) read back, judged by the rules of diagnose.c and shown as a
 * verdict per process, a live table, or a one-screen summary. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "diagnose.h"
#include "gpumemctl.h"
#include "json.h"
#include "json_read.h"
#include "samples.h"
#include "size.h"
#include "text.h"

/* The window `top` shows trends over by default, and the default of diagnose. */
#define TOP_WINDOW_MS 10000u
#define DIAGNOSE_WINDOW_MS 60000u

/* Asks for the samples; *ret_set is freed with gpumem_sample_set_free(). */
static int fetch_set(ctl_t *c, uint32_t pid, const char *tenant, uint64_t window_ms, gpumem_sample_set **ret_set) {
        int r = ctl_connect(c);
        if (r)
                return r;
        r = gpumem_admin_samples(c->admin, pid, tenant, window_ms, ret_set);
        return r < 0 ? ctl_failed(c, r) : 0;
}

/* ---- who still holds it: live blocks allocated in the window ---- */

/* Live blocks grouped by the stack that allocated them. */
typedef struct holder {
        char where[256];
        uint64_t blocks, bytes;
} holder_t;

#define MAX_HOLDERS 16

typedef struct holders {
        bool history;                     /* the snapshot had trace entries of the process */
        bool any_blocks;                  /* ... and blocks (a local heap's are in its process) */
        holder_t groups[MAX_HOLDERS + 1]; /* the last: everything else */
        size_t n;
} holders_t;

typedef struct live_block {
        uint64_t address, size;
        const gm_json_t *alloc; /* its newest alloc entry */
} live_block_t;

static int by_address(const void *a, const void *b) {
        const live_block_t *x = a, *y = b;
        return x->address < y->address ? -1 : x->address > y->address;
}

static int by_bytes(const void *a, const void *b) {
        const holder_t *x = a, *y = b;
        return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

/* "file:line name < file:line name" of the first frames of a trace entry. */
static void frames_text(const gm_json_t *entry, char *buf, size_t len) {
        const gm_json_t *frames = gm_json_get(entry, "frames");
        buf[0] = '\0';
        for (size_t i = 0; frames && frames->type == GM_JSON_ARRAY && i < frames->n && i < 3; i++) {
                size_t used = strlen(buf);
                char raw[160], safe[160];
                snprintf(raw, sizeof(raw), "%s:%" PRIu64 " %s", gm_json_get_string(frames->items[i], "filename", "?"),
                         gm_json_get_uint(frames->items[i], "line", 0),
                         gm_json_get_string(frames->items[i], "name", "?"));
                snprintf(buf + used, len - used, "%s%s", i ? " < " : "", gm_text_escape(raw, safe, sizeof(safe)));
        }
        if (!buf[0])
                snprintf(buf, len, "(no stack recorded)");
}

static void count_holder(holders_t *h, const char *where, uint64_t bytes) {
        size_t i = 0;
        while (i < h->n && strcmp(h->groups[i].where, where) != 0)
                i++;
        if (i == h->n && h->n < MAX_HOLDERS)
                snprintf(h->groups[h->n++].where, sizeof(h->groups[0].where), "%s", where);
        else if (i == h->n)
                i = MAX_HOLDERS; /* everything else */
        h->groups[i].blocks++;
        h->groups[i].bytes += bytes;
}

/* The live blocks of snapshot `snap` whose newest alloc entry of process
 * `pid` is at or after since_us. */
static void holders_of(const gm_json_t *snap, uint32_t pid, uint64_t since_us, holders_t *h) {
        const gm_json_t *segments = gm_json_get(snap, "segments"), *traces = gm_json_get(snap, "device_traces");
        size_t n = 0, cap = 0;
        live_block_t *live = NULL;
        for (size_t i = 0; segments && segments->type == GM_JSON_ARRAY && i < segments->n; i++) {
                const gm_json_t *seg = segments->items[i], *blocks = gm_json_get(seg, "blocks");
                if (gm_json_get_uint(seg, "pid", 0) != pid || !blocks || blocks->type != GM_JSON_ARRAY)
                        continue;
                for (size_t k = 0; k < blocks->n; k++) {
                        const gm_json_t *b = blocks->items[k];
                        h->any_blocks = true;
                        if (strcmp(gm_json_get_string(b, "state", ""), "active_allocated") != 0)
                                continue;
                        if (n == cap) {
                                live_block_t *more = realloc(live, (cap = cap ? 2 * cap : 64) * sizeof(*live));
                                if (!more)
                                        goto out;
                                live = more;
                        }
                        live[n++] = (live_block_t){.address = gm_json_get_uint(b, "address", 0),
                                                   .size = gm_json_get_uint(b, "size", 0)};
                }
        }
        if (n)
                qsort(live, n, sizeof(*live), by_address);
        /* The history is the last list of device_traces, oldest first: walk it newest first. */
        const gm_json_t *trace =
                traces && traces->type == GM_JSON_ARRAY && traces->n ? traces->items[traces->n - 1] : NULL;
        for (size_t i = trace && trace->type == GM_JSON_ARRAY ? trace->n : 0; i-- > 0;) {
                const gm_json_t *e = trace->items[i];
                if (gm_json_get_uint(e, "pid", 0) != pid)
                        continue;
                h->history = true;
                if (strcmp(gm_json_get_string(e, "action", ""), "alloc") != 0 || !n)
                        continue;
                live_block_t key = {.address = gm_json_get_uint(e, "addr", 0)};
                live_block_t *b = bsearch(&key, live, n, sizeof(*live), by_address);
                if (b && !b->alloc)
                        b->alloc = e;
        }
        for (size_t i = 0; i < n; i++) {
                if (!live[i].alloc || gm_json_get_uint(live[i].alloc, "time_us", 0) < since_us)
                        continue;
                char where[256];
                frames_text(live[i].alloc, where, sizeof(where));
                count_holder(h, where, live[i].size);
        }
        if (h->groups[MAX_HOLDERS].blocks)
                snprintf(h->groups[MAX_HOLDERS].where, sizeof(h->groups[0].where), "(other stacks)");
        qsort(h->groups, h->n, sizeof(h->groups[0]), by_bytes);
out:
        free(live);
}

/* Reads the process's snapshot (JSON) and groups its live blocks allocated
 * within the window. Returns 0 or an exit code. */
static int find_holders(ctl_t *c, uint32_t pid, uint64_t window_ms, holders_t *h) {
        *h = (holders_t){0};
        int r = ctl_connect(c);
        if (r)
                return r;
        void *data;
        size_t size;
        r = gpumem_admin_snapshot_data(c->admin, GPUMEM_SNAPSHOT_JSON, GPUMEM_SNAPSHOT_CATEGORY_NONE, pid, &data,
                                       &size);
        if (r < 0)
                return ctl_failed(c, r);
        gm_json_t *snap = NULL;
        r = size ? gm_json_parse(data, size, &snap, NULL) : -EINVAL;
        gpumem_buffer_free(data);
        if (r < 0) {
                fprintf(stderr, "gpumemctl: cannot read the snapshot: %s\n", strerror(-r));
                return EXIT_REFUSED;
        }
        uint64_t now_us = gm_realtime_us(), span_us = window_ms * 1000;
        holders_of(snap, pid, now_us > span_us ? now_us - span_us : 0, h);
        gm_json_free(snap);
        return 0;
}

/* One session's samples, unpacked (malloc'd; NULL when it has none). */
static gm_sample_t *session_samples(const gpumem_session_samples *ss, size_t *ret_n) {
        size_t stride = ss->stride, n = stride ? ss->n_samples / stride : 0;
        gm_sample_t *v = n ? calloc(n, sizeof(*v)) : NULL;
        for (size_t i = 0; v && i < n; i++)
                gm_sample_unpack(ss->samples + i * stride, stride, &v[i]);
        *ret_n = v ? n : 0;
        return v;
}

/* The process's command name (/proc/PID/comm), else what its client said. */
static void command_name(const gpumem_session_samples *ss, char *buf, size_t len) {
        char path[64], raw[64] = "";
        snprintf(path, sizeof(path), "/proc/%u/comm", ss->pid);
        FILE *f = fopen(path, "re");
        if (f) {
                if (!fgets(raw, sizeof(raw), f))
                        raw[0] = '\0';
                fclose(f);
                raw[strcspn(raw, "\n")] = '\0';
        }
        gm_text_escape(raw[0] ? raw : (ss->name ? ss->name : ""), buf, len);
}

static const char *fmt_size(uint64_t v, char *buf, size_t len) {
        return gm_format_size_as(v, GM_SIZE_COMPACT, buf, len);
}

/* A duration: "500ms", "30s", "5m", "2h", or plain seconds. */
static int parse_duration_ms(const char *s, uint64_t *ret_ms) {
        char *end = NULL;
        errno = 0;
        double v = s && s[0] >= '0' && s[0] <= '9' ? strtod(s, &end) : -1;
        if (v < 0 || errno || !end)
                return -EINVAL;
        double unit = strcmp(end, "ms") == 0                    ? 1
                      : strcmp(end, "s") == 0 || end[0] == '\0' ? 1000
                      : strcmp(end, "m") == 0                   ? 60000
                      : strcmp(end, "h") == 0                   ? 3600000
                                                                : -1;
        if (unit < 0 || v * unit > 1e15)
                return -EINVAL;
        *ret_ms = (uint64_t) (v * unit);
        return *ret_ms > 0 ? 0 : -EINVAL;
}

/* The diagnosis of one session of `set`. */
static int diagnose_session(const gpumem_sample_set *set, const gpumem_session_samples *ss, uint64_t window_ms,
                            gm_diagnosis_t *ret) {
        size_t n;
        gm_sample_t *samples = session_samples(ss, &n);
        gm_diag_input_t in = {.samples = samples, .n_samples = n, .now_ms = set->now_ms, .window_ms = window_ms};
        for (size_t i = 0; i < set->n_refusals; i++) {
                const gpumem_refusal *e = &set->refusals[i];
                int cls = gm_diag_refusal_class_of(e->reason);
                if (e->session_id != ss->session_id) {
                        in.others_refused++;
                } else if (cls >= 0) {
                        in.refusals[cls]++;
                        if (e->size > in.refused_bytes_max)
                                in.refused_bytes_max = e->size;
                }
        }
        int r = gm_diagnose(&in, ret);
        free(samples);
        return r;
}

/* ---- diagnose ---- */

static void print_text_holders(const gpumem_session_samples *ss, const holders_t *h) {
        if (!h->history || !h->any_blocks) {
                printf("    %s\n", !h->any_blocks ? "its blocks are in its own process (a local heap): its snapshot "
                                                    "(gpumem._snapshot() in it) names them"
                                                  : "memory history is off: gpumemctl history on, then diagnose "
                                                    "again, names the stacks that still hold it");
                return;
        }
        printf("    still live, allocated in the window, by the stack that allocated them:\n");
        for (size_t i = 0; i <= MAX_HOLDERS; i++) {
                const holder_t *g = &h->groups[i];
                char b[32];
                if (g->blocks && (i < h->n || i == MAX_HOLDERS))
                        printf("      %6" PRIu64 " block%s %10s  %s\n", g->blocks, g->blocks == 1 ? " " : "s",
                               gm_format_size(g->bytes, b, sizeof(b)), g->where);
        }
        if (h->n == 0)
                printf("      none (the window's allocations of pid %u were all freed)\n", ss->pid);
}

static void print_json_holders(const holders_t *h) {
        printf(", \"holders\": {\"history\": %s, \"blocks_visible\": %s, \"groups\": [", h->history ? "true" : "false",
               h->any_blocks ? "true" : "false");
        bool first = true;
        for (size_t i = 0; i <= MAX_HOLDERS; i++) {
                const holder_t *g = &h->groups[i];
                if (!g->blocks || (i >= h->n && i != MAX_HOLDERS))
                        continue;
                printf("%s{\"where\": ", first ? "" : ", ");
                gm_json_print_string(stdout, g->where);
                printf(", \"blocks\": %" PRIu64 ", \"bytes\": %" PRIu64 "}", g->blocks, g->bytes);
                first = false;
        }
        printf("]}");
}

static void print_text_diagnosis(const gpumem_session_samples *ss, const gm_diagnosis_t *d, const holders_t *h) {
        const gm_diag_figures_t *f = &d->fig;
        char cmd[64], b[8][32];
        command_name(ss, cmd, sizeof(cmd));
        printf("pid %u (%s), tenant %s, %s heap: %s\n", ss->pid, cmd, ss->tenant, ss->heap_mode,
               d->n_findings ? gm_diag_kind_title(d->findings[0].kind) : "healthy");
        printf("  allocated %s + waiting on streams %s + cached %s = reserved %s (%" PRIu64 " segments)\n",
               gm_format_size(f->allocated, b[0], 32), gm_format_size(f->pending, b[1], 32),
               gm_format_size(f->inactive, b[2], 32), gm_format_size(f->reserved, b[3], 32), f->segments);
        printf("  cached = %s pinned between live blocks (inactive split) + %s in whole idle segments\n",
               gm_format_size(f->inactive_split, b[4], 32), gm_format_size(f->idle_whole, b[5], 32));
        printf("  fragmentation ratio %.2f (%s), largest free block %s, requests up to %s, %" PRIu64
               " retries, idle %.1f s\n",
               f->frag_ratio, f->frag_band, gm_format_size(f->largest_free, b[6], 32),
               gm_format_size(f->request_max, b[7], 32), f->retries, (double) f->idle_ms / 1000.0);
        for (size_t i = 0; i < d->n_findings; i++) {
                printf("  %s: %s\n", gm_diag_kind_title(d->findings[i].kind), d->findings[i].summary);
                printf("    next: %s\n", d->findings[i].next);
                if (d->findings[i].kind == GM_DIAG_LEAK && h)
                        print_text_holders(ss, h);
        }
}

static void print_json_figures(const gm_diag_figures_t *f) {
        printf("{\"allocated_bytes\": %" PRIu64 ", \"pending_free_bytes\": %" PRIu64 ", \"inactive_bytes\": %" PRIu64
               ", \"reserved_bytes\": %" PRIu64 ", \"inactive_split_bytes\": %" PRIu64
               ", \"idle_segment_bytes\": %" PRIu64 ", \"largest_free_bytes\": %" PRIu64
               ", \"request_max_bytes\": %" PRIu64 ", \"releasing_bytes\": %" PRIu64 ", \"segments\": %" PRIu64
               ", \"fragmentation_ratio\": %.4f, \"fragmentation\": \"%s\", \"allocated_floor_early\": %" PRIu64
               ", \"allocated_floor_late\": %" PRIu64 ", \"retries\": %" PRIu64 ", \"idle_ms\": %" PRIu64
               ", \"covered_ms\": %" PRIu64 ", \"others_refused\": %" PRIu64 ", \"refusals\": {",
               f->allocated, f->pending, f->inactive, f->reserved, f->inactive_split, f->idle_whole, f->largest_free,
               f->request_max, f->releasing, f->segments, f->frag_ratio, f->frag_band, f->floor_early, f->floor_late,
               f->retries, f->idle_ms, f->covered_ms, f->others_refused);
        for (unsigned i = 0; i < GM_DIAG_REFUSAL_CLASSES; i++)
                printf("%s\"%s\": %" PRIu64, i ? ", " : "", gm_diag_refusal_class(i), f->refusals[i]);
        printf("}}");
}

static void print_json_diagnosis(const gpumem_session_samples *ss, const gm_diagnosis_t *d, const holders_t *h) {
        char cmd[64];
        command_name(ss, cmd, sizeof(cmd));
        printf("{\"pid\": %u, \"session_id\": %" PRIu64 ", \"command\": ", ss->pid, ss->session_id);
        gm_json_print_string(stdout, cmd);
        printf(", \"tenant\": ");
        gm_json_print_string(stdout, ss->tenant);
        printf(", \"heap\": \"%s\", \"verdict\": \"%s\", \"figures\": ", ss->heap_mode, gm_diag_verdict(d));
        print_json_figures(&d->fig);
        printf(", \"findings\": [");
        for (size_t i = 0; i < d->n_findings; i++) {
                printf("%s{\"kind\": \"%s\", \"title\": \"%s\", \"summary\": ", i ? ", " : "",
                       gm_diag_kind_name(d->findings[i].kind), gm_diag_kind_title(d->findings[i].kind));
                gm_json_print_string(stdout, d->findings[i].summary);
                printf(", \"next\": ");
                gm_json_print_string(stdout, d->findings[i].next);
                printf("}");
        }
        printf("]");
        if (h)
                print_json_holders(h);
        printf("}");
}

static void print_json_refusals(const gpumem_sample_set *set) {
        printf("[");
        for (size_t i = 0; i < set->n_refusals; i++) {
                const gpumem_refusal *e = &set->refusals[i];
                printf("%s{\"age_ms\": %" PRIu64 ", \"pid\": %u, \"tenant\": ", i ? ", " : "",
                       set->now_ms > e->t_ms ? set->now_ms - e->t_ms : 0, e->pid);
                gm_json_print_string(stdout, e->tenant);
                printf(", \"class\": ");
                gm_json_print_string(stdout, e->reason);
                printf(", \"size\": %" PRIu64 "}", e->size);
        }
        printf("]");
}

int cmd_diagnose(ctl_t *c, int argc, char **argv) {
        static const struct option opts[] = {
                {"pid", required_argument, NULL, 'p'},
                {"tenant", required_argument, NULL, 't'},
                {"window", required_argument, NULL, 'w'},
                {"json", no_argument, NULL, 'j'},
                {},
        };
        uint64_t pid = 0, window_ms = DIAGNOSE_WINDOW_MS;
        const char *tenant = NULL;
        bool json = false;
        int o;
        optind = 1;
        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                if (o == 'p' && gm_parse_uint(optarg, 1, UINT32_MAX, &pid) < 0) {
                        fprintf(stderr, "gpumemctl: --pid wants a process id, not '%s'\n", optarg);
                        return EXIT_USAGE;
                } else if (o == 'w' && parse_duration_ms(optarg, &window_ms) < 0) {
                        fprintf(stderr, "gpumemctl: --window wants a duration (30s, 5m, 1h), not '%s'\n", optarg);
                        return EXIT_USAGE;
                } else if (o == 't') {
                        tenant = optarg;
                } else if (o == 'j') {
                        json = true;
                } else if (o == '?') {
                        return EXIT_USAGE;
                }
        }
        if (optind < argc || (pid && tenant)) {
                fprintf(stderr, "gpumemctl: diagnose [--pid P | --tenant T] [--window DURATION] [--json]\n");
                return EXIT_USAGE;
        }
        gpumem_sample_set *set;
        int r = fetch_set(c, (uint32_t) pid, tenant, window_ms, &set);
        if (r)
                return r;
        if (set->n_sessions == 0 && (pid || tenant)) {
                if (pid)
                        fprintf(stderr,
                                "gpumemctl: no process with pid %" PRIu64 " holds memory on this GPU "
                                "(or it is not yours to see)\n",
                                pid);
                else
                        fprintf(stderr,
                                "gpumemctl: no process of tenant '%.64s' holds memory on this GPU "
                                "(or it is not yours to see)\n",
                                tenant);
                gpumem_sample_set_free(set);
                return EXIT_REFUSED;
        }
        if (json)
                printf("{\"window_ms\": %" PRIu64 ", \"processes\": [", window_ms);
        else if (set->n_sessions == 0)
                printf("no process holds memory on this GPU\n");
        size_t shown = 0;
        for (size_t i = 0; i < set->n_sessions; i++) {
                gm_diagnosis_t d;
                if (diagnose_session(set, &set->sessions[i], window_ms, &d) < 0)
                        continue; /* no sample in the window */
                holders_t h;
                bool leak = d.n_findings && d.findings[0].kind == GM_DIAG_LEAK;
                if (leak && (r = find_holders(c, set->sessions[i].pid, window_ms, &h)) != 0)
                        break;
                if (json) {
                        printf("%s", shown ? ", " : "");
                        print_json_diagnosis(&set->sessions[i], &d, leak ? &h : NULL);
                } else {
                        print_text_diagnosis(&set->sessions[i], &d, leak ? &h : NULL);
                }
                shown++;
        }
        if (json) {
                printf("], \"refusals\": ");
                print_json_refusals(set);
                printf("}\n");
        }
        gpumem_sample_set_free(set);
        return r;
}

/* ---- top and status ---- */

typedef struct row {
        const gpumem_session_samples *ss;
        gm_sample_t last;
        int64_t trend; /* allocated now minus at the window's start */
        bool has;
        gm_diagnosis_t diag;
} row_t;

static int by_reserved(const void *a, const void *b) {
        const row_t *x = a, *y = b;
        if (x->last.reserved != y->last.reserved)
                return x->last.reserved < y->last.reserved ? 1 : -1;
        return x->ss->pid < y->ss->pid ? -1 : x->ss->pid > y->ss->pid;
}

/* One row per session with samples, sorted by reserved (malloc'd). */
static row_t *build_rows(const gpumem_sample_set *set, uint64_t window_ms, size_t *ret_n) {
        row_t *rows = calloc(set->n_sessions + 1, sizeof(*rows));
        size_t k = 0;
        for (size_t i = 0; rows && i < set->n_sessions; i++) {
                size_t n;
                gm_sample_t *s = session_samples(&set->sessions[i], &n);
                if (!s)
                        continue;
                row_t *r = &rows[k++];
                r->ss = &set->sessions[i];
                r->last = s[n - 1];
                r->trend = (int64_t) s[n - 1].allocated - (int64_t) s[0].allocated;
                r->has = diagnose_session(set, &set->sessions[i], window_ms, &r->diag) == 0;
                free(s);
        }
        if (rows)
                qsort(rows, k, sizeof(*rows), by_reserved);
        *ret_n = k;
        return rows;
}

static const char *fmt_trend(int64_t t, char *buf, size_t len) {
        char s[32];
        if (t == 0)
                return snprintf(buf, len, "="), buf;
        snprintf(buf, len, "%c%s", t > 0 ? '+' : '-', fmt_size(t > 0 ? (uint64_t) t : (uint64_t) -t, s, sizeof(s)));
        return buf;
}

/* What `top` draws on: the terminal on stdout, in rows and columns; 0 for
 * either: unlimited (stdout is no terminal, or it does not say). */
typedef struct screen {
        unsigned rows, cols;
} screen_t;

static screen_t stdout_screen(void) {
        struct winsize ws;
        if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0)
                return (screen_t){ws.ws_row, ws.ws_col};
        return (screen_t){0, 0};
}

/* Prints one line, cut to `cols` columns (0: whole; never inside a UTF-8 character). */
static void print_line(unsigned cols, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void print_line(unsigned cols, const char *fmt, ...) {
        char line[1024];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(line, sizeof(line), fmt, ap);
        va_end(ap);
        size_t len = n < 0 ? 0 : (size_t) n < sizeof(line) ? (size_t) n : sizeof(line) - 1;
        if (cols && len > cols) {
                len = cols;
                while (len && ((unsigned char) line[len] & 0xc0) == 0x80)
                        len--;
        }
        fwrite(line, 1, len, stdout);
        putchar('\n');
}

static void print_device_line(const ctl_t *c, const gpumem_sample_set *set, double refusals_per_s, unsigned cols) {
        char cap[32], res[32], al[32], fr[32];
        print_line(cols, "GPU %d (%s)  capacity %s  reserved %s  allocated %s  free %s  refusals %.1f/s%s",
                   gpumem_admin_device(c->admin), gpumem_admin_backend(c->admin),
                   fmt_size(set->capacity, cap, sizeof(cap)), fmt_size(set->reserved, res, sizeof(res)),
                   fmt_size(set->allocated, al, sizeof(al)), fmt_size(set->device_free, fr, sizeof(fr)), refusals_per_s,
                   set->device_scope ? "" : "  (reserved and allocated: your tenant's)");
}

/* The header and the rows, at most `max_rows` of them (0: all): when there
 * are more, the last of those lines says how many more. Lines are cut to
 * `cols` columns (0: whole). */
static void print_table(const gpumem_sample_set *set, const row_t *rows, size_t n, bool verdicts, size_t max_rows,
                        unsigned cols) {
        print_line(cols, "%7s %-15s %-14s %-16s %-7s %9s %9s %5s %8s %4s %8s%s", "PID", "COMMAND", "TENANT", "UNIT",
                   "HEAP", "ALLOCATED", "RESERVED", "FRAG", "TREND", "SEGS", "REFUSED", verdicts ? " VERDICT" : "");
        size_t shown = max_rows && n > max_rows ? max_rows - 1 : n;
        for (size_t i = 0; i < shown; i++) {
                const row_t *r = &rows[i];
                char cmd[64], a[32], rs[32], tr[32], age[32];
                command_name(r->ss, cmd, sizeof(cmd));
                double frag = r->last.reserved ? 1.0 - (double) r->last.allocated / (double) r->last.reserved : 0;
                const char *refused = "-";
                if (r->ss->last_refusal_ms && set->now_ms >= r->ss->last_refusal_ms)
                        refused = ctl_fmt_age(set->now_ms - r->ss->last_refusal_ms, age, sizeof(age));
                print_line(cols, "%7u %-15.15s %-14.14s %-16.16s %-7s %9s %9s %5.2f %8s %4" PRIu64 " %8s%s%s",
                           r->ss->pid, cmd, r->ss->tenant, r->ss->unit && r->ss->unit[0] ? r->ss->unit : "-",
                           r->ss->heap_mode, fmt_size(r->last.allocated, a, sizeof(a)),
                           fmt_size(r->last.reserved, rs, sizeof(rs)), frag < 0 ? 0 : frag,
                           fmt_trend(r->trend, tr, sizeof(tr)), r->last.segments, refused, verdicts ? " " : "",
                           verdicts ? (r->has ? gm_diag_verdict(&r->diag) : "-") : "");
        }
        if (shown < n)
                print_line(cols, "... %zu more process%s (a taller window shows them)", n - shown,
                           n - shown == 1 ? "" : "es");
}

static void print_top_json(const ctl_t *c, const gpumem_sample_set *set, const row_t *rows, size_t n,
                           uint64_t window_ms) {
        printf("{\"device\": %d, \"backend\": ", gpumem_admin_device(c->admin));
        gm_json_print_string(stdout, gpumem_admin_backend(c->admin));
        printf(", \"capacity_bytes\": %" PRIu64 ", \"reserved_bytes\": %" PRIu64 ", \"allocated_bytes\": %" PRIu64
               ", \"free_bytes\": %" PRIu64 ", \"device_scope\": %s, \"refusals_total\": %" PRIu64
               ", \"refusals_in_window\": %zu, \"window_ms\": %" PRIu64 ", \"processes\": [",
               set->capacity, set->reserved, set->allocated, set->device_free, set->device_scope ? "true" : "false",
               set->refusals_total, set->n_refusals, window_ms);
        for (size_t i = 0; i < n; i++) {
                const row_t *r = &rows[i];
                char cmd[64];
                command_name(r->ss, cmd, sizeof(cmd));
                double frag = r->last.reserved ? 1.0 - (double) r->last.allocated / (double) r->last.reserved : 0;
                printf("%s{\"pid\": %u, \"session_id\": %" PRIu64 ", \"command\": ", i ? ", " : "", r->ss->pid,
                       r->ss->session_id);
                gm_json_print_string(stdout, cmd);
                printf(", \"tenant\": ");
                gm_json_print_string(stdout, r->ss->tenant);
                printf(", \"unit\": ");
                gm_json_print_string(stdout, r->ss->unit ? r->ss->unit : "");
                printf(", \"heap\": \"%s\", \"allocated_bytes\": %" PRIu64 ", \"reserved_bytes\": %" PRIu64
                       ", \"fragmentation_ratio\": %.4f, \"trend_bytes\": %" PRId64 ", \"segments\": %" PRIu64
                       ", \"last_refusal_age_ms\": ",
                       r->ss->heap_mode, r->last.allocated, r->last.reserved, frag < 0 ? 0 : frag, r->trend,
                       r->last.segments);
                if (r->ss->last_refusal_ms && set->now_ms >= r->ss->last_refusal_ms)
                        printf("%" PRIu64, set->now_ms - r->ss->last_refusal_ms);
                else
                        printf("null");
                printf(", \"verdict\": \"%s\"}", r->has ? gm_diag_verdict(&r->diag) : "healthy");
        }
        printf("]}\n");
}

int cmd_top(ctl_t *c, int argc, char **argv) {
        static const struct option opts[] = {
                {"once", no_argument, NULL, 'o'},           {"json", no_argument, NULL, 'j'},
                {"interval", required_argument, NULL, 'i'}, {"iterations", required_argument, NULL, 'n'},
                {"window", required_argument, NULL, 'w'},   {},
        };
        bool once = false, json = false;
        uint64_t interval_ms = 2000, iterations = 0, window_ms = TOP_WINDOW_MS;
        int o;
        optind = 1;
        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                if (o == 'o') {
                        once = true;
                } else if (o == 'j') {
                        json = true;
                } else if (o == 'i' && parse_duration_ms(optarg, &interval_ms) < 0) {
                        fprintf(stderr, "gpumemctl: --interval wants a duration (2s, 500ms), not '%s'\n", optarg);
                        return EXIT_USAGE;
                } else if (o == 'n' && gm_parse_uint(optarg, 1, UINT32_MAX, &iterations) < 0) {
                        fprintf(stderr, "gpumemctl: --iterations wants a count, not '%s'\n", optarg);
                        return EXIT_USAGE;
                } else if (o == 'w' && (parse_duration_ms(optarg, &window_ms) < 0 || window_ms == 0)) {
                        fprintf(stderr, "gpumemctl: --window wants a duration (10s, 5m), not '%s'\n", optarg);
                        return EXIT_USAGE;
                } else if (o == '?') {
                        return EXIT_USAGE;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "gpumemctl: top [--once] [--json] [--interval DURATION] [--iterations N] [--window "
                                "DURATION]\n");
                return EXIT_USAGE;
        }
        uint64_t last_total = 0, last_now = 0;
        for (uint64_t round = 0;; round++) {
                gpumem_sample_set *set;
                int r = fetch_set(c, 0, NULL, window_ms, &set);
                if (r)
                        return r;
                size_t n;
                row_t *rows = build_rows(set, window_ms, &n);
                /* Refusals per second: since the last refresh, else over the window. */
                double per_s = round && set->now_ms > last_now ? (double) (set->refusals_total - last_total) * 1000.0 /
                                                                         (double) (set->now_ms - last_now)
                                                               : (double) set->n_refusals * 1000.0 / (double) window_ms;
                last_total = set->refusals_total;
                last_now = set->now_ms;
                if (json) {
                        print_top_json(c, set, rows, n, window_ms);
                } else {
                        /* Taken each round: the window may have been resized. The rows
                         * left for processes: all but the device line, the header and
                         * the cursor's last line (a newline there would scroll). */
                        screen_t scr = stdout_screen();
                        size_t max_rows = scr.rows ? (scr.rows > 4 ? scr.rows - 3 : 1) : 0;
                        if (!once)
                                printf("\033[H\033[2J"); /* home, clear: plain ANSI, fine over ssh */
                        print_device_line(c, set, per_s, scr.cols);
                        print_table(set, rows, n, false, max_rows, scr.cols);
                }
                fflush(stdout);
                free(rows);
                gpumem_sample_set_free(set);
                if (once || json || (iterations && round + 1 >= iterations))
                        return 0;
                struct timespec ts = {.tv_sec = (time_t) (interval_ms / 1000),
                                      .tv_nsec = (long) (interval_ms % 1000) * 1000000L};
                nanosleep(&ts, NULL);
        }
}

int cmd_status(ctl_t *c, int argc, char **argv) {
        if (argc > 1) {
                fprintf(stderr, "gpumemctl: status takes no arguments\n");
                return EXIT_USAGE;
        }
        gpumem_sample_set *set;
        int r = fetch_set(c, 0, NULL, DIAGNOSE_WINDOW_MS, &set);
        if (r)
                return r;
        size_t n;
        row_t *rows = build_rows(set, DIAGNOSE_WINDOW_MS, &n);
        print_device_line(c, set, (double) set->n_refusals * 1000.0 / DIAGNOSE_WINDOW_MS, 0);
        uint64_t by_class[GM_DIAG_REFUSAL_CLASSES] = {0};
        for (size_t i = 0; i < set->n_refusals; i++) {
                int cls = gm_diag_refusal_class_of(set->refusals[i].reason);
                if (cls >= 0)
                        by_class[cls]++;
        }
        printf("%zu process%s with memory; %zu refusal%s in the last minute", n, n == 1 ? "" : "es", set->n_refusals,
               set->n_refusals == 1 ? "" : "s");
        for (unsigned i = 0; i < GM_DIAG_REFUSAL_CLASSES; i++)
                if (by_class[i])
                        printf("%s %" PRIu64 " %s", i ? "," : ":", by_class[i], gm_diag_refusal_class(i));
        printf(" (%" PRIu64 " since the daemon started)\n", set->refusals_total);
        print_table(set, rows, n, true, 0, 0);
        size_t flagged = 0;
        for (size_t i = 0; i < n; i++)
                flagged += rows[i].has && rows[i].diag.n_findings > 0;
        if (flagged)
                printf("%zu process%s need%s a look: gpumemctl diagnose\n", flagged, flagged == 1 ? "" : "es",
                       flagged == 1 ? "s" : "");
        free(rows);
        gpumem_sample_set_free(set);
        return 0;
}
