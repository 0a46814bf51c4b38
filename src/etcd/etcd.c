/* etcd.c — etcd v3 JSON-gateway client: calls with endpoint fail-over, watch streams, auth. */
#include "etcd/etcd.h"

#include "baton/error.h"
#include "common/buf.h"
#include "common/list.h"
#include "common/log.h"
#include "http/client.h"

#include <mbedtls/base64.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_PORT 2379
#define POOL_IDLE    4

typedef struct call_s {
    baton_list_t node; /* in exactly one of etcd->inflight, ->auth_wait, ->deferred */
    baton_etcd_t *e;
    char api[64];
    char *body;
    size_t body_len;
    baton_etcd_cb cb;
    baton_etcd_msg_cb on_msg; /* watches only */
    void *data;
    baton_http_creq_t *req;
    size_t ep;    /* endpoint of the request in flight */
    size_t tries; /* endpoints tried for this call */
    int status;
    int err; /* deferred completion */
    int is_watch, is_auth, auth_retried, got_msg, cancelled;
    baton_buf_t buf;
} call_t;

struct baton_etcd_watch_s {
    call_t call;
};

struct baton_etcd_s {
    uv_loop_t *loop;
    baton_etcd_url_t url;
    baton_http_pool_t *pools[BATON_ETCD_MAX_ENDPOINTS];
    size_t cur;
    char *user, *password, *token;
    int authing, closing;
    uint64_t timeout_ms;
    size_t live; /* calls not yet reported */
    baton_list_t inflight, auth_wait, deferred;
    uv_timer_t defer;
    char endpoint[300];
};

static void start(call_t *c);

int baton_etcd_url_parse(const char *url, baton_etcd_url_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    const char *p;
    if (strncmp(url, "etcd://", 7) == 0)
        p = url + 7;
    else if (strncmp(url, "etcds://", 8) == 0) {
        p = url + 8;
        out->tls = 1;
    } else {
        snprintf(err, errlen, "must start with etcd:// or etcds:// (TLS)");
        return BATON_EINVAL;
    }
    const char *slash = strchr(p, '/');
    if (slash == NULL || slash[1] == '\0') {
        snprintf(err, errlen, "a key prefix is required: etcd://host:port/prefix");
        return BATON_EINVAL;
    }
    size_t plen = strlen(slash);
    while (plen > 1 && slash[plen - 1] == '/')
        plen--;
    if (plen >= sizeof(out->prefix) || strpbrk(slash, " \r\n\t") != NULL) {
        snprintf(err, errlen, "bad key prefix");
        return BATON_EINVAL;
    }
    memcpy(out->prefix, slash, plen);
    while (p < slash) {
        const char *end = memchr(p, ',', (size_t)(slash - p));
        if (end == NULL)
            end = slash;
        const char *colon = NULL;
        for (const char *q = p; q < end; q++)
            if (*q == ':')
                colon = q;
        size_t hlen = (size_t)((colon ? colon : end) - p);
        if (out->n == BATON_ETCD_MAX_ENDPOINTS || hlen == 0 || hlen >= sizeof(out->host[0])) {
            snprintf(err, errlen, "bad or too many endpoints (at most %d)",
                     BATON_ETCD_MAX_ENDPOINTS);
            return BATON_EINVAL;
        }
        memcpy(out->host[out->n], p, hlen);
        int port = DEFAULT_PORT;
        if (colon != NULL) {
            char *pe;
            long v = strtol(colon + 1, &pe, 10);
            if (pe != end || v < 1 || v > 65535) {
                snprintf(err, errlen, "bad port in endpoint '%.*s'", (int)(end - p), p);
                return BATON_EINVAL;
            }
            port = (int)v;
        }
        out->port[out->n++] = port;
        if (end < slash && end + 1 == slash) {
            snprintf(err, errlen, "empty endpoint after ','");
            return BATON_EINVAL;
        }
        p = end < slash ? end + 1 : end;
    }
    if (out->n == 0) {
        snprintf(err, errlen, "no endpoint");
        return BATON_EINVAL;
    }
    return 0;
}

