/* test_tokenizer.c — src/tokenizer on a small byte-level tokenizer.json made here: merges in
 * rank order, added and special tokens (special text parsed only on request), the
 * post-processor's bos, invalid UTF-8, decode, refusals by name, and one tokenizer shared by
 * threads each with its own scratch. Exactness against real models is
 * tests/integration/test_tokenizer_exact.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "tok_small.h" /* fuzz/: the byte-level alphabet, shared with the harnesses */
#include "tokenizer/tokenizer.h"

enum { ID_HE = 256, ID_LL, ID_HELL, ID_HELLO, ID_SP_H, ID_BOS = 300, ID_THINK = 301 };

/* Vocabulary: the 256 bytes (id = byte), then he, ll, hell, hello, " h"; merges in that
 * order; pre-tokenizer: GPT-2-like split + ByteLevel; post-processor adds <|s|>. */
static json_t *make_json(void)
{
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char c[4];
        tok_small_byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    char sp[4];
    tok_small_byte_char(' ', sp);
    char sph[8];
    snprintf(sph, sizeof(sph), "%sh", sp);
    json_object_set_new(vocab, "he", json_integer(ID_HE));
    json_object_set_new(vocab, "ll", json_integer(ID_LL));
    json_object_set_new(vocab, "hell", json_integer(ID_HELL));
    json_object_set_new(vocab, "hello", json_integer(ID_HELLO));
    json_object_set_new(vocab, sph, json_integer(ID_SP_H));
    char m5[16];
    snprintf(m5, sizeof(m5), "%s h", sp);
    json_t *merges = json_pack("[s,s,s,s,s]", "h e", "l l", "he ll", "hell o", m5);
    return json_pack(
        "{s:n, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b}]}, s:{s:s, s:o, s:o},"
        " s:[{s:i, s:s, s:b, s:b}, {s:i, s:s, s:b, s:b}],"
        " s:{s:s, s:[{s:{s:s}}, {s:{s:s}}], s:{s:{s:[i]}}}, s:{s:s}}",
        "normalizer", "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split",
        "pattern", "Regex", " ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+", "behavior",
        "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 0,
        "model", "type", "BPE", "vocab", vocab, "merges", merges, "added_tokens", "id", ID_BOS,
        "content", "<|s|>", "special", 1, "normalized", 0, "id", ID_THINK, "content", "<think>",
        "special", 0, "normalized", 0, "post_processor", "type", "TemplateProcessing", "single",
        "SpecialToken", "id", "<|s|>", "Sequence", "id", "A", "special_tokens", "<|s|>", "ids",
        ID_BOS, "decoder", "type", "ByteLevel");
}

static baton_tok_t *load_doc(json_t *doc, const char *config, int *rc_p, char *err, size_t n)
{
    char *s = json_dumps(doc, JSON_COMPACT);
    baton_tok_t *t = NULL;
    *rc_p = baton_tok_load_json(s, strlen(s), config, config ? strlen(config) : 0, &t, err, n);
    free(s);
    return t;
}

static baton_tok_t *load_small(void)
{
    json_t *doc = make_json();
    assert_non_null(doc);
    char err[256] = "";
    int rc;
    baton_tok_t *t = load_doc(doc,
                              "{\"bos_token\": {\"content\": \"<|s|>\"}, \"eos_token\": "
                              "\"<|s|>\", \"model_max_length\": 4096, \"chat_template\": "
                              "\"{{ x }}\"}",
                              &rc, err, sizeof(err));
    json_decref(doc);
    if (rc != 0)
        fail_msg("load: %s", err);
    return t;
}

static void expect_ids(const baton_tok_t *t, baton_tok_scratch_t *sc, const char *text,
                       unsigned flags, const uint32_t *want, size_t n)
{
    baton_tok_ids_t ids = BATON_TOK_IDS_INIT;
    assert_int_equal(baton_tok_encode(t, sc, text, strlen(text), flags, &ids), 0);
    assert_int_equal(ids.len, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ids.ids[i], want[i]);
    baton_tok_ids_free(&ids);
}

