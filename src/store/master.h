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
    const char *tls_cert, *tls_key, *tls_client_ca; /* the HTTP API over TLS (http/tls.h) */
    const char *kv_events_endpoint, *kv_events_replay_endpoint, *kv_events_medium;
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

typedef struct baton__mlog_s baton__mlog_t;
typedef struct baton__mkvev_s baton__mkvev_t;
typedef struct baton__parked_s baton__parked_t;

typedef struct {
    uv_loop_t *loop;
    baton__master_opts_t opts;
    baton__meta_t *meta;
    baton__mnode_t *nodes; /* by meta node index */
    size_t n_nodes;
    baton__slisten_t *ctrl;
    baton_http_server_t *http;
    uv_timer_t tick;
    uv_signal_t sigint, sigterm, sighup;
    uv_timer_t stop_timer; /* a graceful stop's bound */
    int stopping;
    struct baton_tls_s *http_tls; /* NULL: plain HTTP */
    char admin_token[256];
    uint64_t requests, refused_requests;
    uint64_t last_tick_ms;
    baton__elect_t *elect;   /* NULL: no --registry, always the leader */
    baton__mlog_t *log;      /* the operation log in etcd (with --registry) */
    baton__mkvev_t *kvev;    /* KV events (with --kv-events-endpoint) */
    baton__parked_t *parked; /* replies waiting for their records to reach etcd */
    int leader;              /* serving: elected (or no registry) and restored */
    uint64_t leader_acquired, acquired_ms, failover_ms;
    int exit_code;
} baton__master_t;

/* master.c: a node comes up (registration, or a restore from the log): known by id with the
 * same incarnation it is kept, otherwise it gets a fresh segment (a new incarnation loses what
 * the master knew of the old one). 0 or an error. */
int baton__master_node_up(baton__master_t *ms, const char *id, uint64_t incarnation,
                          const char *host, uint16_t xfer_port, uint16_t ctrl_port,
                          uint64_t seg_bytes, uint64_t now, int journal, uint32_t *node_p);
/* Stops serving and exits (the supervisor restarts this master as a standby). */
void baton__master_step_down(baton__master_t *ms, const char *why);

/* master_log.c: the operation log (docs/STORE.md, "Masters through etcd"). */
typedef struct {
    uint64_t queued, txns, ops, txn_ms, retries, pending;
    uint64_t restored_nodes, restored_objects, restored_putting, dropped, restore_ms;
} baton__mlog_stats_t;
typedef void (*baton__mlog_wait_cb)(void *arg, int status);
typedef void (*baton__mlog_done_cb)(baton__master_t *ms);
int baton__mlog_create(baton__master_t *ms, baton__mlog_t **l_p);
/* The metadata's journal callback (data: the master). */
void baton__mlog_journal(void *data, const baton__meta_rec_t *rec);
/* A node registered (up) or lost. */
void baton__mlog_node(baton__master_t *ms, uint32_t node, int up);
/* 1 when every record queued so far is in etcd (or there is no log): go on at once. 0: fn runs
 * once they are. */
int baton__mlog_wait(baton__master_t *ms, baton__mlog_wait_cb fn, void *arg);
/* Reads the log into the (empty) metadata, then done(ms). */
void baton__mlog_restore(baton__master_t *ms, baton__mlog_done_cb done);
void baton__mlog_stats(const baton__master_t *ms, baton__mlog_stats_t *st);

/* master_http.c: GET /health, /metrics, /batch_query_keys, over TLS with --tls-cert. 0 or an
 * error (logged). */
int baton__master_http_start(baton__master_t *ms);
/* SIGHUP: the certificate files are read again (new connections use them). */
void baton__master_http_reload(baton__master_t *ms);
void baton__master_http_stop(baton__master_t *ms);

/* `baton-store master ...`: runs until SIGINT / SIGTERM. The exit status. */
int baton__master_main(int argc, char **argv);

/* master_kvev.c: KV events for objects that hold a KV block (docs/STORE.md, "KV events"). */
struct json_t;
typedef struct {
    struct json_t *blocks; /* a PUT_START's blocks, validated; NULL: none */
} baton__mkvev_req_t;
typedef struct {
    uint64_t blocks, stored, removed, batches, overflows, send_failures;
} baton__mkvev_stats_t;
int baton__mkvev_start(baton__master_t *ms);
/* Validates a PUT_START's text (its blocks). 0 (out->blocks NULL when none) or EINVAL. */
int baton__mkvev_parse(const baton__sp_msg_t *req, baton__mkvev_req_t *out);
/* After a PUT_START: the blocks of the objects placed are kept by put id (req is consumed). */
void baton__mkvev_put_started(baton__master_t *ms, baton__mkvev_req_t *req,
                              const baton__sp_ritem_t *ritems);
/* The metadata's journal: a commit publishes BlockStored, a free BlockRemoved. */
void baton__mkvev_journal(baton__master_t *ms, const baton__meta_rec_t *rec);
/* An uncommitted object's block as the operation log keeps it ([hash, parent, [ids], lora]), or
 * NULL. */
struct json_t *baton__mkvev_block_json(baton__master_t *ms, uint64_t put_id);
/* A successor restored a committed object with its block: BlockStored again. */
void baton__mkvev_restored(baton__master_t *ms, uint64_t put_id, struct json_t *block);
/* This master starts leading: AllBlocksCleared first. */
void baton__mkvev_leading(baton__master_t *ms);
void baton__mkvev_stats(const baton__master_t *ms, baton__mkvev_stats_t *st);

#endif
