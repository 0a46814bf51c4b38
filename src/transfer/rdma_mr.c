/* transfer/rdma_mr.c — registration on every HCA (split at max_mr_size, dmabuf) and peer rkeys. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/mman.h>

#include "common/log.h"
#include "transfer/cuda_shim.h"
#include "transfer/le_bytes.h"
#include "transfer/rdma.h"

/* The same memory is a write source on prefill and a write target on decode. Constant, so the
 * ibv_reg_mr macro resolves to the plain ibv_reg_mr symbol. */
#define MR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static uint32_t chunk_count(uint64_t len, uint64_t chunk)
{
    uint64_t n = len / chunk + (len % chunk != 0);
    return n > UINT32_MAX ? 0 : (uint32_t)n;
}

static void dereg_all(rdma_mr_t *mr)
{
    rdma_tp_t *tp = container_of(mr->base.tp, rdma_tp_t, base);
    for (int d = 0; d < mr->ndev; d++) {
        for (uint32_t c = 0; c < mr->nchunks; c++) {
            struct ibv_mr **m = &mr->mrs[(size_t)d * mr->nchunks + c];
            if (!*m)
                continue;
            int err = baton__rdma_err_ret(ibv_dereg_mr(*m));
            if (err)
                log_error("rdma", "dereg_mr_failed dev=%s chunk=%u err=%s", tp->devs[d].name, c,
                          baton_strerror(err));
            *m = NULL;
        }
    }
}

static int reg_host(rdma_tp_t *tp, rdma_mr_t *mr);

#ifdef BATON_HAVE_CUDA
/*
 * Device memory. The driver is resolved at run time (cuda_shim.c), so a CUDA build starts on
 * hosts without libcuda.so.1; registration then fails with a clear error. Registration may run
 * on any caller thread: the owning device's context is made current here first. The dma-buf
 * covers the allocation's exact range (cuMemGetAddressRange), never a page rounding that could
 * reach past it; without dma-buf (old driver or kernel) the device pointer is registered as is,
 * which works where nvidia-peermem is loaded.
 */
static int reg_cuda(rdma_tp_t *tp, rdma_mr_t *mr)
{
    CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)mr->base.addr, abase = 0;
    size_t asize = 0;
    CUdevice cdev;
    if (baton__cuda_bind(ptr, &cdev) != 0)
        return BATON_ENOTSUP;
    CUresult cr = baton__cu.mem_get_address_range(&abase, &asize, ptr);
    if (cr != CUDA_SUCCESS || ptr < abase || ptr - abase > asize ||
        mr->base.len > asize - (ptr - abase)) {
        log_error("rdma", "cuda_range_invalid addr=%p len=%zu base=0x%llx size=%zu cu_err=%s",
                  mr->base.addr, mr->base.len, (unsigned long long)abase, asize,
                  cr == CUDA_SUCCESS ? "outside_allocation" : baton__cuda_errstr(cr));
        return BATON_EINVAL;
    }
    int ordering = CU_GPU_DIRECT_RDMA_WRITES_ORDERING_NONE;
    if (baton__cu.device_get_attribute(
            &ordering, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING, cdev) != CUDA_SUCCESS)
        ordering = CU_GPU_DIRECT_RDMA_WRITES_ORDERING_NONE;
    /* the writer must read back before it reports the bytes in place (see transfer.h) */
    mr->readback = ordering < CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER;
    char bus[32];
    if (baton__cu.device_get_pci_bus_id(bus, (int)sizeof(bus), cdev) == CUDA_SUCCESS)
        mr->near_devs = baton__rdma_near_devs(tp, bus);

    int fd = -1;
    cr = CUDA_ERROR_NOT_SUPPORTED;
    if (baton__cu.mem_get_handle_for_address_range)
        cr = baton__cu.mem_get_handle_for_address_range(&fd, abase, asize,
                                                        CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (cr != CUDA_SUCCESS || fd < 0) {
        log_warn("rdma",
                 "cuda_dmabuf_unavailable addr=%p len=%zu cu_err=%s: registering the device "
                 "pointer directly (needs nvidia-peermem)",
                 mr->base.addr, mr->base.len, baton__cuda_errstr(cr));
        mr->peermem = 1;
        return reg_host(tp, mr);
    }
    uintptr_t addr = (uintptr_t)mr->base.addr;
    int err = 0;
    for (int d = 0; d < mr->ndev && !err; d++) {
        if (__atomic_load_n(&tp->devs[d].dead, __ATOMIC_RELAXED))
            continue;
        for (uint32_t c = 0; c < mr->nchunks; c++) {
            uint64_t off = (uint64_t)c * mr->chunk;
            uint64_t len = mr->base.len - off < mr->chunk ? mr->base.len - off : mr->chunk;
            struct ibv_mr *m = ibv_reg_dmabuf_mr(tp->devs[d].pd, addr + off - abase, len,
                                                 addr + off, fd, MR_ACCESS);
            if (!m) {
                err = baton__rdma_err_null();
                log_error("rdma", "reg_dmabuf_mr_failed dev=%s addr=%p len=%llu err=%s",
                          tp->devs[d].name, (void *)(addr + off), (unsigned long long)len,
                          baton_strerror(err));
                break;
            }
            mr->mrs[(size_t)d * mr->nchunks + c] = m;
        }
    }
    close(fd); /* each MR holds its own reference to the dma-buf */
    return err;
}
#endif

