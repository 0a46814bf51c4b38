/* vllm_lease.c — a vllm-nixl decode's heartbeats to its prefill: while a request waits for its KV
 * pages or pulls them, POST /kv_lease renews the prefill's hold (vLLM's NIXL lease renewal). */
#include "worker/vllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"
#include "http/client.h"

#define COMP "worker"

struct wk_vllm_hb_s {
    uv_timer_t timer;
    baton_http_pool_t *pool;
    baton_http_creq_t *req; /* the heartbeat in flight, if any */
    int status;             /* its answer's status */
    int stopping, timer_closed;
    uint64_t lease_ms;
    char body[160];
    size_t body_len;
};

static void hb_maybe_free(wk_vllm_hb_t *hb)
{
    if (!hb->timer_closed || hb->req)
        return;
    baton_http_pool_destroy(hb->pool);
    free(hb);
}

static void on_hb_head(baton_http_creq_t *req, int status, const baton_http_header_t *h, size_t n)
{
    wk_vllm_hb_t *hb = req->data;
    (void)h;
    (void)n;
    hb->status = status;
}

static void on_hb_done(baton_http_creq_t *req, int err)
{
    wk_vllm_hb_t *hb = req->data;
    hb->req = NULL;
    /* a missed heartbeat is no failure yet: the lease has room for several (vLLM's margin) */
    if (err != 0 && err != BATON_ECANCELED)
        log_debug(COMP, "kv_lease_heartbeat_failed err=%s", baton_err_name(err));
    else if (err == 0 && hb->status != 200)
        log_debug(COMP, "kv_lease_heartbeat_refused status=%d", hb->status);
    if (hb->stopping)
        hb_maybe_free(hb);
}

static const baton_http_client_cb_t hb_cb = {on_hb_head, NULL, on_hb_done};

static void on_hb_timer(uv_timer_t *t)
{
    wk_vllm_hb_t *hb = t->data;
    if (hb->req != NULL)
        return; /* the last one is still on its way */
    static const baton_http_header_t ct = {"Content-Type", "application/json"};
    baton_http_timeouts_t to = {1000, hb->lease_ms / 3, hb->lease_ms / 3, hb->lease_ms / 3};
    hb->status = 0;
    int rc = baton_http_request(&hb->req, hb->pool, "POST", "/kv_lease", &ct, 1, hb->body,
                                hb->body_len, &to, &hb_cb, hb);
    if (rc != 0) {
        hb->req = NULL;
        log_debug(COMP, "kv_lease_heartbeat_failed err=%s", baton_err_name(rc));
    }
}

int wk_vllm_hb_start(wk_vllm_hb_t **hb_p, uv_loop_t *loop, const char *host, int port,
                     const char *request_id, uint64_t lease_ms)
{
    wk_vllm_hb_t *hb = calloc(1, sizeof(*hb));
    if (!hb)
        return BATON_ENOMEM;
    int n = snprintf(hb->body, sizeof(hb->body), "{\"request_ids\":[\"%s\"]}", request_id);
    if (n < 0 || (size_t)n >= sizeof(hb->body) || strpbrk(request_id, "\"\\") != NULL) {
        free(hb); /* ids are the router's (cmpl-<hex>); anything else gets no heartbeats */
        return BATON_EINVAL;
    }
    hb->body_len = (size_t)n;
    hb->lease_ms = lease_ms;
    int rc = baton_http_pool_create(&hb->pool, loop, host, port, 1);
    if (rc != 0) {
        free(hb);
        return rc;
    }
    uv_timer_init(loop, &hb->timer);
    hb->timer.data = hb;
    /* vLLM: every kv_lease_duration // 6, from the request's arrival */
    uint64_t every = lease_ms / 6 ? lease_ms / 6 : 1;
    uv_timer_start(&hb->timer, on_hb_timer, every, every);
    *hb_p = hb;
    return 0;
}

static void on_hb_timer_closed(uv_handle_t *h)
{
    wk_vllm_hb_t *hb = h->data;
    hb->timer_closed = 1;
    hb_maybe_free(hb);
}

void wk_vllm_hb_stop(wk_vllm_hb_t *hb)
{
    if (!hb)
        return;
    hb->stopping = 1;
    uv_timer_stop(&hb->timer);
    uv_close((uv_handle_t *)&hb->timer, on_hb_timer_closed);
    if (hb->req)
        baton_http_request_cancel(hb->req); /* on_hb_done follows */
}
