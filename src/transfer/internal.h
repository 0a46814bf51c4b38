/* transfer/internal.h — libbaton's private types shared by engine, control channel and rooms. */
#ifndef BATON_TRANSFER_INTERNAL_H
#define BATON_TRANSFER_INTERNAL_H

#include <inttypes.h>
#include <stdatomic.h>
#include <stdint.h>

#include <uv.h>

#include "baton/transfer.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/list.h"
#include "common/log.h"
#include "common/phase.h"
#include "health/heartbeat.h"
#include "health/peer_state.h"
#include "transfer/ctrl_frame.h"
#include "transfer/transport.h"
#include "common/u64map.h"

/*
 * Threads and ownership
 * ---------------------
 * CALLER thread: the public API and every user callback. PROGRESS thread: the engine's own
 * loop (ploop): sockets, transports, timers, all protocol state. They talk through two queues
 * under one mutex: commands (caller -> progress, woken by cmd_async) and events (progress ->
 * caller, woken by caller_async). Each struct below says which thread owns which field.
 *
 * Objects that cross threads:
 *   baton__droom_t  decode room: built by the caller (offer), owned by the progress thread from
 *                   its OFFER command until its completion event, then freed by the caller.
 *   baton_xfer_room_s prefill room: refcounted (progress, caller, in-flight commands).
 *   baton__wreq_t   a write call: built by the caller, owned by the progress thread until its
 *                   WRITE_DONE event, then freed by the caller.
 */

#define BATON__MAX_TP 3

/* ---- commands and events ---------------------------------------------------------------- */

typedef enum {
    BATON__CMD_CONNECT = 1,
    BATON__CMD_OFFER,
    BATON__CMD_ABORT,
    BATON__CMD_WRITE,
    BATON__CMD_COMPLETE,
    BATON__CMD_PABORT,
    BATON__CMD_MEM_ADD,
    BATON__CMD_MEM_DEL,
    BATON__CMD_SHUTDOWN,
    BATON__CMD_GRANT,  /* pull by RDMA READ: u.grant (room_pull.c -> room_prefill.c) */
    BATON__CMD_SERVE,  /* baton_xfer_engine_serve: u.serve */
    BATON__CMD_FORGET, /* baton_xfer_forget: u.connect (host, port) */
} baton__cmd_type_t;

typedef struct baton__droom_s baton__droom_t;
typedef struct baton__wreq_s baton__wreq_t;
typedef struct baton__lmem_s baton__lmem_t;
typedef struct baton__conn_s baton__conn_t;
typedef struct baton__peer_s baton__peer_t;

typedef struct {
    int32_t status;
    int64_t first_token;
    uint16_t len;
    uint8_t payload[BATON_XFER_DONE_PAYLOAD_MAX];
} baton__done_copy_t;

/* A holder's grant of its source pages to a puller (pull by RDMA READ), caller -> progress. */
typedef struct {
    baton_xfer_room_t *room; /* ref held */
    baton__done_copy_t done;
    uint32_t n_pages;
    baton__offer_page_t pages[]; /* the sources, layer-major; mem_id: the holder's region */
} baton__grant_cmd_t;

typedef struct baton__cmd_s {
    baton_list_t link;
    baton__cmd_type_t type;
    int embedded; /* part of a droom / wreq: not freed by itself */
    union {
        struct {
            char host[256];
            int port;
        } connect;
        baton__droom_t *offer;
        uint64_t abort_room;
        baton__wreq_t *write;
        struct {
            baton_xfer_room_t *room;
            baton__done_copy_t done;
        } complete;
        struct {
            baton_xfer_room_t *room;
            int reason;
        } pabort;
        baton__lmem_t *mem_add;
        uint32_t mem_del;
        baton__grant_cmd_t *grant;
        struct {
            baton_xfer_serve_cb cb;
            void *data;
        } serve;
    } u;
} baton__cmd_t;

