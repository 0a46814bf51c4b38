/* transfer/cuda_shim.h — the few CUDA driver calls libbaton makes, resolved with dlopen so a
 * CUDA-enabled build runs on hosts without a driver. */
#ifndef BATON_TRANSFER_CUDA_SHIM_H
#define BATON_TRANSFER_CUDA_SHIM_H

#ifdef BATON_HAVE_CUDA
#include <cuda.h>

/* Function pointers, valid after baton__cuda_load() returned 0. */
typedef struct {
    __typeof__(&cuInit) init;
    __typeof__(&cuDeviceGet) device_get;
    __typeof__(&cuDevicePrimaryCtxRetain) primary_ctx_retain;
    __typeof__(&cuCtxSetCurrent) ctx_set_current;
    __typeof__(&cuMemGetAddressRange) mem_get_address_range;
    __typeof__(&cuIpcGetMemHandle) ipc_get_mem_handle;
    __typeof__(&cuIpcOpenMemHandle) ipc_open_mem_handle;
    __typeof__(&cuIpcCloseMemHandle) ipc_close_mem_handle;
    __typeof__(&cuMemcpy) memcpy;
    __typeof__(&cuEventQuery) event_query;
} baton__cuda_t;

extern baton__cuda_t baton__cu;

/* Loads libcuda.so.1 once (thread-safe). 0, or BATON_ENODEV when there is no driver. */
int baton__cuda_load(void);
#endif

#endif
