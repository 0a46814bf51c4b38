/* tokenizer/tok_api.h — vLLM's /tokenize and /detokenize request and response bodies over a
 * loaded tokenizer and chat template, and how vLLM encodes a prompt (the bos transformers adds):
 * one definition for the router and the worker. */
#ifndef BATON_TOKENIZER_TOK_API_H
#define BATON_TOKENIZER_TOK_API_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

struct json_t;

/* Largest token list /detokenize accepts and /tokenize returns. */
#define BATON_TOK_API_MAX_IDS (1u << 22)

/* Whether a prompt encoded with add_special_tokens gets a bos the post-processor does not add:
 * transformers' Llama tokenizers add it themselves when tokenizer_config.json says
 * add_bos_token (DeepSeek V3), so vLLM's ids start with it. sc: any scratch. */
int baton_tok_prompt_adds_bos(const baton_tok_t *tok, baton_tok_scratch_t *sc);

/* How the caller encodes: chat (a rendered template: special-token text parsed, nothing added)
 * or a prompt (with add_special: the post-processor's tokens and the bos above). Appends to
 * out; 0, BATON_EINVAL (not UTF-8) or BATON_ENOMEM. */
typedef int (*baton_tok_api_encode_fn)(void *arg, const char *text, size_t len, int chat,
                                       int add_special, baton_tok_ids_t *out);

typedef struct baton_tok_api_s {
    const baton_tok_t *tok;
    const baton_tmpl_t *tmpl; /* NULL: chat requests are refused */
    uint64_t max_model_len;   /* reported as "max_model_len" */
    baton_tok_api_encode_fn encode;
    void *arg;
} baton_tok_api_t;

/* A refusal: vLLM's 400 message and the parameter it names (NULL: none). */
typedef struct baton_tok_api_err_s {
    char message[512];
    const char *param;
} baton_tok_api_err_t;

/*
 * POST /tokenize: {prompt, add_special_tokens (true)} or {messages, add_generation_prompt
 * (true), add_special_tokens (false), tools, chat_template_kwargs}, both with
 * return_token_strs (false) → {count, max_model_len, tokens[, token_strs]}.
 * POST /detokenize: {tokens} → {prompt} (special tokens kept, a cut character as U+FFFD).
 * 0 and *resp, 1 (a bad request: *e), or BATON_ENOMEM.
 */
int baton_tok_api_tokenize(const baton_tok_api_t *a, const struct json_t *body,
                           struct json_t **resp, baton_tok_api_err_t *e);
int baton_tok_api_detokenize(const baton_tok_api_t *a, const struct json_t *body,
                             struct json_t **resp, baton_tok_api_err_t *e);

/* {"error": {"message", "type": "BadRequestError", "param", "code": 400}}: vLLM's ErrorResponse. */
struct json_t *baton_tok_api_error_json(const char *message, const char *param);

#endif
