/* Protocol codec: one packed gpumem.Envelope a packet.
 *
 * The envelope's own framing is written and read here: its request_id
 * (field 1, a varint) and its one body (a oneof member: a length-delimited
 * message). protobuf-c packs and unpacks only the body, with the body's own
 * descriptor: its generic walk over the Envelope's every oneof member cost
 * more than the body itself. The bytes are those protobuf-c writes for the
 * same envelope (request_id first, omitted when 0; then the body).
 *
 * An unpacked envelope lives in one heap block: a header, the Envelope and
 * an arena the body is unpacked into (protobuf-c's allocator interface);
 * what does not fit is malloc()ed on its own and freed by gm_msg_free(). */
#include "msg.h"

#include <errno.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "hotmsg.h"
#include "ipc.h"

#define FIELD_REQUEST_ID 1u
#define WIRE_VARINT 0u
#define WIRE_FIXED64 1u
#define WIRE_LENGTH 2u
#define WIRE_FIXED32 5u

/* Body fields by number, for the numbers a table holds (the rest are
 * looked up in the descriptor). */
#define BODY_TABLE_SIZE 256u
static const ProtobufCFieldDescriptor *body_table[BODY_TABLE_SIZE];
static pthread_once_t body_table_once = PTHREAD_ONCE_INIT;

static bool is_body(const ProtobufCFieldDescriptor *f) {
        return f && f->type == PROTOBUF_C_TYPE_MESSAGE && f->label != PROTOBUF_C_LABEL_REPEATED;
}

static void body_table_fill(void) {
        const ProtobufCMessageDescriptor *d = &gpumem__envelope__descriptor;
        for (unsigned i = 0; i < d->n_fields; i++)
                if (d->fields[i].id < BODY_TABLE_SIZE && is_body(&d->fields[i]))
                        body_table[d->fields[i].id] = &d->fields[i];
}

/* The body field of that number, or NULL (none: request_id, or a number
 * this build does not know). */
static const ProtobufCFieldDescriptor *body_field(uint32_t number) {
        if (number >= BODY_TABLE_SIZE) {
                const ProtobufCFieldDescriptor *f =
                        protobuf_c_message_descriptor_get_field(&gpumem__envelope__descriptor, number);
                return is_body(f) ? f : NULL;
        }
        pthread_once(&body_table_once, body_table_fill);
        return body_table[number];
}

static ProtobufCMessage **body_slot(Gpumem__Envelope *env, const ProtobufCFieldDescriptor *f) {
        return (ProtobufCMessage **) ((char *) env + f->offset);
}

static size_t varint_size(uint64_t v) {
        size_t n = 1;
        while (v >= 0x80) {
                v >>= 7;
                n++;
        }
        return n;
}

static size_t put_varint(uint8_t *p, uint64_t v) {
        size_t n = 0;
        while (v >= 0x80) {
                p[n++] = (uint8_t) (v | 0x80);
                v >>= 7;
        }
        p[n++] = (uint8_t) v;
        return n;
}

/* gm_msg_pack(), inlined into gm_msg_send() (the client's every request). */
static inline __attribute__((always_inline)) int pack(const Gpumem__Envelope *env, size_t max_packet, uint8_t *buf,
                                                      size_t cap, uint8_t **ret_data, size_t *ret_len) {
        const ProtobufCFieldDescriptor *f = body_field(env->body_case);
        const ProtobufCMessage *body = f ? *body_slot((Gpumem__Envelope *) env, f) : NULL;
        if (env->body_case != GPUMEM__ENVELOPE__BODY__NOT_SET && !f)
                return -EINVAL;
        size_t body_size = body ? protobuf_c_message_get_packed_size(body) : 0;
        uint64_t body_tag = f ? (uint64_t) f->id << 3 | WIRE_LENGTH : 0;
        size_t head = env->request_id ? 1 + varint_size(env->request_id) : 0;
        size_t size = head + (body ? varint_size(body_tag) + varint_size(body_size) + body_size : 0);
        if (size > max_packet)
                return -EMSGSIZE;
        uint8_t *out = buf;
        if (size > cap) {
                out = malloc(size);
                if (!out)
                        return -ENOMEM;
        }
        size_t at = 0;
        if (env->request_id) {
                out[at++] = FIELD_REQUEST_ID << 3 | WIRE_VARINT;
                at += put_varint(out + at, env->request_id);
        }
        if (body) {
                at += put_varint(out + at, body_tag);
                at += put_varint(out + at, body_size);
                at += protobuf_c_message_pack(body, out + at);
        }
        if (at != size) { /* protobuf-c wrote another size than it measured */
                if (out != buf)
                        free(out);
                return -EINVAL;
        }
        *ret_data = out;
        *ret_len = size;
        return 0;
}

