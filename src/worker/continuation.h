/* continuation.h — a request that continues a stream another worker began: its wire form and
 * the replay that brings a sequence to where that stream stopped. */
#ifndef BATON_WORKER_CONTINUATION_H
#define BATON_WORKER_CONTINUATION_H

#include <jansson.h>

#include "worker/render.h"
#include "worker/request.h"
#include "worker/simtext.h"

/*
 * Wire form (docs/WORKER.md "Continuations"): the original request's body, unchanged, plus
 *
 *   "baton_continuation": {"choices": [C_0, C_1, ...]}
 *
 * one entry per sequence in the order of the answer (choices[i].index, or the /generate batch
 * index), each null (the client saw nothing of that sequence) or
 *
 *   {"text": "<the text the client has of it>", "finished": false, "tokens": 7}
 *
 * "finished": true when its last chunk (the one with finish_reason) reached the client too;
 * "tokens" (optional): how many tokens the client has, where the stream says (/generate's
 * meta_info.completion_tokens) — without it, the fewest tokens whose visible text covers
 * "text".
 * The worker generates the sequence from the start as the uninterrupted request would (the
 * output is a function of the prompt), does not send what the client has, and streams the rest
 * exactly as the uninterrupted stream would have: the same chunks, the same usage (the whole
 * completion). A "text" that is not what the sequence produces is refused (400
 * continuation_mismatch). Only streamed chat, completions and /generate requests without
 * logprobs take one.
 */

typedef struct wk_cont_item_s {
    int present; /* 0: null, the client saw nothing of this sequence */
    char *text;  /* owned */
    size_t len;
    int finished;
    long long tokens; /* -1: not given */
} wk_cont_item_t;

/* Reads "baton_continuation" of root into req->cont (req->n_items entries; NULL when the body
 * has none). 0, BATON_EINVAL with *err filled, or BATON_ENOMEM. */
int wk_cont_parse(json_t *root, wk_request_t *req, wk_parse_err_t *err);

/* Generates g (just initialised) up to where the client's stream of it stopped and sets st as
 * if those chunks had been sent. 0, BATON_EINVAL when c->text is not what g produces, or
 * BATON_ENOMEM. A NULL or absent c leaves both untouched. */
int wk_cont_replay(const wk_cont_item_t *c, wk_gen_t *g, wk_stream_state_t *st);

void wk_cont_free(wk_cont_item_t *cont, size_t n);

#endif