typedef enum {
    BATON__EV_OFFER_DONE = 1,
    BATON__EV_ROOM,
    BATON__EV_ROOM_CLOSED,
    BATON__EV_WRITE_DONE,
    BATON__EV_PEER,
    BATON__EV_CLOSED,
    BATON__EV_LAYER, /* u.droom; the layer is the event's index in droom->layer_evs */
    BATON__EV_WAKE,  /* own-progress mode: an export deadline is due (eng->wake_ev, embedded) */
} baton__ev_type_t;

typedef struct {
    char endpoint[300];
    char engine_id[BATON__ID_MAX + 1];
    uint64_t incarnation;
    baton_xfer_peer_state_t state;
    baton_xfer_transport_t transport;
    int reason;
    uint32_t reconnects;
} baton__peer_ev_t;

typedef struct baton__ev_s {
    baton_list_t link;
    baton__ev_type_t type;
    int status;
    int embedded;
    union {
        baton__droom_t *droom;
        baton_xfer_room_t *room;
        baton__wreq_t *wreq;
        baton__peer_ev_t peer;
    } u;
} baton__ev_t;

/* ---- memory ----------------------------------------------------------------------------- */

/* A registered region (caller thread). */
struct baton_xfer_mem_s {
    baton_xfer_engine_t *eng;
    uint32_t id;
    void *addr;
    size_t len;
    baton_xfer_mem_kind_t kind;
    int device;
    int memfd; /* -1 unless from baton_xfer_mem_alloc */
    uint64_t token;
    baton__tp_mr_t *mr[BATON__MAX_TP]; /* per engine transport index; NULL if it refused */
    atomic_int refs;                   /* open rooms / writes using it */
};

/* The progress thread's copy of a local region, announced to decode-role peers (MEM). */
struct baton__lmem_s {
    baton_list_t link;
    uint32_t id;
    uint64_t base, len;
    baton_xfer_mem_kind_t kind;
    int shm_ok;                 /* reachable over shm: memfd-backed, or CUDA (IPC) */
    uint8_t reg[BATON__MAX_TP]; /* registered with that engine transport */
    uint16_t blob_len[BATON__MAX_TP];
    uint8_t *blob[BATON__MAX_TP];
};

/* A peer's region as announced to us (prefill side, per connection). */
typedef struct {
    uint32_t id;
    uint64_t base, len;
    baton_xfer_mem_kind_t kind;
    int usable; /* the transport accepted its key (else pages in it are refused) */
} baton__rmem_t;

/* ---- rooms ------------------------------------------------------------------------------ */

/* A decode room's phases; only BATON__DR_MOVE changes them (the table is in room_decode.c):
 *   (new) -> QUEUED | SENT;  QUEUED -> SENT;  SENT -> ABORTING | READING | FAILING;
 *   READING -> SENT (the READ could not start) | FAILING.  ABORTING and FAILING end with the
 *   room's completion (it leaves the maps; no further move). */
typedef enum {
    BATON__DR_NEW = 0, /* allocated, not yet offered or queued */
    BATON__DR_QUEUED = 1,
    /* waiting for its peer to come UP */ /* waiting for its peer to come UP */
    BATON__DR_SENT,                       /* OFFER sent */
    BATON__DR_ABORTING,                   /* ABORT sent, waiting for ABORT_ACK / DONE / fence */
    BATON__DR_FAILING,                    /* its connection failed; completes after the fence */
    BATON__DR_READING, /* pull by RDMA READ: GRANT arrived, our READs are in flight */
    BATON__DR_N_STATES
} baton__droom_state_t;
extern const baton_phase_table_t baton__droom_phases;
#define BATON__DR_MOVE(dr, to)                                                                     \
    BATON_PHASE_MOVE(&baton__droom_phases, (dr)->state, (to), "room=%" PRIu64, (dr)->room_id)

typedef struct {
    uint64_t addr;
    uint64_t len;
    uint32_t mem_id;
    baton_xfer_mem_kind_t kind; /* of the region the page lies in */
} baton__dpage_t;

