/* store/master_http.c — the master's HTTP API: GET /health, GET /metrics (Prometheus) and
 * GET /batch_query_keys?keys=a,b[&ns=NS] (read-only: grants no lease; what a router asks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/log.h"
#include "http/tls.h"
#include "store/master.h"

#define QUERY_KEYS_MAX BATON_STORE_BATCH_MAX

/* Percent-decodes s[0..n) into out (room for cap, NUL-terminated). -1: malformed, too long or
 * a NUL byte. */
static int pct_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            if (i + 2 >= n)
                return -1;
            int hi = baton_hex_value(s[i + 1]), lo = baton_hex_value(s[i + 2]);
            if (hi < 0 || lo < 0)
                return -1;
            c = hi * 16 + lo;
            i += 2;
        } else if (c == '+') {
            c = ' ';
        }
        if (c == 0 || o + 1 >= cap)
            return -1;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return 0;
}

/* The value of query parameter `name` (raw), or NULL. */
static const char *query_param(const char *q, const char *name, size_t *len_p)
{
    size_t nl = strlen(name);
    const char *p = q;
    while (p && *p) {
        const char *amp = strchr(p, '&');
        size_t plen = amp ? (size_t)(amp - p) : strlen(p);
        if (plen > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
            *len_p = plen - nl - 1;
            return p + nl + 1;
        }
        p = amp ? amp + 1 : NULL;
    }
    return NULL;
}

static int authorized(baton__master_t *ms, baton_http_req_t *req)
{
    if (ms->admin_token[0] == '\0')
        return 1;
    const baton_http_header_t *h = baton_http_req_header(req, "authorization");
    if (h == NULL || strncmp(h->value, "Bearer ", 7) != 0)
        return 0;
    const char *t = h->value + 7;
    size_t a = strlen(t), b = strlen(ms->admin_token);
    volatile unsigned char diff = (unsigned char)(a != b);
    for (size_t i = 0; i < a && i < b; i++)
        diff |= (unsigned char)(t[i] ^ ms->admin_token[i]);
    return diff == 0;
}

