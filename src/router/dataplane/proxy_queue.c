/* proxy_queue.c — admission of proxied requests: a router-wide slot (admission.h) and the
 * loop's FIFO of requests waiting for one or for a worker under its cap, with its timeout. */
#include "router/dataplane/proxy_internal.h"

#include <stdio.h>

#include "baton/error.h"
#include "common/clock.h"

baton__preq_t *baton__queue_head(const baton_proxy_loop_t *pl)
{
    baton_list_t *first = baton_list_first(&pl->queue);
    return first ? container_of(first, baton__preq_t, qlink) : NULL;
}

void baton__queue_remove(baton__preq_t *pr, int final)
{
    baton_proxy_loop_t *pl = pr->pl;
    baton_router_t *r = pl->router;
    if (pr->phase != PH_QUEUED)
        return;
    baton_list_remove(&pr->qlink);
    if (r->admission)
        baton_admission_dequeue(r->admission, &pl->waker);
    baton_resil_metrics_queue_depth(r->resil, -1);
    if (final)
        baton_resil_metrics_queue_time(r->resil, baton_seconds_since(pr->queued_ns));
    baton__pr_set_phase(pr, PH_NEW, "dequeued"); /* stops the queue timer */
}

/* Joins the queue at its tail (a new request) or head (one that left it to try for a worker and
 * found them all at their caps again: it keeps its place and what is left of its timeout). */
static int queue_join(baton__preq_t *pr, int front, uint64_t timeout_ms)
{
    baton_proxy_loop_t *pl = pr->pl;
    baton_router_t *r = pl->router;
    if (!r->admission || baton_admission_enqueue(r->admission, &pl->waker) != 0)
        return BATON_EBUSY;
    if (front)
        baton_list_push_front(&pl->queue, &pr->qlink);
    else
        baton_list_push(&pl->queue, &pr->qlink);
    baton_resil_metrics_queue_depth(r->resil, +1);
    baton__pr_set_phase(pr, PH_QUEUED, front ? "capped_again" : "no_capacity");
    baton__pr_timer_start(pr, timeout_ms);
    return 0;
}

int baton__queue_add(baton__preq_t *pr)
{
    pr->queued_ns = uv_hrtime();
    return queue_join(pr, 0, pr->pl->router->cfg->queue_timeout_ms);
}

static void slot_take(baton__preq_t *pr)
{
    baton_router_t *r = pr->pl->router;
    pr->slot = 1;
    baton_resil_metrics_active(r->resil, +1);
}

enum baton__start_rc baton__try_start(baton__preq_t *pr, int fair)
{
    baton_router_t *r = pr->pl->router;
    if (r->admission && !pr->slot) {
        if (!baton_admission_try_acquire(r->admission, fair))
            return ST_WAIT;
        slot_take(pr);
    }
    int missing_prefill;
    enum baton__start_rc rc = baton__start_attempt(pr, &missing_prefill);
    if (rc == ST_WAIT || rc == ST_NOWORKER) {
        if (pr->slot && r->admission) {
            pr->slot = 0;
            baton_resil_metrics_active(r->resil, -1);
            if (rc == ST_WAIT)
                baton_admission_release_quiet(r->admission);
            else
                baton_admission_release(r->admission);
        }
    }
    if (rc == ST_NOWORKER)
        baton__respond_no_worker(pr, missing_prefill);
    else if (rc == ST_NOMEM)
        baton__finish_error(pr, 500, "router out of memory", "server_error", "internal_error",
                            "router_error");
    return rc;
}

void baton__queue_run(baton_proxy_loop_t *pl)
{
    baton__preq_t *pr;
    while ((pr = baton__queue_head(pl)) != NULL) {
        baton_router_t *r = pl->router;
        /* Try before leaving the queue (so the queue counts it until it has a slot), but with
         * fair = 0: it is the one allowed to take a slot. */
        if (r->admission && !pr->slot) {
            if (!baton_admission_try_acquire(r->admission, 0))
                return;
            slot_take(pr);
        }
        baton__queue_remove(pr, 0);
        enum baton__start_rc rc = baton__try_start(pr, 0);
        if (rc != ST_WAIT)
            baton_resil_metrics_queue_time(r->resil, baton_seconds_since(pr->queued_ns));
        if (rc == ST_WAIT) {
            /* All at their caps again: back to the head of the queue, nothing lost. */
            uint64_t waited = (uv_hrtime() - pr->queued_ns) / 1000000u;
            uint64_t left =
                r->cfg->queue_timeout_ms > waited ? r->cfg->queue_timeout_ms - waited : 1;
            if (queue_join(pr, 1, left) != 0) {
                baton_resil_metrics_queue_time(r->resil, baton_seconds_since(pr->queued_ns));
                baton_resil_metrics_rejected(r->resil, "queue_full");
                baton__pr_respond_queue_full(pr);
                baton__pr_maybe_free(pr);
            }
            return;
        }
        baton__pr_maybe_free(pr);
    }
}

void baton__queue_timeout(baton__preq_t *pr)
{
    baton_router_t *r = pr->pl->router;
    baton__queue_remove(pr, 1);
    baton_resil_metrics_rejected(r->resil, "queue_timeout");
    char msg[160];
    snprintf(msg, sizeof(msg),
             "no capacity within the queue timeout (%llu ms): every worker is busy",
             (unsigned long long)r->cfg->queue_timeout_ms);
    baton__pr_respond_error(pr, 503, msg, "service_unavailable_error", "queue_timeout");
}
