/* The configuration file (INI, parsed with libinih), whose tenant rules map
 * the identity of a connected peer (identity.h) to a tenant name. Nothing here logs: errors come back as negative errno with
 * a one-line "FILE:LINE: reason" in reterr. Loading never touches the daemon's
 * state, so a reload that fails leaves the running configuration alone. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "broker.h" /* gm_release_check_t */
#include "identity.h"

#define GM_CONFIG_DEFAULT_PATH "/etc/gpumem/gpumemd.conf"
#define GM_CONFIG_DEFAULT_STATE_DIR "/var/lib/gpumem"
#define GM_CONFIG_MAX_TENANTS 1024u
#define GM_CONFIG_MAX_RULES 16384u    /* unit=, user= and group= lines of all tenants */
#define GM_CONFIG_MAX_LINE 4096u      /* bytes in one line, newline excluded */
#define GM_CONFIG_MAX_FILE (1u << 20) /* bytes in the whole file */
#define GM_TENANT_NAME_MAX 63u        /* characters; [A-Za-z0-9_.:-] */

typedef enum gm_rule_kind {
        GM_RULE_UNIT,
        GM_RULE_USER,
        GM_RULE_GROUP,
        _GM_RULE_KIND_MAX,
} gm_rule_kind_t;

/* One unit=, user= or group= line of a [tenant NAME] section. */
typedef struct gm_config_rule {
        gm_rule_kind_t kind;
        size_t tenant;                   /* index into gm_config_t.tenants */
        char unit[GM_UNIT_NAME_MAX + 1]; /* GM_RULE_UNIT: "foo.service", or "foo@.service" for every instance */
        uint32_t id;                     /* GM_RULE_USER: uid; GM_RULE_GROUP: gid (names resolved at load) */
        unsigned line;
} gm_config_rule_t;

typedef struct gm_config_tenant {
        char name[GM_TENANT_NAME_MAX + 1];
        bool has_quota;
        uint64_t quota; /* bytes; 0 = "none" (no limit), as in gm_tenant_t */
        bool has_heap;
        bool heap_central; /* heap = central: its sessions' heaps must run in the daemon (else "any") */
        bool has_release_check;
        gm_release_check_t release_check; /* how its give-backs are checked (else [daemon] release_check's) */
        bool has_tag_quota;
        gm_tag_quota_t tag_quotas[GM_TENANT_MAX_TAG_QUOTAS]; /* tag_quota = kv_cache:40G,weights:20G */
        size_t n_tag_quotas;
        unsigned line; /* of its [tenant NAME] header */
} gm_config_tenant_t;

/* A loaded file. Every [daemon] key has a has_* flag that is true only when
 * the file sets it, so that the caller can layer defaults < file < flags. */
