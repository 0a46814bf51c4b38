/* request.h — parsing and validating worker API bodies (/generate, chat, completions) into items.
 */
#ifndef BATON_WORKER_REQUEST_H
#define BATON_WORKER_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "worker/simtext.h"

typedef enum {
    WK_API_GENERATE,    /* SGLang POST /generate */
    WK_API_CHAT,        /* POST /v1/chat/completions */
    WK_API_COMPLETIONS, /* POST /v1/completions */
    WK_API_RESPONSES,   /* POST /v1/responses: parsed as the chat it amounts to */
} wk_api_t;

#define WK_MAX_ITEMS      1024      /* sequences in one request (batch × n) */
#define WK_MAX_TOKENS_CAP (1 << 20) /* largest max_tokens accepted */
#define WK_MAX_STOPS      64
#define WK_MAX_N          128

/* Defaults when the body names no limit. */
#define WK_DEFAULT_MAX_TOKENS_GENERATE    128
#define WK_DEFAULT_MAX_TOKENS_CHAT        128
#define WK_DEFAULT_MAX_TOKENS_COMPLETIONS 16

/* One sequence to generate: a batch element, or one of the n choices of a prompt. */
typedef struct wk_item_s {
    char *prompt; /* rendered prompt text (owned), or NULL for a token-id prompt */
    size_t prompt_len;
    int64_t *ids; /* token-id prompt (owned), n_ids >= 1 */
    size_t n_ids;
    int64_t *text_ids; /* --tokenizer: the model's ids of prompt (owned), prompt_tokens of them;
                        * NULL: the word tokenizer's */
    uint64_t seed;
    uint32_t prompt_tokens;
    uint32_t cached_tokens; /* of prompt_tokens, found in the worker's prefix cache (job sets) */
    uint32_t max_tokens;

    char **stop_strs; /* owned */
    size_t *stop_lens;
    size_t n_stop;
    int64_t *stop_ids; /* owned */
    size_t n_stop_ids;

    int logprobs;           /* output-token logprobs wanted */
    int top_logprobs;       /* OpenAI alternatives per token (0 = none) */
    uint32_t logprob_start; /* /generate: first prompt token with an input logprob */
    char *rid;              /* /generate rid (owned) or NULL */

    size_t prompt_index; /* which prompt of the request (usage counts each prompt once) */
    size_t choice_index; /* position in the response: choices[i].index / batch index */

    /* PD: set when the body carries bootstrap fields */
    int has_boot;
    char *boot_host; /* owned, NULL when absent */
    int boot_port;   /* -1 when absent or null */
    uint64_t room;
} wk_item_t;

/* vLLM PD protocols: the leg a body's kv_transfer_params make of it (vllm.h). */
typedef enum {
    WK_VLLM_NONE = 0,
    WK_VLLM_NIXL_PREFILL,
    WK_VLLM_NIXL_DECODE,
    WK_VLLM_MOONCAKE_PREFILL,
    WK_VLLM_MOONCAKE_DECODE,
} wk_vllm_leg_t;

typedef struct wk_request_s {
    wk_api_t api;
    int is_batch; /* /generate with list input: the answer is a JSON array */
    int stream;
    int include_usage; /* stream_options.include_usage */
    char *model;       /* the body's "model" (owned) or NULL */
    char *prev_id;     /* Responses: previous_response_id (owned) or NULL */
    size_t n_prompts;
    size_t n_items;
    wk_item_t *items;
    int has_boot;                /* any of bootstrap_host/port/room present and not null */
    wk_vllm_leg_t vllm_leg;      /* kv_transfer_params (vllm.h); NONE without */
    char *vllm_rid;              /* vllm-nixl decode: remote_request_id (owned), else NULL */
    int lease_port;              /* vllm-nixl decode: the prefill's baton_lease_port, 0 without */
    struct wk_cont_item_s *cont; /* a continuation (continuation.h): n_items entries, else NULL */
} wk_request_t;

typedef struct wk_parse_err_s {
    int status; /* 400 */
    char message[256];
    char param[64]; /* "" when none */
    const char *code;
} wk_parse_err_t;

/*
 * Parses `body` for `api`. On success returns 0 and fills *req (free with wk_request_free).
 * On a bad body returns BATON_EINVAL with *err filled (nothing to free); BATON_ENOMEM on
 * allocation failure.
 */
int wk_request_parse(wk_request_t *req, wk_api_t api, const char *body, size_t len,
                     wk_parse_err_t *err);
void wk_request_free(wk_request_t *req);

/* The stop rules of an item as the generator wants them. */
void wk_item_stop(const wk_item_t *it, wk_stop_t *out);

/* "generate", "chat", "completions" (metrics labels, logs). */
const char *wk_api_name(wk_api_t api);

#endif
