/* test_pdreq.c — unit tests for request validation, batch detection, bootstrap injection,
 * logprob merging (src/router/dataplane/pdreq.c) and SSE framing (src/http/sse.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "baton/error.h"
#include "router/dataplane/pdreq.h"
#include "router/dataplane/policy.h"
#include "http/sse.h"

/* ---- helpers ---- */

static int parse(baton_pdreq_t *r, baton_api_t api, const char *body, baton_pdreq_error_t *err)
{
    memset(err, 0, sizeof(*err));
    return baton_pdreq_parse(r, api, body, strlen(body), err);
}

/* Asserts a 400 naming `param` (NULL: no param) with `code`. */
static void expect_bad(baton_api_t api, const char *body, const char *param, const char *code)
{
    baton_pdreq_t r;
    baton_pdreq_error_t err;
    int rc = parse(&r, api, body, &err);
    if (rc != BATON_EINVAL)
        fail_msg("accepted: %s", body);
    assert_int_equal(err.status, 400);
    assert_null(r.body); /* r holds nothing */
    assert_true(err.message[0] != '\0');
    if (param)
        assert_string_equal(err.param, param);
    else
        assert_string_equal(err.param, "");
    if (code)
        assert_string_equal(err.code, code);
}

static void expect_ok(baton_api_t api, const char *body, size_t batch, int stream, int logprobs)
{
    baton_pdreq_t r;
    baton_pdreq_error_t err;
    int rc = parse(&r, api, body, &err);
    if (rc != 0)
        fail_msg("rejected (%s, param %s): %s", err.message, err.param, body);
    assert_int_equal(r.batch, batch);
    assert_int_equal(r.stream, stream);
    assert_int_equal(r.logprobs, logprobs);
    baton_pdreq_free(&r);
}

/* ---- validation ---- */

static void test_body_must_be_object(void **state)
{
    (void)state;
    expect_bad(BATON_API_CHAT, "", NULL, "invalid_json");
    expect_bad(BATON_API_CHAT, "{", NULL, "invalid_json");
    expect_bad(BATON_API_CHAT, "{\"messages\": [}", NULL, "invalid_json");
    expect_bad(BATON_API_CHAT, "[1,2]", NULL, "invalid_type");
    expect_bad(BATON_API_CHAT, "\"text\"", NULL, "invalid_type");
    expect_bad(BATON_API_GENERATE, "42", NULL, "invalid_type");
    expect_bad(BATON_API_GENERATE, "null", NULL, "invalid_type");
    /* trailing garbage after the object */
    expect_bad(BATON_API_GENERATE, "{\"text\":\"a\"} x", NULL, "invalid_json");
}

