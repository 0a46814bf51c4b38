/* render.h — the worker's response bodies: whole JSON answers and SSE events for the three APIs. */
#ifndef BATON_WORKER_RENDER_H
#define BATON_WORKER_RENDER_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "worker/request.h"
#include "worker/simtext.h"

typedef struct wk_render_ctx_s {
    const char *id;     /* "chatcmpl-…", "cmpl-…"; /generate: the default meta_info.id */
    const char *model;  /* model name to report */
    long long created;  /* unix seconds */
    int input_logprobs; /* /generate: include prompt logprobs (0 on a PD decode: they are []) */
    double e2e_s;       /* /generate meta_info.e2e_latency */
    uint32_t *seq;      /* Responses API stream: the next event's sequence_number (counted up) */
} wk_render_ctx_t;

/* What one sequence has streamed so far. Zero-initialise. */
typedef struct wk_stream_state_s {
    size_t sent_bytes;    /* text bytes sent */
    uint32_t sent_tokens; /* tokens whose logprobs / ids were sent */
    int started;          /* chat: the role chunk went out */
    int finished;         /* the final chunk went out */
} wk_stream_state_t;

/* gens[i] belongs to req->items[i]; all finished. Appends the non-streaming body. */
int wk_render_full(const wk_render_ctx_t *ctx, const wk_request_t *req, const wk_gen_t *const *gens,
                   baton_buf_t *out);

/* Appends the SSE events ("data: …\n\n") that bring the client up to date with item i. */
int wk_render_stream_progress(const wk_render_ctx_t *ctx, const wk_request_t *req, size_t i,
                              const wk_gen_t *gen, wk_stream_state_t *st, baton_buf_t *out);

/* After every item finished: the usage chunk (OpenAI APIs, stream_options.include_usage) and
 * "data: [DONE]". */
int wk_render_stream_tail(const wk_render_ctx_t *ctx, const wk_request_t *req,
                          const wk_gen_t *const *gens, baton_buf_t *out);

/* A mid-stream error: data: {"error":{"message","type","code"}} then data: [DONE]. */
int wk_render_stream_error(const char *message, const char *type, const char *code,
                           baton_buf_t *out);

/* The Responses API's renderings (render_responses.c): the response object, the stream's typed
 * events as text arrives (the first call adds response.created and the output item's start),
 * the closing events with response.completed (or response.incomplete at max_output_tokens), and
 * a mid-stream error event. One sequence per request. */
int wk_render_responses_full(const wk_render_ctx_t *ctx, const wk_request_t *req,
                             const wk_gen_t *const *gens, baton_buf_t *out);
int wk_render_responses_progress(const wk_render_ctx_t *ctx, const wk_request_t *req,
                                 const wk_gen_t *g, wk_stream_state_t *st, baton_buf_t *out);
int wk_render_responses_tail(const wk_render_ctx_t *ctx, const wk_request_t *req,
                             const wk_gen_t *const *gens, baton_buf_t *out);
int wk_render_responses_error(const wk_render_ctx_t *ctx, const char *message, const char *code,
                              baton_buf_t *out);

/* Usage numbers: prompt tokens count once per prompt (not per choice). */
void wk_render_usage(const wk_request_t *req, const wk_gen_t *const *gens, uint64_t *prompt_p,
                     uint64_t *completion_p);

#endif
