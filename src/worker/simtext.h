/* simtext.h — the simulated model: tokenizer, deterministic token stream, logprobs, stop rules. */
#ifndef BATON_WORKER_SIMTEXT_H
#define BATON_WORKER_SIMTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

/*
 * Everything here is a pure function of its inputs; docs/WORKER.md states the definition and
 * tests/integration/simtext.py is an independent reference implementation of it. Change one,
 * change all three.
 *
 *   seed      = FNV-1a 64 of the prompt bytes (token-id prompts: of the ids in decimal joined
 *               by single spaces, e.g. "1 2 3")
 *   z(i)      = splitmix64 finalizer of (seed + (i + 1) * 0x9E3779B97F4A7C15), i = 0, 1, ...
 *   token(i)  = z(i) % WK_SIM_VOCAB_SIZE, text = vocab words joined by single spaces
 *   logprob   = -(((z >> 56) + 1) / 256), an exact binary fraction in [-1, -1/256]
 */

#define WK_SIM_VOCAB_SIZE 64
#define WK_SIM_GOLDEN     0x9E3779B97F4A7C15ULL
#define WK_SIM_INPUT_BASE 0x8000000000000000ULL /* k offset for input-token logprobs */

extern const char *const wk_sim_vocab[WK_SIM_VOCAB_SIZE];

uint64_t wk_sim_fnv1a(const void *data, size_t len);
uint64_t wk_sim_mix(uint64_t seed, uint64_t k);

/* Seeds for a text prompt and for a token-id prompt. */
uint64_t wk_sim_seed_text(const char *s, size_t len);
uint64_t wk_sim_seed_ids(const int64_t *ids, size_t n);

/* Prompt tokens of a text prompt: runs of non-whitespace (space \t \n \v \f \r), at least 1. */
uint32_t wk_sim_count_words(const char *s, size_t len);

/* Token id of one prompt word: FNV-1a 64 of its bytes & 0x7fffffff. */
int64_t wk_sim_word_id(const char *w, size_t len);

/* The token ids of a text prompt's words, in order: writes at most `cap` of them and returns
 * how many there are (wk_sim_count_words; an empty or all-blank prompt is one token, the id
 * of ""). */
uint32_t wk_sim_word_ids(const char *s, size_t len, int64_t *out, uint32_t cap);

/* The i-th generated token (0-based) and its logprob. */
int32_t wk_sim_token(uint64_t seed, uint32_t i);
double wk_sim_output_logprob(uint64_t seed, uint32_t i);
/* Logprob of prompt token j >= 1 (prompt token 0 has none). */
double wk_sim_input_logprob(uint64_t seed, uint32_t j);
double wk_sim_logprob_of(uint64_t z);

/* Word of a token id; "" for ids outside the vocabulary. */
const char *wk_sim_word(int64_t id);

/* Stop conditions of one sequence. Strings are not owned. Empty strings are ignored. */
typedef struct wk_stop_s {
    const char *const *strs;
    const size_t *lens;
    size_t n;
    const int64_t *ids; /* stop_token_ids */
    size_t n_ids;
} wk_stop_t;

typedef enum {
    WK_FINISH_NONE = 0,
    WK_FINISH_LENGTH, /* max_tokens reached */
    WK_FINISH_STOP,   /* a stop string or stop token id */
} wk_finish_t;

/*
 * One sequence's generation state. The caller supplies each token id (normally
 * wk_sim_token(seed, n_tokens); in PD decode the first one comes from prefill), wk_gen_push
 * applies the stop rules:
 *   1. n_tokens += 1, the id is recorded;
 *   2. the id is in stop_token_ids → finished "stop", its word is not appended;
 *   3. else its word is appended (after one space unless the text is empty) and the earliest
 *      occurrence of any stop string in the text ends it: text truncated there, "stop" (ties:
 *      the stop listed first);
 *   4. else n_tokens == max_tokens → finished "length".
 * max_tokens 0 is finished ("length") right after init.
 */
typedef struct wk_gen_s {
    uint64_t seed;
    uint32_t max_tokens;
    wk_stop_t stop;
    size_t max_stop_len;
    uint32_t n_tokens;
    int32_t *ids; /* n_tokens of them */
    uint32_t ids_cap;
    baton_buf_t text; /* cumulative text of the appended tokens, not truncated */
    size_t *tok_end;  /* text length after each token (for offsets); n_tokens entries */
    size_t final_len; /* valid when finished */
    wk_finish_t finish;
    int matched_str;    /* index of the stop string that matched, or -1 */
    int64_t matched_id; /* the stop token id that matched, or -1 */
} wk_gen_t;

void wk_gen_init(wk_gen_t *g, uint64_t seed, uint32_t max_tokens, const wk_stop_t *stop);
void wk_gen_free(wk_gen_t *g);
/* The id wk_sim_token would produce next. */
int32_t wk_gen_next_id(const wk_gen_t *g);
/* Returns 0 or BATON_ENOMEM (BATON_EINVAL when already finished). */
int wk_gen_push(wk_gen_t *g, int32_t id);

/*
 * Length of the text that may be shown now: the final text once finished; before that the
 * text minus its longest suffix that is a proper prefix of some stop string (it may still
 * become part of a stop match). Streaming sends what this grows by; the pieces add up to the
 * final text.
 */
size_t wk_gen_visible_len(const wk_gen_t *g);

/* Token i's text as seen in logprobs: the word, with a leading space for i > 0. */
int wk_gen_token_text(const wk_gen_t *g, uint32_t i, baton_buf_t *out);

#endif
