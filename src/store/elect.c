/* store/elect.c — the masters' leader election through etcd (lease, create-only transaction,
 * keepalive, step-down) and the leader lookup clients and nodes use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/store.h"
#include "common/clock.h"
#include "common/log.h"
#include "etcd/etcd.h"
#include "store/elect.h"

#define COMP          "store"
#define CAMPAIGN_MS   250
#define PROBE_MS      1000
#define ETCD_TIMEOUT  2000
#define LEADER_SUFFIX "/store/leader"

struct baton__elect_s {
    baton_etcd_t *etcd;
    uv_timer_t timer;
    char key[300];
    char *value;
    uint32_t ttl_s;
    int64_t lease;
    int leader, busy;
    uint64_t last_renew_ms;
    baton__elect_cb cb;
    void *data;
    struct probe_s *probe; /* the holder's control port, being tried */
    void (*resigned)(void *data);
    void *resigned_data;
    uint64_t revoked; /* dead leaders' leases revoked */
};

/*
 * A leader killed outright (kill -9, a crash) leaves its key until etcd expires its lease: the
 * TTL (2 s, etcd's floor with its default election timeout) plus etcd's expiry sweep — about 3 s
 * measured. A standby whose campaign fails tries the holder's control address instead; a refused
 * connection (the host answers, nothing listens on that port: the holder's process is gone) lets
 * it revoke the holder's lease, which deletes the key at once, and campaign again. A holder that
 * does not answer at all (partitioned, host down) is left to its TTL: only a refusal is evidence
 * of its death. A deposed holder still running could not write anyway: the operation log's
 * transactions are fenced by the key's lease.
 */
typedef struct probe_s {
    uv_tcp_t tcp;
    uv_connect_t req;
    uv_timer_t timer;
    baton__elect_t *e; /* NULL once the election went away */
    int64_t lease;
    int closing;
} probe_t;

static int make_client(uv_loop_t *loop, const char *url, baton_etcd_t **etcd_p, char *key,
                       size_t cap)
{
    baton_etcd_url_t u;
    char err[200];
    if (baton_etcd_url_parse(url, &u, err, sizeof(err)) != 0) {
        log_error(COMP, "registry_invalid url=%s reason=\"%s\"", url, err);
        return BATON_XFER_EINVAL;
    }
    if (u.tls) {
        log_error(COMP, "registry_invalid url=%s reason=\"etcds:// is not supported here\"", url);
        return BATON_XFER_ENOTSUP;
    }
    snprintf(key, cap, "%s%s", u.prefix, LEADER_SUFFIX);
    return baton_etcd_create(etcd_p, loop, &u, NULL, NULL, NULL, ETCD_TIMEOUT);
}

static void set_leader(baton__elect_t *e, int leader)
{
    if (e->leader == leader)
        return;
    e->leader = leader;
    log_info(COMP, "leadership %s key=%s lease=%lld", leader ? "acquired" : "lost", e->key,
             (long long)e->lease);
    e->cb(e->data, leader);
}

static void step(baton__elect_t *e);

static void on_keepalive(void *data, int err, json_t *res)
{
    baton__elect_t *e = data;
    e->busy = 0;
    if (err == 0 && baton_etcd_int(json_object_get(res, "result"), "TTL", 0) > 0) {
        e->last_renew_ms = baton_now_ms();
        return;
    }
    if (err == 0) { /* the lease is gone: so is the key */
        e->lease = 0;
        set_leader(e, 0);
        return;
    }
    if (e->leader && baton_now_ms() - e->last_renew_ms >= (uint64_t)e->ttl_s * 1000) {
        log_warn(COMP, "leader_lease_unrenewed for_ms=%llu",
                 (unsigned long long)(baton_now_ms() - e->last_renew_ms));
        e->lease = 0;
        set_leader(e, 0);
    }
}

static void on_revoked(void *data, int err, json_t *res)
{
    baton__elect_t *e = data;
    (void)res;
    e->busy = 0;
    if (err == 0) {
        e->revoked++;
        step(e); /* the key is gone: campaign at once */
    }
}

static void probe_closed(uv_handle_t *h)
{
    probe_t *p = h->data;
    if (--p->closing == 0)
        free(p);
}

static void probe_end(probe_t *p, int refused)
{
    baton__elect_t *e = p->e;
    if (p->closing)
        return;
    p->closing = 2;
    uv_close((uv_handle_t *)&p->tcp, probe_closed);
    uv_close((uv_handle_t *)&p->timer, probe_closed);
    if (e == NULL)
        return;
    e->probe = NULL;
    if (!refused || e->leader || e->busy)
        return;
    log_warn(COMP, "leader_gone key=%s lease=%lld action=\"revoke its lease\"", e->key,
             (long long)p->lease);
    json_t *body = json_pack("{s:I}", "ID", (json_int_t)p->lease);
    if (body && baton_etcd_call(e->etcd, "/v3/lease/revoke", body, on_revoked, e) == 0)
        e->busy = 1;
    json_decref(body);
}