/* Transparent huge pages under a large pool: one NIC translation entry per 2 MiB instead of
 * per 4 KiB. Advice only (the caller owns the mapping); failures are logged, not fatal. */
static void advise_hugepages(void *addr, size_t len)
{
    const uintptr_t huge = 2u << 20;
    uintptr_t lo = ((uintptr_t)addr + huge - 1) & ~(huge - 1);
    uintptr_t hi = ((uintptr_t)addr + len) & ~(huge - 1);
    if (hi <= lo)
        return;
    if (madvise((void *)lo, hi - lo, MADV_HUGEPAGE) != 0)
        log_info("rdma", "hugepage_advice_refused addr=%p len=%zu errno=%d", addr, len, errno);
}

static int reg_host(rdma_tp_t *tp, rdma_mr_t *mr)
{
    uintptr_t addr = (uintptr_t)mr->base.addr;
    for (int d = 0; d < mr->ndev; d++) {
        if (__atomic_load_n(&tp->devs[d].dead, __ATOMIC_RELAXED))
            continue;
        for (uint32_t c = 0; c < mr->nchunks; c++) {
            uint64_t off = (uint64_t)c * mr->chunk;
            uint64_t len = mr->base.len - off < mr->chunk ? mr->base.len - off : mr->chunk;
            struct ibv_mr *m = ibv_reg_mr(tp->devs[d].pd, (void *)(addr + off), len, MR_ACCESS);
            if (!m) {
                int err = baton__rdma_err_null();
                log_error("rdma", "reg_mr_failed dev=%s addr=%p len=%llu chunk=%u/%u err=%s",
                          tp->devs[d].name, (void *)(addr + off), (unsigned long long)len, c,
                          mr->nchunks, baton_strerror(err));
                return err;
            }
            /* never trust a silently shortened registration (PROTOCOLS.md §5) */
            if (m->length < len) {
                log_error("rdma", "reg_mr_short dev=%s asked=%llu got=%zu", tp->devs[d].name,
                          (unsigned long long)len, m->length);
                mr->mrs[(size_t)d * mr->nchunks + c] = m;
                return BATON_ENOMEM;
            }
            mr->mrs[(size_t)d * mr->nchunks + c] = m;
        }
    }
    return 0;
}

