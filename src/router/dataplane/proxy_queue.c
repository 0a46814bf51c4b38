/* proxy_queue.c — admission of proxied requests: a router-wide slot (admission.h) and the
 * loop's queues, one FIFO per priority class, of requests waiting for one or for a worker under
 * its cap, with their timeout, shedding and preemption. */
#include "router/dataplane/proxy_internal.h"

#include <stdio.h>

#include "baton/error.h"
#include "common/clock.h"
#include "common/log.h"

baton__preq_t *baton__queue_head(const baton_proxy_loop_t *pl)
{
    for (int c = BATON_PRIO_COUNT - 1; c >= 0; c--) {
        baton_list_t *first = baton_list_first(&pl->queue[c]);
        if (first)
            return container_of(first, baton__preq_t, qlink);
    }
    return NULL;
}

/* The wait of a request that leaves the queue for good (admitted, shed or timed out). */
static void observe_wait(baton__preq_t *pr)
{
    baton_router_t *r = pr->pl->router;
    double s = baton_seconds_since(pr->queued_ns);
    baton_resil_metrics_queue_time(r->resil, s);
    baton_resil_metrics_prio_queue_time(r->resil, pr->prio, s);
}

void baton__queue_remove(baton__preq_t *pr, int final)
{
    baton_proxy_loop_t *pl = pr->pl;
    baton_router_t *r = pl->router;
    if (pr->phase != PH_QUEUED)
        return;
    baton_list_remove(&pr->qlink);
    if (r->admission)
        baton_admission_dequeue(r->admission, &pl->waker, pr->prio);
    baton_resil_metrics_queue_depth(r->resil, -1);
    baton_resil_metrics_prio_depth(r->resil, pr->prio, -1, 0);
    if (final) {
        observe_wait(pr);
        /* It may have been what kept lower classes from a free slot (on any loop). */
        if (r->admission)
            baton_admission_kick(r->admission);
    }
    baton__pr_set_phase(pr, PH_NEW, "dequeued"); /* stops the queue timer */
}

/* Sheds pr from the queue for a higher class (--priority-preempt): 429, reason preempted. */
static void shed_preempted(baton__preq_t *pr, const char *for_class)
{
    baton_router_t *r = pr->pl->router;
    baton__queue_remove(pr, 1);
    baton_resil_metrics_rejected(r->resil, "queue_full");
    baton_resil_metrics_prio_shed(r->resil, pr->prio, "preempted");
    baton_log_limited(BATON_LOG_INFO, 10, "router", "preempted",
                      "preempted route=%s priority=%s for=%s", pr->route, baton_prio_name(pr->prio),
                      for_class);
    baton__pr_respond_queue_full(pr);
    baton__pr_maybe_free(pr);
}

/* The newest waiter of class c on this loop, or NULL. */
static baton__preq_t *newest(baton_proxy_loop_t *pl, int c)
{
    baton_list_t *last = pl->queue[c].prev;
    return last == &pl->queue[c] ? NULL : container_of(last, baton__preq_t, qlink);
}

/*
 * --priority-preempt: a request of class c found the queue at its class's limit. The newest
 * waiter of the lowest class below c leaves the queue with 429, when that makes room for c (a
 * bulk waiter shed must free a place a default request may use), and pr joins. One on this loop
 * is shed at once; one on another loop is shed by that loop when it wakes (admission.h,
 * baton_admission_preempt), pr joining at once in its place. 0 when pr was counted in the queue,
 * else BATON_EBUSY.
 */
static int preempt_enqueue(baton__preq_t *pr)
{
    baton_proxy_loop_t *pl = pr->pl;
    baton_router_t *r = pl->router;
    if (!r->cfg->priority_preempt)
        return BATON_EBUSY;
    unsigned limit = baton_prio_queue_limit(pr->prio, baton_admission_queue_size(r->admission));
    /* Shedding one must make room; the lowest class goes first, here or on another loop. */
    if (baton_admission_queued(r->admission) > limit)
        return BATON_EBUSY;
    for (int c = 0; c < (int)pr->prio; c++) {
        baton__preq_t *victim = newest(pl, c);
        if (victim) {
            shed_preempted(victim, baton_prio_name(pr->prio));
            return baton_admission_enqueue(r->admission, &pl->waker, pr->prio);
        }
        if (baton_admission_preempt(r->admission, &pl->waker, pr->prio, (baton_prio_t)c) == 0)
            return 0;
    }
    return BATON_EBUSY;
}

