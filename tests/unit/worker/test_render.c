/* test_render.c — response bodies: JSON shapes, SSE framing, stream pieces adding up. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "baton/error.h"
#include "worker/render.h"
#include "worker/request.h"

typedef struct fixture_s {
    wk_request_t req;
    wk_gen_t gens[8];
    const wk_gen_t *gp[8];
    wk_stream_state_t st[8];
    wk_render_ctx_t ctx;
} fixture_t;

static fixture_t fx;

static void load(wk_api_t api, const char *body)
{
    memset(&fx, 0, sizeof(fx));
    wk_parse_err_t err;
    int rc = wk_request_parse(&fx.req, api, body, strlen(body), &err);
    if (rc != 0)
        fail_msg("parse: %s", err.message);
    assert_true(fx.req.n_items <= 8);
    for (size_t i = 0; i < fx.req.n_items; i++) {
        wk_stop_t stop;
        wk_item_stop(&fx.req.items[i], &stop);
        wk_gen_init(&fx.gens[i], fx.req.items[i].seed, fx.req.items[i].max_tokens, &stop);
        fx.gp[i] = &fx.gens[i];
    }
    fx.ctx.id = "id-1";
    fx.ctx.model = "sim";
    fx.ctx.created = 1700000000;
    fx.ctx.input_logprobs = 1;
}

static void unload(void)
{
    for (size_t i = 0; i < fx.req.n_items; i++)
        wk_gen_free(&fx.gens[i]);
    wk_request_free(&fx.req);
}

/* Splits "data: X\n\n" events; every event must be framed exactly like that. */
static size_t sse_split(const char *s, size_t len, char out[][2048], size_t max)
{
    size_t n = 0, pos = 0;
    while (pos < len) {
        assert_true(len - pos > 6);
        assert_memory_equal(s + pos, "data: ", 6);
        const char *end = strstr(s + pos, "\n\n");
        assert_non_null(end);
        size_t plen = (size_t)(end - (s + pos + 6));
        assert_true(n < max && plen < 2048);
        memcpy(out[n], s + pos + 6, plen);
        out[n][plen] = '\0';
        assert_null(memchr(out[n], '\n', plen)); /* one line per event */
        n++;
        pos = (size_t)(end - s) + 2;
    }
    return n;
}

static void test_chat_full(void **state)
{
    load(WK_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4,"
                      "\"n\":2,\"logprobs\":true,\"top_logprobs\":2}");
    for (size_t i = 0; i < 2; i++)
        while (fx.gens[i].finish == WK_FINISH_NONE)
            assert_int_equal(wk_gen_push(&fx.gens[i], wk_gen_next_id(&fx.gens[i])), 0);
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(wk_render_full(&fx.ctx, &fx.req, fx.gp, &b), 0);
    json_error_t je;
    json_t *j = json_loads(b.data, 0, &je);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    assert_string_equal(json_string_value(json_object_get(j, "model")), "sim");
    json_t *choices = json_object_get(j, "choices");
    assert_int_equal(json_array_size(choices), 2);
    json_t *c1 = json_array_get(choices, 1);
    assert_int_equal(json_integer_value(json_object_get(c1, "index")), 1);
    const char *content =
        json_string_value(json_object_get(json_object_get(c1, "message"), "content"));
    assert_int_equal(strlen(content), fx.gens[1].final_len);
    assert_memory_equal(content, fx.gens[1].text.data, fx.gens[1].final_len);
    assert_string_equal(json_string_value(json_object_get(c1, "finish_reason")), "length");
    assert_true(json_is_null(json_object_get(c1, "matched_stop")));
    json_t *lp = json_object_get(json_object_get(c1, "logprobs"), "content");
    assert_int_equal(json_array_size(lp), 4);
    json_t *e0 = json_array_get(lp, 0);
    assert_true(json_real_value(json_object_get(e0, "logprob")) ==
                wk_sim_output_logprob(fx.gens[1].seed, 0));
    assert_int_equal(json_array_size(json_object_get(e0, "top_logprobs")), 2);
    json_t *u = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), 2); /* once */
    assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 8);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 10);
    json_decref(j);
    baton_buf_free(&b);
    unload();
}