struct baton__droom_s {
    baton__cmd_t cmd;
    baton__ev_t ev;
    baton_xfer_engine_t *eng;
    uint64_t room_id;
    /* ppl counts the offered pages of a layer: the shape's pages_per_layer less first_page,
     * the pages the decode side already holds (not offered, never written) */
    uint32_t n_layers, ppl, n_pages, first_page;
    baton__dpage_t *pages;
    baton_xfer_mem_t **mems; /* distinct regions referenced (refs held) */
    size_t n_mems;
    uint64_t total_bytes;
    int shm_ok; /* every page reachable over shm (memfd or CUDA) */
    int cuda;   /* some page in device memory */
    baton_xfer_offer_cb cb;
    baton_xfer_layer_cb layer_cb; /* NULL: no layer events */
    baton__ev_t *layer_evs;       /* n_layers events when layer_cb is set (no malloc later) */
    uint8_t *layer_seen;          /* progress thread: LAYER_DONE received, per layer */
    void *data;
    char host[256];
    int port;
    /* progress thread */
    baton_list_t link; /* peer->queued or conn->drooms */
    baton__peer_t *peer;
    baton__conn_t *conn;
    baton__droom_state_t state;
    int abort_status; /* what an abort reports (EABORTED, ETIMEOUT) */
    uint64_t t_offer_ms;
    /* pull by RDMA READ (progress thread): the READ request over the holder's granted pages,
     * and the status an abort / timeout asked for while it ran (it ends with the READs) */
    baton__tp_write_t rd;
    baton__tp_sge_t *rd_sges;
    int read_abort;
    /* result, read by the caller with the event */
    int status;
    baton__done_copy_t done;
};

/* A prefill room's phases; only BATON__PR_MOVE changes them (the table is in room_prefill.c):
 *   (new) -> OPEN | CLOSED;  OPEN -> COMPLETING | ABORT_LOCAL | ABORT_PEER | GRANTED | CLOSED;
 *   COMPLETING -> ABORT_LOCAL | ABORT_PEER | CLOSED;  ABORT_LOCAL -> ABORT_PEER | CLOSED;
 *   ABORT_PEER -> ABORT_PEER (a repeated ABORT restates its reason) | CLOSED;
 *   GRANTED -> ABORT_PEER | CLOSED;  CLOSED is terminal. */
typedef enum {
    BATON__PR_NEW = 0, /* allocated, not yet announced */
    BATON__PR_OPEN = 1,
    BATON__PR_COMPLETING,  /* DONE waits for in-flight writes */
    BATON__PR_ABORT_LOCAL, /* our abort: ABORT waits for in-flight writes */
    BATON__PR_ABORT_PEER,  /* peer's ABORT: ABORT_ACK waits for in-flight writes */
    BATON__PR_CLOSED,
    BATON__PR_GRANTED, /* pull by RDMA READ: GRANT sent, the puller reads until READ_DONE */
    BATON__PR_N_STATES
} baton__proom_state_t;
extern const baton_phase_table_t baton__proom_phases;
#define BATON__PR_MOVE(room, to)                                                                   \
    BATON_PHASE_MOVE(&baton__proom_phases, (room)->state, (to), "room=%" PRIu64, (room)->room_id)

struct baton_xfer_room_s {
    atomic_int refs;
    baton_xfer_engine_t *eng;
    /* immutable once announced */
    uint64_t room_id;
    /* ppl: offered pages per layer; the shape has first_page more (cached on the decode side) */
    uint32_t n_layers, ppl, first_page;
    baton__offer_page_t *pages;
    char peer_id[BATON__ID_MAX + 1];
    baton_xfer_transport_t transport;
    int tp_index;
    /* caller thread */
    void *user;
    uint8_t *written;   /* per layer */
    int caller_ended;   /* complete/abort called */
    int caller_writes;  /* write calls whose callback has not run yet */
    int closed_pending; /* ROOM_CLOSED arrived while writes were outstanding */
    int closed_status;
    int pull;            /* served (or refused) by pull mode, not the application's (room_pull.c) */
    int served;          /* answered by the engine's serve callback: no caller reference, no
                          * events (room_prefill.c) */
    uint16_t peer_proto; /* the decode peer's HELLO proto (GRANT only to >= 4) */
    uint64_t granted_bytes; /* progress thread: bytes a GRANT offered (stats at READ_DONE) */
    /* progress thread */
    baton__conn_t *conn;
    baton__proom_state_t state;
    uint32_t inflight; /* transport writes started, not finished */
    int abort_reason;
    baton__done_copy_t done;
    baton__ev_t ev_room, ev_closed;
};

