/* worker_models.h — which models a worker serves (its model_id, else what its own /v1/models
 * lists) and the model pools a request's `model` selects. */
#ifndef BATON_ROUTER_WORKER_MODELS_H
#define BATON_ROUTER_WORKER_MODELS_H

#include <stddef.h>

#include <jansson.h>

#include "router/control/registry.h"

/*
 * A worker's models: its registered model_id when it has one; otherwise the ids its own
 * GET /v1/models listed at its last successful health check (a vLLM worker lists its LoRA
 * adapters there too, so they are routable by name). A worker with neither is "unnamed".
 *
 * The pool of a request for model M (baton_models_classify):
 *   - no `model` in the request             → every worker (BATON_POOL_ANY);
 *   - some registered worker serves M        → the workers that serve M (BATON_POOL_NAMED);
 *   - none does, and the workers name at most one model between them (a single-model
 *     deployment)                            → every worker, as without a model: the worker
 *                                              judges the name (BATON_POOL_ANY);
 *   - none does, several models are named, and some workers are unnamed
 *                                            → the unnamed workers (BATON_POOL_UNNAMED);
 *   - otherwise                              → no worker: 404 model_not_found
 *                                              (BATON_POOL_UNKNOWN).
 * Threading: thread-safe (the found lists are written by the health checker's loop and read
 * by every request loop, under one lock).
 */

typedef enum {
    BATON_POOL_ANY = 0,
    BATON_POOL_NAMED,
    BATON_POOL_UNNAMED,
    BATON_POOL_UNKNOWN,
} baton_model_pool_t;

/* 1 when w serves `model` (its model_id, or a found id, equals it). */
int baton_worker_serves(const baton_worker_t *w, const char *model);
/* 1 when w has a model_id or a found list. */
int baton_worker_named(const baton_worker_t *w);
/* 1 when w belongs to the pool (BATON_POOL_ANY: always). */
int baton_worker_in_pool(const baton_worker_t *w, baton_model_pool_t pool, const char *model);

/* Sets w's found list from an OpenAI model list body ({"data":[{"id":...},...]}). 0, or
 * BATON_EINVAL (the body is not such a list: the previous list is kept) or BATON_ENOMEM. At
 * most 256 ids of at most 256 bytes each are kept. */
int baton_worker_models_found(baton_worker_t *w, const char *body, size_t len);

/* The pool of a request for `model` (NULL: none given), by the rule above, over the
 * registered workers (every role, draining ones aside). */
baton_model_pool_t baton_models_classify(baton_registry_t *reg, const char *model);

/* The union of the registered workers' models as an OpenAI list's "data" array (sorted by id,
 * each {"id","object":"model","created":0,"owned_by":"baton"}); *unnamed (may be NULL) is set
 * to how many workers are unnamed. NULL when out of memory. */
json_t *baton_models_union(baton_registry_t *reg, size_t *unnamed);

/* 1 when a registered worker serves `model` (the model label of metrics is bounded by it). */
int baton_models_known(baton_registry_t *reg, const char *model);

#endif
