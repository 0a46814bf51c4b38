/* token_metrics.c — TTFT and inter-token latency histograms from the relayed SSE stream. */
#include "router/dataplane/token_metrics.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "router/dataplane/router_metrics.h"

struct baton_token_metrics_s {
    baton_metric_family_t *ttft, *itl;
    uint64_t id; /* tells the per-thread route cache's entries of a destroyed set from ours */
};

/*
 * The route's two children, found once per loop thread instead of once per request: a child
 * lookup hashes the label and takes the family's lock, and routes are a handful of static
 * strings. Thread-local, so the loops never share an entry; keyed by the set's id (never
 * reused) so a set created at a freed one's address does not see its children.
 */
#define ROUTE_CACHE 8
typedef struct route_entry_s {
    uint64_t id;
    const char *route;
    baton_metric_child_t *ttft, *itl;
} route_entry_t;
static _Thread_local route_entry_t route_cache[ROUTE_CACHE];
static atomic_uint_fast64_t next_id = 1;

/* Inter-token gaps are milliseconds, not seconds: finer buckets than the request latency's. */
static const double itl_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                     0.1,   0.15,   0.2,   0.3,  0.5,  1.0,  2.5,  5.0};

baton_token_metrics_t *baton_token_metrics_create(baton_metrics_t *reg)
{
    baton_token_metrics_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->id = atomic_fetch_add(&next_id, 1);
    static const char *const route[] = {"route"};
    m->ttft = baton_metrics_histogram(
        reg, "baton_time_to_first_token_seconds",
        "Router-observed time from the client request to the first streamed token event, by route.",
        1, route, baton_router_latency_buckets, baton_router_latency_buckets_n);
    m->itl = baton_metrics_histogram(
        reg, "baton_inter_token_latency_seconds",
        "Router-observed gap between consecutive streamed token events, by route.", 1, route,
        itl_buckets, sizeof(itl_buckets) / sizeof(itl_buckets[0]));
    return m;
}

void baton_token_metrics_destroy(baton_token_metrics_t *m)
{
    free(m);
}

void baton_token_scan_start(baton_token_metrics_t *m, baton_token_scan_t *s, const char *route,
                            uint64_t start_ns)
{
    memset(s, 0, sizeof(*s));
    if (m == NULL)
        return;
    /* Routes are static strings: the pointer is the key (another pointer to the same text
     * takes a second entry and finds the same children). */
    route_entry_t *e = &route_cache[((uintptr_t)route >> 4) % ROUTE_CACHE];
    if (e->id != m->id || e->route != route) {
        const char *v[] = {route};
        e->ttft = baton_metric_child(m->ttft, v);
        e->itl = baton_metric_child(m->itl, v);
        e->route = route;
        e->id = m->id;
    }
    s->ttft = e->ttft;
    s->itl = e->itl;
    s->start_ns = start_ns;
}

/* 1 when the event that ends just before data[end] is "data: [DONE]" (not a token). Only
 * looks inside this read: a [DONE] split across reads counts as a token (a last-gap error). */
static int is_done_event(const char *data, size_t end)
{
    return end >= 7 && memcmp(data + end - 7, "[DONE]\n", 7) == 0;
}

/* The byte k places before data[i], reaching back into the previous reads' last two bytes. */
static char byte_before(const baton_token_scan_t *s, const char *data, size_t i, size_t k)
{
    return i >= k ? data[i - k] : s->tail[2 - (k - i)];
}

unsigned baton_token_scan_events(baton_token_scan_t *s, const char *data, size_t len)
{
    if (s->start_ns == 0 || len == 0)
        return 0;
    unsigned events = 0;
    const char *nl = memchr(data, '\n', len);
    while (nl != NULL) {
        size_t i = (size_t)(nl - data);
        /* "\n\n" or "\n\r\n": the blank line that ends an event. */
        char c1 = byte_before(s, data, i, 1);
        int blank = c1 == '\n' || (c1 == '\r' && byte_before(s, data, i, 2) == '\n');
        if (blank && !is_done_event(data, i))
            events++;
        /* An event's last line is followed at once by the blank line: look there first, so
         * the search runs once per event rather than once per line. */
        if (i + 1 < len && data[i + 1] == '\n')
            nl = data + i + 1;
        else if (i + 2 < len && data[i + 1] == '\r' && data[i + 2] == '\n')
            nl = data + i + 2;
        else
            nl = i + 1 < len ? memchr(data + i + 1, '\n', len - i - 1) : NULL;
    }
    s->tail[0] = len >= 2 ? data[len - 2] : s->tail[1];
    s->tail[1] = data[len - 1];
    return events;
}

void baton_token_scan_observe(baton_token_scan_t *s, unsigned events, uint64_t now_ns)
{
    if (events == 0)
        return;
    if (s->last_ns == 0) {
        baton_histogram_observe(s->ttft, (double)(now_ns - s->start_ns) / 1e9);
        for (unsigned i = 1; i < events; i++) /* came with the first: no gap */
            baton_histogram_observe(s->itl, 0.0);
    } else {
        double gap = (double)(now_ns - s->last_ns) / 1e9 / events;
        for (unsigned i = 0; i < events; i++)
            baton_histogram_observe(s->itl, gap);
    }
    s->last_ns = now_ns;
}

void baton_token_scan(baton_token_scan_t *s, const char *data, size_t len, uint64_t now_ns)
{
    baton_token_scan_observe(s, baton_token_scan_events(s, data, len), now_ns);
}
