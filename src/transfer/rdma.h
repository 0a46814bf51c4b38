/* transfer/rdma.h — the RDMA transport's private types and cross-file functions. */
#ifndef BATON_TRANSFER_RDMA_H
#define BATON_TRANSFER_RDMA_H

/*
 * Layout of the RDMA transport (one concern per file):
 *   rdma.c        ops table: init / fini / query, peer ops glue
 *   rdma_dev.c    one context per active HCA port: open, GID choice, limits, PD, CQ, completion
 *                 channel, PCIe/NUMA placement (sysfs)
 *   rdma_verbs.c  the ONE place where verbs' error conventions become Baton codes
 *   rdma_mr.c     local registrations (every HCA, split at max_mr_size, CUDA dmabuf) and the
 *                 peer's remote regions (rkeys per NIC per chunk)
 *   rdma_qp.c     QP state machine RESET→INIT→RTR→RTS→ERR, the handshake blob, NIC pairing
 *   rdma_post.c   writes and (pull mode) reads: slicing, striping over NICs and QPs, selective
 * signalling, the outstanding-WR accounting, completion of writes, peer failure and fencing
 *   rdma_poll.c   completion channel + async event fd on the progress loop (uv_poll); port and
 *                 device events (by port number), dead devices
 *
 * Testing seams: the tunables (baton__rdma_init_tuned: queue sizes, the watchdog's period, the
 * sysfs root) and cuda_shim's baton__cuda_install; nothing else. The unit tests link with
 * -Wl,--wrap=ibv_* for the exported verbs and hand out model contexts whose ops table serves the
 * inline data-path verbs (ibv_post_send, ibv_poll_cq, ibv_req_notify_cq); see
 * tests/unit/transfer/verbs_model.h.
 *
 * Threads: everything runs on the engine's progress thread except baton__rdma_mem_reg /
 * _mem_key / _mem_dereg, which only read the device table's fields that never change after
 * init (ctx, pd, dead, PCIe placement) and touch their own registration (ibv_reg_mr is
 * thread-safe; CUDA registration makes the GPU's context current on the calling thread).
 * Each transport owns all of its state: two engines in one process share nothing here.
 *
 * Connection shape. The TARGET (decode) creates Q QPs on each of its R usable NICs, ordered
 * k-major (QP i sits on target NIC i % R, i = k*R + j), and sends them in its blob. The
 * INITIATOR (prefill) creates one QP per target QP, QP i on its local NIC i % L, and answers
 * with a blob of the same length; entry i of each blob is one RC pair. Slices go round-robin
 * over that order, so consecutive slices alternate NICs and then QPs.
 */

#include <stdint.h>

#include <infiniband/verbs.h>
#include <uv.h>

#include "common/phase.h"

#include "transfer/transport.h"

/* Knobs the config does not expose. Defaults as Mooncake; tests lower them to reach limits.
 * Each transport owns its copy (no process-wide mutable state): baton__rdma_tunables_default
 * fills one, baton__rdma_init_tuned starts a transport with it. Every value is clamped to the
 * device's limits when QPs and CQs are created. */
typedef struct {
    uint32_t max_wr;         /* send queue depth per QP (256) */
    uint32_t max_sge;        /* SGEs per WR (4) */
    uint32_t max_inline;     /* inline data bytes (64) */
    uint32_t signal_every;   /* signal at least every k-th WR on a QP (16) */
    uint32_t post_batch;     /* most WRs in one ibv_post_send chain (32) */
    uint32_t cq_size;        /* CQEs per device CQ (4096, clamped to max_cqe) */
    uint64_t max_mr_size;    /* 0: the device's; else split registrations at min(this, device) */
    uint32_t drain_check_ms; /* how often the drain watchdog looks (0: drain bound / 4) */
    const char *sysfs_root;  /* where PCIe / NUMA topology is read ("/sys"; tests: a temp dir) */
} baton__rdma_tunables_t;