/* ---- base64 and small helpers ---- */

json_t *baton_etcd_b64(const char *s, size_t len)
{
    size_t olen = 0;
    size_t cap = 4 * ((len + 2) / 3) + 1;
    unsigned char *out = malloc(cap);
    if (out == NULL)
        return NULL;
    if (mbedtls_base64_encode(out, cap, &olen, (const unsigned char *)s, len) != 0) {
        free(out);
        return NULL;
    }
    json_t *j = json_stringn((const char *)out, olen);
    free(out);
    return j;
}

static int b64_digit(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Base64 as the gateway writes it (standard alphabet, padded, no line breaks), by branches
 * rather than mbedTLS's constant-time decoder: keys and values are no secrets, and a new store
 * leader decodes two per object it restores. */
char *baton_etcd_unb64(json_t *v, size_t *len_p)
{
    if (!json_is_string(v))
        return NULL;
    const unsigned char *in = (const unsigned char *)json_string_value(v);
    size_t inlen = json_string_length(v), olen = 0;
    if (inlen % 4 != 0)
        return NULL;
    unsigned char *out = malloc(inlen / 4 * 3 + 1);
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < inlen; i += 4) {
        int pad = in[i + 3] == '=' ? in[i + 2] == '=' ? 2 : 1 : 0;
        int a = b64_digit(in[i]), b = b64_digit(in[i + 1]);
        int c = pad == 2 ? 0 : b64_digit(in[i + 2]), d = pad ? 0 : b64_digit(in[i + 3]);
        if ((a | b | c | d) < 0 || (pad && i + 4 != inlen)) {
            free(out);
            return NULL;
        }
        uint32_t q = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | (uint32_t)d;
        out[olen++] = (unsigned char)(q >> 16);
        if (pad < 2)
            out[olen++] = (unsigned char)(q >> 8);
        if (pad < 1)
            out[olen++] = (unsigned char)q;
    }
    out[olen] = '\0';
    if (len_p)
        *len_p = olen;
    return (char *)out;
}

void baton_etcd_prefix_end(const char *prefix, char *out, size_t outlen)
{
    snprintf(out, outlen, "%s", prefix);
    /* etcd's rule: increment the last byte that is not 0xff, drop what follows. */
    for (size_t i = strlen(out); i-- > 0;) {
        if ((unsigned char)out[i] < 0xff) {
            out[i] = (char)((unsigned char)out[i] + 1);
            out[i + 1] = '\0';
            return;
        }
    }
    snprintf(out, outlen, "%c", 0); /* all 0xff: no end (not reached with text prefixes) */
}

int64_t baton_etcd_int(json_t *obj, const char *key, int64_t def)
{
    json_t *v = json_object_get(obj, key);
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    if (json_is_string(v)) {
        char *end;
        long long x = strtoll(json_string_value(v), &end, 10);
        if (end != json_string_value(v) && *end == '\0')
            return (int64_t)x;
    }
    return def;
}

/* ---- client ---- */

const char *baton_etcd_endpoint(const baton_etcd_t *e)
{
    return e->endpoint;
}

static void set_current(baton_etcd_t *e, size_t i)
{
    e->cur = i;
    snprintf(e->endpoint, sizeof(e->endpoint), "%s:%d", e->url.host[i], e->url.port[i]);
}

