/* tokenizer/tokenizer.h — the tokenizer's public API: loading a Hugging Face tokenizer.json
 * (+ tokenizer_config.json), text to token ids, token ids back to bytes. */
#ifndef BATON_TOKENIZER_TOKENIZER_H
#define BATON_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

struct json_t;

/*
 * Ownership and threading
 * - A baton_tok_t is built once by baton_tok_load*() and is IMMUTABLE afterwards: every call
 *   below takes it const, so one loaded tokenizer is shared read-only by any number of threads
 *   without locks. baton_tok_free() is the only call that changes it; the owner calls it once
 *   no thread uses it any more (a reload builds a new one and frees the old after a swap).
 * - Working memory is the caller's: a baton_tok_scratch_t holds the regex match state, the BPE
 *   work arrays and a cache of recently seen pieces. One scratch per thread (or per event
 *   loop); never shared by two threads at once. A scratch is not tied to one tokenizer: it
 *   notices a different tokenizer and drops its cache.
 * - Outputs are caller-owned growable arrays (baton_tok_ids_t, baton_buf_t) that the calls
 *   append to; the caller frees them.
 *
 * Exactness: a tokenizer.json that uses anything this implementation cannot reproduce exactly
 * (a model type, normalizer, pre-tokenizer, post-processor, decoder or option outside the
 * supported set, docs/TOKENIZER.md) is refused at load with a message naming the construct;
 * it is never loaded to tokenize approximately.
 *
 * Errors: 0 or a negative baton_errno_t (BATON_EINVAL for bad input, BATON_ENOTSUP for an
 * unsupported construct, BATON_ENOMEM, or a negative errno from reading the files).
 */

typedef struct baton_tok baton_tok_t;
typedef struct baton_tok_scratch baton_tok_scratch_t;

/* A caller-owned array of token ids; start it zeroed (BATON_TOK_IDS_INIT), free with
 * baton_tok_ids_free. encode appends to it. */
typedef struct {
    uint32_t *ids;
    size_t len;
    size_t cap;
} baton_tok_ids_t;

#define BATON_TOK_IDS_INIT                                                                         \
    {                                                                                              \
        NULL, 0, 0                                                                                 \
    }

/* Encode flags. */
enum {
    /* Add what the post-processor adds around a single sequence (for example Llama 3's
     * <|begin_of_text|>): what Hugging Face's encode(add_special_tokens=True) does. */
    BATON_TOK_ADD_SPECIAL = 1u << 0,
    /* Recognise the text of special tokens ("<|im_start|>") in the input as those tokens.
     * Without it, special-token text in the input is tokenized as ordinary text, so user
     * content can never forge a control token; only a prompt the server itself builds (a
     * rendered chat template) should pass this flag. Added tokens that are not special (Qwen's
     * "<think>") are always recognised, as in Hugging Face's tokenizers. */
    BATON_TOK_PARSE_SPECIAL = 1u << 1,
};

/* Decode flags. */
enum {
    BATON_TOK_SKIP_SPECIAL = 1u << 0, /* leave special tokens out of the text */
};

/* Loads a tokenizer. path is a directory holding tokenizer.json (and optionally
 * tokenizer_config.json), or the tokenizer.json file itself (tokenizer_config.json is then
 * looked for beside it). On failure returns an error and writes a one-line reason into
 * err[errlen] (which may name the unsupported construct, never an address). */
int baton_tok_load(const char *path, baton_tok_t **tok_p, char *err, size_t errlen);

/* The same from memory: tokenizer.json's text, and tokenizer_config.json's (config may be
 * NULL). Nothing is kept pointing into the arguments. */
int baton_tok_load_json(const char *tokenizer_json, size_t len, const char *config_json,
                        size_t config_len, baton_tok_t **tok_p, char *err, size_t errlen);

void baton_tok_free(baton_tok_t *tok);

/* A scratch for one thread; NULL when out of memory. */
baton_tok_scratch_t *baton_tok_scratch_new(void);
void baton_tok_scratch_free(baton_tok_scratch_t *sc);

/* Appends the ids of text[0..len) to out. text must be valid UTF-8 (BATON_EINVAL otherwise;
 * out is then left as it was). */
int baton_tok_encode(const baton_tok_t *tok, baton_tok_scratch_t *sc, const char *text, size_t len,
                     unsigned flags, baton_tok_ids_t *out);

/* Counts the tokens text would encode to, without keeping them (0 or an error; *n_p set). */
int baton_tok_count(const baton_tok_t *tok, baton_tok_scratch_t *sc, const char *text, size_t len,
                    unsigned flags, size_t *n_p);

/* Appends the bytes ids[0..n) stand for to out. The bytes of a byte-level token sequence
 * need not be valid UTF-8 at every cut (a character may span two tokens): a streaming caller
 * keeps the incomplete tail for the next call. An id outside the vocabulary is BATON_EINVAL
 * (out left as it was). */
int baton_tok_decode(const baton_tok_t *tok, const uint32_t *ids, size_t n, unsigned flags,
                     baton_buf_t *out);

void baton_tok_ids_free(baton_tok_ids_t *ids);

/* Facts about a loaded tokenizer (all const, any thread). */

/* One past the largest id (vocabulary plus added tokens). */
uint32_t baton_tok_vocab_size(const baton_tok_t *tok);
/* The id of a token given its text (an added token's content, or a vocabulary entry's bytes),
 * or -1. */
int64_t baton_tok_token_id(const baton_tok_t *tok, const char *text, size_t len);
/* The bytes id stands for (an added token's content as it is), or NULL for an unknown id. */
const char *baton_tok_token_bytes(const baton_tok_t *tok, uint32_t id, size_t *len_p);
/* Whether id is a special token (control tokens such as <|im_end|>). */
int baton_tok_is_special(const baton_tok_t *tok, uint32_t id);
/* Whether id is an added token (tokenizer.json's added_tokens, special or not: matched in the
 * text before the model runs). */
int baton_tok_is_added(const baton_tok_t *tok, uint32_t id);
/* The beginning- / end-of-sequence tokens named by tokenizer_config.json (bos_token,
 * eos_token), or -1 when it names none. */
int64_t baton_tok_bos_id(const baton_tok_t *tok);
int64_t baton_tok_eos_id(const baton_tok_t *tok);
/* A top-level string of tokenizer_config.json ("chat_template", "bos_token" — a token given
 * as {"content": ...} is returned as its content), or NULL. Valid while tok lives. */
const char *baton_tok_config_str(const baton_tok_t *tok, const char *key);
/* tokenizer_config.json as parsed by jansson (chat_template given as a list of named
 * templates, add_bos_token, added_tokens_decoder, ...), or NULL without one. Read-only: jansson
 * objects are not safe to modify or reference-count from several threads. Valid while tok
 * lives. */
const struct json_t *baton_tok_config_json(const baton_tok_t *tok);
/* tokenizer_config.json's model_max_length when it is a plausible context length, else 0. */
uint64_t baton_tok_model_max_length(const baton_tok_t *tok);

#endif
