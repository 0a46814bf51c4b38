/* register.c — baton-worker's self-registration in etcd: lease grant, put, keep-alive, revoke. */
#include "worker/register.h"

#include "baton/error.h"
#include "common/log.h"
#include "etcd/etcd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMP "register"

struct wk_register_s {
    baton_etcd_t *etcd;
    uv_timer_t timer;
    unsigned ttl_s;
    char key[600];
    char *value;
    int64_t lease;  /* 0 = none yet */
    int busy;       /* a call in flight */
    int registered; /* the key is on the current lease */
    int stopping;
    int calls; /* etcd calls not yet reported: r lives until they have */
    int etcd_closed;
    void (*done)(void *data);
    void *done_data;
};

static void tick(uv_timer_t *t);

static void schedule(wk_register_t *r, uint64_t ms)
{
    if (!r->stopping)
        uv_timer_start(&r->timer, tick, ms, 0);
}

static uint64_t renew_ms(const wk_register_t *r)
{
    return r->ttl_s * 1000ull / 3;
}

static void on_timer_closed(uv_handle_t *h)
{
    wk_register_t *r = h->data;
    if (r->done)
        r->done(r->done_data);
    free(r->value);
    free(r);
}

static void maybe_free(wk_register_t *r)
{
    if (r->etcd_closed && r->calls == 0 && !uv_is_closing((uv_handle_t *)&r->timer))
        uv_close((uv_handle_t *)&r->timer, on_timer_closed);
}

static void finish(wk_register_t *r)
{
    if (!r->etcd_closed) {
        r->etcd_closed = 1;
        baton_etcd_close(r->etcd);
    }
    maybe_free(r);
}

static void on_put(void *data, int err, json_t *res)
{
    (void)res;
    wk_register_t *r = data;
    r->busy = 0;
    if (--r->calls, r->stopping) {
        maybe_free(r);
        return;
    }
    if (err != 0) {
        log_warn(COMP, "put_failed key=%s err=%s", r->key, baton_err_name(err));
        schedule(r, 500);
        return;
    }
    r->registered = 1;
    log_info(COMP, "registered key=%s lease=%lld ttl_s=%u", r->key, (long long)r->lease, r->ttl_s);
    schedule(r, renew_ms(r));
}

static void on_grant(void *data, int err, json_t *res)
{
    wk_register_t *r = data;
    r->busy = 0;
    if (--r->calls, r->stopping) {
        maybe_free(r);
        return;
    }
    int64_t id = err == 0 ? baton_etcd_int(res, "ID", 0) : 0;
    if (id == 0) {
        log_warn(COMP, "lease_grant_failed err=%s", err ? baton_err_name(err) : "no ID");
        schedule(r, 500);
        return;
    }
    r->lease = id;
    r->registered = 0;
    schedule(r, 0); /* put at once */
}

static void on_keepalive(void *data, int err, json_t *res)
{
    wk_register_t *r = data;
    r->busy = 0;
    if (--r->calls, r->stopping) {
        maybe_free(r);
        return;
    }
    if (err != 0) {
        /* etcd unreachable: keep trying; if it lasts past the TTL the lease is gone and the
         * answer below says so once etcd is back. */
        log_warn(COMP, "keepalive_failed err=%s", baton_err_name(err));
        schedule(r, renew_ms(r) / 2 + 1);
        return;
    }
    if (baton_etcd_int(json_object_get(res, "result"), "TTL", 0) <= 0) {
        log_warn(COMP, "lease_expired lease=%lld action=register_again", (long long)r->lease);
        r->lease = 0;
        r->registered = 0;
        schedule(r, 0);
        return;
    }
    schedule(r, renew_ms(r));
}

static void tick(uv_timer_t *t)
{
    wk_register_t *r = t->data;
    if (r->busy || r->stopping)
        return;
    json_t *body;
    const char *api;
    baton_etcd_cb cb;
    if (r->lease == 0) {
        api = "/v3/lease/grant";
        cb = on_grant;
        body = json_pack("{s:I}", "TTL", (json_int_t)r->ttl_s);
    } else if (!r->registered) {
        api = "/v3/kv/put";
        cb = on_put;
        json_t *k = baton_etcd_b64(r->key, strlen(r->key));
        json_t *v = baton_etcd_b64(r->value, strlen(r->value));
        body = k && v ? json_pack("{s:o, s:o, s:I}", "key", k, "value", v, "lease",
                                  (json_int_t)r->lease)
                      : NULL;
        if (body == NULL) {
            json_decref(k);
            json_decref(v);
        }
    } else {
        api = "/v3/lease/keepalive";
        cb = on_keepalive;
        body = json_pack("{s:I}", "ID", (json_int_t)r->lease);
    }
    int rc = body ? baton_etcd_call(r->etcd, api, body, cb, r) : BATON_ENOMEM;
    json_decref(body);
    if (rc == 0) {
        r->busy = 1;
        r->calls++;
    } else
        schedule(r, 500);
}

int wk_register_start(wk_register_t **reg_p, uv_loop_t *loop, const char *etcd_url,
                      const char *user, const char *password, struct baton_tls_s *tls,
                      unsigned ttl_s, const char *key_name, const char *value_json, char *err,
                      size_t errlen)
{
    baton_etcd_url_t url;
    int rc = baton_etcd_url_parse(etcd_url, &url, err, errlen);
    if (rc != 0)
        return rc;
    if (url.tls && tls == NULL) {
        snprintf(err, errlen, "etcds:// needs a TLS configuration");
        return BATON_EINVAL;
    }
    wk_register_t *r = calloc(1, sizeof(*r));
    if (r == NULL || (r->value = strdup(value_json)) == NULL) {
        free(r);
        return BATON_ENOMEM;
    }
    r->ttl_s = ttl_s < 2 ? 2 : ttl_s;
    snprintf(r->key, sizeof(r->key), "%s/workers/%s", url.prefix, key_name);
    /* Calls give up well inside one renewal period, so a slow member cannot eat the lease. */
    uint64_t timeout = renew_ms(r) / 2 > 200 ? renew_ms(r) / 2 : 200;
    if ((rc = baton_etcd_create(&r->etcd, loop, &url, user, password, tls, timeout)) != 0) {
        free(r->value);
        free(r);
        return rc;
    }
    uv_timer_init(loop, &r->timer);
    r->timer.data = r;
    schedule(r, 0);
    *reg_p = r;
    return 0;
}

static void on_revoked(void *data, int err, json_t *res)
{
    (void)res;
    wk_register_t *r = data;
    r->calls--;
    log_info(COMP, "lease_revoked key=%s err=%s", r->key, err ? baton_err_name(err) : "none");
    finish(r);
}

void wk_register_stop(wk_register_t *r, void (*done)(void *data), void *data)
{
    if (r == NULL || r->stopping)
        return;
    r->stopping = 1;
    r->done = done;
    r->done_data = data;
    uv_timer_stop(&r->timer);
    json_t *body = r->lease ? json_pack("{s:I}", "ID", (json_int_t)r->lease) : NULL;
    if (body != NULL && baton_etcd_call(r->etcd, "/v3/lease/revoke", body, on_revoked, r) == 0)
        r->calls++;
    else
        finish(r);
    json_decref(body);
}
