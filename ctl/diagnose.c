/* The diagnosis rules (diagnose.h, docs/diagnosis.md). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "diagnose.h"
#include "oom.h"
#include "size.h"
#include "text.h"

_Static_assert(_GM_OOM_REASON_MAX == GM_DIAG_REFUSAL_CLASSES, "one class per gm_oom_reason_t");

static const char *const kind_names[_GM_DIAG_KIND_MAX] = {
        [GM_DIAG_LEAK] = "leak",         [GM_DIAG_FRAGMENTATION] = "fragmentation",
        [GM_DIAG_STREAMS] = "streams",   [GM_DIAG_IDLE_CACHE] = "idle_cache",
        [GM_DIAG_REFUSALS] = "refusals",
};

static const char *const kind_titles[_GM_DIAG_KIND_MAX] = {
        [GM_DIAG_LEAK] = "leak suspected",
        [GM_DIAG_FRAGMENTATION] = "fragmentation",
        [GM_DIAG_STREAMS] = "waiting on streams",
        [GM_DIAG_IDLE_CACHE] = "idle cache",
        [GM_DIAG_REFUSALS] = "out-of-memory refusals",
};

static const char *const class_names[GM_DIAG_REFUSAL_CLASSES] = {"quota", "fragmentation", "device", "reclaim",
                                                                 "external"};

/* What each class means, for people. */
static const char *const class_meanings[GM_DIAG_REFUSAL_CLASSES] = {
        "the tenant's quota", "fragmentation (free bytes, no block large enough)", "the device full of live memory",
        "memory held in other caches, not given back in time", "memory used outside the broker"};

const char *gm_diag_kind_name(gm_diag_kind_t kind) {
        return (unsigned) kind < _GM_DIAG_KIND_MAX ? kind_names[kind] : "unknown";
}

const char *gm_diag_kind_title(gm_diag_kind_t kind) {
        return (unsigned) kind < _GM_DIAG_KIND_MAX ? kind_titles[kind] : "unknown";
}

const char *gm_diag_refusal_class(unsigned reason) {
        return reason < GM_DIAG_REFUSAL_CLASSES ? class_names[reason] : "unknown";
}

int gm_diag_refusal_class_of(const char *name) {
        for (int i = 0; i < GM_DIAG_REFUSAL_CLASSES; i++)
                if (name && strcmp(name, class_names[i]) == 0)
                        return i;
        return -1;
}

const char *gm_diag_verdict(const gm_diagnosis_t *d) {
        return d->n_findings ? gm_diag_kind_name(d->findings[0].kind) : "healthy";
}

static uint64_t min_u64(uint64_t a, uint64_t b) {
        return a < b ? a : b;
}

static uint64_t max_u64(uint64_t a, uint64_t b) {
        return a > b ? a : b;
}

/* Sizes for the texts: a few per message. */
typedef struct sizes {
        char buf[8][32];
        unsigned next;
} sizes_t;

static const char *sz(sizes_t *s, uint64_t bytes) {
        char *b = s->buf[s->next++ % 8];
        return gm_format_size(bytes, b, sizeof(s->buf[0]));
}

static gm_diag_finding_t *add(gm_diagnosis_t *d, gm_diag_kind_t kind) {
        gm_diag_finding_t *f = &d->findings[d->n_findings++];
        f->kind = kind;
        f->summary[0] = f->next[0] = '\0';
        return f;
}

static const char *band(double ratio) {
        if (ratio > GM_DIAG_FRAG_SEVERE)
                return "severe";
        if (ratio >= GM_DIAG_FRAG_MILD)
                return "mild";
        return ratio >= 0.1 ? "slight" : "normal";
}

