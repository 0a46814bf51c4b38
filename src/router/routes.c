/* routes.c — path → handler table of the router, who may call each route (auth.h) and the
 * endpoints it answers itself (health, readiness, metrics, model list); inference and info
 * requests go to proxy.c. */
#include "router/routes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "baton/error.h"
#include "common/clock.h"
#include "common/log.h"
#include "router/control/admin.h"
#include "router/dataplane/models.h"
#include "router/dataplane/policy_metrics.h"
#include "router/dataplane/proxy.h"
#include "router/dataplane/responses.h"

typedef void (*route_fn)(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route);

typedef struct route_s {
    const char *path;
    const char *method;      /* the one method served; others get 405 with Allow: method */
    route_fn fn;             /* NULL: an inference API, proxied as `api` */
    baton_route_class_t cls; /* who may call it */
    baton_api_t api;
} route_t;

static void run(baton_proxy_loop_t *pl, baton_http_req_t *req, const route_t *rt)
{
    if (rt->fn)
        rt->fn(pl, req, rt->path);
    else
        baton_proxy_inference(pl, req, rt->api);
}

static void h_health(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route)
{
    baton__respond_json(baton_proxy_loop_router(pl), req, route, 200,
                        json_pack("{s:s}", "status", "ok"));
}

static void h_readiness(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route)
{
    baton_router_t *r = baton_proxy_loop_router(pl);
    size_t all[BATON_ROLE_COUNT], ok[BATON_ROLE_COUNT];
    baton_registry_counts(r->registry, all, ok);
    size_t p = ok[BATON_ROLE_PREFILL], d = ok[BATON_ROLE_DECODE], g = ok[BATON_ROLE_REGULAR];
    if (atomic_load(&r->draining)) {
        /* SIGTERM: in-flight requests are finishing; load balancers must send no more. */
        baton__respond_error(r, req, route, 503, "not ready: the router is shutting down",
                             "service_unavailable_error", NULL, "shutting_down");
        return;
    }
    if ((p >= 1 && d >= 1) || g >= 1) {
        json_t *j = json_pack("{s:s,s:I,s:I,s:I}", "status", "ready", "prefill", (json_int_t)p,
                              "decode", (json_int_t)d, "regular", (json_int_t)g);
        /* A shared registry (etcd) that is unreachable does not make the router unready: it
         * serves its last known workers, and says so here. */
        char src[16], detail[256];
        int connected;
        if (j && baton_registry_shared_state(r->registry, src, sizeof(src), &connected, detail,
                                             sizeof(detail)))
            json_object_set_new(j, "registry",
                                json_pack("{s:s,s:b,s:s}", "source", src, "connected", connected,
                                          "detail", detail));
        baton__respond_json(baton_proxy_loop_router(pl), req, route, 200, j);
        return;
    }
    char msg[600], src[16], detail[256];
    int connected,
        n = snprintf(msg, sizeof(msg),
                     "not ready: needs at least one prefill and one decode worker, or "
                     "one regular worker (available: prefill=%zu decode=%zu regular=%zu)",
                     p, d, g);
    if (baton_registry_shared_state(r->registry, src, sizeof(src), &connected, detail,
                                    sizeof(detail)) &&
        !connected && n > 0 && (size_t)n < sizeof(msg))
        snprintf(msg + n, sizeof(msg) - (size_t)n, "; %s registry: %s", src, detail);
    baton__respond_error(r, req, route, 503, msg, "service_unavailable_error", NULL, "not_ready");
}

/* The memory budget's state (--max-buffered-bytes): what is held now, by kind, and its max. */
static int budget_metrics_append(const baton_router_t *r, baton_buf_t *out)
{
    const baton_http_budget_t *b = r->budget;
    if (!b)
        return 0;
    size_t used = atomic_load(&b->used), up = atomic_load(&b->upstream_used);
    return baton_buf_printf(
        out,
        "# HELP baton_buffered_bytes Bytes the router holds for peers now: request bodies being "
        "read, upstream answers and SSE events held, responses queued to clients.\n"
        "# TYPE baton_buffered_bytes gauge\n"
        "baton_buffered_bytes{kind=\"request_bodies\"} %zu\n"
        "baton_buffered_bytes{kind=\"small_bodies_reserve\"} %zu\n"
        "baton_buffered_bytes{kind=\"upstream_answers\"} %zu\n"
        "baton_buffered_bytes{kind=\"client_queues\"} %zu\n"
        "# HELP baton_buffered_bytes_max The budget of request bodies and upstream answers "
        "(--max-buffered-bytes); client queues are held to half of it by back-pressure.\n"
        "# TYPE baton_buffered_bytes_max gauge\n"
        "baton_buffered_bytes_max %zu\n"
        "# HELP baton_buffer_waits_total Request bodies that had to wait for the budget.\n"
        "# TYPE baton_buffer_waits_total counter\n"
        "baton_buffer_waits_total %llu\n",
        used > up ? used - up : 0, atomic_load(&b->reserve_used), up, atomic_load(&b->out_used),
        b->max, atomic_load(&b->waits));
}

