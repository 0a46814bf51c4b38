/* router_metrics.c — the router's baton_* metric families and the worker-gauge sync. */
#include "router/dataplane/router_metrics.h"

#include "baton/error.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double baton_router_latency_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                               0.1,    0.25,  0.5,    1,     2.5,  5,     10,
                                               30,     60,    120,    300,   600};
const size_t baton_router_latency_buckets_n =
    sizeof(baton_router_latency_buckets) / sizeof(baton_router_latency_buckets[0]);

typedef struct {
    char id[BATON_WORKER_ID_MAX];
    baton_worker_role_t role;
} seen_worker_t;

struct baton_router_metrics_s {
    baton_metrics_t *reg;
    baton_metric_family_t *requests;
    baton_metric_family_t *duration;
    baton_metric_family_t *ttfb;
    baton_metric_family_t *in_flight;
    baton_metric_family_t *workers;
    baton_metric_family_t *upstream_errors;
    baton_metric_family_t *model_requests;

    pthread_mutex_t sync_lock; /* the worker series published by the last sync */
    seen_worker_t *seen;
    size_t n_seen;
};

int baton_router_metrics_create(baton_router_metrics_t **m_p, baton_metrics_t *reg)
{
    if (reg == NULL)
        return BATON_EINVAL;
    baton_router_metrics_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return BATON_ENOMEM;
    if (pthread_mutex_init(&m->sync_lock, NULL) != 0) {
        free(m);
        return BATON_ENOMEM;
    }
    m->reg = reg;
    const char *route_status[] = {"route", "status"};
    const char *route[] = {"route"};
    const char *worker_role[] = {"worker", "role"};
    const char *role[] = {"role"};
    const char *role_kind[] = {"role", "kind"};
    const char *model_status[] = {"model", "status"};
    m->requests = baton_metrics_counter(reg, "baton_requests_total",
                                        "Client requests answered by the router, by route and "
                                        "HTTP status.",
                                        2, route_status);
    m->duration = baton_metrics_histogram(
        reg, "baton_request_duration_seconds",
        "Client request duration in seconds, first request byte to last response byte.", 1, route,
        baton_router_latency_buckets, baton_router_latency_buckets_n);
    m->ttfb = baton_metrics_histogram(
        reg, "baton_time_to_first_byte_seconds",
        "Router-observed time to first response byte in seconds, by route.", 1, route,
        baton_router_latency_buckets, baton_router_latency_buckets_n);
    m->in_flight = baton_metrics_gauge(reg, "baton_worker_in_flight_requests",
                                       "Requests in flight to each worker (worker = worker id).", 2,
                                       worker_role);
    m->workers = baton_metrics_gauge(reg, "baton_workers", "Registered workers by role.", 1, role);
    m->upstream_errors = baton_metrics_counter(
        reg, "baton_upstream_errors_total",
        "Failed upstream requests to workers, by worker role and error kind.", 2, role_kind);
    m->model_requests = baton_metrics_counter(
        reg, "baton_model_requests_total",
        "Inference requests answered, by requested model (\"other\": a name no registered "
        "worker serves, or none) and HTTP status.",
        2, model_status);
    if (m->model_requests == NULL || m->requests == NULL || m->duration == NULL || m->ttfb == NULL || m->in_flight == NULL ||
        m->workers == NULL || m->upstream_errors == NULL) {
        /* Families already registered stay in `reg` (a registry cannot drop one); the usual
         * cause is calling create twice on the same registry. */
        pthread_mutex_destroy(&m->sync_lock);
        free(m);
        return BATON_EEXIST;
    }
    for (int r = 0; r < BATON_ROLE_COUNT; r++) {
        const char *v[] = {baton_worker_role_name((baton_worker_role_t)r)};
        baton_gauge_set(baton_metric_child(m->workers, v), 0);
    }
    *m_p = m;
    return 0;
}

void baton_router_metrics_destroy(baton_router_metrics_t *m)
{
    if (m == NULL)
        return;
    pthread_mutex_destroy(&m->sync_lock);
    free(m->seen);
    free(m);
}

/* The status label: the statuses the router and the engines it fronts answer with their own
 * number, any other its class ("2xx") or "other", so a worker's answers cannot grow the label
 * set. */
static const char *status_label(int status, char st[16])
{
    static const short known[] = {200, 201, 202, 204, 206, 301, 302, 304, 307, 308, 400, 401, 403,
                                  404, 405, 406, 408, 409, 410, 411, 413, 414, 415, 416, 422, 424,
                                  425, 426, 429, 431, 499, 500, 501, 502, 503, 504, 505};
    for (size_t i = 0; i < sizeof(known) / sizeof(*known); i++) {
        if (known[i] == status) {
            snprintf(st, 16, "%d", status);
            return st;
        }
    }
    static const char *const classes[] = {"1xx", "2xx", "3xx", "4xx", "5xx"};
    return status >= 100 && status <= 599 ? classes[status / 100 - 1] : "other";
}

