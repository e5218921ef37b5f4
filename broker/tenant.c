/* Tenants: the unit of quotas and accounting. Created on first use, kept for
 * the daemon's lifetime so that their statistics stay continuous. Quotas come
 * from three sources (runtime > persistent > config); persistent ones live in
 * <state_dir>/quotas. Each has a release check (verify or trust, its own or
 * the broker's default), and may limit tagged pools (tag quotas, checked by
 * piece.c against the bytes its sessions' pieces charge to each pool). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "books.h"
#include "size.h"
#include "text.h"

gm_tenant_t *gm_tenant_find(const gm_broker_t *b, const char *name) {
        for (gm_tenant_t *t = b->tenants; t; t = t->next)
                if (strcmp(t->name, name) == 0)
                        return t;
        return NULL;
}

gm_tenant_t *gm_tenant_get(gm_broker_t *b, const char *name) {
        gm_tenant_t *t = gm_tenant_find(b, name);
        if (t)
                return t;
        t = calloc(1, sizeof(*t));
        if (!t)
                return NULL;
        snprintf(t->name, sizeof(t->name), "%s", name);
        gm_stats_init(&t->stats);
        t->stats.max_split_size = b->device_stats.max_split_size;
        t->next = b->tenants;
        b->tenants = t;
        b->n_tenants++;
        return t;
}

void gm_tenant_set_quota(gm_tenant_t *t, gm_quota_source_t source, bool has, uint64_t bytes) {
        t->quota_set[source] = has;
        t->quota_by_source[source] = has ? bytes : 0;
        t->quota = 0;
        for (int i = 0; i < _GM_QUOTA_SOURCE_MAX; i++)
                if (t->quota_set[i]) {
                        t->quota = t->quota_by_source[i];
                        break;
                }
}

const char *gm_tenant_quota_source(const gm_tenant_t *t) {
        static const char *const names[_GM_QUOTA_SOURCE_MAX] = {"runtime", "persistent", "config"};
        for (int i = 0; i < _GM_QUOTA_SOURCE_MAX; i++)
                if (t->quota_set[i])
                        return names[i];
        return "none";
}

void gm_tenant_set_release_check(gm_tenant_t *t, bool has, gm_release_check_t check) {
        t->release_check_set = has;
        t->release_check = has ? check : GM_RELEASE_CHECK_VERIFY;
}

gm_release_check_t gm_tenant_release_check(const gm_broker_t *b, const gm_tenant_t *t) {
        return t->release_check_set ? t->release_check : b->limits.release_check;
}

static const char *const release_check_names[_GM_RELEASE_CHECK_MAX] = {"verify", "trust"};

const char *gm_release_check_name(gm_release_check_t check) {
        return check < _GM_RELEASE_CHECK_MAX ? release_check_names[check] : "verify";
}

int gm_release_check_parse(const char *name, gm_release_check_t *ret_check) {
        for (int i = 0; i < _GM_RELEASE_CHECK_MAX; i++)
                if (strcmp(name, release_check_names[i]) == 0) {
                        *ret_check = (gm_release_check_t) i;
                        return 0;
                }
        return -EINVAL;
}

/* Longest line of the quotas file we accept. */
#define QUOTA_LINE_MAX 256

int gm_tenant_quotas_load(gm_broker_t *b, const char *state_dir) {
        if (!state_dir)
                return 0;
        char path[512];
        snprintf(path, sizeof(path), "%s/quotas", state_dir);
        FILE *f = fopen(path, "re");
        if (!f)
                return errno == ENOENT ? 0 : -errno;
        char line[QUOTA_LINE_MAX];
        int r = 0;
        while (fgets(line, sizeof(line), f)) {
                char name[64];
                uint64_t bytes;
                if (line[0] == '#' || line[0] == '\n')
                        continue;
                if (sscanf(line, "%63s %" SCNu64, name, &bytes) != 2) {
                        r = -EBADMSG;
                        continue;
                }
                gm_tenant_t *t = gm_tenant_get(b, name);
                if (!t) {
                        r = -ENOMEM;
                        break;
                }
                gm_tenant_set_quota(t, GM_QUOTA_PERSISTENT, true, bytes);
        }
        fclose(f);
        return r;
}

int gm_tenant_quotas_save(const gm_broker_t *b, const char *state_dir) {
        if (!state_dir)
                return -ENOENT;
        char path[512], tmp[520];
        snprintf(path, sizeof(path), "%s/quotas", state_dir);
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        if (mkdir(state_dir, 0750) < 0 && errno != EEXIST)
                return -errno;
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
        if (fd < 0)
                return -errno;
        FILE *f = fdopen(fd, "w");
        if (!f) {
                close(fd);
                return -ENOMEM;
        }
        fprintf(f, "# gpumemd persistent quotas: TENANT BYTES (written by gpumemctl quota set)\n");
        for (const gm_tenant_t *t = b->tenants; t; t = t->next)
                if (t->quota_set[GM_QUOTA_PERSISTENT])
                        fprintf(f, "%s %" PRIu64 "\n", t->name, t->quota_by_source[GM_QUOTA_PERSISTENT]);
        int r = 0;
        if (fflush(f) != 0 || fsync(fileno(f)) < 0)
                r = -errno;
        if (fclose(f) != 0 && r == 0)
                r = -errno;
        if (r == 0 && rename(tmp, path) < 0)
                r = -errno;
        if (r < 0)
                unlink(tmp);
        return r;
}

void gm_tenant_set_tag_quotas(gm_tenant_t *t, const gm_tag_quota_t *quotas, size_t n) {
        t->n_tag_quotas = n < GM_TENANT_MAX_TAG_QUOTAS ? n : GM_TENANT_MAX_TAG_QUOTAS;
        for (size_t i = 0; i < t->n_tag_quotas; i++)
                t->tag_quotas[i] = quotas[i];
}

int gm_tag_quotas_parse(const char *text, gm_tag_quota_t *ret_quotas, size_t *ret_n) {
        gm_tag_quota_t q[GM_TENANT_MAX_TAG_QUOTAS];
        size_t n = 0;
        char item[64];

        for (const char *p = text; p && *p;) {
                const char *end = strchr(p, ',');
                size_t len = end ? (size_t) (end - p) : strlen(p);
                const char *colon = memchr(p, ':', len);
                if (len == 0 || len >= sizeof(item) || !colon)
                        return -EINVAL;
                if (n == GM_TENANT_MAX_TAG_QUOTAS)
                        return -E2BIG;
                memcpy(item, p, len);
                item[len] = '\0';
                item[colon - p] = '\0';
                if (!gm_text_tag_valid(item, false) || gm_parse_size(item + (colon - p) + 1, &q[n].bytes) < 0 ||
                    q[n].bytes == 0)
                        return -EINVAL;
                for (size_t k = 0; k < n; k++)
                        if (strcmp(q[k].tag, item) == 0)
                                return -EINVAL;
                memcpy(q[n].tag, item, strlen(item) + 1); /* gm_text_tag_valid(): at most 31 bytes */
                n++;
                p = end ? end + 1 : NULL;
        }
        for (size_t k = 0; k < n; k++)
                ret_quotas[k] = q[k];
        *ret_n = n;
        return 0;
}

uint64_t gm_tenant_tag_charged(const gm_broker_t *b, const gm_tenant_t *t, const char *tag) {
        uint64_t bytes = 0;

        for (const gm_session_t *s = b->sessions; s; s = s->next)
                for (unsigned id = 1; s->tenant == t && id <= s->tags.n; id++)
                        if (strcmp(s->tags.names[id], tag) == 0)
                                bytes += s->tags.bytes[id];
        return bytes;
}