int baton_etcd_create(baton_etcd_t **etcd_p, uv_loop_t *loop, const baton_etcd_url_t *url,
                      const char *user, const char *password, struct baton_tls_s *tls,
                      uint64_t timeout_ms)
{
    if (url->tls && tls == NULL)
        return BATON_EINVAL;
    baton_etcd_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return BATON_ENOMEM;
    e->loop = loop;
    e->url = *url;
    e->timeout_ms = timeout_ms ? timeout_ms : 2000;
    baton_list_init(&e->inflight);
    baton_list_init(&e->auth_wait);
    baton_list_init(&e->deferred);
    int rc = 0;
    if (user != NULL && ((e->user = strdup(user)) == NULL ||
                         (e->password = strdup(password ? password : "")) == NULL))
        rc = BATON_ENOMEM;
    for (size_t i = 0; rc == 0 && i < url->n; i++) {
        rc = baton_http_pool_create(&e->pools[i], loop, url->host[i], url->port[i], POOL_IDLE);
        if (rc == 0 && url->tls)
            baton_http_pool_set_tls(e->pools[i], tls);
    }
    if (rc == 0)
        rc = uv_timer_init(loop, &e->defer);
    if (rc != 0) {
        for (size_t i = 0; i < url->n; i++)
            if (e->pools[i])
                baton_http_pool_destroy(e->pools[i]);
        free(e->user);
        free(e->password);
        free(e);
        return rc;
    }
    e->defer.data = e;
    set_current(e, 0);
    *etcd_p = e;
    return 0;
}

static void on_defer_closed(uv_handle_t *h)
{
    baton_etcd_t *e = h->data;
    for (size_t i = 0; i < e->url.n; i++)
        baton_http_pool_destroy(e->pools[i]);
    free(e->user);
    free(e->password);
    free(e->token);
    free(e);
}

static void maybe_free(baton_etcd_t *e)
{
    if (e->closing && e->live == 0 && !uv_is_closing((uv_handle_t *)&e->defer))
        uv_close((uv_handle_t *)&e->defer, on_defer_closed);
}

/* Reports a call once and frees it. */
static void complete(call_t *c, int err, json_t *result)
{
    baton_etcd_t *e = c->e;
    baton_list_remove(&c->node);
    if (c->cancelled)
        err = BATON_ECANCELED;
    c->cb(c->data, err, err == 0 || err == BATON_EUPSTREAM ? result : NULL);
    baton_buf_free(&c->buf);
    free(c->body);
    free(c);
    e->live--;
    maybe_free(e);
}

static void on_defer(uv_timer_t *t)
{
    baton_etcd_t *e = t->data;
    baton_list_t *n;
    while ((n = baton_list_first(&e->deferred)) != NULL) {
        call_t *c = container_of(n, call_t, node);
        complete(c, c->err, NULL);
    }
}

/* Completes on a later loop turn (never inside the call that started the work). */
static void defer(call_t *c, int err)
{
    c->err = err;
    baton_list_remove(&c->node);
    baton_list_push(&c->e->deferred, &c->node);
    uv_timer_start(&c->e->defer, on_defer, 0, 0);
}

void baton_etcd_close(baton_etcd_t *e)
{
    if (e == NULL || e->closing)
        return;
    e->closing = 1;
    baton_list_t *n;
    while ((n = baton_list_first(&e->auth_wait)) != NULL) {
        call_t *c = container_of(n, call_t, node);
        c->cancelled = 1;
        defer(c, BATON_ECANCELED);
    }
    for (n = e->inflight.next; n != &e->inflight; n = n->next) {
        call_t *c = container_of(n, call_t, node);
        c->cancelled = 1;
        baton_http_request_cancel(c->req);
    }
    maybe_free(e);
}

static void failover(call_t *c, int err)
{
    baton_etcd_t *e = c->e;
    if (e->cur == c->ep) {
        set_current(e, (c->ep + 1) % e->url.n);
        log_debug("etcd", "endpoint_switch to=%s reason=%s", e->endpoint, baton_err_name(err));
    }
    if (++c->tries >= e->url.n || e->closing || c->cancelled) {
        defer(c, err);
        return;
    }
    start(c);
}

static void on_auth_done(void *data, int err, json_t *result)
{
    baton_etcd_t *e = data;
    e->authing = 0;
    json_t *tok = err == 0 ? json_object_get(result, "token") : NULL;
    if (json_is_string(tok)) {
        free(e->token);
        e->token = strdup(json_string_value(tok));
    }
    if (e->token == NULL)
        log_warn("etcd", "auth_failed user=%s err=%s", e->user,
                 err ? baton_err_name(err) : "no token");
    baton_list_t waiting;
    baton_list_init(&waiting);
    baton_list_splice(&waiting, &e->auth_wait);
    baton_list_t *n;
    while ((n = baton_list_first(&waiting)) != NULL) {
        call_t *c = container_of(n, call_t, node);
        baton_list_remove(n);
        baton_list_push(&e->inflight, n); /* a list to leave: start/defer move it on */
        if (e->token != NULL)
            start(c);
        else
            defer(c, err ? err : BATON_EUPSTREAM);
    }
}