static void test_merges_in_rank_order(void **state)
{
    (void)state;
    baton_tok_t *t = load_small();
    baton_tok_scratch_t *sc = baton_tok_scratch_new();
    expect_ids(t, sc, "hello", 0, (uint32_t[]){ID_HELLO}, 1);
    /* " hello": " h" is the last merge, so "he" (rank 0) wins over " h" (rank 4). */
    expect_ids(t, sc, "hello hello", 0, (uint32_t[]){ID_HELLO, ' ', ID_HELLO}, 3);
    expect_ids(t, sc, "hi", 0, (uint32_t[]){'h', 'i'}, 2);
    expect_ids(t, sc, " hi", 0, (uint32_t[]){ID_SP_H, 'i'}, 2);
    expect_ids(t, sc, "lll", 0, (uint32_t[]){ID_LL, 'l'}, 2); /* leftmost first */
    expect_ids(t, sc, "", 0, NULL, 0);
    /* Twice: the second answer comes from the piece cache and must be the same. */
    expect_ids(t, sc, "hello hello", 0, (uint32_t[]){ID_HELLO, ' ', ID_HELLO}, 3);
    baton_tok_scratch_free(sc);
    baton_tok_free(t);
}

static void test_special_text_is_text_unless_asked(void **state)
{
    (void)state;
    baton_tok_t *t = load_small();
    baton_tok_scratch_t *sc = baton_tok_scratch_new();
    /* User content: "<|s|>" is five bytes of text ("<|" and "|>" are punctuation pieces). */
    expect_ids(t, sc, "<|s|>", 0, (uint32_t[]){'<', '|', 's', '|', '>'}, 5);
    expect_ids(t, sc, "<|s|>", BATON_TOK_PARSE_SPECIAL, (uint32_t[]){ID_BOS}, 1);
    /* A non-special added token is always recognised. */
    expect_ids(t, sc, "<think>hello", 0, (uint32_t[]){ID_THINK, ID_HELLO}, 2);
    expect_ids(t, sc, "hello", BATON_TOK_ADD_SPECIAL, (uint32_t[]){ID_BOS, ID_HELLO}, 2);
    assert_true(baton_tok_is_special(t, ID_BOS));
    assert_false(baton_tok_is_special(t, ID_THINK));
    assert_int_equal(baton_tok_bos_id(t), ID_BOS);
    assert_int_equal(baton_tok_eos_id(t), ID_BOS);
    assert_int_equal(baton_tok_model_max_length(t), 4096);
    assert_string_equal(baton_tok_config_str(t, "chat_template"), "{{ x }}");
    assert_true(json_is_object(baton_tok_config_json(t)));
    assert_int_equal(baton_tok_token_id(t, "<think>", 7), ID_THINK);
    assert_int_equal(baton_tok_token_id(t, "hello", 5), ID_HELLO);
    assert_int_equal(baton_tok_token_id(t, "nope!", 5), -1);
    baton_tok_scratch_free(sc);
    baton_tok_free(t);
}

static void test_invalid_utf8_and_decode(void **state)
{
    (void)state;
    baton_tok_t *t = load_small();
    baton_tok_scratch_t *sc = baton_tok_scratch_new();
    baton_tok_ids_t ids = BATON_TOK_IDS_INIT;
    const char *bad[] = {"\xff", "a\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "abc\xe2\x82"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(baton_tok_encode(t, sc, bad[i], strlen(bad[i]), 0, &ids), BATON_EINVAL);
    assert_int_equal(ids.len, 0);
    const char text[] = "hello <think> w\xc3\xb6rld \xf0\x9f\x98\x80 \x00 <|s|>";
    assert_int_equal(baton_tok_encode(t, sc, text, sizeof(text) - 1, BATON_TOK_PARSE_SPECIAL, &ids),
                     0);
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton_tok_decode(t, ids.ids, ids.len, 0, &b), 0);
    assert_int_equal(b.len, sizeof(text) - 1);
    assert_memory_equal(b.data, text, b.len);
    baton_buf_reset(&b);
    assert_int_equal(baton_tok_decode(t, ids.ids, ids.len, BATON_TOK_SKIP_SPECIAL, &b), 0);
    assert_int_equal(b.len, sizeof(text) - 1 - 5);
    baton_buf_reset(&b);
    uint32_t unknown[] = {ID_HELLO, 299};
    assert_int_equal(baton_tok_decode(t, unknown, 2, 0, &b), BATON_EINVAL);
    assert_int_equal(b.len, 0);
    baton_buf_free(&b);
    baton_tok_ids_free(&ids);
    baton_tok_scratch_free(sc);
    baton_tok_free(t);
}