void baton__rdma_tunables_default(baton__rdma_tunables_t *tun);
/* The ops table's init with explicit tunables (the ops' init uses the defaults). */
int baton__rdma_init_tuned(const baton__tp_env_t *env, const baton__rdma_tunables_t *tun,
                           baton__tp_t **tp_p);

/* GID types as ibv_gid_entry.gid_type reports them (IBV_GID_TYPE_*), plus "unknown". */
#define BATON__RDMA_GID_IB      0
#define BATON__RDMA_GID_ROCE_V1 1
#define BATON__RDMA_GID_ROCE_V2 2

#define BATON__RDMA_MAX_DEVS 16
#define BATON__RDMA_MAX_QPS  64 /* per peer connection (keeps the blob < BATON__TP_BLOB_MAX) */

typedef struct rdma_tp_s rdma_tp_t;
typedef struct rdma_dev_s rdma_dev_t;
typedef struct rdma_peer_s rdma_peer_t;
typedef struct rdma_qp_s rdma_qp_t;
typedef struct rdma_mr_s rdma_mr_t;
typedef struct rdma_rmem_s rdma_rmem_t;
typedef struct rdma_op_s rdma_op_t;

struct rdma_dev_s {
    rdma_tp_t *tp;
    int index; /* position in tp->devs: what blobs name */
    char name[IBV_SYSFS_NAME_MAX];
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    uint8_t port;
    uint8_t nports;
    enum ibv_mtu active_mtu;
    uint16_t lid;
    uint8_t link_layer;
    union ibv_gid gid;
    int gid_index;
    int gid_type;        /* BATON__RDMA_GID_* of the chosen entry */
    int gid_override;    /* -1, or the index the config named for this device */
    uint8_t prefix_len;  /* RoCE IPv4 GID: its interface's prefix length (0: unknown) */
    uint32_t max_msg_sz; /* the port's largest message: slices never exceed it */
    uint32_t max_sge;    /* device limit on SGEs per WR */
    int numa_node;       /* from sysfs, -1 unknown */
    char pci_path[256];  /* the PCI device's sysfs path, resolved ("" unknown) */
    uint64_t max_mr_size;
    uint32_t max_qp_wr;
    uint8_t max_rd_atom;      /* responder resources (max_qp_rd_atom) */
    uint8_t max_init_rd_atom; /* initiator depth (max_qp_init_rd_atom) */
    uint32_t cq_size;
    uint32_t cq_used; /* CQEs that posted WRs may still produce (flushes produce one each) */
    int starved;      /* a peer held back posts because this CQ was full: pump them all later */
    int port_up;      /* cleared by PORT_ERR on OUR port, set by PORT_ACTIVE on it */
    int dead;         /* DEVICE_FATAL / CQ_ERR: never used again, nothing completes on it */
    /* read-back target for GPU destinations (rdma_post.c), registered on first use */
    struct ibv_mr *rb_mr;
    uint8_t rb_buf[64];
    uv_poll_t comp_poll;
    uv_poll_t async_poll;
    int polls_started;
    rdma_qp_t **qp_hash; /* qpn -> QP, BATON__RDMA_QP_HASH chains */
};

#define BATON__RDMA_QP_HASH 256

struct rdma_tp_s {
    baton__tp_t base;
    baton__rdma_tunables_t tun;
    uint32_t slice_size;
    uint32_t qps_per_nic;
    rdma_dev_t devs[BATON__RDMA_MAX_DEVS];
    int ndevs;
    uint64_t chunk;     /* registrations are split into chunks of this size */
    baton_list_t peers; /* of rdma_peer_t.link: every live peer (device-wide events reach all) */
    int handles_open;   /* uv handles whose close callback has not run yet */
    int finishing;      /* fini called: free when handles_open reaches 0 */
    uint64_t psn_state; /* splitmix64 state for QP PSNs (common/rand.h), this transport's own */
    uint8_t traffic_class;
    uint8_t service_level;
    int hugepages;
    uint64_t drain_bound_ms; /* a failed peer's QPs are abandoned after this long */
    uv_timer_t watchdog;     /* drain watchdog, runs while some peer drains */
    int watchdog_init;
    uint64_t wd_gen; /* watchdog pass number */
};

