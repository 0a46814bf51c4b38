/* test_kvpool.c — the KV page pool: all-or-nothing reservations, FIFO waiters (no starvation),
 * and the fencing rule of leases (slots return only when the transfer engine, the request and
 * every worker-thread job have let go). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "baton/error.h"
#include "common/rand.h"
#include "worker/kvpool.h"

static int all_distinct(const uint32_t *a, uint32_t n, uint32_t max)
{
    uint8_t *seen = calloc(max, 1);
    int ok = seen != NULL;
    for (uint32_t i = 0; ok && i < n; i++) {
        if (a[i] >= max || seen[a[i]])
            ok = 0;
        else
            seen[a[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_take_put(void **state)
{
    (void)state;
    wk_kvpool_t p;
    assert_int_equal(wk_kvpool_init(&p, 0), BATON_EINVAL);
    assert_int_equal(wk_kvpool_init(&p, 8), 0);
    uint32_t a[8], b[8];
    assert_int_equal(wk_kvpool_take(&p, 0, a), BATON_EINVAL);
    assert_int_equal(wk_kvpool_take(&p, 9, a), BATON_ETOOBIG);
    assert_int_equal(wk_kvpool_take(&p, 5, a), 0);
    assert_int_equal(p.n_free, 3);
    /* all or nothing: 4 do not fit, and nothing was taken */
    assert_int_equal(wk_kvpool_take(&p, 4, b), BATON_EBUSY);
    assert_int_equal(p.n_free, 3);
    assert_int_equal(wk_kvpool_take(&p, 3, b), 0);
    memcpy(a + 5, b, 3 * sizeof(uint32_t));
    assert_true(all_distinct(a, 8, 8)); /* no slot handed out twice */
    wk_kvpool_put(&p, a, 8);
    assert_int_equal(p.n_free, 8);
    /* more puts than slots never overflow the free stack */
    wk_kvpool_put(&p, a, 8);
    assert_int_equal(p.n_free, 8);
    wk_kvpool_free(&p);
}

static void test_fifo(void **state)
{
    (void)state;
    wk_kvpool_t p;
    assert_int_equal(wk_kvpool_init(&p, 10), 0);
    uint32_t held[10], big_s[8], small_s[1], mid_s[2];
    assert_int_equal(wk_kvpool_take(&p, 9, held), 0);
    wk_kvwait_t big = {.n = 8, .slots = big_s}, small = {.n = 1, .slots = small_s},
                mid = {.n = 2, .slots = mid_s};
    wk_kvpool_wait(&p, &big);
    /* one slot is free, but a big request waits first: the small one queues behind it */
    assert_int_equal(wk_kvpool_take(&p, 1, small_s), BATON_EBUSY);
    wk_kvpool_wait(&p, &small);
    wk_kvpool_wait(&p, &mid);
    assert_int_equal(p.n_waiting, 3);
    assert_null(wk_kvpool_next_ready(&p));
    wk_kvpool_put(&p, held, 7); /* 8 free now */
    assert_ptr_equal(wk_kvpool_next_ready(&p), &big);
    assert_false(big.queued);
    assert_null(wk_kvpool_next_ready(&p)); /* 0 free */
    wk_kvpool_put(&p, held + 7, 2);
    assert_ptr_equal(wk_kvpool_next_ready(&p), &small);
    assert_null(wk_kvpool_next_ready(&p)); /* 1 free, mid wants 2 */
    /* a cancelled waiter leaves no trace */
    wk_kvpool_cancel(&p, &mid);
    wk_kvpool_cancel(&p, &mid);
    assert_int_equal(p.n_waiting, 0);
    assert_int_equal(p.slots_wanted, 0);
    assert_null(wk_kvpool_next_ready(&p));
    wk_kvpool_put(&p, big_s, 8);
    wk_kvpool_put(&p, small_s, 1);
    assert_int_equal(p.n_free, 10);
    wk_kvpool_free(&p);
}