struct baton__wreq_s {
    baton__cmd_t cmd;
    baton__ev_t ev;
    baton__tp_write_t w;
    baton_xfer_room_t *room; /* ref held */
    uint32_t layer;
    baton_xfer_write_cb cb;
    void *data;
    baton_xfer_mem_t **mems; /* source regions (refs held) */
    size_t n_mems;
    void *cuda_event; /* start only once it completed (CUDA builds) */
    uint64_t bytes;
    baton__tp_sge_t sges[]; /* flexible */
};

/* ---- connections and peers (progress thread) --------------------------------------------- */

/* A control connection's phases; only BATON__CONN_MOVE changes them (table in ctrl_conn.c):
 *   (new) -> PENDING (accepted) | CONNECTING (decode);
 *   CONNECTING -> AUTH | HELLO;  PENDING -> AUTH | HELLO;  AUTH -> PENDING (prefill: proven,
 *   HELLO next) | HELLO (decode: proven, sends HELLO);  HELLO -> TP_CONNECT | UP;
 *   TP_CONNECT -> TP_CONNECT (the next transport) | UP;  every phase but CLOSING -> CLOSING. */
typedef enum {
    BATON__CONN_NEW = 0, /* allocated */
    BATON__CONN_PENDING = 1,
    /* accepted, first frame not seen yet */ /* accepted, first frame not seen yet */
    BATON__CONN_CONNECTING,                  /* decode: TCP connect under way */
    BATON__CONN_HELLO,                       /* HELLO sent (decode) / awaited (prefill) */
    BATON__CONN_TP_CONNECT,                  /* the chosen transport's peer_connect is under way */
    BATON__CONN_UP,
    BATON__CONN_CLOSING,
    BATON__CONN_AUTH, /* challenge-response under way (a shared secret is set; ctrl_auth.c) */
    BATON__CONN_N_STATES
} baton__conn_state_t;
extern const baton_phase_table_t baton__conn_phases;
#define BATON__CONN_MOVE(c, to)                                                                    \
    BATON_PHASE_MOVE(&baton__conn_phases, (c)->state, (to), "peer=%s", (c)->addr)

/* One side of the KV bootstrap's challenge-response (ctrl_auth.c). */
typedef struct {
    char id[BATON__ID_MAX + 1];
    uint64_t incarnation;
    uint64_t generation;
    uint8_t nonce[BATON__AUTH_NONCE];
} baton__auth_party_t;

struct baton__conn_s {
    baton_list_t link; /* eng->conns */
    baton_xfer_engine_t *eng;
    uv_tcp_t *tcp; /* malloc'd; freed in its close callback */
    uv_connect_t creq;
    int role; /* BATON__ROLE_DECODE: we connected; PREFILL: we accepted */
    baton__conn_state_t state;
    uint64_t gen;
    uint64_t remote_gen;
    uint64_t remote_inc;
    uint16_t remote_proto; /* the peer's HELLO proto (LAYER_DONE only to >= 2) */
    char remote_id[BATON__ID_MAX + 1];
    char addr[80]; /* the peer's "ip:port" */
    baton_buf_t rbuf;
    baton__peer_t *peer; /* decode side */
    int tp_index;        /* engine transport index of tp_peer, -1 none */
    baton__tp_peer_t *tp_peer;
    baton__tp_peer_t *cand[BATON__MAX_TP]; /* decode: per engine transport, during HELLO */
    int prefill_try;                       /* prefill: index into the peer's HELLO list */
    baton__hello_t *peer_hello;            /* prefill: copy kept while trying transports */
    uint8_t *peer_hello_buf;
    baton_u64map_t rooms; /* room id -> droom (decode) or room (prefill) */
    baton_u64map_t rmems; /* prefill: mem id -> rmem; decode: the holder's source regions */
    baton_u64map_t smems; /* prefill: our regions announced to this puller (MEM), id -> 1 */
    baton_heartbeat_t hb;
    uint64_t hb_seq;
    int fail_status;
    int pending; /* close/fence callbacks outstanding while CLOSING */
    int reported_up;
    int close_after_send; /* a refusal is on its way: close once it was written */
    uint64_t t_start_ms;
    /* KV bootstrap authentication (only with a shared secret): this side's nonce, the peer's
     * claimed identity and nonce, and whether the peer proved the secret. */
    uint8_t auth_nonce[BATON__AUTH_NONCE];
    baton__auth_party_t auth_peer;
    int authed;
    /* Accepted and not UP yet (ctrl_admit.c): counted against the listener's caps, its read
     * buffer (charged bytes) against the pending budget; ip is the peer's address alone. */
    int admitted;
    size_t charged;
    char ip[64];
};

