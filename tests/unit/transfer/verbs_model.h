/* verbs_model.h — a software model of the verbs the RDMA transport calls (tests only). */
#ifndef BATON_TESTS_VERBS_MODEL_H
#define BATON_TESTS_VERBS_MODEL_H

/*
 * How the model stands in for the NIC
 * -----------------------------------
 * The test binary is linked with -Wl,--wrap=ibv_xxx for every *exported* verb the transport
 * calls (device list, open/close, PD, MR, CQ, completion channel, QP create/modify/destroy,
 * queries, CQ and async events); the model defines the matching __wrap_ibv_xxx functions.
 * The data-path verbs (ibv_post_send, ibv_poll_cq, ibv_req_notify_cq) are static inline in
 * <infiniband/verbs.h> and call through context->ops, so they cannot be wrapped: instead the
 * model plays the provider — every ibv_context it hands out carries an ops table whose
 * post_send / poll_cq / req_notify_cq point at the model. ibv_query_port is an inline too; a
 * model context is not an "extended" verbs context, so the inline falls back to the exported
 * ibv_query_port, which is wrapped. Production code therefore calls verbs exactly as it would
 * against a real HCA, with no test seam in it.
 *
 * What the model enforces (each violation is a real-HCA failure, counted in `misuse` or
 * reported the way hardware reports it):
 *  - QP states RESET/INIT/RTR/RTS/ERR with the kernel's transition table and required /
 *    optional attribute masks for RC; values checked (port, path_mtu <= port active MTU, GRH
 *    required on RoCE ports).
 *  - post_send: QP must be RTS (ERR: accepted and flushed), num_sge <= max_send_sge, no more
 *    than max_send_wr WRs outstanding (a slot frees when a CQE covering it is *polled*),
 *    inline data <= max_inline_data, opcodes RDMA_WRITE and RDMA_READ (never inline); at most
 *    max_rd_atomic READs of a QP queued at once (more is counted as misuse: the NIC would
 *    stall them, and Baton promises to respect its initiator depth).
 *  - modify_qp: max_dest_rd_atomic <= the device's max_qp_rd_atom, max_rd_atomic <= its
 *    max_qp_init_rd_atom (else EINVAL).
 *  - executing a READ: the initiator's max_rd_atomic above the responder QP's
 *    max_dest_rd_atomic ends in IBV_WC_REM_INV_REQ_ERR (the responder has no resources for
 *    it); rkey, bounds and REMOTE_READ access (QP and MR) as for writes; the bytes land in the
 *    local SGEs, whose MR needs LOCAL_WRITE.
 *  - executing a WR: lkey/bounds on the local device and PD (else IBV_WC_LOC_PROT_ERR), the
 *    peer QP found by the dest QPN recorded at RTR, connected back to this QP, same PSN
 *    (sq_psn == peer rq_psn), GID matching the peer's device, path MTU within the peer's port
 *    (else IBV_WC_RETRY_EXC_ERR); rkey on the *peer's device and PD*, bounds, REMOTE_WRITE
 *    access (else IBV_WC_REM_ACCESS_ERR). Success copies the bytes into the remote memory.
 *  - errors move the QP to ERR; every WR still queued on a QP in ERR completes with
 *    IBV_WC_WR_FLUSH_ERR (signalled or not), and never lands.
 *  - CQ capacity (overflow counted, plus an IBV_EVENT_CQ_ERR async event, and the CQ is
 *    unusable from then on: nothing more is ever polled from it), completion events only when
 *    the CQ was armed, destroy of busy objects (EBUSY), un-acked events.
 *  - A ConnectX-shaped GID table per port (RoCE): index 0 v1 link-local, 1 v2 link-local,
 *    2 v1 IPv4-mapped, 3 v2 IPv4-mapped (cfg.gid), each with a netdev; InfiniBand: one entry.
 *    Every device sits in its own IP subnet unless cfg.subnet says otherwise, and a packet
 *    crosses subnets only v2 to v2 with routable (not link-local) GIDs: anything else ends in
 *    IBV_WC_RETRY_EXC_ERR, as across a routed RoCE fabric. ibv_query_gid_ex is wrapped.
 *  - Fatal devices (vm_inject_device_fatal): no completion of any kind, flushes included;
 *    modify_qp / destroy_* return EIO (the object is released anyway, as the kernel does).
 *  - Device memory (vm_devmem_alloc): PROT_NONE pages the CPU cannot touch. Only the model's
 *    DMA path (executing WRs, vm_devmem_read/write) reaches them, so an inline send or a CPU
 *    copy from "GPU" memory crashes the test. Every WR landing in device memory counts as
 *    unflushed until an RDMA READ on the same QP from the same allocation completes after it
 *    (vm_devmem_unflushed).
 *  - QP capacities are written back rounded up (max_send_wr to a power of two, inline data to
 *    a multiple of 32), and the device refuses inline data or SGEs beyond its limits.
 *  - Two ports per device when cfg.nports is 2; port events carry their port number.
 *
 * Timing: WRs are queued at post time and run only when the test calls vm_step()/vm_run()
 * (or at once with vm_set_auto_execute(1)), so a test decides exactly what has landed when.
 *
 * Threading: every entry point (the wrapped verbs, the provider ops post_send / poll_cq /
 * req_notify_cq, and the vm_* calls) takes one recursive model lock, so two transports may
 * create QPs from two threads at once, and whole engines may run on their progress threads
 * (test_xfer_pull_rdma: WRs then run inside the posting thread's post_send with
 * vm_set_auto_execute(1), or when the test thread calls vm_run).
 */

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char name[32];
    uint8_t nports;          /* 0: a device that has no ports; at most 2 */
    enum ibv_mtu active_mtu; /* every port */
    enum ibv_mtu max_mtu;
    enum ibv_port_state port_state;  /* port 1 */
    enum ibv_port_state port2_state; /* port 2 (0: ACTIVE) */
    int subnet;                      /* devices with equal subnets share layer 2 (default: index) */
    int max_inline;                  /* inline data the device takes (default 256; 0: none) */
    uint32_t max_msg_sz;             /* port max message (default 1 GiB) */
    uint8_t link_layer; /* IBV_LINK_LAYER_ETHERNET (RoCE: GRH required) or _INFINIBAND */
    uint16_t lid;
    uint8_t gid[16];
    uint8_t roce_v1_only; /* RoCE: the port lists only its v1 entries (an old kernel or an
                           * L2-only configuration); the v2 slots stay empty */
    uint64_t max_mr_size;
    int max_qp_wr;
    int max_sge;
    int max_cqe;
    int max_rd_atom; /* max_qp_rd_atom and max_qp_init_rd_atom (default 16) */
} vm_dev_cfg_t;

