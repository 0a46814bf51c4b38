/* test_admission.c — the router-wide concurrency cap, queue bounds, fairness and wake-ups,
 * including from several threads at once, and the per-class limits and order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>

#include "baton/error.h"
#include "router/dataplane/admission.h"

#define D BATON_PRIO_DEFAULT

typedef struct {
    int wakes;
} wake_ctx_t;

static void on_wake(void *ctx)
{
    ((wake_ctx_t *)ctx)->wakes++;
}

static void test_cap_and_queue(void **state)
{
    baton_admission_t *a;
    assert_int_equal(baton_admission_create(&a, 2, 3), 0);
    assert_int_equal(baton_admission_max_active(a), 2);
    assert_int_equal(baton_admission_queue_size(a), 3);
    wake_ctx_t w1 = {0}, w2 = {0};
    baton_admission_waker_t k1 = {.wake = on_wake, .ctx = &w1};
    baton_admission_waker_t k2 = {.wake = on_wake, .ctx = &w2};
    baton_admission_register(a, &k1);
    baton_admission_register(a, &k2);

    assert_true(baton_admission_try_acquire(a, D, 1));
    assert_true(baton_admission_try_acquire(a, D, 1));
    assert_false(baton_admission_try_acquire(a, D, 1)); /* at the cap */
    assert_int_equal(baton_admission_active(a), 2);

    /* three may wait, the fourth is refused */
    assert_int_equal(baton_admission_enqueue(a, &k1, D), 0);
    assert_int_equal(baton_admission_enqueue(a, &k1, D), 0);
    assert_int_equal(baton_admission_enqueue(a, &k2, D), 0);
    assert_int_equal(baton_admission_enqueue(a, &k2, D), BATON_EBUSY);
    assert_int_equal(baton_admission_queued(a), 3);
    assert_int_equal(atomic_load(&k1.waiting), 2);
    assert_int_equal(atomic_load(&k2.waiting), 1);

    /* a release wakes every loop with waiting requests */
    baton_admission_release(a);
    assert_int_equal(w1.wakes, 1);
    assert_int_equal(w2.wakes, 1);
    /* a newcomer does not overtake the queue; a waiter (fair = 0) takes the slot */
    assert_false(baton_admission_try_acquire(a, D, 1));
    assert_true(baton_admission_try_acquire(a, D, 0));
    baton_admission_dequeue(a, &k2, D);
    assert_int_equal(atomic_load(&k2.waiting), 0);

    /* release_quiet wakes nobody; kick wakes only loops that have waiters */
    baton_admission_release_quiet(a);
    assert_int_equal(w1.wakes, 1);
    baton_admission_kick(a);
    assert_int_equal(w1.wakes, 2);
    assert_int_equal(w2.wakes, 1);

    baton_admission_dequeue(a, &k1, D);
    baton_admission_dequeue(a, &k1, D);
    assert_int_equal(baton_admission_queued(a), 0);
    baton_admission_kick(a); /* nobody waits: no wake */
    assert_int_equal(w1.wakes, 2);
    /* with the queue empty, newcomers take free slots again */
    assert_true(baton_admission_try_acquire(a, D, 1));
    assert_false(baton_admission_try_acquire(a, D, 1));

    /* an unregistered waker is never called again */
    baton_admission_unregister(a, &k1);
    assert_int_equal(baton_admission_enqueue(a, &k1, D), 0);
    baton_admission_release(a);
    assert_int_equal(w1.wakes, 2);
    baton_admission_dequeue(a, &k1, D);
    baton_admission_unregister(a, &k2);
    baton_admission_destroy(a);
}

static void test_unlimited_and_no_queue(void **state)
{
    baton_admission_t *a;
    assert_int_equal(baton_admission_create(&a, 0, 0), 0);
    wake_ctx_t w = {0};
    baton_admission_waker_t k = {.wake = on_wake, .ctx = &w};
    for (int i = 0; i < 10000; i++)
        assert_true(baton_admission_try_acquire(a, D, 1));
    assert_int_equal(baton_admission_active(a), 10000);
    assert_int_equal(baton_admission_enqueue(a, &k, D), BATON_EBUSY); /* queue_size 0 */
    for (int i = 0; i < 10000; i++)
        baton_admission_release(a);
    assert_int_equal(baton_admission_active(a), 0);
    baton_admission_destroy(a);
    baton_admission_destroy(NULL);
}