/* The figures of the window: the last sample's, floors, retries, idle time. */
static void figures(const gm_diag_input_t *in, gm_diag_figures_t *f) {
        const gm_sample_t *first = &in->samples[0], *last = &in->samples[in->n_samples - 1];
        *f = (gm_diag_figures_t){
                .allocated = last->allocated,
                .pending = last->pending,
                .inactive = gm_sample_inactive(last),
                .reserved = last->reserved,
                .inactive_split = last->inactive_split,
                .idle_whole = gm_sample_idle_whole(last),
                .largest_free = last->largest_free,
                .releasing = last->releasing,
                .segments = last->segments,
                .retries = last->retries >= first->retries ? last->retries - first->retries : last->retries,
                .others_refused = in->others_refused,
        };
        memcpy(f->refusals, in->refusals, sizeof(f->refusals));
        f->frag_ratio = last->reserved ? 1.0 - (double) last->allocated / (double) last->reserved : 0;
        if (f->frag_ratio < 0)
                f->frag_ratio = 0;
        f->frag_band = band(f->frag_ratio);
        uint64_t start = first->t_ms, end = max_u64(last->until_ms, start);
        f->covered_ms = end - start;
        uint64_t mid = start + (end - start) / 2;
        bool any_late = false;
        f->floor_early = UINT64_MAX;
        f->floor_late = UINT64_MAX;
        for (size_t i = 0; i < in->n_samples; i++) {
                const gm_sample_t *s = &in->samples[i];
                f->request_max = max_u64(f->request_max, s->request_max);
                if (s->t_ms <= mid || i == 0) {
                        f->floor_early = min_u64(f->floor_early, s->allocated_min);
                } else {
                        f->floor_late = min_u64(f->floor_late, s->allocated_min);
                        any_late = true;
                }
        }
        if (!any_late)
                f->floor_late = 0;
        /* Idle since the first of the trailing samples with the same activity. */
        size_t i = in->n_samples - 1;
        while (i > 0 && in->samples[i - 1].allocations == last->allocations &&
               in->samples[i - 1].allocated == last->allocated)
                i--;
        bool quiet_in_span = last->allocated_min == last->allocated_max;
        /* A change merges into a sample only within its period, so a busy last
         * sample's activity ended by then, however long it is extended since. */
        uint64_t busy_until = min_u64(last->until_ms, last->t_ms + GM_SAMPLE_PERIOD_MS);
        uint64_t since = quiet_in_span || i < in->n_samples - 1 ? in->samples[i].t_ms : busy_until;
        f->idle_ms = in->now_ms > since ? in->now_ms - since : 0;
}

static bool leak_suspected(const gm_diag_figures_t *f) {
        if (f->floor_late == 0 || f->floor_early == UINT64_MAX)
                return false;
        uint64_t need = max_u64(GM_DIAG_MIN_BYTES, f->floor_early / 100 * GM_DIAG_LEAK_GROWTH_PCT);
        return f->floor_late >= f->floor_early + need && f->allocated >= f->floor_late;
}

static void rule_leak(gm_diagnosis_t *d) {
        const gm_diag_figures_t *f = &d->fig;
        if (!leak_suspected(f))
                return;
        sizes_t s = {0};
        gm_diag_finding_t *x = add(d, GM_DIAG_LEAK);
        gm_text_append(x->summary, sizeof(x->summary),
                       "allocated rose from a floor of %s to %s over %.1f s and never came back down "
                       "(the later half's lowest is %s): memory allocated in the window is still live",
                       sz(&s, f->floor_early), sz(&s, f->allocated), (double) f->covered_ms / 1000.0,
                       sz(&s, f->floor_late));
        gm_text_append(
                x->next, sizeof(x->next),
                "find who still holds it: turn memory history on (gpumemctl history on), let it run, then "
                "gpumemctl snapshot -o snap.pickle --pid PID and open it in https://pytorch.org/memory_viz: the "
                "blocks still live, with the stacks that allocated them; look for tensors kept in lists, caches or "
                "autograd graphs (a loss kept without .item(), retained graphs)");
}

static void rule_fragmentation(gm_diagnosis_t *d) {
        const gm_diag_figures_t *f = &d->fig;
        bool refused = f->refusals[GM_OOM_FRAGMENTATION] > 0;
        bool pinned = f->inactive_split >= GM_DIAG_MIN_BYTES && f->inactive_split >= f->pending + f->idle_whole;
        if (!refused && !(f->frag_ratio >= GM_DIAG_FRAG_MILD && pinned && f->allocated >= GM_DIAG_MIN_BYTES))
                return;
        sizes_t s = {0};
        gm_diag_finding_t *x = add(d, GM_DIAG_FRAGMENTATION);
        gm_text_append(
                x->summary, sizeof(x->summary),
                "reserved %s for %s allocated: fragmentation ratio %.2f (%s); %s of free blocks are pinned between "
                "live blocks (inactive split), %s in whole idle segments, %s waiting on streams",
                sz(&s, f->reserved), sz(&s, f->allocated), f->frag_ratio, f->frag_band, sz(&s, f->inactive_split),
                sz(&s, f->idle_whole), sz(&s, f->pending));
        if (f->request_max > f->largest_free)
                gm_text_append(x->summary, sizeof(x->summary),
                               "; the largest free block, %s, is smaller than recent requests of %s",
                               sz(&s, f->largest_free), sz(&s, f->request_max));
        double over = f->allocated ? (double) f->reserved / (double) f->allocated : 0;
        bool expandable = over > GM_DIAG_EXPANDABLE_RATIO || f->retries > GM_DIAG_EXPANDABLE_RETRIES;
        gm_text_append(
                x->next, sizeof(x->next),
                "1. expandable_segments:True (gpumemctl alloc-conf, or alloc_conf in gpumemd.conf)%s; "
                "2. still failing: max_split_size_mb (blocks above it are never split, so large free blocks stay "
                "whole); "
                "3. long runs: garbage_collection_threshold (frees idle cached blocks before the quota is reached); "
                "4. look at the layout: gpumemctl snapshot -o snap.pickle, opened in https://pytorch.org/memory_viz",
                expandable ? (over > GM_DIAG_EXPANDABLE_RATIO ? " (reserved/allocated is above 1.3)"
                                                              : " (more than 100 retries)")
                           : "");
}

