/* drain.h — baton-worker's graceful stop (SIGTERM, SIGINT): in-flight requests finish first. */
#ifndef BATON_WORKER_DRAIN_H
#define BATON_WORKER_DRAIN_H

#include <stdint.h>
#include <uv.h>

#include "worker/worker.h"

/*
 * The router's shape (its --drain-timeout-ms): the listener closes and idle connections with
 * it, a request still begun on an open connection gets 503 shutting_down, and the requests in
 * flight (streams included) run to their end; once no request and no connection is left, the
 * worker closes. At the deadline every request still here is answered (503, or an SSE error
 * event and the stream's end), its connection gets a moment to flush, then the worker closes
 * anyway. on_closed is wk_worker_shutdown's.
 *
 * Everything runs on the worker's loop; the caller owns the struct, which must outlive the
 * worker's close. The KV holds of a vllm-nixl prefill (answered requests whose decode has yet to
 * pull) are not waited for.
 */
/* After the deadline's answers: time for them to reach their clients (a client closes on the
 * answer's Connection: close; the HTTP server's linger is 2 s) before the connections are cut. */
#define WK_DRAIN_FLUSH_MS 2000

typedef struct wk_drain_s {
    wk_worker_t *w;
    void (*on_closed)(wk_worker_t *w);
    uv_timer_t poll;     /* looks whether the last request and connection went */
    uv_timer_t deadline; /* the drain timeout, then the flush after its answers */
    int expired;         /* the deadline's answers went out */
    int finished;        /* the worker is closing */
} wk_drain_t;

/* Starts draining w; the worker closes within timeout_ms plus a short flush. 0 or a libuv
 * error (then the caller stops the worker at once). */
int wk_drain_start(wk_drain_t *d, wk_worker_t *w, uint64_t timeout_ms,
                   void (*on_closed)(wk_worker_t *w));
/* A second signal: the deadline now (answers for what is left); after it, the close now. */
void wk_drain_hurry(wk_drain_t *d);

#endif