static call_t *call_new(baton_etcd_t *e, const char *api, json_t *body, baton_etcd_cb cb,
                        void *data)
{
    call_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->body = json_dumps(body, JSON_COMPACT);
    if (c->body == NULL) {
        free(c);
        return NULL;
    }
    c->body_len = strlen(c->body);
    c->e = e;
    snprintf(c->api, sizeof(c->api), "%s", api);
    c->cb = cb;
    c->data = data;
    c->buf = (baton_buf_t)BATON_BUF_INIT;
    baton_list_init(&c->node);
    e->live++;
    return c;
}

static int authenticate(baton_etcd_t *e)
{
    json_t *body = json_pack("{s:s, s:s}", "name", e->user, "password", e->password);
    call_t *c = body ? call_new(e, "/v3/auth/authenticate", body, on_auth_done, e) : NULL;
    json_decref(body);
    if (c == NULL)
        return BATON_ENOMEM;
    c->is_auth = 1;
    e->authing = 1;
    start(c);
    return 0;
}

/* Splits a watch stream into its newline-delimited JSON messages. */
static void watch_feed(call_t *c)
{
    char *nl;
    while (!c->cancelled && (nl = memchr(c->buf.data, '\n', c->buf.len)) != NULL) {
        size_t len = (size_t)(nl - c->buf.data);
        json_t *msg = json_loadb(c->buf.data, len, 0, NULL);
        baton_buf_consume(&c->buf, len + 1);
        json_t *res = json_object_get(msg, "result");
        if (res != NULL) {
            c->got_msg = 1;
            c->on_msg(c->data, res);
        } else if (msg != NULL) {
            const char *m =
                json_string_value(json_object_get(json_object_get(msg, "error"), "message"));
            log_warn("etcd", "watch_error msg=\"%.200s\"", m ? m : "?");
        }
        json_decref(msg);
    }
}

static void on_head(baton_http_creq_t *req, int status, const baton_http_header_t *h, size_t n)
{
    (void)h;
    (void)n;
    call_t *c = req->data;
    c->status = status;
}

static void on_data(baton_http_creq_t *req, const char *data, size_t len)
{
    call_t *c = req->data;
    if (baton_buf_append(&c->buf, data, len) != 0) {
        baton_http_request_cancel(req);
        return;
    }
    if (c->is_watch && c->status == 200)
        watch_feed(c);
}

static int token_rejected(int status, json_t *j)
{
    const char *msg = json_string_value(json_object_get(j, "error"));
    if (msg == NULL)
        msg = json_string_value(json_object_get(j, "message"));
    return status == 401 || (msg != NULL && (strstr(msg, "invalid auth token") != NULL ||
                                             strstr(msg, "user name is empty") != NULL));
}

static void on_done(baton_http_creq_t *req, int err)
{
    call_t *c = req->data;
    baton_etcd_t *e = c->e;
    c->req = NULL;
    if (c->cancelled || e->closing) {
        defer(c, BATON_ECANCELED);
        return;
    }
    if (err != 0 || c->status >= 500) {
        if (c->is_watch && c->got_msg)
            defer(c, err ? err : BATON_EUPSTREAM);
        else
            failover(c, err ? err : BATON_EUPSTREAM);
        return;
    }
    json_t *j =
        c->is_watch ? NULL : json_loadb(c->buf.data ? c->buf.data : "", c->buf.len, 0, NULL);
    if (c->status != 200 && e->user != NULL && !c->is_auth && !c->auth_retried &&
        token_rejected(c->status, j)) {
        /* Tokens expire: get a new one and send the call once more. */
        json_decref(j);
        c->auth_retried = 1;
        free(e->token);
        e->token = NULL;
        baton_buf_reset(&c->buf);
        start(c);
        return;
    }
    if (c->is_watch)
        complete(c, c->status == 200 ? BATON_EEOF : BATON_EUPSTREAM, NULL);
    else if (c->status == 200 && j != NULL)
        complete(c, 0, j);
    else
        complete(c, BATON_EUPSTREAM, j);
    json_decref(j);
}