struct baton__peer_s {
    baton_list_t link; /* eng->peers */
    baton_xfer_engine_t *eng;
    char host[256];
    int port;
    char endpoint[300];
    baton_peer_health_t health;
    baton__conn_t *conn; /* current attempt or UP connection */
    baton_list_t queued; /* drooms waiting for UP */
    char remote_id[BATON__ID_MAX + 1];
    uint64_t remote_inc;
    baton_xfer_transport_t transport;
    uv_getaddrinfo_t gai;
    int resolving;
    int forget; /* baton_xfer_forget: dropped once no room uses it (peer.c) */
};

/* ---- engine ----------------------------------------------------------------------------- */

struct baton_xfer_engine_s {
    baton_xfer_config_t cfg;
    char engine_id[BATON__ID_MAX + 1];
    char rdma_devices[256];
    uint64_t incarnation;
    baton_xfer_callbacks_t cbs;

    /* caller side */
    uv_loop_t *caller_loop; /* NULL: own-progress mode (evfd + api_lock instead) */
    uv_async_t caller_async;
    int evfd;             /* own-progress mode: readable while events are queued */
    uv_mutex_t api_lock;  /* own-progress mode: serializes every caller-side call (recursive) */
    baton_log_sink_t log; /* this engine's log destination (cfg.log_cb / log_level) */
    int has_log;          /* log differs from the process default */
    const baton_log_sink_t *create_prev_log; /* the creating thread's sink, during create */
    baton__cmd_t shutdown_fallback;          /* destroy must not fail for lack of memory */
    baton__ev_t closed_fallback;
    baton_xfer_mem_t **mems; /* sorted by address */
    size_t n_mems, cap_mems;
    uint32_t next_mem_id;
    baton_u64map_t caller_rooms; /* open decode room ids */
    baton_u64map_t exports;      /* pull mode: key -> export (room_pull.c), caller thread */
    /* Own-progress mode has no caller loop to run export timers: the caller thread publishes the
     * earliest export deadline (baton_now_ms, 0: none) and the progress thread's tick posts
     * wake_ev once it is due, which makes the engine fd readable; dispatch then expires the
     * exports (room_pull.c). wake_posted: wake_ev is queued (set by progress, cleared by the
     * dispatch that takes it), so the embedded event is never queued twice. */
    atomic_uint_fast64_t pull_due_ms;
    atomic_int wake_posted;
    baton__ev_t wake_ev;
    int destroying;
    baton_xfer_close_cb close_cb;
    void *close_data;
    uv_thread_t thread;
    int thread_started;

    /* queues */
    uv_mutex_t qlock;
    baton_list_t cmdq;
    baton_list_t evq;

