/* test_prompts.c — baton-bench prompts: random prompts, JSON escaping, request bodies, ShareGPT. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "baton/error.h"
#include "prompts.h"

static void test_random_prompt_word_count(void **state)
{
    bb_rng_t r1, r2;
    bb_rng_seed(&r1, 3);
    bb_rng_seed(&r2, 3);
    uint32_t lens[] = {1, 2, 17, 1000, 100000};
    for (size_t i = 0; i < sizeof(lens) / sizeof(*lens); i++) {
        baton_buf_t a = BATON_BUF_INIT, b = BATON_BUF_INIT;
        assert_int_equal(bb_random_prompt(&a, &r1, lens[i]), 0);
        assert_int_equal(bb_random_prompt(&b, &r2, lens[i]), 0);
        assert_int_equal(bb_count_words(a.data, a.len), lens[i]);
        assert_int_equal(a.len, b.len); /* same seed, same prompt */
        assert_memory_equal(a.data, b.data, a.len);
        baton_buf_free(&a);
        baton_buf_free(&b);
    }
}

static void test_json_string_round_trip(void **state)
{
    const char raw[] = "quote \" backslash \\ nl \n tab \t cr \r bell \x07 utf8 \xc3\xa9 end";
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton_buf_append_json_string(&b, raw, sizeof(raw) - 1), 0);
    json_error_t e;
    json_t *v = json_loadb(b.data, b.len, JSON_DECODE_ANY, &e);
    assert_non_null(v);
    assert_true(json_is_string(v));
    assert_int_equal(json_string_length(v), sizeof(raw) - 1);
    assert_memory_equal(json_string_value(v), raw, sizeof(raw) - 1);
    json_decref(v);
    baton_buf_free(&b);
}

static json_t *render(bb_endpoint_t ep, int stream, const char *model, const bb_turn_t *t, size_t n,
                      uint32_t max_tokens)
{
    bb_body_opts_t o = {ep, stream, model, 0, NULL, 0};
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(bb_render_body(&b, &o, t, n, max_tokens), 0);
    json_error_t e;
    json_t *v = json_loadb(b.data, b.len, 0, &e);
    if (!v)
        fail_msg("body is not JSON: %s: %s", e.text, b.data);
    baton_buf_free(&b);
    return v;
}

/* --token-ids: the turns' words as integer ids, the same word the same id, so a follow-up
 * turn's ids extend the earlier turn's (what exact-prefix routing keys on). */
static void test_token_ids(void **state)
{
    (void)state;
    bb_turn_t t[2] = {{"alpha bravo", 11, "alpha  x", 8}, {"bravo", 5, NULL, 0}};
    bb_body_opts_t o = {BB_EP_COMPLETIONS, 0, NULL, 0, NULL, 1};
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(bb_render_body(&b, &o, t, 2, 4), 0);
    json_t *v = json_loadb(b.data, b.len, 0, NULL);
    assert_non_null(v);
    json_t *ids = json_object_get(v, "prompt");
    assert_int_equal(json_array_size(ids), 5);
    json_int_t a = json_integer_value(json_array_get(ids, 0));
    assert_true(a > 0 && a <= 0x7fffffff);
    assert_int_equal(json_integer_value(json_array_get(ids, 2)), a); /* alpha again */
    assert_int_equal(json_integer_value(json_array_get(ids, 4)),
                     json_integer_value(json_array_get(ids, 1))); /* bravo again */
    json_decref(v);
    baton_buf_free(&b);
    o.endpoint = BB_EP_GENERATE;
    assert_int_equal(bb_render_body(&b, &o, t, 1, 4), 0);
    v = json_loadb(b.data, b.len, 0, NULL);
    assert_int_equal(json_array_size(json_object_get(v, "input_ids")), 4);
    assert_null(json_object_get(v, "text"));
    json_decref(v);
    baton_buf_free(&b);
}

/* A session's key goes out as the OpenAI "user" field (consistent_hash keys on it). */
static void test_user_field(void **state)
{
    (void)state;
    bb_turn_t one = {"hi", 2, NULL, 0};
    bb_body_opts_t o = {BB_EP_COMPLETIONS, 0, NULL, 0, "bench-s7", 0};
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(bb_render_body(&b, &o, &one, 1, 4), 0);
    json_t *v = json_loadb(b.data, b.len, 0, NULL);
    assert_non_null(v);
    assert_string_equal(json_string_value(json_object_get(v, "user")), "bench-s7");
    assert_string_equal(json_string_value(json_object_get(v, "prompt")), "hi");
    json_decref(v);
    baton_buf_free(&b);
    v = render(BB_EP_COMPLETIONS, 0, NULL, &one, 1, 4);
    assert_null(json_object_get(v, "user"));
    json_decref(v);
}

