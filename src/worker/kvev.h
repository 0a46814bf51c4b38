/* kvev.h — baton-worker's KV-event publisher: its prefix cache's pages published as vLLM's
 * BlockStored / BlockRemoved events (medium "GPU", its only tier) on a ZMQ PUB socket, with a
 * replay socket, through src/kvevents. Private to src/worker. */
#ifndef BATON_WORKER_KVEV_H
#define BATON_WORKER_KVEV_H

#include <uv.h>

#include "worker/prefix_cache.h"

typedef struct wk_kvev_s wk_kvev_t;

/* Binds endpoint (and replay_endpoint when not NULL) and observes pc. 0, or -1 with the reason
 * logged. */
int wk_kvev_create(wk_kvev_t **out, uv_loop_t *loop, wk_pcache_t *pc, uint32_t page_tokens,
                   const char *endpoint, const char *replay_endpoint);
/* The PUB (replay 0) or replay (1) endpoint as bound (a wildcard port resolved); "" for none. */
const char *wk_kvev_endpoint(const wk_kvev_t *k, int replay);
/* Publishes the events gathered since the last flush as one batch (nothing when none). */
void wk_kvev_flush(wk_kvev_t *k);
/* Closes the sockets; the handles close on the loop, then k is freed. NULL is ignored. */
void wk_kvev_destroy(wk_kvev_t *k);

#endif