static void h_metrics(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route)
{
    baton_router_t *r = baton_proxy_loop_router(pl);
    baton_buf_t out = BATON_BUF_INIT;
    if (baton_router_metrics_render(r->metrics, r->registry, &out) != 0 ||
        baton_policy_metrics_append(r, &out) != 0 || budget_metrics_append(r, &out) != 0) {
        baton_buf_free(&out);
        baton__respond_error(r, req, route, 500, "router out of memory", "server_error", NULL,
                             "internal_error");
        return;
    }
    baton__respond(r, req, route, 200, "text/plain; version=0.0.4; charset=utf-8",
                   out.data ? out.data : "", out.len);
    baton_buf_free(&out);
}

static void h_models(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route)
{
    baton_models_list(pl, req, route);
}

static void h_info(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route)
{
    static const baton_worker_role_t roles[] = {BATON_ROLE_DECODE, BATON_ROLE_REGULAR,
                                                BATON_ROLE_PREFILL};
    if (baton_proxy_forward(pl, req, route, roles, 3) == BATON_ENOWORKER)
        baton__respond_error(baton_proxy_loop_router(pl), req, route, 503, "no worker available",
                             "service_unavailable_error", NULL, "no_worker");
}

/* An inference API, proxied to the workers; a route the router answers itself. */
// clang-format off
#define API(path, api)            {path, "POST", NULL, BATON_ROUTE_INFERENCE, api}
#define FN(path, method, fn, cls) {path, method, fn, cls, BATON_API_CHAT /* unused */}
// clang-format on

static const route_t routes[] = {
    API("/v1/chat/completions", BATON_API_CHAT),
    API("/v1/completions", BATON_API_COMPLETIONS),
    API("/generate", BATON_API_GENERATE),
    API("/v1/responses", BATON_API_RESPONSES),
    API("/v1/embeddings", BATON_API_EMBEDDINGS),
    API("/v1/rerank", BATON_API_RERANK),
    API("/v1/score", BATON_API_SCORE),
    API("/tokenize", BATON_API_TOKENIZE),
    API("/detokenize", BATON_API_DETOKENIZE),
    FN("/v1/models", "GET", h_models, BATON_ROUTE_INFERENCE),
    FN("/health", "GET", h_health, BATON_ROUTE_OPEN),
    FN("/liveness", "GET", h_health, BATON_ROUTE_OPEN),
    FN("/readiness", "GET", h_readiness, BATON_ROUTE_OPEN),
    /* A worker's own description (its whole server configuration, addresses and paths): for
     * operators only. /v1/models passes through stripped (proxy_relay.c). */
    FN("/get_server_info", "GET", h_info, BATON_ROUTE_ADMIN),
    FN("/get_model_info", "GET", h_info, BATON_ROUTE_ADMIN),
    FN("/metrics", "GET", h_metrics, BATON_ROUTE_METRICS),
};

/* An OpenAI-format error with one extra header (Allow, WWW-Authenticate, Retry-After). */
static void respond_error_hdr(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route,
                              int status, const char *msg, const char *type, const char *code,
                              const baton_http_header_t *hdr)
{
    json_t *j = json_pack("{s:{s:s,s:s,s:n,s:s}}", "error", "message", msg, "type", type, "param",
                          "code", code);
    baton__respond_json_hdr(baton_proxy_loop_router(pl), req, route, status, j, hdr);
}

static void method_not_allowed(baton_proxy_loop_t *pl, baton_http_req_t *req, const route_t *rt)
{
    char msg[160];
    snprintf(msg, sizeof(msg), "method %.16s not allowed on %s; use %s", req->method, rt->path,
             rt->method);
    const baton_http_header_t allow = {"Allow", rt->method};
    respond_error_hdr(pl, req, rt->path, 405, msg, "invalid_request_error", "method_not_allowed",
                      &allow);
}

