/* xfer_engine_cuda.c — CUDA device memory over tcp both ways, through the bounce buffers. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "../phase_checks.h"
#include <dlfcn.h>
#include <uv.h>

#include "baton/error.h"
#include "baton/transfer.h"
#include "transfer/ctrl_frame.h"
#include "xfer_pattern.h"
#include "transfer/internal.h"
#include "xfer_engine.h"

/* CUDA device memory over tcp, both ways: a device source (the sender stages it through its
 * bounce buffers) into host pages and into device pages, and a host source into device pages
 * (the receiver fills them from its bounce buffers before it acknowledges). Every byte is copied
 * back and compared; the stats count the staged bytes and bound the bounce buffers. Runs on a
 * real driver, or on tests/gpu/fake_cuda.c (whose device memory faults if the CPU touches it:
 * test xfer_engine_cuda_fake); skips visibly without either. */
/* A visible skip; a failure where the run promised a driver (XFER_CUDA_REQUIRED: the fake). */
#define cuda_skip(why)                                                                             \
    do {                                                                                           \
        if (getenv("XFER_CUDA_REQUIRED") != NULL)                                                  \
            fail_msg("no skip allowed here: %s", why);                                             \
        print_message("SKIP: %s\n", why);                                                          \
        skip();                                                                                    \
    } while (0)

void test_cuda_device_memory(void **state)
{
#ifndef BATON_HAVE_CUDA
    cuda_skip("built without CUDA");
#else
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        cuda_skip("no CUDA driver (libcuda.so.1) on this host");
    }
    typedef unsigned long long dptr_t;
    int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*cu_count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    int (*cu_get)(int *, int) = (int (*)(int *, int))dlsym(h, "cuDeviceGet");
    int (*cu_retain)(void **, int) = (int (*)(void **, int))dlsym(h, "cuDevicePrimaryCtxRetain");
    int (*cu_set)(void *) = (int (*)(void *))dlsym(h, "cuCtxSetCurrent");
    int (*cu_alloc)(dptr_t *, size_t) = (int (*)(dptr_t *, size_t))dlsym(h, "cuMemAlloc_v2");
    int (*cu_free)(dptr_t) = (int (*)(dptr_t))dlsym(h, "cuMemFree_v2");
    int (*cu_htod)(dptr_t, const void *, size_t) =
        (int (*)(dptr_t, const void *, size_t))dlsym(h, "cuMemcpyHtoD_v2");
    int (*cu_dtoh)(void *, dptr_t, size_t) =
        (int (*)(void *, dptr_t, size_t))dlsym(h, "cuMemcpyDtoH_v2");
    int n = 0, dev = 0;
    void *ctx = NULL;
    if (!cu_init || !cu_count || cu_init(0) != 0 || cu_count(&n) != 0 || n == 0) {
        cuda_skip("no CUDA device");
    }
    assert_non_null(cu_htod);
    assert_non_null(cu_dtoh);
    assert_int_equal(cu_get(&dev, 0), 0);
    assert_int_equal(cu_retain(&ctx, dev), 0);
    assert_int_equal(cu_set(ctx), 0);
    const size_t dlen = 1 << 20;
    dptr_t dsrc = 0, ddst = 0;
    assert_int_equal(cu_alloc(&dsrc, SRC_LEN), 0);
    assert_int_equal(cu_alloc(&ddst, dlen), 0);
    assert_int_equal(cu_htod(dsrc, src, SRC_LEN), 0);
    uint8_t *poison = malloc(dlen), *mirror = malloc(dlen);
    assert_non_null(poison);
    assert_non_null(mirror);
    memset(poison, XFER_POISON, dlen);
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
    baton_xfer_mem_t *ms = NULL, *md = NULL;
    assert_int_equal(API(baton_xfer_mem_register(T.p, (void *)(uintptr_t)dsrc, SRC_LEN,
                                                 BATON_XFER_MEM_CUDA, 0, &ms)),
                     0);
    assert_int_equal(API(baton_xfer_mem_register(T.d, (void *)(uintptr_t)ddst, dlen,
                                                 BATON_XFER_MEM_CUDA, 0, &md)),
                     0);
    T.pmode = P_AUTO;
    int port = baton_xfer_engine_listen_port(T.p);
    /* page_len 40000: not a multiple of the 16 KiB slices or of the receiver's chunk */
    const struct {
        int dev_src, dev_dst;
    } cases[] = {{1, 0}, {1, 1}, {0, 1}};
    uint64_t want_p = 0, want_d = 0;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        droom_t r[2] = {{.id = 808 + c, .layers = 3, .ppl = 8, .page_len = 40000, .slot = 40960},
                        {0}};
        uint64_t bytes = (uint64_t)r[0].layers * r[0].ppl * r[0].page_len;
        r[0].device = cases[c].dev_dst;
        wsrc = cases[c].dev_src ? (uint8_t *)(uintptr_t)dsrc : src;
        if (cases[c].dev_dst)
            assert_int_equal(cu_htod(ddst, poison, dlen), 0);
        assert_int_equal(
            offer_room(&r[0], port, cases[c].dev_dst ? (uint8_t *)(uintptr_t)ddst : T.pool), 0);
        run_until(all_done, r, 10000, "device-memory room");
        assert_int_equal(r[0].status, 0);
        if (cases[c].dev_dst) {
            assert_int_equal(cu_dtoh(mirror, ddst, dlen), 0);
            r[0].base = mirror;
            check_pages(&r[0]);
        }
        assert_int_equal(T.corrupt, 0);
        want_p += cases[c].dev_src ? bytes : 0;
        want_d += cases[c].dev_dst ? bytes : 0;
    }
    wsrc = src;
    baton_xfer_stats_t sp, sd;
    baton_xfer_engine_stats_sized(T.p, &sp, sizeof(sp));
    baton_xfer_engine_stats_sized(T.d, &sd, sizeof(sd));
    assert_int_equal(sp.staged_bytes, want_p);
    assert_int_equal(sd.staged_bytes, want_d);
    assert_true(sp.stage_buffer_bytes > 0 && sp.stage_buffer_bytes <= (8u << 20));
    assert_true(sd.stage_buffer_bytes > 0 && sd.stage_buffer_bytes <= 3 * (512u << 10));
    assert_int_equal(API(baton_xfer_mem_deregister(T.d, md)), 0);
    assert_int_equal(API(baton_xfer_mem_deregister(T.p, ms)), 0);
    stop_engines();
    free(poison);
    free(mirror);
    cu_free(dsrc);
    cu_free(ddst);
    dlclose(h);
#endif
}
