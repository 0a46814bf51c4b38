/* test_log_limit.c — common/log's rate limiter: a flood from one call site (and from several
 * threads) writes at most N lines per second plus one summary line with the exact count. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

typedef struct {
    atomic_ulong lines;     /* flood lines let through */
    atomic_ulong summaries; /* log_suppressed lines */
    atomic_ulong summed;    /* their counts, added up */
} tally_t;

static void on_line(void *data, baton_log_level_t level, const char *msg)
{
    tally_t *t = data;
    (void)level;
    const char *s = strstr(msg, "log_suppressed event=flood count=");
    if (s) {
        atomic_fetch_add(&t->summaries, 1);
        atomic_fetch_add(&t->summed,
                         strtoull(s + strlen("log_suppressed event=flood count="), NULL, 10));
    } else if (strstr(msg, "flood_line")) {
        atomic_fetch_add(&t->lines, 1);
    }
}

static baton_log_limit_t flood_lim = BATON_LOG_LIMIT_INIT("flood", 10);

static void flood(tally_t *t, unsigned long n)
{
    baton_log_sink_t sink = {on_line, t, BATON_LOG_DEBUG};
    const baton_log_sink_t *prev = baton_log_sink_swap(&sink);
    for (unsigned long i = 0; i < n; i++)
        if (baton_log_limit_pass(&flood_lim, BATON_LOG_WARN, "test"))
            baton_log(BATON_LOG_WARN, "test", "flood_line i=%lu", i);
    baton_log_sink_swap(prev);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void test_flood_one_thread(void **state)
{
    (void)state;
    tally_t t = {0};
    double t0 = now_s();
    flood(&t, 200000);
    double secs = now_s() - t0;
    unsigned long lines = atomic_load(&t.lines);
    /* 10 per started second; the loop may straddle a few second boundaries */
    assert_true(lines >= 10);
    assert_true(lines <= 10 * ((unsigned long)secs + 2));
    /* every occurrence is either written, or counted in a summary, or still pending */
    assert_int_equal(lines + atomic_load(&t.summed) + flood_lim.suppressed, 200000);
    /* the next second's first line brings the pending count out, as one line */
    unsigned long pending = flood_lim.suppressed;
    assert_true(pending > 0);
    sleep(1);
    tally_t t2 = {0};
    flood(&t2, 1);
    assert_int_equal(atomic_load(&t2.summaries), 1);
    assert_int_equal(atomic_load(&t2.summed), pending);
    assert_int_equal(atomic_load(&t2.lines), 1);
}

static void *flood_thread(void *arg)
{
    flood(arg, 50000);
    return NULL;
}

static void test_flood_threads(void **state)
{
    (void)state;
    sleep(1); /* a fresh second: the previous test's window is over */
    tally_t t = {0};
    flood(&t, 1); /* flushes what the previous test left pending */
    unsigned long before_lines = atomic_load(&t.lines), before_sum = atomic_load(&t.summed);
    double t0 = now_s();
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, flood_thread, &t), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    double secs = now_s() - t0;
    unsigned long lines = atomic_load(&t.lines) - before_lines;
    assert_true(lines <= 10 * ((unsigned long)secs + 2));
    assert_int_equal(lines + atomic_load(&t.summed) - before_sum + flood_lim.suppressed, 200000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flood_one_thread),
        cmocka_unit_test(test_flood_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