/* Per-class queue limits (of --queue-size 8): bulk 4, default 8, interactive 10, system 12. */
static void test_class_limits(void **state)
{
    assert_int_equal(baton_prio_queue_limit(BATON_PRIO_BULK, 8), 4);
    assert_int_equal(baton_prio_queue_limit(BATON_PRIO_DEFAULT, 8), 8);
    assert_int_equal(baton_prio_queue_limit(BATON_PRIO_INTERACTIVE, 8), 10);
    assert_int_equal(baton_prio_queue_limit(BATON_PRIO_SYSTEM, 8), 12);
    assert_int_equal(baton_prio_queue_limit(BATON_PRIO_BULK, 1), 1);   /* at least one */
    assert_int_equal(baton_prio_queue_limit(BATON_PRIO_SYSTEM, 0), 0); /* no queue */

    baton_admission_t *a;
    assert_int_equal(baton_admission_create(&a, 1, 8), 0);
    wake_ctx_t w = {0};
    baton_admission_waker_t k = {.wake = on_wake, .ctx = &w};
    baton_admission_register(a, &k);
    /* bulk fills half of the queue, then is shed; default fills the rest */
    for (int i = 0; i < 4; i++)
        assert_int_equal(baton_admission_enqueue(a, &k, BATON_PRIO_BULK), 0);
    assert_int_equal(baton_admission_enqueue(a, &k, BATON_PRIO_BULK), BATON_EBUSY);
    for (int i = 0; i < 4; i++)
        assert_int_equal(baton_admission_enqueue(a, &k, D), 0);
    assert_int_equal(baton_admission_enqueue(a, &k, D), BATON_EBUSY);
    /* interactive and system have their reserve beyond --queue-size */
    assert_int_equal(baton_admission_enqueue(a, &k, BATON_PRIO_INTERACTIVE), 0);
    assert_int_equal(baton_admission_enqueue(a, &k, BATON_PRIO_INTERACTIVE), 0);
    assert_int_equal(baton_admission_enqueue(a, &k, BATON_PRIO_INTERACTIVE), BATON_EBUSY);
    assert_int_equal(baton_admission_enqueue(a, &k, BATON_PRIO_SYSTEM), 0);
    assert_int_equal(baton_admission_enqueue(a, &k, BATON_PRIO_SYSTEM), 0);
    assert_int_equal(baton_admission_enqueue(a, &k, BATON_PRIO_SYSTEM), BATON_EBUSY);
    assert_int_equal(baton_admission_queued(a), 12);
    assert_int_equal(baton_admission_queued_class(a, BATON_PRIO_BULK), 4);
    assert_int_equal(baton_admission_queued_class(a, D), 4);
    assert_int_equal(baton_admission_queued_class(a, BATON_PRIO_INTERACTIVE), 2);
    assert_int_equal(baton_admission_queued_class(a, BATON_PRIO_SYSTEM), 2);
    assert_int_equal(atomic_load(&k.waiting), 12);
    for (int i = 0; i < 4; i++) {
        baton_admission_dequeue(a, &k, BATON_PRIO_BULK);
        baton_admission_dequeue(a, &k, D);
    }
    for (int i = 0; i < 2; i++) {
        baton_admission_dequeue(a, &k, BATON_PRIO_INTERACTIVE);
        baton_admission_dequeue(a, &k, BATON_PRIO_SYSTEM);
    }
    assert_int_equal(baton_admission_queued(a), 0);
    assert_int_equal(atomic_load(&k.waiting), 0);
    baton_admission_unregister(a, &k);
    baton_admission_destroy(a);
}