static void rule_streams(gm_diagnosis_t *d) {
        const gm_diag_figures_t *f = &d->fig;
        if (f->pending < GM_DIAG_MIN_BYTES || (double) f->pending < GM_DIAG_PENDING_FRACTION * (double) f->reserved)
                return;
        sizes_t s = {0};
        gm_diag_finding_t *x = add(d, GM_DIAG_STREAMS);
        gm_text_append(
                x->summary, sizeof(x->summary),
                "%s of freed blocks (%.0f%% of reserved) wait for work on other streams before they can be reused",
                sz(&s, f->pending), 100.0 * (double) f->pending / (double) (f->reserved ? f->reserved : 1));
        gm_text_append(
                x->next, sizeof(x->next),
                "blocks used on another stream (record_stream) are reusable only once that stream's work is done: "
                "free them after synchronizing that stream, free them on the stream that used them last "
                "(gpumem_free_async), or allocate them on that stream in the first place");
}

static void rule_idle_cache(const gm_diag_input_t *in, gm_diagnosis_t *d) {
        const gm_diag_figures_t *f = &d->fig;
        uint64_t idle_need = min_u64(GM_DIAG_IDLE_MS, in->window_ms / 2);
        uint64_t held = f->idle_whole + f->releasing;
        if (held < GM_DIAG_MIN_BYTES || f->idle_ms < idle_need || f->others_refused == 0)
                return;
        sizes_t s = {0};
        gm_diag_finding_t *x = add(d, GM_DIAG_IDLE_CACHE);
        gm_text_append(x->summary, sizeof(x->summary),
                       "%s of idle cache (%s in whole idle segments, %s already asked back), no allocation or free for "
                       "%.1f s, while other processes were refused %" PRIu64 " time%s",
                       sz(&s, held), sz(&s, f->idle_whole), sz(&s, f->releasing), (double) f->idle_ms / 1000.0,
                       f->others_refused, f->others_refused == 1 ? "" : "s");
        if (f->releasing)
                gm_text_append(
                        x->summary, sizeof(x->summary),
                        "; reclaim already runs: what was asked back is not given back yet (is the process stopped "
                        "or blocked?)");
        gm_text_append(
                x->next, sizeof(x->next),
                "a trim gives the whole idle segments back at once: gpumemctl trim --tenant TENANT (admin), or the "
                "process's own empty_cache(); the daemon reclaims idle caches by itself when an allocation needs "
                "them, but a process that does not answer keeps its memory charged until it does or ends");
}

static void rule_refusals(const gm_diag_input_t *in, gm_diagnosis_t *d) {
        const gm_diag_figures_t *f = &d->fig;
        uint64_t total = 0;
        unsigned top = 0;
        for (unsigned i = 0; i < GM_DIAG_REFUSAL_CLASSES; i++) {
                total += f->refusals[i];
                if (f->refusals[i] > f->refusals[top])
                        top = i;
        }
        if (total == 0)
                return;
        sizes_t s = {0};
        gm_diag_finding_t *x = add(d, GM_DIAG_REFUSALS);
        gm_text_append(x->summary, sizeof(x->summary), "%" PRIu64 " refused in the window (largest %s):", total,
                       sz(&s, in->refused_bytes_max));
        for (unsigned i = 0; i < GM_DIAG_REFUSAL_CLASSES; i++)
                if (f->refusals[i])
                        gm_text_append(x->summary, sizeof(x->summary), " %" PRIu64 " by %s (%s);", f->refusals[i],
                                       class_meanings[i], class_names[i]);
        static const char *const steps[GM_DIAG_REFUSAL_CLASSES] = {
                "free memory or trim this tenant's cache (empty_cache(), gpumemctl trim); only an admin can raise "
                "the quota (gpumemctl quota set)",
                "see the fragmentation advice: expandable_segments:True first",
                "live allocations fill the device: smaller batches or models, or fewer processes on this GPU",
                "other processes hold idle cache and did not give it back in time: diagnose them (idle cache); "
                "an admin can trim them (gpumemctl trim --tenant T)",
                "memory is used on the GPU outside the broker: nvidia-smi shows which processes",
        };
        gm_text_append(x->next, sizeof(x->next), "%s", steps[top]);
}

int gm_diagnose(const gm_diag_input_t *in, gm_diagnosis_t *ret) {
        if (!in->samples || in->n_samples == 0)
                return -EINVAL;
        gm_diagnosis_t *d = ret;
        d->n_findings = 0;
        figures(in, &d->fig);
        rule_leak(d);
        rule_fragmentation(d);
        rule_streams(d);
        rule_idle_cache(in, d);
        rule_refusals(in, d);
        return 0;
}