/* The fencing rule: whichever order the holds go, slots return exactly once, after the last. */
static void test_lease_fencing(void **state)
{
    (void)state;
    wk_kvpool_t p;
    assert_int_equal(wk_kvpool_init(&p, 4), 0);
    uint32_t s[3];
    assert_int_equal(wk_kvpool_take(&p, 3, s), 0);
    wk_kvlease_t l;
    assert_int_equal(wk_kvlease_init(&l, s, 3, WK_KV_HOLD_USER | WK_KV_HOLD_XFER), 0);

    /* the request gives up (timeout, abort, client gone): the engine may still write */
    assert_int_equal(wk_kvlease_drop(&p, &l, WK_KV_HOLD_USER), 0);
    assert_true(wk_kvlease_live(&l));
    assert_int_equal(p.n_free, 1);
    /* dropping it again changes nothing */
    assert_int_equal(wk_kvlease_drop(&p, &l, WK_KV_HOLD_USER), 0);
    assert_int_equal(p.n_free, 1);
    /* the engine's final callback: now nothing can land, the slots come back */
    assert_int_equal(wk_kvlease_drop(&p, &l, WK_KV_HOLD_XFER), 1);
    assert_false(wk_kvlease_live(&l));
    assert_int_equal(p.n_free, 4);
    assert_int_equal(wk_kvlease_drop(&p, &l, WK_KV_HOLD_XFER), 0);
    assert_int_equal(p.n_free, 4);

    /* the other order, with a worker-thread job (fill / check) in between */
    assert_int_equal(wk_kvpool_take(&p, 3, s), 0);
    assert_int_equal(wk_kvlease_init(&l, s, 3, WK_KV_HOLD_USER | WK_KV_HOLD_XFER), 0);
    wk_kvlease_work_start(&l);
    assert_int_equal(wk_kvlease_drop(&p, &l, WK_KV_HOLD_XFER), 0);
    assert_int_equal(wk_kvlease_drop(&p, &l, WK_KV_HOLD_USER), 0);
    assert_int_equal(p.n_free, 1); /* a thread still touches the pages */
    assert_int_equal(wk_kvlease_work_done(&p, &l), 1);
    assert_int_equal(p.n_free, 4);
    assert_int_equal(wk_kvlease_work_done(&p, &l), 0);

    /* a hold added later (prefill: the room arrives after the slots) also fences */
    assert_int_equal(wk_kvpool_take(&p, 2, s), 0);
    assert_int_equal(wk_kvlease_init(&l, s, 2, WK_KV_HOLD_USER), 0);
    wk_kvlease_hold(&l, WK_KV_HOLD_XFER);
    assert_int_equal(wk_kvlease_drop(&p, &l, WK_KV_HOLD_USER), 0);
    assert_int_equal(p.n_free, 2);
    assert_int_equal(wk_kvlease_drop(&p, &l, WK_KV_HOLD_XFER), 1);
    assert_int_equal(p.n_free, 4);
    wk_kvpool_free(&p);
}

/* Random reservations, waits and leases released in random order: the pool never hands out a
 * slot that is still leased, and ends full. */
static void test_random_churn(void **state)
{
    (void)state;
    enum { SLOTS = 64, LEASES = 32 };
    wk_kvpool_t p;
    assert_int_equal(wk_kvpool_init(&p, SLOTS), 0);
    wk_kvlease_t ls[LEASES];
    memset(ls, 0, sizeof(ls));
    int owner[SLOTS];
    for (int i = 0; i < SLOTS; i++)
        owner[i] = -1;
    uint64_t rs = 7;
    for (int round = 0; round < 20000; round++) {
        int k = (int)(baton_xorshift64s(&rs) % LEASES);
        if (!wk_kvlease_live(&ls[k])) {
            uint32_t n = 1 + (uint32_t)(baton_xorshift64s(&rs) % 12), tmp[12];
            if (wk_kvpool_take(&p, n, tmp) != 0)
                continue;
            assert_int_equal(wk_kvlease_init(&ls[k], tmp, n, WK_KV_HOLD_USER | WK_KV_HOLD_XFER), 0);
            for (uint32_t i = 0; i < n; i++) {
                assert_int_equal(owner[tmp[i]], -1); /* never handed out while leased */
                owner[tmp[i]] = k;
            }
        } else {
            unsigned hold = baton_xorshift64s(&rs) % 3 == 0
                                ? 0
                                : (baton_xorshift64s(&rs) % 2 ? WK_KV_HOLD_USER : WK_KV_HOLD_XFER);
            uint32_t saved[12], n = ls[k].n;
            memcpy(saved, ls[k].slots, n * sizeof(uint32_t));
            int released;
            if (hold == 0) {
                wk_kvlease_work_start(&ls[k]);
                released = wk_kvlease_work_done(&p, &ls[k]);
            } else {
                released = wk_kvlease_drop(&p, &ls[k], hold);
            }
            if (released) {
                assert_int_equal(ls[k].holds, 0);
                for (uint32_t i = 0; i < n; i++)
                    owner[saved[i]] = -1;
            }
        }
    }
    for (int k = 0; k < LEASES; k++) {
        wk_kvlease_drop(&p, &ls[k], WK_KV_HOLD_USER);
        wk_kvlease_drop(&p, &ls[k], WK_KV_HOLD_XFER);
        assert_false(wk_kvlease_live(&ls[k]));
    }
    assert_int_equal(p.n_free, SLOTS);
    wk_kvpool_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_take_put),
        cmocka_unit_test(test_fifo),
        cmocka_unit_test(test_lease_fencing),
        cmocka_unit_test(test_random_churn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
