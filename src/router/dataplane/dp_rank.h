/* dp_rank.h — which data-parallel rank of a worker serves a request: round robin, or
 * the rank with the fewest of this router's requests in flight, and those per-rank counts. */
#ifndef BATON_ROUTER_DP_RANK_H
#define BATON_ROUTER_DP_RANK_H

#include "router/control/registry.h"

/*
 * Threads: any (the counts are atomics in the worker, w->dp_in_flight, shared by every loop of
 * this router; a pick reads them without a lock, so two loops picking at the same moment may both
 * see the same least-loaded rank — the balance is approximate, like the workers' own in-flight
 * counts).
 *
 * Least loaded is the default: the router's own count per (worker, rank) sees long requests that
 * round robin would pile on one rank by chance, and when every rank is idle its ties rotate with
 * the worker's turn, so it hands out ranks exactly like round robin.
 */

/*
 * Pure selection over count candidates first, first + step, ... (their loads in load[], indexed by
 * rank): the least loaded; ties go to the first one at or after candidate `turn % count`
 * (cyclically), so equal loads rotate. Returns the rank.
 */
int baton_dp_least(const long *load, int first, int step, int count, unsigned turn);

/*
 * The ranks of a pair (prefill p, decode d; a side whose dp_size is 0 or 1 gets rank 0): the
 * prefill's among all its ranks, then the decode's among those that can share a bootstrap_room
 * with it (baton_pdproto_dp_decode_rank), each least loaded or round robin. Takes one in-flight
 * count on each data-parallel side's chosen rank (give it back with baton_dp_release).
 */
void baton_dp_pick_pair(baton_worker_t *p, baton_worker_t *d, int round_robin, int *rank_p,
                        int *rank_d);
/* One rank of w alone (d NULL above), with its count taken. */
int baton_dp_pick(baton_worker_t *w, int round_robin);
/* Gives back the count taken on w's rank (no-op when w is not data-parallel). */
void baton_dp_release(baton_worker_t *w, int rank);
/* This router's requests in flight on w's rank (0 when not data-parallel). */
long baton_dp_in_flight(const baton_worker_t *w, int rank);

#endif
