/* route_ctx.h — what a request tells the routing policies (prompt text, words, session key,
 * pin), built from the parsed body and the headers. */
#ifndef BATON_ROUTER_ROUTE_CTX_H
#define BATON_ROUTER_ROUTE_CTX_H

#include "http/server.h"
#include "router/dataplane/pdreq.h"
#include "router/dataplane/policy.h"
#include "router/dataplane/proxy.h"

/* Fills ctx from the parsed body pd and the client request's headers (prompt text, words,
 * session key, pin when allowed). 0 or BATON_ENOMEM. Freed with baton_route_ctx_free(ctx).
 * A leaf of the proxy: it reads the request, never the proxy's own state. */
int baton_route_ctx_build(baton_route_ctx_t *ctx, baton_router_t *r, const baton_pdreq_t *pd,
                          const baton_http_req_t *req);
/* Whether this client request may pin a worker with X-Baton-Target-Worker (admin-only once
 * admin auth exists: the one function to wire it in). */
int baton_pin_allowed(const baton_router_t *r, const baton_http_req_t *req);

#endif
