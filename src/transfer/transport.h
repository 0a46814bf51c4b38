/* transfer/transport.h — the internal transport ops table (rdma, tcp, shm) and its rules. */
#ifndef BATON_TRANSFER_TRANSPORT_H
#define BATON_TRANSFER_TRANSPORT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/socket.h>

#include <uv.h>

#include "baton/error.h"
#include "baton/transfer.h"
#include "common/list.h"

/*
 * A transport moves bytes from the PREFILL side's registered memory into the DECODE side's
 * registered pages. The engine owns the control channel (ctrl_*.c), the rooms (room_prefill.c,
 * room_decode.c, room_pull.c), the peers and their health (peer.c, engine.c); a transport owns
 * only its data path.
 *
 * Objects (each transport embeds the base struct FIRST in its own struct and recovers it with
 * container_of; the engine only ever sees the base):
 *   baton__tp_t       one started transport of one engine (created by init, freed by fini)
 *   baton__tp_peer_t  one peer CONNECTION's data path (QPs, lanes, mappings). A connection is
 *                     one-shot: after a failure it is fenced and destroyed, never reused; a
 *                     reconnect creates a new one with a new generation.
 *   baton__tp_mr_t    one local memory registration (MRs per NIC, split at max_mr_size, ...)
 *
 * Threads. Every op runs on the engine's PROGRESS thread (env->loop's thread), except
 * mem_reg, mem_key and mem_dereg, which run on the caller's thread, concurrently with
 * progress-thread ops on other objects: they must be thread-safe (ibv_reg_mr is). A transport
 * may register uv handles (uv_poll_t on a completion channel or async-event fd, timers) on
 * env->loop and must close them in fini / peer_destroy.
 *
 * Callbacks from a transport to the engine (write completions, connect and fence callbacks,
 * env upcalls) run on the progress thread and NEVER inside the op that started the work:
 * defer them (baton__tp_defer, a completion poll, a uv callback). Each fires exactly once.
 *
 * Errors: ops return 0 or a negative code from baton/error.h. An op a transport does not
 * support points at baton__tp_notsup (returns BATON_ENOTSUP) — never NULL.
 *
 * Roles. The decode side (it connected the control channel) is the TARGET of writes; the
 * prefill side (it accepted) is the INITIATOR. The handshake, in order:
 *   decode:  peer_create(ROLE_TARGET)    -> peer_info()   -> HELLO{blob} to prefill
 *   prefill: peer_create(ROLE_INITIATOR) -> peer_connect(decode's blob, cb) -> on cb(0):
 *            peer_info() -> HELLO{blob} back to decode
 *   decode:  peer_connect(prefill's blob, cb) -> on cb(0): the engine sends MEM frames (with
 *            mem_key blobs) and marks the peer UP; OFFERs follow.
 *   prefill: mem_add() per MEM frame, then write() for the rooms' pages.
 * Hence peer_info may be called before or after peer_connect; its blob is what the other side
 * passes to its own peer_connect. Blobs are opaque to the engine, at most
 * BATON__TP_BLOB_MAX bytes; the engine carries them in HELLO / MEM and checks only the length.
 * A transport must validate every field of a peer's blob (it came from the network).
 */

#define BATON__TP_BLOB_MAX 4096

typedef struct baton__tp_s baton__tp_t;
typedef struct baton__tp_peer_s baton__tp_peer_t;
typedef struct baton__tp_mr_s baton__tp_mr_t;
typedef struct baton__tp_ops_s baton__tp_ops_t;
typedef struct baton__tp_write_s baton__tp_write_t;

typedef enum {
    BATON__TP_ROLE_TARGET = 1,    /* decode: pages are written into our memory */
    BATON__TP_ROLE_INITIATOR = 2, /* prefill: we write into the peer's pages */
} baton__tp_role_t;

