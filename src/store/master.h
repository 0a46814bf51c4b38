/* store/master.h — the baton-store master process: its state (the metadata, the nodes' addresses
 * and liveness, the listeners) shared by master.c (control requests) and master_http.c. */
#ifndef BATON_STORE_MASTER_H
#define BATON_STORE_MASTER_H

#include <stdint.h>

#include <uv.h>

#include "http/server.h"
#include "store/elect.h"
#include "store/meta.h"
#include "store/sconn.h"

typedef struct {
    const char *host;
    int port, http_port;
    const char *registry;
    uint64_t lease_ttl_ms;
    double high_watermark, evict_ratio;
    const char *secret_file, *admin_token_file;
    uint64_t node_timeout_ms; /* a node silent this long is lost (default 3000) */
    /* --namespace-quota NS=BYTES, repeatable */
    char quota_ns[16][BATON_STORE_NAMESPACE_MAX + 1];
    uint64_t quota_bytes[16];
    int n_quotas;
} baton__master_opts_t;

typedef struct {
    char host[BATON__SP_HOST_MAX + 1];
    uint16_t xfer_port, ctrl_port;
    uint64_t incarnation;
    uint64_t last_seen_ms;
    uint32_t seg;
    int alive;
} baton__mnode_t;

typedef struct {
    uv_loop_t *loop;
    baton__master_opts_t opts;
    baton__meta_t *meta;
    baton__mnode_t *nodes; /* by meta node index */
    size_t n_nodes;
    baton__slisten_t *ctrl;
    baton_http_server_t *http;
    uv_timer_t tick;
    uv_signal_t sigint, sigterm;
    char admin_token[256];
    uint64_t requests, refused_requests;
    uint64_t last_tick_ms;
    baton__elect_t *elect; /* NULL: no --registry, always the leader */
    int leader;
    int exit_code;
} baton__master_t;

/* master_http.c: GET /health, /metrics, /batch_query_keys. 0 or an error. */
int baton__master_http_start(baton__master_t *ms);

/* `baton-store master ...`: runs until SIGINT / SIGTERM. The exit status. */
int baton__master_main(int argc, char **argv);

#endif
