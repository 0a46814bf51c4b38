/* prompts.h — baton-bench prompts: random word prompts, ShareGPT datasets, request bodies. */
#ifndef BATON_BENCH_PROMPTS_H
#define BATON_BENCH_PROMPTS_H

#include <stddef.h>
#include <stdint.h>

#include "arrival.h"
#include "common/buf.h"
#include "resp.h"

/*
 * Lengths are counted in words (runs of non-whitespace). baton-worker counts prompt tokens
 * exactly that way, so for it --input-len N means N prompt tokens; for a real engine it is an
 * estimate (there is no tokenizer here).
 */

/* One conversation opening taken from a dataset. Strings are owned by the dataset. */
typedef struct bb_item_s {
    char *prompt;
    size_t prompt_len;
    uint32_t prompt_words;
    uint32_t output_words; /* length of the dataset's reply: the max_tokens to ask for */
} bb_item_t;

typedef struct bb_dataset_s {
    bb_item_t *items;
    size_t n;
} bb_dataset_t;

/*
 * Loads a ShareGPT-format file: a JSON array of {"conversations": [{"from", "value"}, ...]}.
 * Like vLLM's bench serve, it keeps entries with at least two turns, takes the first turn as
 * the prompt and the second as the reference reply, and drops pairs where either side has
 * fewer than 4 words, the prompt more than 1024 or both together more than 2048.
 * Returns 0, BATON_EINVAL (message in err) or BATON_ENOMEM.
 */
int bb_dataset_load_sharegpt(bb_dataset_t *ds, const char *path, char *err, size_t errlen);
void bb_dataset_free(bb_dataset_t *ds);

/* Appends n_words random words (single spaces between them) drawn from a fixed vocabulary. */
int bb_random_prompt(baton_buf_t *out, bb_rng_t *rng, uint32_t n_words);

/* One turn of a conversation; `assistant` is NULL for the turn being asked. Not owned. */
typedef struct bb_turn_s {
    const char *user;
    size_t user_len;
    const char *assistant;
    size_t assistant_len;
} bb_turn_t;

typedef struct bb_body_opts_s {
    bb_endpoint_t endpoint;
    int stream;
    const char *model; /* NULL: no "model" field */
    int ignore_eos;
    const char *user; /* NULL: none; else the OpenAI "user" field (the session key) */
    int token_ids; /* completions / generate: the prompt as ids, one per word (FNV-1a, 31 bits) */
} bb_body_opts_t;

/*
 * Appends the JSON body asking for the reply to the last turn with max_tokens tokens.
 * chat: the turns become alternating user/assistant messages; completions and /generate: the
 * turns are joined with newlines into one prompt (the next turn repeats the whole history).
 * Streaming chat/completions ask for stream_options.include_usage so the output token count
 * comes from the server. 0 or BATON_ENOMEM.
 */
int bb_render_body(baton_buf_t *out, const bb_body_opts_t *o, const bb_turn_t *turns,
                   size_t n_turns, uint32_t max_tokens);

#endif
