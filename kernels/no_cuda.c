// Built instead of the CUDA sources when no CUDA compiler is found: the CPU path only.
#include "../model/backend.h"

#include <stddef.h>

const Backend *backend_cuda_get(void) { return NULL; }