static void test_chat_messages(void **state)
{
    (void)state;
    expect_bad(BATON_API_CHAT, "{}", "messages", "missing_parameter");
    expect_bad(BATON_API_CHAT, "{\"messages\":null}", "messages", "missing_parameter");
    expect_bad(BATON_API_CHAT, "{\"messages\":\"hi\"}", "messages", "invalid_type");
    expect_bad(BATON_API_CHAT, "{\"messages\":[]}", "messages", "invalid_value");
    expect_bad(BATON_API_CHAT, "{\"messages\":[1]}", "messages", "invalid_type");
    expect_bad(BATON_API_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", "messages", "invalid_type");
    expect_bad(BATON_API_CHAT, "{\"messages\":[{\"role\":7}]}", "messages", "invalid_type");
    expect_ok(BATON_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 0, 0, 0);
}

static void test_completions_prompt(void **state)
{
    (void)state;
    expect_bad(BATON_API_COMPLETIONS, "{}", "prompt", "missing_parameter");
    expect_bad(BATON_API_COMPLETIONS, "{\"prompt\":3}", "prompt", "invalid_type");
    expect_bad(BATON_API_COMPLETIONS, "{\"prompt\":[]}", "prompt", "invalid_value");
    expect_bad(BATON_API_COMPLETIONS, "{\"prompt\":[\"a\",1]}", "prompt", "invalid_type");
    expect_bad(BATON_API_COMPLETIONS, "{\"prompt\":[[1],[]]}", "prompt", "invalid_type");
    expect_bad(BATON_API_COMPLETIONS, "{\"prompt\":[[1],\"a\"]}", "prompt", "invalid_type");
    expect_bad(BATON_API_COMPLETIONS, "{\"prompt\":{\"a\":1}}", "prompt", "invalid_type");
    expect_ok(BATON_API_COMPLETIONS, "{\"prompt\":\"hello\"}", 0, 0, 0);
    expect_ok(BATON_API_COMPLETIONS, "{\"prompt\":[1,2,3]}", 0, 0, 0);
    expect_ok(BATON_API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\",\"c\"]}", 3, 0, 0);
    expect_ok(BATON_API_COMPLETIONS, "{\"prompt\":[\"a\"]}", 1, 0, 0);
    expect_ok(BATON_API_COMPLETIONS, "{\"prompt\":[[1,2],[3]]}", 2, 0, 0);
}

static void test_generate_inputs(void **state)
{
    (void)state;
    expect_bad(BATON_API_GENERATE, "{}", "text", "missing_parameter");
    expect_bad(BATON_API_GENERATE, "{\"text\":null,\"input_ids\":null}", "text",
               "missing_parameter");
    expect_bad(BATON_API_GENERATE, "{\"text\":5}", "text", "invalid_type");
    expect_bad(BATON_API_GENERATE, "{\"text\":[]}", "text", "invalid_type");
    expect_bad(BATON_API_GENERATE, "{\"text\":[\"a\",2]}", "text", "invalid_type");
    expect_bad(BATON_API_GENERATE, "{\"input_ids\":[]}", "input_ids", "invalid_type");
    expect_bad(BATON_API_GENERATE, "{\"input_ids\":\"1 2\"}", "input_ids", "invalid_type");
    expect_bad(BATON_API_GENERATE, "{\"input_ids\":[1,[2]]}", "input_ids", "invalid_type");
    expect_bad(BATON_API_GENERATE, "{\"input_ids\":[1.5]}", "input_ids", "invalid_type");
    expect_bad(BATON_API_GENERATE, "{\"text\":[\"a\",\"b\"],\"input_ids\":[[1]]}", "input_ids",
               "invalid_value");
    expect_ok(BATON_API_GENERATE, "{\"text\":\"hi\"}", 0, 0, 0);
    expect_ok(BATON_API_GENERATE, "{\"input_ids\":[1,2]}", 0, 0, 0);
    expect_ok(BATON_API_GENERATE, "{\"text\":[\"a\",\"b\"]}", 2, 0, 0);
    expect_ok(BATON_API_GENERATE, "{\"input_ids\":[[1],[2],[3,4]]}", 3, 0, 0);
}

static void test_field_types(void **state)
{
    (void)state;
    const char *m = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char body[512];
    static const struct {
        const char *field;
        const char *value;
    } bad[] = {
        {"stream", "\"yes\""},
        {"stream", "1"},
        {"max_tokens", "-1"},
        {"max_tokens", "1.5"},
        {"max_tokens", "\"10\""},
        {"max_completion_tokens", "-3"},
        {"n", "0"},
        {"n", "\"2\""},
        {"stop", "5"},
        {"stop", "[\"a\",1]"},
        {"temperature", "\"hot\""},
        {"top_p", "true"},
        {"logprobs", "\"yes\""},
        {"logprobs", "-1"},
        {"top_logprobs", "-2"},
        {"model", "5"},
        {"seed", "1.5"},
        {"stream_options", "true"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        snprintf(body, sizeof(body), "{%s,\"%s\":%s}", m, bad[i].field, bad[i].value);
        expect_bad(BATON_API_CHAT, body, bad[i].field, "invalid_type");
    }
    /* null means absent; good types pass */
    snprintf(body, sizeof(body),
             "{%s,\"stream\":null,\"stop\":null,\"max_tokens\":null,\"temperature\":0.5,"
             "\"top_p\":1,\"stop\":[\"a\",\"b\"],\"max_tokens\":0,\"n\":1,\"seed\":-4}",
             m);
    expect_ok(BATON_API_CHAT, body, 0, 0, 0);

    /* sampling_params for /generate */
    expect_bad(BATON_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":3}", "sampling_params",
               "invalid_type");
    expect_bad(BATON_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"max_new_tokens\":-1}}",
               "sampling_params.max_new_tokens", "invalid_type");
    expect_bad(BATON_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"temperature\":\"x\"}}",
               "sampling_params.temperature", "invalid_type");
    expect_bad(BATON_API_GENERATE, "{\"text\":\"a\",\"return_logprob\":1}", "return_logprob",
               "invalid_type");
    expect_bad(BATON_API_GENERATE, "{\"text\":[\"a\"],\"return_logprob\":[true,2]}",
               "return_logprob", "invalid_type");
    expect_ok(BATON_API_GENERATE,
              "{\"text\":\"a\",\"sampling_params\":{\"max_new_tokens\":8,\"stop\":\"x\"}}", 0, 0,
              0);
}

static void test_stream_and_logprobs_flags(void **state)
{
    (void)state;
    expect_ok(BATON_API_CHAT,
              "{\"messages\":[{\"role\":\"user\"}],\"stream\":true,\"logprobs\":true}", 0, 1, 1);
    expect_ok(BATON_API_CHAT, "{\"messages\":[{\"role\":\"user\"}],\"logprobs\":false}", 0, 0, 0);
    expect_ok(BATON_API_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":2}", 0, 0, 1);
    expect_ok(BATON_API_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":null}", 0, 0, 0);
    expect_ok(BATON_API_GENERATE, "{\"text\":\"a\",\"return_logprob\":true,\"stream\":true}", 0, 1,
              1);
    expect_ok(BATON_API_GENERATE, "{\"text\":\"a\",\"return_logprob\":false}", 0, 0, 0);
    expect_ok(BATON_API_GENERATE, "{\"text\":[\"a\",\"b\"],\"return_logprob\":[false,true]}", 2, 0,
              1);
}

static void test_batch_sizes(void **state)
{
    (void)state;
    expect_ok(BATON_API_CHAT, "{\"messages\":[{\"role\":\"user\"}],\"n\":1}", 0, 0, 0);
    expect_ok(BATON_API_CHAT, "{\"messages\":[{\"role\":\"user\"}],\"n\":3}", 3, 0, 0);
    expect_ok(BATON_API_COMPLETIONS, "{\"prompt\":\"a\",\"n\":2}", 2, 0, 0);
    /* one room per sequence: prompts x n */
    expect_ok(BATON_API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\",\"c\"],\"n\":2}", 6, 0, 0);
    expect_ok(BATON_API_COMPLETIONS, "{\"prompt\":[[1],[2]],\"n\":1}", 2, 0, 0);
    expect_ok(BATON_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"n\":4}}", 4, 0, 0);
    expect_ok(BATON_API_GENERATE, "{\"text\":[\"a\",\"b\"],\"sampling_params\":{\"n\":4}}", 8, 0,
              0);
    /* per-element sampling_params */
    expect_ok(BATON_API_GENERATE,
              "{\"text\":[\"a\",\"b\"],\"sampling_params\":[{\"max_new_tokens\":1},{}]}", 2, 0, 0);
    expect_bad(BATON_API_GENERATE, "{\"text\":[\"a\"],\"sampling_params\":[{\"top_p\":\"x\"}]}",
               "sampling_params.top_p", "invalid_type");
    expect_bad(BATON_API_GENERATE, "{\"text\":[\"a\"],\"sampling_params\":[3]}", "sampling_params",
               "invalid_type");
    expect_bad(BATON_API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\"],\"n\":3000}", NULL,
               "invalid_value");
    /* too big a batch */
    char body[64];
    snprintf(body, sizeof(body), "{\"messages\":[{\"role\":\"u\"}],\"n\":%d",
             BATON_PDREQ_MAX_BATCH + 1);
    strcat(body, "}");
    expect_bad(BATON_API_CHAT, body, NULL, "invalid_value");
}

/* ---- injection ---- */

static json_t *load_out(const baton_pdreq_t *r)
{
    json_error_t je;
    assert_non_null(r->out.data);
    /* compact: no newline, no ": " */
    assert_null(memchr(r->out.data, '\n', r->out.len));
    json_t *j = json_loadb(r->out.data, r->out.len, 0, &je);
    if (!j)
        fail_msg("serialized body is not JSON: %s", je.text);
    return j;
}

static void test_inject_single(void **state)
{
    (void)state;
    baton_pdreq_t r;
    baton_pdreq_error_t err;
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
        "\"bootstrap_room\":\"client-value\",\"temperature\":0.25,\"extra\":{\"k\":[1,"
        "2]}}";
    assert_int_equal(parse(&r, BATON_API_CHAT, body, &err), 0);
    uint64_t room = 0x7123456789abcdefULL;
    assert_int_equal(baton_pdreq_inject(&r, "10.0.0.7", 8998, &room), 0);
    json_t *j = load_out(&r);
    assert_string_equal(json_string_value(json_object_get(j, "bootstrap_host")), "10.0.0.7");
    assert_int_equal(json_integer_value(json_object_get(j, "bootstrap_port")), 8998);
    assert_true((uint64_t)json_integer_value(json_object_get(j, "bootstrap_room")) == room);
    /* everything else kept as sent */
    assert_string_equal(json_string_value(json_object_get(j, "model")), "m");
    assert_true(json_real_value(json_object_get(j, "temperature")) == 0.25);
    assert_int_equal(
        json_integer_value(json_array_get(json_object_get(json_object_get(j, "extra"), "k"), 1)),
        2);
    assert_int_equal(json_object_size(j), 7);
    json_decref(j);

    /* a retry: new pair, null port, new room — replaces the old values */
    uint64_t room2 = 5;
    assert_int_equal(baton_pdreq_inject(&r, "h2", -1, &room2), 0);
    j = load_out(&r);
    assert_string_equal(json_string_value(json_object_get(j, "bootstrap_host")), "h2");
    assert_true(json_is_null(json_object_get(j, "bootstrap_port")));
    assert_int_equal(json_integer_value(json_object_get(j, "bootstrap_room")), 5);
    assert_int_equal(json_object_size(j), 7);
    json_decref(j);
    baton_pdreq_free(&r);
}

static void check_batch_inject(baton_api_t api, const char *body, size_t n)
{
    baton_pdreq_t r;
    baton_pdreq_error_t err;
    assert_int_equal(parse(&r, api, body, &err), 0);
    assert_int_equal(r.batch, n);
    assert_int_equal(baton_pdreq_n_rooms(&r), n);
    uint64_t *rooms = calloc(n, sizeof(*rooms));
    assert_non_null(rooms);
    for (size_t i = 0; i < n; i++)
        rooms[i] = baton_bootstrap_room();
    assert_int_equal(baton_pdreq_inject(&r, "prefill.local", -1, rooms), 0);
    json_t *j = load_out(&r);
    json_t *h = json_object_get(j, "bootstrap_host"), *p = json_object_get(j, "bootstrap_port"),
           *rm = json_object_get(j, "bootstrap_room");
    assert_true(json_is_array(h) && json_is_array(p) && json_is_array(rm));
    assert_int_equal(json_array_size(h), n);
    assert_int_equal(json_array_size(p), n);
    assert_int_equal(json_array_size(rm), n);
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(json_string_value(json_array_get(h, i)), "prefill.local");
        assert_true(json_is_null(json_array_get(p, i)));
        json_int_t v = json_integer_value(json_array_get(rm, i));
        assert_true(v >= 0);
        assert_true((uint64_t)v == rooms[i]);
        for (size_t k = 0; k < i; k++)
            assert_true(json_integer_value(json_array_get(rm, k)) != v);
    }
    json_decref(j);
    free(rooms);
    baton_pdreq_free(&r);
}

static void test_inject_batches(void **state)
{
    (void)state;
    check_batch_inject(BATON_API_CHAT, "{\"messages\":[{\"role\":\"user\"}],\"n\":3}", 3);
    check_batch_inject(BATON_API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\"]}", 2);
    check_batch_inject(BATON_API_COMPLETIONS, "{\"prompt\":[[1,2],[3],[4],[5]]}", 4);
    check_batch_inject(BATON_API_GENERATE, "{\"text\":[\"x\",\"y\",\"z\"]}", 3);
    check_batch_inject(BATON_API_GENERATE, "{\"input_ids\":[[1],[2]]}", 2);
}

/* The injection is a splice: the client's bytes as sent (spacing, number spelling, escapes,
 * key order) minus every client bootstrap member, compared by decoded key, plus the tail. */
static void test_inject_splice(void **state)
{
    (void)state;
    baton_pdreq_t r, moved;
    baton_pdreq_error_t err;
    const char *body = "{ \"prompt\" : \"caf\\u00e9\", \"bootstrap_room\":1, \"temperature\":1.0E0,"
                       "\"bootstrap_\\u0072oom\":[2], \"bootstrap_host\":\"x\",\"top_k\":5 }  ";
    assert_int_equal(parse(&r, BATON_API_COMPLETIONS, body, &err), 0);
    baton_pdreq_move(&moved, &r); /* as the router does; r is left empty */
    assert_null(r.body);
    uint64_t room = 42 | (1ull << 63); /* masked to 63 bits */
    assert_int_equal(baton_pdreq_inject(&moved, "h\"1", 7, &room), 0);
    assert_string_equal(
        moved.out.data,
        "{ \"prompt\" : \"caf\\u00e9\", \"temperature\":1.0E0,\"top_k\":5,"
        "\"bootstrap_host\":\"h\\\"1\",\"bootstrap_port\":7,\"bootstrap_room\":42}");
    /* the segments are the same bytes, without a copy of the client's */
    size_t at = 0;
    for (size_t i = 0; i < moved.segs.n; i++) {
        assert_memory_equal(moved.out.data + at, moved.segs.iov[i].iov_base,
                            moved.segs.iov[i].iov_len);
        at += moved.segs.iov[i].iov_len;
    }
    assert_int_equal(at, moved.out.len);
    assert_int_equal(at, moved.segs.total);
    assert_true((const char *)moved.segs.iov[0].iov_base == body); /* borrowed */
    baton_pdreq_free(&moved);

    /* no client bootstrap member: two segments, the body to its last value and the tail */
    body = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":2}";
    assert_int_equal(parse(&r, BATON_API_CHAT, body, &err), 0);
    uint64_t rooms[2] = {1, 2};
    assert_int_equal(baton_pdreq_inject_segs(&r, "10.0.0.1", -1, rooms), 0);
    assert_int_equal(r.segs.n, 2);
    assert_int_equal(r.segs.iov[0].iov_len, strlen(body) - 1);
    assert_int_equal(baton_json_splice_flatten(&r.segs, &r.out), 0);
    assert_string_equal(
        r.out.data, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":2,"
                    "\"bootstrap_host\":[\"10.0.0.1\",\"10.0.0.1\"],\"bootstrap_port\":[null,null],"
                    "\"bootstrap_room\":[1,2]}");
    baton_pdreq_free(&r);
}

/* Keys are compared decoded and the last duplicate wins, as in jansson's tree. */
static void test_escaped_and_duplicate_keys(void **state)
{
    (void)state;
    expect_ok(BATON_API_CHAT, "{\"messages\":[{\"role\":\"user\"}],\"\\u0073tream\":true}", 0, 1,
              0);
    expect_ok(BATON_API_CHAT,
              "{\"messages\":[{\"role\":\"user\"}],\"stream\":\"x\",\"stream\":false}", 0, 0, 0);
    expect_bad(BATON_API_CHAT, "{\"messages\":[{\"role\":\"user\"}],\"stream\":true,\"stream\":1}",
               "stream", "invalid_type");
    expect_ok(BATON_API_CHAT, "{\"messages\":[{\"role\":1,\"role\":\"user\"}]}", 0, 0, 0);
    expect_bad(BATON_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"r\\u006fle\":1}]}", "messages",
               "invalid_type");
    expect_bad(BATON_API_CHAT, "{\"messages\":[],\"messages\":null}", "messages",
               "missing_parameter");
    /* invalid JSON keeps jansson's wording, line and column */
    baton_pdreq_t r;
    baton_pdreq_error_t err;
    assert_int_equal(parse(&r, BATON_API_CHAT, "{\"a\":\n 01}", &err), BATON_EINVAL);
    assert_string_equal(err.code, "invalid_json");
    assert_non_null(strstr(err.message, "invalid JSON at line 2 column"));
    assert_int_equal(parse(&r, BATON_API_CHAT, "{\"a\":\"\\ud800\"}", &err), BATON_EINVAL);
    assert_string_equal(err.code, "invalid_json");
}

static void test_rooms_in_range(void **state)
{
    (void)state;
    uint64_t or_bits = 0;
    for (int i = 0; i < 10000; i++) {
        uint64_t r = baton_bootstrap_room();
        assert_true(r <= (uint64_t)INT64_MAX);
        or_bits |= r;
    }
    /* 63 random bits: after 10k draws every bit below the top one has been seen */
    assert_true(or_bits == (uint64_t)INT64_MAX);
}

/* ---- logprob merging ---- */

static void test_merge_body_single(void **state)
{
    (void)state;
    const char *p = "{\"text\":\"\",\"meta_info\":{\"input_token_logprobs\":[[-1,1,null],[-0.5,2,"
                    "null]]}}";
    const char *d =
        "{\"text\":\"out\",\"meta_info\":{\"id\":\"x\",\"input_token_logprobs\":[[-0.25,"
        "3,null]],\"output_token_logprobs\":[]}}";
    baton_pdreq_lp_t *lp = baton_pdreq_lp_extract(p, strlen(p));
    assert_non_null(lp);
    baton_buf_t out = BATON_BUF_INIT;
    assert_int_equal(baton_pdreq_merge_body(lp, d, strlen(d), &out), 1);
    json_t *j = json_loadb(out.data, out.len, 0, NULL);
    assert_non_null(j);
    json_t *a = json_object_get(json_object_get(j, "meta_info"), "input_token_logprobs");
    assert_int_equal(json_array_size(a), 3);
    assert_int_equal(json_integer_value(json_array_get(json_array_get(a, 0), 1)), 1);
    assert_int_equal(json_integer_value(json_array_get(json_array_get(a, 1), 1)), 2);
    assert_int_equal(json_integer_value(json_array_get(json_array_get(a, 2), 1)), 3);
    assert_string_equal(json_string_value(json_object_get(j, "text")), "out");
    json_decref(j);

    /* decode without the array: nothing merged, body left alone */
    const char *d2 = "{\"text\":\"out\",\"meta_info\":{}}";
    baton_buf_reset(&out);
    assert_int_equal(baton_pdreq_merge_body(lp, d2, strlen(d2), &out), 0);
    /* not JSON at all */
    assert_int_equal(baton_pdreq_merge_body(lp, "oops", 4, &out), 0);
    baton_buf_free(&out);
    baton_pdreq_lp_free(lp);

    /* prefill without logprobs */
    assert_null(baton_pdreq_lp_extract("{\"text\":\"\"}", 11));
    assert_null(baton_pdreq_lp_extract("", 0));
    assert_null(baton_pdreq_lp_extract("{\"meta_info\":{\"input_token_logprobs\":7}}", 41));
}

static void test_merge_body_batch(void **state)
{
    (void)state;
    const char *p = "[{\"meta_info\":{\"input_token_logprobs\":[[-1,10,null]]}},"
                    "{\"meta_info\":{\"input_token_logprobs\":[[-1,20,null]]}}]";
    const char *d = "[{\"meta_info\":{\"input_token_logprobs\":[[-1,11,null]]}},"
                    "{\"meta_info\":{\"input_token_logprobs\":[[-1,21,null]]}}]";
    baton_pdreq_lp_t *lp = baton_pdreq_lp_extract(p, strlen(p));
    assert_non_null(lp);
    baton_buf_t out = BATON_BUF_INIT;
    assert_int_equal(baton_pdreq_merge_body(lp, d, strlen(d), &out), 1);
    json_t *j = json_loadb(out.data, out.len, 0, NULL);
    assert_true(json_is_array(j));
    for (size_t i = 0; i < 2; i++) {
        json_t *a = json_object_get(json_object_get(json_array_get(j, i), "meta_info"),
                                    "input_token_logprobs");
        assert_int_equal(json_array_size(a), 2);
        assert_int_equal(json_integer_value(json_array_get(json_array_get(a, 0), 1)), 10 * (i + 1));
        assert_int_equal(json_integer_value(json_array_get(json_array_get(a, 1), 1)),
                         10 * (i + 1) + 1);
    }
    json_decref(j);
    baton_buf_free(&out);
    baton_pdreq_lp_free(lp);
}

static void test_merge_stream(void **state)
{
    (void)state;
    /* prefill answered with an SSE stream */
    const char *p = "data: {\"text\":\"\",\"meta_info\":{\"input_token_logprobs\":[[-1,1,null]]}}"
                    "\n\ndata: {\"index\":1,\"meta_info\":{\"input_token_logprobs\":[[-2,2,null]]}}"
                    "\n\ndata: [DONE]\n\n";
    baton_pdreq_lp_t *lp = baton_pdreq_lp_extract(p, strlen(p));
    assert_non_null(lp);
    baton_buf_t out = BATON_BUF_INIT;
    const char *e0 = "{\"text\":\"a\",\"meta_info\":{\"input_token_logprobs\":[[-3,3,null]]}}";
    assert_int_equal(baton_pdreq_merge_event(lp, e0, strlen(e0), &out), 1);
    json_t *j = json_loadb(out.data, out.len, 0, NULL);
    json_t *a = json_object_get(json_object_get(j, "meta_info"), "input_token_logprobs");
    assert_int_equal(json_array_size(a), 2);
    assert_int_equal(json_integer_value(json_array_get(json_array_get(a, 0), 1)), 1);
    json_decref(j);
    /* the same index again: left alone */
    baton_buf_reset(&out);
    assert_int_equal(baton_pdreq_merge_event(lp, e0, strlen(e0), &out), 0);
    /* index 1 gets prefill's index-1 logprobs */
    const char *e1 = "{\"index\":1,\"meta_info\":{\"input_token_logprobs\":[]}}";
    assert_int_equal(baton_pdreq_merge_event(lp, e1, strlen(e1), &out), 1);
    j = json_loadb(out.data, out.len, 0, NULL);
    a = json_object_get(json_object_get(j, "meta_info"), "input_token_logprobs");
    assert_int_equal(json_array_size(a), 1);
    assert_int_equal(json_integer_value(json_array_get(json_array_get(a, 0), 1)), 2);
    json_decref(j);
    /* events without logprobs and non-JSON events pass */
    assert_int_equal(baton_pdreq_merge_event(lp, "{\"text\":\"b\"}", 12, &out), 0);
    assert_int_equal(baton_pdreq_merge_event(lp, "[DONE]", 6, &out), 0);
    baton_buf_free(&out);
    baton_pdreq_lp_free(lp);
}

/* A batch of any size: every index gets prefill's logprobs in its first event that carries
 * input_token_logprobs, and only there (the same rule below and above 64). */
static void test_merge_stream_big_batch(void **state)
{
    (void)state;
    enum { N = 200 };
    baton_buf_t p = BATON_BUF_INIT;
    for (int i = 0; i < N; i++)
        assert_int_equal(baton_buf_printf(&p,
                                          "data: {\"index\":%d,\"meta_info\":{"
                                          "\"input_token_logprobs\":[[-1,%d,null]]}}\n\n",
                                          i, i),
                         0);
    baton_pdreq_lp_t *lp = baton_pdreq_lp_extract(p.data, p.len);
    assert_non_null(lp);
    baton_buf_t out = BATON_BUF_INIT;
    char ev[160];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            int n = snprintf(ev, sizeof(ev),
                             "{\"index\":%d,\"meta_info\":{\"input_token_logprobs\":[]}}", i);
            baton_buf_reset(&out);
            int rc = baton_pdreq_merge_event(lp, ev, (size_t)n, &out);
            if (rc != (round == 0))
                fail_msg("index %d round %d: merge returned %d", i, round, rc);
        }
    }
    baton_buf_free(&out);
    baton_buf_free(&p);
    baton_pdreq_lp_free(lp);
}

