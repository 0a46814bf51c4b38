/* test_phase.c — the phase helper: names by designated initialisers, legal moves, the checked
 * move and the count of refused moves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/log.h"
#include "common/phase.h"

enum { ST_A, ST_B, ST_C, ST_N };
static const uint32_t legal[ST_N] = {
    [ST_A] = BATON_PHASE_BIT(ST_B),
    [ST_B] = BATON_PHASE_BIT(ST_A) | BATON_PHASE_BIT(ST_C),
};
/* in another order than the enum on purpose: the initialisers put each where it belongs */
static const char *const names[ST_N] = {[ST_C] = "c", [ST_A] = "a", [ST_B] = "b"};
static const baton_phase_table_t tab = {"test", "thing", ST_N, legal, names};

static void test_names_and_legal(void **state)
{
    (void)state;
    assert_string_equal(baton_phase_name(&tab, ST_A), "a");
    assert_string_equal(baton_phase_name(&tab, ST_C), "c");
    assert_string_equal(baton_phase_name(&tab, ST_N), "?");
    assert_true(baton_phase_legal(&tab, ST_A, ST_B));
    assert_false(baton_phase_legal(&tab, ST_A, ST_C));
    assert_false(baton_phase_legal(&tab, ST_C, ST_A)); /* terminal */
    assert_false(baton_phase_legal(&tab, ST_N, ST_A));
    assert_false(baton_phase_legal(&tab, ST_B, 31));
}

static void test_move_counts_refusals(void **state)
{
    (void)state;
    baton_phase_refused_reset();
    unsigned char st = ST_A; /* any integer lvalue */
    assert_int_equal(BATON_PHASE_MOVE(&tab, st, ST_B, "id=%d", 1), 0);
    assert_int_equal(st, ST_B);
    assert_int_equal(BATON_PHASE_MOVE(&tab, st, ST_C, NULL), 0);
    assert_int_equal(baton_phase_refused(), 0);
    assert_int_equal(BATON_PHASE_MOVE(&tab, st, ST_A, "id=%d", 2), BATON_EINVAL);
    assert_int_equal(st, ST_C); /* unchanged */
    assert_int_equal(baton_phase_refused(), 1);
    baton_phase_refused_reset();
    assert_int_equal(baton_phase_refused(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_legal),
        cmocka_unit_test(test_move_counts_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
