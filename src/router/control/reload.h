/* reload.h — applying a re-read configuration to the running router's worker registry (SIGHUP):
 * the diff of the configured worker sets. */
#ifndef BATON_ROUTER_RELOAD_H
#define BATON_ROUTER_RELOAD_H

#include <stddef.h>

#include "router/control/config.h"
#include "router/control/registry.h"

/*
 * Workers come from two places: the configuration (file and command line) and the admin API.
 * A reload owns only the first kind: it compares the workers of the configuration applied
 * before (`prev`) with those of the new one (`next`), by normalized URL:
 *   - in next only                 → registered (a worker the API registered with that URL
 *                                    already is adopted as it is);
 *   - in prev only                 → removed from the registry, which starts its drain (no new
 *                                    requests; in-flight ones get --worker-drain-timeout-ms);
 *   - in both, attributes changed  → removed and registered again (the old object drains, the
 *     (role, bootstrap_port,         new one takes the new requests);
 *      api_key, model_id, priority,
 *      cost, labels)
 *   - in both, unchanged           → left alone (registered again if it was removed through
 *                                    the API meanwhile: the file says it should exist).
 * Workers registered through the API and absent from both configurations are never touched.
 * Connections are not dropped: requests in flight keep their worker references.
 *
 * Threading: call from one thread at a time (the main thread on SIGHUP); the registry is
 * thread-safe and the loops keep serving meanwhile.
 */

typedef struct baton_reload_result_s {
    size_t added, removed, changed, unchanged;
} baton_reload_result_t;

/* 0, or the first failure (BATON_ENOMEM, BATON_EINVAL) with the reason in err; the changes
 * made before it stay. `res` may be NULL. */
int baton_reload_workers(baton_registry_t *reg, const baton_config_t *prev,
                         const baton_config_t *next, baton_reload_result_t *res, char *err,
                         size_t errlen);

/* 1 when the two configured workers have the same attributes (URL compared normalized). */
int baton_reload_same_worker(const baton_config_worker_t *a, const baton_config_worker_t *b);

#endif
