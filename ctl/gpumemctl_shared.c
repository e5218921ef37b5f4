/* gpumemctl shared: the daemon's shared objects (docs/shared.md). list shows
 * every object the caller may see, show one name's versions with their
 * readers and the sessions that map them, rm unpublishes. Stands on ctl.c
 * and libgpumem's admin API (gpumem_admin_shared_list(),
 * gpumem_admin_shared_unpublish()). */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpumemctl.h"
#include "json.h"
#include "size.h"

/* NAME[@VERSION] into name (the text before the last '@') and *ret_version
 * (0: every version); false (printed) when it is no object's name. */
static bool shared_parse_target(const char *arg, char *name, size_t len, uint64_t *ret_version) {
        const char *at = strrchr(arg, '@');
        size_t n = at ? (size_t) (at - arg) : strlen(arg);
        uint64_t version = 0;
        if (n == 0 || n >= len || (at && gm_parse_uint(at + 1, 1, UINT64_MAX, &version) < 0)) {
                fprintf(stderr, "gpumemctl: shared: expected NAME or NAME@VERSION (VERSION 1 or more), not '%s'\n",
                        arg);
                return false;
        }
        memcpy(name, arg, n);
        name[n] = '\0';
        *ret_version = version;
        return true;
}

static uint64_t shared_now_unix_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

static uint64_t shared_age_ms(const gpumem_shared_info *o, uint64_t now_ms) {
        return now_ms > o->created_unix_ms ? now_ms - o->created_unix_ms : 0;
}

static void shared_print_json(const gpumem_shared_info *o, uint64_t now_ms, bool detailed) {
        printf("{\"object_id\": %" PRIu64 ", \"name\": ", o->object_id);
        gm_json_print_string(stdout, o->name);
        printf(", \"version\": %" PRIu64 ", \"tenant\": ", o->version);
        gm_json_print_string(stdout, o->tenant);
        printf(", \"size\": %" PRIu64 ", \"mappers\": %u, \"state\": \"%s\", \"created_unix_ms\": %" PRIu64
               ", \"age_ms\": %" PRIu64 ", \"retention_s\": %u",
               o->size, o->mappers, o->state, o->created_unix_ms, shared_age_ms(o, now_ms), o->retention_s);
        if (detailed) {
                printf(", \"readers\": [");
                for (size_t i = 0; i < o->n_readers; i++) {
                        printf("%s", i ? ", " : "");
                        gm_json_print_string(stdout, o->readers[i]);
                }
                printf("], \"meta_bytes\": %" PRIu64 ", \"sessions\": [", o->meta_len);
                for (size_t i = 0; i < o->n_sessions; i++) {
                        const gpumem_shared_mapper *m = &o->sessions[i];
                        printf("%s{\"session_id\": %" PRIu64 ", \"pid\": %u, \"tenant\": ", i ? ", " : "",
                               m->session_id, m->pid);
                        gm_json_print_string(stdout, m->tenant);
                        printf(", \"opens\": %u}", m->opens);
                }
                printf("]");
        }
        printf("}");
}

/* One table row: version, tenant, size, mappers, state, age, retention,
 * and the name last (up to 127 characters: never cut). */
static void shared_print_row(const gpumem_shared_info *o, uint64_t now_ms) {
        char size[32], age[32], retention[32] = "-";
        if (o->retention_s)
                ctl_fmt_age((uint64_t) o->retention_s * 1000u, retention, sizeof(retention));
        printf("%7" PRIu64 " %-16.16s %8s %7u %-9s %6s %9s %s\n", o->version, o->tenant,
               gm_format_size_as(o->size, GM_SIZE_COMPACT, size, sizeof(size)), o->mappers, o->state,
               ctl_fmt_age(shared_age_ms(o, now_ms), age, sizeof(age)), retention, o->name);
}

static void shared_print_header(void) {
        printf("%7s %-16s %8s %7s %-9s %6s %9s %s\n", "VERSION", "TENANT", "SIZE", "MAPPERS", "STATE", "AGE",
               "RETENTION", "NAME");
}

/* show's text: the row, then readers, meta and the mapping sessions. */
static void shared_print_detail(const gpumem_shared_info *o, uint64_t now_ms) {
        shared_print_row(o, now_ms);
        printf("  readers:");
        if (!o->n_readers)
                printf(" (the publisher's tenant only)");
        for (size_t i = 0; i < o->n_readers; i++)
                printf(" %s", o->readers[i]);
        printf("\n  meta: %" PRIu64 " bytes\n", o->meta_len);
        for (size_t i = 0; i < o->n_sessions; i++)
                printf("  mapped by pid %u (session %" PRIu64 ", tenant %s)%s\n", o->sessions[i].pid,
                       o->sessions[i].session_id, o->sessions[i].tenant,
                       o->sessions[i].opens > 1 ? " more than once" : "");
}

static int shared_list(ctl_t *c, const char *name, uint64_t version, bool json) {
        int r = ctl_connect(c);
        if (r)
                return r;
        gpumem_shared_info *list;
        size_t n;
        bool truncated;
        r = gpumem_admin_shared_list(c->admin, name, version, &list, &n, &truncated);
        if (r < 0)
                return ctl_failed(c, r);
        uint64_t now_ms = shared_now_unix_ms();
        if (name && n == 0) {
                gpumem_buffer_free(list);
                fprintf(stderr, "gpumemctl: no shared object '%s'%s you may see\n", name,
                        version ? " at that version" : "");
                return EXIT_REFUSED;
        }
        if (json)
                printf(name ? "[" : "{\"truncated\": %s, \"objects\": [", truncated ? "true" : "false");
        else if (!name || n)
                shared_print_header();
        for (size_t i = 0; i < n; i++) {
                if (json) {
                        printf("%s", i ? ", " : "");
                        shared_print_json(&list[i], now_ms, name != NULL);
                } else if (name) {
                        shared_print_detail(&list[i], now_ms);
                } else {
                        shared_print_row(&list[i], now_ms);
                }
        }
        if (json)
                printf(name ? "]\n" : "]}\n");
        else if (truncated)
                printf("(older objects left out: more than one reply holds)\n");
        gpumem_buffer_free(list);
        return 0;
}

int cmd_shared(ctl_t *c, int argc, char **argv) {
        const char *sub = argc >= 2 ? argv[1] : "";
        bool json = argc >= 3 && strcmp(argv[argc - 1], "--json") == 0;
        int args = argc - (json ? 1 : 0); /* arguments before --json */
        char name[128];
        uint64_t version = 0;
        if (strcmp(sub, "list") == 0 && args == 2)
                return shared_list(c, NULL, 0, json);
        if (strcmp(sub, "show") == 0 && args == 3)
                return shared_parse_target(argv[2], name, sizeof(name), &version) ? shared_list(c, name, version, json)
                                                                                  : EXIT_USAGE;
        if (strcmp(sub, "rm") == 0 && argc == 3) {
                if (!shared_parse_target(argv[2], name, sizeof(name), &version))
                        return EXIT_USAGE;
                int r = ctl_connect(c);
                if (r)
                        return r;
                r = gpumem_admin_shared_unpublish(c->admin, name, version);
                if (r < 0)
                        return ctl_failed(c, r);
                printf("unpublished %s\n", argv[2]);
                return 0;
        }
        fprintf(stderr, "gpumemctl: usage: shared list [--json] | show NAME[@VERSION] [--json] | rm NAME[@VERSION]\n"
                        "Try 'gpumemctl --help'.\n");
        return EXIT_USAGE;
}
