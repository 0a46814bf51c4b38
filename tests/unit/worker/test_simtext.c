/* test_simtext.c — the simulated model's text: hashes, token stream, stop rules, hold-back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "baton/error.h"
#include "worker/simtext.h"

/* Runs a generator to completion with the model's own tokens. */
static void run(wk_gen_t *g)
{
    for (int guard = 0; g->finish == WK_FINISH_NONE && guard < 100000; guard++)
        assert_int_equal(wk_gen_push(g, wk_gen_next_id(g)), 0);
    assert_int_not_equal(g->finish, WK_FINISH_NONE);
}

static const char *final_text(const wk_gen_t *g, char *buf, size_t cap)
{
    size_t n = g->final_len < cap - 1 ? g->final_len : cap - 1;
    memcpy(buf, g->text.data ? g->text.data : "", n);
    buf[n] = '\0';
    return buf;
}

static void test_hash_vectors(void **state)
{
    /* published FNV-1a 64 and splitmix64 test vectors */
    assert_true(wk_sim_fnv1a("", 0) == 0xcbf29ce484222325ULL);
    assert_true(wk_sim_fnv1a("a", 1) == 0xaf63dc4c8601ec8cULL);
    assert_true(wk_sim_fnv1a("foobar", 6) == 0x85944171f73967e8ULL);
    assert_true(wk_sim_mix(0, 1) == 0xe220a8397b1dcdafULL);
    assert_true(wk_sim_mix(0, 2) == 0x6e789e6aa1b965f4ULL);
}

static void test_words_and_seeds(void **state)
{
    assert_int_equal(wk_sim_count_words("", 0), 1);
    assert_int_equal(wk_sim_count_words("   \t\n", 5), 1);
    assert_int_equal(wk_sim_count_words("hello", 5), 1);
    assert_int_equal(wk_sim_count_words(" hello  world\t!\n", 16), 3);
    /* only ASCII whitespace splits: a UTF-8 no-break space does not */
    assert_int_equal(wk_sim_count_words("a\xc2\xa0z", 4), 1);
    int64_t ids[3] = {1, 22, 333};
    assert_true(wk_sim_seed_ids(ids, 3) == wk_sim_seed_text("1 22 333", 8));
    int64_t one = 0;
    assert_true(wk_sim_seed_ids(&one, 1) == wk_sim_seed_text("0", 1));
    assert_true(wk_sim_word_id("a", 1) == (int64_t)(0xaf63dc4c8601ec8cULL & 0x7fffffff));
}

static void test_tokens_stable(void **state)
{
    uint64_t seed = wk_sim_seed_text("hello world", 11);
    for (uint32_t i = 0; i < 1000; i++) {
        int32_t t = wk_sim_token(seed, i);
        assert_true(t >= 0 && t < WK_SIM_VOCAB_SIZE);
        assert_int_equal(t, wk_sim_token(seed, i));
        double lp = wk_sim_output_logprob(seed, i);
        assert_true(lp <= -1.0 / 256 && lp >= -1.0);
        /* an exact multiple of 1/256: prints exactly in JSON */
        assert_true(lp * 256 == (double)(int)(lp * 256));
    }
    /* every vocabulary word is plain, non-empty, without whitespace, and unique */
    for (int i = 0; i < WK_SIM_VOCAB_SIZE; i++) {
        const char *w = wk_sim_vocab[i];
        assert_true(strlen(w) > 0);
        assert_int_equal(wk_sim_count_words(w, strlen(w)), 1);
        assert_null(strchr(w, ' '));
        for (int j = 0; j < i; j++)
            assert_string_not_equal(w, wk_sim_vocab[j]);
    }
    assert_string_equal(wk_sim_word(-1), "");
    assert_string_equal(wk_sim_word(WK_SIM_VOCAB_SIZE), "");
}

