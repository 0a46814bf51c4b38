/* test_rdma.c — the RDMA transport against the verbs model: QPs, slices, faults, fencing. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../phase_checks.h"
#include <ftw.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "transfer/cuda_shim.h"
#include "transfer/rdma.h"
#include "verbs_model.h"

/* ---- what the engine provides, reduced to what the transport uses ------------------------ */

typedef struct defer_s {
    struct defer_s *next;
    void (*fn)(void *);
    void *arg;
} defer_t;

static defer_t *dq_head, **dq_tail = &dq_head;

int baton__tp_defer(const baton__tp_env_t *env, void (*fn)(void *arg), void *arg)
{
    defer_t *d = calloc(1, sizeof(*d));
    if (!d)
        return BATON_ENOMEM;
    d->fn = fn;
    d->arg = arg;
    *dq_tail = d;
    dq_tail = &d->next;
    return 0;
}

static int run_deferred(void)
{
    defer_t *list = dq_head;
    dq_head = NULL;
    dq_tail = &dq_head;
    int n = 0;
    while (list) {
        defer_t *d = list;
        list = d->next;
        d->fn(d->arg);
        free(d);
        n++;
    }
    return n;
}

int baton__tp_notsup_adopt_lane(baton__tp_peer_t *peer, uv_tcp_t *stream, uint32_t lane_index,
                                const uint8_t *rest, size_t rest_len)
{
    return BATON_ENOTSUP;
}

/* ---- fixture: a prefill transport (NICs 0..P-1) and a decode transport (the next D) ------- */

typedef struct {
    int failed; /* env->peer_failed calls */
    int fail_err;
    int connected; /* connect callbacks */
    int connect_status;
    int fenced;
    int fence_status;
} peer_rec_t;

typedef struct {
    baton__tp_write_t w;
    baton__tp_sge_t sge[4];
    int done;
    int status;
} wreq_t;

#define MEM_ID 7

static struct {
    uv_loop_t loop;
    baton_xfer_config_t cfg;
    baton__tp_env_t env_pre, env_dec;
    baton__tp_t *pre, *dec;
    baton__tp_peer_t *pp, *pd;
    peer_rec_t rp, rd;
    uint64_t gen;
    int npre, ndec;
    uint8_t *src, *dst;
    size_t size;
    baton__tp_mr_t *src_mr, *dst_mr;
    int expect_misuse;
} F;

static const baton__tp_ops_t *ops = &baton__tp_rdma_ops;
static baton__rdma_tunables_t tun; /* what the next tp_init uses; reset by base_setup */

/* The transport's init with the test's tunables (ops->init uses the defaults). */
static int tp_init(const baton__tp_env_t *env, baton__tp_t **tp_p)
{
    return baton__rdma_init_tuned(env, &tun, tp_p);
}

static void on_peer_failed(baton__tp_peer_t *peer, int err)
{
    peer_rec_t *r = peer->ctx;
    r->failed++;
    r->fail_err = err;
}

static void on_connected(baton__tp_peer_t *peer, int status, void *arg)
{
    peer_rec_t *r = arg;
    r->connected++;
    r->connect_status = status;
}

static void on_fenced(baton__tp_peer_t *peer, int status, void *arg)
{
    peer_rec_t *r = arg;
    r->fenced++;
    r->fence_status = status;
}

static void on_write(baton__tp_write_t *w, int status)
{
    wreq_t *x = container_of(w, wreq_t, w);
    x->done++;
    x->status = status;
}

/* Bounded progress: deferred calls and the loop (completion and async fds). */
static void spin(void)
{
    for (int i = 0; i < 8; i++) {
        run_deferred();
        uv_run(&F.loop, UV_RUN_NOWAIT);
    }
}

/* The model runs every queued WR (of QPs not held); the transport sees every completion. */
static void run_all(void)
{
    for (int i = 0; i < 400; i++) {
        int ran = vm_run();
        spin();
        if (!ran && !vm_queued() && !dq_head)
            break;
    }
}

static void env_init(baton__tp_env_t *env, const char *id, uint64_t inc)
{
    memset(env, 0, sizeof(*env));
    env->loop = &F.loop;
    env->cfg = &F.cfg;
    env->engine_id = id;
    env->incarnation = inc;
    env->peer_failed = on_peer_failed;
}

static void add_devs(int first, int n, enum ibv_mtu mtu, uint64_t max_mr)
{
    for (int i = first; i < first + n; i++) {
        vm_dev_cfg_t c;
        vm_dev_cfg_default(&c, i);
        c.active_mtu = mtu;
        if (max_mr)
            c.max_mr_size = max_mr;
        assert_int_equal(vm_add_device(&c), i);
    }
}

static void base_setup(void)
{
    vm_reset();
    memset(&F, 0, sizeof(F));
    dq_head = NULL;
    dq_tail = &dq_head;
    baton__rdma_tunables_default(&tun);
    assert_int_equal(uv_loop_init(&F.loop), 0);
    F.cfg.slice_size = 64 * 1024;
    F.cfg.rdma_qps_per_nic = 2;
    env_init(&F.env_pre, "prefill", 0x1111);
    env_init(&F.env_dec, "decode", 0x2222);
    F.gen = 100;
}

/* Prefill's transport owns devices [0, npre), decode's the next ndec. */
static void init_sides(int npre, int ndec)
{
    vm_set_visible(0, npre);
    assert_int_equal(tp_init(&F.env_pre, &F.pre), 0);
    vm_set_visible(npre, ndec);
    assert_int_equal(tp_init(&F.env_dec, &F.dec), 0);
    vm_set_visible(0, -1);
}

static void fx_start(int npre, int ndec, enum ibv_mtu mtu_pre, enum ibv_mtu mtu_dec,
                     uint64_t mr_pre, uint64_t mr_dec)
{
    F.npre = npre;
    F.ndec = ndec;
    add_devs(0, npre, mtu_pre, mr_pre);
    add_devs(npre, ndec, mtu_dec, mr_dec);
    init_sides(npre, ndec);
}

static int setup_default(void **state)
{
    base_setup();
    fx_start(2, 2, IBV_MTU_4096, IBV_MTU_4096, 0, 0);
    return 0;
}

static size_t blob_of(baton__tp_peer_t *p, uint8_t *buf)
{
    size_t len = 0;
    assert_int_equal(ops->peer_info(p, buf, BATON__TP_BLOB_MAX, &len), 0);
    assert_true(len > 0);
    return len;
}

/* The handshake as the engine runs it: decode's blob first, prefill answers. */
static void fx_connect(void)
{
    uint8_t bd[BATON__TP_BLOB_MAX], bp[BATON__TP_BLOB_MAX];
    memset(&F.rp, 0, sizeof(F.rp));
    memset(&F.rd, 0, sizeof(F.rd));
    assert_int_equal(ops->peer_create(F.dec, BATON__TP_ROLE_TARGET, ++F.gen, &F.pd), 0);
    F.pd->ctx = &F.rd;
    size_t ld = blob_of(F.pd, bd);
    assert_int_equal(ops->peer_create(F.pre, BATON__TP_ROLE_INITIATOR, ++F.gen, &F.pp), 0);
    F.pp->ctx = &F.rp;
    assert_int_equal(ops->peer_connect(F.pp, bd, ld, on_connected, &F.rp), 0);
    assert_int_equal(F.rp.connected, 0); /* never inside the call */
    spin();
    assert_int_equal(F.rp.connected, 1);
    assert_int_equal(F.rp.connect_status, 0);
    size_t lp = blob_of(F.pp, bp);
    assert_int_equal(ops->peer_connect(F.pd, bp, lp, on_connected, &F.rd), 0);
    spin();
    assert_int_equal(F.rd.connected, 1);
    assert_int_equal(F.rd.connect_status, 0);
}

/* Registers size bytes on both sides and announces the decode region to the prefill peer. */
static void fx_mem(size_t size)
{
    F.size = size;
    F.src = aligned_alloc(4096, size);
    F.dst = aligned_alloc(4096, size);
    assert_non_null(F.src);
    assert_non_null(F.dst);
    for (size_t i = 0; i < size; i++)
        F.src[i] = (uint8_t)(i * 131 + (i >> 12) + 7);
    memset(F.dst, 0, size);
    baton__tp_mem_params_t mp = {
        .addr = F.src, .len = size, .kind = BATON_XFER_MEM_HOST, .memfd = -1};
    assert_int_equal(ops->mem_reg(F.pre, &mp, &F.src_mr), 0);
    mp.addr = F.dst;
    assert_int_equal(ops->mem_reg(F.dec, &mp, &F.dst_mr), 0);
}

static void fx_announce(void)
{
    uint8_t key[BATON__TP_BLOB_MAX];
    size_t klen = 0;
    assert_int_equal(ops->mem_key(F.dst_mr, key, sizeof(key), &klen), 0);
    assert_int_equal(
        ops->mem_add(F.pp, MEM_ID, (uintptr_t)F.dst, F.size, BATON_XFER_MEM_HOST, key, klen), 0);
}

static int fx_write(wreq_t *x, size_t src_off, size_t dst_off, size_t len)
{
    memset(x, 0, sizeof(*x));
    x->sge[0].src = F.src + src_off;
    x->sge[0].src_mr = F.src_mr;
    x->sge[0].dst = (uintptr_t)F.dst + dst_off;
    x->sge[0].dst_mem = MEM_ID;
    x->sge[0].len = len;
    x->w.room_id = 42;
    x->w.sges = x->sge;
    x->w.n_sges = 1;
    x->w.cb = on_write;
    return ops->write(F.pp, &x->w);
}

static void fence_destroy(baton__tp_peer_t **p, peer_rec_t *r)
{
    if (!*p)
        return;
    if (!r->fenced) {
        assert_int_equal(ops->peer_fence(*p, on_fenced, r), 0);
        assert_int_equal(r->fenced, 0);
        run_all();
        assert_int_equal(r->fenced, 1);
        assert_int_equal(r->fence_status, 0);
    }
    ops->peer_destroy(*p);
    *p = NULL;
}

static int teardown(void **state)
{
    fence_destroy(&F.pp, &F.rp);
    fence_destroy(&F.pd, &F.rd);
    if (F.src_mr)
        assert_int_equal(ops->mem_dereg(F.src_mr), 0);
    if (F.dst_mr)
        assert_int_equal(ops->mem_dereg(F.dst_mr), 0);
    if (F.pre)
        ops->fini(F.pre);
    if (F.dec)
        ops->fini(F.dec);
    spin();
    assert_int_equal(uv_loop_close(&F.loop), 0); /* every handle closed */
    assert_int_equal(vm_live_objects(), 0);      /* every verbs object released */
    vm_stats_t st;
    vm_stats(&st);
    if (!F.expect_misuse)
        assert_int_equal(st.misuse, 0);
    free(F.src);
    free(F.dst);
    baton__rdma_tunables_default(&tun);
    return 0;
}

/* QPNs of one side (prefill: devices < npre), in creation order; returns how many. */
static int side_qps(int prefill, uint32_t *out, int cap, int live_only)
{
    uint32_t all[512];
    int n = vm_qp_list(all, 512), k = 0;
    for (int i = 0; i < n && k < cap; i++) {
        vm_qp_info_t qi;
        vm_qp_info(all[i], &qi);
        if ((qi.dev < F.npre) != !!prefill)
            continue;
        if (live_only && qi.destroyed)
            continue;
        out[k++] = all[i];
    }
    return k;
}

static int had_state(const vm_qp_info_t *qi, enum ibv_qp_state s)
{
    for (int i = 0; i < qi->nhistory; i++)
        if (qi->history[i] == s)
            return 1;
    return 0;
}

static int bytes_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
    return memcmp(a, b, n) == 0;
}