/* ---- SSE framing ---- */

struct collect {
    char events[16][128];
    size_t n;
};

static int collect_cb(const char *p, size_t len, void *arg)
{
    struct collect *c = arg;
    assert_true(c->n < 16 && len < 128);
    memcpy(c->events[c->n], p, len);
    c->events[c->n][len] = '\0';
    c->n++;
    return 0;
}

static void test_sse_each(void **state)
{
    (void)state;
    struct collect c = {0};
    const char *body = "data: one\n\n: comment\n\ndata:two\r\n\r\ndata: a\ndata: b\n\nevent: x\n"
                       "data: last\n\ndata: incomplete";
    assert_int_equal(baton_sse_each(body, strlen(body), collect_cb, &c), 0);
    assert_int_equal(c.n, 4);
    assert_string_equal(c.events[0], "one");
    assert_string_equal(c.events[1], "two");
    assert_string_equal(c.events[2], "a\nb");
    assert_string_equal(c.events[3], "last");
}

static int raw_cb(const char *p, size_t len, void *arg)
{
    baton_buf_t *b = arg;
    assert_int_equal(baton_buf_append(b, "|", 1), 0);
    assert_int_equal(baton_buf_append(b, p, len), 0);
    return 0;
}

static void test_sse_splitter_any_chunking(void **state)
{
    (void)state;
    const char *stream =
        "data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\ndata: x\ndata: y\n\ndata: [DONE]\n\n";
    size_t len = strlen(stream);
    const char *want = "|data: {\"a\":1}\n\n|data: {\"b\":2}\r\n\r\n|data: x\ndata: y\n\n|data: "
                       "[DONE]\n\n";
    /* every chunk size from 1 byte to the whole stream gives the same events */
    for (size_t step = 1; step <= len; step++) {
        baton_sse_splitter_t s = BATON_SSE_SPLITTER_INIT;
        baton_buf_t got = BATON_BUF_INIT;
        for (size_t off = 0; off < len; off += step) {
            size_t n = len - off < step ? len - off : step;
            assert_int_equal(baton_sse_feed(&s, stream + off, n, raw_cb, &got), 0);
        }
        assert_int_equal(baton_sse_pending(&s), 0);
        assert_non_null(got.data);
        if (strcmp(got.data, want) != 0)
            fail_msg("step %zu: got %s", step, got.data);
        baton_buf_free(&got);
        baton_sse_splitter_free(&s);
    }
    /* an incomplete tail is held back */
    baton_sse_splitter_t s = BATON_SSE_SPLITTER_INIT;
    baton_buf_t got = BATON_BUF_INIT;
    assert_int_equal(baton_sse_feed(&s, "data: 1\n\ndata: 2\n", 17, raw_cb, &got), 0);
    assert_int_equal(baton_sse_pending(&s), 8);
    assert_string_equal(got.data, "|data: 1\n\n");
    baton_buf_free(&got);
    baton_sse_splitter_free(&s);
}

