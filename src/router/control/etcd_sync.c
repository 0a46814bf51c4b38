/* etcd_sync.c — the router's side of the shared registry: resync, watch, publish, outage state. */
#include "router/control/etcd_sync.h"

#include "baton/error.h"
#include "common/hash.h"
#include "common/list.h"
#include "common/log.h"
#include "common/u64map.h"
#include "etcd/etcd.h"
#include "router/control/admin.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BACKOFF_FIRST_MS 100
#define BACKOFF_MAX_MS   2000
/* A watch on a hung or partitioned member just goes quiet; a linearizable read this often
 * (through the client's fail-over) tells whether the member the watch is on still serves. */
#define CHECK_INTERVAL_MS 2000

typedef struct op_s {
    baton_list_t node;
    int is_put;
    char id[BATON_WORKER_ID_MAX];
    char *value; /* put: the JSON value */
} op_t;

struct baton_etcd_sync_s {
    uv_loop_t *loop;
    baton_registry_t *reg;
    baton_etcd_t *etcd;
    baton_etcd_url_t url;
    char key_prefix[300]; /* PREFIX/workers/ */
    char key_end[300];

    /* Filled by router threads, drained on the loop. */
    uv_mutex_t lock;
    baton_list_t incoming;
    uv_async_t wake;

    baton_list_t pending; /* ops to publish, in order (loop thread) */
    int busy;             /* an op or the range read is in flight */
    int need_sync;
    int closing;
    baton_etcd_watch_t *watch;
    int64_t revision; /* last revision applied */
    uv_timer_t retry;
    uint64_t backoff_ms;
    int connected; /* -1 before the first answer */
    uint64_t down_since_ms;
    uv_timer_t check;
    int checking;       /* a liveness read in flight */
    char watch_ep[300]; /* the endpoint the current watch was created on */
    unsigned uncreated; /* liveness ticks the current watch has waited for "created" */

    /* etcd key hash → known_t: the keys this router applied, and the worker each names. */
    baton_u64map_t known;
    int listed; /* the first full read was applied */

    baton_metric_child_t *m_up, *m_resyncs, *m_errors, *m_put, *m_del, *m_revision, *m_workers;
};

/* One key under the prefix as last applied. Several keys may name one URL (a worker's own
 * registration and a router's publication, say): the worker is the one the newest of them
 * describes, and stays while any is left, so every router holds the same set whatever the
 * order it saw the keys in (a full read is applied in mod_revision order, as a watch sees it). */
typedef struct {
    char *id;    /* the registry id of the worker the value names */
    char *key;   /* the etcd key, for deleting it */
    char *value; /* the JSON value (text) */
    int64_t mod_rev;
} known_t;

static void step(baton_etcd_sync_t *s);

