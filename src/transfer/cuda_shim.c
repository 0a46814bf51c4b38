/* transfer/cuda_shim.c — dlopen of the CUDA driver API (see cuda_shim.h). */
#include "transfer/cuda_shim.h"

#ifdef BATON_HAVE_CUDA
#include <dlfcn.h>
#include <pthread.h>

#include "baton/error.h"
#include "common/log.h"

baton__cuda_t baton__cu;
static int load_status = BATON_ENODEV;
static int installed; /* a test's table replaces the driver */
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

#define LOAD_OPT(field, fn) baton__cu.field = (__typeof__(baton__cu.field))dlsym(h, STR(fn))

static void load(void)
{
    if (installed) {
        load_status = baton__cu.init(0) == CUDA_SUCCESS ? 0 : BATON_ENODEV;
        return;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        log_info("cuda", "driver_missing err=\"%s\": CUDA memory is not usable", dlerror());
        return;
    }
    LOAD(init, cuInit);
    LOAD(device_get, cuDeviceGet);
    LOAD(primary_ctx_retain, cuDevicePrimaryCtxRetain);
    LOAD(ctx_set_current, cuCtxSetCurrent);
    LOAD(mem_get_address_range, cuMemGetAddressRange);
    LOAD(ipc_get_mem_handle, cuIpcGetMemHandle);
    LOAD(ipc_open_mem_handle, cuIpcOpenMemHandle);
    LOAD(ipc_close_mem_handle, cuIpcCloseMemHandle);
    LOAD(memcpy, cuMemcpy);
    LOAD(memcpy_htod, cuMemcpyHtoD);
    LOAD(memcpy_dtoh, cuMemcpyDtoH);
    LOAD(mem_host_alloc, cuMemHostAlloc);
    LOAD(mem_free_host, cuMemFreeHost);
    LOAD(event_query, cuEventQuery);
    LOAD(ctx_get_current, cuCtxGetCurrent);
    LOAD(pointer_get_attribute, cuPointerGetAttribute);
    LOAD(device_get_attribute, cuDeviceGetAttribute);
    LOAD(device_get_pci_bus_id, cuDeviceGetPCIBusId);
    LOAD_OPT(mem_get_handle_for_address_range, cuMemGetHandleForAddressRange);
    LOAD_OPT(get_error_string, cuGetErrorString);
    if (baton__cu.init(0) != CUDA_SUCCESS)
        return;
    load_status = 0;
}

int baton__cuda_load(void)
{
    pthread_once(&once, load);
    return load_status;
}

void baton__cuda_install(const baton__cuda_t *table)
{
    baton__cu = *table;
    installed = 1;
    pthread_once(&once, load);
}

int baton__cuda_bind(CUdeviceptr ptr, CUdevice *dev_p)
{
    if (baton__cuda_load() != 0)
        return BATON_ENODEV;
    /* cuInit ran in load(); a thread has no current context until it makes one current */
    int ordinal = -1;
    CUdevice dev;
    CUcontext cur = NULL, ctx = NULL;
    CUresult r =
        baton__cu.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr);
    if (r == CUDA_SUCCESS)
        r = baton__cu.device_get(&dev, ordinal);
    if (r == CUDA_SUCCESS)
        r = baton__cu.ctx_get_current(&cur);
    if (r == CUDA_SUCCESS && cur == NULL) {
        r = baton__cu.primary_ctx_retain(&ctx, dev);
        if (r == CUDA_SUCCESS)
            r = baton__cu.ctx_set_current(ctx);
    }
    if (r != CUDA_SUCCESS) {
        log_error("cuda", "bind_failed ptr=0x%llx err=%s", (unsigned long long)ptr,
                  baton__cuda_errstr(r));
        return BATON_ENODEV;
    }
    if (dev_p)
        *dev_p = dev;
    return 0;
}

const char *baton__cuda_errstr(CUresult r)
{
    const char *s = NULL;
    if (baton__cu.get_error_string && baton__cu.get_error_string(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "?";
}
#else
typedef int baton__cuda_shim_unused_t; /* ISO C forbids an empty translation unit */
#endif
