/* store/sconn.h — baton-store's framed, authenticated control connections (master, node and
 * client ends), and the request/reply channel (srpc) that clients and nodes call through. */
#ifndef BATON_STORE_SCONN_H
#define BATON_STORE_SCONN_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "store/proto.h"

typedef struct baton__sconn_s baton__sconn_t;
typedef struct baton__slisten_s baton__slisten_t;

/* A frame arrived on an authenticated connection; `m` is freed when the callback returns. */
typedef void (*baton__sconn_msg_cb)(baton__sconn_t *c, baton__sp_msg_t *m, void *data);
/* ready: status 0 (connected and, with a secret, authenticated). closed: fires once, with why
 * (0 after baton__sconn_close(c, 0)); the connection is freed after it returns. */
typedef void (*baton__sconn_event_cb)(baton__sconn_t *c, int status, void *data);

typedef struct {
    uv_loop_t *loop;
    const uint8_t *secret; /* NULL: none (copied) */
    size_t secret_len;
    const char *id;        /* this end's id in the handshake (copied) */
    uint32_t max_body;     /* frames with a longer body close the connection */
    uint32_t handshake_ms; /* connect + authentication must end within this (default 5000) */
    /* 0: unbounded. Else, when more than this many bytes wait to be sent to the peer, its
     * frames stop being read until half of them are sent (a client that asks without reading
     * the answers costs the loop nothing and the process at most this much memory). */
    uint32_t max_queued;
    baton__sconn_msg_cb on_msg;
    baton__sconn_event_cb on_ready, on_close;
    void *data;
} baton__sconn_opts_t;

int baton__sconn_connect(const baton__sconn_opts_t *o, const char *host, int port,
                         baton__sconn_t **c_p);
/* Encodes and queues m. 0, BATON_XFER_ECANCELED (closing), BATON_XFER_EINVAL, ENOMEM. */
int baton__sconn_send(baton__sconn_t *c, const baton__sp_msg_t *m);
void baton__sconn_close(baton__sconn_t *c, int reason);
void baton__sconn_set_data(baton__sconn_t *c, void *data);
void *baton__sconn_get_data(const baton__sconn_t *c);
/* The peer's address "ip" (accepted connections), for logs and replies. */
const char *baton__sconn_peer_ip(const baton__sconn_t *c);

/* Listens; every accepted connection gets a copy of `o` (its data: o->data). *port_p: bound. */
int baton__slisten_start(const baton__sconn_opts_t *o, const char *host, int port, int *port_p,
                         baton__slisten_t **l_p);
void baton__slisten_close(baton__slisten_t *l);
/* Accepted connections refused (bad frame, failed authentication, handshake time-out). */
uint64_t baton__slisten_refused(const baton__slisten_t *l);
/* Times an accepted connection stopped being read because its unsent bytes passed max_queued. */
uint64_t baton__slisten_paused(const baton__slisten_t *l);

/* The handshake's MAC (libbaton's transcript over both ids and nonces, the store's labels): the
 * listener's proof (listener 1) or the connector's (0). For connections made without sconn (the
 * client's blocking inline reads, client_inline.c), so both speak the one handshake. */
int baton__sconn_auth_mac(const uint8_t *secret, size_t secret_len, int listener,
                          const char *conn_id, const uint8_t *conn_nonce, const char *lis_id,
                          const uint8_t *lis_nonce, uint8_t *mac);
/* Constant-time comparison of two BATON__SP_MAC-byte MACs: 1 when equal. */
int baton__sconn_mac_equal(const uint8_t *a, const uint8_t *b);

/* ---- srpc: calls to one "host:port" with replies matched by request id ------------------------
 */

typedef struct baton__srpc_s baton__srpc_t;
/* status: 0 with the reply (freed after the callback), or why there is none (time-out, the
 * connection failed: BATON_STORE_ENOLEADER for the master, BATON_XFER_EPEERDOWN for a node). */
typedef void (*baton__srpc_cb)(void *data, int status, baton__sp_msg_t *reply);

/* Connects on demand and again after a failure (the next call reconnects: nothing to restart). */
int baton__srpc_create(const baton__sconn_opts_t *o, const char *host, int port, int down_status,
                       baton__srpc_t **r_p);
/* Looks the target up with `resolver` (not owned; it must outlive r) before each connection,
 * and drops the connection after a BATON_STORE_ENOLEADER reply (a standby master). */
struct baton__resolver_s;
void baton__srpc_set_resolver(baton__srpc_t *r, struct baton__resolver_s *resolver);
/* Sends m (its req_id is set here); cb fires exactly once, never inside this call. */
int baton__srpc_call(baton__srpc_t *r, baton__sp_msg_t *m, uint32_t timeout_ms, baton__srpc_cb cb,
                     void *data);
/* Identifies the connection now up (odd, changes whenever it goes down or another comes up), or 0
 * while none is: what a reply said about the peer's state holds at most as long as this stays. */
uint64_t baton__srpc_epoch(const baton__srpc_t *r);
/* Keeps *out equal to baton__srpc_epoch(r) (atomically: other threads may read it) until r is
 * freed; its last value is 0. */
void baton__srpc_mirror_epoch(baton__srpc_t *r, atomic_uint_fast64_t *out);
/* Fails every pending call with BATON_XFER_ESHUTDOWN (their callbacks may run inside this call),
 * closes; freed once closed. */
void baton__srpc_destroy(baton__srpc_t *r);

/* Reads a shared secret file (its bytes less one trailing newline). 0 or -1 (logged). */
int baton__store_read_secret(const char *path, uint8_t *buf, size_t cap, size_t *len_p);

#endif
