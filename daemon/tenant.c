/* Tenants: the unit of quotas and accounting. Created on first use, kept for
 * the daemon's lifetime so that their statistics stay continuous. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

gm_tenant_t *gm_tenant_find(gm_daemon_t *d, const char *name) {
        for (gm_tenant_t *t = d->tenants; t; t = t->next)
                if (strcmp(t->name, name) == 0)
                        return t;
        return NULL;
}

gm_tenant_t *gm_tenant_get(gm_daemon_t *d, const char *name) {
        gm_tenant_t *t = gm_tenant_find(d, name);
        if (t)
                return t;
        t = calloc(1, sizeof(*t));
        if (!t)
                return NULL;
        snprintf(t->name, sizeof(t->name), "%s", name);
        gm_stats_init(&t->stats);
        t->stats.max_split_size = d->device_stats.max_split_size;
        t->next = d->tenants;
        d->tenants = t;
        return t;
}

void gm_tenants_free(gm_daemon_t *d) {
        while (d->tenants) {
                gm_tenant_t *t = d->tenants;
                d->tenants = t->next;
                free(t);
        }
}