void baton_router_metrics_request_done(baton_router_metrics_t *m, const char *route, int status,
                                       double duration_s, double ttfb_s)
{
    if (m == NULL)
        return;
    if (route == NULL)
        route = "other";
    char st[16];
    const char *rs[] = {route, status_label(status, st)};
    const char *r[] = {route};
    baton_counter_add(baton_metric_child(m->requests, rs), 1);
    if (duration_s >= 0)
        baton_histogram_observe(baton_metric_child(m->duration, r), duration_s);
    if (ttfb_s >= 0)
        baton_histogram_observe(baton_metric_child(m->ttfb, r), ttfb_s);
}

void baton_router_metrics_model_done(baton_router_metrics_t *m, const char *model, int status)
{
    if (m == NULL)
        return;
    char st[16];
    const char *v[] = {model ? model : "other", status_label(status, st)};
    baton_counter_add(baton_metric_child(m->model_requests, v), 1);
}

void baton_router_metrics_upstream_error(baton_router_metrics_t *m, baton_worker_role_t role,
                                         const char *kind)
{
    if (m == NULL)
        return;
    const char *v[] = {baton_worker_role_name(role), kind ? kind : "other"};
    baton_counter_add(baton_metric_child(m->upstream_errors, v), 1);
}

const char *baton_router_metrics_error_kind(int err)
{
    switch (err) {
    case BATON_ECONNECT:
        return "connect";
    case BATON_ETIMEOUT_CONNECT:
    case BATON_ETIMEOUT_FIRST_BYTE:
    case BATON_ETIMEOUT_IDLE:
    case BATON_ETIMEOUT_TOTAL:
    case BATON_ETIMEOUT:
        return "timeout";
    case BATON_EEOF:
    case BATON_ECLOSED:
        return "closed";
    case BATON_EUPSTREAM:
    case BATON_EPROTO:
        return "protocol";
    case BATON_ECANCELED:
        return "canceled";
    case BATON_ETLS:
        return "tls";
    default:
        return "other";
    }
}

void baton_router_metrics_sync(baton_router_metrics_t *m, baton_registry_t *workers)
{
    if (m == NULL || workers == NULL)
        return;
    baton_worker_t *stack[64], **ws;
    size_t n = baton_registry_snapshot_all(workers, BATON_ROLE_ANY, BATON_SNAP_ALL, stack, 64, &ws);
    seen_worker_t *now = malloc((n ? n : 1) * sizeof(*now));

    pthread_mutex_lock(&m->sync_lock);
    double per_role[BATON_ROLE_COUNT] = {0};
    for (size_t i = 0; i < n; i++) {
        baton_worker_t *w = ws[i];
        per_role[w->role] += 1;
        const char *v[] = {w->id, baton_worker_role_name(w->role)};
        baton_gauge_set(baton_metric_child(m->in_flight, v), (double)baton_worker_in_flight(w));
        if (now != NULL) {
            memcpy(now[i].id, w->id, sizeof(now[i].id));
            now[i].role = w->role;
        }
    }
    for (int r = 0; r < BATON_ROLE_COUNT; r++) {
        const char *v[] = {baton_worker_role_name((baton_worker_role_t)r)};
        baton_gauge_set(baton_metric_child(m->workers, v), per_role[r]);
    }
    if (now != NULL) {
        /* Series of workers gone since the last sync disappear from the output. */
        for (size_t i = 0; i < m->n_seen; i++) {
            size_t j = 0;
            while (j < n &&
                   !(strcmp(m->seen[i].id, now[j].id) == 0 && m->seen[i].role == now[j].role))
                j++;
            if (j == n) {
                const char *v[] = {m->seen[i].id, baton_worker_role_name(m->seen[i].role)};
                baton_metric_child_remove(m->in_flight, v);
            }
        }
        free(m->seen);
        m->seen = now;
        m->n_seen = n;
    }
    pthread_mutex_unlock(&m->sync_lock);

    baton_workers_release(ws, n, stack);
}

int baton_router_metrics_render(baton_router_metrics_t *m, baton_registry_t *workers,
                                baton_buf_t *out)
{
    if (m == NULL || out == NULL)
        return BATON_EINVAL;
    baton_router_metrics_sync(m, workers);
    return baton_metrics_render(m->reg, out);
}