/* Defaults for device number `index`: RoCE, MTU 4096, unique LID and GID, 1 TiB max_mr_size. */
void vm_dev_cfg_default(vm_dev_cfg_t *cfg, int index);

/* Frees every model object and forgets devices, faults and counters. Call in each setup. */
void vm_reset(void);
/* Adds a device; returns its index. */
int vm_add_device(const vm_dev_cfg_t *cfg);
/*
 * Which devices ibv_get_device_list() returns from now on: [first, first+count). Lets two
 * transport instances in one process own different NICs (e.g. 0-1 "prefill", 2-3 "decode").
 * Default: all devices.
 */
void vm_set_visible(int first, int count);
/* ibv_get_device_list() returns NULL with errno ENOSYS, like a kernel without RDMA support. */
void vm_set_no_kernel_support(int on);

/* --- timing ------------------------------------------------------------------------------ */

/* Runs up to n queued WRs in post order (skipping held QPs); returns how many ran. */
int vm_step(int n);
/* Runs every queued WR of QPs that are not held; returns how many ran. */
int vm_run(void);
/* WRs posted and not yet run or flushed (all QPs). */
int vm_queued(void);
/* 1: WRs run inside post_send. */
void vm_set_auto_execute(int on);
/* Holds back (1) or releases (0) the WRs of one QP. */
void vm_hold_qp(uint32_t qpn, int hold);

/* --- fault injection -------------------------------------------------------------------- */

typedef enum {
    VM_OP_GET_DEVICE_LIST,
    VM_OP_OPEN_DEVICE,
    VM_OP_QUERY_DEVICE,
    VM_OP_QUERY_PORT,
    VM_OP_QUERY_GID,
    VM_OP_ALLOC_PD,
    VM_OP_REG_MR,
    VM_OP_REG_DMABUF_MR,
    VM_OP_CREATE_COMP_CHANNEL,
    VM_OP_CREATE_CQ,
    VM_OP_REQ_NOTIFY_CQ,
    VM_OP_CREATE_QP,
    VM_OP_MODIFY_QP,
    VM_OP_POST_SEND,
    VM_OP_COUNT_
} vm_op_t;

/* The nth next call (1 = the next one) of op fails with errno err. */
void vm_fail_op(vm_op_t op, int nth, int err);
/* The nth next WR to run (1 = the next one) completes with status (no data lands); QP → ERR. */
void vm_fail_wr(int nth, enum ibv_wc_status status);
/* QP → ERR (its queued WRs flush) and IBV_EVENT_QP_FATAL on its context. */
int vm_inject_qp_fatal(uint32_t qpn);
/* IBV_EVENT_PORT_ERR / IBV_EVENT_DEVICE_FATAL on every open context of device dev (port 1). */
int vm_inject_port_err(int dev);
int vm_inject_device_fatal(int dev);
/* A port event (PORT_ERR: port down, PORT_ACTIVE: up, LID_CHANGE, GID_CHANGE) for one port
 * of dev, on every open context of dev. Returns the number of contexts told. */