static int all_bytes(const uint8_t *a, uint8_t v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != v)
            return 0;
    return 1;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_no_devices(void **state)
{
    baton__tp_t *tp = NULL;
    base_setup();
    /* no device at all */
    assert_int_equal(tp_init(&F.env_pre, &tp), BATON_ENODEV);
    assert_null(tp);
    /* a kernel without RDMA: the device list itself fails */
    vm_set_no_kernel_support(1);
    assert_int_equal(tp_init(&F.env_pre, &tp), BATON_ENODEV);
    vm_set_no_kernel_support(0);
    /* a device without ports, and one whose port is down */
    vm_dev_cfg_t c;
    vm_dev_cfg_default(&c, 0);
    c.nports = 0;
    vm_add_device(&c);
    vm_dev_cfg_default(&c, 1);
    c.port_state = IBV_PORT_DOWN;
    vm_add_device(&c);
    assert_int_equal(tp_init(&F.env_pre, &tp), BATON_ENODEV);
    /* a usable device that the filter does not name */
    vm_dev_cfg_default(&c, 2);
    vm_add_device(&c);
    F.cfg.rdma_devices = "mlx5_9, nothing";
    assert_int_equal(tp_init(&F.env_pre, &tp), BATON_ENODEV);
    /* a device that cannot be opened */
    F.cfg.rdma_devices = "vm_2";
    vm_fail_op(VM_OP_OPEN_DEVICE, 1, EPERM);
    assert_int_equal(tp_init(&F.env_pre, &tp), BATON_ENODEV);
    /* ... and the same device when it opens: only that one is used */
    assert_int_equal(tp_init(&F.env_pre, &tp), 0);
    assert_int_equal(container_of(tp, rdma_tp_t, base)->ndevs, 1);
    ops->fini(tp);
    spin();
    assert_int_equal(uv_loop_close(&F.loop), 0);
    assert_int_equal(vm_live_objects(), 0);
    vm_stats_t st;
    vm_stats(&st);
    assert_int_equal(st.misuse, 0);
}

static void check_connection(enum ibv_mtu want_mtu)
{
    uint32_t pq[64], dq[64];
    int np = side_qps(1, pq, 64, 1), nd = side_qps(0, dq, 64, 1);
    /* >= 2 RC QPs per NIC per peer, on every NIC */
    assert_int_equal(np, F.ndec * 2); /* one initiator QP per target QP */
    assert_int_equal(nd, F.ndec * 2);
    int per_dev[8] = {0};
    for (int s = 0; s < 2; s++) {
        uint32_t *q = s ? dq : pq;
        int n = s ? nd : np;
        for (int i = 0; i < n; i++) {
            vm_qp_info_t a, b;
            vm_qp_info(q[i], &a);
            per_dev[a.dev]++;
            assert_int_equal(a.state, IBV_QPS_RTS);
            assert_int_equal(a.nhistory, 4);
            assert_int_equal(a.history[0], IBV_QPS_RESET);
            assert_int_equal(a.history[1], IBV_QPS_INIT);
            assert_int_equal(a.history[2], IBV_QPS_RTR);
            assert_int_equal(a.history[3], IBV_QPS_RTS);
            assert_int_equal(a.cap.max_send_wr, 256);
            assert_int_equal(a.cap.max_send_sge, 4);
            assert_int_equal(a.cap.max_inline_data, 64);
            assert_int_equal(a.sq_sig_all, 0);
            /* RESET -> INIT */
            assert_int_equal(a.init_mask,
                             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
            assert_int_equal(a.access_flags, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                                                 IBV_ACCESS_REMOTE_WRITE);
            assert_int_equal(a.port_num, 1);
            assert_int_equal(a.pkey_index, 0);
            /* INIT -> RTR */
            assert_int_equal(a.rtr_mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                             IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
            assert_int_equal(a.path_mtu, want_mtu);
            assert_int_equal(a.max_dest_rd_atomic, 16);
            assert_int_equal(a.min_rnr_timer, 12);
            assert_int_equal(a.is_global, 1);
            /* RTR -> RTS */
            assert_int_equal(a.rts_mask, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                             IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                             IBV_QP_MAX_QP_RD_ATOMIC);
            assert_int_equal(a.timeout, 14);
            assert_int_equal(a.retry_cnt, 7);
            assert_int_equal(a.rnr_retry, 7);
            assert_int_equal(a.max_rd_atomic, 16);
            /* the pair: each names the other, PSNs agree, GRH carries the peer's GID */
            vm_qp_info(a.dest_qpn, &b);
            assert_true(b.exists);
            assert_int_equal(b.dest_qpn, q[i]);
            assert_int_equal(a.rq_psn, b.sq_psn);
            assert_int_equal(a.sq_psn, b.rq_psn);
            assert_true((a.dev < F.npre) != (b.dev < F.npre));
            vm_dev_cfg_t pc;
            vm_dev_cfg_default(&pc, b.dev);
            assert_memory_equal(a.dgid, pc.gid, 16);
            assert_int_equal(a.dlid, pc.lid);
        }
    }
    for (int d = 0; d < F.npre + F.ndec; d++)
        assert_true(per_dev[d] >= 2);
}

static void test_qp_states_mtu_min_decode_smaller(void **state)
{
    base_setup();
    fx_start(2, 2, IBV_MTU_4096, IBV_MTU_1024, 0, 0);
    fx_connect();
    check_connection(IBV_MTU_1024);
}

static void test_qp_states_mtu_min_prefill_smaller(void **state)
{
    base_setup();
    fx_start(2, 2, IBV_MTU_2048, IBV_MTU_4096, 0, 0);
    fx_connect();
    check_connection(IBV_MTU_2048);
}

static void test_slicing_and_striping(void **state)
{
    const size_t len = (1u << 20) + 3;
    fx_connect();
    fx_mem(2u << 20);
    fx_announce();
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 5, len), 0);
    assert_int_equal(x.done, 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    assert_true(bytes_equal(F.dst + 5, F.src, len));
    assert_true(all_bytes(F.dst, 0, 5));
    assert_true(all_bytes(F.dst + 5 + len, 0, F.size - 5 - len));

    vm_stats_t st;
    vm_stats(&st);
    size_t slices = (len + 65535) / 65536;
    assert_int_equal(st.wrs_posted, slices);
    assert_int_equal(st.wrs_run, slices);
    assert_int_equal(st.bytes_landed, len);
    assert_true(st.max_wr_bytes <= 65536);
    assert_int_equal(vm_bytes_landed_in(F.dst, 5), 0);
    assert_int_equal(vm_bytes_landed_in(F.dst + 5, len), len);
    /* round-robin over 4 QPs on 2 NICs: 5,4,4,4 WRs; both NICs carry half */
    uint32_t pq[8];
    int np = side_qps(1, pq, 8, 1);
    assert_int_equal(np, 4);
    uint64_t per_dev[2] = {0, 0}, signalled = 0;
    for (int i = 0; i < np; i++) {
        vm_qp_info_t a;
        vm_qp_info(pq[i], &a);
        assert_true(a.wrs_run >= slices / 4 && a.wrs_run <= slices / 4 + 1);
        per_dev[a.dev] += a.wrs_run;
        signalled += a.wrs_signalled;
    }
    assert_true(per_dev[0] >= slices / 2 && per_dev[1] >= slices / 2);
    /* selective signalling: one completion per QP for this batch */
    assert_true(signalled < slices);
    assert_int_equal(st.cqes, signalled);
}

static void test_completion_only_after_every_slice(void **state)
{
    const size_t len = 4u << 20; /* 64 slices, 16 per QP */
    fx_connect();
    fx_mem(len);
    fx_announce();
    uint32_t pq[8];
    assert_int_equal(side_qps(1, pq, 8, 1), 4);

    /* one QP held back: the other three finish, the write must not */
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    vm_hold_qp(pq[2], 1);
    run_all();
    assert_int_equal(x.done, 0);
    vm_stats_t st;
    vm_stats(&st);
    assert_int_equal(st.wrs_run, 48);
    assert_true(st.cqes < st.wrs_run); /* fewer completions than WRs */
    vm_hold_qp(pq[2], 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
    vm_stats(&st);
    assert_int_equal(st.wrs_posted, 64);
    assert_true(st.cqes < 64);

    /* WR by WR: the last one missing still means "not complete" */
    memset(F.dst, 0, len);
    wreq_t y;
    assert_int_equal(fx_write(&y, 0, 0, len), 0);
    int queued = vm_queued();
    assert_int_equal(queued, 64);
    assert_int_equal(vm_step(queued - 1), queued - 1);
    spin();
    assert_int_equal(y.done, 0);
    assert_int_equal(vm_step(1), 1);
    spin();
    assert_int_equal(y.done, 1);
    assert_int_equal(y.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
}

static void test_mr_split_at_max_mr_size(void **state)
{
    base_setup();
    /* prefill HCAs register at most 96 KiB per MR, decode HCAs 256 KiB */
    fx_start(2, 2, IBV_MTU_4096, IBV_MTU_4096, 96 * 1024, 256 * 1024);
    fx_connect();
    fx_mem(1u << 20);
    vm_stats_t st;
    vm_stats(&st);
    assert_int_equal(st.mrs_registered, 2 * 11 + 2 * 4);
    uint8_t key[BATON__TP_BLOB_MAX];
    size_t klen = 0;
    assert_int_equal(ops->mem_key(F.dst_mr, key, sizeof(key), &klen), 0);
    assert_int_equal(klen, 40 + 2 * (4 + 4 * 4));
    fx_announce();
    /* unaligned on both sides: spans every MR boundary of both */
    const size_t len = (1u << 20) - 150;
    wreq_t x;
    assert_int_equal(fx_write(&x, 100, 50, len), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    assert_true(bytes_equal(F.dst + 50, F.src + 100, len));
    vm_stats(&st);
    assert_int_equal(st.wrs_failed, 0);
    assert_true(st.wrs_posted > (len + 65535) / 65536); /* cut at MR boundaries too */
    assert_true(st.max_wr_bytes <= 65536);
    assert_int_equal(st.bytes_landed, len);
}

static void test_retry_exceeded_then_reconnect(void **state)
{
    const size_t len = 2u << 20; /* 32 slices */
    fx_connect();
    fx_mem(len);
    fx_announce();
    uint32_t old[8];
    assert_int_equal(side_qps(1, old, 8, 1), 4);
    uint32_t oldd[8];
    assert_int_equal(side_qps(0, oldd, 8, 1), 4);
    uint64_t old_gen_p = F.pp->generation, old_gen_d = F.pd->generation;

    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    vm_fail_wr(10, IBV_WC_RETRY_EXC_ERR);
    run_all();
    /* the write fails once, with a clear error; the engine is told once */
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, BATON_EPEERDOWN);
    assert_int_equal(F.rp.failed, 1);
    assert_int_equal(F.rp.fail_err, BATON_EPEERDOWN);
    /* every QP of the connection went to ERR, was drained, and destroyed */
    for (int i = 0; i < 4; i++) {
        vm_qp_info_t a;
        vm_qp_info(old[i], &a);
        assert_true(had_state(&a, IBV_QPS_ERR));
        assert_true(a.destroyed);
    }
    vm_stats_t st;
    vm_stats(&st);
    assert_int_equal(st.wrs_failed, 1);
    assert_true(st.wrs_flushed > 0);
    assert_int_equal(st.misuse, 0); /* none destroyed before its WRs drained */
    /* a write on the dead connection is refused at once */
    wreq_t z;
    assert_int_equal(fx_write(&z, 0, 0, 4096), BATON_EPEERDOWN);
    spin();
    assert_int_equal(x.done, 1);
    assert_int_equal(z.done, 0);

    /* the engine fences both sides, destroys, and reconnects with a new generation */
    fence_destroy(&F.pp, &F.rp);
    fence_destroy(&F.pd, &F.rd);
    fx_connect();
    assert_true(F.pp->generation != old_gen_p && F.pd->generation != old_gen_d);
    uint32_t nq[8], nqd[8];
    assert_int_equal(side_qps(1, nq, 8, 1), 4);
    assert_int_equal(side_qps(0, nqd, 8, 1), 4);
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 4; j++) {
            assert_true(nq[i] != old[j]);
            assert_true(nqd[i] != oldd[j]);
        }
    }
    fx_announce();
    for (size_t i = 0; i < len; i++)
        F.src[i] = (uint8_t)(i * 7 + 3);
    memset(F.dst, 0, len);
    wreq_t y;
    assert_int_equal(fx_write(&y, 0, 0, len), 0);
    run_all();
    assert_int_equal(y.done, 1);
    assert_int_equal(y.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
    assert_int_equal(F.rp.failed, 0);
}

static void test_stale_handshake_ignored(void **state)
{
    uint8_t bd[BATON__TP_BLOB_MAX], bp[BATON__TP_BLOB_MAX], bd2[BATON__TP_BLOB_MAX];
    peer_rec_t r_old = {0}, r_new = {0};
    baton__tp_peer_t *pd_old, *pd_new, *pp_old;

    /* connection 1: decode's blob, prefill's answer -- which gets delayed */
    assert_int_equal(ops->peer_create(F.dec, BATON__TP_ROLE_TARGET, 1, &pd_old), 0);
    pd_old->ctx = &r_old;
    size_t ld = blob_of(pd_old, bd);
    assert_int_equal(ops->peer_create(F.pre, BATON__TP_ROLE_INITIATOR, 11, &pp_old), 0);
    pp_old->ctx = &F.rp;
    assert_int_equal(ops->peer_connect(pp_old, bd, ld, on_connected, &F.rp), 0);
    spin();
    size_t lp = blob_of(pp_old, bp);

    /* decode gave up on connection 1 and started connection 2 */
    assert_int_equal(ops->peer_fence(pd_old, on_fenced, &r_old), 0);
    run_all();
    assert_int_equal(r_old.fenced, 1);
    ops->peer_destroy(pd_old);
    assert_int_equal(ops->peer_create(F.dec, BATON__TP_ROLE_TARGET, 2, &pd_new), 0);
    pd_new->ctx = &r_new;
    size_t ld2 = blob_of(pd_new, bd2);
    (void)ld2;

    /* the late answer to connection 1 must not configure connection 2's QPs */
    assert_int_equal(ops->peer_connect(pd_new, bp, lp, on_connected, &r_new), BATON_ESTALE);
    spin();
    assert_int_equal(r_new.connected, 0);
    uint32_t dq[16];
    int nd = side_qps(0, dq, 16, 1);
    assert_int_equal(nd, 4);
    for (int i = 0; i < nd; i++) {
        vm_qp_info_t a;
        vm_qp_info(dq[i], &a);
        assert_int_equal(a.state, IBV_QPS_INIT);
        assert_int_equal(a.rtr_mask, 0);
    }
    /* malformed blobs are refused too */
    assert_int_equal(ops->peer_connect(pd_new, bp, lp - 1, on_connected, &r_new), BATON_EPROTO);
    uint8_t bad[BATON__TP_BLOB_MAX];
    memcpy(bad, bp, lp);
    bad[0] ^= 0xff;
    assert_int_equal(ops->peer_connect(pd_new, bad, lp, on_connected, &r_new), BATON_EPROTO);
    memcpy(bad, bp, lp);
    bad[40 + 3] = 9; /* MTU enum out of range */
    assert_int_equal(ops->peer_connect(pd_new, bad, lp, on_connected, &r_new), BATON_EPROTO);
    /* a target blob handed to a target */
    assert_int_equal(ops->peer_connect(pd_new, bd, ld, on_connected, &r_new), BATON_EPROTO);
    spin();
    assert_int_equal(r_new.connected, 0);

    /* a fresh answer for connection 2 works */
    F.pd = pd_new;
    F.rd = r_new;
    F.pd->ctx = &F.rd;
    baton__tp_peer_t *pp_new;
    assert_int_equal(ops->peer_create(F.pre, BATON__TP_ROLE_INITIATOR, 12, &pp_new), 0);
    peer_rec_t r_pnew = {0};
    pp_new->ctx = &r_pnew;
    assert_int_equal(ops->peer_connect(pp_new, bd2, ld2, on_connected, &r_pnew), 0);
    spin();
    size_t lp2 = blob_of(pp_new, bp);
    assert_int_equal(ops->peer_connect(F.pd, bp, lp2, on_connected, &F.rd), 0);
    spin();
    assert_int_equal(F.rd.connected, 1);
    assert_int_equal(F.rd.connect_status, 0);

    fence_destroy(&pp_old, &F.rp);
    fence_destroy(&pp_new, &r_pnew);
}

static void test_fenced_page_gets_no_late_write(void **state)
{
    const size_t len = 1u << 20; /* 16 slices, 4 per QP */
    fx_connect();
    fx_mem(len);
    fx_announce();
    uint32_t pq[8];
    assert_int_equal(side_qps(1, pq, 8, 1), 4);

    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    /* three QPs are slow; the fast one fails on its 2nd WR */
    for (int i = 1; i < 4; i++)
        vm_hold_qp(pq[i], 1);
    vm_fail_wr(2, IBV_WC_RETRY_EXC_ERR);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, BATON_EPEERDOWN);
    assert_int_equal(F.rp.failed, 1);
    /* every sibling QP went to ERR (their WRs flushed) and all are gone */
    for (int i = 0; i < 4; i++) {
        vm_qp_info_t a;
        vm_qp_info(pq[i], &a);
        assert_true(had_state(&a, IBV_QPS_ERR));
        assert_true(a.destroyed);
    }
    assert_int_equal(vm_queued(), 0);
    fence_destroy(&F.pp, &F.rp);
    fence_destroy(&F.pd, &F.rd);

    /* the page is released and reused: nothing may land in it any more */
    uint64_t landed = vm_bytes_landed_in(F.dst, len);
    assert_int_equal(landed, 65536); /* only the first slice made it */
    memset(F.dst, 0xEE, len);
    for (int i = 1; i < 4; i++)
        vm_hold_qp(pq[i], 0);
    run_all();
    assert_true(all_bytes(F.dst, 0xEE, len));
    assert_int_equal(vm_bytes_landed_in(F.dst, len), landed);
}

static void test_target_fence_stops_incoming_writes(void **state)
{
    const size_t len = 256 * 1024;
    fx_connect();
    fx_mem(len);
    fx_announce();
    /* decode fences its side (e.g. an abort with no ABORT_ACK): QPs to ERR and destroyed */
    assert_int_equal(ops->peer_fence(F.pd, on_fenced, &F.rd), 0);
    run_all();
    assert_int_equal(F.rd.fenced, 1);
    assert_int_equal(F.rd.failed, 0); /* fenced by the engine: no upcall */
    uint32_t dq[8];
    assert_int_equal(side_qps(0, dq, 8, 1), 0);
    memset(F.dst, 0xEE, len);
    /* prefill does not know yet and writes: nothing lands, the write fails */
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, BATON_EPEERDOWN);
    assert_int_equal(F.rp.failed, 1);
    assert_true(all_bytes(F.dst, 0xEE, len));
    assert_int_equal(vm_bytes_landed_in(F.dst, len), 0);
}

