/* store/client_int.h — the store client's private types, shared by client.c (life time, exists,
 * remove, shared helpers) and client_data.c (put and get). */
#ifndef BATON_STORE_CLIENT_INT_H
#define BATON_STORE_CLIENT_INT_H

#include "store/sconn.h"

typedef struct {
    char host[BATON__SP_HOST_MAX + 1];
    int port;
    baton__srpc_t *rpc;
} node_rpc_t;

typedef struct loc_s loc_t;                   /* a located object (client_cache.c) */
typedef struct baton__inode_s baton__inode_t; /* a node's inline-read connection */
typedef struct op_s op_t;
typedef struct baton__own_s baton__own_t; /* own-progress mode (client_own.c) */

struct baton_store_client_s {
    uv_loop_t *loop;
    baton_xfer_engine_t *eng;
    baton__sconn_opts_t so;
    uint8_t secret[BATON_XFER_SECRET_MAX];
    char ns[BATON_STORE_NAMESPACE_MAX + 1];
    char host[BATON__SP_HOST_MAX + 1];
    char id[BATON__SP_ID_MAX + 1];
    uint32_t timeout_ms;
    baton__srpc_t *master;
    struct baton__resolver_s *resolver; /* "etcd://" masters: the leader is looked up there */
    node_rpc_t *nodes;
    size_t n_nodes;
    uint32_t room_seq;
    uint64_t key_seq;
    baton__own_t *own; /* own-progress mode: the client's thread and queues, else NULL */
    loc_t **locs;      /* the location cache: n_locs slots (a power of two), 0: off */
    uint32_t n_locs;
    uv_mutex_t loc_lock; /* the cache's entries (own-progress: the host's threads read them) */
    atomic_uint_fast64_t master_epoch; /* baton__srpc_epoch(master), readable on any thread */
    /* inline reads (client_inline.c), on whichever thread calls get (see store.h) */
    uint32_t inline_max;    /* gets up to this many bytes are read inline (0: never) */
    uv_mutex_t inline_lock; /* the nodes' list and their idle connections */
    baton__inode_t *inodes; /* a node read inline: its idle connections, its back-off */
    atomic_uint_fast64_t inline_reads, inline_fallbacks;
    atomic_uint_fast32_t inline_req;
    op_t *later; /* gets finished inside the call, their callbacks next iteration */
    uv_idle_t *later_idle;
    size_t ops;
    int closing;
    uv_timer_t close_timer;
    baton_store_close_cb close_cb;
    void *close_data;
};

/* One object of an operation. */
typedef struct {
    char key[BATON_STORE_KEY_MAX + 1];
    uint8_t *addr;
    uint64_t len, obj_len;
    uint32_t crc;
    uint64_t put_id;
    uint32_t lease_ms;
    uint32_t n_replicas, n_slices;
    baton__slice_t *slices; /* replica-major */
    uint32_t *slice_try;    /* get: the replica each slice is read from */
    baton__sp_node_t
        *nodes; /* from the location cache: the nodes its slices name (else the op's) */
    uint32_t n_nodes;
    uint64_t lease_start_ms; /* get: the lease runs from here (before the request that got it) */
    int verified;            /* get: the checksum was checked (an inline read) */
    uint32_t pending;
    int status;
} oobj_t;

struct op_s {
    baton_store_client_t *cl;
    uint8_t type;
    size_t n;
    oobj_t *o;
    baton_store_result_t *res;
    baton_store_batch_cb cb;
    void *data;
    uint64_t start_ms;
    uint32_t replicas, flags;
    baton__sp_node_t *nodes; /* the node table of the master's reply */
    uint32_t n_nodes;
    uint32_t pending; /* transfers, then the commit / revoke calls */
    int cached;       /* get: started from the location cache, without the master */
    int small;        /* get: the objects found total at most inline_max bytes (read inline) */
    char *text;       /* the request's text (a put's blocks), freed once sent */
    uint32_t text_len;
    op_t *later_next; /* on the client's list of ops finished inside the call */
};

op_t *baton__op_new(baton_store_client_t *cl, uint8_t type, size_t n, baton_store_batch_cb cb,
                    void *data);
/* Reports the op (status != 0: for every object) and frees it. */
void baton__op_finish(op_t *op, int status);
int baton__op_copy_keys(op_t *op, const char *const *keys, const baton_store_obj_t *objs);
/* A request naming every object of the op; *items_p is the caller's to free. */
int baton__op_request(op_t *op, baton__sp_msg_t *m, baton__sp_item_t **items_p);
int baton__op_take_placement(op_t *op, oobj_t *o, const baton__sp_msg_t *r,
                             const baton__sp_ritem_t *it);
