#include "kind.h"

const gm_kind_caps_t gm_kind_host_caps = {.device_streams = false, .cpu_accessible = true};
const gm_kind_caps_t gm_kind_cuda_caps = {.device_streams = true, .cpu_accessible = false};
