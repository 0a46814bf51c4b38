/* resil_metrics.c — the resilience layer's metric families (retries, aborts, queue). */
#include "router/dataplane/resil_metrics.h"

#include <stdlib.h>

#include "baton/error.h"
#include "router/dataplane/router_metrics.h"

struct baton_resil_metrics_s {
    baton_metric_family_t *retries, *exhausted, *aborts, *rejected, *migrations;
    baton_metric_child_t *queue_depth, *queue_time, *active;
};

int baton_resil_metrics_create(baton_resil_metrics_t **m_p, baton_metrics_t *reg)
{
    if (reg == NULL)
        return BATON_EINVAL;
    baton_resil_metrics_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return BATON_ENOMEM;
    static const char *const role_reason[] = {"role", "reason"};
    static const char *const reason[] = {"reason"};
    static const char *const outcome[] = {"outcome"};
    m->retries = baton_metrics_counter(reg, "baton_retries_total",
                                       "Upstream attempts retried with a new worker pair, by the "
                                       "role that failed and the reason.",
                                       2, role_reason);
    m->exhausted = baton_metrics_counter(
        reg, "baton_retries_exhausted_total",
        "Retryable failures answered to the client because no retry was left (max_retries), "
        "time was up (out_of_time) or no worker pair was available (no_worker).",
        1, reason);
    m->aborts = baton_metrics_counter(reg, "baton_upstream_aborts_total",
                                      "Upstream requests the router closed before they ended, by "
                                      "worker role and reason.",
                                      2, role_reason);
    m->rejected = baton_metrics_counter(
        reg, "baton_admission_rejected_total",
        "Requests refused by admission control: queue_full (429) or queue_timeout (503).", 1,
        reason);
    m->migrations = baton_metrics_counter(
        reg, "baton_stream_migrations_total",
        "Streams whose worker died after tokens reached the client, by outcome: started, "
        "completed, finished, failed, limit, out_of_time, no_worker.",
        1, outcome);
    baton_metric_family_t *depth = baton_metrics_gauge(
        reg, "baton_queue_depth", "Requests waiting in the admission queue now.", 0, NULL);
    baton_metric_family_t *qtime = baton_metrics_histogram(
        reg, "baton_queue_time_seconds",
        "Time requests spent in the admission queue (admitted or not), in seconds.", 0, NULL,
        baton_router_latency_buckets, baton_router_latency_buckets_n);
    baton_metric_family_t *active =
        baton_metrics_gauge(reg, "baton_active_requests",
                            "Requests holding an admission slot (being proxied) now.", 0, NULL);
    if (m->retries == NULL || m->exhausted == NULL || m->aborts == NULL || m->rejected == NULL ||
        m->migrations == NULL || depth == NULL || qtime == NULL || active == NULL) {
        free(m);
        return BATON_EEXIST;
    }
    m->queue_depth = baton_metric_child(depth, NULL);
    m->queue_time = baton_metric_child(qtime, NULL);
    m->active = baton_metric_child(active, NULL);
    if (m->queue_depth == NULL || m->queue_time == NULL || m->active == NULL) {
        free(m);
        return BATON_ENOMEM;
    }
    baton_gauge_set(m->queue_depth, 0);
    baton_gauge_set(m->active, 0);
    *m_p = m;
    return 0;
}

void baton_resil_metrics_destroy(baton_resil_metrics_t *m)
{
    free(m);
}

static void inc2(baton_metric_family_t *f, const char *a, const char *b)
{
    const char *v[] = {a, b};
    baton_counter_inc_labels(f, v);
}

void baton_resil_metrics_retry(baton_resil_metrics_t *m, baton_worker_role_t role,
                               const char *reason)
{
    if (m != NULL)
        inc2(m->retries, baton_worker_role_name(role), reason);
}

void baton_resil_metrics_retries_exhausted(baton_resil_metrics_t *m, const char *reason)
{
    if (m != NULL) {
        const char *v[] = {reason};
        baton_counter_inc_labels(m->exhausted, v);
    }
}

void baton_resil_metrics_abort(baton_resil_metrics_t *m, baton_worker_role_t role,
                               const char *reason)
{
    if (m != NULL)
        inc2(m->aborts, baton_worker_role_name(role), reason);
}

void baton_resil_metrics_queue_depth(baton_resil_metrics_t *m, int delta)
{
    if (m != NULL)
        baton_gauge_add(m->queue_depth, delta);
}

void baton_resil_metrics_queue_time(baton_resil_metrics_t *m, double seconds)
{
    if (m != NULL)
        baton_histogram_observe(m->queue_time, seconds);
}

void baton_resil_metrics_rejected(baton_resil_metrics_t *m, const char *reason)
{
    if (m != NULL) {
        const char *v[] = {reason};
        baton_counter_inc_labels(m->rejected, v);
    }
}

void baton_resil_metrics_active(baton_resil_metrics_t *m, int delta)
{
    if (m != NULL)
        baton_gauge_add(m->active, delta);
}

void baton_resil_metrics_migration(baton_resil_metrics_t *m, const char *outcome)
{
    if (m != NULL) {
        const char *v[] = {outcome};
        baton_counter_inc_labels(m->migrations, v);
    }
}