static void test_max_tokens(void **state)
{
    uint64_t seed = wk_sim_seed_text("hello world", 11);
    char buf[4096];
    wk_gen_t g;
    wk_gen_init(&g, seed, 8, NULL);
    run(&g);
    assert_int_equal(g.finish, WK_FINISH_LENGTH);
    assert_int_equal(g.n_tokens, 8);
    /* same text as tests/integration/simtext.py computes for this prompt */
    assert_string_equal(final_text(&g, buf, sizeof(buf)), "route ten to was data fast wind eight");
    /* words joined by single spaces */
    size_t words = wk_sim_count_words(g.text.data, g.text.len);
    assert_int_equal(words, 8);
    assert_int_equal(wk_gen_push(&g, 1), BATON_EINVAL);
    wk_gen_free(&g);

    /* a longer run starts with the same tokens: the text depends on max_tokens only by length */
    wk_gen_t g2;
    wk_gen_init(&g2, seed, 20, NULL);
    run(&g2);
    assert_int_equal(g2.n_tokens, 20);
    assert_memory_equal(g2.text.data, "route ten to was data fast wind eight ", 38);
    wk_gen_free(&g2);

    wk_gen_t g0;
    wk_gen_init(&g0, seed, 0, NULL);
    assert_int_equal(g0.finish, WK_FINISH_LENGTH);
    assert_int_equal(g0.n_tokens, 0);
    assert_int_equal(g0.final_len, 0);
    assert_int_equal(wk_gen_push(&g0, 1), BATON_EINVAL);
    wk_gen_free(&g0);
}

static void gen_with_stops(wk_gen_t *g, uint64_t seed, uint32_t max, const char *const *strs,
                           size_t n, const int64_t *ids, size_t n_ids, size_t *lens)
{
    for (size_t i = 0; i < n; i++)
        lens[i] = strlen(strs[i]);
    wk_stop_t st = {.strs = strs, .lens = lens, .n = n, .ids = ids, .n_ids = n_ids};
    wk_gen_init(g, seed, max, &st);
    run(g);
}

static void test_stop_strings(void **state)
{
    uint64_t seed = wk_sim_seed_text("hello world", 11);
    char buf[256];
    size_t lens[4];
    wk_gen_t g;

    /* a stop inside a word, spanning two tokens, and the earliest of several */
    const char *s1[] = {"fast"};
    gen_with_stops(&g, seed, 8, s1, 1, NULL, 0, lens);
    assert_int_equal(g.finish, WK_FINISH_STOP);
    assert_int_equal(g.matched_str, 0);
    assert_int_equal(g.n_tokens, 6);
    assert_string_equal(final_text(&g, buf, sizeof(buf)), "route ten to was data ");
    wk_gen_free(&g);

    const char *s2[] = {"o was d"};
    gen_with_stops(&g, seed, 8, s2, 1, NULL, 0, lens);
    assert_int_equal(g.n_tokens, 5);
    assert_string_equal(final_text(&g, buf, sizeof(buf)), "route ten t");
    wk_gen_free(&g);

    const char *s3[] = {"wind", "en", "ten"};
    gen_with_stops(&g, seed, 8, s3, 3, NULL, 0, lens);
    assert_int_equal(g.n_tokens, 2);
    assert_int_equal(g.matched_str, 2); /* "ten" starts before "en" */
    assert_string_equal(final_text(&g, buf, sizeof(buf)), "route ");
    wk_gen_free(&g);

    const char *s4[] = {"te", "t"}; /* same start: the one listed first wins */
    gen_with_stops(&g, seed, 8, s4, 2, NULL, 0, lens);
    assert_int_equal(g.n_tokens, 1);
    assert_int_equal(g.matched_str, 0);
    assert_string_equal(final_text(&g, buf, sizeof(buf)), "rou");
    wk_gen_free(&g);

    const char *s5[] = {"", "zzz"}; /* empty strings are ignored, absent ones never match */
    gen_with_stops(&g, seed, 8, s5, 2, NULL, 0, lens);
    assert_int_equal(g.finish, WK_FINISH_LENGTH);
    assert_int_equal(g.n_tokens, 8);
    wk_gen_free(&g);

    /* stop on the last allowed token: "stop" wins over "length" */
    const char *s6[] = {"eight"};
    gen_with_stops(&g, seed, 8, s6, 1, NULL, 0, lens);
    assert_int_equal(g.finish, WK_FINISH_STOP);
    assert_int_equal(g.n_tokens, 8);
    wk_gen_free(&g);
}