/* Services the engine gives every transport. Valid from init to fini. */
typedef struct {
    uv_loop_t *loop;                /* the progress loop */
    const baton_xfer_config_t *cfg; /* slice_size, lanes, rdma_devices, rdma_qps_per_nic */
    const char *engine_id;          /* for logs */
    uint64_t incarnation;
    void *priv; /* the engine's (baton__tp_defer uses it) */

    /* The transport saw a fatal error on a peer connection (failed work completion, QP_FATAL,
     * lane reset, PORT_ERR / DEVICE_FATAL for every peer on that device). The engine marks the
     * peer DOWN, fails its rooms under the fencing rule and later calls peer_fence then
     * peer_destroy. Call it at most once per peer; it may be called from any progress-thread
     * callback (never inside an op). */
    void (*peer_failed)(baton__tp_peer_t *peer, int err);

    /* TARGET side only, for transports whose receiver places the bytes itself (tcp): resolves
     * an incoming write of `len` bytes for `room_id` at remote address `addr` into destination
     * page `page`. Returns 0 and *dst_p (== addr, checked to lie inside that page of an open
     * room offered on this connection); BATON_ERKEY for a bounds violation; BATON_EABORTED or
     * BATON_ENOTFOUND when the room is aborting or gone (the transport then discards the
     * payload and answers the write with that error). *kind_p says what memory the page is in
     * (a CUDA page must be filled through the driver, never by the CPU). The pointer is valid
     * only until the transport returns to the loop. */
    int (*resolve_dst)(baton__tp_peer_t *peer, uint64_t room_id, uint32_t page, uint64_t addr,
                       uint64_t len, void **dst_p, baton_xfer_mem_kind_t *kind_p);
    /* TARGET side: `len` bytes were placed for room_id (statistics, progress). */
    void (*placed)(baton__tp_peer_t *peer, uint64_t room_id, uint64_t len);
    /* The engine's counters of device bytes copied through host bounce buffers (tcp) and of
     * the bounce-buffer bytes held now (a gauge). Any thread, relaxed. */
    atomic_uint_fast64_t *staged_bytes;
    atomic_uint_fast64_t *stage_buffer_bytes;
} baton__tp_env_t;

/* Base of a started transport. */
struct baton__tp_s {
    const baton__tp_ops_t *ops;
    const baton__tp_env_t *env;
    baton_xfer_transport_t id;
};

/* Base of a peer connection's data path. peer_create fills tp, role and generation; the engine
 * then sets ctx and remote_addr before it calls any other op on the peer. */
struct baton__tp_peer_s {
    baton__tp_t *tp;
    baton__tp_role_t role;
    uint64_t generation; /* unique per connection in this process; echoed in blobs so a stale
                            reply (old connection / old QPs) is recognised and ignored */
    void *ctx;           /* the engine's connection object; the transport never touches it */
    /* The control connection's peer address: tcp connects its lanes there (the prefill side's
     * bootstrap listener). */
    struct sockaddr_storage remote_addr;
};

/* Base of a local registration. */
struct baton__tp_mr_s {
    baton__tp_t *tp;
    void *addr;
    size_t len;
    baton_xfer_mem_kind_t kind;
};

/* What a transport can do; queried, never assumed. */
typedef struct {
    uint64_t max_slice;        /* largest single write it accepts (0: unlimited) */
    unsigned same_host : 1;    /* only usable between processes of one host (shm) */
    unsigned needs_shm : 1;    /* target pages must be in baton_xfer_mem_alloc memory */
    unsigned cuda_local : 1;   /* can read CUDA device memory as a source */
    unsigned cuda_remote : 1;  /* can write into CUDA device memory of the peer */
    unsigned remote_check : 1; /* the target validates every write (rkey/bounds) in hardware or
                                  in its receiver; shm relies on the writer's own check */
} baton__tp_caps_t;

/* Local registration parameters (mem_reg). */
typedef struct {
    void *addr;
    size_t len;
    baton_xfer_mem_kind_t kind;
    int device;         /* CUDA ordinal for BATON_XFER_MEM_CUDA */
    int memfd;          /* the memfd behind [addr, addr+len) (offset 0), or -1 */
    uint64_t shm_token; /* random name tag of that memfd (shm uses it to verify the mapping) */
} baton__tp_mem_params_t;

/* One contiguous piece of a write: local source -> remote destination. The engine passes whole
 * pages; the transport cuts them into env->cfg->slice_size pieces (and stripes them over its
 * QPs / lanes / NICs as it sees fit). */
