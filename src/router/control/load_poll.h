/* router/control/load_poll.h — polls every worker's reported load (GET /get_load, SGLang's format)
 * at an interval, for least_load (policy.h: baton_worker_load). */
#ifndef BATON_ROUTER_LOAD_POLL_H
#define BATON_ROUTER_LOAD_POLL_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "router/control/registry.h"

struct baton_tls_s;

/*
 * Every interval_ms the poller sends GET <prefix>/get_load to each registered worker that has
 * no poll out yet (a fresh connection each time, the worker's api_key as a Bearer token, the
 * whole exchange bounded by the interval, at least 1 s) and stores the answer on the worker:
 * reported_load, reported_base (the router's in-flight count for it when the answer came) and
 * reported_until_ms (now + 3 intervals: a report the poller could not renew stops counting).
 * A failed or unparsable poll withdraws the worker's report at once, so least_load falls back
 * to the router's own counts for it.
 *
 * Answers understood (baton_load_parse): SGLang's current /get_load, a JSON array of per-DP-rank
 * objects whose "num_reqs" (else "num_running_reqs" + "num_waiting_reqs") are summed, which is
 * what baton-worker answers; and the older {"load": N} object.
 *
 * Threading: create, start, close and every callback run on the loop's thread; the registry is
 * thread-safe and the per-worker fields are atomics read by the request loops.
 * Ownership: the registry must outlive the poller (until close_cb). close() cancels the polls
 * out and frees the poller once every handle closed and every poll reported; close_cb (may be
 * NULL) runs once, last, on the loop.
 */

typedef struct baton_lpoll_s baton_lpoll_t;
typedef void (*baton_lpoll_close_cb)(baton_lpoll_t *lp, void *ctx);

/* 0, BATON_EINVAL (NULL loop/registry, interval 0) or BATON_ENOMEM. Nothing runs until start. */
int baton_lpoll_create(baton_lpoll_t **lp_p, uv_loop_t *loop, baton_registry_t *reg,
                       uint64_t interval_ms);
/* For https:// workers (not owned; must outlive the poller). */
void baton_lpoll_set_tls(baton_lpoll_t *lp, struct baton_tls_s *tls);
int baton_lpoll_start(baton_lpoll_t *lp);
void baton_lpoll_close(baton_lpoll_t *lp, baton_lpoll_close_cb close_cb, void *ctx);
/* Polls answered with a load / failed, since create (tests, logs). */
uint64_t baton_lpoll_ok(const baton_lpoll_t *lp);
uint64_t baton_lpoll_failed(const baton_lpoll_t *lp);

/* Parses a /get_load body; 0 and *load_p, or BATON_EINVAL for anything else. */
int baton_load_parse(const char *body, size_t len, long *load_p);

#endif
