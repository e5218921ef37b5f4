/* The fixed-layout codec of the central session's hot messages: Alloc,
 * AllocReply (the cached case) and Free, beside protobuf for everything else.
 *
 * A packet is one or the other by its first byte. A fixed-layout packet
 * starts with GM_HOTMSG_MAGIC (0x07); no protobuf Envelope can: its first
 * byte is the first byte of a field key, a varint (number << 3 | wire type),
 * and 0x07 (no continuation bit) is the whole key 7: field number 0 and wire
 * type 7, both invalid (numbers start at 1, wire types end at 5). An empty
 * packet is neither (the transport refuses it).
 *
 * Layout (little-endian, fixed sizes; the length must be exact):
 *   u8 magic (0x07), u8 version (GM_HOTMSG_VERSION), u8 kind, u8 flags,
 *   u32 n_ids, u64 request_id, then the kind's fields:
 *   ALLOC        u64 size, u64 stream, u64 freed_block_ids[n_ids]
 *                (flags bit 0: frees_fenced)
 *   ALLOC_REPLY  u64 block_id, segment_id, offset, block_size (n_ids 0, flags 0)
 *   FREE         u64 block_id, u64 more_block_ids[n_ids] (flags bit 0: deferred)
 * n_ids is at most GM_CARRIED_FREES_MAX. Any other version, kind, flag bit or
 * length is malformed, as bytes protobuf cannot parse are.
 *
 * Only a message the layout carries whole is encoded: an Alloc with a tag,
 * frames, fence reports, other streams fenced or `capturing` (rare: a graph
 * is captured once and its replays allocate nothing, so version 1 stays
 * as it is and either side of it still understands the other), a reply with
 * mappings, page moves or fence marks, any other body (an Error among them)
 * stays protobuf.
 * A decoded packet is the same Envelope protobuf would give, so the same
 * handlers check the same fields. The daemon offers the codec in
 * HelloReply.fixed_codec; a client uses it only when offered, and the daemon
 * answers in it only on a connection whose client has used it. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpumem.pb-c.h"
#include "msg.h"

#define GM_HOTMSG_MAGIC 0x07u
#define GM_HOTMSG_VERSION 1u

enum {
        GM_HOTMSG_KIND_ALLOC = 1,
        GM_HOTMSG_KIND_ALLOC_REPLY = 2,
        GM_HOTMSG_KIND_FREE = 3,
};

#define GM_HOTMSG_HEADER_SIZE 16u
/* The largest packet: a header, two fields and GM_CARRIED_FREES_MAX ids. */
#define GM_HOTMSG_MAX_SIZE (GM_HOTMSG_HEADER_SIZE + 4u * 8u + GM_CARRIED_FREES_MAX * 8u)

/* The storage a decoded envelope's body points into. */
typedef struct gm_hotmsg_body {
        union {
                Gpumem__Alloc alloc;
                Gpumem__AllocReply alloc_reply;
                Gpumem__Free free;
        } msg;
        uint64_t ids[GM_CARRIED_FREES_MAX];
} gm_hotmsg_body_t;

/* Whether a packet is in the fixed layout (its first byte), whatever follows. */
static inline bool gm_hotmsg_is(const void *buf, size_t len) {
        return len > 0 && *(const uint8_t *) buf == GM_HOTMSG_MAGIC;
}

/* Encodes env into buf (cap bytes, GM_HOTMSG_MAX_SIZE is always enough);
 * *ret_len is the packet's size. -EOPNOTSUPP for a message the layout does
 * not carry whole (send it as protobuf), -EMSGSIZE when cap is too small. */
int gm_hotmsg_encode(const Gpumem__Envelope *env, uint8_t *buf, size_t cap, size_t *ret_len);

/* Decodes one fixed-layout packet into *ret_env, whose body lives in *body
 * (the caller's: nothing is allocated, nothing to free). -EBADMSG for
 * bytes that are not a valid packet; nothing is written then. */
int gm_hotmsg_decode(const void *buf, size_t len, Gpumem__Envelope *ret_env, gm_hotmsg_body_t *body);
