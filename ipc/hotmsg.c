/* The fixed-layout codec of the hot messages (hotmsg.h has the layout and
 * why its magic byte never starts a protobuf Envelope). */
#include "hotmsg.h"

#include <endian.h>
#include <errno.h>
#include <string.h>

#define FLAG_ALLOC_FREES_FENCED 1u
#define FLAG_FREE_DEFERRED 1u

static void put_u64(uint8_t *p, uint64_t v) {
        v = htole64(v);
        memcpy(p, &v, sizeof(v));
}

static uint64_t get_u64(const uint8_t *p) {
        uint64_t v;
        memcpy(&v, p, sizeof(v));
        return le64toh(v);
}

static void put_ids(uint8_t *p, const uint64_t *ids, size_t n) {
        for (size_t i = 0; i < n; i++)
                put_u64(p + 8 * i, ids[i]);
}

/* Whether an Alloc is carried whole: no tag, frames, fence reports or other
 * streams fenced, not made during a stream capture, no fields this build
 * does not know. */
static bool alloc_fits(const Gpumem__Alloc *a) {
        return a->base.n_unknown_fields == 0 && a->n_frames == 0 && a->n_fences_done == 0 &&
               a->n_other_frees_fenced == 0 && !a->capturing && a->n_freed_block_ids <= GM_CARRIED_FREES_MAX &&
               (!a->tag || !a->tag[0]);
}

/* Whether an AllocReply is the cached case: no mapping, move or mark. */
static bool alloc_reply_fits(const Gpumem__AllocReply *r) {
        return r->base.n_unknown_fields == 0 && r->n_new_mappings == 0 && r->n_page_moves == 0 && r->n_fence_marks == 0;
}

static bool free_fits(const Gpumem__Free *f) {
        return f->base.n_unknown_fields == 0 && f->n_more_block_ids <= GM_CARRIED_FREES_MAX;
}

int gm_hotmsg_encode(const Gpumem__Envelope *env, uint8_t *buf, size_t cap, size_t *ret_len) {
        uint8_t kind, flags = 0;
        size_t n_ids = 0, n_fields;
        const uint64_t *ids = NULL;
        uint64_t fields[4];
        switch (env->body_case) {
        case GPUMEM__ENVELOPE__BODY_ALLOC:
                if (!alloc_fits(env->alloc))
                        return -EOPNOTSUPP;
                kind = GM_HOTMSG_KIND_ALLOC;
                flags = env->alloc->frees_fenced ? FLAG_ALLOC_FREES_FENCED : 0;
                fields[0] = env->alloc->size;
                fields[1] = env->alloc->stream;
                n_fields = 2;
                ids = env->alloc->freed_block_ids;
                n_ids = env->alloc->n_freed_block_ids;
                break;
        case GPUMEM__ENVELOPE__BODY_ALLOC_REPLY:
                if (!alloc_reply_fits(env->alloc_reply))
                        return -EOPNOTSUPP;
                kind = GM_HOTMSG_KIND_ALLOC_REPLY;
                fields[0] = env->alloc_reply->block_id;
                fields[1] = env->alloc_reply->segment_id;
                fields[2] = env->alloc_reply->offset;
                fields[3] = env->alloc_reply->block_size;
                n_fields = 4;
                break;
        case GPUMEM__ENVELOPE__BODY_FREE:
                if (!free_fits(env->free))
                        return -EOPNOTSUPP;
                kind = GM_HOTMSG_KIND_FREE;
                flags = env->free->deferred ? FLAG_FREE_DEFERRED : 0;
                fields[0] = env->free->block_id;
                n_fields = 1;
                ids = env->free->more_block_ids;
                n_ids = env->free->n_more_block_ids;
                break;
        default:
                return -EOPNOTSUPP;
        }
        size_t len = GM_HOTMSG_HEADER_SIZE + 8 * (n_fields + n_ids);
        if (len > cap)
                return -EMSGSIZE;
        uint32_t n32 = htole32((uint32_t) n_ids);
        buf[0] = GM_HOTMSG_MAGIC;
        buf[1] = GM_HOTMSG_VERSION;
        buf[2] = kind;
        buf[3] = flags;
        memcpy(buf + 4, &n32, sizeof(n32));
        put_u64(buf + 8, env->request_id);
        put_ids(buf + GM_HOTMSG_HEADER_SIZE, fields, n_fields);
        put_ids(buf + GM_HOTMSG_HEADER_SIZE + 8 * n_fields, ids, n_ids);
        *ret_len = len;
        return 0;
}

