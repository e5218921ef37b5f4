/* Memory snapshots: see snapshot.h. Collecting copies heaps and histories
 * into flat owned tables (strings in one string table, by offset); rendering
 * sorts the segments by address and writes the whole tree with a
 * gm_pickler_t. Segment totals are summed from the blocks, as PyTorch does,
 * so total_size always equals the sum of the block sizes. */
#include "snapshot.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pickle.h"
#include "u64map.h"

#define NO_OWNER UINT32_MAX
/* "shared NAME@VERSION": a shared object's owner's command. */
#define SHARED_COMMAND_MAX 160

typedef struct seg_rec {
        gm_segment_info_t info;
        uint32_t owner;
        size_t first_block, n_blocks; /* range in data.blocks */
        size_t shared;                /* a shared object's: 1 + its index in data.shareds (0: a heap's) */
} seg_rec_t;

typedef struct shared_rec {
        size_t name, state; /* string offsets */
        uint64_t version;
        size_t first_mapper, n_mappers; /* range in data.mappers */
} shared_rec_t;

typedef struct mapper_rec {
        uint32_t pid;
        uint64_t session_id;
        size_t tenant; /* string offset */
} mapper_rec_t;

typedef struct owner_rec {
        uint32_t pid;
        size_t tenant, command;             /* string offsets */
        size_t tag_names[GM_HEAP_MAX_TAGS]; /* string offsets ("default", "tag N" where unnamed) */
        uint64_t session_id;
        bool blocks_unknown;
} owner_rec_t;

typedef struct frame_rec {
        size_t filename, name; /* string offsets */
        uint32_t line;
} frame_rec_t;

typedef struct trace_rec {
        gm_history_entry_t e;
        size_t first_frame, n_frames; /* range in data.frames */
        size_t seq;                   /* order of adding: ties of time_us keep it */
} trace_rec_t;

struct gm_snapshot_data {
        seg_rec_t *segs;
        size_t n_segs, cap_segs;
        gm_block_info_t *blocks;
        size_t n_blocks, cap_blocks;
        owner_rec_t *owners;
        size_t n_owners, cap_owners;
        trace_rec_t *traces;
        size_t n_traces, cap_traces;
        frame_rec_t *frames;
        size_t n_frames, cap_frames;
        char *strings;
        size_t n_strings, cap_strings;
        shared_rec_t *shareds;
        size_t n_shareds, cap_shareds;
        mapper_rec_t *mappers;
        size_t n_mappers, cap_mappers;
        uint64_t shared_next_addr; /* the next shared object's address (0: GM_SNAPSHOT_SHARED_BASE) */
};

/* Makes room for `more` elements in *arr. */
static bool grow(void **arr, size_t *cap, size_t n, size_t more, size_t elem) {
        if (more <= *cap - n)
                return true;
        if (more > SIZE_MAX / elem - n)
                return false;
        size_t ncap = *cap ? *cap : 64;
        while (ncap - n < more) {
                if (ncap > SIZE_MAX / 2 / elem)
                        return false;
                ncap *= 2;
        }
        void *p = realloc(*arr, ncap * elem);
        if (!p)
                return false;
        *arr = p;
        *cap = ncap;
        return true;
}

