/* The configuration file parser (daemon/config.c): the input goes through a
 * memfd, so the real read path (size limit, NUL bytes, long lines) runs too.
 * Properties: failure comes with "FILE:..." in reterr; success gives a
 * configuration whose tenants and rules keep the documented limits. */
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "fuzz.h"

static void check_config(const gm_config_t *c) {
        FUZZ_ASSERT(c->n_tenants <= GM_CONFIG_MAX_TENANTS && c->n_rules <= GM_CONFIG_MAX_RULES);
        for (size_t i = 0; i < c->n_tenants; i++) {
                FUZZ_ASSERT(gm_tenant_name_valid(c->tenants[i].name));
                FUZZ_ASSERT(gm_config_tenant_find(c, c->tenants[i].name) == &c->tenants[i]);
        }
        for (size_t i = 0; i < c->n_rules; i++) {
                FUZZ_ASSERT(c->rules[i].tenant < c->n_tenants && c->rules[i].kind < _GM_RULE_KIND_MAX);
                FUZZ_ASSERT(strlen(c->rules[i].unit) <= GM_UNIT_NAME_MAX);
        }
        if (c->has_socket)
                FUZZ_ASSERT(c->socket && c->socket[0] == '/');
        if (c->has_socket_mode)
                FUZZ_ASSERT(c->socket_mode <= 0777);
        if (c->has_capacity)
                FUZZ_ASSERT(c->capacity > 0);
        if (c->has_max_fds)
                FUZZ_ASSERT(c->max_fds >= 1 && c->max_fds <= 253);
        if (c->has_max_packet)
                FUZZ_ASSERT(c->max_packet >= 4096 && c->max_packet <= (1u << 20));
        FUZZ_ASSERT(c->state_dir && c->state_dir[0] == '/');

        /* Tenant lookup of an arbitrary identity stays inside its buffer. */
        gm_identity_t id = {.uid = 4242, .gid = 4242};
        char buf[32];
        const char *t = gm_config_tenant_for(c, &id, buf, sizeof(buf));
        FUZZ_ASSERT(t && gm_tenant_name_valid(t));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 64 * 1024)
                return 0;
        int fd = memfd_create("fuzz-config", MFD_CLOEXEC);
        FUZZ_ASSERT(fd >= 0);
        FUZZ_ASSERT(size == 0 || write(fd, data, size) == (ssize_t) size);
        char path[64];
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);

        gm_config_t *c = NULL;
        char err[512];
        err[0] = '\0';
        int r = gm_config_load(path, &c, err, sizeof(err));
        if (r < 0) {
                FUZZ_ASSERT(r == -EINVAL || r == -ENOMEM);
                FUZZ_ASSERT(strncmp(err, path, strlen(path)) == 0);
        } else {
                check_config(c);
                gm_config_free(c);
        }
        close(fd);
        return 0;
}