int baton__rdma_mem_reg(baton__tp_t *btp, const baton__tp_mem_params_t *p, baton__tp_mr_t **mr_p)
{
    rdma_tp_t *tp = container_of(btp, rdma_tp_t, base);
    if (!p || !p->addr || p->len == 0 || !mr_p)
        return BATON_EINVAL;
    if ((uintptr_t)p->addr + p->len < (uintptr_t)p->addr)
        return BATON_EINVAL;
#ifndef BATON_HAVE_CUDA
    if (p->kind == BATON_XFER_MEM_CUDA)
        return BATON_ENOTSUP;
#endif
    if (p->kind != BATON_XFER_MEM_HOST && p->kind != BATON_XFER_MEM_CUDA)
        return BATON_EINVAL;
    uint32_t nchunks = chunk_count(p->len, tp->chunk);
    if (nchunks == 0)
        return BATON_ETOOBIG;
    rdma_mr_t *mr = calloc(1, sizeof(*mr));
    if (!mr)
        return BATON_ENOMEM;
    mr->base.tp = btp;
    mr->base.addr = p->addr;
    mr->base.len = p->len;
    mr->base.kind = p->kind;
    mr->chunk = tp->chunk;
    mr->nchunks = nchunks;
    mr->ndev = tp->ndevs;
    mr->mrs = calloc((size_t)mr->ndev * nchunks, sizeof(*mr->mrs));
    if (!mr->mrs) {
        free(mr);
        return BATON_ENOMEM;
    }
    int err;
    if (p->kind == BATON_XFER_MEM_HOST && tp->hugepages)
        advise_hugepages(p->addr, p->len);
#ifdef BATON_HAVE_CUDA
    if (p->kind == BATON_XFER_MEM_CUDA)
        err = reg_cuda(tp, mr);
    else
#endif
        err = reg_host(tp, mr);
    if (err) {
        dereg_all(mr);
        free(mr->mrs);
        free(mr);
        return err;
    }
    log_debug("rdma",
              "mem_registered addr=%p len=%zu kind=%s devices=%d mrs_per_device=%u readback=%d "
              "peermem=%d near_devs=0x%x",
              p->addr, p->len, p->kind == BATON_XFER_MEM_CUDA ? "cuda" : "host", mr->ndev, nchunks,
              mr->readback, mr->peermem, mr->near_devs);
    *mr_p = &mr->base;
    return 0;
}

int baton__rdma_mem_dereg(baton__tp_mr_t *bmr)
{
    if (!bmr)
        return BATON_EINVAL;
    rdma_mr_t *mr = container_of(bmr, rdma_mr_t, base);
    dereg_all(mr);
    free(mr->mrs);
    free(mr);
    return 0;
}

/* ---- key blob ----------------------------------------------------------------------------
 *   0 u32 magic "BRMK"  4 u16 version  6 u16 n_dev  8 u64 base  16 u64 len  24 u64 chunk
 *  32 u32 n_chunks     36 u16 kind  38 u16 flags (bit 0: GPU memory the writer must read
 *                                                  back before reporting it in place)
 *  40 per device: u16 device index, u16 0, u32 rkey[n_chunks]
 */
#define KEY_MAGIC         0x4b4d5242u
#define KEY_VERSION       1
#define KEY_HDR           40
#define KEY_FLAG_READBACK 1u