static void get_ids(uint64_t *ids, const uint8_t *p, size_t n) {
        for (size_t i = 0; i < n; i++)
                ids[i] = get_u64(p + 8 * i);
}

int gm_hotmsg_decode(const void *buf, size_t len, Gpumem__Envelope *ret_env, gm_hotmsg_body_t *body) {
        const uint8_t *p = buf;
        if (len < GM_HOTMSG_HEADER_SIZE || p[0] != GM_HOTMSG_MAGIC || p[1] != GM_HOTMSG_VERSION)
                return -EBADMSG;
        uint8_t kind = p[2], flags = p[3];
        uint32_t n_ids;
        memcpy(&n_ids, p + 4, sizeof(n_ids));
        n_ids = le32toh(n_ids);
        /* Each kind: its fixed fields, the flags it knows, whether it carries ids. */
        size_t n_fields;
        uint8_t known_flags;
        bool has_ids;
        switch (kind) {
        case GM_HOTMSG_KIND_ALLOC:
                n_fields = 2, known_flags = FLAG_ALLOC_FREES_FENCED, has_ids = true;
                break;
        case GM_HOTMSG_KIND_ALLOC_REPLY:
                n_fields = 4, known_flags = 0, has_ids = false;
                break;
        case GM_HOTMSG_KIND_FREE:
                n_fields = 1, known_flags = FLAG_FREE_DEFERRED, has_ids = true;
                break;
        default:
                return -EBADMSG;
        }
        if ((flags & ~known_flags) || n_ids > (has_ids ? GM_CARRIED_FREES_MAX : 0) ||
            len != GM_HOTMSG_HEADER_SIZE + 8 * (n_fields + (size_t) n_ids))
                return -EBADMSG;
        const uint8_t *f = p + GM_HOTMSG_HEADER_SIZE;
        Gpumem__Envelope env = GPUMEM__ENVELOPE__INIT;
        env.request_id = get_u64(p + 8);
        get_ids(body->ids, f + 8 * n_fields, n_ids);
        switch (kind) {
        case GM_HOTMSG_KIND_ALLOC:
                gpumem__alloc__init(&body->msg.alloc);
                body->msg.alloc.size = get_u64(f);
                body->msg.alloc.stream = get_u64(f + 8);
                body->msg.alloc.frees_fenced = flags & FLAG_ALLOC_FREES_FENCED;
                body->msg.alloc.n_freed_block_ids = n_ids;
                body->msg.alloc.freed_block_ids = n_ids ? body->ids : NULL;
                env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC;
                env.alloc = &body->msg.alloc;
                break;
        case GM_HOTMSG_KIND_ALLOC_REPLY:
                gpumem__alloc_reply__init(&body->msg.alloc_reply);
                body->msg.alloc_reply.block_id = get_u64(f);
                body->msg.alloc_reply.segment_id = get_u64(f + 8);
                body->msg.alloc_reply.offset = get_u64(f + 16);
                body->msg.alloc_reply.block_size = get_u64(f + 24);
                env.body_case = GPUMEM__ENVELOPE__BODY_ALLOC_REPLY;
                env.alloc_reply = &body->msg.alloc_reply;
                break;
        default: /* GM_HOTMSG_KIND_FREE */
                gpumem__free__init(&body->msg.free);
                body->msg.free.block_id = get_u64(f);
                body->msg.free.deferred = flags & FLAG_FREE_DEFERRED;
                body->msg.free.n_more_block_ids = n_ids;
                body->msg.free.more_block_ids = n_ids ? body->ids : NULL;
                env.body_case = GPUMEM__ENVELOPE__BODY_FREE;
                env.free = &body->msg.free;
                break;
        }
        *ret_env = env;
        return 0;
}