/* 0, or -ENOMEM: room for `more` elements in d->field. */
#define GROW(d, field, more) \
        (grow((void **) &(d)->field, &(d)->cap_##field, (d)->n_##field, (more), sizeof(*(d)->field)) ? 0 : -ENOMEM)

/* Copies s (NULL: "") into the string table; *ret_off names it. */
static int string_add(gm_snapshot_data_t *d, const char *s, size_t *ret_off) {
        size_t len = strlen(s ? s : "") + 1;
        if (GROW(d, strings, len) < 0)
                return -ENOMEM;
        memcpy(d->strings + d->n_strings, s ? s : "", len);
        *ret_off = d->n_strings;
        d->n_strings += len;
        return 0;
}

static const char *string_at(const gm_snapshot_data_t *d, size_t off) {
        return d->strings + off;
}

int gm_snapshot_data_new(gm_snapshot_data_t **ret_data) {
        gm_snapshot_data_t *d = calloc(1, sizeof(*d));
        if (!d)
                return -ENOMEM;
        size_t empty;
        if (string_add(d, "", &empty) < 0) { /* offset 0 is "" */
                free(d);
                return -ENOMEM;
        }
        *ret_data = d;
        return 0;
}

gm_snapshot_data_t *gm_snapshot_data_free(gm_snapshot_data_t *d) {
        if (!d)
                return NULL;
        free(d->segs);
        free(d->blocks);
        free(d->owners);
        free(d->traces);
        free(d->frames);
        free(d->strings);
        free(d->shareds);
        free(d->mappers);
        free(d);
        return NULL;
}

int gm_snapshot_data_add_owner(gm_snapshot_data_t *d, const gm_snapshot_owner_t *o, uint32_t *ret_owner) {
        if (d->n_owners >= NO_OWNER)
                return -ENOSPC;
        owner_rec_t rec = {.pid = o->pid, .session_id = o->session_id, .blocks_unknown = o->blocks_unknown};
        int r = GROW(d, owners, 1);
        if (r == 0)
                r = string_add(d, o->tenant, &rec.tenant);
        if (r == 0)
                r = string_add(d, o->command, &rec.command);
        for (size_t id = 0; id < GM_HEAP_MAX_TAGS && r == 0; id++) {
                char unnamed[16];
                const char *name = o->tag_names && id < o->n_tag_names ? o->tag_names[id] : NULL;
                snprintf(unnamed, sizeof(unnamed), id ? "tag %zu" : "default", id);
                r = string_add(d, name && *name ? name : unnamed, &rec.tag_names[id]);
        }
        if (r < 0)
                return r;
        d->owners[d->n_owners] = rec;
        *ret_owner = (uint32_t) d->n_owners++;
        return 0;
}

void gm_snapshot_data_set_blocks_unknown(gm_snapshot_data_t *d, uint32_t owner) {
        if (owner < d->n_owners)
                d->owners[owner].blocks_unknown = true;
}

int gm_snapshot_data_add_segment(gm_snapshot_data_t *d, uint32_t owner, const gm_segment_info_t *seg,
                                 const gm_block_info_t *blocks, size_t n_blocks) {
        uint64_t addr = seg->addr;
        if (owner >= d->n_owners || n_blocks == 0)
                return -EINVAL;
        for (size_t i = 0; i < n_blocks; i++) {
                if (blocks[i].addr != addr || blocks[i].size == 0 || blocks[i].size > UINT64_MAX - addr ||
                    (unsigned) blocks[i].state > GM_BLOCK_ACTIVE_PENDING_FREE)
                        return -EINVAL;
                addr += blocks[i].size;
        }
        if (addr - seg->addr != seg->size)
                return -EINVAL;
        if (GROW(d, segs, 1) < 0 || GROW(d, blocks, n_blocks) < 0)
                return -ENOMEM;
        d->segs[d->n_segs++] =
                (seg_rec_t){.info = *seg, .owner = owner, .first_block = d->n_blocks, .n_blocks = n_blocks};
        memcpy(d->blocks + d->n_blocks, blocks, n_blocks * sizeof(*blocks));
        d->n_blocks += n_blocks;
        return 0;
}

int gm_snapshot_data_add_shared(gm_snapshot_data_t *d, const gm_snapshot_shared_t *s) {
        enum { ALIGN = 2u << 20 };
        uint64_t addr = d->shared_next_addr ? d->shared_next_addr : GM_SNAPSHOT_SHARED_BASE;
        if (s->size == 0 || s->size > (1ull << 53) - addr)
                return -EINVAL;
        char command[SHARED_COMMAND_MAX];
        snprintf(command, sizeof(command), "shared %s@%" PRIu64, s->name, s->version);
        gm_snapshot_owner_t owner = {.pid = 0, .tenant = s->tenant, .command = command};
        uint32_t idx;
        shared_rec_t rec = {.version = s->version, .first_mapper = d->n_mappers, .n_mappers = s->n_mappers};
        int r = gm_snapshot_data_add_owner(d, &owner, &idx);
        if (r == 0)
                r = GROW(d, shareds, 1) < 0 || GROW(d, mappers, s->n_mappers) < 0 ? -ENOMEM : 0;
        if (r == 0)
                r = string_add(d, s->name, &rec.name);
        if (r == 0)
                r = string_add(d, s->state, &rec.state);
        for (size_t i = 0; r == 0 && i < s->n_mappers; i++) {
                mapper_rec_t *m = &d->mappers[d->n_mappers + i];
                *m = (mapper_rec_t){.pid = s->mappers[i].pid, .session_id = s->mappers[i].session_id};
                r = string_add(d, s->mappers[i].tenant, &m->tenant);
        }
        const gm_segment_info_t seg = {.addr = addr, .size = s->size};
        const gm_block_info_t block = {
                .addr = addr, .size = s->size, .requested_size = s->size, .state = GM_BLOCK_ACTIVE_ALLOCATED};
        if (r == 0)
                r = gm_snapshot_data_add_segment(d, idx, &seg, &block, 1);
        if (r < 0)
                return r;
        d->segs[d->n_segs - 1].shared = d->n_shareds + 1;
        d->shareds[d->n_shareds++] = rec;
        d->n_mappers += s->n_mappers;
        uint64_t end = addr + s->size;
        d->shared_next_addr = end > (1ull << 53) - ALIGN ? (1ull << 53) : (end + ALIGN - 1) / ALIGN * ALIGN;
        return 0;
}

typedef struct heap_collector {
        gm_snapshot_data_t *d;
        uint32_t owner;
        int error;
} heap_collector_t;

static void collect_segment(const gm_segment_info_t *seg, void *userdata) {
        heap_collector_t *c = userdata;
        gm_snapshot_data_t *d = c->d;
        if (c->error == 0 && (c->error = GROW(d, segs, 1)) == 0)
                d->segs[d->n_segs++] = (seg_rec_t){.info = *seg, .owner = c->owner, .first_block = d->n_blocks};
}

static void collect_block(const gm_segment_info_t *seg, const gm_block_info_t *block, void *userdata) {
        heap_collector_t *c = userdata;
        gm_snapshot_data_t *d = c->d;
        if (c->error != 0 || (c->error = GROW(d, blocks, 1)) != 0)
                return;
        /* The walk's contract: blocks tile their segment in address order. */
        seg_rec_t *s = &d->segs[d->n_segs - 1];
        if (s->info.id != seg->id ||
            block->addr != (s->n_blocks == 0 ? s->info.addr
                                             : d->blocks[d->n_blocks - 1].addr + d->blocks[d->n_blocks - 1].size)) {
                c->error = -EINVAL;
                return;
        }
        d->blocks[d->n_blocks++] = *block;
        s->n_blocks++;
}

int gm_snapshot_data_add_heap(gm_snapshot_data_t *d, uint32_t owner, const gm_heap_t *heap) {
        if (owner >= d->n_owners || !heap)
                return -EINVAL;
        heap_collector_t c = {.d = d, .owner = owner};
        const gm_heap_visitor_t visitor = {.segment_fn = collect_segment, .block_fn = collect_block, .userdata = &c};
        gm_heap_walk(heap, &visitor);
        return c.error;
}

int gm_snapshot_data_add_trace(gm_snapshot_data_t *d, const gm_history_entry_t *e, const gm_frame_t *frames,
                               size_t n_frames) {
        trace_rec_t t = {.e = *e, .first_frame = d->n_frames, .n_frames = n_frames, .seq = d->n_traces};
        if (GROW(d, traces, 1) < 0 || GROW(d, frames, n_frames) < 0)
                return -ENOMEM;
        for (size_t i = 0; i < n_frames; i++) {
                frame_rec_t *f = &d->frames[d->n_frames + i];
                f->line = frames[i].line;
                if (string_add(d, frames[i].filename, &f->filename) < 0 || string_add(d, frames[i].name, &f->name) < 0)
                        return -ENOMEM;
        }
        d->n_frames += n_frames;
        d->traces[d->n_traces++] = t;
        return 0;
}

/* pid -> its first owner (in d->owners, which must not grow while the map
 * is in use). */
/* The owners by pid, or by session id (`by_session`: owners with none are
 * left out). */
static int index_owners(const gm_snapshot_data_t *d, bool by_session, gm_u64map_t *ret_map) {
        gm_u64map_t m = {0};
        int r = gm_u64map_reserve(&m, d->n_owners);
        for (size_t i = 0; r == 0 && i < d->n_owners; i++) {
                uint64_t key = by_session ? d->owners[i].session_id : d->owners[i].pid;
                if ((!by_session || key) && !gm_u64map_find(&m, key, NULL))
                        r = gm_u64map_put(&m, key, (void *) &d->owners[i]);
        }
        if (r < 0) {
                gm_u64map_done(&m);
                return r;
        }
        *ret_map = m;
        return 0;
}

typedef struct history_copy {
        gm_snapshot_data_t *d;
        /* Whose entries are copied (NULL = every entry): an entry that names
         * its session, that session's owner's; one that does not, its pid's. */
        const gm_u64map_t *owners, *sessions;
        gm_u64map_t stacks; /* frames_id -> index + 1 of its first trace in d */
        uint64_t last_us;   /* times are made non-decreasing, so sorting by time keeps this order */
        int error;
} history_copy_t;

static void copy_entry(const gm_history_entry_t *e, const gm_frame_t *frames, size_t n_frames, void *userdata) {
        history_copy_t *x = userdata;
        gm_snapshot_data_t *d = x->d;
        if (x->error || (x->owners && !(e->session_id ? gm_u64map_find(x->sessions, e->session_id, NULL)
                                                      : gm_u64map_find(x->owners, e->pid, NULL))))
                return;
        gm_history_entry_t entry = *e;
        if (entry.time_us < x->last_us)
                entry.time_us = x->last_us;
        x->last_us = entry.time_us;
        e = &entry;
        /* Entries sharing a stack share its copy. */
        uintptr_t first = e->frames_id ? (uintptr_t) gm_u64map_get(&x->stacks, e->frames_id) : 0;
        if (first) {
                if ((x->error = GROW(d, traces, 1)) == 0)
                        d->traces[d->n_traces] = (trace_rec_t){.e = *e,
                                                               .first_frame = d->traces[first - 1].first_frame,
                                                               .n_frames = d->traces[first - 1].n_frames,
                                                               .seq = d->n_traces};
                d->n_traces += x->error == 0;
                return;
        }
        if ((x->error = gm_snapshot_data_add_trace(d, e, frames, n_frames)) == 0 && e->frames_id)
                x->error = gm_u64map_put(&x->stacks, e->frames_id, (void *) (uintptr_t) d->n_traces);
}

int gm_snapshot_data_add_history(gm_snapshot_data_t *d, const gm_history_t *h, bool only_owned) {
        if (!h)
                return 0;
        history_copy_t x = {.d = d};
        gm_u64map_t owners = {0}, sessions = {0};
        if (only_owned) {
                int r = index_owners(d, false, &owners);
                if (r == 0)
                        r = index_owners(d, true, &sessions);
                if (r < 0) {
                        gm_u64map_done(&owners);
                        return r;
                }
                x.owners = &owners;
                x.sessions = &sessions;
        }
        gm_history_foreach(h, copy_entry, &x);
        gm_u64map_done(&x.stacks);
        gm_u64map_done(&owners);
        gm_u64map_done(&sessions);
        return x.error;
}

size_t gm_snapshot_data_blocks(const gm_snapshot_data_t *d) {
        return d->n_blocks;
}

size_t gm_snapshot_data_traces(const gm_snapshot_data_t *d) {
        return d->n_traces;
}

/* ---- rendering ---- */

/* The frames of the newest `alloc` trace entry at an address: a live
 * block's frames, as PyTorch records them at allocation. Addresses are
 * unique in a snapshot, so the address names the block. */
typedef struct alloc_frames {
        uint64_t addr;
        size_t trace; /* index in data.traces; the newest at an address wins */
} alloc_frames_t;

typedef struct render {
        gm_pickler_t w;
        const gm_snapshot_data_t *d;
        const gm_snapshot_options_t *o;
        alloc_frames_t *allocs; /* sorted by address */
        size_t n_allocs;
        gm_u64map_t owners_by_pid; /* pid -> its first owner_rec_t, for trace entries */
} render_t;

static int cmp_seg_addr(const void *a, const void *b) {
        const seg_rec_t *x = a, *y = b;
        return (x->info.addr > y->info.addr) - (x->info.addr < y->info.addr);
}

static int cmp_trace_time(const void *a, const void *b) {
        const trace_rec_t *x = a, *y = b;
        if (x->e.time_us != y->e.time_us)
                return (x->e.time_us > y->e.time_us) - (x->e.time_us < y->e.time_us);
        return (x->seq > y->seq) - (x->seq < y->seq);
}

static int cmp_alloc_frames(const void *a, const void *b) {
        const alloc_frames_t *x = a, *y = b;
        if (x->addr != y->addr)
                return (x->addr > y->addr) - (x->addr < y->addr);
        return (x->trace > y->trace) - (x->trace < y->trace);
}

static int build_alloc_index(render_t *r) {
        const gm_snapshot_data_t *d = r->d;
        r->allocs = malloc((d->n_traces + 1) * sizeof(*r->allocs));
        if (!r->allocs)
                return -ENOMEM;
        for (size_t i = 0; i < d->n_traces; i++)
                if (d->traces[i].e.action == GM_TRACE_ALLOC)
                        r->allocs[r->n_allocs++] = (alloc_frames_t){.addr = d->traces[i].e.addr, .trace = i};
        if (r->n_allocs > 1)
                qsort(r->allocs, r->n_allocs, sizeof(*r->allocs), cmp_alloc_frames);
        size_t k = 0;
        for (size_t i = 0; i < r->n_allocs; i++) {
                if (k > 0 && r->allocs[k - 1].addr == r->allocs[i].addr)
                        k--; /* a newer allocation at the same address replaces it */
                r->allocs[k++] = r->allocs[i];
        }
        r->n_allocs = k;
        return 0;
}

static const trace_rec_t *alloc_find(const render_t *r, uint64_t addr) {
        size_t lo = 0, hi = r->n_allocs;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (r->allocs[mid].addr < addr)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo < r->n_allocs && r->allocs[lo].addr == addr ? &r->d->traces[r->allocs[lo].trace] : NULL;
}

static const owner_rec_t *owner_of_pid(const render_t *r, uint32_t pid) {
        return gm_u64map_get(&r->owners_by_pid, pid);
}

static const char *state_name(gm_block_state_t state) {
        switch (state) {
        case GM_BLOCK_ACTIVE_ALLOCATED:
                return "active_allocated";
        case GM_BLOCK_ACTIVE_PENDING_FREE:
                return "active_pending_free";
        default:
                return "inactive";
        }
}

static void key_uint(gm_pickler_t *w, const char *key, uint64_t v) {
        gm_pickler_key(w, key);
        gm_pickler_uint(w, v);
}

static void key_str(gm_pickler_t *w, const char *key, const char *v) {
        gm_pickler_key(w, key);
        gm_pickler_str(w, v);
}

static void key_empty_list(gm_pickler_t *w, const char *key) {
        gm_pickler_key(w, key);
        gm_pickler_begin_list(w);
        gm_pickler_end_list(w);
}

static void frame_dict(gm_pickler_t *w, const char *filename, uint32_t line, const char *name) {
        gm_pickler_begin_dict(w);
        key_str(w, "filename", filename);
        key_uint(w, "line", line);
        key_str(w, "name", name);
        gm_pickler_end_dict(w);
}

/* The outermost frame naming a process: hovering in MemoryViz shows it. */
static void process_frame(render_t *r, const owner_rec_t *o) {
        char file[128], name[192];
        const char *command = string_at(r->d, o->command);
        snprintf(file, sizeof(file), "[pid %" PRIu32 "%s%s%s]", o->pid, command[0] ? " " : "", command,
                 o->blocks_unknown ? ", blocks unknown: no answer in time" : "");
        snprintf(name, sizeof(name), "tenant %s, session %" PRIu64, string_at(r->d, o->tenant), o->session_id);
        frame_dict(&r->w, file, 0, name);
}

/* "frames": the trace's (may be NULL) and, when asked, the process's. */
static void key_frames(render_t *r, const trace_rec_t *t, const owner_rec_t *o) {
        gm_pickler_t *w = &r->w;
        gm_pickler_key(w, "frames");
        gm_pickler_begin_list(w);
        for (size_t i = 0; t && i < t->n_frames; i++) {
                const frame_rec_t *f = &r->d->frames[t->first_frame + i];
                frame_dict(w, string_at(r->d, f->filename), f->line, string_at(r->d, f->name));
        }
        if (o && r->o->process_frames)
                process_frame(r, o);
        gm_pickler_end_list(w);
}

/* The segment holding addr (segments sorted by address), or NULL. */
static const seg_rec_t *segment_at(const render_t *r, uint64_t addr) {
        size_t lo = 0, hi = r->d->n_segs;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (r->d->segs[mid].info.addr + r->d->segs[mid].info.size <= addr)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo < r->d->n_segs && r->d->segs[lo].info.addr <= addr ? &r->d->segs[lo] : NULL;
}

/* `category` of a block of segment s, or of a trace entry (s NULL) at addr. */
static void category(render_t *r, const owner_rec_t *o, const seg_rec_t *s, uint64_t addr) {
        char pid[32];
        switch (r->o->category) {
        case GM_SNAPSHOT_CATEGORY_TAG:
                if (!s)
                        s = segment_at(r, addr);
                if (s && s->info.tag < GM_HEAP_MAX_TAGS && &r->d->owners[s->owner] == o)
                        key_str(&r->w, "category", string_at(r->d, o->tag_names[s->info.tag]));
                else
                        key_str(&r->w, "category", "unknown");
                break;
        case GM_SNAPSHOT_CATEGORY_TENANT:
                key_str(&r->w, "category", o ? string_at(r->d, o->tenant) : "unknown");
                break;
        case GM_SNAPSHOT_CATEGORY_PID:
                snprintf(pid, sizeof(pid), "pid %" PRIu32, o ? o->pid : 0);
                key_str(&r->w, "category", o ? pid : "unknown");
                break;
        default:
                break;
        }
}

static void segment_totals(const seg_rec_t *s, const gm_block_info_t *blocks, uint64_t ret[4]) {
        uint64_t total = 0, allocated = 0, active = 0, requested = 0;
        for (size_t i = 0; i < s->n_blocks; i++) {
                const gm_block_info_t *b = &blocks[i];
                total += b->size;
                if (b->state == GM_BLOCK_ACTIVE_ALLOCATED)
                        allocated += b->size;
                if (b->state != GM_BLOCK_INACTIVE) {
                        active += b->size;
                        requested += b->requested_size;
                }
        }
        ret[0] = total;
        ret[1] = allocated;
        ret[2] = active;
        ret[3] = requested;
}

static void write_blocks(render_t *r, const seg_rec_t *s, const owner_rec_t *o) {
        gm_pickler_t *w = &r->w;
        const gm_block_info_t *blocks = r->d->blocks + s->first_block;
        bool legacy = r->o->format == GM_SNAPSHOT_PICKLE_1_13;
        gm_pickler_key(w, "blocks");
        gm_pickler_begin_list(w);
        if (o->blocks_unknown) { /* one block over the whole segment: what it holds is not known */
                gm_pickler_begin_dict(w);
                if (!legacy)
                        key_uint(w, "address", s->info.addr);
                key_uint(w, "size", s->info.size);
                key_uint(w, "requested_size", s->info.size);
                key_str(w, "state", "active_allocated");
                if (!legacy) {
                        key_frames(r, NULL, o);
                        category(r, o, s, s->info.addr);
                }
                gm_pickler_end_dict(w);
                gm_pickler_end_list(w);
                return;
        }
        for (size_t i = 0; i < s->n_blocks; i++) {
                const gm_block_info_t *b = &blocks[i];
                const trace_rec_t *t = b->state != GM_BLOCK_INACTIVE ? alloc_find(r, b->addr) : NULL;
                gm_pickler_begin_dict(w);
                if (!legacy)
                        key_uint(w, "address", b->addr);
                key_uint(w, "size", b->size);
                key_uint(w, "requested_size", b->requested_size);
                key_str(w, "state", state_name(b->state));
                if (legacy) {
                        /* 1.13 keeps the allocation's stack in `history`. */
                        if (b->state != GM_BLOCK_INACTIVE) {
                                gm_pickler_key(w, "history");
                                gm_pickler_begin_list(w);
                                gm_pickler_begin_dict(w);
                                key_uint(w, "addr", b->addr);
                                key_uint(w, "real_size", b->requested_size);
                                key_frames(r, t, o);
                                gm_pickler_end_dict(w);
                                gm_pickler_end_list(w);
                        }
                } else {
                        key_frames(r, t, b->state != GM_BLOCK_INACTIVE ? o : NULL);
                        if (b->state != GM_BLOCK_INACTIVE)
                                category(r, o, s, b->addr);
                }
                gm_pickler_end_dict(w);
        }
        gm_pickler_end_list(w);
}

/* "gpumemd_shared": the shared object this segment is, with its mappers. */
static void write_shared(render_t *r, const shared_rec_t *sh, const owner_rec_t *o) {
        gm_pickler_t *w = &r->w;
        gm_pickler_key(w, "gpumemd_shared");
        gm_pickler_begin_dict(w);
        key_str(w, "name", string_at(r->d, sh->name));
        key_uint(w, "version", sh->version);
        key_str(w, "tenant", string_at(r->d, o->tenant));
        key_str(w, "state", string_at(r->d, sh->state));
        gm_pickler_key(w, "mappers");
        gm_pickler_begin_list(w);
        for (size_t i = 0; i < sh->n_mappers; i++) {
                const mapper_rec_t *m = &r->d->mappers[sh->first_mapper + i];
                gm_pickler_begin_dict(w);
                key_uint(w, "pid", m->pid);
                key_uint(w, "session_id", m->session_id);
                key_str(w, "tenant", string_at(r->d, m->tenant));
                gm_pickler_end_dict(w);
        }
        gm_pickler_end_list(w);
        gm_pickler_end_dict(w);
}

static void write_segment(render_t *r, const seg_rec_t *s) {
        static const int64_t default_pool[2] = {0, 0};
        gm_pickler_t *w = &r->w;
        const owner_rec_t *o = &r->d->owners[s->owner];
        bool legacy = r->o->format == GM_SNAPSHOT_PICKLE_1_13;
        uint64_t totals[4];
        segment_totals(s, r->d->blocks + s->first_block, totals);

        gm_pickler_begin_dict(w);
        gm_pickler_key(w, "device");
        gm_pickler_int(w, r->o->device);
        key_uint(w, "address", s->info.addr);
        key_uint(w, "total_size", totals[0]);
        key_uint(w, "allocated_size", totals[1]);
        key_uint(w, "active_size", totals[2]);
        key_uint(w, "requested_size", totals[3]);
        key_uint(w, "stream", s->info.stream);
        key_str(w, "segment_type", s->info.small_pool ? "small" : "large");
        if (!legacy) {
                gm_pickler_key(w, "segment_pool_id");
                gm_pickler_tuple_ints(w, default_pool, 2);
                gm_pickler_key(w, "is_expandable");
                gm_pickler_bool(w, s->info.expandable);
                key_empty_list(w, "frames");
        }
        write_blocks(r, s, o);
        key_uint(w, "pid", o->pid);
        key_str(w, "tenant", string_at(r->d, o->tenant));
        key_uint(w, "session_id", o->session_id);
        if (o->blocks_unknown) {
                gm_pickler_key(w, "gpumemd_blocks_unknown");
                gm_pickler_bool(w, true);
        }
        if (s->shared)
                write_shared(r, &r->d->shareds[s->shared - 1], o);
        gm_pickler_end_dict(w);
}

static void write_trace_entry(render_t *r, const trace_rec_t *t) {
        gm_pickler_t *w = &r->w;
        const char *action = gm_trace_action_name(t->e.action);
        const owner_rec_t *o = owner_of_pid(r, t->e.pid);
        gm_pickler_begin_dict(w);
        key_str(w, "action", action ? action : "unknown");
        key_uint(w, t->e.action == GM_TRACE_OOM ? "device_free" : "addr", t->e.addr);
        key_uint(w, "size", t->e.size);
        key_uint(w, "stream", t->e.stream);
        key_uint(w, "time_us", t->e.time_us);
        if (t->n_frames > 0 || (o && r->o->process_frames))
                key_frames(r, t, o);
        category(r, o, NULL, t->e.addr);
        key_uint(w, "pid", t->e.pid);
        gm_pickler_end_dict(w);
}

/* The closing entry of a trace with categories: PyTorch's `snapshot` action
 * (address 0, the active bytes), in the category "unknown" that MemoryViz
 * requires once any category is present. */
static void write_snapshot_entry(render_t *r) {
        gm_pickler_t *w = &r->w;
        uint64_t active = 0;
        for (size_t i = 0; i < r->d->n_blocks; i++)
                if (r->d->blocks[i].state != GM_BLOCK_INACTIVE)
                        active += r->d->blocks[i].size;
        gm_pickler_begin_dict(w);
        key_str(w, "action", "snapshot");
        key_uint(w, "addr", 0);
        key_uint(w, "size", active);
        key_uint(w, "stream", 0);
        key_uint(w, "time_us", r->o->now_us);
        key_str(w, "category", "unknown");
        key_uint(w, "pid", 0);
        gm_pickler_end_dict(w);
}

static void write_traces(render_t *r) {
        gm_pickler_t *w = &r->w;
        gm_pickler_begin_list(w);
        for (int dev = 0; dev < r->o->device; dev++) {
                gm_pickler_begin_list(w);
                gm_pickler_end_list(w);
        }
        gm_pickler_begin_list(w);
        for (size_t i = 0; i < r->d->n_traces && w->error == 0; i++)
                write_trace_entry(r, &r->d->traces[i]);
        if (r->o->category != GM_SNAPSHOT_CATEGORY_NONE)
                write_snapshot_entry(r);
        gm_pickler_end_list(w);
        gm_pickler_end_list(w);
}

static void write_settings(gm_pickler_t *w, const gm_alloc_config_t *c) {
        gm_pickler_begin_dict(w);
        key_str(w, "PYTORCH_CUDA_ALLOC_CONF", c->raw);
        gm_pickler_key(w, "max_split_size");
        gm_pickler_int(w, c->max_split_size == UINT64_MAX ? -1 : (int64_t) c->max_split_size);
        gm_pickler_key(w, "garbage_collection_threshold");
        gm_pickler_double(w, c->garbage_collection_threshold);
        gm_pickler_key(w, "expandable_segments");
        gm_pickler_bool(w, c->expandable_segments);
        if (c->page_reuse) { /* gpumemd extension: absent unless set, so default snapshots match PyTorch's */
                gm_pickler_key(w, "gpumemd_page_reuse");
                gm_pickler_bool(w, true);
        }
        gm_pickler_key(w, "release_lock_on_cudamalloc");
        gm_pickler_bool(w, c->release_lock_on_cudamalloc);
        gm_pickler_key(w, "pinned_use_cuda_host_register");
        gm_pickler_bool(w, c->pinned_use_cuda_host_register);
        gm_pickler_key(w, "pinned_num_register_threads");
        gm_pickler_uint(w, c->pinned_num_register_threads);
        /* Slot i governs sizes from 2^i MiB: keys "1", "2", ..., "32768". */
        gm_pickler_key(w, "roundup_power2_divisions");
        gm_pickler_begin_dict(w);
        for (unsigned i = 0; i < GM_ROUNDUP_SLOTS; i++) {
                char key[8];
                snprintf(key, sizeof(key), "%u", 1u << i);
                key_uint(w, key, c->roundup_power2_divisions[i]);
        }
        gm_pickler_end_dict(w);
        gm_pickler_end_dict(w);
}

static void write_segments(render_t *r) {
        gm_pickler_begin_list(&r->w);
        for (size_t i = 0; i < r->d->n_segs && r->w.error == 0; i++) {
                write_segment(r, &r->d->segs[i]);
                if (r->o->max_bytes && r->w.len > r->o->max_bytes)
                        break; /* the size check after finishing reports it */
        }
        gm_pickler_end_list(&r->w);
}

int gm_snapshot_render(gm_snapshot_data_t *d, const gm_snapshot_options_t *o, char **ret_buf, size_t *ret_len) {
        if (!d || !o || o->device < 0 || !o->config || (unsigned) o->format >= _GM_SNAPSHOT_FORMAT_MAX ||
            (unsigned) o->category >= _GM_SNAPSHOT_CATEGORY_MAX)
                return -EINVAL;
        render_t r = {.d = d, .o = o};
        int ret = 0;
        if (d->n_segs > 1)
                qsort(d->segs, d->n_segs, sizeof(*d->segs), cmp_seg_addr);
        for (size_t i = 1; i < d->n_segs; i++)
                if (d->segs[i].info.addr < d->segs[i - 1].info.addr + d->segs[i - 1].info.size)
                        return -EINVAL; /* overlapping segments: the viewers' replay would fail */
        /* Sources (the device's ring, each local session's) merge by time. */
        if (d->n_traces > 1)
                qsort(d->traces, d->n_traces, sizeof(*d->traces), cmp_trace_time);
        if ((ret = build_alloc_index(&r)) < 0 || (ret = index_owners(r.d, false, &r.owners_by_pid)) < 0)
                goto finish;
        ret = gm_pickler_init(&r.w, o->format == GM_SNAPSHOT_JSON ? GM_PICKLE_FORMAT_JSON : GM_PICKLE_FORMAT_PICKLE);
        if (ret < 0)
                goto finish;
        if (o->format == GM_SNAPSHOT_PICKLE_1_13) {
                write_segments(&r);
        } else {
                gm_pickler_begin_dict(&r.w);
                gm_pickler_key(&r.w, "segments");
                write_segments(&r);
                gm_pickler_key(&r.w, "device_traces");
                write_traces(&r);
                gm_pickler_key(&r.w, "allocator_settings");
                write_settings(&r.w, o->config);
                key_empty_list(&r.w, "external_annotations");
                gm_pickler_end_dict(&r.w);
        }
        char *buf;
        size_t len;
        ret = gm_pickler_finish(&r.w, &buf, &len);
        if (ret == 0 && o->max_bytes && len > o->max_bytes) {
                free(buf);
                ret = -EFBIG;
        } else if (ret == 0) {
                *ret_buf = buf;
                *ret_len = len;
        }
finish:
        free(r.allocs);
        gm_u64map_done(&r.owners_by_pid);
        return ret;
}

int gm_snapshot_write(const gm_snapshot_source_t *src, gm_snapshot_format_t fmt, char **ret_buf, size_t *ret_len) {
        gm_snapshot_data_t *d;
        int r;

        if (!src || src->device < 0 || !src->config || (src->n_heaps > 0 && !src->heaps) ||
            (unsigned) fmt >= _GM_SNAPSHOT_FORMAT_MAX)
                return -EINVAL;
        for (size_t i = 0; i < src->n_heaps; i++)
                if (!src->heaps[i].heap)
                        return -EINVAL;
        if ((r = gm_snapshot_data_new(&d)) < 0)
                return r;
        for (size_t i = 0; i < src->n_heaps && r == 0; i++) {
                const gm_snapshot_heap_t *hp = &src->heaps[i];
                gm_snapshot_owner_t o = {.pid = hp->pid, .tenant = hp->tenant, .session_id = hp->session_id};
                uint32_t owner;
                r = gm_snapshot_data_add_owner(d, &o, &owner);
                if (r == 0)
                        r = gm_snapshot_data_add_heap(d, owner, hp->heap);
        }
        if (r == 0)
                r = gm_snapshot_data_add_history(d, src->history, src->only_heap_pids);
        gm_snapshot_options_t opts = {.device = src->device, .format = fmt, .config = src->config};
        if (r == 0)
                r = gm_snapshot_render(d, &opts, ret_buf, ret_len);
        gm_snapshot_data_free(d);
        return r;
}

/* ---- a local session's answer ---- */

#define ANSWER_MAGIC "GMSNAP1"

/* Fixed-size records, in this order after the header. */
typedef struct answer_header {
        char magic[8];
        uint64_t n_segments, n_blocks, n_traces, n_frames, strings_len;
        uint64_t va_span; /* every address of the answer lies below it */
} answer_header_t;

typedef struct answer_segment {
        uint64_t segment_id, offset, addr, size, stream;
        uint32_t n_blocks;
        uint32_t flags; /* ANSWER_SMALL, ANSWER_EXPANDABLE */
} answer_segment_t;

/* flags: the pool bits, and the heap tag id in bits 8-15 (tagged pools). */
enum { ANSWER_SMALL = 1, ANSWER_EXPANDABLE = 2, ANSWER_TAG_SHIFT = 8 };

typedef struct answer_block {
        uint64_t size, requested_size;
        uint32_t state, pad;
} answer_block_t;

typedef struct answer_trace {
        uint32_t action, n_frames;
        uint64_t first_frame, addr, size, stream, time_us;
} answer_trace_t;

typedef struct answer_frame {
        uint32_t filename, name, line, pad; /* string offsets */
} answer_frame_t;

/* The encoder's growing buffer. */
typedef struct out {
        char *buf;
        size_t len, cap, max;
        int error;
} out_t;

static void *out_reserve(out_t *o, size_t n) {
        if (o->error)
                return NULL;
        if (n > SIZE_MAX - o->len || (o->max && o->len + n > o->max)) {
                o->error = -EFBIG;
                return NULL;
        }
        if (!grow((void **) &o->buf, &o->cap, o->len, n, 1)) {
                o->error = -ENOMEM;
                return NULL;
        }
        void *p = o->buf + o->len;
        memset(p, 0, n);
        o->len += n;
        return p;
}

int gm_snapshot_answer_encode(const gm_heap_t *heap, const gm_history_t *h, size_t max_bytes, char **ret_buf,
                              size_t *ret_len) {
        gm_snapshot_data_t *d;
        uint32_t owner;
        int r = gm_snapshot_data_new(&d);
        if (r < 0)
                return r;
        gm_snapshot_owner_t o = {.tenant = ""};
        if ((r = gm_snapshot_data_add_owner(d, &o, &owner)) < 0 ||
            (r = gm_snapshot_data_add_heap(d, owner, heap)) < 0 ||
            (r = gm_snapshot_data_add_history(d, h, false)) < 0) {
                gm_snapshot_data_free(d);
                return r;
        }
        out_t out = {.max = max_bytes};
        answer_header_t *hd = out_reserve(&out, sizeof(*hd));
        size_t header_at = 0;
        uint64_t span = 0;
        for (size_t i = 0; i < d->n_segs && !out.error; i++) {
                const seg_rec_t *s = &d->segs[i];
                answer_segment_t *as = out_reserve(&out, sizeof(*as));
                if (!as)
                        break;
                *as = (answer_segment_t){.segment_id = s->info.id,
                                         .offset = s->info.offset,
                                         .addr = s->info.addr,
                                         .size = s->info.size,
                                         .stream = s->info.stream,
                                         .n_blocks = (uint32_t) s->n_blocks,
                                         .flags = (s->info.small_pool ? ANSWER_SMALL : 0u) |
                                                  (s->info.expandable ? ANSWER_EXPANDABLE : 0u) |
                                                  (uint32_t) s->info.tag << ANSWER_TAG_SHIFT};
                if (s->info.addr + s->info.size > span)
                        span = s->info.addr + s->info.size;
        }
        for (size_t i = 0; i < d->n_blocks && !out.error; i++) {
                answer_block_t *ab = out_reserve(&out, sizeof(*ab));
                if (ab)
                        *ab = (answer_block_t){.size = d->blocks[i].size,
                                               .requested_size = d->blocks[i].requested_size,
                                               .state = (uint32_t) d->blocks[i].state};
        }
        for (size_t i = 0; i < d->n_traces && !out.error; i++) {
                const trace_rec_t *t = &d->traces[i];
                answer_trace_t *at = out_reserve(&out, sizeof(*at));
                if (!at)
                        break;
                *at = (answer_trace_t){.action = (uint32_t) t->e.action,
                                       .n_frames = (uint32_t) t->n_frames,
                                       .first_frame = t->first_frame,
                                       .addr = t->e.addr,
                                       .size = t->e.size,
                                       .stream = t->e.stream,
                                       .time_us = t->e.time_us};
                if (t->e.action != GM_TRACE_OOM && t->e.addr + t->e.size > span)
                        span = t->e.addr + t->e.size;
        }
        for (size_t i = 0; i < d->n_frames && !out.error; i++) {
                answer_frame_t *af = out_reserve(&out, sizeof(*af));
                if (af)
                        *af = (answer_frame_t){.filename = (uint32_t) d->frames[i].filename,
                                               .name = (uint32_t) d->frames[i].name,
                                               .line = d->frames[i].line};
        }
        if (d->n_strings > UINT32_MAX)
                out.error = -EFBIG;
        char *strings = out_reserve(&out, d->n_strings);
        if (strings)
                memcpy(strings, d->strings, d->n_strings);
        if (out.error == 0) {
                hd = (answer_header_t *) (void *) (out.buf + header_at);
                memcpy(hd->magic, ANSWER_MAGIC, sizeof(hd->magic));
                hd->n_segments = d->n_segs;
                hd->n_blocks = d->n_blocks;
                hd->n_traces = d->n_traces;
                hd->n_frames = d->n_frames;
                hd->strings_len = d->n_strings;
                hd->va_span = span;
        }
        gm_snapshot_data_free(d);
        if (out.error) {
                free(out.buf);
                return out.error;
        }
        *ret_buf = out.buf;
        *ret_len = out.len;
        return 0;
}

/* A view of `count` records of `size` bytes at *at in buf, moving *at on. */
static const void *records(const char *buf, size_t len, size_t *at, uint64_t count, size_t size) {
        if (count > (len - *at) / size)
                return NULL;
        const void *p = buf + *at;
        *at += (size_t) count * size;
        return p;
}

/* Whether [offset, offset + size) of segment_id is made of granted pieces. */
static bool granted(const gm_snapshot_answer_limits_t *lim, uint64_t segment_id, uint64_t offset, uint64_t size) {
        size_t lo = 0, hi = lim->n_pieces;
        while (lo < hi) { /* the first piece of the segment */
                size_t mid = lo + (hi - lo) / 2;
                if (lim->pieces[mid].segment_id < segment_id)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        uint64_t at = offset, end = offset + size;
        for (size_t i = lo; i < lim->n_pieces && lim->pieces[i].segment_id == segment_id && at < end; i++) {
                const gm_snapshot_piece_t *p = &lim->pieces[i];
                if (end > p->va_size)
                        return false;
                if (p->offset <= at && at < p->offset + p->size)
                        at = p->offset + p->size;
        }
        return at >= end;
}

typedef struct seg_order {
        uint64_t key1, key2, end;
} seg_order_t;

static int cmp_seg_order(const void *a, const void *b) {
        const seg_order_t *x = a, *y = b;
        if (x->key1 != y->key1)
                return (x->key1 > y->key1) - (x->key1 < y->key1);
        return (x->key2 > y->key2) - (x->key2 < y->key2);
}

/* Whether sorted ranges (key1 groups, [key2, end) ranges) overlap. */
static bool ranges_overlap(seg_order_t *o, size_t n) {
        if (n > 1)
                qsort(o, n, sizeof(*o), cmp_seg_order);
        for (size_t i = 1; i < n; i++)
                if (o[i].key1 == o[i - 1].key1 && o[i].key2 < o[i - 1].end)
                        return true;
        return false;
}

/* Checks the segments of an answer: granted, within the span, no overlap. */
static int check_answer_segments(const answer_segment_t *segs, size_t n, const gm_snapshot_answer_limits_t *lim,
                                 uint64_t span) {
        seg_order_t *by_piece = malloc((n + 1) * sizeof(*by_piece));
        seg_order_t *by_addr = malloc((n + 1) * sizeof(*by_addr));
        int r = by_piece && by_addr ? 0 : -ENOMEM;
        for (size_t i = 0; i < n && r == 0; i++) {
                const answer_segment_t *s = &segs[i];
                if (s->size == 0 || s->size > span || s->addr > span - s->size || s->offset > UINT64_MAX - s->size ||
                    !granted(lim, s->segment_id, s->offset, s->size))
                        r = -EBADMSG;
                by_piece[i] = (seg_order_t){.key1 = s->segment_id, .key2 = s->offset, .end = s->offset + s->size};
                by_addr[i] = (seg_order_t){.key2 = s->addr, .end = s->addr + s->size};
        }
        if (r == 0 && (ranges_overlap(by_piece, n) || ranges_overlap(by_addr, n)))
                r = -EBADMSG;
        free(by_piece);
        free(by_addr);
        return r;
}

/* Puts d's tables back to their lengths in `mark` (undoes a partial add). */
typedef struct data_mark {
        size_t segs, blocks, traces, frames, strings;
} data_mark_t;

static data_mark_t data_mark(const gm_snapshot_data_t *d) {
        return (data_mark_t){d->n_segs, d->n_blocks, d->n_traces, d->n_frames, d->n_strings};
}

static void data_rewind(gm_snapshot_data_t *d, data_mark_t m) {
        d->n_segs = m.segs;
        d->n_blocks = m.blocks;
        d->n_traces = m.traces;
        d->n_frames = m.frames;
        d->n_strings = m.strings;
}

static int add_answer_traces(gm_snapshot_data_t *d, const answer_trace_t *traces, uint64_t n_traces,
                             const answer_frame_t *frames, uint64_t n_frames, const char *strings, uint64_t strings_len,
                             const gm_snapshot_answer_limits_t *lim, uint64_t base, uint64_t span) {
        gm_frame_t stack[GM_SNAPSHOT_ANSWER_MAX_FRAMES];
        uint64_t last_us = 0;
        for (uint64_t i = 0; i < n_traces; i++) {
                const answer_trace_t *t = &traces[i];
                bool oom = t->action == GM_TRACE_OOM;
                if (t->action >= _GM_TRACE_ACTION_MAX || t->n_frames > GM_SNAPSHOT_ANSWER_MAX_FRAMES ||
                    t->first_frame > n_frames || t->n_frames > n_frames - t->first_frame ||
                    (!oom && (t->size > span || t->addr > span - t->size)))
                        return -EBADMSG;
                for (uint32_t k = 0; k < t->n_frames; k++) {
                        const answer_frame_t *f = &frames[t->first_frame + k];
                        if (f->filename >= strings_len || f->name >= strings_len)
                                return -EBADMSG;
                        stack[k] = (gm_frame_t){
                                .filename = strings + f->filename, .line = f->line, .name = strings + f->name};
                }
                gm_history_entry_t e = {.action = (int) t->action,
                                        .addr = oom ? t->addr : t->addr + base,
                                        .size = t->size,
                                        .stream = t->stream,
                                        .time_us = t->time_us < last_us ? last_us : t->time_us,
                                        .pid = lim->pid};
                last_us = e.time_us;
                int r = gm_snapshot_data_add_trace(d, &e, stack, t->n_frames);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int add_answer(gm_snapshot_data_t *d, uint32_t owner, const char *buf, size_t len,
                      const gm_snapshot_answer_limits_t *lim, uint64_t base, uint64_t *ret_span) {
        answer_header_t hd;
        size_t at = sizeof(hd);
        if (len < sizeof(hd) || owner >= d->n_owners)
                return -EBADMSG;
        memcpy(&hd, buf, sizeof(hd));
        if (memcmp(hd.magic, ANSWER_MAGIC, sizeof(hd.magic)) != 0 || hd.va_span > lim->max_va_span ||
            base > UINT64_MAX - hd.va_span)
                return -EBADMSG;
        if (hd.n_segments > lim->max_blocks || hd.n_blocks > lim->max_blocks - hd.n_segments ||
            hd.n_traces > lim->max_blocks - hd.n_segments - hd.n_blocks)
                return -E2BIG;
        const answer_segment_t *segs = records(buf, len, &at, hd.n_segments, sizeof(*segs));
        const answer_block_t *blocks = records(buf, len, &at, hd.n_blocks, sizeof(*blocks));
        const answer_trace_t *traces = records(buf, len, &at, hd.n_traces, sizeof(*traces));
        const answer_frame_t *frames = records(buf, len, &at, hd.n_frames, sizeof(*frames));
        const char *strings = records(buf, len, &at, hd.strings_len, 1);
        if (!segs || !blocks || !traces || !frames || !strings || at != len ||
            (hd.strings_len > 0 && strings[hd.strings_len - 1] != '\0') || (hd.n_frames > 0 && hd.strings_len == 0))
                return -EBADMSG;
        int r = check_answer_segments(segs, hd.n_segments, lim, hd.va_span);
        if (r < 0)
                return r;
        uint64_t next_block = 0;
        for (uint64_t i = 0; i < hd.n_segments; i++) {
                const answer_segment_t *s = &segs[i];
                gm_block_info_t bi[64];
                if (s->n_blocks == 0 || s->n_blocks > hd.n_blocks - next_block)
                        return -EBADMSG;
                gm_segment_info_t info = {.id = s->segment_id,
                                          .addr = s->addr + base,
                                          .offset = s->offset,
                                          .size = s->size,
                                          .stream = s->stream,
                                          .small_pool = s->flags & ANSWER_SMALL,
                                          .expandable = s->flags & ANSWER_EXPANDABLE,
                                          .tag = s->flags >> ANSWER_TAG_SHIFT};
                if (info.tag >= GM_HEAP_MAX_TAGS)
                        return -EBADMSG;
                /* Blocks go in through the checked path, in batches. */
                if ((r = GROW(d, segs, 1)) < 0)
                        return r;
                seg_rec_t *rec = &d->segs[d->n_segs];
                *rec = (seg_rec_t){.info = info, .owner = owner, .first_block = d->n_blocks};
                uint64_t addr = info.addr;
                for (uint32_t k = 0; k < s->n_blocks; k += 64) {
                        uint32_t n = s->n_blocks - k < 64 ? s->n_blocks - k : 64;
                        for (uint32_t j = 0; j < n; j++) {
                                const answer_block_t *b = &blocks[next_block + k + j];
                                if (b->size == 0 || b->size > s->size || addr - info.addr > s->size - b->size ||
                                    b->state > GM_BLOCK_ACTIVE_PENDING_FREE || b->requested_size > b->size ||
                                    (b->state != GM_BLOCK_INACTIVE && b->requested_size == 0))
                                        return -EBADMSG;
                                bi[j] = (gm_block_info_t){.addr = addr,
                                                          .size = b->size,
                                                          .requested_size = b->requested_size,
                                                          .state = (gm_block_state_t) b->state};
                                addr += b->size;
                        }
                        if ((r = GROW(d, blocks, n)) < 0)
                                return r;
                        memcpy(d->blocks + d->n_blocks, bi, n * sizeof(*bi));
                        d->n_blocks += n;
                        rec->n_blocks += n;
                }
                if (addr - info.addr != s->size)
                        return -EBADMSG;
                next_block += s->n_blocks;
                d->n_segs++;
        }
        if (next_block != hd.n_blocks)
                return -EBADMSG;
        r = add_answer_traces(d, traces, hd.n_traces, frames, hd.n_frames, strings, hd.strings_len, lim, base,
                              hd.va_span);
        if (r == 0)
                *ret_span = hd.va_span;
        return r;
}

int gm_snapshot_data_add_answer(gm_snapshot_data_t *d, uint32_t owner, const void *buf, size_t len,
                                const gm_snapshot_answer_limits_t *lim, uint64_t base, uint64_t *ret_span) {
        data_mark_t mark = data_mark(d);
        int r = add_answer(d, owner, buf, len, lim, base, ret_span);
        if (r < 0)
                data_rewind(d, mark);
        return r;
}

int gm_snapshot_data_add_pieces(gm_snapshot_data_t *d, uint32_t owner, const gm_snapshot_piece_t *pieces,
                                size_t n_pieces, uint64_t base, uint64_t *ret_span) {
        data_mark_t mark = data_mark(d);
        uint64_t at = base;
        for (size_t i = 0; i < n_pieces;) {
                size_t j = i + 1;
                uint64_t size = pieces[i].size;
                while (j < n_pieces && pieces[j].segment_id == pieces[i].segment_id &&
                       pieces[j].offset == pieces[j - 1].offset + pieces[j - 1].size)
                        size += pieces[j++].size;
                gm_segment_info_t seg = {.id = pieces[i].segment_id,
                                         .addr = at,
                                         .offset = pieces[i].offset,
                                         .size = size,
                                         .small_pool = pieces[i].va_size <= (2u << 20),
                                         .expandable = pieces[i].size < pieces[i].va_size};
                /* What it holds is not known: counted as allocated, as a live block would be. */
                gm_block_info_t whole = {
                        .addr = at, .size = size, .requested_size = size, .state = GM_BLOCK_ACTIVE_ALLOCATED};
                int r = gm_snapshot_data_add_segment(d, owner, &seg, &whole, 1);
                if (r < 0) {
                        data_rewind(d, mark);
                        return r;
                }
                at += size;
                i = j;
        }
        *ret_span = at - base;
        return 0;
}
