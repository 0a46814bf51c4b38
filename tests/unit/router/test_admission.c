/* test_admission.c — the router-wide concurrency cap, queue bounds, fairness and wake-ups,
 * including from several threads at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>

#include "baton/error.h"
#include "router/dataplane/admission.h"

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

    assert_true(baton_admission_try_acquire(a, 1));
    assert_true(baton_admission_try_acquire(a, 1));
    assert_false(baton_admission_try_acquire(a, 1)); /* at the cap */
    assert_int_equal(baton_admission_active(a), 2);

    /* three may wait, the fourth is refused */
    assert_int_equal(baton_admission_enqueue(a, &k1), 0);
    assert_int_equal(baton_admission_enqueue(a, &k1), 0);
    assert_int_equal(baton_admission_enqueue(a, &k2), 0);
    assert_int_equal(baton_admission_enqueue(a, &k2), BATON_EBUSY);
    assert_int_equal(baton_admission_queued(a), 3);
    assert_int_equal(atomic_load(&k1.waiting), 2);
    assert_int_equal(atomic_load(&k2.waiting), 1);

    /* a release wakes every loop with waiting requests */
    baton_admission_release(a);
    assert_int_equal(w1.wakes, 1);
    assert_int_equal(w2.wakes, 1);
    /* a newcomer does not overtake the queue; a waiter (fair = 0) takes the slot */
    assert_false(baton_admission_try_acquire(a, 1));
    assert_true(baton_admission_try_acquire(a, 0));
    baton_admission_dequeue(a, &k2);
    assert_int_equal(atomic_load(&k2.waiting), 0);

    /* release_quiet wakes nobody; kick wakes only loops that have waiters */
    baton_admission_release_quiet(a);
    assert_int_equal(w1.wakes, 1);
    baton_admission_kick(a);
    assert_int_equal(w1.wakes, 2);
    assert_int_equal(w2.wakes, 1);

    baton_admission_dequeue(a, &k1);
    baton_admission_dequeue(a, &k1);
    assert_int_equal(baton_admission_queued(a), 0);
    baton_admission_kick(a); /* nobody waits: no wake */
    assert_int_equal(w1.wakes, 2);
    /* with the queue empty, newcomers take free slots again */
    assert_true(baton_admission_try_acquire(a, 1));
    assert_false(baton_admission_try_acquire(a, 1));

    /* an unregistered waker is never called again */
    baton_admission_unregister(a, &k1);
    assert_int_equal(baton_admission_enqueue(a, &k1), 0);
    baton_admission_release(a);
    assert_int_equal(w1.wakes, 2);
    baton_admission_dequeue(a, &k1);
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
        assert_true(baton_admission_try_acquire(a, 1));
    assert_int_equal(baton_admission_active(a), 10000);
    assert_int_equal(baton_admission_enqueue(a, &k), BATON_EBUSY); /* queue_size 0 */
    for (int i = 0; i < 10000; i++)
        baton_admission_release(a);
    assert_int_equal(baton_admission_active(a), 0);
    baton_admission_destroy(a);
    baton_admission_destroy(NULL);
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
        if (!baton_admission_try_acquire(t->a, 0))
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