static uint64_t key_hash(const char *key, size_t len)
{
    return baton_fnv1a64_add(BATON_FNV1A64_INIT, key, len);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void set_state(baton_etcd_sync_t *s, int connected, int err)
{
    char detail[256];
    size_t n = baton_registry_size(s->reg);
    if (connected) {
        if (s->connected == 0)
            log_info("etcd", "registry_reconnected endpoint=%s down_ms=%llu workers=%zu",
                     baton_etcd_endpoint(s->etcd),
                     (unsigned long long)(now_ms() - s->down_since_ms), n);
        snprintf(detail, sizeof(detail), "watching %.100s at revision %lld via %.100s",
                 s->url.prefix, (long long)s->revision, baton_etcd_endpoint(s->etcd));
    } else {
        if (s->connected != 0) {
            s->down_since_ms = now_ms();
            log_warn("etcd",
                     "registry_unreachable err=%s action=\"serving the last known %zu workers, "
                     "retrying\"",
                     baton_err_name(err), n);
        }
        snprintf(detail, sizeof(detail),
                 "etcd unreachable for %llu ms (%s): serving the last known %zu workers",
                 (unsigned long long)(now_ms() - s->down_since_ms), baton_err_name(err), n);
    }
    s->connected = connected;
    baton_gauge_set(s->m_up, connected);
    baton_registry_set_shared_state(s->reg, "etcd", connected, detail);
}

static void on_retry(uv_timer_t *t)
{
    step(t->data);
}

static void failed(baton_etcd_sync_t *s, int err)
{
    baton_counter_add(s->m_errors, 1);
    set_state(s, 0, err);
    s->need_sync = 1;
    uv_timer_start(&s->retry, on_retry, s->backoff_ms, 0);
    s->backoff_ms = s->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : s->backoff_ms * 2;
}

/* ---- applying etcd's view ---- */

static void known_free(known_t *e)
{
    if (e != NULL) {
        free(e->id);
        free(e->key);
        free(e->value);
        free(e);
    }
}

/* A worker's JSON value → the registry (add, or replace when its attributes changed). Returns
 * the worker's id (heap string), or NULL when the value is refused. */
static char *apply_value(baton_etcd_sync_t *s, const char *key, size_t klen, const char *text)
{
    json_t *body = text ? json_loads(text, JSON_REJECT_DUPLICATES, NULL) : NULL;
    baton_worker_desc_t d;
    baton_worker_spec_t spec;
    char err[256] = "", *id = NULL;
    if (body == NULL || baton_admin_desc_parse(body, &d, err, sizeof(err)) != 0) {
        log_warn("etcd", "bad_worker_value key=%.*s reason=\"%s\"", (int)klen, key,
                 body ? err : "not base64 JSON");
        json_decref(body);
        return NULL;
    }
    BATON_WORKER_DESC_COPY_FIELDS(&spec, &d);
    baton_worker_t *cur = baton_registry_find_url(s->reg, spec.url);
    if (cur != NULL) {
        /* Without a protocol the value takes the router's default, which cur already has. */
        baton_worker_spec_t now;
        BATON_WORKER_DESC_COPY_FIELDS(&now, cur);
        if (spec.pd_protocol == BATON_PD_UNSET)
            now.pd_protocol = BATON_PD_UNSET;
        if (baton_worker_spec_equal(&spec, &now)) {
            id = strdup(cur->id);
            baton_worker_unref(cur);
            baton_worker_desc_free(&d);
            json_decref(body);
            return id;
        }
        baton_registry_remove(s->reg, cur->id); /* changed attributes: replaced below */
        baton_worker_unref(cur);
    }
    baton_worker_t *w = NULL;
    int rc = baton_registry_add(s->reg, &spec, &w, err, sizeof(err));
    if (rc == 0) {
        log_info("etcd", "worker_added id=%s url=%s role=%s key=%.*s", w->id, w->url,
                 baton_worker_role_name(w->role), (int)klen, key);
        id = strdup(w->id);
        baton_worker_unref(w);
    } else {
        log_warn("etcd", "worker_rejected key=%.*s reason=\"%s\"", (int)klen, key, err);
    }
    baton_worker_desc_free(&d);
    json_decref(body);
    return id;
}

/* No key names worker `id` as it did any more: it follows the newest key left naming it, or
 * goes when there is none. */
static void settle(baton_etcd_sync_t *s, const char *id)
{
    known_t *best = NULL, *e;
    size_t it = 0;
    while ((e = baton_u64map_next(&s->known, &it, NULL)) != NULL)
        if (strcmp(e->id, id) == 0 && (best == NULL || e->mod_rev > best->mod_rev))
            best = e;
    if (best != NULL) {
        free(apply_value(s, best->key, strlen(best->key), best->value));
        return;
    }
    if (baton_registry_remove(s->reg, id) == 0)
        log_info("etcd", "worker_removed id=%s", id);
}

static void forget(baton_etcd_sync_t *s, uint64_t h)
{
    known_t *old = baton_u64map_del(&s->known, h);
    if (old != NULL) {
        settle(s, old->id);
        known_free(old);
    }
}

/* Remembers that `key` (value text, at mod_rev) names worker id (taken). */
static void remember(baton_etcd_sync_t *s, const char *key, size_t klen, const char *text,
                     int64_t mod_rev, char *id)
{
    known_t *e = calloc(1, sizeof(*e));
    if (e != NULL) {
        e->id = id;
        e->key = strndup(key, klen);
        e->value = strdup(text);
        e->mod_rev = mod_rev;
    }
    if (e == NULL || e->key == NULL || e->value == NULL ||
        baton_u64map_put(&s->known, key_hash(key, klen), e) != 0) {
        log_warn("etcd", "known_set_full id=%s", id);
        if (e == NULL)
            free(id);
        known_free(e);
    }
}

static void apply_put(baton_etcd_sync_t *s, const char *key, size_t klen, const char *text,
                      int64_t mod_rev)
{
    char *id = apply_value(s, key, klen, text);
    known_t *old = baton_u64map_del(&s->known, key_hash(key, klen));
    if (id != NULL)
        remember(s, key, klen, text, mod_rev, id);
    /* The key named another worker before (or its value is refused now): that one follows
     * the keys left naming it. */
    if (old != NULL && (id == NULL || strcmp(old->id, id) != 0))
        settle(s, old->id);
    known_free(old);
}

static void apply_kv(baton_etcd_sync_t *s, json_t *kv, int is_delete)
{
    size_t klen = 0;
    char *key = baton_etcd_unb64(json_object_get(kv, "key"), &klen);
    if (key == NULL)
        return;
    int64_t rev = baton_etcd_int(kv, "mod_revision", 0);
    if (rev > s->revision)
        s->revision = rev;
    if (is_delete) {
        baton_counter_add(s->m_del, 1);
        forget(s, key_hash(key, klen));
    } else {
        baton_counter_add(s->m_put, 1);
        char *text = baton_etcd_unb64(json_object_get(kv, "value"), NULL);
        apply_put(s, key, klen, text, rev);
        free(text);
    }
    free(key);
}

static void on_watch_msg(void *data, json_t *res)
{
    baton_etcd_sync_t *s = data;
    int64_t compact = baton_etcd_int(res, "compact_revision", 0);
    if (compact > 0 || json_is_true(json_object_get(res, "canceled"))) {
        /* Our start revision was compacted away: only a full read can tell what changed. */
        log_warn("etcd", "watch_canceled compact_revision=%lld revision=%lld action=resync",
                 (long long)compact, (long long)s->revision);
        baton_etcd_watch_cancel(s->watch);
        return;
    }
    json_t *evs = json_object_get(res, "events");
    size_t i;
    json_t *ev;
    json_array_foreach(evs, i, ev)
    {
        const char *type = json_string_value(json_object_get(ev, "type"));
        apply_kv(s, json_object_get(ev, "kv"), type != NULL && strcmp(type, "DELETE") == 0);
    }
    if (json_array_size(evs) > 0) {
        baton_gauge_set(s->m_revision, (double)s->revision);
        baton_gauge_set(s->m_workers, (double)baton_registry_size(s->reg));
    }
    if (json_is_true(json_object_get(res, "created"))) {
        /* The member this stream is on, which the liveness read is compared with: the
         * client's current endpoint may be another one if a call failed over meanwhile. */
        baton_etcd_watch_endpoint(s->watch, s->watch_ep, sizeof(s->watch_ep));
        s->uncreated = 0;
        log_info("etcd", "watch_created endpoint=%s revision=%lld", s->watch_ep,
                 (long long)s->revision);
        set_state(s, 1, 0);
    }
}

static void on_watch_end(void *data, int err, json_t *res)
{
    (void)res;
    baton_etcd_sync_t *s = data;
    s->watch = NULL;
    s->watch_ep[0] = '\0';
    if (s->closing) {
        step(s);
        return;
    }
    log_info("etcd", "watch_ended err=%s revision=%lld action=resync", baton_err_name(err),
             (long long)s->revision);
    s->need_sync = 1;
    if (err == BATON_ECANCELED) /* we cancelled it (compaction): resync now */
        step(s);
    else
        failed(s, err);
}

static void on_range(void *data, int err, json_t *res)
{
    baton_etcd_sync_t *s = data;
    s->busy = 0;
    if (s->closing) {
        step(s);
        return;
    }
    if (err != 0) {
        failed(s, err);
        return;
    }
    baton_counter_add(s->m_resyncs, 1);
    /* Everything etcd holds now; what we had from it and is not there any more goes. */
    baton_u64map_t seen;
    baton_u64map_init(&seen);
    size_t i;
    json_t *kv;
    json_array_foreach(json_object_get(res, "kvs"), i, kv)
    {
        size_t klen = 0;
        char *key = baton_etcd_unb64(json_object_get(kv, "key"), &klen);
        if (key == NULL)
            continue;
        baton_u64map_put(&seen, key_hash(key, klen), (void *)1);
        char *text = baton_etcd_unb64(json_object_get(kv, "value"), NULL);
        apply_put(s, key, klen, text, baton_etcd_int(kv, "mod_revision", 0));
        free(text);
        free(key);
    }
    size_t it = 0, n_gone = 0, cap = 0;
    uint64_t k, *gone = NULL;
    while (baton_u64map_next(&s->known, &it, &k) != NULL) {
        if (baton_u64map_get(&seen, k) != NULL)
            continue;
        if (n_gone == cap) {
            uint64_t *g = realloc(gone, (cap = cap ? cap * 2 : 16) * sizeof(*g));
            if (g == NULL)
                break;
            gone = g;
        }
        gone[n_gone++] = k;
    }
    for (size_t j = 0; j < n_gone; j++)
        forget(s, gone[j]);
    free(gone);
    baton_u64map_free(&seen);
    s->revision = baton_etcd_int(json_object_get(res, "header"), "revision", s->revision);
    baton_gauge_set(s->m_revision, (double)s->revision);
    baton_gauge_set(s->m_workers, (double)baton_registry_size(s->reg));
    log_info("etcd", "resynced revision=%lld keys=%zu removed=%zu workers=%zu endpoint=%s",
             (long long)s->revision, json_array_size(json_object_get(res, "kvs")), n_gone,
             baton_registry_size(s->reg), baton_etcd_endpoint(s->etcd));
    /* From the read's revision + 1: nothing between the read and the watch is missed. */
    s->uncreated = 0;
    int rc = baton_etcd_watch(&s->watch, s->etcd, s->key_prefix, s->key_end, s->revision + 1,
                              on_watch_msg, on_watch_end, s);
    if (rc != 0) {
        s->watch = NULL;
        failed(s, rc);
        return;
    }
    s->need_sync = 0;
    s->listed = 1;
    s->backoff_ms = BACKOFF_FIRST_MS;
    set_state(s, 1, 0);
    step(s); /* admin changes queued during the read */
}

/* ---- publishing admin changes ---- */

/* A removal through this router removes the worker for every router: one transaction deletes
 * its canonical key (k, taken) and every other key that names it (a worker's own registration
 * under HOST:PORT, an older publication), so no key is left to bring it back. */
static json_t *delete_all_body(baton_etcd_sync_t *s, const char *id, json_t *k)
{
    json_t *ops = json_array();
    json_t *canon = json_pack("{s:{s:o}}", "requestDeleteRange", "key", k);
    if (ops == NULL || canon == NULL || json_array_append_new(ops, canon) != 0) {
        json_decref(ops);
        return NULL;
    }
    char own[300 + BATON_WORKER_ID_MAX];
    snprintf(own, sizeof(own), "%s%s", s->key_prefix, id);
    known_t *e;
    size_t it = 0;
    while ((e = baton_u64map_next(&s->known, &it, NULL)) != NULL) {
        if (strcmp(e->id, id) != 0 || strcmp(e->key, own) == 0)
            continue;
        json_t *kk = baton_etcd_b64(e->key, strlen(e->key));
        json_t *del = kk ? json_pack("{s:{s:o}}", "requestDeleteRange", "key", kk) : NULL;
        if (del == NULL || json_array_append_new(ops, del) != 0) {
            json_decref(ops);
            return NULL;
        }
    }
    return json_pack("{s:o}", "success", ops);
}

/* Forgets every key naming worker id without touching the registry (it is gone already). */
static void forget_id(baton_etcd_sync_t *s, const char *id)
{
    known_t *e;
    size_t it = 0;
    uint64_t h;
    while ((e = baton_u64map_next(&s->known, &it, &h)) != NULL) {
        if (strcmp(e->id, id) == 0) {
            known_free(baton_u64map_del(&s->known, h)); /* allowed while visiting it */
        }
    }
}

static void op_free(op_t *op)
{
    free(op->value);
    free(op);
}

static void on_op_done(void *data, int err, json_t *res)
{
    baton_etcd_sync_t *s = data;
    s->busy = 0;
    if (s->closing) {
        step(s);
        return;
    }
    op_t *op = container_of(baton_list_first(&s->pending), op_t, node);
    if (err != 0 && err != BATON_EUPSTREAM) {
        /* Unreachable: kept at the head, published (in order) before the next resync reads
         * etcd back. */
        failed(s, err);
        return;
    }
    baton_list_remove(&op->node);
    if (err == BATON_EUPSTREAM) {
        /* etcd answered and refused (permissions, a bad key): retrying would block every later
         * change and the resync; the next resync brings this router back to etcd's view. */
        const char *m = json_string_value(json_object_get(res, "error"));
        log_error("etcd", "publish_rejected op=%s id=%s reason=\"%.200s\"",
                  op->is_put ? "put" : "delete", op->id, m ? m : "?");
        baton_counter_add(s->m_errors, 1);
        op_free(op);
        s->need_sync = 1;
        if (s->watch != NULL)
            baton_etcd_watch_cancel(s->watch); /* its end starts the resync */
        step(s);
        return;
    }
    /* The answer travels apart from the watch: when the watch (or a full read) has already
     * applied etcd at this change's revision or later, the keys it knows are newer than this
     * answer (another router may have changed them since) and stay as they are. */
    int64_t rev = baton_etcd_int(json_object_get(res, "header"), "revision", 0);
    int applied = rev > 0 && rev <= s->revision;
    if (op->is_put && !applied) {
        char key[300 + BATON_WORKER_ID_MAX];
        int klen = snprintf(key, sizeof(key), "%s%s", s->key_prefix, op->id);
        known_free(baton_u64map_del(&s->known, key_hash(key, (size_t)klen)));
        char *id = strdup(op->id);
        if (id != NULL)
            remember(s, key, (size_t)klen, op->value, rev, id);
    } else if (!applied) {
        forget_id(s, op->id); /* every key that named it is gone */
    }
    log_info("etcd", "published op=%s id=%s", op->is_put ? "put" : "delete", op->id);
    op_free(op);
    step(s);
}

static int start_op(baton_etcd_sync_t *s, op_t *op)
{
    char key[300 + BATON_WORKER_ID_MAX];
    snprintf(key, sizeof(key), "%s%s", s->key_prefix, op->id);
    json_t *k = baton_etcd_b64(key, strlen(key));
    json_t *body;
    if (op->is_put) {
        json_t *v = baton_etcd_b64(op->value, strlen(op->value));
        body = k && v ? json_pack("{s:o, s:o}", "key", k, "value", v) : NULL;
        if (body == NULL)
            json_decref(v);
    } else {
        body = k ? delete_all_body(s, op->id, k) : NULL;
    }
    if (body == NULL) {
        json_decref(k);
        return BATON_ENOMEM;
    }
    int rc =
        baton_etcd_call(s->etcd, op->is_put ? "/v3/kv/put" : "/v3/kv/txn", body, on_op_done, s);
    json_decref(body);
    return rc;
}

static void on_check_done(void *data, int err, json_t *res)
{
    (void)res;
    baton_etcd_sync_t *s = data;
    s->checking = 0;
    if (s->closing) {
        step(s);
        return;
    }
    if (s->watch == NULL)
        return;
    /* Failed everywhere, or answered by another member than the watch's: the watch may be
     * stuck on a member that no longer serves; start over from a full read. */
    if (err != 0 || strcmp(baton_etcd_endpoint(s->etcd), s->watch_ep) != 0) {
        log_warn("etcd", "watch_stale watch_endpoint=%s answered_by=%s err=%s action=resync",
                 s->watch_ep, err ? "none" : baton_etcd_endpoint(s->etcd), baton_err_name(err));
        baton_etcd_watch_cancel(s->watch);
    }
}

static void on_check(uv_timer_t *t)
{
    baton_etcd_sync_t *s = t->data;
    if (s->closing || s->checking || s->watch == NULL)
        return;
    if (s->watch_ep[0] == '\0') {
        /* A member that stopped answering between the read and the watch's "created" leaves
         * a watch with no endpoint to check: two ticks without "created" count as stale. */
        if (++s->uncreated >= 2) {
            log_warn("etcd", "watch_stale watch_endpoint=none reason=never_created action=resync");
            s->uncreated = 0;
            baton_etcd_watch_cancel(s->watch);
        }
        return;
    }
    json_t *k = baton_etcd_b64(s->key_prefix, strlen(s->key_prefix));
    json_t *body = k ? json_pack("{s:o, s:b}", "key", k, "count_only", 1) : NULL;
    if (body != NULL && baton_etcd_call(s->etcd, "/v3/kv/range", body, on_check_done, s) == 0)
        s->checking = 1;
    json_decref(body);
}

static void on_wake_closed(uv_handle_t *h)
{
    baton_etcd_sync_t *s = h->data;
    baton_list_splice(&s->pending, &s->incoming);
    baton_list_t *n;
    while ((n = baton_list_first(&s->pending)) != NULL) {
        baton_list_remove(n);
        op_free(container_of(n, op_t, node));
    }
    size_t it = 0;
    known_t *e;
    while ((e = baton_u64map_next(&s->known, &it, NULL)) != NULL)
        known_free(e);
    baton_u64map_free(&s->known);
    uv_mutex_destroy(&s->lock);
    free(s);
}

/* The one driver: pending publications first, then a resync when one is due. */
static void step(baton_etcd_sync_t *s)
{
    if (s->closing) {
        if (!s->busy && !s->checking && s->watch == NULL && s->etcd != NULL) {
            baton_etcd_close(s->etcd);
            s->etcd = NULL;
            uv_close((uv_handle_t *)&s->retry, NULL);
            uv_close((uv_handle_t *)&s->check, NULL);
            uv_close((uv_handle_t *)&s->wake, on_wake_closed); /* closes last: frees s */
        }
        return;
    }
    if (s->busy || uv_is_active((uv_handle_t *)&s->retry))
        return;
    baton_list_t *first = baton_list_first(&s->pending);
    int rc = 0;
    if (first != NULL) {
        s->busy = 1;
        rc = start_op(s, container_of(first, op_t, node));
    } else if (s->need_sync && s->watch == NULL) {
        char pfx_end[300];
        baton_etcd_prefix_end(s->key_prefix, pfx_end, sizeof(pfx_end));
        json_t *k = baton_etcd_b64(s->key_prefix, strlen(s->key_prefix));
        json_t *e = baton_etcd_b64(pfx_end, strlen(pfx_end));
        /* Oldest change first, the order a watch delivers them in (see known_t). */
        json_t *body = k && e ? json_pack("{s:o, s:o, s:s, s:s}", "key", k, "range_end", e,
                                          "sort_order", "ASCEND", "sort_target", "MOD")
                              : NULL;
        if (body == NULL) {
            json_decref(k);
            json_decref(e);
            rc = BATON_ENOMEM;
        } else {
            s->busy = 1;
            rc = baton_etcd_call(s->etcd, "/v3/kv/range", body, on_range, s);
            json_decref(body);
        }
    }
    if (rc != 0) {
        s->busy = 0;
        failed(s, rc);
    }
}

static void on_wake(uv_async_t *a)
{
    baton_etcd_sync_t *s = a->data;
    uv_mutex_lock(&s->lock);
    baton_list_splice(&s->pending, &s->incoming);
    uv_mutex_unlock(&s->lock);
    step(s);
}

static void queue_op(baton_etcd_sync_t *s, const baton_worker_t *w, int is_put)
{
    op_t *op = calloc(1, sizeof(*op));
    json_t *j = is_put ? baton_admin_spec_json(w) : NULL;
    if (op == NULL ||
        (is_put &&
         (j == NULL || (op->value = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS)) == NULL))) {
        log_error("etcd", "publish_dropped id=%s reason=\"out of memory\"", w->id);
        json_decref(j);
        free(op);
        return;
    }
    json_decref(j);
    op->is_put = is_put;
    snprintf(op->id, sizeof(op->id), "%s", w->id);
    baton_list_init(&op->node);
    uv_mutex_lock(&s->lock);
    baton_list_push(&s->incoming, &op->node);
    uv_mutex_unlock(&s->lock);
    uv_async_send(&s->wake);
}