    /* progress side */
    uv_loop_t ploop;
    uv_async_t cmd_async;
    uv_timer_t tick;
    uv_idle_t defer_idle;
    baton_list_t deferred;
    uv_tcp_t listener;
    int listening;
    atomic_int port;
    baton__tp_env_t env;
    int n_tp;
    baton__tp_t *tp[BATON__MAX_TP];
    baton__tp_caps_t caps[BATON__MAX_TP];
    baton_xfer_transport_t tp_ids[BATON__MAX_TP];
    baton_list_t peers;
    baton_list_t conns;
    baton_list_t lmems;
    baton_u64map_t drooms; /* every decode room the progress thread holds */
    uint64_t next_gen;
    int shutting_down;
    int closed_posted;
    int retiring; /* transport peers being fenced outside any connection */
    uint32_t tick_ms;
    /* Scratch for the HELLO being built (one per transport): per engine, so that two engines
     * never share it, and off the stack (12 KiB). */
    uint8_t hs_blobs[BATON__MAX_TP][BATON__TP_BLOB_MAX];
    baton_list_t cuda_waits; /* CUDA builds: writes waiting for their event, in arrival order */
    baton_xfer_serve_cb serve_cb; /* baton_xfer_engine_serve (progress thread only) */
    void *serve_data;

    /* statistics (any thread, relaxed) */
    atomic_uint_fast64_t st_bytes_written, st_bytes_received, st_rooms_done, st_rooms_failed,
        st_rooms_aborted, st_peers_up, st_peers_down, st_reconnects, st_frames_rejected,
        st_writes_rejected, st_auth_failures, st_conns_refused;
    /* Pending connections (ctrl_admit.c; written on the progress thread, read by stats). */
    atomic_uint_fast64_t st_pending_conns, st_pending_bytes;
    /* Device memory staged through the tcp transport's bounce buffers (tcp_stage.c). */
    atomic_uint_fast64_t st_staged_bytes, st_stage_buffer_bytes;
    /* Decode-side peers kept, and those dropped by baton_xfer_forget (peer.c). */
    atomic_uint_fast64_t st_peers, st_peers_forgotten;

    /* KV bootstrap authentication: the shared secret (a copy; secret_len 0: none) and the
     * rate limit of refusal lines (progress thread). */
    uint8_t secret[BATON_XFER_SECRET_MAX];
    size_t secret_len;
    uint64_t auth_log_window_ms, auth_log_suppressed;
    unsigned auth_log_lines;
};

/* ---- engine.c ---------------------------------------------------------------------------- */
/* Brackets every caller-side public call: takes the engine lock in own-progress mode and routes
 * the thread's log lines to the engine's sink; leave restores both. */
typedef struct {
    const baton_log_sink_t *prev_log;
} baton__api_scope_t;
void baton__api_enter(baton_xfer_engine_t *eng, baton__api_scope_t *scope);
void baton__api_leave(baton_xfer_engine_t *eng, baton__api_scope_t *scope);
/* Evaluates `call` (an expression with a value) between api_enter and api_leave. */
#define BATON__LOCKED(eng, call)                                                                   \
    __extension__({                                                                                \
        baton__api_scope_t scope_;                                                                 \
        baton__api_enter((eng), &scope_);                                                          \
        __typeof__(call) ret_ = (call);                                                            \
        baton__api_leave((eng), &scope_);                                                          \
        ret_;                                                                                      \
    })
/* Caller thread: queue a command for the progress thread. */
void baton__cmd_post(baton_xfer_engine_t *eng, baton__cmd_t *cmd);
/* Progress thread: queue an event for the caller loop. */
void baton__ev_post(baton_xfer_engine_t *eng, baton__ev_t *ev);
void baton__post_peer_event(baton_xfer_engine_t *eng, const char *endpoint, const char *engine_id,
                            uint64_t inc, baton_xfer_peer_state_t st, baton_xfer_transport_t tp,
                            int reason, uint32_t reconnects);
int baton__tp_index(const baton_xfer_engine_t *eng, baton_xfer_transport_t id);
void baton__maybe_finish_shutdown(baton_xfer_engine_t *eng);
void baton__room_unref(baton_xfer_room_t *room);

/* ---- ctrl_conn.c -------------------------------------------------------------------------- */
baton__conn_t *baton__conn_new(baton_xfer_engine_t *eng, int role);
/* Starts reading frames on conn->tcp. */
int baton__conn_start_read(baton__conn_t *conn);
/* Sends the frames encoded in buf (takes its storage). Errors fail the connection. */
void baton__conn_send(baton__conn_t *conn, baton_buf_t *buf);
/* Fails the connection once: logs why, closes it, fences its transport, then fails its rooms
 * (decode rooms after the fence) with `status`. */