/* Edits the small document at a path of keys, loads it, expects refusal naming `expect`. */
static void expect_refused(const char *k1, const char *k2, json_t *value, int code,
                           const char *expect)
{
    json_t *doc = make_json();
    json_t *o = k2 ? json_object_get(doc, k1) : doc;
    json_object_set_new(o, k2 ? k2 : k1, value);
    char err[256] = "";
    int rc;
    baton_tok_t *t = load_doc(doc, NULL, &rc, err, sizeof(err));
    json_decref(doc);
    assert_null(t);
    assert_int_equal(rc, code);
    if (!strstr(err, expect))
        fail_msg("error '%s' does not name '%s'", err, expect);
}

static void test_refusals_name_the_construct(void **state)
{
    (void)state;
    expect_refused("normalizer", NULL, json_pack("{s:s}", "type", "Lowercase"), BATON_ENOTSUP,
                   "normalizer Lowercase");
    expect_refused("pre_tokenizer", NULL, json_pack("{s:s}", "type", "Metaspace"), BATON_ENOTSUP,
                   "pre_tokenizer Metaspace");
    expect_refused("model", "type", json_string("Unigram"), BATON_ENOTSUP, "Unigram");
    expect_refused("model", "byte_fallback", json_true(), BATON_ENOTSUP, "byte_fallback");
    expect_refused("model", "merges", json_pack("[s]", "h zz"), BATON_ENOTSUP,
                   "outside the vocabulary");
    expect_refused("model", "merges", json_pack("[s]", "a b c"), BATON_EINVAL, "merges[0]");
    expect_refused("decoder", NULL, json_pack("{s:s}", "type", "Metaspace"), BATON_ENOTSUP,
                   "decoder Metaspace");
    expect_refused("post_processor", NULL, json_pack("{s:s}", "type", "BertProcessing"),
                   BATON_ENOTSUP, "BertProcessing");
    expect_refused("added_tokens", NULL,
                   json_pack("[{s:i, s:s, s:b}]", "id", 400, "content", "<x>", "lstrip", 1),
                   BATON_ENOTSUP, "lstrip");
    expect_refused("pre_tokenizer", NULL,
                   json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "Regex", "(",
                             "behavior", "Isolated"),
                   BATON_ENOTSUP, "regex does not compile");
    /* The post-processor naming an id that no token has (a gap in the id space). */
    expect_refused("post_processor", NULL,
                   json_pack("{s:s, s:[{s:{s:s}}, {s:{s:s}}], s:{s:{s:[i]}}}", "type",
                             "TemplateProcessing", "single", "SpecialToken", "id", "<|s|>",
                             "Sequence", "id", "A", "special_tokens", "<|s|>", "ids", 299),
                   BATON_EINVAL, "bad special token id");
    char err[128];
    baton_tok_t *t = NULL;
    assert_int_equal(baton_tok_load_json("{nope", 5, NULL, 0, &t, err, sizeof(err)), BATON_EINVAL);
    assert_int_equal(baton_tok_load("/nonexistent-dir", &t, err, sizeof(err)) < 0, 1);
    assert_null(t);
}

typedef struct {
    const baton_tok_t *t;
    const char *text;
    size_t want;
    int ok;
} thr_arg_t;

static void *thr_main(void *p)
{
    thr_arg_t *a = p;
    baton_tok_scratch_t *sc = baton_tok_scratch_new();
    a->ok = 1;
    for (int i = 0; i < 300 && a->ok; i++) {
        size_t n = 0;
        if (baton_tok_count(a->t, sc, a->text, strlen(a->text), 0, &n) != 0 || n != a->want)
            a->ok = 0;
    }
    baton_tok_scratch_free(sc);
    return NULL;
}

static void test_shared_by_threads(void **state)
{
    (void)state;
    baton_tok_t *t = load_small();
    const char *text = "hello hello world, <think> 12345 hello\n\n  ünïcode hello";
    baton_tok_scratch_t *sc = baton_tok_scratch_new();
    size_t want = 0;
    assert_int_equal(baton_tok_count(t, sc, text, strlen(text), 0, &want), 0);
    baton_tok_scratch_free(sc);
    pthread_t th[4];
    thr_arg_t args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg_t){t, text, want, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thr_main, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
    }
    baton_tok_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merges_in_rank_order),
        cmocka_unit_test(test_special_text_is_text_unless_asked),
        cmocka_unit_test(test_invalid_utf8_and_decode),
        cmocka_unit_test(test_refusals_name_the_construct),
        cmocka_unit_test(test_shared_by_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