static void hook_add(void *ctx, const baton_worker_t *w)
{
    queue_op(ctx, w, 1);
}

static void hook_remove(void *ctx, const baton_worker_t *w)
{
    queue_op(ctx, w, 0);
}

/* ---- life cycle ---- */

int baton_etcd_sync_create(baton_etcd_sync_t **sync_p, uv_loop_t *loop, baton_registry_t *reg,
                           baton_metrics_t *metrics, const baton_etcd_sync_config_t *cfg, char *err,
                           size_t errlen)
{
    baton_etcd_sync_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return BATON_ENOMEM;
    int rc = baton_etcd_url_parse(cfg->url, &s->url, err, errlen);
    if (rc != 0) {
        free(s);
        return rc;
    }
    s->loop = loop;
    s->reg = reg;
    s->connected = -1;
    s->need_sync = 1;
    s->backoff_ms = BACKOFF_FIRST_MS;
    snprintf(s->key_prefix, sizeof(s->key_prefix), "%s/workers/", s->url.prefix);
    baton_etcd_prefix_end(s->key_prefix, s->key_end, sizeof(s->key_end));
    baton_list_init(&s->incoming);
    baton_list_init(&s->pending);
    baton_u64map_init(&s->known);
    if ((rc = baton_etcd_create(&s->etcd, loop, &s->url, cfg->user, cfg->password, cfg->tls,
                                cfg->timeout_ms)) != 0) {
        free(s);
        snprintf(err, errlen, "etcd client: %s", baton_strerror(rc));
        return rc;
    }
    uv_mutex_init(&s->lock);
    uv_async_init(loop, &s->wake, on_wake);
    uv_timer_init(loop, &s->retry);
    uv_timer_init(loop, &s->check);
    s->wake.data = s->retry.data = s->check.data = s;
    if (metrics != NULL) {
        static const char *const ev_label[] = {"type"};
        baton_metric_family_t *ev = baton_metrics_counter(
            metrics, "baton_registry_etcd_events_total",
            "Worker changes applied from etcd (watch events and resync reads)", 1, ev_label);
        const char *put[] = {"put"}, *del[] = {"delete"};
        s->m_put = baton_metric_child(ev, put);
        s->m_del = baton_metric_child(ev, del);
        s->m_up = baton_metric_child(
            baton_metrics_gauge(metrics, "baton_registry_etcd_up",
                                "1 while the router reads and watches the etcd registry", 0, NULL),
            NULL);
        s->m_resyncs = baton_metric_child(
            baton_metrics_counter(metrics, "baton_registry_etcd_resyncs_total",
                                  "Full reads of the etcd prefix (start, outages, compaction)", 0,
                                  NULL),
            NULL);
        s->m_errors = baton_metric_child(
            baton_metrics_counter(metrics, "baton_registry_etcd_errors_total",
                                  "Failed etcd calls and broken watches", 0, NULL),
            NULL);
        s->m_revision = baton_metric_child(
            baton_metrics_gauge(metrics, "baton_registry_etcd_revision",
                                "Last etcd revision applied to the worker set", 0, NULL),
            NULL);
        s->m_workers = baton_metric_child(
            baton_metrics_gauge(metrics, "baton_registry_workers",
                                "Workers in this router's registry after the last etcd change", 0,
                                NULL),
            NULL);
    }
    baton_gauge_set(s->m_up, 0);
    *sync_p = s;
    return 0;
}