static void test_remote_access_errors(void **state)
{
    const size_t len = 256 * 1024;
    fx_connect();
    fx_mem(len);
    fx_announce();
    wreq_t x;
    /* out of the announced region, or an unknown region: refused before posting */
    assert_int_equal(fx_write(&x, 0, 4096, len), BATON_ERKEY);
    x.sge[0].dst_mem = 99;
    x.sge[0].dst = (uintptr_t)F.dst;
    x.sge[0].len = 4096;
    assert_int_equal(ops->write(F.pp, &x.w), BATON_ERKEY);
    /* a source outside its registration */
    assert_int_equal(fx_write(&x, len - 100, 0, 4096), BATON_EINVAL);
    vm_stats_t st;
    vm_stats(&st);
    assert_int_equal(st.wrs_posted, 0);

    /* a corrupted rkey reaches the HCA: remote access error */
    uint8_t key[BATON__TP_BLOB_MAX];
    size_t klen = 0;
    assert_int_equal(ops->mem_key(F.dst_mr, key, sizeof(key), &klen), 0);
    for (size_t off = 40; off + 8 <= klen; off += 8)
        key[off + 4] ^= 0x5a; /* first rkey of each device */
    assert_int_equal(ops->mem_add(F.pp, 8, (uintptr_t)F.dst, len, BATON_XFER_MEM_HOST, key, klen),
                     0);
    /* a key blob that does not match the announced region is refused */
    assert_int_equal(
        ops->mem_add(F.pp, 9, (uintptr_t)F.dst + 1, len, BATON_XFER_MEM_HOST, key, klen),
        BATON_EPROTO);
    assert_int_equal(ops->mem_add(F.pp, 9, (uintptr_t)F.dst, len, BATON_XFER_MEM_HOST, key, 20),
                     BATON_EPROTO);
    wreq_t y;
    memset(&y, 0, sizeof(y));
    y.sge[0].src = F.src;
    y.sge[0].src_mr = F.src_mr;
    y.sge[0].dst = (uintptr_t)F.dst;
    y.sge[0].len = len;
    y.sge[0].dst_mem = 8;
    y.w.room_id = 43;
    y.w.sges = y.sge;
    y.w.n_sges = 1;
    y.w.cb = on_write;
    memset(F.dst, 0xEE, len);
    assert_int_equal(ops->write(F.pp, &y.w), 0);
    run_all();
    assert_int_equal(y.done, 1);
    assert_int_equal(y.status, BATON_ERKEY);
    assert_int_equal(F.rp.failed, 1);
    assert_int_equal(F.rp.fail_err, BATON_ERKEY);
    assert_true(all_bytes(F.dst, 0xEE, len));
    assert_int_equal(vm_bytes_landed_in(F.dst, len), 0);
    vm_stats(&st);
    assert_true(st.wrs_failed >= 1);
}

/* ---- pull mode: RDMA READ by the decode side (the puller) from the prefill side's pages ---- */

#define SRC_ID 21 /* the holder's region as announced to the puller */

/* The puller learns the holder's source region (its rkeys per NIC), as a pull grant carries it. */
static void fx_announce_src(void)
{
    uint8_t key[BATON__TP_BLOB_MAX];
    size_t klen = 0;
    assert_int_equal(ops->mem_key(F.src_mr, key, sizeof(key), &klen), 0);
    assert_int_equal(
        ops->mem_add(F.pd, SRC_ID, (uintptr_t)F.src, F.size, BATON_XFER_MEM_HOST, key, klen), 0);
}

/* The puller reads [remote_off, +len) of the holder's region into its own pages at local_off. */
static int fx_read(wreq_t *x, size_t local_off, size_t remote_off, size_t len)
{
    memset(x, 0, sizeof(*x));
    x->sge[0].src = F.dst + local_off;
    x->sge[0].src_mr = F.dst_mr;
    x->sge[0].dst = (uintptr_t)F.src + remote_off;
    x->sge[0].dst_mem = SRC_ID;
    x->sge[0].len = len;
    x->w.room_id = 77;
    x->w.sges = x->sge;
    x->w.n_sges = 1;
    x->w.cb = on_write;
    return ops->read(F.pd, &x->w);
}

/* Holder NICs with 4 responder resources, puller NICs with 16: the handshake carries the holder's
 * limit, the puller's QPs go to RTS with max_rd_atomic 4 and never have more than 4 READs queued;
 * the bytes arrive only through READs, the callback only after the last one completed. */