/* 1 when req may go on; else it was answered (401 or 429). Admin routes are admin.c's. */
static int authorize(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route,
                     baton_route_class_t cls)
{
    baton_auth_t *auth = baton_proxy_loop_router(pl)->auth;
    if (cls == BATON_ROUTE_ADMIN) /* the info routes: refused as the admin API refuses */
        return baton_admin_authorize(req, auth) == 0;
    baton_auth_result_t res = baton_auth_check(auth, req, cls);
    if (res != BATON_AUTH_OK) {
        static const baton_http_header_t www = {"WWW-Authenticate", "Bearer"};
        int is_key = cls == BATON_ROUTE_INFERENCE;
        log_warn_limited("router", "auth_failed", "auth_failed route=%s peer=%s reason=%s", route,
                         req->peer, baton_auth_bearer(req) ? "wrong_token" : "no_token");
        respond_error_hdr(pl, req, route, 401,
                          is_key ? "Incorrect or missing API key: send it as "
                                   "'Authorization: Bearer KEY'"
                                 : "Incorrect or missing token: send it as "
                                   "'Authorization: Bearer TOKEN'",
                          "invalid_request_error", is_key ? "invalid_api_key" : "invalid_token",
                          &www);
        return 0;
    }
    unsigned retry_s = 1;
    if (cls == BATON_ROUTE_INFERENCE && !baton_auth_rate(auth, req, uv_hrtime(), &retry_s)) {
        char secs[16], msg[128];
        snprintf(secs, sizeof(secs), "%u", retry_s);
        snprintf(msg, sizeof(msg), "Rate limit reached: retry after %u s", retry_s);
        const baton_http_header_t ra = {"Retry-After", secs};
        log_warn_limited("router", "rate_limited", "rate_limited route=%s peer=%s", route,
                         req->peer);
        respond_error_hdr(pl, req, route, 429, msg, "rate_limit_error", "rate_limit_exceeded", &ra);
        return 0;
    }
    return 1;
}

void baton_routes_handle(baton_http_req_t *req, void *ctx)
{
    baton_proxy_loop_t *pl = ctx;
    for (size_t i = 0; i < sizeof(routes) / sizeof(*routes); i++) {
        if (strcmp(req->path, routes[i].path) != 0)
            continue;
        /* Credentials first: a refused caller learns nothing about the route, not even its
         * method. */
        if (!authorize(pl, req, routes[i].path, routes[i].cls))
            return;
        if (strcmp(req->method, routes[i].method) != 0) {
            method_not_allowed(pl, req, &routes[i]);
            return;
        }
        run(pl, req, &routes[i]);
        return;
    }
    /* The routes whose last segment is an id (a model's may hold '/': "org/name"). */
    static const struct {
        const char *prefix;
        route_t rt;
        const char *also; /* a second method served, or NULL */
    } by_id[] = {
        {BATON_MODELS_PREFIX, FN("/v1/models/{id}", "GET", baton_models_get, BATON_ROUTE_INFERENCE),
         NULL},
        {BATON_RESPONSES_PREFIX,
         FN("/v1/responses/{id}", "GET", baton_responses_by_id, BATON_ROUTE_INFERENCE), "DELETE"},
    };
    for (size_t i = 0; i < sizeof(by_id) / sizeof(*by_id); i++) {
        size_t plen = strlen(by_id[i].prefix);
        if (strncmp(req->path, by_id[i].prefix, plen) != 0 || req->path[plen] == '\0')
            continue;
        const route_t *rt = &by_id[i].rt;
        if (!authorize(pl, req, rt->path, rt->cls))
            return;
        if (strcmp(req->method, rt->method) != 0 &&
            !(by_id[i].also && strcmp(req->method, by_id[i].also) == 0)) {
            char msg[160], allow[32];
            snprintf(msg, sizeof(msg), "method %.16s not allowed on %s", req->method, rt->path);
            snprintf(allow, sizeof(allow), "%s%s%s", rt->method, by_id[i].also ? ", " : "",
                     by_id[i].also ? by_id[i].also : "");
            const baton_http_header_t hdr = {"Allow", allow};
            respond_error_hdr(pl, req, rt->path, 405, msg, "invalid_request_error",
                              "method_not_allowed", &hdr);
            return;
        }
        run(pl, req, rt);
        return;
    }
    baton_router_t *r = baton_proxy_loop_router(pl);
    if (baton_admin_is_path(req->path)) {
        if (!baton_admin_authorize(req, r->auth))
            baton_admin_handle(req, r->registry);
        return;
    }
    /* Unknown paths need an API key too, so an anonymous caller cannot map the routes. */
    if (!authorize(pl, req, "other", BATON_ROUTE_INFERENCE))
        return;
    char msg[160];
    snprintf(msg, sizeof(msg), "no route for %.16s %.100s", req->method, req->path);
    baton__respond_error(baton_proxy_loop_router(pl), req, "other", 404, msg,
                         "invalid_request_error", NULL, "not_found");
}
