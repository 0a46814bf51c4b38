/* fuzz/fuzz_tokenizer.c — libFuzzer harness for encode on arbitrary bytes: valid UTF-8 encodes
 * and decodes back to itself (no normalizer: byte-level BPE loses nothing), anything else is
 * BATON_EINVAL with the output untouched. The first byte picks the flags. Set
 * BATON_FUZZ_TOKENIZER to a model directory to fuzz a real tokenizer instead of the small one. */
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "fuzz_check.h"
#include "tok_small.h"
#include "tokenizer/tokenizer.h"

static baton_tok_t *tok;
static baton_tok_scratch_t *sc;
static bool exact_roundtrip = true;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char err[256] = "";
    const char *path = getenv("BATON_FUZZ_TOKENIZER");
    if (path) {
        CHECK(baton_tok_load(path, &tok, err, sizeof(err)) == 0);
        exact_roundtrip = getenv("BATON_FUZZ_TOKENIZER_NORMALIZES") == NULL;
    } else {
        char *j = tok_small_json(false);
        CHECK(baton_tok_load_json(j, strlen(j), NULL, 0, &tok, err, sizeof(err)) == 0);
        free(j);
    }
    sc = baton_tok_scratch_new();
    CHECK(sc != NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (size == 0)
        return 0;
    unsigned flags = data[0] & 3;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    baton_tok_ids_t ids = BATON_TOK_IDS_INIT;
    int rc = baton_tok_encode(tok, sc, text, len, flags & BATON_TOK_PARSE_SPECIAL, &ids);
    if (rc != 0) {
        CHECK(rc == BATON_EINVAL || rc == BATON_ETOOBIG);
        CHECK(ids.len == 0);
        return 0;
    }
    CHECK(ids.len <= len);
    baton_buf_t b = BATON_BUF_INIT;
    CHECK(baton_tok_decode(tok, ids.ids, ids.len, 0, &b) == 0);
    if (exact_roundtrip)
        CHECK(b.len == len && (len == 0 || memcmp(b.data, text, len) == 0));
    size_t n = 0;
    CHECK(baton_tok_count(tok, sc, text, len, flags & BATON_TOK_PARSE_SPECIAL, &n) == 0);
    CHECK(n == ids.len); /* the piece cache answers as the merges did */
    baton_buf_free(&b);
    baton_tok_ids_free(&ids);
    return 0;
}