static void test_read_pulls_holder_pages(void **state)
{
    (void)state;
    base_setup();
    F.npre = 2;
    F.ndec = 2;
    for (int i = 0; i < 4; i++) {
        vm_dev_cfg_t c;
        vm_dev_cfg_default(&c, i);
        c.max_rd_atom = i < 2 ? 4 : 16;
        assert_int_equal(vm_add_device(&c), i);
    }
    init_sides(2, 2);
    const size_t len = 4u << 20; /* 64 slices of 64 KiB over 4 QPs: 16 each, above the depth */
    fx_connect();
    fx_mem(len);
    fx_announce_src();
    uint32_t dq[8], pq[8];
    assert_int_equal(side_qps(0, dq, 8, 1), 4);
    assert_int_equal(side_qps(1, pq, 8, 1), 4);
    for (int i = 0; i < 4; i++) {
        vm_qp_info_t a;
        vm_qp_info(dq[i], &a);
        assert_int_equal(a.max_rd_atomic, 4); /* the holder's responder resources */
        vm_qp_info(pq[i], &a);
        assert_int_equal(a.max_dest_rd_atomic, 4);
        assert_true(a.access_flags & IBV_ACCESS_REMOTE_READ); /* the responder allows READs */
    }
    wreq_t x;
    assert_int_equal(fx_read(&x, 0, 0, len), 0);
    assert_int_equal(x.done, 0); /* never inside the call */
    vm_step(40);
    spin();
    assert_int_equal(x.done, 0); /* not before the last READ */
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
    vm_stats_t st;
    vm_stats(&st);
    assert_true(st.reads_run >= len / F.cfg.slice_size);
    assert_int_equal(st.reads_run, st.wrs_run); /* nothing but READs moved the bytes */
    assert_int_equal(st.bytes_landed, 0);       /* no WRITE landed anywhere */
    assert_int_equal(st.max_reads_queued, 4);   /* the depth was used, never exceeded */
    assert_int_equal(st.misuse, 0);
    for (size_t i = 0; i < len; i++) /* the holder's pages are untouched */
        if (F.src[i] != (uint8_t)(i * 131 + (i >> 12) + 7))
            fail_msg("holder byte %zu changed", i);
    /* a second read of a sub-range on the same connection, at an offset */
    memset(F.dst, 0, len);
    assert_int_equal(fx_read(&x, 4096, 8192, 100000), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    assert_true(bytes_equal(F.dst + 4096, F.src + 8192, 100000));
    assert_true(all_bytes(F.dst, 0, 4096));
    assert_int_equal(F.rd.failed, 0);
    assert_int_equal(F.rp.failed, 0);
}

/* Refused before anything is posted: an unknown region, a range outside the holder's region, a
 * local buffer outside its registration, a peer that is not up. Refused by the responder NIC: a
 * bad rkey (the READ completes with a remote access error, the connection fails once, nothing is
 * written into the puller's pages). */
static void test_read_refusals(void **state)
{
    (void)state;
    const size_t len = 256 * 1024;
    fx_connect();
    fx_mem(len);
    fx_announce_src();
    wreq_t x;
    assert_int_equal(fx_read(&x, 0, 4096, len), BATON_ERKEY); /* past the region's end */
    x.sge[0].dst_mem = 99;
    x.sge[0].dst = (uintptr_t)F.src;
    x.sge[0].len = 4096;
    assert_int_equal(ops->read(F.pd, &x.w), BATON_ERKEY);            /* a region never announced */
    assert_int_equal(fx_read(&x, len - 100, 0, 4096), BATON_EINVAL); /* local buffer outside */
    /* a connection not up yet */
    baton__tp_peer_t *fresh = NULL;
    assert_int_equal(ops->peer_create(F.dec, BATON__TP_ROLE_TARGET, ++F.gen, &fresh), 0);
    assert_int_equal(ops->read(fresh, &x.w), BATON_EPEERDOWN);
    ops->peer_destroy(fresh);
    vm_stats_t st;
    vm_stats(&st);
    assert_int_equal(st.wrs_posted, 0);

    /* a corrupted rkey reaches the holder's NIC */
    uint8_t key[BATON__TP_BLOB_MAX];
    size_t klen = 0;
    assert_int_equal(ops->mem_key(F.src_mr, key, sizeof(key), &klen), 0);
    for (size_t off = 40; off + 8 <= klen; off += 8)
        key[off + 4] ^= 0x5a; /* first rkey of each device */
    assert_int_equal(ops->mem_add(F.pd, 22, (uintptr_t)F.src, len, BATON_XFER_MEM_HOST, key, klen),
                     0);
    memset(F.dst, 0xEE, len);
    assert_int_equal(fx_read(&x, 0, 0, len), 0);
    x.sge[0].dst_mem = 22; /* (read only at post time: the op was queued with SRC_ID) */
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0); /* SRC_ID's keys are good */
    memset(F.dst, 0xEE, len);
    wreq_t y;
    memset(&y, 0, sizeof(y));
    y.sge[0].src = F.dst;
    y.sge[0].src_mr = F.dst_mr;
    y.sge[0].dst = (uintptr_t)F.src;
    y.sge[0].dst_mem = 22;
    y.sge[0].len = len;
    y.w.room_id = 78;
    y.w.sges = y.sge;
    y.w.n_sges = 1;
    y.w.cb = on_write;
    assert_int_equal(ops->read(F.pd, &y.w), 0);
    run_all();
    assert_int_equal(y.done, 1);
    assert_int_equal(y.status, BATON_ERKEY);
    assert_int_equal(F.rd.failed, 1); /* the puller's connection failed, once */
    assert_int_equal(F.rd.fail_err, BATON_ERKEY);
    assert_true(all_bytes(F.dst, 0xEE, len));
    vm_stats(&st);
    assert_true(st.wrs_failed >= 1);
    /* the failed connection takes no more reads */
    assert_int_equal(fx_read(&x, 0, 0, 4096), BATON_EPEERDOWN);
}

/* A stale connection's grant is worthless on the next one, a withdrawn region is refused, and a
 * region the holder deregistered (its export released) is not readable: the NIC refuses it. */
static void test_read_stale_and_released(void **state)
{
    (void)state;
    const size_t len = 128 * 1024;
    fx_connect();
    fx_mem(len);
    fx_announce_src();
    wreq_t x;
    assert_int_equal(fx_read(&x, 0, 0, len), 0);
    run_all();
    assert_int_equal(x.status, 0);
    /* the connection is retired (a new incarnation / generation follows): its keys went with it */
    fence_destroy(&F.pp, &F.rp);
    fence_destroy(&F.pd, &F.rd);
    fx_connect();
    memset(F.dst, 0, len);
    assert_int_equal(fx_read(&x, 0, 0, len), BATON_ERKEY); /* SRC_ID unknown on this one */
    fx_announce_src();
    assert_int_equal(ops->mem_del(F.pd, SRC_ID), 0); /* the holder withdrew it */
    assert_int_equal(fx_read(&x, 0, 0, len), BATON_ERKEY);
    fx_announce_src();
    /* the holder deregisters the region: a READ with its old rkeys fails at the NIC */
    assert_int_equal(ops->mem_dereg(F.src_mr), 0);
    F.src_mr = NULL;
    assert_int_equal(fx_read(&x, 0, 0, len), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, BATON_ERKEY);
    assert_true(all_bytes(F.dst, 0, len));
    assert_int_equal(F.rd.failed, 1);
}

/* Faults in the middle of a read: a READ completing with an error, the QP going to error, the
 * engine fencing the connection. Each ends the read exactly once with the documented error, the
 * connection's failure is told once (not for the engine's own fence) and the fence completes only
 * after the read's callback (the local pages are the caller's again). */
static void test_read_faults(void **state)
{
    (void)state;
    const size_t len = 2u << 20;
    fx_connect();
    fx_mem(len);
    fx_announce_src();
    wreq_t x;

    /* 1. the 5th READ to run completes with "retry exceeded": peer down */
    vm_fail_wr(5, IBV_WC_RETRY_EXC_ERR);
    assert_int_equal(fx_read(&x, 0, 0, len), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, BATON_EPEERDOWN);
    assert_int_equal(F.rd.failed, 1);
    assert_int_equal(F.rd.fail_err, BATON_EPEERDOWN);
    fence_destroy(&F.pd, &F.rd);
    fence_destroy(&F.pp, &F.rp);

    /* 2. a puller QP goes to error mid-read (QP_FATAL) */
    fx_connect();
    fx_announce_src();
    uint32_t dq[16];
    int n = side_qps(0, dq, 16, 1);
    assert_int_equal(n, 4);
    assert_int_equal(fx_read(&x, 0, 0, len), 0);
    vm_step(6);
    spin();
    assert_int_equal(x.done, 0);
    assert_int_equal(vm_inject_qp_fatal(dq[2]), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, BATON_EPEERDOWN);
    assert_int_equal(F.rd.failed, 1);
    for (int i = 0; i < n; i++) {
        vm_qp_info_t a;
        vm_qp_info(dq[i], &a);
        assert_true(had_state(&a, IBV_QPS_ERR)); /* every QP of the connection, not only one */
        assert_true(a.destroyed);
    }
    fence_destroy(&F.pd, &F.rd);
    fence_destroy(&F.pp, &F.rp);

    /* 3. the engine fences the puller's connection while READs are queued (an abort) */
    fx_connect();
    fx_announce_src();
    assert_int_equal(fx_read(&x, 0, 0, len), 0);
    vm_step(3);
    spin();
    assert_int_equal(ops->peer_fence(F.pd, on_fenced, &F.rd), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_true(x.status != 0);
    assert_int_equal(F.rd.fenced, 1);
    assert_int_equal(F.rd.failed, 0); /* the engine's own fence is not reported back */
    vm_stats_t st;
    vm_stats(&st);
    assert_true(st.wrs_flushed > 0); /* the queued READs flushed, none ran after the fence */
}

static void test_deregistered_target_memory(void **state)
{
    const size_t len = 128 * 1024;
    fx_connect();
    fx_mem(len);
    fx_announce();
    /* decode dropped the registration (its rkeys are dead) */
    assert_int_equal(ops->mem_dereg(F.dst_mr), 0);
    F.dst_mr = NULL;
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, BATON_ERKEY);
    assert_true(all_bytes(F.dst, 0, len));
}

static void test_qp_fatal_event(void **state)
{
    const size_t len = 1u << 20;
    fx_connect();
    fx_mem(len);
    fx_announce();
    uint32_t pq[8];
    assert_int_equal(side_qps(1, pq, 8, 1), 4);
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    for (int i = 0; i < 4; i++)
        vm_hold_qp(pq[i], 1);
    assert_int_equal(vm_inject_qp_fatal(pq[1]), 0);
    spin();
    assert_int_equal(F.rp.failed, 1);
    assert_int_equal(F.rp.fail_err, BATON_EPEERDOWN);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, BATON_EPEERDOWN);
    for (int i = 0; i < 4; i++) {
        vm_qp_info_t a;
        vm_qp_info(pq[i], &a);
        assert_true(had_state(&a, IBV_QPS_ERR));
        assert_true(a.destroyed);
    }
    assert_int_equal(vm_bytes_landed_in(F.dst, len), 0);
}

static void test_port_error_disconnects_all(void **state)
{
    fx_connect();
    /* a second connection to another decode peer, over the same devices */
    uint8_t bd[BATON__TP_BLOB_MAX], bp[BATON__TP_BLOB_MAX];
    peer_rec_t r2d = {0}, r2p = {0};
    baton__tp_peer_t *pd2, *pp2;
    assert_int_equal(ops->peer_create(F.dec, BATON__TP_ROLE_TARGET, 500, &pd2), 0);
    pd2->ctx = &r2d;
    size_t ld = blob_of(pd2, bd);
    assert_int_equal(ops->peer_create(F.pre, BATON__TP_ROLE_INITIATOR, 501, &pp2), 0);
    pp2->ctx = &r2p;
    assert_int_equal(ops->peer_connect(pp2, bd, ld, on_connected, &r2p), 0);
    size_t lp = blob_of(pp2, bp);
    assert_int_equal(ops->peer_connect(pd2, bp, lp, on_connected, &r2d), 0);
    spin();

    assert_true(vm_inject_port_err(0) > 0); /* prefill's first NIC */
    spin();
    assert_int_equal(F.rp.failed, 1);
    assert_int_equal(r2p.failed, 1);
    assert_int_equal(F.rd.failed, 0);
    /* new connections avoid the NIC whose port is down */
    fence_destroy(&pp2, &r2p);
    fence_destroy(&pd2, &r2d);
    fence_destroy(&F.pp, &F.rp);
    fence_destroy(&F.pd, &F.rd);
    fx_connect();
    uint32_t pq[8];
    int np = side_qps(1, pq, 8, 1);
    assert_int_equal(np, 4);
    for (int i = 0; i < np; i++) {
        vm_qp_info_t a;
        vm_qp_info(pq[i], &a);
        assert_int_equal(a.dev, 1);
    }
}

static void test_outstanding_bounded_by_max_wr(void **state)
{
    base_setup();
    tun.max_wr = 8;
    tun.signal_every = 4;
    tun.post_batch = 4;
    F.cfg.slice_size = 4096;
    fx_start(2, 2, IBV_MTU_4096, IBV_MTU_4096, 0, 0);
    const size_t len = 1u << 20; /* 256 slices */
    fx_connect();
    fx_mem(len);
    fx_announce();
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    vm_stats_t st;
    vm_stats(&st);
    assert_true(st.wrs_posted <= 4 * 8); /* the queues filled, the rest waits */
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
    vm_stats(&st);
    assert_int_equal(st.wrs_posted, 256);
    assert_true(st.max_outstanding <= 8);
    assert_int_equal(st.post_rejected, 0);
    assert_true(st.cqes >= 256 / 4 && st.cqes < 256);
}

