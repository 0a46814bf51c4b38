/* rtok_req.h — a request's prompt tokens in the router (the route context's token ids), the
 * context-length refusal in vLLM's words, and the /tokenize and /detokenize answers. */
#ifndef BATON_ROUTER_RTOK_REQ_H
#define BATON_ROUTER_RTOK_REQ_H

#include <stddef.h>
#include <stdint.h>

#include "router/dataplane/pdreq.h"
#include "router/dataplane/policy.h"
#include "router/dataplane/rtok.h"
#include "tokenizer/tok_api.h"

struct json_t;

/* A 400 in vLLM's shape: the message and the parameter it names (NULL: none). */
typedef baton_tok_api_err_t baton_rtok_refusal_t;

/*
 * For a chat or completions request whose model (ctx->model) has a tokenizer in the router:
 * its prompt's token ids into ctx->tokens / n_tokens (the context owns them), computed once,
 * on the calling loop's thread; then the context-length check (--max-model-len). A prompt the
 * router cannot tokenize (a batch, a template error, text that is not UTF-8) goes on without
 * ids, counted in baton_tokenize_failures_total: the worker judges it.
 * 0 (go on), 1 (refused: *ref says why, in vLLM's words), or BATON_ENOMEM.
 */
int baton_rtok_request(baton_rtok_local_t *L, const baton_pdreq_t *pd, baton_route_ctx_t *ctx,
                       baton_rtok_refusal_t *ref);

/* vLLM's check: n prompt tokens >= max_len, or n + max_tokens > max_len (max_tokens -1: not
 * given). 1 and *ref filled when refused; max_len 0: never. */
int baton_rtok_context_check(uint64_t max_len, size_t n, int64_t max_tokens,
                             baton_rtok_refusal_t *ref);

/*
 * POST /tokenize (detok 0) or /detokenize (1) with vLLM's request and response shapes, when
 * the router has the body's model's tokenizer: 0 and *resp, 1 (a bad request: *ref), or
 * BATON_ENOTFOUND (no tokenizer for that model: the caller forwards it to a worker),
 * BATON_ENOMEM.
 */
int baton_rtok_api(baton_rtok_local_t *L, int detok, const char *body, size_t len,
                   struct json_t **resp, baton_rtok_refusal_t *ref);

#endif