/* One outstanding WR, for the completion that covers it. */
typedef struct {
    rdma_op_t *op; /* NULL: a drain marker */
    uint32_t len;
    uint8_t is_read; /* an RDMA READ: counted in its QP's reads_out until covered */
} rdma_wr_rec_t;

/* A (QP, GPU region) pair an op wrote through: it is read back once per pair. */
typedef struct {
    uint16_t qi;  /* peer->qps index */
    uint32_t sge; /* an SGE of the op whose destination lies in that region */
} rdma_rb_t;

typedef enum {
    RDMA_QP_NONE = 0, /* not created / destroyed */
    RDMA_QP_INIT,
    RDMA_QP_RTR,
    RDMA_QP_RTS,
    RDMA_QP_ERR,
    RDMA_QP_N_STATES
} rdma_qp_state_t;

struct rdma_qp_s {
    rdma_peer_t *peer;
    rdma_dev_t *dev;
    struct ibv_qp *qp;
    rdma_qp_t *hnext;
    uint32_t qpn;
    uint32_t psn;
    rdma_qp_state_t state;
    uint32_t max_wr;
    uint32_t max_inline;
    enum ibv_mtu path_mtu;
    /* the pair */
    uint32_t remote_qpn;
    uint16_t remote_dev; /* the peer's device index (selects the rkey column) */
    int rnic;            /* index into peer->rnic_dev */
    /* send queue: WRs with seq in [tail_seq, next_seq) have no polled completion yet */
    uint64_t next_seq;
    uint64_t tail_seq;
    rdma_wr_rec_t *ring; /* max_wr entries, seq % max_wr */
    uint32_t since_signal;
    int last_signalled; /* the newest posted WR asked for a completion */
    uint32_t max_sge;   /* as the provider granted (written back by ibv_create_qp), capped */
    /* RDMA READs: max_rd is the initiator depth set at RTS (max_rd_atomic: our device's
     * max_qp_init_rd_atom, the peer's responder resources from its blob, 16, whichever is
     * least); reads_out counts READ WRs posted and not yet covered by a polled completion, an
     * upper bound of the READs on the wire, never allowed above max_rd */
    uint8_t max_rd;
    uint32_t reads_out;
};

/* A region of the peer's memory (its MEM frame): rkeys per peer NIC per chunk. */
struct rdma_rmem_s {
    uint32_t mem_id;
    uint64_t base;
    uint64_t len;
    uint64_t chunk;
    uint32_t nchunks;
    uint16_t ndev;
    uint16_t devidx[BATON__RDMA_MAX_DEVS];
    int col[BATON__RDMA_MAX_DEVS]; /* peer->rnic_dev[i] -> column in rkeys */
    int readback;    /* GPU memory whose GPUDirect writes need a flush: read back before done */
    uint32_t *rkeys; /* [ndev][nchunks] */
};

/* A local registration: MRs per device per chunk. */
struct rdma_mr_s {
    baton__tp_mr_t base;
    uint64_t chunk;
    uint32_t nchunks;
    int ndev;
    struct ibv_mr **mrs; /* [dev][chunk] */
    int readback;        /* CUDA memory whose GPUDirect writes need a read-back (key flag) */
    uint32_t near_devs;  /* CUDA memory: devices closest to its GPU (bit per index; 0: all) */
    int peermem;         /* CUDA memory registered by pointer (no dma-buf) */
};

typedef enum {
    RDMA_PEER_NEW = 0, /* created; TARGET: its QPs are in INIT */
    RDMA_PEER_UP,      /* QPs in RTS: writes flow */
    RDMA_PEER_FAILED,  /* an error: QPs in ERR, draining, no new writes */
    RDMA_PEER_N_STATES
} rdma_peer_state_t;

/* The QP's and the peer's phase tables (rdma_qp.c, common/phase.h): only these moves change them.
 *   QP: NONE -> INIT -> RTR -> RTS; INIT, RTR, RTS -> ERR; any created -> NONE (destroyed).
 *   peer: NEW -> UP (connecting) -> NEW (the sweep could not be queued); NEW, UP -> FAILED. */
