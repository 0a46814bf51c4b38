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
    uint32_t pending;
    int status;
} oobj_t;

typedef struct {
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
    char *text;       /* the request's text (a put's blocks), freed once sent */
    uint32_t text_len;
} op_t;

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
const baton__sp_node_t *baton__op_node(const op_t *op, uint32_t node);
uint64_t baton__slice_obj_off(const oobj_t *o, uint32_t s);
/* The control channel to a node's ctrl port (created on first use). */
baton__srpc_t *baton__client_node_rpc(baton_store_client_t *cl, const char *host, int port);

#endif