int gm_msg_pack(const Gpumem__Envelope *env, size_t max_packet, uint8_t *buf, size_t cap, uint8_t **ret_data,
                size_t *ret_len) {
        return pack(env, max_packet, buf, cap, ret_data, ret_len);
}

int gm_msg_send(int sock, const Gpumem__Envelope *env, const int *fds, size_t n_fds, size_t max_packet) {
        uint8_t stack_buf[GM_MSG_STACK_PACK_MAX];
        uint8_t *data;
        size_t len;
        int r = pack(env, max_packet, stack_buf, sizeof(stack_buf), &data, &len);
        if (r < 0)
                return r;
        r = gm_ipc_send(sock, data, len, fds, n_fds);
        if (data != stack_buf)
                free(data);
        return r;
}

/* ---- unpacking ---- */

typedef struct unpacked {
        ProtobufCAllocator allocator; /* allocator_data: this block */
        size_t used, cap;             /* of arena */
        size_t spilled;               /* allocations that did not fit (malloc()ed) */
        Gpumem__Envelope env;
        alignas(max_align_t) uint8_t arena[];
} unpacked_t;

static void *arena_alloc(void *data, size_t size) {
        unpacked_t *u = data;
        size_t at = (u->used + alignof(max_align_t) - 1) & ~(alignof(max_align_t) - 1);
        if (at <= u->cap && size <= u->cap - at) {
                u->used = at + size;
                return u->arena + at;
        }
        void *p = malloc(size);
        u->spilled += p != NULL;
        return p;
}

static void arena_free(void *data, void *p) {
        unpacked_t *u = data;
        if ((uint8_t *) p >= u->arena && (uint8_t *) p < u->arena + u->cap)
                return; /* goes with the block */
        free(p);
}

/* Arena bytes for a body of `len` packed bytes: unpacked structs are larger
 * than their packed form; what does not fit spills. */
static size_t arena_size(size_t len) {
        return 512 + 2 * len;
}

static bool get_varint(const uint8_t **p, const uint8_t *end, uint64_t *ret) {
        if (*p < end && !(**p & 0x80)) { /* most tags, ids and lengths: one byte */
                *ret = *(*p)++;
                return true;
        }
        uint64_t v = 0;
        for (unsigned shift = 0; shift < 64 && *p < end; shift += 7) {
                uint8_t b = *(*p)++;
                v |= (uint64_t) (b & 0x7f) << shift;
                if (!(b & 0x80)) {
                        *ret = v;
                        return true;
                }
        }
        return false;
}

/* Skips one field of an unknown number; false for a malformed one (or a
 * group, which protobuf-c does not accept either). */
static bool skip_field(const uint8_t **p, const uint8_t *end, unsigned wire) {
        uint64_t n;
        switch (wire) {
        case WIRE_VARINT:
                return get_varint(p, end, &n);
        case WIRE_FIXED64:
                n = 8;
                break;
        case WIRE_FIXED32:
                n = 4;
                break;
        case WIRE_LENGTH:
                if (!get_varint(p, end, &n))
                        return false;
                break;
        default:
                return false;
        }
        if (n > (uint64_t) (end - *p))
                return false;
        *p += n;
        return true;
}

/* Whether m and every message inside it are free of field number 0, which
 * protobuf forbids but protobuf-c accepts when the tag is written in more
 * bytes than needed (it would keep it as an unknown field and write it back as
 * bytes it then refuses). The schema has no recursive types, so the depth is
 * the schema's. */
static bool field_numbers_valid(const ProtobufCMessage *m) {
        for (unsigned i = 0; i < m->n_unknown_fields; i++)
                if (m->unknown_fields[i].tag == 0)
                        return false;
        const ProtobufCMessageDescriptor *d = m->descriptor;
        const char *base = (const char *) m;
        for (unsigned i = 0; i < d->n_fields; i++) {
                const ProtobufCFieldDescriptor *f = &d->fields[i];
                if (f->type != PROTOBUF_C_TYPE_MESSAGE)
                        continue;
                if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                    *(const uint32_t *) (base + f->quantifier_offset) != f->id)
                        continue; /* another member of the oneof is set */
                if (f->label == PROTOBUF_C_LABEL_REPEATED) {
                        size_t n = *(const size_t *) (base + f->quantifier_offset);
                        ProtobufCMessage *const *items = *(ProtobufCMessage *const *const *) (base + f->offset);
                        for (size_t k = 0; k < n; k++)
                                if (!field_numbers_valid(items[k]))
                                        return false;
                } else {
                        const ProtobufCMessage *sub = *(const ProtobufCMessage *const *) (base + f->offset);
                        if (sub && !field_numbers_valid(sub))
                                return false;
                }
        }
        return true;
}