static void on_probe_connect(uv_connect_t *req, int status)
{
    probe_end(req->data, status == UV_ECONNREFUSED);
}

static void on_probe_timeout(uv_timer_t *t)
{
    probe_end(t->data, 0);
}

/* Tries the holder's control address "host:port" (an IP literal; a name is left to the TTL). */
static void probe_holder(baton__elect_t *e, const char *addr, int64_t lease)
{
    const char *colon = strrchr(addr, ':');
    char host[80];
    if (e->probe || lease == 0 || colon == NULL || (size_t)(colon - addr) >= sizeof(host) ||
        strcmp(addr, e->value) == 0)
        return;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    int port = atoi(colon + 1);
    struct sockaddr_storage sa;
    if (port <= 0 || port > 65535 ||
        (uv_ip4_addr(host, port, (struct sockaddr_in *)&sa) != 0 &&
         uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa) != 0))
        return;
    probe_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return;
    p->e = e;
    p->lease = lease;
    uv_loop_t *loop = e->timer.loop;
    uv_tcp_init(loop, &p->tcp);
    uv_timer_init(loop, &p->timer);
    p->tcp.data = p->timer.data = p->req.data = p;
    e->probe = p;
    if (uv_tcp_connect(&p->req, &p->tcp, (struct sockaddr *)&sa, on_probe_connect) != 0) {
        probe_end(p, 0);
        return;
    }
    uv_timer_start(&p->timer, on_probe_timeout, PROBE_MS, 0);
}

static void on_campaign(void *data, int err, json_t *res)
{
    baton__elect_t *e = data;
    e->busy = 0;
    if (err != 0) {
        /* most often our lease expired while we stood by (only a leader keeps its lease
         * alive): take a fresh one for the next campaign */
        e->lease = 0;
        return;
    }
    json_t *ok = json_object_get(res, "succeeded");
    if (json_is_true(ok)) {
        e->last_renew_ms = baton_now_ms();
        set_leader(e, 1);
        return;
    }
    /* held by another: the failure branch read the key (its value and lease) */
    json_t *rr =
        json_object_get(json_array_get(json_object_get(res, "responses"), 0), "response_range");
    json_t *kv = json_array_get(json_object_get(rr, "kvs"), 0);
    char *val = kv ? baton_etcd_unb64(json_object_get(kv, "value"), NULL) : NULL;
    if (val)
        probe_holder(e, val, baton_etcd_int(kv, "lease", 0));
    free(val);
}

static void on_grant(void *data, int err, json_t *res)
{
    baton__elect_t *e = data;
    e->busy = 0;
    if (err == 0) {
        e->lease = baton_etcd_int(res, "ID", 0);
        e->last_renew_ms = baton_now_ms();
    }
    if (e->lease)
        step(e);
}

/* One move: grant a lease, campaign with it, or keep it alive. */
static void step(baton__elect_t *e)
{
    if (e->busy)
        return;
    json_t *body = NULL;
    const char *api;
    baton_etcd_cb cb;
    if (e->lease == 0) {
        api = "/v3/lease/grant";
        cb = on_grant;
        body = json_pack("{s:I}", "TTL", (json_int_t)e->ttl_s);
    } else if (e->leader || baton_now_ms() - e->last_renew_ms >= (uint64_t)e->ttl_s * 1000 / 3) {
        /* a standby keeps its lease alive too: a campaign that wins must not win with a lease
         * about to expire (its first keepalive would find it gone) */
        api = "/v3/lease/keepalive";
        cb = on_keepalive;
        body = json_pack("{s:I}", "ID", (json_int_t)e->lease);
    } else {
        api = "/v3/kv/txn";
        cb = on_campaign;
        json_t *k = baton_etcd_b64(e->key, strlen(e->key));
        json_t *v = baton_etcd_b64(e->value, strlen(e->value));
        body = json_pack("{s:[{s:O,s:s,s:s,s:s}],s:[{s:{s:O,s:o,s:I}}],s:[{s:{s:O}}]}", "compare",
                         "key", k, "target", "CREATE", "result", "EQUAL", "create_revision", "0",
                         "success", "request_put", "key", k, "value", v, "lease",
                         (json_int_t)e->lease, "failure", "request_range", "key", k);
        json_decref(k);
    }
    if (body && baton_etcd_call(e->etcd, api, body, cb, e) == 0)
        e->busy = 1;
    json_decref(body);
}

