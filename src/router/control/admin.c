/* admin.c — worker registration API handlers (/workers, legacy /add_worker, /remove_worker) and
 * who may call them. */
#include "router/control/admin.h"

#include "baton/error.h"
#include "common/log.h"
#include "router/control/kv_route.h"
#include "router/dataplane/dp_rank.h"
#include "router/dataplane/policy_metrics.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define URL_FIELD_MAX 1024 /* a decoded URL query parameter */

/* ---- query strings ---- */

int baton_url_decode(const char *in, size_t inlen, char *out, size_t outlen)
{
    size_t o = 0;
    for (size_t i = 0; i < inlen; i++) {
        char c = in[i];
        if (c == '+') {
            c = ' ';
        } else if (c == '%') {
            if (i + 2 >= inlen)
                return BATON_EINVAL;
            int hi = baton_hex_value((unsigned char)in[i + 1]),
                lo = baton_hex_value((unsigned char)in[i + 2]);
            if (hi < 0 || lo < 0)
                return BATON_EINVAL;
            c = (char)(hi * 16 + lo);
            if (c == '\0')
                return BATON_EINVAL;
            i += 2;
        }
        if (o + 1 >= outlen)
            return BATON_EINVAL;
        out[o++] = c;
    }
    if (outlen == 0)
        return BATON_EINVAL;
    out[o] = '\0';
    return 0;
}

int baton_query_get(const char *query, const char *key, char *out, size_t outlen)
{
    if (query == NULL)
        return 0;
    const char *p = query;
    char name[128];
    while (*p != '\0') {
        const char *end = p + strcspn(p, "&");
        const char *eq = memchr(p, '=', (size_t)(end - p));
        const char *kend = eq ? eq : end;
        if (baton_url_decode(p, (size_t)(kend - p), name, sizeof(name)) == 0 &&
            strcmp(name, key) == 0) {
            const char *v = eq ? eq + 1 : end;
            if (baton_url_decode(v, (size_t)(end - v), out, outlen) != 0)
                return BATON_EINVAL;
            return 1;
        }
        p = *end ? end + 1 : end;
    }
    return 0;
}

/* ---- responses ---- */

static void respond_json(baton_http_req_t *req, int status, json_t *body,
                         const baton_http_header_t *extra, size_t n_extra)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (text == NULL) {
        baton_http_respond_error(req, 500, "out of memory", "internal_error", NULL, NULL);
        return;
    }
    baton_http_respond(req, status, "application/json", extra, n_extra, text, strlen(text));
    free(text);
}

/* The one error shape of every route (README "API reference"): OpenAI's
 * {"error":{"message","type","param","code"}}; the admin routes keep the SGLang gateway's codes
 * (WORKER_ALREADY_EXISTS, ...). */
static json_t *error_json(int status, const char *code, const char *msg)
{
    const char *type = status >= 500 ? "server_error" : "invalid_request_error";
    return json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", msg, "type", type, "param",
                     "code", code);
}