int baton__rdma_mem_key(baton__tp_mr_t *bmr, uint8_t *buf, size_t cap, size_t *len_p)
{
    if (!bmr || !buf || !len_p)
        return BATON_EINVAL;
    rdma_mr_t *mr = container_of(bmr, rdma_mr_t, base);
    int ndev = 0;
    for (int d = 0; d < mr->ndev; d++)
        ndev += mr->mrs[(size_t)d * mr->nchunks] != NULL;
    size_t need = KEY_HDR + (size_t)ndev * (4 + 4 * (size_t)mr->nchunks);
    if (need > cap) {
        log_error("rdma", "mem_key_too_big addr=%p chunks=%u devices=%d need=%zu cap=%zu",
                  bmr->addr, mr->nchunks, ndev, need, cap);
        return BATON_ETOOBIG;
    }
    memset(buf, 0, KEY_HDR);
    baton__le_put32(buf, KEY_MAGIC);
    baton__le_put16(buf + 4, KEY_VERSION);
    baton__le_put16(buf + 6, (uint16_t)ndev);
    baton__le_put64(buf + 8, (uintptr_t)bmr->addr);
    baton__le_put64(buf + 16, bmr->len);
    baton__le_put64(buf + 24, mr->chunk);
    baton__le_put32(buf + 32, mr->nchunks);
    baton__le_put16(buf + 36, (uint16_t)bmr->kind);
    baton__le_put16(buf + 38, mr->readback ? KEY_FLAG_READBACK : 0);
    uint8_t *p = buf + KEY_HDR;
    for (int d = 0; d < mr->ndev; d++) {
        if (!mr->mrs[(size_t)d * mr->nchunks])
            continue;
        baton__le_put16(p, (uint16_t)d);
        baton__le_put16(p + 2, 0);
        p += 4;
        for (uint32_t c = 0; c < mr->nchunks; c++, p += 4)
            baton__le_put32(p, mr->mrs[(size_t)d * mr->nchunks + c]->rkey);
    }
    *len_p = need;
    return 0;
}

uint32_t baton__rdma_lkey(const rdma_mr_t *mr, int dev, uintptr_t src, uint64_t *room_p)
{
    uint64_t off = src - (uintptr_t)mr->base.addr;
    uint64_t c = off / mr->chunk;
    uint64_t end = (c + 1) * mr->chunk;
    if (end > mr->base.len || end < off)
        end = mr->base.len;
    *room_p = end - off;
    const struct ibv_mr *m = mr->mrs[(size_t)dev * mr->nchunks + c];
    return m ? m->lkey : 0;
}

uint32_t baton__rdma_rkey(const rdma_rmem_t *rm, int rnic, uint64_t dst, uint64_t *room_p)
{
    uint64_t off = dst - rm->base;
    uint64_t c = off / rm->chunk;
    uint64_t end = (c + 1) * rm->chunk;
    if (end > rm->len || end < off)
        end = rm->len;
    *room_p = end - off;
    return rm->rkeys[(size_t)rm->col[rnic] * rm->nchunks + c];
}

/* ---- the peer's regions ------------------------------------------------------------------ */

rdma_rmem_t *baton__rdma_rmem_find(rdma_peer_t *peer, uint32_t mem_id)
{
    for (int i = 0; i < peer->nrmems; i++)
        if (peer->rmems[i].mem_id == mem_id)
            return &peer->rmems[i];
    return NULL;
}

