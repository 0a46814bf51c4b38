/* phase_checks.h — the unit tests' check that no phase move was refused (common/phase.h):
 * a reset after the cases that refuse moves on purpose, and the check itself, last. */
#ifndef BATON_TEST_PHASE_CHECKS_H
#define BATON_TEST_PHASE_CHECKS_H

#include "common/phase.h"

/* The phase tests above refuse moves on purpose; from here on none may be refused. */
static inline void test_refused_count_starts(void **state)
{
    (void)state;
    baton_phase_refused_reset();
}

/* Last: every object of the runs above moved only along its phase table. */
static inline void test_no_refused_phase_moves(void **state)
{
    (void)state;
    assert_int_equal(baton_phase_refused(), 0);
}

#endif
