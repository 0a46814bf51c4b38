/* fuzz/fuzz_tokenizer_load.c — libFuzzer harness for the loader on hostile tokenizer.json: any
 * bytes load or are refused with an error and a message (no crash, no leak, bounded memory);
 * what loads encodes a mixed text and its own bytes, and decodes them. */
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "fuzz_check.h"
#include "tokenizer/tokenizer.h"

static baton_tok_scratch_t *sc;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    sc = baton_tok_scratch_new();
    CHECK(sc != NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    char err[256] = "";
    baton_tok_t *t = NULL;
    int rc = baton_tok_load_json((const char *)data, size, NULL, 0, &t, err, sizeof(err));
    if (rc != 0) {
        CHECK(rc < 0 && t == NULL && err[0] != 0);
        return 0;
    }
    static const char text[] = "Hello world <|s|> <think> 12345 ünïcödé 你好 👍🏽\n\n  x";
    baton_tok_ids_t ids = BATON_TOK_IDS_INIT;
    for (unsigned flags = 0; flags < 4; flags++) {
        ids.len = 0;
        rc = baton_tok_encode(t, sc, text, sizeof(text) - 1, flags, &ids);
        CHECK(rc == 0 || rc == BATON_ETOOBIG);
        baton_buf_t b = BATON_BUF_INIT;
        CHECK(baton_tok_decode(t, ids.ids, ids.len, 0, &b) == 0);
        baton_buf_free(&b);
    }
    ids.len = 0;
    (void)baton_tok_encode(t, sc, (const char *)data, size < 4096 ? size : 4096,
                           BATON_TOK_PARSE_SPECIAL, &ids);
    baton_tok_ids_free(&ids);
    (void)baton_tok_config_str(t, "chat_template");
    baton_tok_free(t);
    return 0;
}
