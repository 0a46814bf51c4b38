/* routes.h — the router's HTTP surface: path → handler table, and the endpoints the router
 * answers itself (health, readiness, metrics, model list). */
#ifndef BATON_ROUTER_ROUTES_H
#define BATON_ROUTER_ROUTES_H

#include "http/server.h"

/*
 * The handler for baton_http_server_create(); ctx is the loop's baton_proxy_loop_t.
 *   POST /v1/chat/completions, /v1/completions, /generate, /v1/responses
 *                            → proxy (PD or regular)
 *   POST /v1/embeddings, /v1/rerank, /v1/score → proxy to a regular worker (501 without one)
 *   GET  /v1/models          → the union of the workers' models, or a worker's list when none
 *                              is named (models.h)
 *   GET  /v1/models/{id}     → that model (models.h), 404 model_not_found
 *   GET, DELETE /v1/responses/{id} → the worker that answered it (responses.h), else 404
 *   GET  /get_server_info, /get_model_info → forwarded to a worker (503 without one)
 *   GET  /health, /liveness  → 200 while the router runs
 *   GET  /readiness          → 200 with >= 1 eligible prefill and decode, or >= 1 eligible
 *                              regular worker; else 503
 *   GET  /metrics            → Prometheus text 0.0.4
 *   the admin API (admin.h)  → router-core's handler
 * A known path with another method → 405 with Allow; anything else → 404. Every error body is
 * OpenAI-style JSON.
 * Threading: runs on the loop thread of the server that received the request.
 */
void baton_routes_handle(baton_http_req_t *req, void *ctx);

#endif
