/* admission.h — router-wide admission control: a cap on concurrent requests over all threads,
 * and the per-class accounting and wake-ups of the bounded queue in front of it. */
#ifndef BATON_ROUTER_ADMISSION_H
#define BATON_ROUTER_ADMISSION_H

#include <stdatomic.h>

#include "router/dataplane/priority.h"

/*
 * Every inference request holds one slot while it is proxied (from dispatch to its end).
 * max_active bounds the slots bulk and default requests may take; interactive and system have
 * a reserve beyond it (priority.h, baton_prio_slot_limit; its size set with
 * baton_admission_set_reserve). When no slot is free for its class, or every eligible worker
 * is at its in-flight cap (--max-worker-requests), the request waits in the queue of its own loop;
 * the number of waiting requests over all loops is bounded per priority class (priority.h: bulk
 * half of queue_size, default queue_size, interactive a quarter beyond it, system a half beyond
 * it):
 *   - queue at the class's limit      → 429 queue_full (with Retry-After: 1): the router is
 *                                     overloaded now, the client may come back; the lowest
 *                                     classes are refused first;
 *   - waited queue_timeout_ms       → 408 queue_timeout: no capacity came in time;
 *   - no eligible worker at all     → 503 at once (waiting would not bring one back faster
 *                                     than the client's own retry).
 * Order: strict priority, then FIFO within a class. A request never takes a slot while one of
 * a higher class waits on any loop, and a newcomer (fair = 1) not while one of its own class
 * waits either. Within a class, across loops, the first woken loop to take a freed slot wins
 * (no global order there: fair enough for a router, and no cross-thread hand-off).
 * Starvation: a lower class waits as long as higher classes keep the slots busy; its wait is
 * bounded by queue_timeout_ms (then 408), never unbounded.
 *
 * Wake-ups: each loop registers a waker (a callback that posts to its loop, e.g. uv_async_send)
 * and counts its waiting requests in it. release() and kick() call the waker of every loop that
 * has waiting requests; the loop then retries its queue head(s) on its own thread.
 *
 * Threading: every function is thread-safe. Counters are atomics; the waker list has a mutex,
 * taken by register/unregister and by release/kick only while requests wait.
 * Ownership: the caller allocates wakers and keeps them alive until unregister() returns; a
 * waker's callback is never called after unregister() returned.
 */

typedef struct baton_admission_s baton_admission_t;

typedef struct baton_admission_waker_s {
    void (*wake)(void *ctx); /* must be safe from any thread */
    void *ctx;
    atomic_uint waiting; /* this loop's queued requests (enqueue/dequeue keep it) */
    /* private: per class, this loop's queued requests and the ones other loops asked it to shed
     * (baton_admission_preempt); zero them (or leave them from a zeroed allocation) before
     * register */
    atomic_uint waiting_cls_[BATON_PRIO_COUNT];
    atomic_uint evict_[BATON_PRIO_COUNT];
    struct baton_admission_waker_s *next_; /* private */
} baton_admission_waker_t;

/* max_active 0 = unlimited. 0 or BATON_ENOMEM. */
int baton_admission_create(baton_admission_t **a_p, unsigned max_active, unsigned queue_size);
void baton_admission_destroy(baton_admission_t *a); /* NULL is ignored */
/* The interactive reserve in percent of max_active (default 50; system gets twice it). Set
 * before the loops start. */
void baton_admission_set_reserve(baton_admission_t *a, unsigned pct);

/* Takes a slot for a request of class cls: 1 when taken; 0 when at its class's limit, when
 * requests of a higher class wait, or (with fair) when requests of class cls wait. */
int baton_admission_try_acquire(baton_admission_t *a, baton_prio_t cls, int fair);

/* Gives a slot back and wakes the loops with waiting requests. */
void baton_admission_release(baton_admission_t *a);

/* Gives a slot back without waking anyone: for a woken waiter that took a slot but found every
 * worker at its cap (waking the others would only make them find the same). */
void baton_admission_release_quiet(baton_admission_t *a);

/* One more waiting request of class cls on the loop of `wk`: 0, or BATON_EBUSY when the queue
 * holds its class's limit already (baton_prio_queue_limit; then nothing changed). */
int baton_admission_enqueue(baton_admission_t *a, baton_admission_waker_t *wk, baton_prio_t cls);
/* One waiting request of class cls left the queue (admitted, timed out, shed or gone). */
void baton_admission_dequeue(baton_admission_t *a, baton_admission_waker_t *wk, baton_prio_t cls);

/*
 * --priority-preempt across loops: a request of class cls found the queue at its limit and its
 * own loop (`self`) holds no waiter of class `victim` (< cls) to shed. Another loop holding one
 * is asked to shed it (its waker is called; it then takes the request with
 * baton_admission_take_evictions), and the newcomer is counted as queued in its place at once:
 * 0. BATON_EBUSY when no other loop holds such a waiter, or when shedding one would not make
 * room for cls (nothing changed). Until the other loop has shed it, the queue holds one
 * request more than its limit; if that waiter left meanwhile (admitted, timed out), nothing is
 * shed and the queue stays one over until a request leaves.
 */
int baton_admission_preempt(baton_admission_t *a, baton_admission_waker_t *self, baton_prio_t cls,
                            baton_prio_t victim);
/* The sheddings other loops asked of this loop's waiter: n_p[c] of class c (then cleared). The
 * loop sheds up to that many of its newest class-c waiters (each with dequeue as usual), then
 * calls baton_admission_evicted with the sum of n_p. */
void baton_admission_take_evictions(baton_admission_waker_t *wk, unsigned n_p[BATON_PRIO_COUNT]);
void baton_admission_evicted(baton_admission_t *a, unsigned n);

/* Wakes every loop with waiting requests (capacity may have come: a worker's in-flight count
 * dropped, a worker came back). Cheap when nobody waits. */
void baton_admission_kick(baton_admission_t *a);

void baton_admission_register(baton_admission_t *a, baton_admission_waker_t *wk);
void baton_admission_unregister(baton_admission_t *a, baton_admission_waker_t *wk);

unsigned baton_admission_active(baton_admission_t *a);
unsigned baton_admission_queued(baton_admission_t *a);
unsigned baton_admission_queued_class(baton_admission_t *a, baton_prio_t cls);
unsigned baton_admission_max_active(const baton_admission_t *a);
unsigned baton_admission_queue_size(const baton_admission_t *a);

#endif