extern const baton_phase_table_t baton__rdma_qp_phases, baton__rdma_peer_phases;
#define RDMA_QP_MOVE(q, to)                                                                        \
    (void)BATON_PHASE_MOVE(&baton__rdma_qp_phases, (q)->state, (to), "qpn=%u", (q)->qpn)
#define RDMA_PEER_MOVE(p, to)                                                                      \
    (void)BATON_PHASE_MOVE(&baton__rdma_peer_phases, (p)->state, (to), "generation=%llu",          \
                           (unsigned long long)(p)->base.generation)

typedef struct rdma_flush_s {
    struct rdma_flush_s *next;
    uint64_t upto; /* ops with seq < upto must finish first */
    baton__tp_done_cb cb;
    void *arg;
} rdma_flush_t;

struct rdma_peer_s {
    baton__tp_peer_t base;
    rdma_tp_t *tp;
    baton_list_t link; /* in tp->peers */
    rdma_peer_state_t state;
    rdma_qp_t *qps;
    int nqps;
    uint32_t rr; /* next QP for round-robin */
    uint64_t remote_generation;
    uint8_t remote_rd; /* the peer's responder resources (its blob; 0: an older peer, unknown) */
    int nrnic;
    uint16_t rnic_dev[BATON__RDMA_MAX_DEVS]; /* distinct peer devices this connection reaches */
    rdma_rmem_t *rmems;
    int nrmems;
    int caprmems;
    /* writes: every unfinished op in start order; post_cursor = first with unposted bytes */
    rdma_op_t *ops_head, *ops_tail;
    rdma_op_t *post_cursor;
    uint64_t op_seq;
    rdma_flush_t *flushes;
    /* per-QP post chains, nqps * post_batch, reused by every pump */
    struct ibv_send_wr *cwr;
    struct ibv_sge *csge;
    uint32_t *clen;
    int fail_err;     /* first error: why the connection is down (0: fine) */
    uint64_t fail_ms; /* loop time of the failure: the drain watchdog's start */
    uint64_t wd_gen;  /* the watchdog pass that last looked at it */
    int drained;      /* failed and every QP is gone */
    int fail_told;    /* env->peer_failed was called (or must not be: fenced first) */
    int fencing;      /* peer_fence was called */
    int fence_fired;  /* its callback ran */
    baton__tp_done_cb fence_cb;
    void *fence_arg;
    int connect_pending; /* connect callback not fired yet */
    baton__tp_done_cb connect_cb;
    void *connect_arg;
    /* lifetime: peer_destroy frees at once unless something still holds the memory (a queued
     * sweep, a completion batch being settled); then the last release frees it */
    int holds;
    int destroyed;
    int sweep_queued;
    int touched; /* on a completion batch's list */
    rdma_peer_t *touch_next;
};

struct rdma_op_s {
    rdma_op_t *next;
    baton__tp_write_t *w;
    int is_read; /* pull mode: RDMA READs from the peer's region into the local buffers */
    rdma_peer_t *peer;
    uint64_t seq;
    size_t sge_idx; /* next byte to post: sges[sge_idx] + sge_off */
    uint64_t sge_off;
    int rm_idx;        /* peer->rmems index of sges[sge_idx]'s region, -1: not looked up yet */
    uint32_t inflight; /* WRs posted and not yet covered by a completion */
    int posted_all;    /* nothing more will be posted (done, or abandoned after a failure) */
    int status;
    rdma_rb_t *rb; /* distinct (QP, read-back region) pairs it wrote through; malloc'd */
    uint32_t n_rb, cap_rb;
    int rb_state; /* 0: none needed, 1: needed, 2: reads posted */
};

/* ---- rdma_verbs.c: error conventions ---------------------------------------------------- */

/* errno value -> negative code (ENOMEM -> BATON_ENOMEM, ENODEV/ENOSYS -> BATON_ENODEV, others
 * pass through as -errno like libuv's codes). */
