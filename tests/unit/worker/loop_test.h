/* loop_test.h — what the worker's loop-driven unit tests share: a bounded wait on a libuv loop
 * and reading one series out of a metrics registry. Include after <cmocka.h>. */
#ifndef BATON_TESTS_WORKER_LOOP_TEST_H
#define BATON_TESTS_WORKER_LOOP_TEST_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/buf.h"
#include "common/metrics.h"

#define LOOP_TEST_WAIT_MS 30000 /* a bound for a hung test, never a timing check */

static inline uint64_t loop_test_now_ms(void)
{
    return uv_hrtime() / 1000000;
}

static inline void loop_test_keepalive_cb(uv_timer_t *t)
{
    (void)t;
}

/* A repeating no-op timer, so that UV_RUN_ONCE always comes back to check the condition. */
static inline void loop_test_keepalive(uv_loop_t *loop, uv_timer_t *t)
{
    uv_timer_init(loop, t);
    uv_timer_start(t, loop_test_keepalive_cb, 5, 5);
}

/* Runs `loop` until `cond` holds; fails the test after LOOP_TEST_WAIT_MS. */
#define LOOP_RUN_UNTIL(loop, cond)                                                                 \
    do {                                                                                           \
        uint64_t deadline_ = loop_test_now_ms() + LOOP_TEST_WAIT_MS;                               \
        while (!(cond)) {                                                                          \
            if (loop_test_now_ms() > deadline_)                                                    \
                fail_msg("gave up waiting for %s", #cond);                                         \
            uv_run((loop), UV_RUN_ONCE);                                                           \
        }                                                                                          \
    } while (0)

/* The value of the line `series value` of the registry's text, or -1 when absent. */
static inline double loop_test_metric(baton_metrics_t *m, const char *series)
{
    baton_buf_t b = BATON_BUF_INIT;
    double v = -1;
    assert_int_equal(baton_metrics_render(m, &b), 0);
    assert_int_equal(baton_buf_append(&b, "", 1), 0); /* terminated for strchr */
    size_t n = strlen(series);
    for (const char *line = b.data; line != NULL && *line;) {
        if (strncmp(line, series, n) == 0 && line[n] == ' ') {
            v = strtod(line + n + 1, NULL);
            break;
        }
        line = strchr(line, '\n');
        line = line ? line + 1 : NULL;
    }
    baton_buf_free(&b);
    return v;
}

#endif
