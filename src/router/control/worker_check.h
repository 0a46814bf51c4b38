/* router/control/worker_check.h — active HTTP health checks of every registered worker, on one
 * libuv loop.
 */
#ifndef BATON_ROUTER_WORKER_CHECK_H
#define BATON_ROUTER_WORKER_CHECK_H

#include <stdint.h>
#include <uv.h>

#include "router/control/worker_health.h"

/*
 * A checker runs on one loop (the router's first loop or a dedicated thread's loop: it does not
 * care which) and, for every worker in the registry of `wh`:
 *   - sends GET <prefix><path> (cfg.check.path, default /health) with its own connection pool
 *     (max_idle 0: every check opens a fresh connection, so a worker that stopped accepting is
 *     caught even if an old connection still answers), with the worker's api_key as
 *     "Authorization: Bearer" when it has one;
 *   - bounds each check by timeout_ms (connect and total), so a hung worker (SIGSTOP) fails its
 *     checks instead of stalling them;
 *   - reports each result to baton_whealth_check_result() (rise/fall counter, status change)
 *     and schedules the next one (fast_interval_ms while changing, interval_ms settled up,
 *     down_interval_ms settled down), from the end of the previous check;
 *   - staggers first checks: a uniform random delay in [0, interval_ms).
 * Every sync_interval_ms it calls baton_whealth_sync() (new/removed workers, breaker
 * cool-downs) and adds or drops targets to match the registry; a removed worker's in-flight
 * check is cancelled and it is never checked again.
 * With cfg.check.enabled == 0 only the sync runs (breakers still recover on time).
 *
 * Threading: create, start, close and the callbacks run on the loop's thread only. The
 * registry and `wh` are thread-safe and shared with the request path.
 * Ownership: `wh` must outlive the checker (until close_cb). close() cancels in-flight checks
 * and frees the checker after every handle closed and every check reported; close_cb (may be
 * NULL) runs once, last, on the loop.
 */

typedef struct baton_wcheck_s baton_wcheck_t;
typedef void (*baton_wcheck_close_cb)(baton_wcheck_t *wc, void *ctx);

/* 0, BATON_EINVAL (NULL loop/wh, timeout_ms 0) or BATON_ENOMEM. Nothing runs until start(). */
int baton_wcheck_create(baton_wcheck_t **wc_p, uv_loop_t *loop, baton_whealth_t *wh);

/* Starts the sync timer (first sync on the next loop turn). 0 or a libuv error. */
int baton_wcheck_start(baton_wcheck_t *wc);

/* The client TLS configuration for https:// workers' checks (not owned; outlives wc). */
struct baton_tls_s;
void baton_wcheck_set_tls(baton_wcheck_t *wc, struct baton_tls_s *tls);

void baton_wcheck_close(baton_wcheck_t *wc, baton_wcheck_close_cb close_cb, void *ctx);

/* Workers being checked now, and checks started since creation (tests, debugging). */
size_t baton_wcheck_targets(const baton_wcheck_t *wc);
uint64_t baton_wcheck_checks_started(const baton_wcheck_t *wc);

/* For one worker: the delay its timer was last armed with (the jittered first delay, then the
 * interval chosen after each check) and whether a check is in flight now. 0 or
 * BATON_ENOTFOUND (not a target). Tests and debugging. */
int baton_wcheck_target_info(const baton_wcheck_t *wc, const baton_worker_t *w,
                             uint64_t *last_delay_ms, int *in_flight);

#endif
