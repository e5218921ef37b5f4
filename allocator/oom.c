/* Out-of-memory messages: see oom.h. The first part reproduces PyTorch 2.3+'s
 * CUDACachingAllocator text byte for byte (without the NVML per-process and
 * private-pool clauses, which have no broker equivalent); sizes use PyTorch's
 * format_size() everywhere so the two parts read alike. */
#include "oom.h"
#include "size.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

#define SIZE_BUF 32

typedef struct out {
        char *buf;
        size_t len, pos;
        bool overflow;
} out_t;

static void out_printf(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_printf(out_t *o, const char *fmt, ...) {
        if (o->overflow)
                return;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->buf + o->pos, o->len - o->pos, fmt, ap);
        va_end(ap);
        if (n < 0 || (size_t) n >= o->len - o->pos)
                o->overflow = true;
        else
                o->pos += (size_t) n;
}

static const char *format_size(uint64_t v, char b[static SIZE_BUF]) {
        return gm_format_size_as(v, GM_SIZE_PYTORCH, b, SIZE_BUF);
}

static uint64_t sub_sat(uint64_t a, uint64_t b) {
        return a > b ? a - b : 0;
}

/* Memory the driver counts as used that no broker segment accounts for. */
static uint64_t external_bytes(const gm_oom_report_t *r) {
        return sub_sat(sub_sat(r->device_total, r->device_free), r->broker_reserved);
}

/* Whether freeing `extra` bytes on top of what is free would fit the request. */
static bool would_fit_with(const gm_oom_report_t *r, uint64_t extra) {
        return extra > 0 && r->device_free + extra >= r->alloc_size;
}

gm_oom_reason_t gm_oom_classify(const gm_oom_report_t *r) {
        if (r->tenant_quota > 0 && r->tenant_reserved + r->alloc_size > r->tenant_quota)
                return GM_OOM_QUOTA;
        if (r->session_cached >= r->block_size && r->largest_free < r->block_size)
                return GM_OOM_FRAGMENTATION;
        if (would_fit_with(r, r->others_cached))
                return GM_OOM_RECLAIM;
        if (would_fit_with(r, external_bytes(r)))
                return GM_OOM_EXTERNAL;
        return GM_OOM_DEVICE_FULL;
}

static void format_diagnosis(out_t *o, const gm_oom_report_t *r) {
        char s1[SIZE_BUF], s2[SIZE_BUF], s3[SIZE_BUF];
        const char *tenant = r->tenant ? r->tenant : "(unknown)";

        switch (r->reason) {
        case GM_OOM_QUOTA:
                if (r->caller_admin)
                        out_printf(o,
                                   "Raise the quota with `gpumemctl quota set %s BYTES`, or free tensors and release "
                                   "cached memory (torch.cuda.empty_cache(), `gpumemctl trim --tenant %s`).",
                                   tenant, tenant);
                else
                        out_printf(o,
                                   "Free tensors the tenant's processes no longer need (`gpumemctl clients` lists "
                                   "them) and release their cached memory (torch.cuda.empty_cache() in each), or ask "
                                   "an administrator to raise the quota (`gpumemctl quota get %s` shows it).",
                                   tenant);
                break;
        case GM_OOM_FRAGMENTATION:
                out_printf(o,
                           "fragmentation: this session's cache holds %s free, enough for the %s block requested, "
                           "but its largest free block is %s. Start gpumemd with --alloc-conf "
                           "expandable_segments:True, or set max_split_size_mb to keep large blocks from being split.",
                           format_size(r->session_cached, s1), format_size(r->block_size, s2),
                           format_size(r->largest_free, s3));
                break;
        case GM_OOM_DEVICE_FULL:
                out_printf(o,
                           "the device is full of live allocations: %s of its %s is allocated by gpumemd sessions "
                           "(%s reserved), with no cache left to reclaim. Free tensors or reduce the batch size.",
                           format_size(r->broker_live, s1), format_size(r->device_total, s2),
                           format_size(r->broker_reserved, s3));
                break;
        case GM_OOM_RECLAIM:
                out_printf(o,
                           "%s is held in other tenants' caches and could not be reclaimed in time. Retry the "
                           "allocation, or have an administrator run `gpumemctl trim`.",
                           format_size(r->others_cached, s1));
                break;
        case GM_OOM_EXTERNAL:
                out_printf(o,
                           "%s is used outside gpumemd (the driver reports %s used, gpumemd has %s reserved). Stop "
                           "the other processes on this GPU or run them through gpumemd.",
                           format_size(external_bytes(r), s1),
                           format_size(sub_sat(r->device_total, r->device_free), s2),
                           format_size(r->broker_reserved, s3));
                break;
        default:
                break;
        }
}

/* The quota's own lead, in place of PyTorch's device-centred text. */
static void format_quota_lead(out_t *o, const gm_oom_report_t *r) {
        char s1[SIZE_BUF], s2[SIZE_BUF], s3[SIZE_BUF], s4[SIZE_BUF], s5[SIZE_BUF];

        out_printf(o,
                   "CUDA out of memory: tenant '%s' is at its gpumemd quota. Tried to allocate %s on top of the %s "
                   "the tenant has reserved, over its quota of %s (%s in live allocations, %s cached). ",
                   r->tenant ? r->tenant : "(unknown)", format_size(r->alloc_size, s1),
                   format_size(r->tenant_reserved, s2), format_size(r->tenant_quota, s3),
                   format_size(r->tenant_live, s4), format_size(sub_sat(r->tenant_reserved, r->tenant_live), s5));
        out_printf(o,
                   "GPU %d itself has %s free of %s; this process has %s allocated and %s reserved but unallocated. "
                   "gpumemd: ",
                   r->device, format_size(r->device_free, s1), format_size(r->device_total, s2),
                   format_size(r->session_allocated, s3),
                   format_size(sub_sat(r->session_reserved, r->session_allocated), s4));
}

int gm_oom_format(const gm_oom_report_t *r, char *buf, size_t len) {
        char s1[SIZE_BUF], s2[SIZE_BUF], s3[SIZE_BUF], s4[SIZE_BUF], s5[SIZE_BUF];
        out_t o = {.buf = buf, .len = len};

        if ((unsigned) r->reason >= _GM_OOM_REASON_MAX)
                return -EINVAL;
        if (r->reason == GM_OOM_QUOTA) {
                format_quota_lead(&o, r);
                format_diagnosis(&o, r);
                return o.overflow || o.pos > INT_MAX ? -ENOSPC : (int) o.pos;
        }
        out_printf(&o,
                   "CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s is "
                   "free. ",
                   format_size(r->alloc_size, s1), r->device, format_size(r->device_total, s2),
                   format_size(r->device_free, s3));
        if (r->allowed > 0)
                out_printf(&o, "%s allowed; ", format_size(r->allowed, s1));
        out_printf(&o,
                   "Of the allocated memory %s is allocated by PyTorch, and %s is reserved by PyTorch but "
                   "unallocated. If reserved but unallocated memory is large try setting "
                   "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
                   "Memory Management  "
                   "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-"
                   "alloc-conf) gpumemd: ",
                   format_size(r->session_allocated, s4),
                   format_size(sub_sat(r->session_reserved, r->session_allocated), s5));
        format_diagnosis(&o, r);
        if (o.overflow || o.pos > INT_MAX)
                return -ENOSPC;
        return (int) o.pos;
}
