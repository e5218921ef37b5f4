/* Protocol codec: one packed gpumem.Envelope a packet. */
#include "msg.h"

#include <errno.h>
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

int gm_msg_unpack(const void *buf, size_t len, Gpumem__Envelope **ret_env) {
        Gpumem__Envelope *env = gpumem__envelope__unpack(NULL, len, buf);
        if (!env)
                return -EBADMSG;
        if (env->body_case == GPUMEM__ENVELOPE__BODY__NOT_SET) {
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
