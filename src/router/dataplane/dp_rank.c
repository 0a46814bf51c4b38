/* dp_rank.c — which data-parallel rank of a worker serves a request: least loaded by this
 * router's in-flight count per rank, or round robin (see dp_rank.h). */
#include "router/dataplane/dp_rank.h"

#include "router/dataplane/pdproto.h"

int baton_dp_least(const long *load, int first, int step, int count, unsigned turn)
{
    int start = (int)(turn % (unsigned)count), best = first + start * step;
    for (int k = 1; k < count; k++) {
        int r = first + ((start + k) % count) * step;
        if (load[r] < load[best])
            best = r;
    }
    return best;
}

static int data_parallel(const baton_worker_t *w)
{
    return w && w->dp_size > 1 && w->dp_in_flight != NULL;
}

/* A rank among first + k * step (k < count) of w: w's turn moves on either way. */
static int pick_among(baton_worker_t *w, int first, int step, int count, int round_robin)
{
    unsigned turn = atomic_fetch_add(&w->dp_turn, 1);
    if (round_robin || !data_parallel(w))
        return first + (int)(turn % (unsigned)count) * step;
    long load[1024]; /* dp_size <= 1024 (registry.h) */
    for (int k = 0; k < count; k++) {
        int r = first + k * step;
        load[r] = atomic_load_explicit(&w->dp_in_flight[r], memory_order_relaxed);
    }
    return baton_dp_least(load, first, step, count, turn);
}

static void hold(baton_worker_t *w, int rank)
{
    if (data_parallel(w))
        atomic_fetch_add_explicit(&w->dp_in_flight[rank], 1, memory_order_relaxed);
}

int baton_dp_pick(baton_worker_t *w, int round_robin)
{
    if (w->dp_size <= 1)
        return 0;
    int rank = pick_among(w, 0, 1, w->dp_size, round_robin);
    hold(w, rank);
    return rank;
}

void baton_dp_pick_pair(baton_worker_t *p, baton_worker_t *d, int round_robin, int *rank_p,
                        int *rank_d)
{
    int rp = baton_dp_pick(p, round_robin), rd = 0;
    if (d->dp_size > 1) {
        /* the decode ranks that share a room with rp: rd0, rd0 + step, ... below dp_d */
        int rd0 = baton_pdproto_dp_decode_rank(p->dp_size, rp, d->dp_size, 0);
        int step = baton_pdproto_dp_decode_rank(p->dp_size, rp, d->dp_size, 1) - rd0;
        int count = step > 0 ? (d->dp_size - rd0 + step - 1) / step : 1;
        rd = pick_among(d, rd0, step > 0 ? step : 1, count, round_robin);
        hold(d, rd);
    }
    *rank_p = rp;
    *rank_d = rd;
}

void baton_dp_release(baton_worker_t *w, int rank)
{
    if (data_parallel(w) && rank >= 0 && rank < w->dp_size)
        atomic_fetch_sub_explicit(&w->dp_in_flight[rank], 1, memory_order_relaxed);
}

long baton_dp_in_flight(const baton_worker_t *w, int rank)
{
    if (!data_parallel(w) || rank < 0 || rank >= w->dp_size)
        return 0;
    return atomic_load_explicit(&((baton_worker_t *)w)->dp_in_flight[rank], memory_order_relaxed);
}
