/* test_request.c — request parsing and validation for /generate, chat and completions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "baton/error.h"
#include "worker/request.h"

static int parse(wk_request_t *r, wk_api_t api, const char *body, wk_parse_err_t *err)
{
    memset(err, 0, sizeof(*err));
    return wk_request_parse(r, api, body, strlen(body), err);
}

/* Expects a 400 naming `param` ("" for none). */
static void expect_400(wk_api_t api, const char *body, const char *param)
{
    wk_request_t r;
    wk_parse_err_t err;
    int rc = parse(&r, api, body, &err);
    if (rc != BATON_EINVAL)
        fail_msg("accepted: %s", body);
    assert_int_equal(err.status, 400);
    assert_true(strlen(err.message) > 0);
    if (strcmp(err.param, param) != 0)
        fail_msg("body %s: param '%s', expected '%s' (%s)", body, err.param, param, err.message);
    assert_null(r.items); /* nothing to free after a failure */
}

static void test_chat_basic(void **state)
{
    wk_request_t r;
    wk_parse_err_t err;
    const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be "
                       "brief.\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                       "\"hi \"},{\"type\":\"text\",\"text\":\"there\"}]},{\"role\":\"assistant\","
                       "\"content\":null}],\"max_tokens\":7,\"stop\":\"x\",\"stream\":true,"
                       "\"stream_options\":{\"include_usage\":true},\"n\":3,\"temperature\":0.5,"
                       "\"logprobs\":true,\"top_logprobs\":2}";
    assert_int_equal(parse(&r, WK_API_CHAT, body, &err), 0);
    assert_int_equal(r.n_items, 3);
    assert_int_equal(r.n_prompts, 1);
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_string_equal(r.model, "m");
    assert_false(r.has_boot);
    const char *want = "system: Be brief.\nuser: hi there\nassistant: \n";
    for (size_t i = 0; i < 3; i++) {
        const wk_item_t *it = &r.items[i];
        assert_int_equal(it->prompt_len, strlen(want));
        assert_memory_equal(it->prompt, want, strlen(want));
        assert_true(it->seed == wk_sim_seed_text(want, strlen(want)));
        assert_int_equal(it->prompt_tokens, 7); /* system: Be brief. user: hi there assistant: */
        assert_int_equal(it->max_tokens, 7);
        assert_int_equal(it->n_stop, 1);
        assert_string_equal(it->stop_strs[0], "x");
        assert_int_equal(it->choice_index, i);
        assert_int_equal(it->prompt_index, 0);
        assert_true(it->logprobs);
        assert_int_equal(it->top_logprobs, 2);
    }
    wk_request_free(&r);

    /* defaults; max_completion_tokens wins over max_tokens */
    assert_int_equal(parse(&r, WK_API_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                           "\"max_tokens\":5,\"max_completion_tokens\":9}",
                           &err),
                     0);
    assert_int_equal(r.items[0].max_tokens, 9);
    assert_false(r.stream);
    assert_null(r.model);
    wk_request_free(&r);
    assert_int_equal(
        parse(&r, WK_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", &err), 0);
    assert_int_equal(r.items[0].max_tokens, WK_DEFAULT_MAX_TOKENS_CHAT);
    assert_false(r.items[0].logprobs);
    wk_request_free(&r);
}

static void test_chat_invalid(void **state)
{
    expect_400(WK_API_CHAT, "{bad json", "");
    expect_400(WK_API_CHAT, "[1,2]", "");
    expect_400(WK_API_CHAT, "{}", "messages");
    expect_400(WK_API_CHAT, "{\"messages\":[]}", "messages");
    expect_400(WK_API_CHAT, "{\"messages\":\"hi\"}", "messages");
    expect_400(WK_API_CHAT, "{\"messages\":[{\"content\":\"a\"}]}", "messages");
    expect_400(WK_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages");
    expect_400(WK_API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
               "messages");
    const char *m = "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]";
    char body[512];
    struct {
        const char *extra, *param;
    } cases[] = {
        {"\"max_tokens\":\"5\"", "max_tokens"},
        {"\"max_tokens\":-1", "max_tokens"},
        {"\"max_tokens\":1.5", "max_tokens"},
        {"\"max_tokens\":99999999999", "max_tokens"},
        {"\"max_completion_tokens\":true", "max_completion_tokens"},
        {"\"stop\":5", "stop"},
        {"\"stop\":[\"a\",3]", "stop"},
        {"\"stream\":\"yes\"", "stream"},
        {"\"stream_options\":3", "stream_options"},
        {"\"stream_options\":{\"include_usage\":1}", "include_usage"},
        {"\"n\":0", "n"},
        {"\"n\":1000", "n"},
        {"\"temperature\":\"hot\"", "temperature"},
        {"\"logprobs\":1", "logprobs"},
        {"\"top_logprobs\":50", "top_logprobs"},
        {"\"model\":7", "model"},
        {"\"stop_token_ids\":[\"a\"]", "stop_token_ids"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(body, sizeof(body), "{%s,%s}", m, cases[i].extra);
        expect_400(WK_API_CHAT, body, cases[i].param);
    }
}

static void test_completions(void **state)
{
    wk_request_t r;
    wk_parse_err_t err;
    assert_int_equal(parse(&r, WK_API_COMPLETIONS, "{\"prompt\":\"one two\"}", &err), 0);
    assert_int_equal(r.n_items, 1);
    assert_int_equal(r.items[0].max_tokens, WK_DEFAULT_MAX_TOKENS_COMPLETIONS);
    assert_int_equal(r.items[0].prompt_tokens, 2);
    wk_request_free(&r);

    /* a string array is a batch; with n=2 every prompt gets two choices */
    assert_int_equal(parse(&r, WK_API_COMPLETIONS,
                           "{\"prompt\":[\"a\",\"b c\"],\"n\":2,\"max_tokens\":3,"
                           "\"logprobs\":2,\"stop\":[\"x\",\"y\"]}",
                           &err),
                     0);
    assert_int_equal(r.n_items, 4);
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.items[1].prompt_index, 0);
    assert_int_equal(r.items[2].prompt_index, 1);
    assert_int_equal(r.items[3].choice_index, 3);
    assert_int_equal(r.items[3].prompt_tokens, 2);
    assert_int_equal(r.items[0].top_logprobs, 2);
    assert_int_equal(r.items[0].n_stop, 2);
    wk_request_free(&r);

    /* a list of ints is ONE tokenized prompt; a list of lists is a batch */
    assert_int_equal(parse(&r, WK_API_COMPLETIONS, "{\"prompt\":[5,6,7]}", &err), 0);
    assert_int_equal(r.n_items, 1);
    assert_int_equal(r.items[0].prompt_tokens, 3);
    assert_null(r.items[0].prompt);
    assert_true(r.items[0].seed == wk_sim_seed_text("5 6 7", 5));
    wk_request_free(&r);
    assert_int_equal(parse(&r, WK_API_COMPLETIONS, "{\"prompt\":[[5],[6,7]]}", &err), 0);
    assert_int_equal(r.n_items, 2);
    assert_int_equal(r.items[1].n_ids, 2);
    wk_request_free(&r);

    expect_400(WK_API_COMPLETIONS, "{}", "prompt");
    expect_400(WK_API_COMPLETIONS, "{\"prompt\":[]}", "prompt");
    expect_400(WK_API_COMPLETIONS, "{\"prompt\":[\"a\",1]}", "prompt");
    expect_400(WK_API_COMPLETIONS, "{\"prompt\":[[1],[]]}", "prompt");
    expect_400(WK_API_COMPLETIONS, "{\"prompt\":5}", "prompt");
    expect_400(WK_API_COMPLETIONS, "{\"prompt\":\"a\",\"echo\":true}", "echo");
    expect_400(WK_API_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":9}", "logprobs");
    expect_400(WK_API_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":true}", "logprobs");
}

static void test_generate(void **state)
{
    wk_request_t r;
    wk_parse_err_t err;
    assert_int_equal(parse(&r, WK_API_GENERATE,
                           "{\"text\":\"hello world\",\"sampling_params\":{\"max_new_tokens\":4,"
                           "\"stop\":[\"a\"],\"stop_token_ids\":[3,4]},\"return_logprob\":true,"
                           "\"logprob_start_len\":1,\"rid\":\"r1\"}",
                           &err),
                     0);
    assert_false(r.is_batch);
    assert_int_equal(r.n_items, 1);
    const wk_item_t *it = &r.items[0];
    assert_int_equal(it->max_tokens, 4);
    assert_int_equal(it->n_stop_ids, 2);
    assert_int_equal(it->stop_ids[1], 4);
    assert_true(it->logprobs);
    assert_int_equal(it->logprob_start, 1);
    assert_string_equal(it->rid, "r1");
    wk_request_free(&r);

    assert_int_equal(parse(&r, WK_API_GENERATE,
                           "{\"text\":[\"a\",\"b\"],\"sampling_params\":[{\"max_new_tokens\":1},"
                           "{\"max_new_tokens\":2}],\"return_logprob\":[false,true],"
                           "\"rid\":[\"x\",\"y\"]}",
                           &err),
                     0);
    assert_true(r.is_batch);
    assert_int_equal(r.n_items, 2);
    assert_int_equal(r.items[0].max_tokens, 1);
    assert_int_equal(r.items[1].max_tokens, 2);
    assert_false(r.items[0].logprobs);
    assert_true(r.items[1].logprobs);
    assert_string_equal(r.items[1].rid, "y");
    wk_request_free(&r);

    assert_int_equal(parse(&r, WK_API_GENERATE, "{\"input_ids\":[[1,2],[3]]}", &err), 0);
    assert_true(r.is_batch);
    assert_int_equal(r.items[0].max_tokens, WK_DEFAULT_MAX_TOKENS_GENERATE);
    assert_int_equal(r.items[1].prompt_tokens, 1);
    wk_request_free(&r);
    assert_int_equal(parse(&r, WK_API_GENERATE, "{\"input_ids\":[1,2]}", &err), 0);
    assert_false(r.is_batch);
    wk_request_free(&r);

    expect_400(WK_API_GENERATE, "{}", "text");
    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"input_ids\":[1]}", "text");
    expect_400(WK_API_GENERATE, "{\"text\":[]}", "text");
    expect_400(WK_API_GENERATE, "{\"text\":[\"a\",2]}", "text");
    expect_400(WK_API_GENERATE, "{\"input_ids\":[]}", "input_ids");
    expect_400(WK_API_GENERATE, "{\"input_ids\":[-1]}", "input_ids");
    expect_400(WK_API_GENERATE, "{\"input_embeds\":[[0.1]]}", "input_embeds");
    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":5}", "sampling_params");
    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":[{}]}", "sampling_params");
    expect_400(WK_API_GENERATE, "{\"text\":[\"a\"],\"sampling_params\":[{},{}]}",
               "sampling_params");
    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"max_new_tokens\":-2}}",
               "max_new_tokens");
    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"sampling_params\":{\"n\":2}}", "n");
    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"return_logprob\":\"yes\"}", "return_logprob");
    expect_400(WK_API_GENERATE, "{\"text\":[\"a\"],\"return_logprob\":[true,true]}",
               "return_logprob");
    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"logprob_start_len\":-5}", "logprob_start_len");
    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"rid\":5}", "rid");
}