int baton__rdma_mem_add(baton__tp_peer_t *bp, uint32_t mem_id, uint64_t base, uint64_t len,
                        baton_xfer_mem_kind_t kind, const uint8_t *b, size_t blen)
{
    rdma_peer_t *peer = container_of(bp, rdma_peer_t, base);
    if (peer->nrnic == 0)
        return BATON_EINVAL; /* regions arrive after the handshake: on the writing side, and on
                              * a puller for the holder's source regions (RDMA READ) */
    if (baton__rdma_rmem_find(peer, mem_id))
        return BATON_EEXIST;
    if (!b || blen < KEY_HDR || baton__le_get32(b) != KEY_MAGIC ||
        baton__le_get16(b + 4) != KEY_VERSION)
        goto proto;
    uint16_t ndev = baton__le_get16(b + 6);
    uint64_t kbase = baton__le_get64(b + 8), klen = baton__le_get64(b + 16),
             chunk = baton__le_get64(b + 24);
    uint32_t nchunks = baton__le_get32(b + 32), kkind = baton__le_get16(b + 36);
    uint16_t kflags = baton__le_get16(b + 38);
    if (ndev < 1 || ndev > BATON__RDMA_MAX_DEVS || chunk == 0 || klen == 0 || nchunks == 0 ||
        kbase != base || klen != len || kkind != (uint32_t)kind || base + len < base)
        goto proto;
    if (chunk_count(klen, chunk) != nchunks)
        goto proto;
    if (blen != KEY_HDR + (size_t)ndev * (4 + 4 * (size_t)nchunks))
        goto proto;

    rdma_rmem_t rm;
    memset(&rm, 0, sizeof(rm));
    rm.mem_id = mem_id;
    rm.base = base;
    rm.len = len;
    rm.chunk = chunk;
    rm.nchunks = nchunks;
    rm.ndev = ndev;
    rm.readback = (kflags & KEY_FLAG_READBACK) != 0;
    const uint8_t *p = b + KEY_HDR;
    for (int d = 0; d < ndev; d++, p += 4 + 4 * (size_t)nchunks) {
        rm.devidx[d] = baton__le_get16(p);
        if (rm.devidx[d] >= BATON__RDMA_MAX_DEVS)
            goto proto;
        for (int e = 0; e < d; e++)
            if (rm.devidx[e] == rm.devidx[d])
                goto proto;
    }
    /* every NIC this connection writes through needs its own rkeys */
    for (int i = 0; i < peer->nrnic; i++) {
        rm.col[i] = -1;
        for (int d = 0; d < ndev; d++)
            if (rm.devidx[d] == peer->rnic_dev[i])
                rm.col[i] = d;
        if (rm.col[i] < 0) {
            log_error("rdma", "mem_add_rejected mem_id=%u reason=no_rkeys_for_peer_nic dev=%u",
                      mem_id, (unsigned)peer->rnic_dev[i]);
            return BATON_ERKEY;
        }
    }
    rm.rkeys = malloc((size_t)ndev * nchunks * sizeof(uint32_t));
    if (!rm.rkeys)
        return BATON_ENOMEM;
    p = b + KEY_HDR;
    for (int d = 0; d < ndev; d++) {
        p += 4;
        for (uint32_t c = 0; c < nchunks; c++, p += 4)
            rm.rkeys[(size_t)d * nchunks + c] = baton__le_get32(p);
    }
    if (peer->nrmems == peer->caprmems) {
        int ncap = peer->caprmems ? peer->caprmems * 2 : 8;
        rdma_rmem_t *n = realloc(peer->rmems, (size_t)ncap * sizeof(*n));
        if (!n) {
            free(rm.rkeys);
            return BATON_ENOMEM;
        }
        peer->rmems = n;
        peer->caprmems = ncap;
    }
    peer->rmems[peer->nrmems++] = rm;
    log_debug("rdma", "mem_added mem_id=%u base=0x%llx len=%llu chunks=%u devices=%u", mem_id,
              (unsigned long long)base, (unsigned long long)len, nchunks, (unsigned)ndev);
    return 0;

proto:
    log_error("rdma", "mem_add_rejected mem_id=%u reason=malformed_key_blob len=%zu", mem_id, blen);
    return BATON_EPROTO;
}

int baton__rdma_mem_del(baton__tp_peer_t *bp, uint32_t mem_id)
{
    rdma_peer_t *peer = container_of(bp, rdma_peer_t, base);
    rdma_rmem_t *rm = baton__rdma_rmem_find(peer, mem_id);
    if (!rm)
        return BATON_ENOTFOUND;
    int i = (int)(rm - peer->rmems);
    for (rdma_op_t *op = peer->ops_head; op; op = op->next)
        if (op->rm_idx == i && !op->posted_all)
            return BATON_EBUSY;
    free(rm->rkeys);
    memmove(rm, rm + 1, (size_t)(peer->nrmems - i - 1) * sizeof(*rm));
    peer->nrmems--;
    for (rdma_op_t *op = peer->ops_head; op; op = op->next)
        if (op->rm_idx == i)
            op->rm_idx = -1;
        else if (op->rm_idx > i)
            op->rm_idx--;
    return 0;
}

void baton__rdma_rmems_free(rdma_peer_t *peer)
{
    for (int i = 0; i < peer->nrmems; i++)
        free(peer->rmems[i].rkeys);
    free(peer->rmems);
    peer->rmems = NULL;
    peer->nrmems = peer->caprmems = 0;
}