typedef struct {
    const void *src;        /* inside src_mr */
    baton__tp_mr_t *src_mr; /* this transport's registration of the source region */
    uint64_t dst;           /* destination virtual address in the peer */
    uint32_t dst_mem;       /* the peer's region id (from its MEM frame): selects rkey/segment */
    uint32_t dst_page;      /* index of the destination page within the room */
    uint64_t len;           /* > 0 */
} baton__tp_sge_t;

typedef void (*baton__tp_write_cb)(baton__tp_write_t *w, int status);

/*
 * One write request (INITIATOR side), owned by the engine until its cb. `sges` stays valid and
 * the sources unchanged until cb. cb(w, 0): every byte is in place in the peer's memory
 * (RDMA: all WRs completed successfully; TCP: every slice acknowledged; SHM: copied).
 * cb(w, err): the write failed or was cancelled by peer_fence; the transport no longer reads
 * the sources and will issue nothing more for it. Exactly once, never inside write().
 */
struct baton__tp_write_s {
    uint64_t room_id;
    const baton__tp_sge_t *sges;
    size_t n_sges;
    baton__tp_write_cb cb;
    void *data;       /* the engine's */
    uint64_t priv[4]; /* the transport's scratch (counters, list links) */
};

typedef void (*baton__tp_done_cb)(baton__tp_peer_t *peer, int status, void *arg);

struct baton__tp_ops_s {
    const char *name; /* "rdma", "tcp", "shm" */
    baton_xfer_transport_t id;

    /* Starts the transport (open devices, PDs, CQs, completion channel polls). BATON_ENODEV
     * when it cannot run here: the engine logs it and falls back to the next transport. */
    int (*init)(const baton__tp_env_t *env, baton__tp_t **tp_p);
    /* Called after every peer was destroyed; frees everything, closes its uv handles (their
     * close callbacks may run after fini returns: keep the memory they use until then). */
    void (*fini)(baton__tp_t *tp);
    int (*query)(baton__tp_t *tp, baton__tp_caps_t *caps);

    /* ---- local memory (caller thread; thread-safe) ---- */
    int (*mem_reg)(baton__tp_t *tp, const baton__tp_mem_params_t *p, baton__tp_mr_t **mr_p);
    /* The blob a peer needs to write into this region (rkeys per NIC, shm handle); may be
     * empty (*len_p = 0, tcp). */
    int (*mem_key)(baton__tp_mr_t *mr, uint8_t *buf, size_t cap, size_t *len_p);
    int (*mem_dereg)(baton__tp_mr_t *mr);