static void test_bootstrap_fields(void **state)
{
    wk_request_t r;
    wk_parse_err_t err;
    assert_int_equal(parse(&r, WK_API_GENERATE,
                           "{\"text\":\"a\",\"bootstrap_host\":\"10.0.0.1\",\"bootstrap_port\":"
                           "8998,\"bootstrap_room\":9223372036854775807}",
                           &err),
                     0);
    assert_true(r.has_boot);
    assert_true(r.items[0].has_boot);
    assert_string_equal(r.items[0].boot_host, "10.0.0.1");
    assert_int_equal(r.items[0].boot_port, 8998);
    assert_true(r.items[0].room == 9223372036854775807ULL);
    wk_request_free(&r);

    /* arrays: element i belongs to sequence i (chat n=2) */
    assert_int_equal(parse(&r, WK_API_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"n\":2,"
                           "\"bootstrap_host\":[\"h1\",\"h2\"],\"bootstrap_port\":[1,null],"
                           "\"bootstrap_room\":[5,6]}",
                           &err),
                     0);
    assert_int_equal(r.items[1].room, 6);
    assert_string_equal(r.items[1].boot_host, "h2");
    assert_int_equal(r.items[0].boot_port, 1);
    assert_int_equal(r.items[1].boot_port, -1);
    wk_request_free(&r);

    /* all null: not PD */
    assert_int_equal(parse(&r, WK_API_GENERATE,
                           "{\"text\":\"a\",\"bootstrap_host\":null,\"bootstrap_port\":null,"
                           "\"bootstrap_room\":null}",
                           &err),
                     0);
    assert_false(r.has_boot);
    wk_request_free(&r);

    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"bootstrap_host\":\"h\"}", "bootstrap_room");
    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"bootstrap_room\":-1}", "bootstrap_room");
    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"bootstrap_room\":\"1\"}", "bootstrap_room");
    expect_400(WK_API_GENERATE, "{\"text\":[\"a\",\"b\"],\"bootstrap_room\":1}", "bootstrap_room");
    expect_400(WK_API_GENERATE, "{\"text\":[\"a\",\"b\"],\"bootstrap_room\":[1]}",
               "bootstrap_room");
    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"bootstrap_room\":1,\"bootstrap_port\":0}",
               "bootstrap_port");
    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"bootstrap_room\":1,\"bootstrap_port\":70000}",
               "bootstrap_port");
    expect_400(WK_API_GENERATE,
               "{\"text\":[\"a\",\"b\"],\"bootstrap_room\":[1,2],\"bootstrap_host\":[\"h\"]}",
               "bootstrap_host");
    expect_400(WK_API_GENERATE, "{\"text\":\"a\",\"bootstrap_room\":1,\"bootstrap_host\":\"\"}",
               "bootstrap_host");
}

static void test_limits(void **state)
{
    /* more sequences than WK_MAX_ITEMS is refused before anything is allocated per item */
    char body[16384];
    size_t n = 0;
    n += (size_t)snprintf(body + n, sizeof(body) - n, "{\"text\":[");
    for (int i = 0; i < WK_MAX_ITEMS + 1; i++)
        n += (size_t)snprintf(body + n, sizeof(body) - n, "%s\"a\"", i ? "," : "");
    snprintf(body + n, sizeof(body) - n, "]}");
    expect_400(WK_API_GENERATE, body, "");
    expect_400(WK_API_COMPLETIONS,
               "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\","
               "\"i\"],\"n\":128}",
               "prompt");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_basic),       cmocka_unit_test(test_chat_invalid),
        cmocka_unit_test(test_completions),      cmocka_unit_test(test_generate),
        cmocka_unit_test(test_bootstrap_fields), cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