typedef struct gm_config {
        char *path; /* the file read; NULL when the default file was missing */

        bool has_socket;
        char *socket; /* absolute, shorter than sun_path */
        bool has_socket_mode;
        mode_t socket_mode; /* permission bits, at most 0777 */
        bool has_socket_group;
        gid_t socket_group;
        bool has_metrics_listen;
        char *metrics_listen; /* as gm_metrics_start takes it; not validated here */
        bool has_backend;
        char *backend; /* "auto", "cuda" or "host" */
        bool has_device;
        int device;        /* index; -1 when device_uuid is set */
        char *device_uuid; /* "GPU-..." or NULL */
        bool has_capacity;
        uint64_t capacity; /* bytes, > 0 */
        bool has_alloc_conf;
        char *alloc_conf; /* validated with gm_alloc_config_parse */
        bool has_admin_group;
        gid_t admin_group;
        bool has_state_dir;
        char *state_dir; /* absolute; GM_CONFIG_DEFAULT_STATE_DIR when absent */

        /* Limits, with gm_limits_t's types and meanings. */
        bool has_max_sessions;
        uint32_t max_sessions;
        bool has_max_blocks_per_session;
        uint64_t max_blocks_per_session;
        bool has_max_packet;
        uint32_t max_packet; /* bytes, 4 KiB .. 1 MiB */
        bool has_max_fds;
        uint32_t max_fds; /* 1 .. 253 */
        bool has_release_timeout_ms;
        uint32_t release_timeout_ms;
        bool has_park_timeout_ms;
        uint32_t park_timeout_ms;
        bool has_unresponsive_timeout_ms;
        uint32_t unresponsive_timeout_ms; /* 0: a client that does not answer is waited for every time */
        bool has_max_parked_per_session;
        uint32_t max_parked_per_session;
        bool has_max_shared_objects;
        uint32_t max_shared_objects; /* shared objects at once, staging ones included */
        bool has_reattach_grace_ms;
        uint32_t reattach_grace_ms; /* after a restart, how long stored segments wait for their client */
        bool has_max_sessions_per_uid;
        uint32_t max_sessions_per_uid; /* connections of one uid, at most max_sessions */
        bool has_hello_timeout_ms;
        uint32_t hello_timeout_ms; /* a connection's time to say Hello */
        bool has_metrics_tenants;
        bool metrics_tenants; /* /metrics names tenants in labels (default true) */
        bool has_snapshot_max_bytes;
        uint64_t snapshot_max_bytes; /* a non-admin's snapshot file, at most (0: no limit) */
        bool has_snapshot_max_entries;
        uint64_t snapshot_max_entries; /* segments + blocks + trace entries in a non-admin's (0: no limit) */
        bool has_snapshot_answer_timeout_ms;
        uint32_t snapshot_answer_timeout_ms; /* a local session's time to answer a snapshot query */
        bool has_audit_interval_ms;
        uint32_t audit_interval_ms; /* how often believed give-backs are audited by their process's figure (0: never) */
        bool has_max_audited_processes;
        uint32_t max_audited_processes; /* processes whose session ended still audited, at most (0: none) */
        bool has_release_check;
        gm_release_check_t release_check; /* of tenants whose section sets none, and of unnamed tenants */

        gm_config_tenant_t *tenants; /* in file order */
        size_t n_tenants;
        gm_config_rule_t *rules; /* in file order, all tenants together */
        size_t n_rules;
} gm_config_t;

/* Loads `path`, or GM_CONFIG_DEFAULT_PATH when path is NULL; only in that case
 * a missing file is not an error: the result is an empty configuration with
 * path NULL. Unknown sections and keys, repeated sections, a daemon key or a
 * quota set twice, a rule naming a unit, user or group another rule already
 * names, unknown user or group names and invalid values are errors; reterr
 * then reads "FILE:LINE: reason" (or "FILE: reason" for I/O). Returns 0 and
 * hands the caller *ret (free with gm_config_free), -EINVAL for a bad file,
 * or another negative errno for I/O or memory. */
/* A tenant name: 1..GM_TENANT_NAME_MAX characters of [A-Za-z0-9_.:-]. */
bool gm_tenant_name_valid(const char *name);

int gm_config_load(const char *path, gm_config_t **ret, char *reterr, size_t reterr_len);
gm_config_t *gm_config_free(gm_config_t *c);

/* The range of a whole-number [daemon] key (its command-line flag takes the
 * same): 0, or -ENOENT for a key that is not one. */
int gm_config_key_range(const char *key, uint64_t *ret_min, uint64_t *ret_max);

/* A configured tenant by name, or NULL. */
const gm_config_tenant_t *gm_config_tenant_find(const gm_config_t *c, const char *name);

/* The tenant of `id`: the first rule (in file order) matching its unit, else
 * the first matching its uid, else the first matching its primary or a
 * supplementary gid; else "uid:<uid>" written into buf (len >= 16). The result
 * points into c or buf. c may be NULL (no rules). */
const char *gm_config_tenant_for(const gm_config_t *c, const gm_identity_t *id, char *buf, size_t len);