static void batch_query(baton__master_t *ms, baton_http_req_t *req)
{
    size_t klen = 0, nslen = 0;
    const char *keys = query_param(req->query, "keys", &klen);
    const char *nsraw = query_param(req->query, "ns", &nslen);
    char ns[BATON_STORE_NAMESPACE_MAX + 1] = "default";
    if (keys == NULL || klen == 0) {
        baton_http_respond_error(req, 400, "keys=a,b,... is required", "invalid_request_error",
                                 "keys", NULL);
        return;
    }
    if (nsraw && pct_decode(nsraw, nslen, ns, sizeof(ns)) != 0) {
        baton_http_respond_error(req, 400, "bad namespace", "invalid_request_error", "ns", NULL);
        return;
    }
    baton_buf_t b = BATON_BUF_INIT;
    baton_buf_append_str(&b, "{");
    size_t n = 0;
    const char *p = keys, *end = keys + klen;
    while (p <= end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *stop = comma ? comma : end;
        char key[BATON_STORE_KEY_MAX + 1];
        if (++n > QUERY_KEYS_MAX || stop == p ||
            pct_decode(p, (size_t)(stop - p), key, sizeof(key)) != 0) {
            baton_buf_free(&b);
            baton_http_respond_error(req, 400, n > QUERY_KEYS_MAX ? "too many keys" : "bad key",
                                     "invalid_request_error", "keys", NULL);
            return;
        }
        uint64_t len = 0;
        uint32_t reps = 0;
        int there = baton__meta_exists(ms->meta, ns, key, 0, 0, &len, &reps);
        if (n > 1)
            baton_buf_append_str(&b, ",");
        baton_buf_append_json_string(&b, key, strlen(key));
        baton_buf_printf(&b, ":{\"exists\":%s,\"size\":%llu,\"replicas\":%u}",
                         there ? "true" : "false", (unsigned long long)len, reps);
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    baton_buf_append_str(&b, "}");
    baton_http_respond(req, 200, "application/json", NULL, 0, b.data, b.len);
    baton_buf_free(&b);
}

static void metrics(baton__master_t *ms, baton_http_req_t *req)
{
    baton__meta_stats_t st;
    baton__meta_stats(ms->meta, &st);
    baton_buf_t b = BATON_BUF_INIT;
#define G(name, help, v)                                                                           \
    baton_buf_printf(&b,                                                                           \
                     "# HELP baton_store_" name " " help "\n# TYPE baton_store_" name              \
                     " gauge\nbaton_store_" name " %llu\n",                                        \
                     (unsigned long long)(v))
#define C(name, help, v)                                                                           \
    baton_buf_printf(&b,                                                                           \
                     "# HELP baton_store_" name " " help "\n# TYPE baton_store_" name              \
                     " counter\nbaton_store_" name " %llu\n",                                      \
                     (unsigned long long)(v))
    G("capacity_bytes", "Bytes of live segments.", st.capacity);
    G("used_bytes", "Bytes allocated to objects (uncommitted and taken-over puts included).",
      st.used);
    G("objects", "Committed objects.", st.objects);
    G("puts_in_flight", "Uncommitted puts.", st.putting);
    G("nodes", "Live nodes.", st.nodes);
    G("leader", "1 when this master serves (the leader).", ms->leader);
    C("puts_total", "Objects asked to be put.", st.puts);
    C("commits_total", "Objects committed.", st.commits);
    C("revokes_total", "Puts revoked by their putter.", st.revokes);
    C("takeovers_total", "Uncommitted puts taken over after the put timeout.", st.takeovers);
    C("gets_total", "Objects asked for by get.", st.gets);
    C("hits_total", "Gets that found the object.", st.hits);
    C("misses_total", "Gets that did not.", st.misses);
    C("evictions_total", "Objects evicted.", st.evictions);
    C("evicted_bytes_total", "Bytes evicted.", st.evicted_bytes);
    C("lease_waits_total", "Removes refused because of a lease.", st.lease_denials);
    C("nodes_lost_total", "Nodes declared lost.", st.nodes_lost);
    C("objects_lost_total", "Objects lost with their last replica.", st.objects_lost);
    C("state_refused_total", "Illegal object state transitions refused (a bug when not 0).",
      st.refused);
    C("ctrl_refused_total", "Control connections refused (framing, authentication).",
      baton__slisten_refused(ms->ctrl));
    baton__mlog_stats_t lg;
    baton__mlog_stats(ms, &lg);
    C("leader_acquired_total", "Times this master won the election.", ms->leader_acquired);
#define F(name, help, type, v)                                                                     \
    baton_buf_printf(&b,                                                                           \
                     "# HELP baton_store_" name " " help "\n# TYPE baton_store_" name " " type     \
                     "\nbaton_store_" name " %.3f\n",                                              \
                     (double)(v))
    F("failover_seconds",
      "From winning the election to serving (the restore from the log), last time.", "gauge",
      ms->failover_ms / 1000.0);
    G("restored_nodes", "Nodes restored from the operation log at the last takeover.",
      lg.restored_nodes);
    G("restored_objects", "Committed objects restored from the operation log at the last takeover.",
      lg.restored_objects);
    G("restored_putting",
      "Uncommitted puts found in the operation log at the last takeover (taken over).",
      lg.restored_putting);
    G("restore_dropped", "Log records not restored (no live copy of a stripe, or malformed).",
      lg.dropped);
    C("oplog_records_total", "Records queued for the operation log.", lg.queued);
    C("oplog_txns_total", "Transactions written to the operation log.", lg.txns);
    F("oplog_txn_seconds_total", "Time spent in operation log transactions.", "counter",
      lg.txn_ms / 1000.0);
    C("oplog_retries_total", "Operation log transactions sent again after an etcd error.",
      lg.retries);
    G("oplog_pending", "Records queued and not yet in etcd.", lg.pending);
    baton__mkvev_stats_t kv;
    baton__mkvev_stats(ms, &kv);
    G("kv_event_blocks", "Objects holding a KV block (published as stored when committed).",
      kv.blocks);
    C("kv_events_stored_total", "BlockStored events published.", kv.stored);
    C("kv_events_removed_total", "BlockRemoved events published.", kv.removed);
    C("kv_event_batches_total", "KV event batches published.", kv.batches);
    C("kv_event_overflows_total", "Batches replaced by AllBlocksCleared (too many events).",
      kv.overflows);
#undef G
#undef F
#undef C
    baton_http_respond(req, 200, "text/plain; version=0.0.4", NULL, 0, b.data, b.len);
    baton_buf_free(&b);
}

static void on_http(baton_http_req_t *req, void *ctx)
{
    baton__master_t *ms = ctx;
    if (strcmp(req->method, "GET") != 0) {
        baton_http_respond_error(req, 405, "only GET", "invalid_request_error", NULL, NULL);
        return;
    }
    if (strcmp(req->path, "/health") == 0) {
        static const char lead[] = "{\"status\":\"ok\",\"leader\":true}";
        static const char standby[] = "{\"status\":\"ok\",\"leader\":false}";
        const char *b = ms->leader ? lead : standby;
        baton_http_respond(req, 200, "application/json", NULL, 0, b, strlen(b));
        return;
    }
    if (strcmp(req->path, "/metrics") != 0 && strcmp(req->path, "/batch_query_keys") != 0) {
        baton_http_respond_error(req, 404, "not found", "invalid_request_error", NULL, NULL);
        return;
    }
    if (!authorized(ms, req)) {
        baton_http_respond_error(req, 401, "a valid bearer token is required",
                                 "authentication_error", NULL, NULL);
        return;
    }
    if (strcmp(req->path, "/metrics") == 0)
        metrics(ms, req);
    else
        batch_query(ms, req);
}

int baton__master_http_start(baton__master_t *ms)
{
    const baton__master_opts_t *o = &ms->opts;
    if (o->tls_cert || o->tls_key || o->tls_client_ca) {
        char why[400] = "";
        baton_tls_opts_t to = {o->tls_cert, o->tls_key, o->tls_client_ca};
        if (o->tls_cert == NULL || o->tls_key == NULL) {
            log_error("store",
                      "master_tls_invalid reason=\"--tls-cert and --tls-key go together\"");
            return BATON_XFER_EINVAL;
        }
        if (baton_tls_create(&ms->http_tls, BATON_TLS_SERVER, &to, why, sizeof(why)) != 0) {
            log_error("store", "master_tls_invalid reason=\"%s\"", why);
            return BATON_XFER_EINVAL;
        }
    }
    int rc = baton_http_server_create(&ms->http, ms->loop, NULL, on_http, ms);
    if (rc == 0 && ms->http_tls)
        baton_http_server_set_tls(ms->http, ms->http_tls);
    if (rc == 0)
        rc = baton_http_server_listen(ms->http, o->host, o->http_port, 0);
    if (rc == 0 && ms->http_tls)
        log_info("store", "master_http_tls client_auth=%s", o->tls_client_ca ? "required" : "off");
    return rc;
}

void baton__master_http_reload(baton__master_t *ms)
{
    char why[400] = "";
    if (ms->http_tls == NULL)
        return;
    if (baton_tls_reload(ms->http_tls, why, sizeof(why)) != 0)
        log_error("store", "master_tls_reload_failed reason=\"%s\" action=\"previous kept\"", why);
    else
        log_info("store", "master_tls_reloaded");
}

void baton__master_http_stop(baton__master_t *ms)
{
    baton_tls_destroy(ms->http_tls);
    ms->http_tls = NULL;
}