    /* ---- peer connections (progress thread) ---- */
    int (*peer_create)(baton__tp_t *tp, baton__tp_role_t role, uint64_t generation,
                       baton__tp_peer_t **peer_p);
    /* This side's handshake blob (GID/LID/QPNs/PSN/MTU per NIC for rdma; pid/fence segment for
     * shm; lane count and token for tcp). */
    int (*peer_info)(baton__tp_peer_t *peer, uint8_t *buf, size_t cap, size_t *len_p);
    /* Brings the connection up with the peer's blob (RTR/RTS with the minimum MTU; connect
     * the lanes; map the fence segment). cb(peer, 0, arg) when ready, or cb(peer, err, arg);
     * exactly once, never inside the call, unless it returns an error (then never). A blob
     * from another generation / incarnation is refused with BATON_ESTALE. */
    int (*peer_connect)(baton__tp_peer_t *peer, const uint8_t *blob, size_t len,
                        baton__tp_done_cb cb, void *arg);
    /* INITIATOR: the peer announced a region (MEM frame): remember its key blob (parse and
     * check it now: BATON_EPROTO / BATON_ERKEY), map shm segments. */
    int (*mem_add)(baton__tp_peer_t *peer, uint32_t mem_id, uint64_t base, uint64_t len,
                   baton_xfer_mem_kind_t kind, const uint8_t *blob, size_t blob_len);
    /* INITIATOR: the peer withdrew a region (MEM_DEL). No write to it is in flight. */
    int (*mem_del)(baton__tp_peer_t *peer, uint32_t mem_id);
    /* INITIATOR: starts a write. 0: cb will fire. Error: cb never fires (e.g. BATON_ERKEY for
     * a destination outside the announced region, BATON_EPEERDOWN once the peer failed). */
    int (*write)(baton__tp_peer_t *peer, baton__tp_write_t *w);
    /*
     * Pull mode (RDMA READ): the reverse of write, on either role of an UP peer. Each sge names a
     * LOCAL buffer (src, inside src_mr: the bytes land there) and a REMOTE range (dst, len) of
     * the peer's region dst_mem, announced to THIS side with mem_add (the holder's source pages;
     * mem_add is then called on the puller's peer, whatever its role). cb(w, 0): every byte of
     * every range is in the local buffers (all READ completions arrived). cb(w, err): a READ
     * failed (the connection is then down: QPs in ERROR, the peer told through peer_failed) or
     * peer_fence cancelled it; the local buffers hold partial data and the transport writes
     * nothing more into them. Synchronous errors as write (BATON_ERKEY for a range outside the
     * announced region or an unknown region, BATON_EPEERDOWN once the peer failed or is not UP,
     * BATON_ENOTSUP where the transport cannot read: baton__tp_notsup_read).
     */
    int (*read)(baton__tp_peer_t *peer, baton__tp_write_t *w);
    /* cb once every write started before this call has completed (fired its cb). Optional. */
    int (*flush)(baton__tp_peer_t *peer, baton__tp_done_cb cb, void *arg);
    /*
     * Ends the connection's data path for good, in both directions: afterwards no write from
     * the peer can land in our memory (TARGET: QPs in ERROR and drained, lanes closed, the shm
     * writer fenced or dead) and every write request of ours has fired its cb (with an error
     * if unfinished; RDMA: after the flushed completions, so sources are no longer read).
     * cb(peer, 0, arg) then, exactly once, never inside the call. Called once per peer, also
     * for a peer whose peer_connect never completed.
     */
    int (*peer_fence)(baton__tp_peer_t *peer, baton__tp_done_cb cb, void *arg);
    /* Frees a fenced peer (or one whose peer_create succeeded but was never connected). */
    void (*peer_destroy)(baton__tp_peer_t *peer);

    /* TCP only: the engine's bootstrap listener accepted a lane (its LANE_HELLO named this
     * transport and the connection with `generation`). The transport takes the stream (it
     * must be reading-stopped; `rest` holds bytes read after LANE_HELLO). */
    int (*adopt_lane)(baton__tp_peer_t *peer, uv_tcp_t *stream, uint32_t lane_index,
                      const uint8_t *rest, size_t rest_len);
};

/* Typed stubs for unsupported ops (each returns BATON_ENOTSUP); casting one function to
 * another pointer type is not allowed. */
int baton__tp_notsup_flush(baton__tp_peer_t *peer, baton__tp_done_cb cb, void *arg);
int baton__tp_notsup_adopt_lane(baton__tp_peer_t *peer, uv_tcp_t *stream, uint32_t lane_index,
                                const uint8_t *rest, size_t rest_len);
int baton__tp_notsup_mem_add(baton__tp_peer_t *peer, uint32_t mem_id, uint64_t base, uint64_t len,
                             baton_xfer_mem_kind_t kind, const uint8_t *blob, size_t blob_len);
int baton__tp_notsup_mem_del(baton__tp_peer_t *peer, uint32_t mem_id);
int baton__tp_notsup_read(baton__tp_peer_t *peer, baton__tp_write_t *w);

/* Runs fn(arg) on the progress loop on a later iteration (never inside the caller). Progress
 * thread only. Returns 0 or BATON_ENOMEM. */
int baton__tp_defer(const baton__tp_env_t *env, void (*fn)(void *arg), void *arg);

/* The transports. Each is defined in its own file (rdma.c, tcp.c, shm.c). */
extern const baton__tp_ops_t baton__tp_rdma_ops;
extern const baton__tp_ops_t baton__tp_tcp_ops;
extern const baton__tp_ops_t baton__tp_shm_ops;

#endif
