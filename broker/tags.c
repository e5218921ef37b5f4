/* Tagged pools' names of a session (broker.h's gm_session_tags_t): the
 * names only; piece.c books the bytes. Floor 1: calls nothing of the broker. */
#include <errno.h>
#include <string.h>

#include "broker.h"
#include "text.h"

int gm_session_tags_name(gm_session_tags_t *t, unsigned id, const char *name) {
        if (!gm_text_tag_valid(name ? name : "", id == 0))
                return -EINVAL;
        if (id == 0)
                return name && *name ? -EINVAL : 0;
        if (id > GM_SESSION_MAX_TAGS)
                return -E2BIG;
        if (t->names[id][0])
                return strcmp(t->names[id], name) == 0 ? 0 : -EINVAL;
        for (unsigned k = 1; k <= t->n; k++)
                if (strcmp(t->names[k], name) == 0)
                        return -EINVAL; /* one name, one id */
        strcpy(t->names[id], name);     /* gm_text_tag_valid(): at most 31 bytes */
        if (id > t->n)
                t->n = id;
        return 0;
}

int gm_session_tags_intern(gm_session_tags_t *t, const char *name, unsigned *ret_id) {
        unsigned free_id = 0;

        if (!gm_text_tag_valid(name ? name : "", true))
                return -EINVAL;
        if (!name || !*name) {
                *ret_id = 0;
                return 0;
        }
        for (unsigned k = 1; k <= GM_SESSION_MAX_TAGS; k++) {
                if (k <= t->n && strcmp(t->names[k], name) == 0) {
                        *ret_id = k;
                        return 0;
                }
                if (!free_id && !t->names[k][0])
                        free_id = k;
        }
        if (!free_id)
                return -E2BIG;
        strcpy(t->names[free_id], name);
        if (free_id > t->n)
                t->n = free_id;
        *ret_id = free_id;
        return 0;
}