static void respond_err(baton_http_req_t *req, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void respond_err(baton_http_req_t *req, int status, const char *code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    respond_json(req, status, error_json(status, code, msg), NULL, 0);
}

static void method_not_allowed(baton_http_req_t *req, const char *allow)
{
    baton_http_header_t h = {"Allow", allow};
    char msg[128];
    snprintf(msg, sizeof(msg), "method %.16s not allowed on %.64s", req->method, req->path);
    respond_json(req, 405, error_json(405, "METHOD_NOT_ALLOWED", msg), &h, 1);
}

/* A registered worker's descriptor as JSON: the api key only where `secrets` (the spec a shared
 * registry stores, so a replica registers the worker as it is); GET /workers never shows it. */
static json_t *desc_json(const baton_worker_t *w, int secrets)
{
    baton_worker_spec_t v;
    BATON_WORKER_DESC_COPY_FIELDS(&v, w);
    return baton_worker_spec_to_json(&v, secrets);
}

json_t *baton_admin_worker_json(baton_registry_t *reg, const baton_worker_t *w)
{
    json_t *j = desc_json(w, 0);
    json_t *rt = json_pack("{s:s, s:I, s:s, s:s, s:b, s:b}", "id", w->id, "in_flight",
                           (json_int_t)baton_worker_in_flight(w), "health",
                           baton_worker_health_name(baton_worker_health(w)), "breaker",
                           baton_breaker_state_name(baton_worker_breaker(w)), "draining",
                           baton_worker_is_draining(w), "healthy",
                           baton_worker_health(w) == BATON_HEALTH_HEALTHY);
    if (!j || !rt || json_object_update_new(j, rt) != 0) {
        json_decref(j);
        return NULL;
    }
    json_object_set_new(j, "cache", baton_policy_worker_json(w));
    json_t *kv = baton_kvroute_worker_json(baton_registry_kv(reg), w);
    if (kv) /* its KV-event subscription: index blocks per tier, last sequence number */
        json_object_set_new(j, "kv_events", kv);
    if (w->dp_size > 1) { /* this router's requests in flight per DP rank (dp_rank.h) */
        json_t *a = json_array();
        for (int r = 0; a && r < w->dp_size; r++)
            json_array_append_new(a, json_integer(baton_dp_in_flight(w, r)));
        json_object_set_new(j, "dp_in_flight", a);
    }
    return j;
}

json_t *baton_admin_spec_json(const baton_worker_t *w)
{
    return desc_json(w, 1);
}

/* ---- handlers ---- */

static void add_result(baton_http_req_t *req, int rc, const char *err, baton_worker_t *w,
                       int legacy)
{
    if (rc == BATON_EEXIST) {
        respond_err(req, 409, "WORKER_ALREADY_EXISTS", "%s", err);
        return;
    }
    if (rc == BATON_ENOMEM) {
        respond_err(req, 500, "INTERNAL_ERROR", "out of memory");
        return;
    }
    if (rc != 0) {
        respond_err(req, 400, "BAD_REQUEST", "%s", err);
        return;
    }
    char location[64];
    snprintf(location, sizeof(location), "/workers/%s", w->id);
    char message[1200];
    snprintf(message, sizeof(message), "Successfully added worker: %s", w->url);
    if (legacy) {
        respond_json(req, 200,
                     json_pack("{s:s, s:s, s:s, s:s}", "status", "ok", "message", message, "id",
                               w->id, "url", w->url),
                     NULL, 0);
        return;
    }
    baton_http_header_t h = {"Location", location};
    respond_json(req, 202,
                 json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "status", "accepted", "id", w->id,
                           "worker_id", w->id, "url", w->url, "worker_type",
                           baton_worker_role_name(w->role), "location", location, "message",
                           message),
                 &h, 1);
}

int baton_admin_desc_parse(json_t *body, baton_worker_desc_t *d, char *err, size_t errlen)
{
    /* Unknown members are ignored and null means the default: SGLang's API and older replicas'
     * values carry members this router does not know. */
    return baton_worker_desc_from_json(d, body, 0, NULL, err, errlen);
}

static void post_workers(baton_http_req_t *req, baton_registry_t *reg)
{
    json_error_t jerr;
    json_t *body = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
    if (body == NULL) {
        respond_err(req, 400, "BAD_REQUEST", "invalid JSON body: %s", jerr.text);
        return;
    }
    char err[512] = "";
    baton_worker_desc_t d;
    baton_worker_spec_t spec;
    int rc = baton_admin_desc_parse(body, &d, err, sizeof(err));
    BATON_WORKER_DESC_COPY_FIELDS(&spec, &d);
    baton_worker_t *w = NULL;
    if (rc == 0)
        rc = baton_registry_add(reg, &spec, &w, err, sizeof(err));
    if (rc == 0)
        baton_registry_publish_add(reg, w);
    add_result(req, rc, err, w, 0);
    baton_worker_unref(w);
    baton_worker_desc_free(&d);
    json_decref(body);
}

static void get_workers(baton_http_req_t *req, baton_registry_t *reg)
{
    size_t total = baton_registry_snapshot(reg, BATON_ROLE_ANY, BATON_SNAP_ALL, NULL, 0);
    size_t cap = total + 16;
    baton_worker_t **ws = malloc(cap * sizeof(*ws));
    if (ws == NULL) {
        respond_err(req, 500, "INTERNAL_ERROR", "out of memory");
        return;
    }
    total = baton_registry_snapshot(reg, BATON_ROLE_ANY, BATON_SNAP_ALL, ws, cap);
    size_t n = total < cap ? total : cap;
    json_t *arr = json_array();
    size_t counts[BATON_ROLE_COUNT] = {0};
    int oom = arr == NULL;
    for (size_t i = 0; i < n && !oom; i++) {
        counts[ws[i]->role]++;
        json_t *j = baton_admin_worker_json(reg, ws[i]);
        oom = j == NULL || json_array_append_new(arr, j) != 0;
    }
    baton_workers_unref(ws, n);
    free(ws);
    json_t *body =
        oom ? NULL
            : json_pack("{s:o, s:I, s:{s:I, s:I, s:I}}", "workers", arr, "total", (json_int_t)n,
                        "stats", "prefill_count", (json_int_t)counts[BATON_ROLE_PREFILL],
                        "decode_count", (json_int_t)counts[BATON_ROLE_DECODE], "regular_count",
                        (json_int_t)counts[BATON_ROLE_REGULAR]);
    if (body == NULL) {
        if (oom)
            json_decref(arr);
        respond_err(req, 500, "INTERNAL_ERROR", "out of memory");
        return;
    }
    /* the KV store's blocks (L3, reachable by every worker) when the router follows them */
    json_t *l3 = baton_kvroute_store_json(baton_registry_kv(reg));
    if (l3)
        json_object_set_new(body, "kv_store", l3);
    respond_json(req, 200, body, NULL, 0);
}

