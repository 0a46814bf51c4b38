/* transfer/cuda_shim.h — the few CUDA driver calls libbaton makes, resolved with dlopen so a
 * CUDA-enabled build runs on hosts without a driver. The one place libbaton loads libcuda. */
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
    __typeof__(&cuMemcpyHtoD) memcpy_htod;      /* tcp: bounce buffer -> device page */
    __typeof__(&cuMemcpyDtoH) memcpy_dtoh;      /* tcp: device source -> bounce buffer */
    __typeof__(&cuMemHostAlloc) mem_host_alloc; /* tcp: pinned bounce buffers */
    __typeof__(&cuMemFreeHost) mem_free_host;
    __typeof__(&cuEventQuery) event_query;
    __typeof__(&cuCtxGetCurrent) ctx_get_current;
    __typeof__(&cuPointerGetAttribute) pointer_get_attribute;
    __typeof__(&cuDeviceGetAttribute) device_get_attribute;
    __typeof__(&cuDeviceGetPCIBusId) device_get_pci_bus_id;
    /* optional (NULL when the driver predates them) */
    __typeof__(&cuMemGetHandleForAddressRange) mem_get_handle_for_address_range; /* dma-buf */
    __typeof__(&cuGetErrorString) get_error_string;
} baton__cuda_t;

extern baton__cuda_t baton__cu;

/* Loads libcuda.so.1 once (thread-safe) and calls cuInit. 0, or BATON_ENODEV when there is no
 * driver. */
int baton__cuda_load(void);

/* Tests only: use `table` instead of the driver (a GPU-less host can then exercise the CUDA
 * paths). Call before anything loads the driver, from one thread. */
void baton__cuda_install(const baton__cuda_t *table);

/* Makes the context of the device that owns `ptr` current on the calling thread (registration
 * may run on any caller thread, and driver calls need a context there). 0 or BATON_ENODEV. */
int baton__cuda_bind(CUdeviceptr ptr, CUdevice *dev_p);

/* A short name for a driver error (for logs). */
const char *baton__cuda_errstr(CUresult r);
#endif

#endif
