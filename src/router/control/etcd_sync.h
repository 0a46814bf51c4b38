/* etcd_sync.h — mirrors the worker set kept under an etcd prefix into the router's registry and
 * publishes the admin API's changes there (several routers, one worker set). */
#ifndef BATON_ROUTER_ETCD_SYNC_H
#define BATON_ROUTER_ETCD_SYNC_H

#include <stdint.h>
#include <uv.h>

#include "common/metrics.h"
#include "router/control/registry.h"

/*
 * Layout: every key under PREFIX/workers/ is one worker, its value the POST /workers body
 * (baton_admin_spec_json). Routers publish under PREFIX/workers/ID, ID being the registry's id
 * (derived from the worker URL, so every router computes the same key); a worker that registers
 * itself (baton-worker --register) puts PREFIX/workers/HOST:PORT on a lease, and the key, and
 * with it the worker, goes when the lease expires.
 *
 * What a router does:
 *   - on start and after any break: publishes its pending admin changes, reads the whole prefix
 *     (adds what is missing, removes what it had from etcd and is gone) and watches the prefix
 *     from the read's revision + 1, so no change between the read and the watch is lost; the
 *     router listens only once the first read is applied (or its time-out passed: etcd down);
 *   - several keys naming one URL are one worker, described by the newest of them and kept
 *     while any is left (a full read is applied oldest change first, as a watch sees them);
 *   - a removal through the admin API deletes every key that names the worker, the worker's
 *     own registration included, in one transaction: it is gone for every router;
 *   - applies watch events as they come (put: add or replace; delete: remove);
 *   - a compacted watch revision, a cancelled watch or a broken stream → the same resync;
 *   - every 2 s a linearizable count of the prefix (with the client's fail-over): when it fails,
 *     or another member than the watch's answers it, the watch may sit on a hung or partitioned
 *     member that sends nothing → the same resync, on a member that serves;
 *   - while etcd is unreachable it keeps its last set, retries with back-off (100 ms doubling
 *     to 2 s), logs it once per outage, and shows it in /readiness (registry shared state) and
 *     in baton_registry_etcd_up.
 * Workers from the command line or the config file are never removed by a resync; local health
 * and breaker state stay per router (they are not stored in etcd).
 *
 * Threading: create/start/close and every callback run on `loop` (the router's main loop). The
 * registry hooks it installs run on router threads and only queue the change (mutex + async).
 */

typedef struct baton_etcd_sync_s baton_etcd_sync_t;

typedef struct baton_etcd_sync_config_s {
    const char *url;      /* etcd[s]://host:port[,host:port...]/prefix */
    const char *user;     /* NULL = no authentication */
    const char *password; /* with user */
    uint64_t timeout_ms;  /* per etcd call and connect, TLS handshake included; 0 = 2000 */
    /* etcds:// only: the client TLS configuration (CA, client certificate), not owned; it must
     * outlive the sync. A handshake that fails counts as etcd unreachable (logged by the TLS
     * layer with its reason, and in /readiness as ETLS). */
    struct baton_tls_s *tls;
} baton_etcd_sync_config_t;

/* 0, or BATON_EINVAL (bad URL or etcds:// without tls, reason in err) / BATON_ENOMEM. metrics
 * may be NULL. */
int baton_etcd_sync_create(baton_etcd_sync_t **sync_p, uv_loop_t *loop, baton_registry_t *reg,
                           baton_metrics_t *metrics, const baton_etcd_sync_config_t *cfg, char *err,
                           size_t errlen);

/* Installs the registry hooks and starts the first resync (before the router threads start). */
void baton_etcd_sync_start(baton_etcd_sync_t *sync);

/* Runs the loop until the first full read of the prefix is applied (and the watch from its
 * revision started), or timeout_ms passed; 1 when it was read. A router that starts listening
 * only then answers its first request with etcd's whole worker set, and every change after
 * the read reaches it through the watch. */
int baton_etcd_sync_wait_listed(baton_etcd_sync_t *sync, uint64_t timeout_ms);

/* Stops watching and frees everything on later loop turns; pending publications are dropped.
 * The registry keeps its workers. */
void baton_etcd_sync_close(baton_etcd_sync_t *sync);

#endif