static void on_timer(uv_timer_t *t)
{
    step(t->data);
}

int baton__elect_start(uv_loop_t *loop, const char *url, const char *value, uint32_t ttl_s,
                       baton__elect_cb cb, void *data, baton__elect_t **e_p)
{
    baton__elect_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return BATON_XFER_ENOMEM;
    int rc = make_client(loop, url, &e->etcd, e->key, sizeof(e->key));
    if (rc != 0) {
        free(e);
        return rc;
    }
    e->value = strdup(value);
    e->ttl_s = ttl_s ? ttl_s : 2;
    e->cb = cb;
    e->data = data;
    uv_timer_init(loop, &e->timer);
    e->timer.data = e;
    /* keepalive at a third of the TTL, campaigns every CAMPAIGN_MS: the shorter of both */
    uint64_t every = e->ttl_s * 1000 / 3 < CAMPAIGN_MS ? e->ttl_s * 1000 / 3 : CAMPAIGN_MS;
    uv_timer_start(&e->timer, on_timer, 0, every);
    *e_p = e;
    return 0;
}

int baton__elect_is_leader(const baton__elect_t *e)
{
    return e && e->leader;
}

static void on_resign(void *data, int err, json_t *res)
{
    baton__elect_t *e = data;
    (void)res;
    log_info(COMP, "leadership_resigned lease=%lld revoked=%s", (long long)e->lease,
             err == 0 ? "yes" : "no");
    e->lease = 0;
    e->leader = 0;
    if (e->resigned)
        e->resigned(e->resigned_data);
}

void baton__elect_resign(baton__elect_t *e, void (*done)(void *data), void *data)
{
    uv_timer_stop(&e->timer);
    e->resigned = done;
    e->resigned_data = data;
    json_t *body = e->lease ? json_pack("{s:I}", "ID", (json_int_t)e->lease) : NULL;
    if (body == NULL || baton_etcd_call(e->etcd, "/v3/lease/revoke", body, on_resign, e) != 0)
        done(data);
    json_decref(body);
}

baton_etcd_t *baton__elect_etcd(const baton__elect_t *e)
{
    return e->etcd;
}

int64_t baton__elect_lease(const baton__elect_t *e)
{
    return e->lease;
}

const char *baton__elect_key(const baton__elect_t *e)
{
    return e->key;
}

/* ---- the leader lookup -------------------------------------------------------------------- */

struct baton__resolver_s {
    baton_etcd_t *etcd;
    char key[300];
};

typedef struct {
    baton__resolve_cb cb;
    void *data;
} rq_t;

static void on_range(void *data, int err, json_t *res)
{
    rq_t *q = data;
    json_t *kvs = err == 0 ? json_object_get(res, "kvs") : NULL;
    json_t *kv = json_is_array(kvs) ? json_array_get(kvs, 0) : NULL;
    char *val = kv ? baton_etcd_unb64(json_object_get(kv, "value"), NULL) : NULL;
    char host[80];
    const char *colon = val ? strrchr(val, ':') : NULL;
    if (colon && colon > val && (size_t)(colon - val) < sizeof(host)) {
        memcpy(host, val, (size_t)(colon - val));
        host[colon - val] = '\0';
        int port = atoi(colon + 1);
        if (port > 0 && port < 65536) {
            q->cb(q->data, 0, host, port);
            free(val);
            free(q);
            return;
        }
    }
    free(val);
    q->cb(q->data, err == BATON_XFER_ECANCELED ? BATON_XFER_ESHUTDOWN : BATON_STORE_ENOLEADER, NULL,
          0);
    free(q);
}

int baton__resolver_create(uv_loop_t *loop, const char *url, baton__resolver_t **r_p)
{
    baton__resolver_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return BATON_XFER_ENOMEM;
    int rc = make_client(loop, url, &r->etcd, r->key, sizeof(r->key));
    if (rc != 0) {
        free(r);
        return rc;
    }
    *r_p = r;
    return 0;
}

int baton__resolve(baton__resolver_t *r, baton__resolve_cb cb, void *data)
{
    rq_t *q = malloc(sizeof(*q));
    json_t *k = baton_etcd_b64(r->key, strlen(r->key));
    json_t *body = k ? json_pack("{s:o}", "key", k) : NULL;
    if (q == NULL || body == NULL) {
        free(q);
        json_decref(body);
        return BATON_XFER_ENOMEM;
    }
    q->cb = cb;
    q->data = data;
    int rc = baton_etcd_call(r->etcd, "/v3/kv/range", body, on_range, q);
    json_decref(body);
    if (rc != 0)
        free(q);
    return rc;
}

void baton__resolver_close(baton__resolver_t *r)
{
    baton_etcd_close(r->etcd);
    free(r);
}