int baton__op_keep_nodes(op_t *op, const baton__sp_msg_t *r);
/* Copies the keys (and, for puts and gets, the buffers) and sends the op's request to the master
 * with cb for its reply (replicas and flags from the op). On failure the op never started: it is
 * freed without a callback and the error returned. */
int baton__op_send(op_t *op, const char *const *keys, const baton_store_obj_t *objs,
                   baton__srpc_cb cb);
/* The status of a master's reply to the op: the call's, else the reply's, else EPROTO when it
 * does not have one item per object. */
int baton__op_reply_status(const op_t *op, int status, const baton__sp_msg_t *r);
/* The address of `node` for object o of op: from o's cached table, else the master's reply. */
const baton__sp_node_t *baton__op_node(const op_t *op, const oobj_t *o, uint32_t node);
/* Frees an object's placement (slices, replica choice, cached nodes) and clears it. */
void baton__obj_reset(oobj_t *o);

/* Frees what the client still holds (after its close callback). */
void baton__client_free(baton_store_client_t *cl);

/* ---- own-progress mode (client_own.c) ---- */
/* Sets the mode up (its loop in *loop_p, the engine's fd polled there); _run starts the thread,
 * _abort undoes a start whose client could not be made. */
int baton__own_start(baton_store_client_t *cl, uv_loop_t **loop_p);
int baton__own_run(baton_store_client_t *cl);
void baton__own_abort(baton_store_client_t *cl);
/* 1 on the client's own thread. */
int baton__own_here(const baton_store_client_t *cl);
/* A call from another thread, posted to the client's (type: BATON__SP_PUT_START, _GET, _EXISTS,
 * _REMOVE); its callback later runs in baton_store_client_dispatch. */
int baton__own_post(baton_store_client_t *cl, int type, const baton_store_obj_t *objs,
                    const char *const *keys, size_t n, const baton_store_put_opts_t *opts,
                    baton_store_batch_cb cb, void *data);
int baton__own_destroy(baton_store_client_t *cl, baton_store_close_cb close_cb, void *data);

/* ---- the location cache (client_cache.c) ---- */
int baton__loc_init(baton_store_client_t *cl, uint32_t entries);
void baton__loc_free(baton_store_client_t *cl);
/* Remembers where o lies (its placement, lease and checksum) while the master connection that
 * granted the lease stays up. */
void baton__loc_put(baton_store_client_t *cl, const op_t *op, const oobj_t *o);
/* Fills o's placement from the cache when its lease leaves room for the read: 0, else -1. */
int baton__loc_take(baton_store_client_t *cl, oobj_t *o, uint64_t now_ms);
void baton__loc_drop(baton_store_client_t *cl, const char *key);
uint64_t baton__slice_obj_off(const oobj_t *o, uint32_t s);
/* ---- inline reads (client_inline.c) ---- */
/* Reads object o of a small op (its placement and checksum known) over the nodes' control ports
 * on this thread, checksum included: 0 with the bytes in o->addr, else -1 (the engine path must
 * read it; the buffer may hold anything meanwhile). */
int baton__inline_read(baton_store_client_t *cl, const op_t *op, oobj_t *o);
void baton__inline_free(baton_store_client_t *cl);
/* Own-progress mode, on a host's thread: the get read wholly inline from the location cache on
 * this thread, its completion queued for dispatch: 0; -1 when it could not be (nothing was
 * queued: post the call to the client's thread). */
int baton__inline_get_here(baton_store_client_t *cl, const baton_store_obj_t *objs, size_t n,
                           baton_store_batch_cb cb, void *data);
/* Queues a completion for the host's dispatch (own-progress mode, any thread). */
int baton__own_complete(baton_store_client_t *cl, const baton_store_result_t *res, size_t n,
                        size_t prefix, baton_store_batch_cb cb, void *data);
/* Finishes op (status 0, or ESHUTDOWN once closing) on the loop's next iteration. */
int baton__op_finish_later(op_t *op);
void baton__later_close(baton_store_client_t *cl);

/* The control channel to a node's ctrl port (created on first use). */
baton__srpc_t *baton__client_node_rpc(baton_store_client_t *cl, const char *host, int port);

#endif