static void test_stop_ids(void **state)
{
    uint64_t seed = wk_sim_seed_text("hello world", 11);
    char buf[256];
    size_t lens[1];
    wk_gen_t g;
    int64_t ids[] = {999, 12}; /* 12 = "was", the 4th token */
    gen_with_stops(&g, seed, 8, NULL, 0, ids, 2, lens);
    assert_int_equal(g.finish, WK_FINISH_STOP);
    assert_int_equal(g.matched_id, 12);
    assert_int_equal(g.matched_str, -1);
    assert_int_equal(g.n_tokens, 4); /* the stop token counts ... */
    assert_string_equal(final_text(&g, buf, sizeof(buf)), "route ten to"); /* ... unseen */
    wk_gen_free(&g);
}

static void test_visible_holdback(void **state)
{
    uint64_t seed = wk_sim_seed_text("hello world", 11);
    size_t lens[2];
    const char *strs[] = {"data fXst", "ind e"};
    lens[0] = strlen(strs[0]);
    lens[1] = strlen(strs[1]);
    wk_stop_t st = {.strs = strs, .lens = lens, .n = 2};
    wk_gen_t g;
    wk_gen_init(&g, seed, 8, &st);
    size_t prev = 0;
    while (g.finish == WK_FINISH_NONE) {
        assert_int_equal(wk_gen_push(&g, wk_gen_next_id(&g)), 0);
        size_t vis = wk_gen_visible_len(&g);
        assert_true(vis >= prev); /* what was shown is never taken back */
        prev = vis;
        if (g.n_tokens == 5) /* "route ten to was data": "data" may start "data fXst" */
            assert_int_equal(vis, strlen("route ten to was "));
        if (g.n_tokens == 6) /* "... data fast": no longer a prefix of any stop */
            assert_int_equal(vis, g.text.len);
        if (g.n_tokens == 7) /* "... wind": "ind" may start "ind e" */
            assert_int_equal(vis, strlen("route ten to was data fast w"));
    }
    /* "ind e" matched across "wind eight": the text ends before it */
    assert_int_equal(g.finish, WK_FINISH_STOP);
    assert_int_equal(g.matched_str, 1);
    assert_int_equal(g.n_tokens, 8);
    assert_int_equal(g.final_len, strlen("route ten to was data fast w"));
    assert_int_equal(wk_gen_visible_len(&g), g.final_len);
    wk_gen_free(&g);
}

static void test_token_text(void **state)
{
    uint64_t seed = wk_sim_seed_text("hello world", 11);
    wk_gen_t g;
    wk_gen_init(&g, seed, 3, NULL);
    run(&g);
    baton_buf_t b = BATON_BUF_INIT;
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(wk_gen_token_text(&g, i, &b), 0);
    /* the token texts add up to the text */
    assert_int_equal(b.len, g.text.len);
    assert_memory_equal(b.data, g.text.data, b.len);
    assert_int_equal(wk_gen_token_text(&g, 3, &b), BATON_EINVAL);
    baton_buf_free(&b);
    assert_int_equal(g.tok_end[0], strlen("route"));
    assert_int_equal(g.tok_end[2], strlen("route ten to"));
    wk_gen_free(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_vectors),     cmocka_unit_test(test_words_and_seeds),
        cmocka_unit_test(test_tokens_stable),    cmocka_unit_test(test_max_tokens),
        cmocka_unit_test(test_stop_strings),     cmocka_unit_test(test_stop_ids),
        cmocka_unit_test(test_visible_holdback), cmocka_unit_test(test_token_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
