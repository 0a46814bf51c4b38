/* models.h — the router's own answers about models: the union list, one model, and the
 * 404 model_not_found for a model no worker serves (worker_models.h has the pool rule). */
#ifndef BATON_ROUTER_MODELS_H
#define BATON_ROUTER_MODELS_H

#include "http/server.h"
#include "router/dataplane/pdreq.h"
#include "router/dataplane/proxy.h"

/* 1 when the request's model is served by no worker (BATON_POOL_UNKNOWN): req was answered
 * 404 model_not_found in the OpenAI shape; else 0 (req untouched). */
int baton_models_refuse(baton_router_t *r, baton_http_req_t *req, const char *route,
                        const baton_pdreq_t *pd);

/* GET /v1/models: the union of the workers' models when any worker is named; else (every
 * worker unnamed) forwarded to a worker as before, or an empty list without one. */
void baton_models_list(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route);

/* GET /v1/models/{id}: the model object when a worker serves it; when none does but unnamed
 * workers may (the pool rule), forwarded to one; else 404 model_not_found. */
void baton_models_get(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route);

/* The route prefix of baton_models_get. */
#define BATON_MODELS_PREFIX "/v1/models/"

#endif