static void test_bodies(void **state)
{
    bb_turn_t one = {"hello \"world\"", 13, NULL, 0};
    json_t *v = render(BB_EP_CHAT, 1, "m1", &one, 1, 32);
    assert_string_equal(json_string_value(json_object_get(v, "model")), "m1");
    json_t *msgs = json_object_get(v, "messages");
    assert_int_equal(json_array_size(msgs), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 0), "role")),
                        "user");
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 0), "content")),
                        "hello \"world\"");
    assert_int_equal(json_integer_value(json_object_get(v, "max_tokens")), 32);
    assert_true(json_is_true(json_object_get(v, "stream")));
    assert_true(
        json_is_true(json_object_get(json_object_get(v, "stream_options"), "include_usage")));
    json_decref(v);

    v = render(BB_EP_COMPLETIONS, 0, NULL, &one, 1, 5);
    assert_null(json_object_get(v, "model"));
    assert_string_equal(json_string_value(json_object_get(v, "prompt")), "hello \"world\"");
    assert_true(json_is_false(json_object_get(v, "stream")));
    assert_null(json_object_get(v, "stream_options"));
    json_decref(v);

    v = render(BB_EP_GENERATE, 1, NULL, &one, 1, 9);
    assert_string_equal(json_string_value(json_object_get(v, "text")), "hello \"world\"");
    assert_int_equal(json_integer_value(
                         json_object_get(json_object_get(v, "sampling_params"), "max_new_tokens")),
                     9);
    assert_true(json_is_true(json_object_get(v, "stream")));
    json_decref(v);
}

static void test_multi_turn_bodies(void **state)
{
    bb_turn_t t[3] = {{"q1", 2, "a1", 2}, {"q2", 2, "a2 more", 7}, {"q3", 2, NULL, 0}};
    json_t *v = render(BB_EP_CHAT, 0, NULL, t, 3, 4);
    json_t *m = json_object_get(v, "messages");
    assert_int_equal(json_array_size(m), 5);
    const char *roles[] = {"user", "assistant", "user", "assistant", "user"};
    const char *texts[] = {"q1", "a1", "q2", "a2 more", "q3"};
    for (int i = 0; i < 5; i++) {
        assert_string_equal(json_string_value(json_object_get(json_array_get(m, i), "role")),
                            roles[i]);
        assert_string_equal(json_string_value(json_object_get(json_array_get(m, i), "content")),
                            texts[i]);
    }
    json_decref(v);
    v = render(BB_EP_COMPLETIONS, 0, NULL, t, 3, 4);
    assert_string_equal(json_string_value(json_object_get(v, "prompt")), "q1\na1\nq2\na2 more\nq3");
    json_decref(v);
}

static void write_file(const char *path, const char *s)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(s, f);
    fclose(f);
}

static void test_sharegpt(void **state)
{
    char path[] = "/tmp/bench-sharegpt-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(
        path,
        "[{\"id\":\"a\",\"conversations\":[{\"from\":\"human\",\"value\":\"one two three four "
        "five\"},{\"from\":\"gpt\",\"value\":\"six seven eight nine ten eleven\"}]},"
        " {\"id\":\"short\",\"conversations\":[{\"from\":\"human\",\"value\":\"hi\"},"
        "{\"from\":\"gpt\",\"value\":\"hello there my friend\"}]},"
        " {\"id\":\"single\",\"conversations\":[{\"from\":\"human\",\"value\":\"a b c d\"}]},"
        " {\"id\":\"noconv\"}, 42,"
        " {\"id\":\"b\",\"conversations\":[{\"from\":\"human\",\"value\":\"w x y z\"},"
        "{\"from\":\"gpt\",\"value\":\"p q r s t\"},{\"from\":\"human\",\"value\":\"more\"}]}]");
    bb_dataset_t ds;
    char err[256];
    assert_int_equal(bb_dataset_load_sharegpt(&ds, path, err, sizeof(err)), 0);
    assert_int_equal(ds.n, 2);
    assert_string_equal(ds.items[0].prompt, "one two three four five");
    assert_int_equal(ds.items[0].prompt_words, 5);
    assert_int_equal(ds.items[0].output_words, 6);
    assert_int_equal(ds.items[1].prompt_words, 4);
    assert_int_equal(ds.items[1].output_words, 5);
    bb_dataset_free(&ds);

    write_file(path, "{\"not\": \"an array\"}");
    assert_int_equal(bb_dataset_load_sharegpt(&ds, path, err, sizeof(err)), BATON_EINVAL);
    assert_non_null(strstr(err, "array"));
    write_file(path, "[{\"conversations\": [");
    assert_int_equal(bb_dataset_load_sharegpt(&ds, path, err, sizeof(err)), BATON_EINVAL);
    write_file(path, "[]");
    assert_int_equal(bb_dataset_load_sharegpt(&ds, path, err, sizeof(err)), BATON_EINVAL);
    unlink(path);
    assert_int_equal(bb_dataset_load_sharegpt(&ds, path, err, sizeof(err)), BATON_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_prompt_word_count),
        cmocka_unit_test(test_json_string_round_trip),
        cmocka_unit_test(test_bodies),
        cmocka_unit_test(test_user_field),
        cmocka_unit_test(test_token_ids),
        cmocka_unit_test(test_multi_turn_bodies),
        cmocka_unit_test(test_sharegpt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