int vm_inject_port_event(int dev, int port, enum ibv_event_type type);
/* The device stops completing anything, with (event 1) or without (0) DEVICE_FATAL. */
int vm_set_device_fatal(int dev, int event);
/* Every CQ of dev becomes unusable (as after an overflow) and IBV_EVENT_CQ_ERR is raised. */
int vm_inject_cq_err(int dev);
/* Changes the IPv4 address of dev's port (GID entries 2 and 3); raise GID_CHANGE yourself. */
void vm_set_port_ipv4(int dev, int port, const uint8_t ip[4]);

/* --- device ("GPU") memory --------------------------------------------------------------- */

/* size bytes of PROT_NONE memory (page-rounded mapping, exact size recorded). */
void *vm_devmem_alloc(size_t size);
void vm_devmem_free(void *p);
/* The allocation containing p: base and exact size; 0 when p is not device memory. */
int vm_devmem_range(const void *p, void **base_p, size_t *size_p);
/* A dma-buf fd for [base, base+size) (must lie in one allocation), or -1. */
int vm_devmem_export(const void *base, size_t size);
/* DMA-path copies for test setup and checks. */
void vm_devmem_write(void *dst, const void *src, size_t len);
void vm_devmem_read(void *dst, const void *src, size_t len);
/* WR landings in device memory not yet followed by a completed read on their QP. */
int vm_devmem_unflushed(void);
/* ibv_reg_mr of device memory succeeds only with nvidia-peermem loaded (default off: EFAULT). */
void vm_set_peermem(int on);
/* Calls to ibv_fork_init. */
int vm_fork_inits(void);

/* --- inspection ------------------------------------------------------------------------- */

typedef struct {
    uint64_t wrs_posted;
    uint64_t wrs_run;          /* landed successfully (writes and reads) */
    uint64_t reads_run;        /* RDMA READs among them */
    uint64_t max_reads_queued; /* the most READs ever queued on one QP at once */
    uint64_t wrs_failed;       /* completed with an error other than flush */
    uint64_t wrs_flushed;      /* completed with IBV_WC_WR_FLUSH_ERR */
    uint64_t bytes_landed;
    uint64_t max_wr_bytes;  /* the largest WR that landed */
    uint64_t post_rejected; /* post_send calls that returned an error */
    uint64_t cqes;
    uint64_t cq_overflows;
    uint64_t cq_events;
    uint64_t async_events;
    uint64_t qps_created;
    uint64_t qps_destroyed;
    uint64_t mrs_registered;
    uint64_t max_outstanding; /* the most WRs ever outstanding on one QP */
    uint64_t misuse;          /* API misuse detected; the reason went to stderr */
} vm_stats_t;

void vm_stats(vm_stats_t *s);

#define VM_MAX_STATES 16

typedef struct {
    int exists;    /* 0: no QP with that number was ever created */
    int destroyed; /* destroyed since */
    int dev;
    enum ibv_qp_state state;
    /* every state it went through, starting with RESET */
    enum ibv_qp_state history[VM_MAX_STATES];
    int nhistory;
    struct ibv_qp_cap cap;
    int sq_sig_all;
    /* attributes as given to the transitions (masks as given) */
    int init_mask, rtr_mask, rts_mask;
    uint8_t port_num;
    uint16_t pkey_index;
    unsigned int access_flags;
    enum ibv_mtu path_mtu;
    uint32_t dest_qpn;
    uint32_t rq_psn;
    uint8_t max_dest_rd_atomic;
    uint8_t min_rnr_timer;
    uint8_t is_global;
    uint8_t dgid[16];
    uint8_t sgid_index;
    uint8_t hop_limit;
    uint8_t traffic_class;
    uint8_t sl;
    uint16_t dlid;
    uint8_t timeout;
    uint8_t retry_cnt;
    uint8_t rnr_retry;
    uint32_t sq_psn;
    uint8_t max_rd_atomic;
    uint64_t wrs_posted;
    uint64_t wrs_signalled;
    uint64_t wrs_run;
    uint64_t bytes_run;
} vm_qp_info_t;

/* Fills info (info->exists = 0 when no such QP was ever created). */
void vm_qp_info(uint32_t qpn, vm_qp_info_t *info);
/* The QPNs of every QP ever created, in creation order; returns the total count. */
int vm_qp_list(uint32_t *qpns, int max);

typedef struct {
    int exists;
    int deregistered;
    int dev;
    void *addr;
    size_t length;
    unsigned int access;
    uint32_t lkey, rkey;
    uint64_t writes_landed; /* WRs that wrote into it */
    uint64_t bytes_landed;
} vm_mr_info_t;

/* Looks an MR up by rkey (any device). */
void vm_mr_info(uint32_t rkey, vm_mr_info_t *info);
/* Bytes landed by WRs into [addr, addr+len) since vm_reset (counted over every MR). */
uint64_t vm_bytes_landed_in(const void *addr, size_t len);
/* Number of live (not destroyed / deregistered / closed) model objects: 0 after a clean teardown.
 */
int vm_live_objects(void);

#endif
