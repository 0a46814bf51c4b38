/* transfer/cuda_shim.c — dlopen of the CUDA driver API (see cuda_shim.h). */
#include "transfer/cuda_shim.h"

#ifdef BATON_HAVE_CUDA
#include <dlfcn.h>
#include <pthread.h>

#include "baton/error.h"
#include "common/log.h"

baton__cuda_t baton__cu;
static int load_status = BATON_ENODEV;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* cuda.h maps some names to versioned symbols (cuMemGetAddressRange -> ..._v2): expand the macro
 * before turning it into the string dlsym looks up. */
#define STR_(x) #x
#define STR(x)  STR_(x)
#define LOAD(field, fn)                                                                            \
    do {                                                                                           \
        baton__cu.field = (__typeof__(baton__cu.field))dlsym(h, STR(fn));                          \
        if (baton__cu.field == NULL) {                                                             \
            log_warn("cuda", "driver_symbol_missing name=%s", STR(fn));                            \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static void load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return;
    LOAD(init, cuInit);
    LOAD(device_get, cuDeviceGet);
    LOAD(primary_ctx_retain, cuDevicePrimaryCtxRetain);
    LOAD(ctx_set_current, cuCtxSetCurrent);
    LOAD(mem_get_address_range, cuMemGetAddressRange);
    LOAD(ipc_get_mem_handle, cuIpcGetMemHandle);
    LOAD(ipc_open_mem_handle, cuIpcOpenMemHandle);
    LOAD(ipc_close_mem_handle, cuIpcCloseMemHandle);
    LOAD(memcpy, cuMemcpy);
    LOAD(event_query, cuEventQuery);
    if (baton__cu.init(0) != CUDA_SUCCESS)
        return;
    load_status = 0;
}

int baton__cuda_load(void)
{
    pthread_once(&once, load);
    return load_status;
}
#else
typedef int baton__cuda_shim_unused_t; /* ISO C forbids an empty translation unit */
#endif