/* Reads the envelope's framing: its request_id and its one body (field and
 * bytes). Fields of other numbers are skipped, as protobuf-c keeps them
 * aside; a second body is refused (our senders never write one). */
static bool parse_envelope(const uint8_t *p, const uint8_t *end, uint64_t *ret_request_id,
                           const ProtobufCFieldDescriptor **ret_body, const uint8_t **ret_data, size_t *ret_len) {
        uint64_t request_id = 0;
        const ProtobufCFieldDescriptor *body = NULL;
        while (p < end) {
                uint64_t tag;
                if (!get_varint(&p, end, &tag) || tag > UINT32_MAX || tag >> 3 == 0)
                        return false;
                uint32_t number = (uint32_t) (tag >> 3);
                unsigned wire = (unsigned) (tag & 7);
                if (number == FIELD_REQUEST_ID) {
                        if (wire != WIRE_VARINT || !get_varint(&p, end, &request_id))
                                return false;
                        continue;
                }
                const ProtobufCFieldDescriptor *f = body_field(number);
                if (!f) {
                        if (!skip_field(&p, end, wire))
                                return false;
                        continue;
                }
                uint64_t len;
                if (body || wire != WIRE_LENGTH || !get_varint(&p, end, &len) || len > (uint64_t) (end - p))
                        return false;
                body = f;
                *ret_data = p;
                *ret_len = (size_t) len;
                p += len;
        }
        if (!body)
                return false;
        *ret_request_id = request_id;
        *ret_body = body;
        return true;
}

/* A fixed-layout packet (hotmsg.h), in a block gm_msg_free() frees. */
static int unpack_hot(const void *buf, size_t len, Gpumem__Envelope **ret_env) {
        unpacked_t *u = malloc(sizeof(*u) + sizeof(gm_hotmsg_body_t));
        if (!u)
                return -ENOMEM;
        int r = gm_hotmsg_decode(buf, len, &u->env, (gm_hotmsg_body_t *) u->arena);
        if (r < 0) {
                free(u);
                return r;
        }
        u->spilled = 0;
        *ret_env = &u->env;
        return 0;
}

int gm_msg_unpack(const void *buf, size_t len, Gpumem__Envelope **ret_env) {
        if (gm_hotmsg_is(buf, len))
                return unpack_hot(buf, len, ret_env);
        uint64_t request_id;
        const ProtobufCFieldDescriptor *f;
        const uint8_t *data = NULL;
        size_t data_len = 0;
        if (!parse_envelope(buf, (const uint8_t *) buf + len, &request_id, &f, &data, &data_len))
                return -EBADMSG;
        size_t cap = arena_size(data_len);
        unpacked_t *u = malloc(sizeof(*u) + cap);
        if (!u)
                return -ENOMEM;
        u->allocator.alloc = arena_alloc;
        u->allocator.free = arena_free;
        u->allocator.allocator_data = u;
        u->used = 0;
        u->cap = cap;
        u->spilled = 0;
        static const Gpumem__Envelope empty = GPUMEM__ENVELOPE__INIT;
        u->env = empty;
        ProtobufCMessage *body = protobuf_c_message_unpack(f->descriptor, &u->allocator, data_len, data);
        if (!body || !field_numbers_valid(body)) {
                if (body && u->spilled)
                        protobuf_c_message_free_unpacked(body, &u->allocator);
                free(u);
                return -EBADMSG;
        }
        u->env.request_id = request_id;
        u->env.body_case = (Gpumem__Envelope__BodyCase) f->id;
        *body_slot(&u->env, f) = body;
        *ret_env = &u->env;
        return 0;
}

Gpumem__Envelope *gm_msg_free(Gpumem__Envelope *env) {
        if (!env)
                return NULL;
        unpacked_t *u = (unpacked_t *) ((char *) env - offsetof(unpacked_t, env));
        if (u->spilled) {
                const ProtobufCFieldDescriptor *f = body_field(env->body_case);
                ProtobufCMessage *body = f ? *body_slot(env, f) : NULL;
                if (body)
                        protobuf_c_message_free_unpacked(body, &u->allocator);
        }
        free(u);
        return NULL;
}
