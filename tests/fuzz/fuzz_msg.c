/* The envelope decoder (ipc/msg.c), the first code that touches a client's
 * bytes, protobuf and the fixed layout (ipc/hotmsg.c) alike. Property:
 * whatever it accepts has a body and survives a round trip (pack, unpack,
 * pack again gives the same bytes); a fixed-layout packet is canonical (its
 * envelope encodes to the very bytes it came from). */
#include <errno.h>

#include "fuzz.h"
#include "hotmsg.h"
#include "msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        Gpumem__Envelope *env = NULL;
        int r = gm_msg_unpack(data, size, &env);
        if (r < 0) {
                FUZZ_ASSERT(r == -EBADMSG);
                FUZZ_ASSERT(env == NULL);
                return 0;
        }
        FUZZ_ASSERT(env && env->body_case != GPUMEM__ENVELOPE__BODY__NOT_SET);
        if (gm_hotmsg_is(data, size)) {
                uint8_t hot[GM_HOTMSG_MAX_SIZE];
                size_t hot_len = 0;
                FUZZ_ASSERT(gm_hotmsg_encode(env, hot, sizeof(hot), &hot_len) == 0);
                FUZZ_ASSERT(hot_len == size && memcmp(hot, data, size) == 0);
        }

        size_t len = gpumem__envelope__get_packed_size(env);
        uint8_t *once = malloc(len ? len : 1);
        FUZZ_ASSERT(once);
        FUZZ_ASSERT(gpumem__envelope__pack(env, once) == len);

        Gpumem__Envelope *again = NULL;
        FUZZ_ASSERT(gm_msg_unpack(once, len, &again) == 0);
        FUZZ_ASSERT(again->body_case == env->body_case && again->request_id == env->request_id);
        size_t len2 = gpumem__envelope__get_packed_size(again);
        FUZZ_ASSERT(len2 == len);
        uint8_t *twice = malloc(len2 ? len2 : 1);
        FUZZ_ASSERT(twice);
        gpumem__envelope__pack(again, twice);
        FUZZ_ASSERT(memcmp(once, twice, len) == 0);

        free(twice);
        free(once);
        gm_msg_free(again);
        gm_msg_free(env);
        return 0;
}