/* {id} is a worker id; a URL-encoded worker URL is accepted too. */
static baton_worker_t *lookup(baton_registry_t *reg, const char *ref)
{
    baton_worker_t *w = baton_registry_get(reg, ref);
    if (w == NULL) {
        char url[URL_FIELD_MAX];
        if (baton_url_decode(ref, strlen(ref), url, sizeof(url)) == 0)
            w = baton_registry_find_url(reg, url);
    }
    return w;
}

static void worker_by_id(baton_http_req_t *req, baton_registry_t *reg, const char *ref)
{
    int is_get = strcmp(req->method, "GET") == 0;
    int is_delete = strcmp(req->method, "DELETE") == 0;
    if (!is_get && !is_delete) {
        method_not_allowed(req, "GET, DELETE");
        return;
    }
    baton_worker_t *w = lookup(reg, ref);
    if (w == NULL) {
        respond_err(req, 404, "WORKER_NOT_FOUND", "worker %.200s not found", ref);
        return;
    }
    if (is_get) {
        json_t *j = baton_admin_worker_json(reg, w);
        baton_worker_unref(w);
        if (j == NULL)
            respond_err(req, 500, "INTERNAL_ERROR", "out of memory");
        else
            respond_json(req, 200, j, NULL, 0);
        return;
    }
    int rc = baton_registry_remove(reg, w->id);
    if (rc != 0) { /* removed by someone else meanwhile */
        baton_worker_unref(w);
        respond_err(req, 404, "WORKER_NOT_FOUND", "worker %.200s not found", ref);
        return;
    }
    baton_registry_publish_remove(reg, w);
    char message[1200];
    snprintf(message, sizeof(message), "Successfully removed worker: %s", w->url);
    respond_json(req, 202,
                 json_pack("{s:s, s:s, s:s, s:s}", "status", "removed", "id", w->id, "url", w->url,
                           "message", message),
                 NULL, 0);
    baton_worker_unref(w);
}

static void legacy_add(baton_http_req_t *req, baton_registry_t *reg)
{
    char url[URL_FIELD_MAX], type[32], port[32];
    baton_worker_spec_t spec;
    baton_worker_spec_init(&spec);
    int r = baton_query_get(req->query, "url", url, sizeof(url));
    if (r <= 0) {
        respond_err(req, 400, "BAD_REQUEST",
                    r == 0 ? "url query parameter is required" : "url: bad encoding");
        return;
    }
    spec.url = url;
    r = baton_query_get(req->query, "worker_type", type, sizeof(type));
    if (r < 0 || (r == 1 && baton_worker_role_parse(type, &spec.role) != 0)) {
        respond_err(req, 400, "BAD_REQUEST",
                    "worker_type must be \"regular\", \"prefill\" or \"decode\"");
        return;
    }
    r = baton_query_get(req->query, "bootstrap_port", port, sizeof(port));
    if (r < 0) {
        respond_err(req, 400, "BAD_REQUEST", "bootstrap_port: bad encoding");
        return;
    }
    if (r == 1 && port[0] != '\0' && strcmp(port, "none") != 0 && strcmp(port, "null") != 0) {
        char *end;
        long p = strtol(port, &end, 10);
        if (*end != '\0' || port[0] < '0' || port[0] > '9' || p < 1 || p > 65535) {
            respond_err(req, 400, "BAD_REQUEST", "bootstrap_port must be 1..65535 or none");
            return;
        }
        spec.bootstrap_port = (int)p;
    }
    char err[512] = "";
    baton_worker_t *w = NULL;
    int rc = baton_registry_add(reg, &spec, &w, err, sizeof(err));
    if (rc == 0)
        baton_registry_publish_add(reg, w);
    add_result(req, rc, err, w, 1);
    baton_worker_unref(w);
}