/* What other loops asked this one to shed for their higher-class newcomers. */
static void shed_evictions(baton_proxy_loop_t *pl)
{
    baton_router_t *r = pl->router;
    unsigned n[BATON_PRIO_COUNT], total = 0;
    baton_admission_take_evictions(&pl->waker, n);
    for (int c = 0; c < BATON_PRIO_COUNT; c++) {
        total += n[c];
        baton__preq_t *victim;
        for (unsigned i = 0; i < n[c] && (victim = newest(pl, c)) != NULL; i++)
            shed_preempted(victim, "another loop's higher class");
    }
    baton_admission_evicted(r->admission, total);
}

/* Joins its class's queue at the tail (a new request) or head (one that left it to try for a
 * worker and found them all at their caps again: it keeps its place and what is left of its
 * timeout). */
static int queue_join(baton__preq_t *pr, int front, uint64_t timeout_ms)
{
    baton_proxy_loop_t *pl = pr->pl;
    baton_router_t *r = pl->router;
    if (!r->admission)
        return BATON_EBUSY;
    if (baton_admission_enqueue(r->admission, &pl->waker, pr->prio) != 0 &&
        preempt_enqueue(pr) != 0)
        return BATON_EBUSY;
    if (front)
        baton_list_push_front(&pl->queue[pr->prio], &pr->qlink);
    else
        baton_list_push(&pl->queue[pr->prio], &pr->qlink);
    baton_resil_metrics_queue_depth(r->resil, +1);
    baton_resil_metrics_prio_depth(r->resil, pr->prio, +1, !front);
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
        if (!baton_admission_try_acquire(r->admission, pr->prio, fair))
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
    if (rc == ST_STARTED)
        baton_resil_metrics_prio_admitted(r->resil, pr->prio);
    else if (rc == ST_NOWORKER)
        baton__respond_no_worker(pr, missing_prefill);
    else if (rc == ST_NOMEM)
        baton__finish_error(pr, 500, "router out of memory", "server_error", "internal_error",
                            "router_error");
    return rc;
}

/* A request that cannot (re)join the queue: 429, counted for its class. */
void baton__queue_shed(baton__preq_t *pr)
{
    baton_router_t *r = pr->pl->router;
    baton_resil_metrics_rejected(r->resil, "queue_full");
    baton_resil_metrics_prio_shed(r->resil, pr->prio, "queue_full");
    baton__pr_respond_queue_full(pr);
}

void baton__queue_run(baton_proxy_loop_t *pl)
{
    if (pl->router->admission)
        shed_evictions(pl);
    baton__preq_t *pr;
    while ((pr = baton__queue_head(pl)) != NULL) {
        baton_router_t *r = pl->router;
        /* Try before leaving the queue (so the queue counts it until it has a slot), but with
         * fair = 0: it is the one allowed to take a slot (unless a higher class waits on
         * another loop: that one's loop is woken too and takes it). */
        if (r->admission && !pr->slot) {
            if (!baton_admission_try_acquire(r->admission, pr->prio, 0))
                return;
            slot_take(pr);
        }
        baton__queue_remove(pr, 0);
        enum baton__start_rc rc = baton__try_start(pr, 0);
        if (rc != ST_WAIT)
            observe_wait(pr);
        if (rc == ST_WAIT) {
            /* All at their caps again: back to the head of the queue, nothing lost. */
            uint64_t waited = (uv_hrtime() - pr->queued_ns) / 1000000u;
            uint64_t left =
                r->cfg->queue_timeout_ms > waited ? r->cfg->queue_timeout_ms - waited : 1;
            if (queue_join(pr, 1, left) != 0) {
                observe_wait(pr);
                baton__queue_shed(pr);
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
    baton_resil_metrics_prio_shed(r->resil, pr->prio, "queue_timeout");
    char msg[200];
    snprintf(msg, sizeof(msg),
             "no capacity within the queue timeout (%llu ms) for a %s-priority request: every "
             "worker is busy",
             (unsigned long long)r->cfg->queue_timeout_ms, baton_prio_name(pr->prio));
    baton__pr_respond_error(pr, 408, msg, "timeout_error", "queue_timeout");
}
