/* admin.h — the worker registration API (PROTOCOLS.md §1): /workers, /add_worker, /list_workers. */
#ifndef BATON_ROUTER_ADMIN_H
#define BATON_ROUTER_ADMIN_H

#include <jansson.h>

#include "http/server.h"
#include "router/auth.h"
#include "router/control/registry.h"

/*
 * Routes handled (anything else returns 0 and the request is left untouched):
 *   POST   /workers          JSON {url, worker_type?, bootstrap_port?, api_key?, model_id?,
 *                            priority?, cost?, labels?} → 202, Location: /workers/{id},
 *                            body {"id","url","worker_type","status":"accepted","message",
 *                            "location"}; 400 {"error","code":"BAD_REQUEST"} on bad input,
 *                            409 {"error","code":"WORKER_ALREADY_EXISTS"} on a duplicate URL.
 *   GET    /workers          → 200 {"workers":[worker...],"total":N,
 *                            "stats":{"prefill_count","decode_count","regular_count"}}
 *   GET    /workers/{id}     → 200 worker | 404 {"error","code":"WORKER_NOT_FOUND"}
 *   DELETE /workers/{id}     → 202 {"id","url","status":"removed","message"} | 404
 *   POST   /add_worker?url=U&worker_type=T&bootstrap_port=P   (legacy; query URL-decoded)
 *                            → 200 {"status":"ok","id","url"} | 400 | 409
 *   POST   /remove_worker?url=U  → 200 {"status":"ok","url"} | 404 (legacy)
 *   GET    /list_workers     → 200 {"urls":[...]} (legacy)
 * A known path with another method → 405 {"error","code":"METHOD_NOT_ALLOWED"} with Allow.
 * A worker renders as {"id","url","worker_type","bootstrap_port" (int|null),"model_id"
 * (str|null),"priority","cost","labels","in_flight","health","breaker","draining","healthy"}.
 * The api_key is never shown.
 *
 * Threading: call on the request's loop thread (the HTTP server's rule); the registry is
 * thread-safe. The response is sent before returning.
 */

/* 1 when the path is an admin path (the request was answered, whatever the status), else 0. */
int baton_admin_handle(baton_http_req_t *req, baton_registry_t *reg);

/* 1 when baton_admin_handle would answer this path (whatever the method). */
int baton_admin_is_path(const char *path);

/*
 * The admin routes' authorisation (docs/SECURITY.md): with an admin token configured, the
 * request must carry "Authorization: Bearer TOKEN" (else 401 {"error","code":"UNAUTHORIZED"},
 * WWW-Authenticate: Bearer); without one, only loopback clients are served (else 403
 * {"error","code":"FORBIDDEN"}). 1 when it answered with the refusal, 0 when the request may
 * go on to baton_admin_handle. auth NULL: everything may go on.
 */
int baton_admin_authorize(baton_http_req_t *req, baton_auth_t *auth);

/* The JSON rendering of one worker shown above (a new reference), or NULL on ENOMEM. */
json_t *baton_admin_worker_json(baton_registry_t *reg, const baton_worker_t *w);

/* The POST /workers body (and the value a shared registry stores per worker) → a descriptor
 * that owns its strings (free it with baton_worker_desc_free, also after a failure). Unknown
 * members are ignored. 0, or BATON_EINVAL / BATON_ENOMEM with err set. The registry checks the
 * rest (url form, protocol fields) when the worker is added. */
int baton_admin_desc_parse(json_t *body, baton_worker_desc_t *d, char *err, size_t errlen);

/* The registration fields of w in the POST /workers shape (api_key included: it is what a
 * router needs to reach the worker). A new reference, or NULL on ENOMEM. */
json_t *baton_admin_spec_json(const baton_worker_t *w);

/* Decodes %XX and '+' (as space) of one query-string component into out (outlen bytes,
 * NUL-terminated). 0, or BATON_EINVAL on a bad escape, an encoded NUL, or not enough room. */
int baton_url_decode(const char *in, size_t inlen, char *out, size_t outlen);

/* Finds `key` in a raw query string ("a=1&b=x%20y") and URL-decodes its value into out.
 * 1 found, 0 absent, BATON_EINVAL bad encoding / too long. */
int baton_query_get(const char *query, const char *key, char *out, size_t outlen);

#endif
