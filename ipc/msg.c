/* Protocol codec: one packed gpumem.Envelope a packet. */
#include "msg.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "ipc.h"

/* Envelopes up to this size are packed on the stack; larger ones in a heap buffer. */
#define STACK_PACK_MAX 4096u

int gm_msg_send(int sock, const Gpumem__Envelope *env, const int *fds, size_t n_fds, size_t max_packet) {
        size_t size = gpumem__envelope__get_packed_size(env);
        if (size > max_packet)
                return -EMSGSIZE;

        uint8_t stack_buf[STACK_PACK_MAX];
        uint8_t *buf = stack_buf;
        if (size > sizeof(stack_buf)) {
                buf = malloc(size);
                if (!buf)
                        return -ENOMEM;
        }
        gpumem__envelope__pack(env, buf);
        int r = gm_ipc_send(sock, buf, size, fds, n_fds);
        if (buf != stack_buf)
                free(buf);
        return r;
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

int gm_msg_unpack(const void *buf, size_t len, Gpumem__Envelope **ret_env) {
        Gpumem__Envelope *env = gpumem__envelope__unpack(NULL, len, buf);
        if (!env)
                return -EBADMSG;
        if (env->body_case == GPUMEM__ENVELOPE__BODY__NOT_SET || !field_numbers_valid(&env->base)) {
                gm_msg_free(env);
                return -EBADMSG;
        }
        *ret_env = env;
        return 0;
}

Gpumem__Envelope *gm_msg_free(Gpumem__Envelope *env) {
        if (env)
                gpumem__envelope__free_unpacked(env, NULL);
        return NULL;
}
