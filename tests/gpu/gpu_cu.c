/* gpu_cu.c — dlopen of the CUDA driver for baton-gpu-check, and the fill kernel's launch. */
#include "gpu_cu.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

#include "gpu_fill_fatbin.h"
#include "gpu_pattern.h"

gpu_cu_t cu;

/* cuda.h maps some names to versioned symbols (cuMemAlloc -> cuMemAlloc_v2): expand first. */
#define STR_(x) #x
#define STR(x)  STR_(x)
#define LOAD(field, fn)                                                                            \
    do {                                                                                           \
        cu.field = (__typeof__(cu.field))dlsym(h, STR(fn));                                        \
        if (cu.field == NULL) {                                                                    \
            *why = "driver symbol missing: " STR(fn);                                              \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

int gpu_cu_load(const char **why)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        *why = "no CUDA driver (libcuda.so.1 not found)";
        return -1;
    }
    LOAD(init, cuInit);
    LOAD(driver_version, cuDriverGetVersion);
    LOAD(device_count, cuDeviceGetCount);
    LOAD(device_get, cuDeviceGet);
    LOAD(device_name, cuDeviceGetName);
    LOAD(primary_ctx_retain, cuDevicePrimaryCtxRetain);
    LOAD(ctx_set_current, cuCtxSetCurrent);
    LOAD(ctx_get_current, cuCtxGetCurrent);
    LOAD(ctx_synchronize, cuCtxSynchronize);
    LOAD(mem_alloc, cuMemAlloc);
    LOAD(mem_free, cuMemFree);
    LOAD(mem_get_info, cuMemGetInfo);
    LOAD(memcpy_htod, cuMemcpyHtoD);
    LOAD(memcpy_dtoh, cuMemcpyDtoH);
    LOAD(memcpy_dtod, cuMemcpyDtoD);
    LOAD(memset_d8, cuMemsetD8);
    LOAD(stream_create, cuStreamCreate);
    LOAD(stream_synchronize, cuStreamSynchronize);
    LOAD(event_create, cuEventCreate);
    LOAD(event_record, cuEventRecord);
    LOAD(event_query, cuEventQuery);
    LOAD(event_synchronize, cuEventSynchronize);
    LOAD(event_destroy, cuEventDestroy);
    LOAD(module_load_data, cuModuleLoadData);
    LOAD(module_get_function, cuModuleGetFunction);
    LOAD(launch_kernel, cuLaunchKernel);
    LOAD(get_error_string, cuGetErrorString);
    CUresult r = cu.init(0);
    if (r != CUDA_SUCCESS) {
        *why = r == CUDA_ERROR_NO_DEVICE ? "no CUDA device (cuInit: no device)" : "cuInit failed";
        return -1;
    }
    int n = 0;
    if (cu.device_count(&n) != CUDA_SUCCESS || n == 0) {
        *why = "no CUDA device";
        return -1;
    }
    return 0;
}

int gpu_cu_bind(void)
{
    CUdevice d;
    CUcontext c;
    if (cu.device_get(&d, 0) != CUDA_SUCCESS || cu.primary_ctx_retain(&c, d) != CUDA_SUCCESS ||
        cu.ctx_set_current(c) != CUDA_SUCCESS)
        return -1;
    return 0;
}

const char *gpu_cu_err(CUresult r)
{
    const char *s = NULL;
    if (cu.get_error_string && cu.get_error_string(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "?";
}

CUfunction gpu_cu_fill_kernel(void)
{
    static CUfunction f;
    static CUmodule m;
    if (f == NULL) {
        CUresult r = cu.module_load_data(&m, baton_gpu_fill_fatbin);
        if (r == CUDA_SUCCESS)
            r = cu.module_get_function(&f, m, GPU_FILL_KERNEL);
        if (r != CUDA_SUCCESS) {
            fprintf(stderr, "gpu-check: fill kernel not loaded: %s\n", gpu_cu_err(r));
            f = NULL;
        }
    }
    return f;
}

CUresult gpu_cu_fill(CUstream s, CUdeviceptr dst, uint64_t len, uint64_t off, uint64_t seed,
                     uint64_t delay_ns)
{
    CUfunction f = gpu_cu_fill_kernel();
    if (f == NULL)
        return CUDA_ERROR_NOT_FOUND;
    unsigned long long a_dst = dst, a_len = len, a_off = off, a_seed = seed, a_delay = delay_ns;
    void *params[] = {&a_dst, &a_len, &a_off, &a_seed, &a_delay};
    unsigned threads = 256, blocks = (unsigned)((len + threads - 1) / threads);
    if (blocks > 4096)
        blocks = 4096;
    if (blocks == 0)
        blocks = 1;
    return cu.launch_kernel(f, blocks, 1, 1, threads, 1, 1, 0, s, params, NULL);
}