void baton__conn_fail(baton__conn_t *conn, int status, const char *why);
void baton__conn_tick(baton__conn_t *conn, uint64_t now);
/* The next frame at at[0..len) of conn's read buffer, judged by conn's state: 1 incomplete, 0
 * decoded (*consumed set), 2 a type this state does not take (f->type set, judged from the
 * header alone: nothing of its body needs to have arrived), or baton__frame_decode's errors. */
int baton__conn_next_frame(const baton__conn_t *conn, const uint8_t *at, size_t len,
                           baton__frame_t *f, size_t *consumed, const char **why);
void baton__listener_accept(uv_stream_t *server, int status);

/* ---- ctrl_admit.c ------------------------------------------------------------------------ */
/* An accepted connection (its ip filled) joins the pending ones: 0, or BATON_EBUSY with a
 * static reason when a cap says no (the caller closes it; counted in conns_refused). */
int baton__admit_accept(baton__conn_t *conn, const char **why);
/* rbuf room for the next read: a pending connection gets a small step charged to the budget
 * (BATON_EBUSY past it), any other one 64 KiB uncharged. */
int baton__admit_reserve(baton__conn_t *conn);
/* The connection is no longer pending (UP, handed to a transport, or finished). Idempotent. */
void baton__admit_release(baton__conn_t *conn);

/* ---- ctrl_handshake.c --------------------------------------------------------------------- */
void baton__hs_decode_start(baton__conn_t *conn);
int baton__hs_on_hello(baton__conn_t *conn, const baton__hello_t *h);
/* Hands an accepted connection that said LANE_HELLO to its transport; returns 1 when conn is
 * gone (freed, its socket now the transport's). */
int baton__hs_on_lane_hello(baton__conn_t *conn, const baton__frame_t *f, const uint8_t *rest,
                            size_t rest_len);
void baton__hs_announce_mem(baton__conn_t *conn, const baton__lmem_t *m);
int baton__hs_on_mem(baton__conn_t *conn, const baton__mem_t *m);
int baton__hs_on_mem_del(baton__conn_t *conn, uint32_t mem_id);

/* ---- peer.c (decode side) ---------------------------------------------------------------- */
baton__peer_t *baton__peer_get(baton_xfer_engine_t *eng, const char *host, int port, int create);
void baton__peer_demand(baton__peer_t *peer);
void baton__peer_on_up(baton__peer_t *peer, baton__conn_t *conn);
void baton__peer_on_conn_failed(baton__peer_t *peer, baton__conn_t *conn, int status,
                                const char *why);
void baton__peer_tick(baton__peer_t *peer, uint64_t now);
void baton__peer_free(baton__peer_t *peer);
/* baton_xfer_forget: drops the peer now when no room uses it, else marks it for the tick. */
void baton__peer_forget(baton__peer_t *peer);
/* The tick: 1 when a peer marked for forgetting was dropped (it is freed). */
int baton__peer_forget_due(baton__peer_t *peer);

/* ---- room_decode.c ------------------------------------------------------------------------ */
void baton__droom_submit(baton_xfer_engine_t *eng, baton__droom_t *dr);
void baton__droom_send(baton__conn_t *conn, baton__droom_t *dr);
/* Completes a decode room (posts its event); the caller must have fenced it. */
void baton__droom_finish(baton__droom_t *dr, int status);
void baton__droom_abort(baton_xfer_engine_t *eng, uint64_t room_id, int status);
int baton__droom_on_done(baton__conn_t *conn, const baton__done_t *d);
int baton__droom_on_abort(baton__conn_t *conn, uint64_t room_id, int reason);
int baton__droom_on_abort_ack(baton__conn_t *conn, uint64_t room_id);
int baton__droom_on_layer_done(baton__conn_t *conn, uint64_t room_id, uint32_t layer);
/* Pull by RDMA READ: the holder granted its pages; READ them (room_decode.c). */
int baton__droom_on_grant(baton__conn_t *conn, const baton__grant_t *g);
void baton__droom_tick(baton_xfer_engine_t *eng, uint64_t now);
int baton__resolve_dst(baton__tp_peer_t *tpp, uint64_t room_id, uint32_t page, uint64_t addr,
                       uint64_t len, void **dst_p, baton_xfer_mem_kind_t *kind_p);
