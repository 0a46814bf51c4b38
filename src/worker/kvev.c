/* kvev.c — baton-worker's KV-event publisher: gathers the prefix cache's page events, sends
 * them as one batch per cache insert, answers replay requests from the loop. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "kvevents/zsock.h"
#include "worker/kvev.h"

#define COMP "kvevents"

/* Events gathered before a flush; one insert produces at most its pages plus as many
 * evictions, so a flush per insert keeps this small. Past the cap, further events are dropped
 * and a clear is sent instead (subscribers forget this worker rather than trust a hole). */
enum { MAX_PENDING = 65536 };

struct wk_kvev_s {
    baton_kvev_pub_t *pub;
    wk_pcache_t *pc;
    uint32_t page;
    baton_kvev_event_t *ev;
    baton_kvev_hash_t *hashes; /* one per event */
    uint32_t *tokens;          /* page per stored event */
    uint32_t n, cap;
    int overflow;
    uv_poll_t poll;
    uv_timer_t timer;
    int has_poll, closing;
};

static void on_block(void *ud, int stored, const wk_pcache_block_t *b)
{
    wk_kvev_t *k = ud;
    if (k->n == k->cap) {
        k->overflow = 1;
        return;
    }
    baton_kvev_event_t *e = &k->ev[k->n];
    memset(e, 0, sizeof(*e));
    k->hashes[k->n] = (baton_kvev_hash_t){.i = (int64_t)b->hash};
    e->type = stored ? BATON_KVEV_STORED : BATON_KVEV_REMOVED;
    e->hashes = &k->hashes[k->n];
    e->n_hashes = 1;
    strcpy(e->medium, "GPU");
    if (stored) {
        e->has_parent = b->has_parent;
        e->parent = (baton_kvev_hash_t){.i = (int64_t)b->parent_hash};
        e->token_ids = &k->tokens[(size_t)k->n * k->page];
        for (uint32_t i = 0; i < b->n; i++)
            e->token_ids[i] = (uint32_t)b->ids[i];
        e->n_tokens = b->n;
        e->block_size = b->n;
    }
    k->n++;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

const char *wk_kvev_endpoint(const wk_kvev_t *k, int replay)
{
    return k ? baton_kvev_pub_endpoint(k->pub, replay) : "";
}

void wk_kvev_flush(wk_kvev_t *k)
{
    if (!k || (k->n == 0 && !k->overflow))
        return;
    baton_kvev_event_t clear = {.type = BATON_KVEV_CLEARED};
    baton_kvev_batch_t b = {.ts = now_s(), .dp_rank = 0, .events = k->ev, .n_events = k->n};
    if (k->overflow) {
        b.events = &clear;
        b.n_events = 1;
    }
    if (baton_kvev_pub_send(k->pub, &b) < 0)
        log_warn(COMP, "publish_failed events=%u", b.n_events);
    k->n = 0;
    k->overflow = 0;
}

static void service(wk_kvev_t *k)
{
    baton_kvev_pub_service(k->pub);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    service(h->data);
}

static void on_timer(uv_timer_t *t)
{
    service(t->data); /* ZMQ's descriptor is edge-triggered: a slow sweep catches a missed edge */
}

int wk_kvev_create(wk_kvev_t **out, uv_loop_t *loop, wk_pcache_t *pc, uint32_t page_tokens,
                   const char *endpoint, const char *replay_endpoint)
{
    *out = NULL;
    if (!pc) {
        log_error(COMP, "start_failed why=\"KV events need the prefix cache (--cache-tokens)\"");
        return -1;
    }
    wk_kvev_t *k = calloc(1, sizeof(*k));
    if (!k)
        return -1;
    k->pc = pc;
    k->page = page_tokens;
    k->cap = MAX_PENDING;
    k->ev = calloc(k->cap, sizeof(*k->ev));
    k->hashes = calloc(k->cap, sizeof(*k->hashes));
    k->tokens = calloc((size_t)k->cap * page_tokens, sizeof(*k->tokens));
    baton_kvev_pub_opts_t o = {.endpoint = endpoint, .replay_endpoint = replay_endpoint,
                               .encoding = BATON_KVEV_ENC_MAP, .reply_with_topic = 1};
    char err[256] = "out of memory";
    if (!k->ev || !k->hashes || !k->tokens || !(k->pub = baton_kvev_pub_open(&o, err, sizeof(err)))) {
        log_error(COMP, "start_failed why=\"%s\"", err);
        free(k->ev);
        free(k->hashes);
        free(k->tokens);
        free(k);
        return -1;
    }
    int fd = baton_kvev_pub_replay_fd(k->pub);
    if (fd >= 0 && uv_poll_init(loop, &k->poll, fd) == 0) {
        k->poll.data = k;
        k->has_poll = 1;
        uv_poll_start(&k->poll, UV_READABLE, on_poll);
    }
    uv_timer_init(loop, &k->timer);
    k->timer.data = k;
    uv_timer_start(&k->timer, on_timer, 100, 100);
    wk_pcache_observe(pc, on_block, k);
    /* "kvevents_listening addr=H:P" (and "kvreplay_..."): the ports a wildcard bind got, in the
     * form the other listeners log theirs. */
    for (int r = 0; r < 2; r++) {
        const char *ep = baton_kvev_pub_endpoint(k->pub, r);
        if (strncmp(ep, "tcp://", 6) == 0)
            log_info(COMP, "%s_listening addr=%s", r ? "kvreplay" : "kvevents", ep + 6);
        else if (ep[0])
            log_info(COMP, "%s_listening endpoint=%s", r ? "kvreplay" : "kvevents", ep);
    }
    *out = k;
    return 0;
}

static void on_closed(uv_handle_t *h)
{
    wk_kvev_t *k = h->data;
    if (--k->closing > 0)
        return;
    free(k->ev);
    free(k->hashes);
    free(k->tokens);
    free(k);
}

void wk_kvev_destroy(wk_kvev_t *k)
{
    if (!k)
        return;
    wk_pcache_observe(k->pc, NULL, NULL);
    baton_kvev_pub_close(k->pub);
    k->pub = NULL;
    k->closing = 1 + k->has_poll;
    if (k->has_poll)
        uv_close((uv_handle_t *)&k->poll, on_closed); /* before the socket's fd would be reused */
    uv_close((uv_handle_t *)&k->timer, on_closed);
}