/* Slots: bulk and default share the cap, interactive and system have a reserve beyond it. */
static void test_class_slots(void **state)
{
    (void)state;
    const unsigned R = 25;
    assert_int_equal(baton_prio_slot_limit(BATON_PRIO_BULK, 8, R), 8);
    assert_int_equal(baton_prio_slot_limit(D, 8, R), 8);
    assert_int_equal(baton_prio_slot_limit(BATON_PRIO_INTERACTIVE, 8, R), 10);
    assert_int_equal(baton_prio_slot_limit(BATON_PRIO_SYSTEM, 8, R), 12);
    assert_int_equal(baton_prio_slot_limit(BATON_PRIO_INTERACTIVE, 1, R), 2); /* at least one */
    assert_int_equal(baton_prio_slot_limit(BATON_PRIO_SYSTEM, 0, R), 0);      /* unlimited */
    assert_int_equal(baton_prio_slot_limit(BATON_PRIO_INTERACTIVE, 8, 50), 12);
    assert_int_equal(baton_prio_slot_limit(BATON_PRIO_SYSTEM, 8, 50), 16);
    assert_int_equal(baton_prio_slot_limit(BATON_PRIO_SYSTEM, 8, 0), 8); /* no reserve */
    assert_int_equal(baton_prio_slot_limit(BATON_PRIO_INTERACTIVE, 8, BATON_PRIO_RESERVE_PCT), 12);
    baton_admission_t *a;
    assert_int_equal(baton_admission_create(&a, 4, 8), 0);
    baton_admission_set_reserve(a, 25);
    for (int i = 0; i < 4; i++)
        assert_true(baton_admission_try_acquire(a, i % 2 ? D : BATON_PRIO_BULK, 1));
    assert_false(baton_admission_try_acquire(a, D, 1));
    assert_false(baton_admission_try_acquire(a, BATON_PRIO_BULK, 1));
    assert_true(baton_admission_try_acquire(a, BATON_PRIO_INTERACTIVE, 1)); /* 5 of 5 */
    assert_false(baton_admission_try_acquire(a, BATON_PRIO_INTERACTIVE, 1));
    assert_true(baton_admission_try_acquire(a, BATON_PRIO_SYSTEM, 1)); /* 6 of 6 */
    assert_false(baton_admission_try_acquire(a, BATON_PRIO_SYSTEM, 1));
    assert_int_equal(baton_admission_active(a), 6);
    /* one freed: no room for default (5 active, cap 4) nor interactive (5 of 5); system */
    baton_admission_release(a);
    assert_false(baton_admission_try_acquire(a, D, 1));
    assert_false(baton_admission_try_acquire(a, BATON_PRIO_INTERACTIVE, 1));
    assert_true(baton_admission_try_acquire(a, BATON_PRIO_SYSTEM, 1));
    /* --priority-reserve-pct 0: every class shares the cap */
    baton_admission_set_reserve(a, 0);
    assert_false(baton_admission_try_acquire(a, BATON_PRIO_SYSTEM, 1));
    for (int i = 0; i < 6; i++)
        baton_admission_release(a);
    assert_int_equal(baton_admission_active(a), 0);
    baton_admission_destroy(a);
}

/* Strict order: no slot for a class while a higher one waits; a newcomer overtakes the lower
 * classes' waiters but not its own class's. */
static void test_class_order(void **state)
{
    baton_admission_t *a;
    assert_int_equal(baton_admission_create(&a, 1, 8), 0);
    wake_ctx_t w = {0};
    baton_admission_waker_t k = {.wake = on_wake, .ctx = &w};
    baton_admission_register(a, &k);
    assert_int_equal(baton_admission_enqueue(a, &k, BATON_PRIO_BULK), 0);
    /* only bulk waits: an interactive or default newcomer takes the free slot */
    assert_true(baton_admission_try_acquire(a, BATON_PRIO_INTERACTIVE, 1));
    baton_admission_release(a);
    assert_true(baton_admission_try_acquire(a, D, 1));
    baton_admission_release(a);
    /* a bulk newcomer does not overtake the bulk waiter, the waiter itself takes it */
    assert_false(baton_admission_try_acquire(a, BATON_PRIO_BULK, 1));
    /* an interactive waiter: the bulk waiter may not take the slot, the interactive one may */
    assert_int_equal(baton_admission_enqueue(a, &k, BATON_PRIO_INTERACTIVE), 0);
    assert_false(baton_admission_try_acquire(a, BATON_PRIO_BULK, 0));
    assert_false(baton_admission_try_acquire(a, D, 1));
    assert_false(baton_admission_try_acquire(a, BATON_PRIO_INTERACTIVE, 1));
    assert_true(baton_admission_try_acquire(a, BATON_PRIO_SYSTEM, 1)); /* above everyone */
    baton_admission_release(a);
    assert_true(baton_admission_try_acquire(a, BATON_PRIO_INTERACTIVE, 0));
    baton_admission_dequeue(a, &k, BATON_PRIO_INTERACTIVE);
    baton_admission_release(a);
    assert_true(baton_admission_try_acquire(a, BATON_PRIO_BULK, 0)); /* now its turn */
    baton_admission_dequeue(a, &k, BATON_PRIO_BULK);
    baton_admission_release(a);
    baton_admission_unregister(a, &k);
    baton_admission_destroy(a);
}

/* Preemption across loops: a default newcomer on k2 at the full queue asks k1 to shed its bulk
 * waiter and is counted at once; k1 is woken and takes the request; the settled shedding
 * frees the place. A second newcomer finds no bulk waiter left unclaimed. */
