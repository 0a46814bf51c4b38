/* drain.c — baton-worker's graceful stop: no new requests, those in flight finish, then close. */
#include "worker/drain.h"

#include "common/log.h"
#include "worker/job.h"

#define COMP "worker"

/* How often a draining worker looks whether its last request and connection went. */
#define DRAIN_POLL_MS 20

static void drain_finish(wk_drain_t *d)
{
    if (d->finished)
        return;
    d->finished = 1;
    uv_close((uv_handle_t *)&d->poll, NULL);
    uv_close((uv_handle_t *)&d->deadline, NULL);
    wk_worker_shutdown(d->w, d->on_closed);
}

static void on_poll(uv_timer_t *t)
{
    wk_drain_t *d = t->data;
    if (wk_worker_drained(d->w)) {
        log_info(COMP, "drained");
        drain_finish(d);
    }
}

static void on_deadline(uv_timer_t *t)
{
    wk_drain_t *d = t->data;
    if (d->expired) {
        drain_finish(d);
        return;
    }
    d->expired = 1;
    log_warn(COMP, "drain_deadline requests_left=%u", d->w->n_jobs);
    wk_job_fail_all_shutdown(d->w);
    uv_timer_start(&d->deadline, on_deadline, WK_DRAIN_FLUSH_MS, 0);
}

int wk_drain_start(wk_drain_t *d, wk_worker_t *w, uint64_t timeout_ms,
                   void (*on_closed)(wk_worker_t *w))
{
    int rc;
    d->w = w;
    d->on_closed = on_closed;
    d->expired = d->finished = 0;
    if ((rc = uv_timer_init(w->loop, &d->poll)) != 0)
        return rc;
    if ((rc = uv_timer_init(w->loop, &d->deadline)) != 0) {
        uv_close((uv_handle_t *)&d->poll, NULL);
        return rc;
    }
    d->poll.data = d->deadline.data = d;
    wk_worker_drain_begin(w);
    uv_timer_start(&d->poll, on_poll, 0, DRAIN_POLL_MS);
    uv_timer_start(&d->deadline, on_deadline, timeout_ms, 0);
    return 0;
}

void wk_drain_hurry(wk_drain_t *d)
{
    if (d->finished)
        return;
    uv_timer_stop(&d->deadline);
    on_deadline(&d->deadline);
}
