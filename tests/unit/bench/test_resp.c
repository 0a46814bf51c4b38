/* test_resp.c — baton-bench response reading: SSE streams of the three APIs split at every byte,
 * chunk timings, usage, errors, and whole JSON bodies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resp.h"

#define CHAT_EV(content)                                                                           \
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"         \
    "\"delta\":{\"content\":\"" content "\"},\"finish_reason\":null}]}\n\n"

static const char chat_stream[] =
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
    "\"content\":\"\"}}]}\n\n" CHAT_EV("an") CHAT_EV(" for") CHAT_EV(" of")
        CHAT_EV(" star") "data: "
                         "{\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":4,"
                         "\"completion_tokens\":4,"
                         "\"total_tokens\":8}}\n\n"
                         "data: [DONE]\n\n";

static const char completions_stream[] =
    ": keep-alive comment\n\n"
    "event: message\ndata: {\"choices\":[{\"index\":0,\"text\":\"one\"}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\" two\"}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\" three\",\"finish_reason\":\"length\"}]}\n\n"
    "data: [DONE]\n\n";

static const char generate_cumulative[] =
    "data: {\"text\":\"door\",\"meta_info\":{\"completion_tokens\":1}}\n\n"
    "data: {\"text\":\"door model\",\"meta_info\":{\"completion_tokens\":2}}\n\n"
    "data: {\"text\":\"door model road\",\"meta_info\":{\"completion_tokens\":3}}\n\n"
    "data: [DONE]\n\n";

static const char generate_delta[] = "data: {\"text\":\"door\"}\n\n"
                                     "data: {\"text\":\" model\"}\n\n"
                                     "data: {\"text\":\" road\"}\n\n"
                                     "data: [DONE]\n\n";

typedef struct expect_s {
    bb_endpoint_t ep;
    const char *stream;
    uint32_t chunks;
    int64_t usage;
    const char *text;
} expect_t;

static const expect_t cases[] = {
    {BB_EP_CHAT, chat_stream, 4, 4, "an for of star"},
    {BB_EP_COMPLETIONS, completions_stream, 3, -1, "one two three"},
    {BB_EP_GENERATE, generate_cumulative, 3, 3, "door model road"},
    {BB_EP_GENERATE, generate_delta, 3, -1, "door model road"},
};

static void check_done(const expect_t *e, bb_resp_t *r)
{
    assert_int_equal(r->err, BB_ERR_NONE);
    assert_int_equal(r->n_chunks, e->chunks);
    assert_true(r->usage_tokens == e->usage);
    assert_true(r->done_seen);
    assert_int_equal(r->text.len, strlen(e->text));
    assert_memory_equal(r->text.data, e->text, r->text.len);
    assert_int_equal(bb_resp_output_tokens(r), e->usage >= 0 ? (uint32_t)e->usage : e->chunks);
    assert_int_equal(r->itl_ms.n, e->chunks - 1);
}

/* Converts "\n" to "\r\n" (a server may use either). */
static char *crlf(const char *s)
{
    size_t n = strlen(s), nl = 0;
    for (size_t i = 0; i < n; i++)
        nl += s[i] == '\n';
    char *out = malloc(n + nl + 1), *o = out;
    assert_non_null(out);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n')
            *o++ = '\r';
        *o++ = s[i];
    }
    *o = '\0';
    return out;
}

static void run_splits(const expect_t *e, const char *data)
{
    size_t n = strlen(data);
    for (size_t cut = 0; cut <= n; cut++) {
        bb_resp_t r;
        bb_resp_init(&r, e->ep, 1, 1);
        assert_int_equal(bb_resp_feed(&r, data, cut, 1000), 0);
        assert_int_equal(bb_resp_feed(&r, data + cut, n - cut, 2000), 0);
        bb_resp_finish(&r, 3000);
        check_done(e, &r);
        bb_resp_free(&r);
    }
    /* And in three pieces at every pair of cuts, for the shorter streams. */
    if (n < 400) {
        for (size_t a = 0; a <= n; a++) {
            for (size_t b = a; b <= n; b++) {
                bb_resp_t r;
                bb_resp_init(&r, e->ep, 1, 1);
                bb_resp_feed(&r, data, a, 1);
                bb_resp_feed(&r, data + a, b - a, 2);
                bb_resp_feed(&r, data + b, n - b, 3);
                bb_resp_finish(&r, 4);
                check_done(e, &r);
                bb_resp_free(&r);
            }
        }
    }
}