static void test_reg_mr_failure_rolls_back(void **state)
{
    base_setup();
    fx_start(2, 2, IBV_MTU_4096, IBV_MTU_4096, 96 * 1024, 0);
    size_t len = 1u << 20;
    F.src = aligned_alloc(4096, len);
    assert_non_null(F.src);
    int before = vm_live_objects();
    baton__tp_mem_params_t mp = {
        .addr = F.src, .len = len, .kind = BATON_XFER_MEM_HOST, .memfd = -1};
    vm_fail_op(VM_OP_REG_MR, 14, ENOMEM); /* on the second device */
    baton__tp_mr_t *mr = NULL;
    assert_int_equal(ops->mem_reg(F.pre, &mp, &mr), BATON_ENOMEM);
    assert_null(mr);
    assert_int_equal(vm_live_objects(), before);
    assert_int_equal(ops->mem_reg(F.pre, &mp, &F.src_mr), 0);
    assert_int_equal(vm_live_objects(), before + 22);
    /* bad arguments, and CUDA memory in a build without CUDA */
    mp.len = 0;
    assert_int_equal(ops->mem_reg(F.pre, &mp, &mr), BATON_EINVAL);
#ifndef BATON_HAVE_CUDA
    mp.len = len;
    mp.kind = BATON_XFER_MEM_CUDA;
    assert_int_equal(ops->mem_reg(F.pre, &mp, &mr), BATON_ENOTSUP);
#endif
}

static void test_post_failure_mid_chain(void **state)
{
    const size_t len = 1u << 20;
    fx_connect();
    fx_mem(len);
    fx_announce();
    vm_fail_op(VM_OP_POST_SEND, 3, ENOMEM); /* the 3rd WR of the first chain is refused */
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    assert_int_equal(x.done, 0); /* never inside write() */
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, BATON_ENOMEM);
    assert_int_equal(F.rp.failed, 1);
    uint32_t pq[8];
    assert_int_equal(side_qps(1, pq, 8, 1), 0); /* drained (a marker closed the chain) */
}

static wreq_t *flush_watch;
static int flush_calls, flush_saw_done;

static void flush_cb(baton__tp_peer_t *peer, int status, void *arg)
{
    flush_calls++;
    flush_saw_done = flush_watch ? flush_watch->done : -1;
}

static void test_flush_waits_for_writes(void **state)
{
    const size_t len = 512 * 1024;
    fx_connect();
    fx_mem(len);
    fx_announce();
    flush_watch = NULL;
    flush_calls = 0;
    assert_int_equal(ops->flush(F.pp, flush_cb, NULL), 0);
    assert_int_equal(flush_calls, 0); /* never inside the call */
    spin();
    assert_int_equal(flush_calls, 1); /* nothing was in flight */
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    flush_watch = &x;
    assert_int_equal(ops->flush(F.pp, flush_cb, NULL), 0);
    spin();
    assert_int_equal(flush_calls, 1);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(flush_calls, 2);
    assert_int_equal(flush_saw_done, 1); /* the write's callback came first */
}

static void test_device_fatal(void **state)
{
    const size_t len = 512 * 1024;
    fx_connect();
    fx_mem(len);
    fx_announce();
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    assert_true(vm_inject_device_fatal(2) > 0); /* a decode NIC */
    run_all();
    assert_int_equal(F.rd.failed, 1);
    assert_int_equal(x.done, 1); /* completes either way, exactly once */
    /* the dead device is not used for new connections */
    fence_destroy(&F.pp, &F.rp);
    fence_destroy(&F.pd, &F.rd);
    fx_connect();
    uint32_t dq[8];
    int nd = side_qps(0, dq, 8, 1);
    assert_int_equal(nd, 2);
    for (int i = 0; i < nd; i++) {
        vm_qp_info_t a;
        vm_qp_info(dq[i], &a);
        assert_int_equal(a.dev, 3);
    }
}

static void test_queue_depth_used_by_large_write(void **state)
{
    base_setup();
    F.cfg.slice_size = 16 * 1024;
    fx_start(2, 2, IBV_MTU_4096, IBV_MTU_4096, 0, 0);
    const size_t len = 8u << 20; /* 512 slices, 128 per QP: deeper than one post batch */
    fx_connect();
    fx_mem(len);
    fx_announce();
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    assert_int_equal(vm_queued(), 512);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
}

static void test_cq_budget_shared_by_peers(void **state)
{
    base_setup();
    tun.cq_size = 64; /* room for 48 WRs per device, two peers compete */
    F.cfg.slice_size = 4096;
    fx_start(2, 2, IBV_MTU_4096, IBV_MTU_4096, 0, 0);
    const size_t len = 1u << 20; /* 256 slices per peer */
    fx_connect();
    fx_mem(len);
    fx_announce();
    /* a second connection writing into the same decode region */
    uint8_t bd[BATON__TP_BLOB_MAX], bp[BATON__TP_BLOB_MAX], key[BATON__TP_BLOB_MAX];
    peer_rec_t r2d = {0}, r2p = {0};
    baton__tp_peer_t *pd2, *pp2;
    assert_int_equal(ops->peer_create(F.dec, BATON__TP_ROLE_TARGET, 600, &pd2), 0);
    pd2->ctx = &r2d;
    size_t ld = blob_of(pd2, bd);
    assert_int_equal(ops->peer_create(F.pre, BATON__TP_ROLE_INITIATOR, 601, &pp2), 0);
    pp2->ctx = &r2p;
    assert_int_equal(ops->peer_connect(pp2, bd, ld, on_connected, &r2p), 0);
    size_t lp = blob_of(pp2, bp);
    assert_int_equal(ops->peer_connect(pd2, bp, lp, on_connected, &r2d), 0);
    spin();
    size_t klen = 0;
    assert_int_equal(ops->mem_key(F.dst_mr, key, sizeof(key), &klen), 0);
    assert_int_equal(
        ops->mem_add(pp2, MEM_ID, (uintptr_t)F.dst, F.size, BATON_XFER_MEM_HOST, key, klen), 0);

    wreq_t a, b;
    assert_int_equal(fx_write(&a, 0, 0, len), 0);
    memset(&b, 0, sizeof(b));
    b.sge[0] = a.sge[0];
    b.w.room_id = 77;
    b.w.sges = b.sge;
    b.w.n_sges = 1;
    b.w.cb = on_write;
    assert_int_equal(ops->write(pp2, &b.w), 0);
    assert_true(vm_queued() <= 2 * 48); /* the CQs' room, not the QPs', is the limit */
    run_all();
    assert_int_equal(a.done, 1);
    assert_int_equal(a.status, 0);
    assert_int_equal(b.done, 1); /* the starved peer was pumped when room came back */
    assert_int_equal(b.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
    vm_stats_t st;
    vm_stats(&st);
    assert_int_equal(st.cq_overflows, 0);
    assert_int_equal(st.wrs_posted, 512);
    fence_destroy(&pp2, &r2p);
    fence_destroy(&pd2, &r2d);
}

/* ---- real-fabric behaviour ------------------------------------------------------ */

/* Every live QP of one side: its sgid index, and whether a write through each pair lands. */
static void assert_sgid(int prefill, int dev, int want)
{
    uint32_t q[64];
    int n = side_qps(prefill, q, 64, 1), seen = 0;
    for (int i = 0; i < n; i++) {
        vm_qp_info_t a;
        vm_qp_info(q[i], &a);
        if (dev >= 0 && a.dev != dev)
            continue;
        assert_int_equal(a.is_global, 1);
        assert_int_equal(a.sgid_index, want);
        seen++;
    }
    assert_true(seen > 0);
}

static void test_gid_v2_ipv4_chosen_and_override(void **state)
{
    /* defaults: every NIC in its own subnet (a routed fabric), ConnectX tables where index 0
     * is the v1 link-local entry; index 3 (v2, IPv4-mapped, netdev) must be used on both sides */
    fx_connect();
    assert_sgid(1, -1, 3);
    assert_sgid(0, -1, 3);
    const size_t len = 256 * 1024;
    fx_mem(len);
    fx_announce();
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
    fence_destroy(&F.pp, &F.rp);
    fence_destroy(&F.pd, &F.rd);
    assert_int_equal(ops->mem_dereg(F.src_mr), 0);
    F.src_mr = NULL;
    ops->fini(F.pre);
    spin();

    /* a per-device override: vm_0 pinned to index 2 (v1), vm_1 left to the choice */
    F.cfg.rdma_devices = "vm_0:2, vm_1";
    vm_set_visible(0, 2);
    assert_int_equal(tp_init(&F.env_pre, &F.pre), 0);
    vm_set_visible(0, -1);
    rdma_tp_t *tp = container_of(F.pre, rdma_tp_t, base);
    assert_int_equal(tp->ndevs, 2);
    assert_int_equal(tp->devs[0].gid_index, 2);
    assert_int_equal(tp->devs[0].gid_type, BATON__RDMA_GID_ROCE_V1);
    assert_int_equal(tp->devs[1].gid_index, 3);
    F.cfg.rdma_devices = NULL;
    /* the handshake carries link layer and GID type: a v1 NIC cannot reach v2 peers, so every
     * pair goes through vm_1 */
    fx_connect();
    assert_sgid(1, 1, 3);
    uint32_t q[16];
    int n = side_qps(1, q, 16, 1);
    assert_int_equal(n, 4);
    for (int i = 0; i < n; i++) {
        vm_qp_info_t a;
        vm_qp_info(q[i], &a);
        assert_int_equal(a.dev, 1);
    }
    baton__tp_mem_params_t mp = {
        .addr = F.src, .len = len, .kind = BATON_XFER_MEM_HOST, .memfd = -1};
    assert_int_equal(ops->mem_reg(F.pre, &mp, &F.src_mr), 0);
    fx_announce();
    memset(F.dst, 0, len);
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
}

/* A RoCE port that lists only v1 entries: v1 is never chosen automatically (it would fail the
 * first WRITE across a router), so the port is skipped; pinning a v1 index uses it. */
static void test_gid_v1_only_needs_a_pin(void **state)
{
    base_setup();
    vm_dev_cfg_t c;
    vm_dev_cfg_default(&c, 0);
    c.roce_v1_only = 1;
    assert_int_equal(vm_add_device(&c), 0);
    add_devs(1, 1, IBV_MTU_4096, 0);
    vm_set_visible(0, 2);
    assert_int_equal(tp_init(&F.env_pre, &F.pre), 0);
    rdma_tp_t *tp = container_of(F.pre, rdma_tp_t, base);
    assert_int_equal(tp->ndevs, 1); /* vm_0 skipped, vm_1 (v2) kept */
    assert_string_equal(tp->devs[0].name, "vm_1");
    assert_int_equal(tp->devs[0].gid_index, 3);
    ops->fini(F.pre);
    spin();
    F.pre = NULL;

    vm_set_visible(0, 1); /* only the v1 NIC: nothing usable unless pinned */
    assert_int_not_equal(tp_init(&F.env_pre, &F.pre), 0);
    F.pre = NULL;
    F.cfg.rdma_devices = "vm_0:2";
    assert_int_equal(tp_init(&F.env_pre, &F.pre), 0);
    tp = container_of(F.pre, rdma_tp_t, base);
    assert_int_equal(tp->ndevs, 1);
    assert_int_equal(tp->devs[0].gid_index, 2);
    assert_int_equal(tp->devs[0].gid_type, BATON__RDMA_GID_ROCE_V1);
    F.cfg.rdma_devices = NULL;
    vm_set_visible(0, -1);
}

/* Both sides pinned to v1 (layer 2 only) across subnets: the model fails the pairs the way a
 * routed fabric does, and the connection goes down instead of hanging. */
static void test_gid_v1_across_subnets_fails(void **state)
{
    base_setup();
    add_devs(0, 4, IBV_MTU_4096, 0);
    F.npre = F.ndec = 2;
    F.cfg.rdma_devices = "vm_0:0,vm_1:0";
    vm_set_visible(0, 2);
    assert_int_equal(tp_init(&F.env_pre, &F.pre), 0);
    F.cfg.rdma_devices = "vm_2:0,vm_3:0";
    vm_set_visible(2, 2);
    assert_int_equal(tp_init(&F.env_dec, &F.dec), 0);
    vm_set_visible(0, -1);
    F.cfg.rdma_devices = NULL;
    fx_connect();
    assert_sgid(1, -1, 0);
    assert_sgid(0, -1, 0);
    const size_t len = 64 * 1024;
    fx_mem(len);
    fx_announce();
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, BATON_EPEERDOWN);
    assert_int_equal(F.rp.failed, 1);
    assert_int_equal(vm_bytes_landed_in(F.dst, len), 0);
}

