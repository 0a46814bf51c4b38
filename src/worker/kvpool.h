/* kvpool.h — the KV page pool: page slots handed out all-or-nothing, a FIFO of requests waiting
 * for slots, and leases that return slots only when every hold on them (the request, the
 * transfer engine, a worker thread) is gone. */
#ifndef BATON_WORKER_KVPOOL_H
#define BATON_WORKER_KVPOOL_H

#include <stdint.h>

#include "common/list.h"

/*
 * A slot is one page in every layer (the KV cache is laid out [layer][slot][page bytes], as in
 * an inference engine), so a room of P pages per layer takes P slots. The pool knows nothing of
 * memory or threads: it counts slots. Single-threaded (the worker loop's thread).
 *
 * Fairness: slots go to waiters strictly in arrival order. A request that fits while others wait
 * queues behind them (wk_kvpool_take says BATON_EBUSY), so a big request is never starved by a
 * stream of small ones.
 */

typedef struct wk_kvwait_s wk_kvwait_t;
struct wk_kvwait_s {
    baton_list_t link;        /* pool's */
    uint32_t n;               /* slots wanted */
    uint32_t *slots;          /* caller's array of n entries; filled when served */
    int queued;               /* pool's */
    void *data;               /* caller's */
};

typedef struct wk_kvpool_s {
    uint32_t n_slots;
    uint32_t *free; /* stack of free slots */
    uint32_t n_free;
    baton_list_t waiters; /* of wk_kvwait_t.link, oldest first */
    uint32_t n_waiting;
    uint64_t slots_wanted; /* by all waiters */
} wk_kvpool_t;

/* Returns 0, BATON_EINVAL (n_slots 0) or BATON_ENOMEM. */
int wk_kvpool_init(wk_kvpool_t *p, uint32_t n_slots);
void wk_kvpool_free(wk_kvpool_t *p);

/*
 * Takes n slots at once into out[0..n): 0, BATON_EBUSY (not enough free, or others are
 * waiting: queue with wk_kvpool_wait), BATON_ETOOBIG (n exceeds the whole pool: never) or
 * BATON_EINVAL (n 0).
 */
int wk_kvpool_take(wk_kvpool_t *p, uint32_t n, uint32_t *out);
/* Gives slots back. Serve waiters afterwards with wk_kvpool_next_ready. */
void wk_kvpool_put(wk_kvpool_t *p, const uint32_t *slots, uint32_t n);

/* Queues w (w->n <= n_slots, w->slots set) at the tail. */
void wk_kvpool_wait(wk_kvpool_t *p, wk_kvwait_t *w);
/* Takes a queued waiter out without serving it (no-op when not queued). */
void wk_kvpool_cancel(wk_kvpool_t *p, wk_kvwait_t *w);
/* When the head waiter fits now: takes its slots into w->slots, dequeues and returns it. Else
 * NULL. Call in a loop after slots came back. */
wk_kvwait_t *wk_kvpool_next_ready(wk_kvpool_t *p);
/* The oldest waiter, or NULL. */
wk_kvwait_t *wk_kvpool_head(const wk_kvpool_t *p);

/* ---- leases: the fencing rule -------------------------------------------------------------- */

/*
 * A lease owns slots while anyone may still touch their pages:
 *   WK_KV_HOLD_USER  the request uses them (decode: until its sequence ends);
 *   WK_KV_HOLD_XFER  the transfer engine may still write (decode) or read (prefill) them; only the
 *                    engine's final callback for the room drops it (offer callback / room closed)
 *                    — never a timeout, never an abort request;
 *   work             a worker thread fills or checks them (a count).
 * The slots return to the pool only when the last hold is dropped.
 */
#define WK_KV_HOLD_USER 1u
#define WK_KV_HOLD_XFER 2u

typedef struct wk_kvlease_s {
    uint32_t *slots; /* owned (malloc'ed); NULL once released */
    uint32_t n;
    unsigned holds; /* WK_KV_HOLD_* */
    unsigned work;
} wk_kvlease_t;

/* Copies n slots into a new lease with the given holds. 0 or BATON_ENOMEM (slots untouched). */
int wk_kvlease_init(wk_kvlease_t *l, const uint32_t *slots, uint32_t n, unsigned holds);
void wk_kvlease_hold(wk_kvlease_t *l, unsigned hold);
/* Drops one hold (or one unit of work with wk_kvlease_work_done); returns 1 when that released
 * the slots to the pool (serve waiters then), else 0. Dropping a hold not held changes nothing. */
int wk_kvlease_drop(wk_kvpool_t *p, wk_kvlease_t *l, unsigned hold);
void wk_kvlease_work_start(wk_kvlease_t *l);
int wk_kvlease_work_done(wk_kvpool_t *p, wk_kvlease_t *l);
/* Whether the slots are still out (not yet returned). */
int wk_kvlease_live(const wk_kvlease_t *l);

#endif
