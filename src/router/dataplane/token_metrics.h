/* token_metrics.h — router-side time to first token and inter-token latency per route, read from
 * the SSE bytes the router relays (no copy, no JSON parsing). */
#ifndef BATON_ROUTER_TOKEN_METRICS_H
#define BATON_ROUTER_TOKEN_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/metrics.h"

/*
 * A token is one SSE event of the relayed stream other than "data: [DONE]" (SGLang, vLLM and
 * baton-worker send one event per decode step; an event carrying several tokens counts once,
 * so a batched step shows as one longer gap, as on the client). The scan looks only for event
 * terminators (a blank line) in the bytes as they pass, so it costs one memchr-like pass over
 * data that is being written anyway (one search per event: the blank line is looked for right
 * after each line end first), and reads the clock only when an event ended.
 *
 *   baton_time_to_first_token_seconds{route}   client request start → first event out
 *   baton_inter_token_latency_seconds{route}   gap between consecutive events; events that
 *                                              arrive in one read share the read's gap
 *
 * Threading: the families are shared (their children are lock-free); a scan state belongs to
 * one request on one loop; each loop thread keeps its own cache of route -> children.
 */
typedef struct baton_token_metrics_s baton_token_metrics_t;

typedef struct baton_token_scan_s {
    uint64_t start_ns; /* the client request's start; 0 = not streaming (scan ignores data) */
    uint64_t last_ns;  /* when the previous event went out; 0 before the first */
    char tail[2];      /* the last two bytes seen: a blank line may span two reads */
    baton_metric_child_t *ttft, *itl; /* this request's route, looked up once */
} baton_token_scan_t;

/* NULL on ENOMEM (then every scan is a no-op). */
baton_token_metrics_t *baton_token_metrics_create(baton_metrics_t *reg);
void baton_token_metrics_destroy(baton_token_metrics_t *m);

/* Arms the scan of one request's stream. m may be NULL. route must live as long as m and keep
 * its text (the API's static path strings): its series are cached by the pointer, per thread. */
void baton_token_scan_start(baton_token_metrics_t *m, baton_token_scan_t *s, const char *route,
                            uint64_t start_ns);
/* The next relayed bytes of that stream, at now_ns. */
void baton_token_scan(baton_token_scan_t *s, const char *data, size_t len, uint64_t now_ns);

/* baton_token_scan in two halves, so the relay reads the clock only for bytes that end an
 * event: the token events that end in these bytes (0 when unarmed), then their observation at
 * now_ns (nothing when events is 0). */
unsigned baton_token_scan_events(baton_token_scan_t *s, const char *data, size_t len);
void baton_token_scan_observe(baton_token_scan_t *s, unsigned events, uint64_t now_ns);

#endif