static void test_preempt_across_loops(void **state)
{
    (void)state;
    baton_admission_t *a;
    assert_int_equal(baton_admission_create(&a, 1, 2), 0);
    wake_ctx_t w1 = {0}, w2 = {0};
    baton_admission_waker_t k1 = {.wake = on_wake, .ctx = &w1};
    baton_admission_waker_t k2 = {.wake = on_wake, .ctx = &w2};
    baton_admission_register(a, &k1);
    baton_admission_register(a, &k2);
    assert_int_equal(baton_admission_enqueue(a, &k1, BATON_PRIO_BULK), 0);
    assert_int_equal(baton_admission_enqueue(a, &k2, D), 0);
    assert_int_equal(baton_admission_enqueue(a, &k2, D), BATON_EBUSY); /* 2 of 2 */
    /* no bulk waiter on k2 itself; one of default is not lower than default */
    assert_int_equal(baton_admission_preempt(a, &k1, D, BATON_PRIO_BULK), BATON_EBUSY);
    assert_int_equal(baton_admission_preempt(a, &k2, D, D), BATON_EBUSY);
    assert_int_equal(baton_admission_preempt(a, &k2, D, BATON_PRIO_BULK), 0);
    assert_int_equal(w1.wakes, 1);
    assert_int_equal(baton_admission_queued(a), 3); /* one over until k1 sheds */
    assert_int_equal(atomic_load(&k2.waiting), 2);
    /* the one bulk waiter is claimed already: a second newcomer is refused */
    assert_int_equal(baton_admission_preempt(a, &k2, D, BATON_PRIO_BULK), BATON_EBUSY);
    unsigned n[BATON_PRIO_COUNT];
    baton_admission_take_evictions(&k1, n);
    assert_int_equal(n[BATON_PRIO_BULK], 1);
    assert_int_equal(n[D], 0);
    baton_admission_dequeue(a, &k1, BATON_PRIO_BULK); /* k1 sheds it */
    baton_admission_evicted(a, 1);
    baton_admission_take_evictions(&k1, n);
    assert_int_equal(n[BATON_PRIO_BULK], 0); /* taken once */
    assert_int_equal(baton_admission_queued(a), 2);
    assert_int_equal(baton_admission_queued_class(a, BATON_PRIO_BULK), 0);
    /* interactive (limit 2 of --queue-size 2) at 2 queued: a default waiter on k2 makes room */
    assert_int_equal(baton_admission_preempt(a, &k1, BATON_PRIO_INTERACTIVE, D), 0);
    assert_int_equal(w2.wakes, 1);
    baton_admission_take_evictions(&k2, n);
    assert_int_equal(n[D], 1);
    baton_admission_dequeue(a, &k2, D);
    baton_admission_evicted(a, 1);
    baton_admission_dequeue(a, &k2, D);
    baton_admission_dequeue(a, &k1, BATON_PRIO_INTERACTIVE);
    assert_int_equal(baton_admission_queued(a), 0);
    assert_int_equal(atomic_load(&k1.waiting) + atomic_load(&k2.waiting), 0);
    baton_admission_unregister(a, &k1);
    baton_admission_unregister(a, &k2);
    baton_admission_destroy(a);
}

#define THREADS 4
#define ROUNDS  20000

typedef struct {
    baton_admission_t *a;
    atomic_int *holding;
    atomic_int *max_seen;
} thr_t;

static void *hammer(void *arg)
{
    thr_t *t = arg;
    for (int i = 0; i < ROUNDS; i++) {
        if (!baton_admission_try_acquire(t->a, D, 0))
            continue;
        int h = atomic_fetch_add(t->holding, 1) + 1;
        int m = atomic_load(t->max_seen);
        while (h > m && !atomic_compare_exchange_weak(t->max_seen, &m, h))
            ;
        atomic_fetch_sub(t->holding, 1);
        baton_admission_release(t->a);
    }
    return NULL;
}

static void test_threads_never_exceed_cap(void **state)
{
    baton_admission_t *a;
    assert_int_equal(baton_admission_create(&a, 3, 10), 0);
    atomic_int holding = 0, max_seen = 0;
    pthread_t th[THREADS];
    thr_t t = {a, &holding, &max_seen};
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, hammer, &t), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    assert_true(atomic_load(&max_seen) <= 3);
    assert_true(atomic_load(&max_seen) >= 1);
    assert_int_equal(baton_admission_active(a), 0);
    baton_admission_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cap_and_queue),
        cmocka_unit_test(test_unlimited_and_no_queue),
        cmocka_unit_test(test_threads_never_exceed_cap),
        cmocka_unit_test(test_class_limits),
        cmocka_unit_test(test_class_order),
        cmocka_unit_test(test_class_slots),
        cmocka_unit_test(test_preempt_across_loops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
