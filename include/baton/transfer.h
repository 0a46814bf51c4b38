/* baton/transfer.h — libbaton's public API: the KV transfer engine (rooms, memory, peers). */
#ifndef BATON_TRANSFER_H
#define BATON_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "baton/export.h"
#include "baton/transfer_error.h"
#include "baton/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Model
 * -----
 * Two engines meet through a bootstrap handshake. The PREFILL engine listens on its bootstrap
 * port; the DECODE engine connects to it (one control connection per peer, multiplexed by
 * room) and OFFERs a room: a 64-bit room id plus the destination pages of every layer, in
 * memory it registered. The prefill engine reports the room to its caller (room_cb), the caller
 * writes the pages layer by layer (or all at once) from its own registered source buffers, then
 * completes the room with a small payload (status, first token, opaque bytes). The decode
 * caller gets the payload in its offer callback once every byte is in place, and (optionally)
 * a layer callback as each layer lands before that (baton_xfer_layer_cb).
 *
 * One engine may play both roles at once (listen and connect).
 *
 * What "in place" means (memory ordering)
 * ---------------------------------------
 * Host memory: over rdma, a write's bytes are in place when the prefill NIC's completion for
 * the last RDMA WRITE of the room has arrived; DONE / LAYER_DONE travel on the control
 * connection after that completion. The assumption, true of PCIe root complexes and of the
 * verbs ordering rules, is that the responder HCA's DMA writes into host DRAM are visible to
 * the decode host's CPUs before the acknowledgement that produced that completion could have
 * been sent, so a CPU that reads the pages after the offer / layer callback sees the new bytes
 * (plain loads suffice; no extra fence is needed beyond the callback's own synchronisation).
 * tcp and shm place the bytes with the CPU before they acknowledge. GPU (CUDA) memory: the
 * GPU may order GPUDirect RDMA writes more weakly than its own kernels see them
 * (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING below OWNER); for such memory the rdma
 * transport reads back through every queue pair that wrote into it after the last write and
 * before the write counts as done (a read that follows writes on one RC connection returns
 * only after they are visible), so the same rule holds for kernels launched after the
 * callback. Where the attribute says the writes are already ordered, no read-back is made.
 * tcp and device memory: a socket cannot read or fill device memory, so the tcp transport
 * stages it through pinned host bounce buffers on the engine's progress thread (which makes a
 * context current for it). A device source is copied (cuMemcpyDtoH) into a chunk before its
 * slice is sent; the chunk is reused once the socket took the bytes. A device destination is
 * read into its lane's chunk and copied (cuMemcpyHtoD, finished when the call returns) into the
 * page before the slice is acknowledged, so a completed write, a layer callback and DONE mean
 * the bytes are in device memory, ordered before any kernel launched after the callback. The
 * chunks belong to the engine's connection to that peer (freed with it); their bound is
 * max(8 MiB, 2 slices) per peer on the sending side and one 512 KiB chunk per lane on the
 * receiving side; baton_xfer_stats_t counts the bytes staged (staged_bytes) and the chunk bytes
 * held (stage_buffer_bytes). A failed copy (BATON_XFER_EINVAL), no usable driver context
 * (BATON_XFER_ENODEV) or no pinned memory (BATON_XFER_ENOMEM) fails that write (its callback
 * gets the error, on whichever side the copy failed); the connection stays up.
 *
 * Threads
 * -------
 * The engine always runs its own progress thread (its own loop) for all network and device I/O.
 * Completions reach the host in one of two modes, chosen at baton_xfer_engine_create:
 *
 *   Loop mode (loop != NULL, "bring your own uv_loop"): the engine belongs to that libuv loop
 *   (the "caller loop"). Every baton_xfer_* function must be called on the caller loop's
 *   thread, except those marked "Any thread". The progress thread hands completions back with
 *   a uv_async_t; every callback runs on the caller loop's thread.
 *
 *   Own-progress mode (loop == NULL): the host runs no libuv loop. Every baton_xfer_* function
 *   may be called from any thread: the engine serializes them on one lock (recursive, so a
 *   callback may call them). Completions are queued; baton_xfer_engine_fd() returns a file
 *   descriptor that becomes readable when some are pending, and baton_xfer_engine_dispatch()
 *   (any thread, typically the one that polls the fd) runs their callbacks, on the calling
 *   thread, inside that call. Spurious wake-ups are possible: dispatch then runs nothing.
 *   A host that wants callbacks on another thread only has to poll the fd there.
 *
 * Signals: every socket write of the engine is made on its progress thread, which blocks SIGPIPE
 * (a peer killed mid-write makes the write fail with EPIPE and fails that peer, instead of ending
 * the host process); the host's own signal dispositions are left alone.
 *
 * In both modes callbacks never fire inside the call that started the work (a call that
 * returns an error fires no callback; a call that returns 0 fires its callback exactly once,
 * later), and "the caller thread" below means: the caller loop's thread (loop mode) or
 * whichever thread holds the engine's lock (own-progress mode).
 *
 * Fencing (the rule that protects KV pages)
 * -----------------------------------------
 * The decode side's offer callback fires exactly once per accepted offer and, whatever its
 * status, ONLY when no write for that room can still land in its pages: after DONE (all the
 * room's writes were acknowledged before the prefill side sent it), after the peer's
 * ABORT_ACK, after the transport was fenced (RDMA QPs in ERROR and drained, TCP lanes closed,
 * shared-memory writer fenced or its process gone). Only then may the caller reuse the pages.
 * Timeouts alone never release pages: a room timeout sends ABORT and still waits for a fence.
 *
 * Failures
 * --------
 * A peer is DOWN after heartbeat_interval_ms * heartbeat_misses without traffic, a reset
 * connection, a malformed / oversized / out-of-order frame (that connection only is closed,
 * with a logged reason) or a transport error. Every open room of that connection then fails
 * once, with BATON_XFER_EPEERDOWN, or BATON_XFER_EPROTO when the connection was closed for a
 * malformed frame (decode rooms after their fence). The decode side reconnects by itself with
 * exponential back-off and jitter (capped, never given up on); a returning peer, restarted (new
 * incarnation) or the same after a blip, gets a fresh handshake and fresh transport state, never
 * the old one. Offers made while the peer is down between attempts fail fast with
 * BATON_XFER_EPEERDOWN, so the caller can pick another pair.
 *
 * ABI policy
 * ----------
 * libbaton is shipped as libbaton.so.MAJOR (SONAME) and libbaton.a; BATON_VERSION_* below are
 * the headers' version and baton_version() the loaded library's.
 *   - Config structs grow only at their end, and carry their size: baton_xfer_config_init()
 *     sets cfg->size = sizeof(baton_xfer_config_t) as the program was compiled; the engine
 *     reads only that many bytes and gives every later field its default, so a program built
 *     against older headers keeps working with a newer library of the same MAJOR.
 *   - Enum values are never renumbered or reordered, error codes never reused; new values are
 *     only added.
 *   - Functions are only added, never removed or changed in signature within a MAJOR.
 *   - Opaque handles (engine, mem, room) have no public layout.
 *   - Anything else (a removed or changed function, a reordered struct, a changed enum value
 *     or callback signature) bumps MAJOR and so the SONAME; MINOR counts additions, PATCH
 *     fixes. While MAJOR is 0, MINOR releases may still break: the SONAME is then
 *     libbaton.so.0 and users should pin MINOR (pkg-config --atleast-version / --max-version).
 *
 * Errors: 0 or a negative code from baton/transfer_error.h (libuv codes pass through).
 */

typedef struct baton_xfer_engine_s baton_xfer_engine_t;
typedef struct baton_xfer_mem_s baton_xfer_mem_t;   /* a registered memory region */
typedef struct baton_xfer_room_s baton_xfer_room_t; /* a room, as seen by the prefill side */

typedef enum {
    BATON_XFER_TRANSPORT_NONE = 0,
    BATON_XFER_TRANSPORT_RDMA = 1, /* rdma-core verbs, RDMA WRITE (pull mode: RDMA READ) */
    BATON_XFER_TRANSPORT_TCP = 2,  /* lanes of TCP connections, direct placement */
    BATON_XFER_TRANSPORT_SHM = 3,  /* same host: writer copies into the reader's memfd pages */
} baton_xfer_transport_t;

#define BATON_XFER_MAX_TRANSPORTS   4
#define BATON_XFER_ENGINE_ID_MAX    64   /* bytes, without the NUL */
#define BATON_XFER_DONE_PAYLOAD_MAX 1024 /* opaque bytes carried by DONE */

/* "rdma", "tcp", "shm" or "none". */
BATON_API const char *baton_xfer_transport_name(baton_xfer_transport_t t);
/* Parses a name; returns 0 or BATON_XFER_EINVAL. */
BATON_API int baton_xfer_transport_parse(const char *name, baton_xfer_transport_t *t_p);

/* ---- configuration ---------------------------------------------------------------------- */

/* Log levels of the log callback (the same order as Baton's own logs). */
typedef enum {
    BATON_XFER_LOG_DEBUG = 0,
    BATON_XFER_LOG_INFO = 1,
    BATON_XFER_LOG_WARN = 2,
    BATON_XFER_LOG_ERROR = 3,
} baton_xfer_log_level_t;

/*
 * Receives one of the engine's log lines: `msg` is logfmt without time stamp and level
 * ("comp=xfer engine_started id=... transports=tcp"), valid only during the call. It runs on
 * the engine's progress thread or on the thread of the API call that logs: it must be
 * thread-safe, quick, and must not call back into libbaton.
 */
typedef void (*baton_xfer_log_cb)(void *data, baton_xfer_log_level_t level, const char *msg);

typedef struct {
    /* sizeof(baton_xfer_config_t) as the program was compiled (see the ABI policy); set by
     * baton_xfer_config_init, never by hand. */
    size_t size;
    /* Identifies this engine to its peers (copied; at most BATON_XFER_ENGINE_ID_MAX bytes).
     * NULL: "<hostname>-<pid>". A random incarnation is drawn per engine on top of it. */
    const char *engine_id;
    /* Bootstrap listener (the prefill role). NULL host: do not listen. Port 0: ephemeral; read
     * the real one with baton_xfer_engine_listen_port(). The engine logs
     * "bootstrap_listening addr=HOST:PORT" once it listens. */
    const char *listen_host;
    int listen_port;
    /* Transports in fallback order (the decode side's order wins). A transport that cannot
     * start here (e.g. rdma without devices) is logged with its error and skipped. Empty
     * (n_transports 0): tcp only. */
    baton_xfer_transport_t transports[BATON_XFER_MAX_TRANSPORTS];
    int n_transports;
    /* Health. A peer is DOWN when nothing arrived for heartbeat_interval_ms * heartbeat_misses.
     * Defaults 250 ms x 4 (detection within about 1 s). */
    uint32_t heartbeat_interval_ms;
    uint32_t heartbeat_misses;
    /* Reconnect back-off (decode side): exponential from min to max, with full jitter.
     * Defaults 50 ms .. 2000 ms. connect_timeout_ms bounds one attempt (default 2000). */
    uint32_t reconnect_min_ms;
    uint32_t reconnect_max_ms;
    uint32_t connect_timeout_ms;
    /* Decode side: a room with no DONE after this long is aborted (ABORT, then fenced) and
     * reported as BATON_XFER_ETIMEOUT. 0 (default): no limit. */
    uint32_t room_timeout_ms;
    /* Bytes per write (an RDMA WRITE, a TCP lane message, a shm copy step). Default 64 KiB. */
    uint32_t slice_size;
    /* TCP lanes (connections) per peer. Default 4, at most 16. */
    uint32_t lanes;
    /* RDMA: device names, comma separated (NULL: every active device); QPs per NIC per peer
     * (default 2). Ignored by other transports. */
    const char *rdma_devices;
    uint32_t rdma_qps_per_nic;
    /* Logging. Every line this engine logs (on its progress thread and in API calls on it)
     * goes to log_cb(log_data, level, msg) when set, else to stderr as one logfmt line with a
     * time stamp (the default). log_level: the least level delivered, a BATON_XFER_LOG_* value,
     * or -1 (default): the process default (the BATON_LOG_LEVEL environment variable read once,
     * else info). libbaton logs nothing outside an engine's create, calls and threads. */
    baton_xfer_log_cb log_cb;
    void *log_data;
    int log_level;

    /* ---- RDMA on real fabrics (docs/RDMA.md). Zero keeps each default. A device's GID index
     * is chosen per device and port (RoCE v2 IPv4-mapped, with a netdev first, then global v2;
     * v1 never automatically; InfiniBand routes by LID); "name:N" in rdma_devices pins device
     * `name` to index N (the only way to use a v1 GID), which is logged. ---- */
    /* GRH traffic class of every QP (RoCE: DSCP << 2, e.g. 106 for DSCP 26 on a lossless
     * class), 0..255. */
    uint32_t rdma_traffic_class;
    /* Service level (InfiniBand SL / RoCE priority mapping), 0..15. */
    uint32_t rdma_service_level;
    /* 1: call ibv_fork_init() before the first device is opened, for hosts that fork after
     * registering memory (Python engines); the alternative is RDMAV_FORK_SAFE=1 in the
     * environment. Process-wide and irreversible, like the verb itself. */
    uint32_t rdma_fork_init;
    /* 1: advise transparent huge pages (madvise MADV_HUGEPAGE) on host regions of 2 MiB or
     * more before registering them: fewer NIC translation entries for large KV pools. */
    uint32_t rdma_hugepages;
    /* After a connection fails, its queue pairs must drain before the fence fires; a drain
     * that has not ended after this long (a NIC that stopped completing) is finished in
     * software. Default 5000 ms. */
    uint32_t rdma_drain_timeout_ms;

    /* ---- KV bootstrap authentication (docs/SECURITY.md, "KV bootstrap"). ---- */
    /* A secret shared by every engine allowed to exchange KV with this one (copied at create;
     * secret_len bytes, BATON_XFER_SECRET_MIN..BATON_XFER_SECRET_MAX, any bytes). Set: every
     * control connection starts with a mutual challenge-response (HMAC-SHA-256 keyed with the
     * secret over both sides' fresh nonces, engine ids, incarnations and generations) before
     * HELLO, so a peer that cannot prove the secret is refused before any transport address,
     * region (MEM), rkey or OFFER is exchanged, and a recorded handshake cannot be replayed.
     * Refusals are logged (rate-limited) and counted (baton_xfer_stats_t.auth_failures).
     * An engine with a secret and one without never connect. NULL (default): no
     * authentication, as before; the engine logs one warning saying so. */
    const void *secret;
    size_t secret_len;

    /* ---- The bootstrap listener before a peer is UP (docs/SECURITY.md, "Buffers the worker and
     * libbaton hold for a peer"). An accepted control connection is pending until its
     * handshake ends (and until it proves the secret, when one is set): it may send only the
     * handshake's frames (AUTH, HELLO, LANE_HELLO; each of bounded size, checked from the frame
     * header before its body is read), and the listener holds at most: ---- */
    /* pending connections in all (default 512); one more is accepted and closed at once */
    uint32_t max_pending_conns;
    /* pending connections from one peer address (default 64) */
    uint32_t max_pending_per_addr;
    /* bytes of read buffer held by all pending connections together (default 8 MiB); a
     * connection whose next read would pass it is closed */
    uint64_t pending_buffer_bytes;
} baton_xfer_config_t;

#define BATON_XFER_SECRET_MIN 16   /* bytes: shorter secrets are refused (BATON_XFER_EINVAL) */
#define BATON_XFER_SECRET_MAX 1024 /* bytes */

/* Fills the defaults above and cfg->size. Always call it first, then override fields.
 * Any thread. */
BATON_API void baton_xfer_config_init(baton_xfer_config_t *cfg);

/* ---- callbacks ---------------------------------------------------------------------------- */

/* The small payload of DONE, sent by the prefill side with baton_xfer_room_complete(). */
typedef struct {
    int32_t status;      /* the prefill application's status: 0 ok, else its own code */
    int64_t first_token; /* the first generated token (-1 when none) */
    const uint8_t *payload;
    size_t payload_len; /* <= BATON_XFER_DONE_PAYLOAD_MAX */
} baton_xfer_done_t;

/*
 * Decode side: the end of an offered room. Fires exactly once per offer that returned 0.
 *   status 0: DONE arrived and every byte written before it is in place; `done` is valid
 *             (only during the call: copy what you keep).
 *   status < 0: the room failed; `done` is NULL. BATON_XFER_EPEERDOWN (connection lost),
 *             BATON_XFER_EPROTO (connection closed for a malformed frame), BATON_XFER_EABORTED
 * (either side aborted), BATON_XFER_ETIMEOUT (room_timeout_ms), BATON_XFER_ERKEY /
 * BATON_XFER_ESTALE (the prefill side refused the offer's pages or its incarnation),
 * BATON_XFER_ENOTSUP (the peer's transport cannot reach these pages), BATON_XFER_ESHUTDOWN,
 * BATON_XFER_ENOMEM. Either way the room's pages are released to the caller: nothing can land in
 * them anymore.
 */
typedef void (*baton_xfer_offer_cb)(void *data, uint64_t room_id, int status,
                                    const baton_xfer_done_t *done);

/*
 * Decode side, optional (baton_xfer_offer_t.layer_cb): every byte of `layer` of the room is in
 * place in the offered pages. It fires at most once per layer, on the caller loop, before the
 * room's offer callback (never after it, never inside baton_xfer_offer), in the order the
 * prefill side's writes of the layers completed (layer order when it writes them in order;
 * baton_xfer_write_room reports every layer, in order, once the whole room is in place).
 * It is a hint for early work, not a release: the pages stay the engine's until the offer
 * callback, which still decides the room (a layer reported here may belong to a room that
 * then fails). No layer callback fires after the room was aborted by either side, and layers
 * never written get none. `data` is the offer's data.
 * Wire: the prefill engine sends LAYER_DONE {room, layer} on the control connection once all
 * writes of that layer were acknowledged (tcp WACKs, shm copies done, rdma completions), the
 * same rule that orders DONE after a room's writes. It does so only for a decode engine whose
 * HELLO announced protocol version 2 or later; with an older prefill engine no layer callback
 * fires and the offer callback alone reports the room (a capability check by version, see
 * src/transfer/ctrl_frame.h).
 */
typedef void (*baton_xfer_layer_cb)(void *data, uint64_t room_id, uint32_t layer);

/*
 * Prefill side: an OFFER arrived. `room` stays valid until room_closed_cb for it returns. The
 * engine keeps the room; the caller writes it (baton_xfer_write_layer) and completes or aborts
 * it. An offer that arrives before the caller knows its request is still reported here: keep
 * it until the request comes (the decode side's room timeout or an abort ends it otherwise).
 */
typedef void (*baton_xfer_room_cb)(baton_xfer_engine_t *engine, baton_xfer_room_t *room,
                                   void *data);

/*
 * Prefill side: the room ended. status 0: DONE was sent after all the room's writes were
 * acknowledged. Else BATON_XFER_EABORTED (the decode side aborted, or baton_xfer_room_abort),
 * BATON_XFER_EPEERDOWN, BATON_XFER_ESHUTDOWN, ... Every write callback of the room has fired before
 * this one. The room handle is freed when this callback returns.
 */
typedef void (*baton_xfer_room_closed_cb)(baton_xfer_engine_t *engine, baton_xfer_room_t *room,
                                          int status, void *data);

/* Peer states, reported for metrics and logs. */
typedef enum {
    BATON_XFER_PEER_CONNECTING = 1, /* a connect attempt / handshake is under way */
    BATON_XFER_PEER_UP = 2,         /* handshake done, rooms flow */
    BATON_XFER_PEER_DOWN = 3,       /* failed; decode side: reconnect pending after back-off */
    BATON_XFER_PEER_GONE = 4,       /* prefill side: the peer's connection was retired */
} baton_xfer_peer_state_t;

typedef struct {
    const char *endpoint;  /* "host:port" (decode side) or the peer's address (prefill side) */
    const char *engine_id; /* the peer's id once it said HELLO, else "" */
    uint64_t incarnation;  /* the peer's incarnation once known, else 0 */
    baton_xfer_peer_state_t state;
    baton_xfer_transport_t transport; /* negotiated transport when UP */
    int reason;                       /* why it went DOWN/GONE (0 otherwise) */
    uint32_t reconnects;              /* successful re-handshakes after a failure */
} baton_xfer_peer_info_t;

typedef void (*baton_xfer_peer_cb)(baton_xfer_engine_t *engine, const baton_xfer_peer_info_t *info,
                                   void *data);

typedef struct {
    baton_xfer_room_cb room_cb;               /* prefill role: required when listening */
    baton_xfer_room_closed_cb room_closed_cb; /* prefill role: required when listening */
    baton_xfer_peer_cb peer_cb;               /* optional */
    void *data;                               /* passed to the three callbacks above */
} baton_xfer_callbacks_t;

/* ---- engine ------------------------------------------------------------------------------- */

/*
 * Creates an engine, starts its progress thread, its transports and (when cfg->listen_host is
 * set) its bootstrap listener. cfg and cbs are copied. `loop`: the caller loop (loop mode), or
 * NULL for own-progress mode (see Threads). Any thread in own-progress mode.
 * Returns 0 and *engine_p, or an error (BATON_XFER_EINVAL for a bad config or a cfg->size older
 * than this library accepts, bind failure, no transport usable, ...).
 */
BATON_API int baton_xfer_engine_create(uv_loop_t *loop, const baton_xfer_config_t *cfg,
                                       const baton_xfer_callbacks_t *cbs,
                                       baton_xfer_engine_t **engine_p);

/*
 * Own-progress mode: the descriptor that becomes readable (POLLIN) while completions are
 * pending. Owned by the engine: poll it, never read or close it. Valid until the close
 * callback. -1 in loop mode. Any thread.
 */
BATON_API int baton_xfer_engine_fd(const baton_xfer_engine_t *engine);

/*
 * Own-progress mode: runs the callbacks of every pending completion on the calling thread and
 * returns how many ran (0 after a spurious wake-up), or BATON_XFER_EINVAL in loop mode. Any
 * thread; concurrent calls are serialized. Never call it from a callback (the events it would
 * run could then overtake older ones still queued in the outer call). The engine's close callback,
 * after baton_xfer_engine_destroy, also runs inside this call: the engine and its fd are gone when
 * it returns, so stop polling from the close callback on.
 */
BATON_API int baton_xfer_engine_dispatch(baton_xfer_engine_t *engine);

/* The bound bootstrap port (after an ephemeral bind), or 0 when not listening. Any thread. */
BATON_API int baton_xfer_engine_listen_port(const baton_xfer_engine_t *engine);

/* This engine's id and incarnation. Any thread. */
BATON_API const char *baton_xfer_engine_id(const baton_xfer_engine_t *engine);
BATON_API uint64_t baton_xfer_engine_incarnation(const baton_xfer_engine_t *engine);

/* Transports that started here, in fallback order; returns how many were written. */
BATON_API int baton_xfer_engine_transports(const baton_xfer_engine_t *engine,
                                           baton_xfer_transport_t *out, int cap);

typedef void (*baton_xfer_close_cb)(baton_xfer_engine_t *engine, void *data);

/*
 * Shuts the engine down: every open room fails with BATON_XFER_ESHUTDOWN (decode rooms only after
 * their fence, as always), connections close, the progress thread exits, then close_cb runs on
 * the caller loop and the engine memory is freed after it returns. Registered memory must be
 * deregistered before (or the engine releases it: regions from baton_xfer_mem_alloc are
 * unmapped, other regions are only forgotten). Call once; in own-progress mode, make no other
 * call on the engine afterwards than baton_xfer_engine_dispatch (until the close callback).
 */
BATON_API void baton_xfer_engine_destroy(baton_xfer_engine_t *engine, baton_xfer_close_cb close_cb,
                                         void *data);

/* ---- memory ------------------------------------------------------------------------------- */

typedef enum {
    BATON_XFER_MEM_HOST = 0,
    BATON_XFER_MEM_CUDA =
        1, /* device memory; only when built with CUDA (else BATON_XFER_ENOTSUP) */
} baton_xfer_mem_kind_t;

/*
 * Registers [addr, addr+len) with every started transport (RDMA MRs, split at max_mr_size)
 * and announces it to connected peers. The memory stays owned by the caller and must stay
 * mapped until baton_xfer_mem_deregister returns. Regions must not overlap.
 * Over shm a region is only reachable when it was made by baton_xfer_mem_alloc (a memfd);
 * a room whose pages are elsewhere fails with BATON_XFER_ENOTSUP on a shm peer. Device memory is
 * reachable over rdma (GPUDirect), shm (CUDA IPC) and tcp (through host bounce buffers: see
 * "What "in place" means" above), as a source and as a destination. `device` is the CUDA device
 * ordinal (ignored for host memory). The handle stays valid until baton_xfer_mem_deregister, or
 * until the engine's close callback (the engine then releases what is left).
 */
BATON_API int baton_xfer_mem_register(baton_xfer_engine_t *engine, void *addr, size_t len,
                                      baton_xfer_mem_kind_t kind, int device,
                                      baton_xfer_mem_t **mem_p);

/*
 * Allocates len bytes of host memory backed by a memfd (shareable with a same-host peer),
 * zero-filled, page-aligned, and registers it like baton_xfer_mem_register. The engine owns
 * the mapping: baton_xfer_mem_deregister unmaps it.
 */
BATON_API int baton_xfer_mem_alloc(baton_xfer_engine_t *engine, size_t len,
                                   baton_xfer_mem_t **mem_p);

/* Base address and length of a region. Any thread. */
BATON_API void *baton_xfer_mem_addr(const baton_xfer_mem_t *mem);
BATON_API size_t baton_xfer_mem_len(const baton_xfer_mem_t *mem);

/*
 * Deregisters (and for baton_xfer_mem_alloc regions unmaps). BATON_XFER_EBUSY while an open room
 * (offered pages or write sources) still uses the region: wait for its callback first.
 */
BATON_API int baton_xfer_mem_deregister(baton_xfer_engine_t *engine, baton_xfer_mem_t *mem);

/* ---- peers -------------------------------------------------------------------------------- */

/*
 * Decode side: starts (or keeps) the control connection to the prefill engine listening at
 * host:port. Optional: baton_xfer_offer connects on demand. The engine keeps the peer for the
 * engine's life and reconnects it with back-off after failures. Returns 0 or BATON_XFER_EINVAL.
 */
BATON_API int baton_xfer_connect(baton_xfer_engine_t *engine, const char *host, int port);

/*
 * Decode side: forgets the peer at host:port (as given to baton_xfer_connect, _offer or _pull):
 * its control connection closes and it is never reconnected; a later offer to host:port starts a
 * fresh peer (a new handshake). A peer that rooms still use is dropped once the last of them has
 * ended; an offer or connect made to it meanwhile keeps it. For engines that reach many
 * short-lived peers (a store node pulling from every client that ever wrote to it): without it the
 * engine keeps every peer it ever reached, and retries the gone ones with back-off, for its whole
 * life. baton_xfer_stats_t counts the peers kept (peers) and those forgotten (peers_forgotten).
 * Returns 0 (an unknown endpoint included: nothing to forget), BATON_XFER_EINVAL,
 * BATON_XFER_ESHUTDOWN or BATON_XFER_ENOMEM.
 */
BATON_API int baton_xfer_forget(baton_xfer_engine_t *engine, const char *host, int port);

/* ---- decode side: rooms ------------------------------------------------------------------- */

typedef struct {
    void *addr;   /* inside a registered region */
    uint64_t len; /* > 0 */
} baton_xfer_iov_t;

typedef struct {
    uint64_t room_id;         /* unique among this engine's open rooms */
    uint32_t n_layers;        /* >= 1 */
    uint32_t pages_per_layer; /* >= 1 */
    /* n_layers * pages_per_layer destination pages, layer-major (layer 0's pages first).
     * Copied during the call. Each page lies inside one registered region. */
    const baton_xfer_iov_t *pages;
    /* Optional (NULL: none): per-layer arrival, see baton_xfer_layer_cb. */
    baton_xfer_layer_cb layer_cb;
} baton_xfer_offer_t;

/*
 * Decode side: offers a room to the prefill engine at host:port (connecting first when needed;
 * offers wait while a connect attempt is under way, and fail with BATON_XFER_EPEERDOWN while the
 * peer is down between attempts). The pages are the caller's; the engine writes into them (through
 * the transport) until cb fires — do not read them as final, reuse or deregister them before.
 * Synchronous errors (no cb): BATON_XFER_EINVAL (bad arguments, a page outside registered memory,
 * too many pages), BATON_XFER_EEXIST (room id already open here), BATON_XFER_ESHUTDOWN.
 * cb(data, room_id, status, done) fires exactly once otherwise, under the fencing rule.
 */
BATON_API int baton_xfer_offer(baton_xfer_engine_t *engine, const char *host, int port,
                               const baton_xfer_offer_t *offer, baton_xfer_offer_cb cb, void *data);

/*
 * Options of baton_xfer_offer_ex. baton_xfer_offer_t carries no size, so it cannot grow under
 * the ABI policy; new offer fields live here instead, in a struct that does (set `size` with
 * baton_xfer_offer_opts_init, then override fields; later fields of an older, smaller struct
 * keep their defaults).
 */
typedef struct {
    size_t size; /* sizeof(baton_xfer_offer_opts_t) as compiled; set by the init function */
    /* Pages [0, first_page) of every layer are already in the decode side's memory (its prefix
     * cache kept them from an earlier turn): they are not offered, and the prefill side never
     * writes them. offer->pages then holds only the offered pages, n_layers * (pages_per_layer
     * - first_page) of them, layer-major; pages_per_layer stays the full shape (what the
     * prefill side compares with its own). 0 (default): every page is offered. Must be below
     * pages_per_layer. A prefill engine older than this feature (control proto < 3) cannot
     * skip pages: such a room fails with BATON_XFER_ENOTSUP (offer it again with 0). */
    uint32_t first_page;
} baton_xfer_offer_opts_t;

/* Fills the defaults and opts->size. Any thread. */
BATON_API void baton_xfer_offer_opts_init(baton_xfer_offer_opts_t *opts);

/* baton_xfer_offer with options (opts NULL: the defaults, exactly baton_xfer_offer).
 * BATON_XFER_EINVAL also for first_page >= pages_per_layer or an opts->size too small. */
BATON_API int baton_xfer_offer_ex(baton_xfer_engine_t *engine, const char *host, int port,
                                  const baton_xfer_offer_t *offer,
                                  const baton_xfer_offer_opts_t *opts, baton_xfer_offer_cb cb,
                                  void *data);

/*
 * Decode side: asks to abort a room this engine offered. Sends ABORT; the room's offer callback
 * then fires with BATON_XFER_EABORTED once the peer's ABORT_ACK (or a fence) proves no write can
 * still land. Returns 0, or BATON_XFER_ENOTFOUND when no such room is open (it already completed:
 * its callback has fired or is queued).
 */
BATON_API int baton_xfer_abort(baton_xfer_engine_t *engine, uint64_t room_id);

/* ---- prefill side: rooms ------------------------------------------------------------------ */

/* The offer, read-only and immutable; valid until room_closed_cb returns. */
BATON_API uint64_t baton_xfer_room_id(const baton_xfer_room_t *room);
BATON_API uint32_t baton_xfer_room_layers(const baton_xfer_room_t *room);
BATON_API uint32_t baton_xfer_room_pages_per_layer(const baton_xfer_room_t *room);
/* Pages [0, first_page) of every layer are cached on the decode side and not offered
 * (baton_xfer_offer_opts_t.first_page); 0 when every page is offered. */
BATON_API uint32_t baton_xfer_room_first_page(const baton_xfer_room_t *room);
/* Length of the destination page `page` of `layer` (0 when out of range or not offered). */
BATON_API uint64_t baton_xfer_room_page_len(const baton_xfer_room_t *room, uint32_t layer,
                                            uint32_t page);
/* The decode peer's engine id and the transport the room travels on. */
BATON_API const char *baton_xfer_room_peer_id(const baton_xfer_room_t *room);
BATON_API baton_xfer_transport_t baton_xfer_room_transport(const baton_xfer_room_t *room);
/* A user pointer the caller may set and read (caller thread only). */
BATON_API void baton_xfer_room_set_data(baton_xfer_room_t *room, void *data);
BATON_API void *baton_xfer_room_get_data(const baton_xfer_room_t *room);

/*
 * Fires once per accepted write call, when the bytes are in place in the peer's pages (status
 * 0) or the write failed (room aborted, peer down, ...). The source buffers of the call belong
 * to the engine (must stay valid and unchanged) until then.
 */
typedef void (*baton_xfer_write_cb)(baton_xfer_room_t *room, uint32_t layer, int status,
                                    void *data);

/*
 * Marks layer `layer` ready and starts writing it at once: src[j] (len == the decode page
 * length of page j of that layer) goes to page j, for j < pages_per_layer. Sources lie in
 * memory registered with this engine. Pages below the room's first_page are not offered:
 * their src entries are ignored (not read, not checked) and nothing is sent for them. Each layer is
 * written at most once per room. Synchronous errors (no cb): BATON_XFER_EINVAL (bad layer, count,
 * lengths, unregistered source), BATON_XFER_EEXIST (layer already written), BATON_XFER_ECANCELED
 * (room already completed/closing).
 */
BATON_API int baton_xfer_write_layer(baton_xfer_room_t *room, uint32_t layer,
                                     const baton_xfer_iov_t *src, size_t n_src,
                                     baton_xfer_write_cb cb, void *data);

/* All layers at once: src holds n_layers * pages_per_layer sources, layer-major; cb fires once
 * (layer = UINT32_MAX) when every layer is in place. */
BATON_API int baton_xfer_write_room(baton_xfer_room_t *room, const baton_xfer_iov_t *src,
                                    size_t n_src, baton_xfer_write_cb cb, void *data);

/*
 * Like baton_xfer_write_layer, but the engine starts the write once `cuda_event` (a CUevent
 * recorded after the layer's kernels) has completed, so the caller never blocks on the GPU.
 * BATON_XFER_ENOTSUP when libbaton was built without CUDA.
 */
BATON_API int baton_xfer_write_layer_after_event(baton_xfer_room_t *room, uint32_t layer,
                                                 const baton_xfer_iov_t *src, size_t n_src,
                                                 void *cuda_event, baton_xfer_write_cb cb,
                                                 void *data);

/*
 * Sends DONE with `done` (copied) once every write issued for the room so far is acknowledged.
 * Layers never written are simply not sent (say so in done->status). room_closed_cb then fires
 * with 0, or an error if the peer failed first. Synchronous errors: BATON_XFER_EINVAL (payload too
 * long), BATON_XFER_ECANCELED (already completed/closing).
 */
BATON_API int baton_xfer_room_complete(baton_xfer_room_t *room, const baton_xfer_done_t *done);

/*
 * Prefill side abort: stops issuing writes, waits for the ones in flight, sends ABORT(reason)
 * to the decode side (which then releases its pages) and closes the room: pending write
 * callbacks fire with BATON_XFER_EABORTED, then room_closed_cb with BATON_XFER_EABORTED.
 * Returns 0 or BATON_XFER_ECANCELED (already completed/closing).
 */
BATON_API int baton_xfer_room_abort(baton_xfer_room_t *room, int reason);

/* ---- served rooms: the prefill engine answers offers on its own ----------------------------- */

/*
 * A holder whose answer to an offer needs no decision of its own (a store node: the room id names
 * the range of its memory to send) can let the engine answer on its progress thread, without the
 * two hand-offs through the caller thread (room_cb, then the write and complete calls) that an
 * ordinary room costs. For every OFFER of one layer of one page with no cached pages (first_page
 * 0) the engine calls, ON ITS PROGRESS THREAD, serve(data, room_id, len, &mem, &off):
 *   0: serve it: the engine writes [mem's address + off, + len) into the offered page and sends
 *      DONE {status 0, first_token -1, no payload} once the write is acknowledged, exactly as
 *      baton_xfer_write_room + baton_xfer_room_complete would (fencing, LAYER_DONE, transports:
 *      unchanged). If the write fails the room is aborted (the puller's callback gets
 *      BATON_XFER_EABORTED or the connection's error). A range outside `mem` aborts the room
 *      with BATON_XFER_ERKEY, a region the room's transport cannot read with
 *      BATON_XFER_ENOTSUP.
 *   > 0: not served here: the room goes to room_cb as any other.
 *   < 0: refused: the room is aborted with that reason (the puller's callback gets it when it
 *      is BATON_XFER_ERKEY, BATON_XFER_ESTALE or BATON_XFER_ENOMEM, else BATON_XFER_EABORTED:
 *      the rule of every abort by the prefill side).
 * Served rooms never reach room_cb or room_closed_cb; baton_xfer_stats_t counts them as rooms.
 * serve must be thread-safe and quick (it runs between the engine's socket reads), must not
 * call into libbaton, and may only return regions of this engine that stay registered for the
 * engine's life (a served write holds its region: baton_xfer_mem_deregister answers
 * BATON_XFER_EBUSY meanwhile, but nothing stops a region being deregistered between serve's
 * answer and the write taking its hold). Pull-mode exports are not consulted for served rooms.
 *
 * baton_xfer_engine_serve installs serve (cb NULL: removes it) for offers that arrive after the
 * progress thread took the call (earlier ones reach room_cb). 0, BATON_XFER_EINVAL (no engine),
 * BATON_XFER_ESHUTDOWN, BATON_XFER_ENOMEM. Any thread in own-progress mode, else the caller's.
 */
typedef int (*baton_xfer_serve_cb)(void *data, uint64_t room_id, uint64_t len,
                                   baton_xfer_mem_t **mem_p, uint64_t *off_p);

BATON_API int baton_xfer_engine_serve(baton_xfer_engine_t *engine, baton_xfer_serve_cb cb,
                                      void *data);

/* ---- pull mode: the holder keeps its pages until the puller fetches them -------------------- */

/*
 * vLLM's NIXL model (docs/PROTOCOLS.md): the prefill side computes the KV first and HOLDS it; a
 * decode side that learns about it later (from the prefill's HTTP answer: its bootstrap address
 * and a key) PULLS it. Two calls on top of the room machinery above:
 *
 *   Holder: baton_xfer_export() registers `key` with its source pages (layer-major, in memory
 *   registered with this engine; they must stay registered and unchanged until the callback).
 *   Puller: baton_xfer_pull() offers its destination pages for room id `key` to the holder at
 *   host:port, exactly like baton_xfer_offer (same callback, same fencing rule, same errors).
 *
 * When a pull arrives for an export of the same shape (layers, pages per layer, every page
 * length equal to its source's), the holder's engine writes the sources into the pulled pages
 * and sends DONE with the export's `done`, with no call from the holder's application (its
 * room_cb / room_closed_cb do not see that room). A pull whose shape differs is refused (the
 * puller's callback gets BATON_XFER_EABORTED) and the export keeps waiting. A pull for a key
 * with no export here reaches room_cb as an ordinary offer (serve or abort it there). An export
 * serves one pull; a second pull while one is served is refused.
 *
 * Completion (export_cb, exactly once per export that returned 0, never inside a call; on the
 * caller thread): 0: the pull is done (every byte was acknowledged in place before DONE went;
 * over rdma READ: the puller's READ_DONE arrived, see below);
 * BATON_XFER_ETIMEOUT: no pull came within timeout_ms; otherwise the pull failed
 * (BATON_XFER_EPEERDOWN when the puller died or its connection broke mid-read,
 * BATON_XFER_EABORTED when it aborted, ...). Either way the export is over and, like a room's
 * write sources after room_closed_cb, the sources are the caller's again: the fencing and
 * incarnation rules of the write path apply unchanged (a restarted puller is a new
 * incarnation; its predecessor's pull failed with its connection).
 *
 * Data path. tcp and shm: the holder's engine writes the sources into the pulled pages (tcp
 * lanes, shm copy) and sends DONE, exactly as the write path above. rdma (both engines of
 * control proto 4 or later; an older puller is served by RDMA WRITE as before): the PULLER
 * reads. The holder answers the pull with GRANT on the control connection: the source pages'
 * addresses and region ids, the rkeys of those regions (MEM frames, sent once per connection
 * and region, withdrawn with MEM_DEL when the region is deregistered) and the export's `done`.
 * The puller posts RDMA READs over the same RC queue pairs as the write path (slices of
 * slice_size, striped over its QPs), never more READs outstanding on a QP than its initiator
 * depth: max_rd_atomic at RTS = min(its device's max_qp_init_rd_atom, the holder's
 * max_dest_rd_atomic as announced in the handshake, 16); the holder's QPs take up to
 * min(max_qp_rd_atom, 16) as responder resources and grant IBV_ACCESS_REMOTE_READ, as do its
 * memory registrations.
 *
 * Completion over rdma READ. The puller's offer callback fires with 0 once the completion of
 * its last READ has arrived (every READ of a QP is covered by a later signalled completion, the
 * last WR on each QP is always signalled): the bytes are then in its pages, and the `done`
 * passed is the one the GRANT carried. The puller then sends READ_DONE; the holder's export
 * callback fires with 0 on it (its sources are the caller's again: no READ of the pull is in
 * flight once the puller said so). A READ that completes in error (remote access error: bad
 * rkey or a deregistered region; retry exceeded; the QP went to error) fails the puller's
 * connection: its QPs go to ERROR and drain (fence), the pull's offer callback fires after the
 * fence with BATON_XFER_EPEERDOWN, and the holder, seeing the connection close, fences its own
 * side and ends the export with BATON_XFER_EPEERDOWN. A grant whose shape does not match the
 * pulled pages, or that names a region this connection does not know, is refused before any
 * READ is posted: READ_DONE carries the error (BATON_XFER_EPROTO / BATON_XFER_ERKEY), both
 * callbacks get it.
 *
 * Abort over rdma READ. baton_xfer_abort (or room_timeout_ms) on a pull whose GRANT has not
 * arrived sends ABORT as for any room (the holder answers ABORT_ACK, the export ends with
 * BATON_XFER_EABORTED; a GRANT that crosses the ABORT is ignored, nothing is read). Once the
 * READs are posted they cannot be recalled one by one: the abort is recorded, the room ends
 * when they complete (or the connection fails and is fenced), with BATON_XFER_EABORTED (or
 * ETIMEOUT), and READ_DONE tells the holder the same status. The holder never ends a granted
 * pull on its own except by fencing the connection (engine destroy, peer down).
 *
 * Keys and fencing over rdma READ (what can still be read, and when). An rkey protects a whole
 * registered region, not one export: the holder's NIC serves any READ on a live connection that
 * carries the region's rkey and stays inside it. libbaton therefore (1) sends a region's keys
 * only in answer to a pull of a live export, and only on that puller's current connection: a
 * restarted puller (new incarnation) or a reconnect gets a new connection whose transport knows
 * none of the old keys (they are refused locally, BATON_XFER_ERKEY, before anything is posted),
 * and the old connection's QPs were moved to ERROR and destroyed, so no READ from them can be
 * served; (2) holds the export's source regions (baton_xfer_mem_deregister returns
 * BATON_XFER_EBUSY) until READ_DONE or the fence; (3) never releases a granted export early
 * (baton_xfer_export_release returns BATON_XFER_EBUSY while a pull is served). What it does NOT
 * do: revoke the rkey of a region whose export was released or ended while the region stays
 * registered. A peer that keeps the keys of an earlier grant on the same live connection could
 * still read that region (the libbaton puller never does: it reads only within a grant). Pages
 * that must become unreadable to a connected peer after their export: deregister the region
 * (its MRs are destroyed; a later READ ends in a remote access error) or put exports in their
 * own regions. Per-export revocation (memory windows bound per grant and invalidated at the
 * end) is not implemented. Authenticate peers (secret) so that only your engines connect.
 *
 * Threads: as the rest of the API. timeout_ms works in both modes: in loop mode a timer on the
 * caller loop ends the export; in own-progress mode the engine's progress thread checks the
 * deadlines on its tick (every heartbeat_interval_ms / 5, 5..50 ms) and makes the engine fd
 * readable once one is due, and baton_xfer_engine_dispatch runs the export's callback with
 * BATON_XFER_ETIMEOUT (so it fires up to one tick late, never early). An export whose pull is
 * being served when its timeout falls due is not timed out: the pull ends it by its own rules.
 * baton_xfer_engine_destroy drops exports still waiting, without their callbacks.
 */
typedef struct {
    uint64_t key;                /* unique among this engine's exports */
    uint32_t n_layers;           /* >= 1 */
    uint32_t pages_per_layer;    /* >= 1 */
    const baton_xfer_iov_t *src; /* n_layers * pages_per_layer sources, layer-major; copied */
    uint32_t timeout_ms;         /* 0: none (see Threads above; both modes) */
    baton_xfer_done_t done;      /* sent with DONE (copied; payload <= DONE_PAYLOAD_MAX) */
} baton_xfer_export_t;

typedef void (*baton_xfer_export_cb)(baton_xfer_engine_t *engine, uint64_t key, int status,
                                     void *data);

/* Holder: 0, or BATON_XFER_EINVAL (bad shape, no sources, payload too long), BATON_XFER_EEXIST
 * (key already exported here), BATON_XFER_ESHUTDOWN, BATON_XFER_ENOMEM. (Earlier builds refused a
 * timeout in own-progress mode with BATON_XFER_ENOTSUP; it is accepted now.) */
BATON_API int baton_xfer_export(baton_xfer_engine_t *engine, const baton_xfer_export_t *ex,
                                baton_xfer_export_cb cb, void *data);

/* Holder: ends a waiting export now; its callback does not fire (the sources are free at
 * once). BATON_XFER_ENOTFOUND (no such export), BATON_XFER_EBUSY (a pull is being served: it
 * ends by its own rules and reports through the callback). */
BATON_API int baton_xfer_export_release(baton_xfer_engine_t *engine, uint64_t key);

/* Puller: baton_xfer_offer with offer->room_id = the holder's key (see above). */
BATON_API int baton_xfer_pull(baton_xfer_engine_t *engine, const char *host, int port,
                              const baton_xfer_offer_t *offer, baton_xfer_offer_cb cb, void *data);

/* ---- observability ------------------------------------------------------------------------ */

typedef struct {
    uint64_t bytes_written;   /* prefill side: payload bytes acknowledged in place */
    uint64_t bytes_received;  /* decode side: page bytes of rooms completed with DONE */
    uint64_t rooms_done;      /* rooms finished with DONE (either side) */
    uint64_t rooms_failed;    /* rooms finished with an error (either side) */
    uint64_t rooms_aborted;   /* of which aborts */
    uint64_t peers_up;        /* peers currently UP */
    uint64_t peers_down;      /* peers currently DOWN / CONNECTING */
    uint64_t reconnects;      /* successful re-handshakes after a failure */
    uint64_t frames_rejected; /* malformed / out-of-order frames (connections closed) */
    uint64_t writes_rejected; /* bounds/rkey violations refused by the receiver */
    /* Added after 0.1.0 (read with baton_xfer_engine_stats_sized): */
    uint64_t auth_failures;      /* control connections refused by the KV bootstrap's
                                  * challenge-response (no / wrong secret, replay, bad proof) */
    uint64_t pending_conns;      /* accepted control connections not UP yet (gauge) */
    uint64_t pending_bytes;      /* read-buffer bytes they hold (gauge, <= pending_buffer_bytes) */
    uint64_t conns_refused;      /* accepted connections closed over a pending cap or the budget */
    uint64_t staged_bytes;       /* device-memory bytes tcp copied through host bounce buffers
                                  * (sources and destinations) */
    uint64_t stage_buffer_bytes; /* pinned bounce-buffer bytes tcp holds now (gauge) */
    uint64_t peers;              /* decode-side peers the engine keeps, up or not (gauge) */
    uint64_t peers_forgotten;    /* peers dropped by baton_xfer_forget */
} baton_xfer_stats_t;

/* A snapshot of counters (relaxed atomics). Any thread. Fills the fields of 0.1 only (bytes_written
 * .. writes_rejected), so that programs built against 0.1's smaller struct keep working. */
BATON_API void baton_xfer_engine_stats(const baton_xfer_engine_t *engine,
                                       baton_xfer_stats_t *stats);
/* The same, filling min(size, sizeof(baton_xfer_stats_t)) bytes: pass sizeof(*stats). */
BATON_API void baton_xfer_engine_stats_sized(const baton_xfer_engine_t *engine,
                                             baton_xfer_stats_t *stats, size_t size);

#ifdef __cplusplus
}
#endif
#endif