static const baton_http_client_cb_t client_cb = {on_head, on_data, on_done};

static void start(call_t *c)
{
    baton_etcd_t *e = c->e;
    baton_list_remove(&c->node);
    if (e->closing || c->cancelled) {
        defer(c, BATON_ECANCELED);
        return;
    }
    if (e->user != NULL && e->token == NULL && !c->is_auth) {
        baton_list_push(&e->auth_wait, &c->node);
        if (!e->authing && authenticate(e) != 0)
            on_auth_done(e, BATON_ENOMEM, NULL);
        return;
    }
    baton_http_header_t h[2] = {{"Content-Type", "application/json"}, {"Authorization", ""}};
    size_t nh = 1;
    if (e->token != NULL && !c->is_auth) {
        h[1].value = e->token;
        nh = 2;
    }
    baton_http_timeouts_t to = {e->timeout_ms, e->timeout_ms, e->timeout_ms, e->timeout_ms};
    if (c->is_watch)
        to.idle_ms = to.total_ms = 0; /* a watch is quiet while nothing changes */
    c->ep = e->cur;
    c->status = 0;
    baton_buf_reset(&c->buf);
    baton_list_push(&e->inflight, &c->node);
    int rc = baton_http_request(&c->req, e->pools[c->ep], "POST", c->api, h, nh, c->body,
                                c->body_len, &to, &client_cb, c);
    if (rc != 0) {
        c->req = NULL;
        defer(c, rc);
    }
}

int baton_etcd_call(baton_etcd_t *e, const char *api, json_t *body, baton_etcd_cb cb, void *data)
{
    if (e->closing)
        return BATON_ESHUTDOWN;
    call_t *c = call_new(e, api, body, cb, data);
    if (c == NULL)
        return BATON_ENOMEM;
    start(c);
    return 0;
}

int baton_etcd_watch(baton_etcd_watch_t **w_p, baton_etcd_t *e, const char *key,
                     const char *range_end, int64_t start_revision, baton_etcd_msg_cb on_msg,
                     baton_etcd_cb on_end, void *data)
{
    if (e->closing)
        return BATON_ESHUTDOWN;
    json_t *k = baton_etcd_b64(key, strlen(key));
    json_t *r = range_end ? baton_etcd_b64(range_end, strlen(range_end)) : json_null();
    json_t *body = k && r ? json_pack("{s:{s:o, s:o, s:I}}", "create_request", "key", k,
                                      "range_end", r, "start_revision", (json_int_t)start_revision)
                          : NULL;
    if (body == NULL) {
        json_decref(k);
        json_decref(r);
        return BATON_ENOMEM;
    }
    /* baton_etcd_watch_t is the call itself: the cast below relies on that layout. */
    call_t *c = call_new(e, "/v3/watch", body, on_end, data);
    json_decref(body);
    if (c == NULL)
        return BATON_ENOMEM;
    c->is_watch = 1;
    c->on_msg = on_msg;
    *w_p = (baton_etcd_watch_t *)c;
    start(c);
    return 0;
}

void baton_etcd_watch_endpoint(const baton_etcd_watch_t *w, char *out, size_t outlen)
{
    const call_t *c = &w->call;
    snprintf(out, outlen, "%s:%d", c->e->url.host[c->ep], c->e->url.port[c->ep]);
}

void baton_etcd_watch_cancel(baton_etcd_watch_t *w)
{
    call_t *c = &w->call;
    if (c->cancelled)
        return;
    c->cancelled = 1;
    if (c->req != NULL)
        baton_http_request_cancel(c->req);
    else
        defer(c, BATON_ECANCELED);
}
