/* test_token_metrics.c — TTFT / inter-token latency from relayed SSE bytes, split anywhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/metrics.h"
#include "router/token_metrics.h"

#define S(x) ((uint64_t)((x)*1e9))

/* The _count sample of a family for route r, from the rendered text. */
static double sample(baton_metrics_t *reg, const char *name)
{
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton_metrics_render(reg, &b), 0);
    const char *p = strstr(b.data, name);
    double v = p ? strtod(p + strlen(name), NULL) : -1;
    baton_buf_free(&b);
    return v;
}

static void events_split_across_reads(void **state)
{
    (void)state;
    baton_metrics_t *reg = baton_metrics_create();
    baton_token_metrics_t *m = baton_token_metrics_create(reg);
    baton_token_scan_t s;
    baton_token_scan_start(m, &s, "/v1/chat/completions", S(1));
    baton_token_scan(&s, "data: {\"a\":1}\n", 14, S(1.25));     /* no blank line yet */
    baton_token_scan(&s, "\n", 1, S(1.5));                      /* ends the first event */
    baton_token_scan(&s, "data: b\n\ndata: c\r\n\r", 19, S(2)); /* one event + half of one */
    baton_token_scan(&s, "\ndata: [DONE]\n\n", 15, S(3));       /* ends c; [DONE] is no token */
    const char *ttft = "baton_time_to_first_token_seconds_sum{route=\"/v1/chat/completions\"} ";
    const char *ttft_n = "baton_time_to_first_token_seconds_count{route=\"/v1/chat/completions\"} ";
    const char *itl = "baton_inter_token_latency_seconds_sum{route=\"/v1/chat/completions\"} ";
    const char *itl_n = "baton_inter_token_latency_seconds_count{route=\"/v1/chat/completions\"} ";
    assert_true(sample(reg, ttft) > 0.499 && sample(reg, ttft) < 0.501);
    assert_int_equal((int)sample(reg, ttft_n), 1);
    assert_int_equal((int)sample(reg, itl_n), 2); /* b at 2.0 (gap 0.5), c at 3.0 (gap 1.0) */
    assert_true(sample(reg, itl) > 1.499 && sample(reg, itl) < 1.501);
    baton_token_metrics_destroy(m);
    baton_metrics_destroy(reg);
}

static void events_in_one_read_share_its_gap(void **state)
{
    (void)state;
    baton_metrics_t *reg = baton_metrics_create();
    baton_token_metrics_t *m = baton_token_metrics_create(reg);
    baton_token_scan_t s;
    baton_token_scan_start(m, &s, "/generate", S(10));
    baton_token_scan(&s, "data: 1\n\n", 9, S(11));
    baton_token_scan(&s, "data: 2\n\ndata: 3\n\ndata: 4\n\n", 27, S(14)); /* 3 events, 3 s */
    const char *itl = "baton_inter_token_latency_seconds_sum{route=\"/generate\"} ";
    const char *itl_n = "baton_inter_token_latency_seconds_count{route=\"/generate\"} ";
    assert_int_equal((int)sample(reg, itl_n), 3);
    assert_true(sample(reg, itl) > 2.999 && sample(reg, itl) < 3.001);
    baton_token_metrics_destroy(m);
    baton_metrics_destroy(reg);
}

static void unarmed_scan_is_a_no_op(void **state)
{
    (void)state;
    baton_token_scan_t s;
    baton_token_scan_start(NULL, &s, "/x", S(1)); /* no metrics: nothing armed */
    baton_token_scan(&s, "data: 1\n\n", 9, S(2));
    assert_int_equal(s.last_ns, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(events_split_across_reads),
        cmocka_unit_test(events_in_one_read_share_its_gap),
        cmocka_unit_test(unarmed_scan_is_a_no_op),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
