#include <errno.h>
#include <string.h>

#include "mapper.h"

int gm_mapper_open(const char *kind, const gm_mapper_params_t *params, gm_mapper_t **ret) {
        if (strcmp(kind, "host") == 0)
                return gm_mapper_host_new(params->granularity, ret);
        if (strcmp(kind, "cuda") == 0)
                return gm_mapper_cuda_new(params->device, params->device_uuid, params->granularity, ret);
        return -EPROTONOSUPPORT;
}