static void test_pairing_by_link_layer(void **state)
{
    /* prefill: an InfiniBand NIC and a RoCE NIC; decode: RoCE only. Every pair must use the
     * RoCE NIC (the old i % L pairing put half of them on InfiniBand). */
    base_setup();
    vm_dev_cfg_t c;
    vm_dev_cfg_default(&c, 0);
    c.link_layer = IBV_LINK_LAYER_INFINIBAND;
    assert_int_equal(vm_add_device(&c), 0);
    add_devs(1, 3, IBV_MTU_4096, 0);
    F.npre = F.ndec = 2;
    init_sides(2, 2);
    fx_connect();
    uint32_t q[16];
    int n = side_qps(1, q, 16, 1);
    assert_int_equal(n, 4);
    for (int i = 0; i < n; i++) {
        vm_qp_info_t a;
        vm_qp_info(q[i], &a);
        assert_int_equal(a.dev, 1);
    }
    const size_t len = 256 * 1024;
    fx_mem(len);
    fx_announce();
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    run_all();
    assert_int_equal(x.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
}

static void test_infiniband_routes_by_lid(void **state)
{
    base_setup();
    for (int i = 0; i < 4; i++) {
        vm_dev_cfg_t c;
        vm_dev_cfg_default(&c, i);
        c.link_layer = IBV_LINK_LAYER_INFINIBAND;
        c.subnet = 0; /* one IB subnet: LIDs reach */
        assert_int_equal(vm_add_device(&c), i);
    }
    F.npre = F.ndec = 2;
    init_sides(2, 2);
    fx_connect();
    uint32_t q[16];
    int n = side_qps(1, q, 16, 1);
    assert_int_equal(n, 4);
    for (int i = 0; i < n; i++) {
        vm_qp_info_t a, b;
        vm_qp_info(q[i], &a);
        vm_qp_info(a.dest_qpn, &b);
        assert_int_equal(a.is_global, 0);
        vm_dev_cfg_t pc;
        vm_dev_cfg_default(&pc, b.dev);
        assert_int_equal(a.dlid, pc.lid);
    }
    const size_t len = 256 * 1024;
    fx_mem(len);
    fx_announce();
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    run_all();
    assert_int_equal(x.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
}

/* Does the VMA holding p carry MADV_HUGEPAGE ("hg" in smaps' VmFlags)? -1: cannot tell. */
static int vma_hugepage_advised(const void *p)
{
    FILE *fp = fopen("/proc/self/smaps", "r");
    if (!fp)
        return -1;
    char line[512];
    int in = 0, found = -1;
    while (fgets(line, sizeof(line), fp)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            continue;
        }
        if (in && strncmp(line, "VmFlags:", 8) == 0) {
            found = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(fp);
    return found;
}

static void test_hugepages_advised_for_large_pools(void **state)
{
    base_setup();
    F.cfg.rdma_hugepages = 1;
    fx_start(1, 1, IBV_MTU_4096, IBV_MTU_4096, 0, 0);
    /* can this kernel take the advice at all? */
    void *probe = mmap(NULL, 4u << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(probe != MAP_FAILED);
    int thp = madvise(probe, 4u << 20, MADV_HUGEPAGE) == 0;
    munmap(probe, 4u << 20);
    if (!thp) {
        print_message("SKIP: this kernel has no transparent huge pages (madvise EINVAL)\n");
        skip();
    }
    const size_t len = 8u << 20;
    uint8_t *pool = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *small =
        mmap(NULL, 1u << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(pool != MAP_FAILED && small != MAP_FAILED);
    uint8_t *mid = (uint8_t *)(((uintptr_t)pool + (4u << 20)) & ~(uintptr_t)((2u << 20) - 1));
    assert_int_equal(vma_hugepage_advised(mid), 0);
    baton__tp_mem_params_t mp = {
        .addr = pool, .len = len, .kind = BATON_XFER_MEM_HOST, .memfd = -1};
    baton__tp_mr_t *mr, *mr2;
    assert_int_equal(ops->mem_reg(F.pre, &mp, &mr), 0);
    assert_int_equal(vma_hugepage_advised(mid), 1);
    mp.addr = small; /* under 2 MiB: left alone */
    mp.len = 1u << 20;
    assert_int_equal(ops->mem_reg(F.pre, &mp, &mr2), 0);
    assert_int_equal(vma_hugepage_advised(small), 0);
    assert_int_equal(ops->mem_dereg(mr), 0);
    assert_int_equal(ops->mem_dereg(mr2), 0);
    munmap(pool, len);
    munmap(small, 1u << 20);
}

static void test_qos_and_fork_init(void **state)
{
    base_setup();
    F.cfg.rdma_traffic_class = 106;
    F.cfg.rdma_service_level = 3;
    F.cfg.rdma_fork_init = 1;
    fx_start(1, 1, IBV_MTU_4096, IBV_MTU_4096, 0, 0);
    assert_int_equal(vm_fork_inits(), 2); /* one call per transport, before any device */
    fx_connect();
    uint32_t q[8];
    int n = side_qps(1, q, 8, 1);
    assert_int_equal(n, 2);
    for (int i = 0; i < n; i++) {
        vm_qp_info_t a;
        vm_qp_info(q[i], &a);
        assert_int_equal(a.traffic_class, 106);
        assert_int_equal(a.sl, 3);
    }
}

static void test_limits_clamped(void **state)
{
    base_setup();
    tun.max_wr = 200; /* the model rounds it to 256 and writes that back */
    F.cfg.slice_size = 64 * 1024;
    for (int i = 0; i < 4; i++) {
        vm_dev_cfg_t c;
        vm_dev_cfg_default(&c, i);
        c.max_sge = 2;            /* below the 4 asked for */
        c.max_inline = 0;         /* no inline data at all */
        c.max_msg_sz = 16 * 1024; /* smaller than a slice */
        assert_int_equal(vm_add_device(&c), i);
    }
    F.npre = F.ndec = 2;
    init_sides(2, 2);
    fx_connect();
    uint32_t q[8];
    int n = side_qps(1, q, 8, 1);
    assert_int_equal(n, 4);
    for (int i = 0; i < n; i++) {
        vm_qp_info_t a;
        vm_qp_info(q[i], &a);
        assert_int_equal(a.cap.max_send_sge, 2);
        assert_int_equal(a.cap.max_inline_data, 0);
        assert_int_equal(a.cap.max_send_wr, 256);
    }
    const size_t len = 8u << 20;
    fx_mem(len);
    fx_announce();
    wreq_t x, y;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    assert_int_equal(fx_write(&y, 0, 0, 40), 0); /* short enough to go inline elsewhere */
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    assert_int_equal(y.done, 1);
    assert_int_equal(y.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
    vm_stats_t st;
    vm_stats(&st);
    assert_true(st.max_wr_bytes <= 16 * 1024);
    assert_true(st.max_outstanding <= 200); /* what we asked for, not what was granted */
    assert_int_equal(st.post_rejected, 0);
}

/* Work outstanding on the initiator's NIC when it dies: every write fails with peer-down, the
 * fence fires and every object is released (teardown checks the baseline). */
static void nic_dies_with_work(int how)
{
    const size_t len = 1u << 20;
    fx_connect();
    fx_mem(len);
    fx_announce();
    uint32_t pq[8];
    assert_int_equal(side_qps(1, pq, 8, 1), 4);
    wreq_t x, y;
    for (int i = 0; i < 4; i++)
        vm_hold_qp(pq[i], 1);
    assert_int_equal(fx_write(&x, 0, 0, len / 2), 0);
    assert_int_equal(fx_write(&y, len / 2, len / 2, len / 2), 0);
    assert_true(vm_queued() > 0);
    if (how == 0)
        assert_true(vm_inject_device_fatal(0) > 0);
    else
        assert_true(vm_inject_cq_err(0) > 0);
    for (int i = 0; i < 4; i++)
        vm_hold_qp(pq[i], 0);
    run_all(); /* bounded */
    assert_int_equal(x.done, 1);
    assert_int_equal(y.done, 1);
    assert_int_equal(x.status, BATON_EPEERDOWN);
    assert_int_equal(y.status, BATON_EPEERDOWN);
    assert_int_equal(F.rp.failed, 1);
    assert_int_equal(F.rp.fail_err, BATON_EPEERDOWN);
    assert_int_equal(ops->peer_fence(F.pp, on_fenced, &F.rp), 0);
    run_all();
    assert_int_equal(F.rp.fenced, 1);
    assert_int_equal(side_qps(1, pq, 8, 1), 0);
    /* the dead NIC is never used again; the other one still is */
    fence_destroy(&F.pp, &F.rp);
    fence_destroy(&F.pd, &F.rd);
    fx_connect();
    int n = side_qps(1, pq, 8, 1);
    assert_int_equal(n, 4);
    for (int i = 0; i < n; i++) {
        vm_qp_info_t a;
        vm_qp_info(pq[i], &a);
        assert_int_equal(a.dev, 1);
    }
}

static void test_initiator_nic_fatal_with_work(void **state)
{
    nic_dies_with_work(0);
}

static void test_initiator_cq_error_with_work(void **state)
{
    nic_dies_with_work(1);
}

static void test_drain_watchdog_bounds_a_silent_nic(void **state)
{
    base_setup();
    F.cfg.rdma_drain_timeout_ms = 20;
    tun.drain_check_ms = 5;
    fx_start(2, 2, IBV_MTU_4096, IBV_MTU_4096, 0, 0);
    const size_t len = 1u << 20;
    fx_connect();
    fx_mem(len);
    fx_announce();
    uint32_t pq[8];
    assert_int_equal(side_qps(1, pq, 8, 1), 4);
    for (int i = 0; i < 4; i++)
        vm_hold_qp(pq[i], 1);
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    /* both of the initiator's NICs stop completing and say nothing; the engine gives up on
     * the peer. (With one NIC still healthy, its flush must be polled within the 20 ms bound,
     * which a loaded machine does not promise: its QPs would be abandoned too.) */
    assert_int_equal(vm_set_device_fatal(0, 0), 0);
    assert_int_equal(vm_set_device_fatal(1, 0), 0);
    assert_int_equal(ops->peer_fence(F.pp, on_fenced, &F.rp), 0);
    for (int i = 0; i < 4; i++)
        vm_hold_qp(pq[i], 0);
    /* bounded (at most ~20 s of 1 ms naps); no assertion on how long it took */
    for (int i = 0; i < 20000 && !F.rp.fenced; i++) {
        vm_run();
        run_deferred();
        uv_run(&F.loop, UV_RUN_NOWAIT);
        if (!F.rp.fenced)
            usleep(1000);
    }
    assert_int_equal(F.rp.fenced, 1);
    assert_int_equal(x.done, 1);
    assert_true(x.status < 0);
    assert_int_equal(side_qps(1, pq, 8, 1), 0);
}

static void test_unused_port_flap_keeps_peers(void **state)
{
    base_setup();
    for (int i = 0; i < 4; i++) {
        vm_dev_cfg_t c;
        vm_dev_cfg_default(&c, i);
        c.nports = 2;
        c.port2_state = IBV_PORT_DOWN; /* cabled on port 1 only */
        assert_int_equal(vm_add_device(&c), i);
    }
    F.npre = F.ndec = 2;
    init_sides(2, 2);
    assert_int_equal(container_of(F.pre, rdma_tp_t, base)->ndevs, 2);
    fx_connect();
    const size_t len = 512 * 1024;
    fx_mem(len);
    fx_announce();
    assert_true(vm_inject_port_event(0, 2, IBV_EVENT_PORT_ERR) > 0);
    assert_true(vm_inject_port_event(2, 2, IBV_EVENT_PORT_ERR) > 0);
    spin();
    assert_true(vm_inject_port_event(0, 2, IBV_EVENT_PORT_ACTIVE) > 0);
    spin();
    assert_int_equal(F.rp.failed, 0);
    assert_int_equal(F.rd.failed, 0);
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
    /* the port in use going down still takes its peers down */
    assert_true(vm_inject_port_event(0, 1, IBV_EVENT_PORT_ERR) > 0);
    spin();
    assert_int_equal(F.rp.failed, 1);
}

static void test_both_ports_used(void **state)
{
    base_setup();
    for (int i = 0; i < 2; i++) {
        vm_dev_cfg_t c;
        vm_dev_cfg_default(&c, i);
        c.nports = 2;
        assert_int_equal(vm_add_device(&c), i);
    }
    F.npre = F.ndec = 1;
    vm_set_visible(0, 1);
    assert_int_equal(tp_init(&F.env_pre, &F.pre), 0);
    vm_set_visible(1, 1);
    assert_int_equal(tp_init(&F.env_dec, &F.dec), 0);
    vm_set_visible(0, -1);
    assert_int_equal(container_of(F.pre, rdma_tp_t, base)->ndevs, 2);
    fx_connect();
    uint32_t q[16];
    int n = side_qps(1, q, 16, 1), port[3] = {0};
    assert_int_equal(n, 4);
    for (int i = 0; i < n; i++) {
        vm_qp_info_t a;
        vm_qp_info(q[i], &a);
        port[a.port_num]++;
    }
    assert_int_equal(port[1], 2);
    assert_int_equal(port[2], 2);
    const size_t len = 1u << 20;
    fx_mem(len);
    fx_announce();
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    run_all();
    assert_int_equal(x.status, 0);
    assert_true(bytes_equal(F.dst, F.src, len));
}

static void test_gid_change_refreshes_address(void **state)
{
    fx_connect();
    fence_destroy(&F.pp, &F.rp);
    fence_destroy(&F.pd, &F.rd);
    /* decode NIC vm_2 gets a new address */
    const uint8_t ip[4] = {10, 9, 9, 9};
    vm_set_port_ipv4(2, 1, ip);
    assert_true(vm_inject_port_event(2, 1, IBV_EVENT_GID_CHANGE) > 0);
    spin();
    fx_connect();
    const size_t len = 256 * 1024;
    fx_mem(len);
    fx_announce();
    wreq_t x;
    assert_int_equal(fx_write(&x, 0, 0, len), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0); /* the prefill side addressed the new GID */
    assert_true(bytes_equal(F.dst, F.src, len));
}

/* Two transports (two engines) creating QPs from two threads at once: each draws its PSNs
 * from its own generator and nothing process-wide is shared. */
typedef struct {
    baton__tp_t *tp;
    uint64_t gen;
    uint32_t psn[64];
    int n;
    int err;
} creator_t;

static void *create_many(void *arg)
{
    creator_t *c = arg;
    for (int i = 0; i < 16 && !c->err; i++) {
        baton__tp_peer_t *p = NULL;
        c->err = ops->peer_create(c->tp, BATON__TP_ROLE_TARGET, c->gen + (uint64_t)i, &p);
        if (c->err)
            break;
        rdma_peer_t *rp = container_of(p, rdma_peer_t, base);
        for (int k = 0; k < rp->nqps && c->n < 64; k++)
            c->psn[c->n++] = rp->qps[k].psn;
        ops->peer_destroy(p);
    }
    return NULL;
}

static void test_two_engines_create_qps_concurrently(void **state)
{
    creator_t a = {.tp = F.pre, .gen = 1000}, b = {.tp = F.dec, .gen = 2000};
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, create_many, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, create_many, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a.err, 0);
    assert_int_equal(b.err, 0);
    assert_int_equal(a.n, 64);
    assert_int_equal(b.n, 64);
    vm_stats_t st;
    vm_stats(&st);
    assert_int_equal(st.qps_created, 2 * 16 * 4);
    assert_int_equal(st.qps_destroyed, 2 * 16 * 4);
    int same = 0;
    for (int i = 0; i < 64; i++) {
        assert_true(a.psn[i] <= 0xffffff && b.psn[i] <= 0xffffff);
        same += a.psn[i] == b.psn[i];
    }
    assert_true(same < 4); /* two generators, not one shared sequence */
    uint32_t q[256];
    assert_int_equal(side_qps(1, q, 256, 1) + side_qps(0, q, 256, 1), 0);
}

#ifdef BATON_HAVE_CUDA
/* ---- CUDA memory through a fake driver over the model's device memory ------------------- */

static struct {
    int inited;
    int ordering; /* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING */
    int no_dmabuf;
    int binds; /* contexts made current */
} FC;
static __thread CUcontext fc_current;

static CUresult fc_init(unsigned int flags)
{
    FC.inited = 1;
    return CUDA_SUCCESS;
}
static CUresult fc_device_get(CUdevice *d, int ordinal)
{
    *d = ordinal;
    return FC.inited ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}
static CUresult fc_primary_ctx_retain(CUcontext *c, CUdevice d)
{
    *c = (CUcontext)(uintptr_t)(0x1000 + d);
    return CUDA_SUCCESS;
}
static CUresult fc_ctx_set_current(CUcontext c)
{
    fc_current = c;
    FC.binds++;
    return CUDA_SUCCESS;
}
static CUresult fc_ctx_get_current(CUcontext *c)
{
    *c = fc_current;
    return FC.inited ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}
static CUresult fc_pointer_get_attribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
    void *base;
    size_t size;
    if (!FC.inited)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (a != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL ||
        !vm_devmem_range((void *)(uintptr_t)p, &base, &size))
        return CUDA_ERROR_INVALID_VALUE;
    *(int *)data = 0;
    return CUDA_SUCCESS;
}
static CUresult fc_pci_bus_id(char *buf, int len, CUdevice d)
{
    snprintf(buf, (size_t)len, "0000:02:00.0");
    return CUDA_SUCCESS;
}
static CUresult fc_device_get_attribute(int *v, CUdevice_attribute a, CUdevice d)
{
    if (a != CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING)
        return CUDA_ERROR_INVALID_VALUE;
    *v = FC.ordering;
    return CUDA_SUCCESS;
}
/* like the driver: needs a current context on the calling thread */
static CUresult fc_mem_get_address_range(CUdeviceptr *b, size_t *s, CUdeviceptr p)
{
    void *base;
    if (!fc_current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!vm_devmem_range((void *)(uintptr_t)p, &base, s))
        return CUDA_ERROR_NOT_FOUND;
    *b = (CUdeviceptr)(uintptr_t)base;
    return CUDA_SUCCESS;
}
static CUresult fc_get_handle(void *h, CUdeviceptr p, size_t size, CUmemRangeHandleType t,
                              unsigned long long flags)
{
    if (!fc_current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (FC.no_dmabuf)
        return CUDA_ERROR_NOT_SUPPORTED;
    int fd = vm_devmem_export((void *)(uintptr_t)p, size); /* -1 past the allocation */
    if (fd < 0)
        return CUDA_ERROR_INVALID_VALUE;
    *(int *)h = fd;
    return CUDA_SUCCESS;
}

static void cuda_fake_install(void)
{
    static int done;
    if (done)
        return;
    baton__cuda_t t;
    memset(&t, 0, sizeof(t));
    t.init = fc_init;
    t.device_get = fc_device_get;
    t.primary_ctx_retain = fc_primary_ctx_retain;
    t.ctx_set_current = fc_ctx_set_current;
    t.ctx_get_current = fc_ctx_get_current;
    t.pointer_get_attribute = fc_pointer_get_attribute;
    t.device_get_attribute = fc_device_get_attribute;
    t.device_get_pci_bus_id = fc_pci_bus_id;
    t.mem_get_address_range = fc_mem_get_address_range;
    t.mem_get_handle_for_address_range = fc_get_handle;
    baton__cuda_install(&t);
    done = 1;
}

typedef struct {
    baton__tp_t *tp;
    baton__tp_mem_params_t mp;
    baton__tp_mr_t *mr;
    int err;
} reg_job_t;

static void *reg_thread(void *arg)
{
    reg_job_t *j = arg;
    j->err = ops->mem_reg(j->tp, &j->mp, &j->mr);
    return NULL;
}

/* Registers on a fresh thread (no current context there) as a caller thread would. */
static int reg_on_thread(baton__tp_t *tp, void *addr, size_t len, baton__tp_mr_t **mr_p)
{
    reg_job_t j = {.tp = tp};
    j.mp.addr = addr;
    j.mp.len = len;
    j.mp.kind = BATON_XFER_MEM_CUDA;
    j.mp.memfd = -1;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reg_thread, &j), 0);
    pthread_join(t, NULL);
    *mr_p = j.mr;
    return j.err;
}

static int unflushed_at_done = -1;

static void on_write_gpu(baton__tp_write_t *w, int status)
{
    unflushed_at_done = vm_devmem_unflushed(); /* what DONE would certify */
    on_write(w, status);
}

/* One GPU-to-GPU write of len bytes; returns the reads the model ran. */
static uint64_t gpu_write(size_t len, int ordering)
{
    FC.ordering = ordering;
    uint8_t *src = vm_devmem_alloc(len), *dst = vm_devmem_alloc(len);
    assert_non_null(src);
    assert_non_null(dst);
    uint8_t *pattern = malloc(len), *back = malloc(len);
    for (size_t i = 0; i < len; i++)
        pattern[i] = (uint8_t)(i * 7 + 3);
    vm_devmem_write(src, pattern, len);
    baton__tp_mr_t *smr, *dmr;
    assert_int_equal(reg_on_thread(F.pre, src, len, &smr), 0);
    assert_int_equal(reg_on_thread(F.dec, dst, len, &dmr), 0);
    uint8_t key[BATON__TP_BLOB_MAX];
    size_t klen = 0;
    assert_int_equal(ops->mem_key(dmr, key, sizeof(key), &klen), 0);
    static uint32_t mem_id = 100;
    mem_id++;
    assert_int_equal(
        ops->mem_add(F.pp, mem_id, (uintptr_t)dst, len, BATON_XFER_MEM_CUDA, key, klen), 0);
    vm_stats_t before, after;
    vm_stats(&before);
    wreq_t x;
    memset(&x, 0, sizeof(x));
    x.sge[0].src = src;
    x.sge[0].src_mr = smr;
    x.sge[0].dst = (uintptr_t)dst;
    x.sge[0].dst_mem = mem_id;
    x.sge[0].len = len;
    x.w.room_id = 9;
    x.w.sges = x.sge;
    x.w.n_sges = 1;
    x.w.cb = on_write_gpu;
    unflushed_at_done = -1;
    assert_int_equal(ops->write(F.pp, &x.w), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    vm_devmem_read(back, dst, len);
    assert_memory_equal(back, pattern, len);
    vm_stats(&after);
    assert_int_equal(ops->mem_del(F.pp, mem_id), 0);
    assert_int_equal(ops->mem_dereg(smr), 0);
    assert_int_equal(ops->mem_dereg(dmr), 0);
    vm_devmem_free(src);
    vm_devmem_free(dst);
    free(pattern);
    free(back);
    return after.reads_run - before.reads_run;
}

static void test_gpu_pages_no_inline_no_cpu_flush_before_done(void **state)
{
    cuda_fake_install();
    memset(&FC, 0, sizeof(FC));
    FC.inited = 1;
    fx_connect();
    /* 48 B: shorter than the inline limit; 64 KiB + 32 B: a full slice and a 32 B tail. A CPU
     * touch of the PROT_NONE source (an inline post) would crash here. */
    const size_t sizes[2] = {48, 64 * 1024 + 32};
    for (int i = 0; i < 2; i++) {
        uint64_t reads = gpu_write(sizes[i], CU_GPU_DIRECT_RDMA_WRITES_ORDERING_NONE);
        assert_int_equal(unflushed_at_done, 0); /* read back before the write counted done */
        assert_true(reads >= 1);
    }
    /* a GPU that orders GPUDirect writes itself needs no read-back */
    uint64_t reads = gpu_write(4096, CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER);
    assert_int_equal(reads, 0);
    assert_true(FC.binds >= 2); /* each registering thread got a current context */
}

/* One write into two GPU allocations (two regions): each (QP, region) pair is read back. */
static void test_gpu_two_regions_one_write(void **state)
{
    cuda_fake_install();
    memset(&FC, 0, sizeof(FC));
    FC.inited = 1;
    FC.ordering = CU_GPU_DIRECT_RDMA_WRITES_ORDERING_NONE;
    fx_connect();
    const size_t len = 1u << 20; /* 8 slices per region: every QP writes into both */
    fx_mem(len);
    uint8_t *d[2];
    baton__tp_mr_t *dmr[2];
    wreq_t x;
    memset(&x, 0, sizeof(x));
    for (int i = 0; i < 2; i++) {
        d[i] = vm_devmem_alloc(len / 2);
        assert_non_null(d[i]);
        assert_int_equal(reg_on_thread(F.dec, d[i], len / 2, &dmr[i]), 0);
        uint8_t key[BATON__TP_BLOB_MAX];
        size_t klen = 0;
        assert_int_equal(ops->mem_key(dmr[i], key, sizeof(key), &klen), 0);
        assert_int_equal(ops->mem_add(F.pp, 200 + (uint32_t)i, (uintptr_t)d[i], len / 2,
                                      BATON_XFER_MEM_CUDA, key, klen),
                         0);
        x.sge[i].src = F.src + i * (len / 2);
        x.sge[i].src_mr = F.src_mr;
        x.sge[i].dst = (uintptr_t)d[i];
        x.sge[i].dst_mem = 200 + (uint32_t)i;
        x.sge[i].len = len / 2;
    }
    x.w.sges = x.sge;
    x.w.n_sges = 2;
    x.w.cb = on_write_gpu;
    unflushed_at_done = -1;
    assert_int_equal(ops->write(F.pp, &x.w), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    assert_int_equal(unflushed_at_done, 0);
    uint8_t *back = malloc(len / 2);
    for (int i = 0; i < 2; i++) {
        vm_devmem_read(back, d[i], len / 2);
        assert_memory_equal(back, F.src + i * (len / 2), len / 2);
        assert_int_equal(ops->mem_del(F.pp, 200 + (uint32_t)i), 0);
        assert_int_equal(ops->mem_dereg(dmr[i]), 0);
        vm_devmem_free(d[i]);
    }
    free(back);
}

static void test_gpu_registration_paths(void **state)
{
    cuda_fake_install();
    memset(&FC, 0, sizeof(FC));
    FC.inited = 1;
    const size_t len = 64 * 1024 + 32; /* not a page multiple: the exact range matters */
    uint8_t *g = vm_devmem_alloc(len);
    assert_non_null(g);
    baton__tp_mr_t *mr = NULL;
    /* dma-buf over the allocation's exact range */
    assert_int_equal(reg_on_thread(F.pre, g, len, &mr), 0);
    assert_int_equal(ops->mem_dereg(mr), 0);
    /* a sub-range of the allocation, not page aligned */
    assert_int_equal(reg_on_thread(F.pre, g + 48, 1000, &mr), 0);
    assert_int_equal(ops->mem_dereg(mr), 0);
    /* no dma-buf: the device pointer itself, which only nvidia-peermem can pin */
    FC.no_dmabuf = 1;
    assert_true(reg_on_thread(F.pre, g, len, &mr) < 0);
    vm_set_peermem(1);
    assert_int_equal(reg_on_thread(F.pre, g, len, &mr), 0);
    assert_true(container_of(mr, rdma_mr_t, base)->peermem);
    assert_int_equal(ops->mem_dereg(mr), 0);
    vm_set_peermem(0);
    /* past the allocation: refused before the NIC sees it */
    FC.no_dmabuf = 0;
    assert_int_equal(reg_on_thread(F.pre, g, len + 4096, &mr), BATON_EINVAL);
    vm_devmem_free(g);
}
/* A sysfs tree in a temp dir: NIC vm_0 and the GPU under one PCIe switch on NUMA node 0,
 * NIC vm_1 under another root port on node 1. */
static char sysroot[256];

static void mk(const char *rel, const char *numa)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s/%s", sysroot, rel);
    char *p = cmd + strlen(sysroot) + 1;
    for (; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(cmd, 0700);
            *p = '/';
        }
    }
    mkdir(cmd, 0700);
    if (numa) {
        char f[600];
        snprintf(f, sizeof(f), "%s/numa_node", cmd);
        FILE *fp = fopen(f, "w");
        assert_non_null(fp);
        fputs(numa, fp);
        fclose(fp);
    }
}

static void ln(const char *target_rel, const char *link_rel)
{
    char t[512], l[512];
    snprintf(t, sizeof(t), "%s/%s", sysroot, target_rel);
    snprintf(l, sizeof(l), "%s/%s", sysroot, link_rel);
    assert_int_equal(symlink(t, l), 0);
}

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void test_gpu_memory_uses_near_nics(void **state)
{
    cuda_fake_install();
    memset(&FC, 0, sizeof(FC));
    FC.inited = 1;
    FC.ordering = CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER;
    const char *tmp = getenv("TMPDIR");
    snprintf(sysroot, sizeof(sysroot), "%s/baton-rdma-sysfs-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(sysroot));
    mk("devices/pci0000:00/0000:00:01.0/0000:01:00.0", "0");
    mk("devices/pci0000:00/0000:00:01.0/0000:02:00.0", "0");
    mk("devices/pci0000:80/0000:80:01.0/0000:81:00.0", "1");
    mk("class/infiniband/vm_0", NULL);
    mk("class/infiniband/vm_1", NULL);
    mk("bus/pci/devices", NULL);
    ln("devices/pci0000:00/0000:00:01.0/0000:01:00.0", "class/infiniband/vm_0/device");
    ln("devices/pci0000:80/0000:80:01.0/0000:81:00.0", "class/infiniband/vm_1/device");
    ln("devices/pci0000:00/0000:00:01.0/0000:02:00.0", "bus/pci/devices/0000:02:00.0");

    base_setup();
    tun.sysfs_root = sysroot;
    fx_start(2, 2, IBV_MTU_4096, IBV_MTU_4096, 0, 0);
    fx_connect();
    const size_t len = 1u << 20;
    uint8_t *src = vm_devmem_alloc(len);
    assert_non_null(src);
    F.dst = aligned_alloc(4096, len);
    uint8_t *pattern = malloc(len);
    for (size_t i = 0; i < len; i++)
        pattern[i] = (uint8_t)(i * 13 + 1);
    vm_devmem_write(src, pattern, len);
    baton__tp_mr_t *smr;
    assert_int_equal(reg_on_thread(F.pre, src, len, &smr), 0);
    assert_int_equal(container_of(smr, rdma_mr_t, base)->near_devs, 1u); /* vm_0 only */
    baton__tp_mem_params_t mp = {
        .addr = F.dst, .len = len, .kind = BATON_XFER_MEM_HOST, .memfd = -1};
    assert_int_equal(ops->mem_reg(F.dec, &mp, &F.dst_mr), 0);
    F.size = len;
    fx_announce();
    wreq_t x;
    memset(&x, 0, sizeof(x));
    x.sge[0].src = src;
    x.sge[0].src_mr = smr;
    x.sge[0].dst = (uintptr_t)F.dst;
    x.sge[0].dst_mem = MEM_ID;
    x.sge[0].len = len;
    x.w.sges = x.sge;
    x.w.n_sges = 1;
    x.w.cb = on_write;
    assert_int_equal(ops->write(F.pp, &x.w), 0);
    run_all();
    assert_int_equal(x.done, 1);
    assert_int_equal(x.status, 0);
    assert_memory_equal(F.dst, pattern, len);
    uint32_t q[8];
    int n = side_qps(1, q, 8, 1);
    uint64_t near = 0, far = 0;
    for (int i = 0; i < n; i++) {
        vm_qp_info_t a;
        vm_qp_info(q[i], &a);
        if (a.dev == 0)
            near += a.wrs_posted;
        else
            far += a.wrs_posted;
    }
    assert_true(near >= len / (64 * 1024));
    assert_int_equal(far, 0);
    assert_int_equal(ops->mem_dereg(smr), 0);
    vm_devmem_free(src);
    free(pattern);
    assert_int_equal(nftw(sysroot, rm_cb, 8, FTW_DEPTH | FTW_PHYS), 0);
}
#else
static void test_gpu_two_regions_one_write(void **state)
{
    print_message("SKIP: built without the CUDA Toolkit headers (BATON_HAVE_CUDA off)\n");
    skip();
}

static void test_gpu_memory_uses_near_nics(void **state)
{
    print_message("SKIP: built without the CUDA Toolkit headers (BATON_HAVE_CUDA off)\n");
    skip();
}

static void test_gpu_pages_no_inline_no_cpu_flush_before_done(void **state)
{
    print_message("SKIP: built without the CUDA Toolkit headers (BATON_HAVE_CUDA off)\n");
    skip();
}

static void test_gpu_registration_paths(void **state)
{
    print_message("SKIP: built without the CUDA Toolkit headers (BATON_HAVE_CUDA off)\n");
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_no_devices, NULL),
        cmocka_unit_test_teardown(test_qp_states_mtu_min_decode_smaller, teardown),
        cmocka_unit_test_teardown(test_qp_states_mtu_min_prefill_smaller, teardown),
        cmocka_unit_test_setup_teardown(test_slicing_and_striping, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_completion_only_after_every_slice, setup_default,
                                        teardown),
        cmocka_unit_test_teardown(test_mr_split_at_max_mr_size, teardown),
        cmocka_unit_test_setup_teardown(test_retry_exceeded_then_reconnect, setup_default,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_stale_handshake_ignored, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_fenced_page_gets_no_late_write, setup_default,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_target_fence_stops_incoming_writes, setup_default,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_remote_access_errors, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_deregistered_target_memory, setup_default, teardown),
        cmocka_unit_test_teardown(test_read_pulls_holder_pages, teardown),
        cmocka_unit_test_setup_teardown(test_read_refusals, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_read_stale_and_released, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_read_faults, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_qp_fatal_event, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_port_error_disconnects_all, setup_default, teardown),
        cmocka_unit_test_teardown(test_outstanding_bounded_by_max_wr, teardown),
        cmocka_unit_test_teardown(test_queue_depth_used_by_large_write, teardown),
        cmocka_unit_test_teardown(test_cq_budget_shared_by_peers, teardown),
        cmocka_unit_test_teardown(test_reg_mr_failure_rolls_back, teardown),
        cmocka_unit_test_setup_teardown(test_post_failure_mid_chain, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_flush_waits_for_writes, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_device_fatal, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_gid_v2_ipv4_chosen_and_override, setup_default,
                                        teardown),
        cmocka_unit_test_teardown(test_gid_v1_across_subnets_fails, teardown),
        cmocka_unit_test_teardown(test_gid_v1_only_needs_a_pin, teardown),
        cmocka_unit_test_teardown(test_pairing_by_link_layer, teardown),
        cmocka_unit_test_teardown(test_infiniband_routes_by_lid, teardown),
        cmocka_unit_test_teardown(test_hugepages_advised_for_large_pools, teardown),
        cmocka_unit_test_teardown(test_qos_and_fork_init, teardown),
        cmocka_unit_test_teardown(test_limits_clamped, teardown),
        cmocka_unit_test_setup_teardown(test_initiator_nic_fatal_with_work, setup_default,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_initiator_cq_error_with_work, setup_default, teardown),
        cmocka_unit_test_teardown(test_drain_watchdog_bounds_a_silent_nic, teardown),
        cmocka_unit_test_teardown(test_unused_port_flap_keeps_peers, teardown),
        cmocka_unit_test_teardown(test_both_ports_used, teardown),
        cmocka_unit_test_setup_teardown(test_gid_change_refreshes_address, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_two_engines_create_qps_concurrently, setup_default,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_gpu_pages_no_inline_no_cpu_flush_before_done,
                                        setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_gpu_two_regions_one_write, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_gpu_registration_paths, setup_default, teardown),
        cmocka_unit_test_teardown(test_gpu_memory_uses_near_nics, teardown),
        cmocka_unit_test(test_no_refused_phase_moves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