void baton_etcd_sync_start(baton_etcd_sync_t *s)
{
    baton_registry_hooks_t hooks = {hook_add, hook_remove, s};
    baton_registry_set_hooks(s->reg, &hooks);
    baton_registry_set_shared_state(s->reg, "etcd", 0, "connecting");
    uv_timer_start(&s->check, on_check, CHECK_INTERVAL_MS, CHECK_INTERVAL_MS);
    step(s);
}

static void on_wait_expired(uv_timer_t *t)
{
    *(int *)t->data = 1;
}

static void on_wait_closed(uv_handle_t *h)
{
    *(int *)h->data = 2;
}

int baton_etcd_sync_wait_listed(baton_etcd_sync_t *s, uint64_t timeout_ms)
{
    int expired = 0;
    uv_timer_t t;
    uv_timer_init(s->loop, &t);
    t.data = &expired;
    uv_timer_start(&t, on_wait_expired, timeout_ms, 0);
    while (!s->listed && !expired)
        uv_run(s->loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, on_wait_closed);
    while (expired != 2)
        uv_run(s->loop, UV_RUN_ONCE);
    return s->listed;
}

void baton_etcd_sync_close(baton_etcd_sync_t *s)
{
    if (s == NULL || s->closing)
        return;
    s->closing = 1;
    baton_registry_hooks_t none = {NULL, NULL, NULL};
    baton_registry_set_hooks(s->reg, &none);
    uv_timer_stop(&s->retry);
    uv_timer_stop(&s->check);
    if (s->watch != NULL)
        baton_etcd_watch_cancel(s->watch);
    step(s);
}