int baton__rdma_err_errno(int e);
/* Verbs returning an errno (modify_qp, destroy_*, dereg_mr, query_*): some providers return
 * -errno or -1 with errno set; all three are handled. 0 stays 0. */
int baton__rdma_err_ret(int rc);
/* Verbs returning NULL with errno set (open_device, alloc_pd, reg_mr, create_*). */
int baton__rdma_err_null(void);
/* ibv_poll_cq's negative count (no errno promised). */
int baton__rdma_err_count(int n);
/* A failed work completion -> the write's error. */
int baton__rdma_err_wc(enum ibv_wc_status st);

/* ---- rdma_dev.c ------------------------------------------------------------------------- */

/* Opens every usable device (filter: comma-separated names, NULL = all). 0, or BATON_ENODEV
 * with a log line saying why when none is usable. */
int baton__rdma_devs_open(rdma_tp_t *tp, const char *filter);
/* Destroys the verbs objects of every device (after its uv handles closed). */
void baton__rdma_devs_close(rdma_tp_t *tp);
/* The smallest max_mr_size over the devices (and the tunable), a multiple of 4096. */
uint64_t baton__rdma_chunk_size(const rdma_tp_t *tp);
void baton__rdma_qp_hash_add(rdma_dev_t *dev, rdma_qp_t *qp);
void baton__rdma_qp_hash_del(rdma_dev_t *dev, rdma_qp_t *qp);
rdma_qp_t *baton__rdma_qp_hash_find(rdma_dev_t *dev, uint32_t qpn);
/* Devices a new connection may use (alive, port up); returns the count written to out. */
int baton__rdma_usable_devs(rdma_tp_t *tp, rdma_dev_t **out, int cap);
/* Re-reads the port's LID and picks the GID again (after LID/GID change events). 0 or error. */
int baton__rdma_dev_refresh(rdma_dev_t *dev);
/* CUDA memory's NICs: the devices whose PCIe path shares the deepest bridge with the GPU at
 * gpu_bus_id ("0000:3b:00.0"), then the same NUMA node. A bit per device index; 0 when the
 * topology is unknown (every device is as good). */
uint32_t baton__rdma_near_devs(const rdma_tp_t *tp, const char *gpu_bus_id);
/* The read-back MR of dev, registered on first use; NULL when registration failed. */
struct ibv_mr *baton__rdma_dev_rb_mr(rdma_dev_t *dev);

/* ---- rdma_poll.c ------------------------------------------------------------------------ */

/* Arms the CQs and starts polling the completion channel and async fds on env->loop. */
int baton__rdma_poll_start(rdma_tp_t *tp);
/* Closes the uv handles; baton__rdma_poll_closed(tp) runs when the last one closed. */
void baton__rdma_poll_stop(rdma_tp_t *tp);
void baton__rdma_poll_closed(rdma_tp_t *tp);
/* Polls one device's CQ until empty and dispatches every completion. */
void baton__rdma_cq_drain(rdma_dev_t *dev);

/* ---- rdma_mr.c -------------------------------------------------------------------------- */

int baton__rdma_mem_reg(baton__tp_t *tp, const baton__tp_mem_params_t *p, baton__tp_mr_t **mr_p);
int baton__rdma_mem_key(baton__tp_mr_t *mr, uint8_t *buf, size_t cap, size_t *len_p);
int baton__rdma_mem_dereg(baton__tp_mr_t *mr);
int baton__rdma_mem_add(baton__tp_peer_t *peer, uint32_t mem_id, uint64_t base, uint64_t len,
                        baton_xfer_mem_kind_t kind, const uint8_t *blob, size_t blob_len);