static void test_sse_single_data(void **state)
{
    (void)state;
    const char *p;
    size_t n;
    assert_int_equal(baton_sse_single_data("data: {\"x\":1}\n\n", 15, &p, &n), 1);
    assert_int_equal(n, 7);
    assert_memory_equal(p, "{\"x\":1}", 7);
    assert_int_equal(baton_sse_single_data("data: a\ndata: b\n\n", 17, &p, &n), 0);
    assert_int_equal(baton_sse_single_data(": ping\n\n", 8, &p, &n), 0);
}

static void test_sse_error_event(void **state)
{
    (void)state;
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton_sse_error_event(&b, "decode worker http://h:1 failed: \"closed\"\n",
                                           "upstream_error", "decode_failed"),
                     0);
    struct collect c = {0};
    assert_int_equal(baton_sse_each(b.data, b.len, collect_cb, &c), 0);
    assert_int_equal(c.n, 2);
    assert_string_equal(c.events[1], "[DONE]");
    json_t *j = json_loads(c.events[0], 0, NULL);
    assert_non_null(j);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "message")),
                        "decode worker http://h:1 failed: \"closed\"\n");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "upstream_error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "decode_failed");
    json_decref(j);
    baton_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_body_must_be_object),
        cmocka_unit_test(test_chat_messages),
        cmocka_unit_test(test_completions_prompt),
        cmocka_unit_test(test_generate_inputs),
        cmocka_unit_test(test_field_types),
        cmocka_unit_test(test_stream_and_logprobs_flags),
        cmocka_unit_test(test_batch_sizes),
        cmocka_unit_test(test_inject_single),
        cmocka_unit_test(test_inject_batches),
        cmocka_unit_test(test_inject_splice),
        cmocka_unit_test(test_escaped_and_duplicate_keys),
        cmocka_unit_test(test_rooms_in_range),
        cmocka_unit_test(test_merge_body_single),
        cmocka_unit_test(test_merge_body_batch),
        cmocka_unit_test(test_merge_stream),
        cmocka_unit_test(test_merge_stream_big_batch),
        cmocka_unit_test(test_sse_each),
        cmocka_unit_test(test_sse_splitter_any_chunking),
        cmocka_unit_test(test_sse_single_data),
        cmocka_unit_test(test_sse_error_event),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
