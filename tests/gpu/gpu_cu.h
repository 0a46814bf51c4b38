/* gpu_cu.h — the CUDA driver calls baton-gpu-check makes itself, resolved with dlopen so that the
 * program starts (and reports a visible skip) on a host without libcuda.so.1. */
#ifndef BATON_GPU_CU_H
#define BATON_GPU_CU_H

#include <cuda.h>

typedef struct {
    __typeof__(&cuInit) init;
    __typeof__(&cuDriverGetVersion) driver_version;
    __typeof__(&cuDeviceGetCount) device_count;
    __typeof__(&cuDeviceGet) device_get;
    __typeof__(&cuDeviceGetName) device_name;
    __typeof__(&cuDevicePrimaryCtxRetain) primary_ctx_retain;
    __typeof__(&cuCtxSetCurrent) ctx_set_current;
    __typeof__(&cuCtxGetCurrent) ctx_get_current;
    __typeof__(&cuCtxSynchronize) ctx_synchronize;
    __typeof__(&cuMemAlloc) mem_alloc;
    __typeof__(&cuMemFree) mem_free;
    __typeof__(&cuMemGetInfo) mem_get_info;
    __typeof__(&cuMemcpyHtoD) memcpy_htod;
    __typeof__(&cuMemcpyDtoH) memcpy_dtoh;
    __typeof__(&cuMemcpyDtoD) memcpy_dtod;
    __typeof__(&cuMemsetD8) memset_d8;
    __typeof__(&cuStreamCreate) stream_create;
    __typeof__(&cuStreamSynchronize) stream_synchronize;
    __typeof__(&cuEventCreate) event_create;
    __typeof__(&cuEventRecord) event_record;
    __typeof__(&cuEventQuery) event_query;
    __typeof__(&cuEventSynchronize) event_synchronize;
    __typeof__(&cuEventDestroy) event_destroy;
    __typeof__(&cuModuleLoadData) module_load_data;
    __typeof__(&cuModuleGetFunction) module_get_function;
    __typeof__(&cuLaunchKernel) launch_kernel;
    __typeof__(&cuGetErrorString) get_error_string;
} gpu_cu_t;

extern gpu_cu_t cu;

/* Loads the driver and calls cuInit. 0, or -1 with `why` set (no driver, missing symbol). */
int gpu_cu_load(const char **why);

/* Makes device 0's primary context current on the calling thread. 0 or -1. */
int gpu_cu_bind(void);

/* The driver's name for an error. */
const char *gpu_cu_err(CUresult r);

/* The fill kernel (fill.cu), loaded once per process. */
CUfunction gpu_cu_fill_kernel(void);

/* Launches the fill kernel on `s`: [dst, dst+len) gets the pattern bytes at [off, off+len) of
 * `seed`, after delay_ns on the device. */
CUresult gpu_cu_fill(CUstream s, CUdeviceptr dst, uint64_t len, uint64_t off, uint64_t seed,
                     uint64_t delay_ns);

#endif