static void test_split_at_every_byte(void **state)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        run_splits(&cases[i], cases[i].stream);
        char *c = crlf(cases[i].stream);
        run_splits(&cases[i], c);
        free(c);
    }
}

/*
 * Byte by byte, each byte arriving 1 ms after the previous one: a content chunk's time is the
 * arrival of the byte that completed its event, and ITLs are the gaps between those.
 */
static void test_byte_by_byte_timings(void **state)
{
    const char *s = chat_stream;
    size_t n = strlen(s);
    /* Ends of the events (index of the second '\n' of each "\n\n"). */
    size_t ends[16], n_ends = 0;
    for (size_t i = 1; i < n; i++)
        if (s[i] == '\n' && s[i - 1] == '\n')
            ends[n_ends++] = i;
    assert_int_equal(n_ends, 7); /* role, 4 contents, usage, [DONE] */

    bb_resp_t r;
    bb_resp_init(&r, BB_EP_CHAT, 1, 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(bb_resp_feed(&r, s + i, 1, (uint64_t)(i + 1) * 1000000ULL), 0);
    bb_resp_finish(&r, (uint64_t)(n + 1) * 1000000ULL);
    assert_int_equal(r.err, BB_ERR_NONE);
    assert_int_equal(r.n_chunks, 4);
    /* The role-only chunk (empty content) is not the first token, as in bench_serving. */
    assert_true(r.t_first == (uint64_t)(ends[1] + 1) * 1000000ULL);
    assert_true(r.t_last == (uint64_t)(ends[4] + 1) * 1000000ULL);
    assert_int_equal(r.itl_ms.n, 3);
    for (int k = 0; k < 3; k++)
        assert_true(fabs(r.itl_ms.v[k] - (double)(ends[k + 2] - ends[k + 1])) < 1e-9);
    bb_resp_free(&r);
}

static void test_stream_errors(void **state)
{
    bb_resp_t r;
    const char *err_ev = CHAT_EV("hi") "data: {\"error\":{\"message\":\"decode worker died\","
                                       "\"type\":\"upstream_error\"}}\n\ndata: [DONE]\n\n";
    bb_resp_init(&r, BB_EP_CHAT, 1, 0);
    bb_resp_feed(&r, err_ev, strlen(err_ev), 5);
    bb_resp_finish(&r, 6);
    assert_int_equal(r.err, BB_ERR_STREAM);
    assert_non_null(strstr(r.err_msg, "decode worker died"));
    bb_resp_free(&r);

    const char *no_done = CHAT_EV("hi") CHAT_EV(" there");
    bb_resp_init(&r, BB_EP_CHAT, 1, 0);
    bb_resp_feed(&r, no_done, strlen(no_done), 5);
    bb_resp_finish(&r, 6);
    assert_int_equal(r.err, BB_ERR_BAD_RESPONSE);
    bb_resp_free(&r);

    const char *not_json = "data: {\"choices\": [\n\ndata: [DONE]\n\n";
    bb_resp_init(&r, BB_EP_CHAT, 1, 0);
    bb_resp_feed(&r, not_json, strlen(not_json), 5);
    bb_resp_finish(&r, 6);
    assert_int_equal(r.err, BB_ERR_BAD_RESPONSE);
    bb_resp_free(&r);

    const char *empty = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"
                        "data: [DONE]\n\n";
    bb_resp_init(&r, BB_EP_CHAT, 1, 0);
    bb_resp_feed(&r, empty, strlen(empty), 5);
    bb_resp_finish(&r, 6);
    assert_int_equal(r.err, BB_ERR_NO_CONTENT);
    bb_resp_free(&r);
}

static void test_whole_bodies(void **state)
{
    bb_resp_t r;
    const char *chat = "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                       "\"content\":\"a b c\"}}],\"usage\":{\"completion_tokens\":7}}";
    bb_resp_init(&r, BB_EP_CHAT, 0, 0);
    /* Split in two reads: the body is only parsed at the end. */
    bb_resp_feed(&r, chat, 10, 100);
    bb_resp_feed(&r, chat + 10, strlen(chat) - 10, 200);
    bb_resp_finish(&r, 300);
    assert_int_equal(r.err, BB_ERR_NONE);
    assert_true(r.t_first == 300); /* TTFT = E2E without streaming */
    assert_int_equal(bb_resp_output_tokens(&r), 7);
    assert_int_equal(r.itl_ms.n, 0);
    bb_resp_free(&r);

    const char *compl = "{\"choices\":[{\"text\":\"x y z w\"}]}"; /* no usage: count words */
    bb_resp_init(&r, BB_EP_COMPLETIONS, 0, 0);
    bb_resp_feed(&r, compl, strlen(compl ), 1);
    bb_resp_finish(&r, 2);
    assert_int_equal(r.err, BB_ERR_NONE);
    assert_int_equal(bb_resp_output_tokens(&r), 4);
    bb_resp_free(&r);

    const char *gen = "[{\"text\":\"p q\",\"meta_info\":{\"completion_tokens\":2}}]";
    bb_resp_init(&r, BB_EP_GENERATE, 0, 1);
    bb_resp_feed(&r, gen, strlen(gen), 1);
    bb_resp_finish(&r, 2);
    assert_int_equal(r.err, BB_ERR_NONE);
    assert_int_equal(bb_resp_output_tokens(&r), 2);
    assert_memory_equal(r.text.data, "p q", 3);
    bb_resp_free(&r);

    const char *err = "{\"error\":{\"message\":\"no worker\",\"type\":\"x\"}}";
    bb_resp_init(&r, BB_EP_CHAT, 0, 0);
    bb_resp_feed(&r, err, strlen(err), 1);
    bb_resp_finish(&r, 2);
    assert_int_equal(r.err, BB_ERR_STREAM);
    bb_resp_free(&r);

    bb_resp_init(&r, BB_EP_CHAT, 0, 0);
    bb_resp_feed(&r, "<html>", 6, 1);
    bb_resp_finish(&r, 2);
    assert_int_equal(r.err, BB_ERR_BAD_RESPONSE);
    bb_resp_free(&r);

    bb_resp_init(&r, BB_EP_CHAT, 0, 0); /* empty body */
    bb_resp_finish(&r, 2);
    assert_int_equal(r.err, BB_ERR_BAD_RESPONSE);
    bb_resp_free(&r);
}

static void test_count_words(void **state)
{
    assert_int_equal(bb_count_words("", 0), 0);
    assert_int_equal(bb_count_words("   ", 3), 0);
    assert_int_equal(bb_count_words("a", 1), 1);
    assert_int_equal(bb_count_words(" a  b\tc\n\nd ", 11), 4);
}

static void test_names(void **state)
{
    assert_string_equal(bb_endpoint_path(BB_EP_CHAT), "/v1/chat/completions");
    assert_string_equal(bb_endpoint_path(BB_EP_COMPLETIONS), "/v1/completions");
    assert_string_equal(bb_endpoint_path(BB_EP_GENERATE), "/generate");
    assert_string_equal(bb_err_kind_name(BB_ERR_TIMEOUT), "timeout");
    assert_string_equal(bb_err_kind_name(BB_ERR_COUNT), "unknown");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_at_every_byte), cmocka_unit_test(test_byte_by_byte_timings),
        cmocka_unit_test(test_stream_errors),       cmocka_unit_test(test_whole_bodies),
        cmocka_unit_test(test_count_words),         cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