static void legacy_remove(baton_http_req_t *req, baton_registry_t *reg)
{
    char url[URL_FIELD_MAX];
    int r = baton_query_get(req->query, "url", url, sizeof(url));
    if (r <= 0) {
        respond_err(req, 400, "BAD_REQUEST",
                    r == 0 ? "url query parameter is required" : "url: bad encoding");
        return;
    }
    baton_worker_t *w = baton_registry_find_url(reg, url);
    if (w == NULL || baton_registry_remove(reg, w->id) != 0) {
        baton_worker_unref(w);
        respond_err(req, 404, "WORKER_NOT_FOUND", "worker %.200s not found", url);
        return;
    }
    baton_registry_publish_remove(reg, w);
    baton_worker_unref(w);
    char message[1200];
    snprintf(message, sizeof(message), "Successfully removed worker: %s", url);
    respond_json(req, 200,
                 json_pack("{s:s, s:s, s:s}", "status", "ok", "message", message, "url", url), NULL,
                 0);
}

static void legacy_list(baton_http_req_t *req, baton_registry_t *reg)
{
    size_t total = baton_registry_snapshot(reg, BATON_ROLE_ANY, BATON_SNAP_ALL, NULL, 0);
    size_t cap = total + 16;
    baton_worker_t **ws = malloc(cap * sizeof(*ws));
    json_t *urls = json_array();
    if (ws == NULL || urls == NULL) {
        free(ws);
        json_decref(urls);
        respond_err(req, 500, "INTERNAL_ERROR", "out of memory");
        return;
    }
    total = baton_registry_snapshot(reg, BATON_ROLE_ANY, BATON_SNAP_ALL, ws, cap);
    size_t n = total < cap ? total : cap;
    for (size_t i = 0; i < n; i++)
        json_array_append_new(urls, json_string(ws[i]->url));
    baton_workers_unref(ws, n);
    free(ws);
    respond_json(req, 200, json_pack("{s:o}", "urls", urls), NULL, 0);
}

static const struct {
    const char *path, *method;
    void (*handle)(baton_http_req_t *req, baton_registry_t *reg);
} legacy[] = {
    {"/add_worker", "POST", legacy_add},
    {"/remove_worker", "POST", legacy_remove},
    {"/list_workers", "GET", legacy_list},
};

int baton_admin_is_path(const char *path)
{
    if (strcmp(path, "/workers") == 0 || strncmp(path, "/workers/", 9) == 0)
        return 1;
    for (size_t i = 0; i < sizeof(legacy) / sizeof(legacy[0]); i++)
        if (strcmp(path, legacy[i].path) == 0)
            return 1;
    return 0;
}

int baton_admin_authorize(baton_http_req_t *req, baton_auth_t *auth)
{
    switch (baton_auth_check(auth, req, BATON_ROUTE_ADMIN)) {
    case BATON_AUTH_OK:
        return 0;
    case BATON_AUTH_NOT_LOOPBACK:
        log_warn_limited("router", "admin_refused", "admin_refused reason=not_loopback peer=%s",
                         req->peer);
        respond_err(req, 403, "FORBIDDEN",
                    "admin routes answer loopback clients only (no admin token is configured)");
        return 1;
    default: {
        log_warn_limited("router", "admin_refused", "admin_refused reason=bad_token peer=%s",
                         req->peer);
        baton_http_header_t h = {"WWW-Authenticate", "Bearer"};
        respond_json(req, 401, error_json(401, "UNAUTHORIZED", "missing or invalid admin token"),
                     &h, 1);
        return 1;
    }
    }
}

int baton_admin_handle(baton_http_req_t *req, baton_registry_t *reg)
{
    const char *path = req->path;
    const char *m = req->method;
    if (strcmp(path, "/workers") == 0 || strcmp(path, "/workers/") == 0) {
        if (strcmp(m, "GET") == 0)
            get_workers(req, reg);
        else if (strcmp(m, "POST") == 0)
            post_workers(req, reg);
        else
            method_not_allowed(req, "GET, POST");
        return 1;
    }
    if (strncmp(path, "/workers/", 9) == 0) {
        worker_by_id(req, reg, path + 9);
        return 1;
    }
    for (size_t i = 0; i < sizeof(legacy) / sizeof(legacy[0]); i++) {
        if (strcmp(path, legacy[i].path) != 0)
            continue;
        if (strcmp(m, legacy[i].method) == 0)
            legacy[i].handle(req, reg);
        else
            method_not_allowed(req, legacy[i].method);
        return 1;
    }
    return 0;
}