int baton__rdma_mem_del(baton__tp_peer_t *peer, uint32_t mem_id);
rdma_rmem_t *baton__rdma_rmem_find(rdma_peer_t *peer, uint32_t mem_id);
void baton__rdma_rmems_free(rdma_peer_t *peer);
/* The local key covering src on dev, and how many bytes from src stay in that MR. */
uint32_t baton__rdma_lkey(const rdma_mr_t *mr, int dev, uintptr_t src, uint64_t *room_p);
/* The rkey for dst reached through the peer's NIC rnic, and the bytes left in that MR. */
uint32_t baton__rdma_rkey(const rdma_rmem_t *rm, int rnic, uint64_t dst, uint64_t *room_p);

/* ---- rdma_qp.c -------------------------------------------------------------------------- */

/* Creates the QP on dev and moves it RESET -> INIT. */
int baton__rdma_qp_create(rdma_peer_t *peer, rdma_qp_t *qp, rdma_dev_t *dev);
/* INIT -> RTR -> RTS toward the pair described by (qpn, psn, gid, lid, mtu). */
int baton__rdma_qp_connect(rdma_qp_t *qp, uint32_t remote_qpn, uint32_t remote_psn,
                           const uint8_t gid[16], uint16_t lid, enum ibv_mtu remote_mtu);
/* -> ERR (in-flight WRs flush). Idempotent. */
int baton__rdma_qp_error(rdma_qp_t *qp);
/* Destroys the QP (only once drained: tail_seq == next_seq). The QP is gone afterwards even
 * when the provider reports an error (EIO on a dead device): the kernel object is released
 * with the context, and keeping ours would hold the fence forever. */
void baton__rdma_qp_destroy(rdma_qp_t *qp);
int baton__rdma_peer_info(baton__tp_peer_t *peer, uint8_t *buf, size_t cap, size_t *len_p);
int baton__rdma_peer_handshake(rdma_peer_t *peer, const uint8_t *blob, size_t len);

/* ---- rdma.c ---------------------------------------------------------------------------- */

/* Starts the drain watchdog (idempotent); it stops itself when no peer drains. */
void baton__rdma_watchdog_arm(rdma_tp_t *tp);
/* Keeps the peer's memory alive across callbacks that may call peer_destroy. */
void baton__rdma_peer_hold(rdma_peer_t *peer);
/* Drops a hold; frees the peer when it was destroyed meanwhile and nothing else holds it. */
void baton__rdma_peer_release(rdma_peer_t *peer);

/* ---- rdma_post.c ------------------------------------------------------------------------ */

int baton__rdma_write(baton__tp_peer_t *peer, baton__tp_write_t *w);
/* Pull mode: the same op with RDMA READs (transport.h, read). */
int baton__rdma_read(baton__tp_peer_t *peer, baton__tp_write_t *w);
int baton__rdma_flush(baton__tp_peer_t *peer, baton__tp_done_cb cb, void *arg);
/* Posts what fits (QP depth, CQ room) of the queued writes. */
void baton__rdma_pump(rdma_peer_t *peer);
/* One work completion from dev's CQ; returns the peer it concerned (to settle), or NULL. */
rdma_peer_t *baton__rdma_on_wc(rdma_dev_t *dev, const struct ibv_wc *wc);
/* After a batch of completions: finish writes, destroy drained QPs, fire fence / flush. */
void baton__rdma_settle(rdma_peer_t *peer);
/* The connection is broken (err): QPs -> ERR, unposted slices dropped, the engine told once
 * (deferred; never inside the caller). Safe inside an op. */
void baton__rdma_peer_fail(rdma_peer_t *peer, int err);
int baton__rdma_peer_fence(baton__tp_peer_t *peer, baton__tp_done_cb cb, void *arg);
/* Completes every WR still outstanding on qp in software (as a flush would, with the peer's
 * error) and destroys it: for devices that will never complete them (fatal, CQ error) and for
 * drains past the watchdog's bound. */
void baton__rdma_qp_abandon(rdma_qp_t *qp);
/* The watchdog's look at one failed peer: abandons its QPs once the drain outlived the bound. */
void baton__rdma_drain_check(rdma_peer_t *peer, uint64_t now_ms);
/* Queues a deferred settle for the peer (used where callbacks may not fire directly). */
void baton__rdma_schedule_sweep(rdma_peer_t *peer);

#endif