static void test_chat_stream_pieces(void **state)
{
    /* a stop string that spans tokens ("route ten to was ..." for this prompt's seed) */
    load(WK_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"stream\"}],"
                      "\"max_tokens\":12,\"stream\":true,\"stream_options\":{\"include_usage\":"
                      "true}}");
    wk_gen_t probe;
    wk_gen_init(&probe, fx.req.items[0].seed, 12, NULL);
    while (probe.finish == WK_FINISH_NONE)
        assert_int_equal(wk_gen_push(&probe, wk_gen_next_id(&probe)), 0);
    /* stop = the end of token 3 + the start of token 4 */
    size_t cut = probe.tok_end[3];
    char stop[16];
    snprintf(stop, sizeof(stop), "%.*s", 4, probe.text.data + cut - 2);
    char body[256];
    snprintf(body, sizeof(body),
             "{\"messages\":[{\"role\":\"user\",\"content\":\"stream\"}],\"max_tokens\":12,"
             "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"stop\":\"%s\"}",
             stop);
    unload();
    load(WK_API_CHAT, body);
    baton_buf_t b = BATON_BUF_INIT;
    wk_gen_t *g = &fx.gens[0];
    while (g->finish == WK_FINISH_NONE) {
        assert_int_equal(wk_gen_push(g, wk_gen_next_id(g)), 0);
        assert_int_equal(wk_render_stream_progress(&fx.ctx, &fx.req, 0, g, &fx.st[0], &b), 0);
    }
    assert_int_equal(g->finish, WK_FINISH_STOP);
    /* a finished sequence renders nothing more */
    size_t before = b.len;
    assert_int_equal(wk_render_stream_progress(&fx.ctx, &fx.req, 0, g, &fx.st[0], &b), 0);
    assert_int_equal(b.len, before);
    assert_int_equal(wk_render_stream_tail(&fx.ctx, &fx.req, fx.gp, &b), 0);

    static char ev[64][2048];
    size_t n = sse_split(b.data, b.len, ev, 64);
    assert_string_equal(ev[n - 1], "[DONE]");
    char text[512] = "";
    int finishes = 0;
    for (size_t i = 0; i < n - 1; i++) {
        json_t *j = json_loads(ev[i], 0, NULL);
        assert_non_null(j);
        assert_string_equal(json_string_value(json_object_get(j, "object")),
                            "chat.completion.chunk");
        json_t *choices = json_object_get(j, "choices");
        if (i == n - 2) { /* usage chunk */
            assert_int_equal(json_array_size(choices), 0);
            assert_int_equal(json_integer_value(
                                 json_object_get(json_object_get(j, "usage"), "completion_tokens")),
                             g->n_tokens);
        } else {
            json_t *ch = json_array_get(choices, 0);
            json_t *delta = json_object_get(ch, "delta");
            if (i == 0)
                assert_string_equal(json_string_value(json_object_get(delta, "role")), "assistant");
            const char *piece = json_string_value(json_object_get(delta, "content"));
            if (piece)
                strncat(text, piece, sizeof(text) - strlen(text) - 1);
            /* never more than the final text */
            assert_true(strlen(text) <= g->final_len);
            assert_memory_equal(text, g->text.data, strlen(text));
            finishes += !json_is_null(json_object_get(ch, "finish_reason"));
        }
        json_decref(j);
    }
    assert_int_equal(finishes, 1);
    assert_int_equal(strlen(text), g->final_len);
    baton_buf_free(&b);
    wk_gen_free(&probe);
    unload();
}

static void test_generate_shapes(void **state)
{
    load(WK_API_GENERATE, "{\"text\":[\"a b\",\"c\"],\"sampling_params\":{\"max_new_tokens\":2},"
                          "\"return_logprob\":true,\"stream\":true}");
    baton_buf_t b = BATON_BUF_INIT;
    for (size_t i = 0; i < 2; i++)
        while (fx.gens[i].finish == WK_FINISH_NONE) {
            assert_int_equal(wk_gen_push(&fx.gens[i], wk_gen_next_id(&fx.gens[i])), 0);
            assert_int_equal(
                wk_render_stream_progress(&fx.ctx, &fx.req, i, &fx.gens[i], &fx.st[i], &b), 0);
        }
    assert_int_equal(wk_render_stream_tail(&fx.ctx, &fx.req, fx.gp, &b), 0);
    static char ev[16][2048];
    size_t n = sse_split(b.data, b.len, ev, 16);
    assert_int_equal(n, 5); /* 2 tokens × 2 items, [DONE]; no usage chunk for /generate */
    json_t *j = json_loads(ev[3], 0, NULL);
    assert_int_equal(json_integer_value(json_object_get(j, "index")), 1);
    json_t *meta = json_object_get(j, "meta_info");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(meta, "finish_reason"), "type")),
        "length");
    json_t *in = json_object_get(meta, "input_token_logprobs");
    assert_int_equal(json_array_size(in), 1);
    assert_true(json_is_null(json_array_get(json_array_get(in, 0), 0)));
    json_decref(j);
    baton_buf_reset(&b);

    /* non-stream batch: a JSON array; decode-side (no input logprobs) gives [] */
    fx.ctx.input_logprobs = 0;
    assert_int_equal(wk_render_full(&fx.ctx, &fx.req, fx.gp, &b), 0);
    j = json_loads(b.data, 0, NULL);
    assert_true(json_is_array(j) && json_array_size(j) == 2);
    meta = json_object_get(json_array_get(j, 0), "meta_info");
    assert_int_equal(json_array_size(json_object_get(meta, "input_token_logprobs")), 0);
    assert_int_equal(json_array_size(json_object_get(meta, "output_token_logprobs")), 2);
    json_decref(j);
    baton_buf_free(&b);
    unload();
}

static void test_error_event(void **state)
{
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(wk_render_stream_error("boom \"x\"", "server_error", NULL, &b), 0);
    assert_string_equal(b.data, "data: {\"error\":{\"message\":\"boom \\\"x\\\"\",\"type\":"
                                "\"server_error\",\"code\":null}}\n\ndata: [DONE]\n\n");
    baton_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_full),
        cmocka_unit_test(test_chat_stream_pieces),
        cmocka_unit_test(test_generate_shapes),
        cmocka_unit_test(test_error_event),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