void baton__placed(baton__tp_peer_t *tpp, uint64_t room_id, uint64_t len);

/* ---- room_prefill.c ----------------------------------------------------------------------- */
int baton__proom_on_offer(baton__conn_t *conn, const baton__offer_t *o);
int baton__proom_on_abort(baton__conn_t *conn, uint64_t room_id, int reason);
/* Pull by RDMA READ: sends the source regions' MEM frames and GRANT (takes g). */
void baton__proom_grant(baton_xfer_engine_t *eng, baton__grant_cmd_t *g);
int baton__proom_on_read_done(baton__conn_t *conn, uint64_t room_id, int status);
void baton__proom_write(baton_xfer_engine_t *eng, baton__wreq_t *wr);
/* baton_xfer_engine_serve on the progress thread. */
void baton__proom_set_serve(baton_xfer_engine_t *eng, baton_xfer_serve_cb cb, void *data);
void baton__proom_complete(baton_xfer_engine_t *eng, baton_xfer_room_t *room,
                           const baton__done_copy_t *done);
void baton__proom_abort(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int reason);
/* The connection is gone (after its fence): close every room with status. */
void baton__proom_close_all(baton__conn_t *conn, int status);
void baton__proom_cuda_tick(baton_xfer_engine_t *eng);

/* ---- mem.c ------------------------------------------------------------------------------- */
/* Caller thread: the region holding [addr, addr+len), or NULL. */
baton_xfer_mem_t *baton__mem_find(baton_xfer_engine_t *eng, const void *addr, uint64_t len);
void baton__mem_dereg_all(baton_xfer_engine_t *eng);
void baton__mem_free_all(baton_xfer_engine_t *eng);
void baton__lmem_free(baton__lmem_t *m);

#define BATON__LOG "xfer"

/* ---- room_pull.c: pull mode, on the caller thread from the event dispatch ---- */

/* An offer arrived: 1 when it is a pull of an export here (served or refused), else 0. */
int baton__pull_on_room(baton_xfer_engine_t *eng, baton_xfer_room_t *room);
/* A room closed: 1 when it was a pull (the export's callback fired), else 0. */
int baton__pull_on_closed(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int status);
/* Destroy: exports still waiting are dropped without their callbacks. */
void baton__pull_drop_all(baton_xfer_engine_t *eng);
/* Own-progress mode, from dispatch (EV_WAKE): ends the exports whose deadline passed with
 * BATON_ETIMEOUT and publishes the next deadline. */
void baton__pull_on_wake(baton_xfer_engine_t *eng);

/* ---- KV bootstrap authentication (ctrl_auth.c) ------------------------------------------- */

/* Decode side, connected: sends the CHALLENGE (state AUTH); HELLO follows a good RESPONSE. */
void baton__auth_decode_start(baton__conn_t *c);
/* An AUTH frame on c. 0, or an error that closes c (a refusal closes it itself and returns 0). */
int baton__auth_on_frame(baton__conn_t *c, const baton__auth_t *a);
/* Before a HELLO is acted on: 1 when it may be (no secret, or it comes from the authenticated
 * engine); 0 when c was refused (closed, counted). */
int baton__auth_check_hello(baton__conn_t *c, const baton__hello_t *h);
/* Counts, logs (rate-limited) and closes c with BATON_EAUTH. */
void baton__auth_refused(baton__conn_t *c, const char *reason);
/* HMAC-SHA-256(key, label NUL | d.nonce | p.nonce | d's id, inc, gen | p's id, inc, gen). */
int baton__auth_mac(const uint8_t *key, size_t key_len, const char *label,
                    const baton__auth_party_t *d, const baton__auth_party_t *p,
                    uint8_t mac[BATON__AUTH_MAC]);
/* Decode side: HELLO with this engine's transports (after authentication, or at once). */
void baton__hs_decode_hello(baton__conn_t *c);

#endif
