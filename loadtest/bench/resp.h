/* resp.h — baton-bench response reading: SSE chunks or a whole JSON body into token timings. */
#ifndef BATON_BENCH_RESP_H
#define BATON_BENCH_RESP_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "http/sse.h"
#include "stats.h"

typedef enum {
    BB_EP_CHAT = 0,    /* POST /v1/chat/completions */
    BB_EP_COMPLETIONS, /* POST /v1/completions */
    BB_EP_GENERATE,    /* POST /generate (SGLang native) */
} bb_endpoint_t;

/* Why a request failed; one counter each in the results. */
#define BB_ERR_MAP(XX)                                                                             \
    XX(NONE, "none")                                                                               \
    XX(CONNECT, "connect")           /* TCP connect failed */                                      \
    XX(HTTP, "http_status")          /* a status other than 200 (counted per status too) */        \
    XX(EOF, "closed_early")          /* the server closed before the response ended */             \
    XX(IO, "io")                     /* read/write error (reset, ...) */                           \
    XX(TIMEOUT, "timeout")           /* --timeout exceeded */                                      \
    XX(STREAM, "error_event")        /* an SSE error event, or an "error" object in a 200 body */  \
    XX(BAD_RESPONSE, "bad_response") /* not HTTP, not JSON, no [DONE], ... */                      \
    XX(NO_CONTENT, "no_content")     /* 200 but no generated text at all */                        \
    XX(CANCELED, "canceled")         /* interrupted (Ctrl-C) */

typedef enum {
#define XX(name, str) BB_ERR_##name,
    BB_ERR_MAP(XX)
#undef XX
        BB_ERR_COUNT
} bb_err_kind_t;

const char *bb_err_kind_name(bb_err_kind_t k);
const char *bb_endpoint_name(bb_endpoint_t ep);
/* "/v1/chat/completions", "/v1/completions", "/generate" */
const char *bb_endpoint_path(bb_endpoint_t ep);

/*
 * One response's reader. Feed it the de-chunked body bytes of a 200 response as they arrive,
 * each read with its arrival time; then call bb_resp_finish. Chunk boundaries may fall
 * anywhere (the SSE splitter keeps partial events).
 *
 * A "content chunk" is an SSE event carrying non-empty generated text, as SGLang's
 * bench_serving counts them: chat choices[0].delta.content, completions choices[0].text,
 * /generate growth of the cumulative "text". The first one gives TTFT; the gaps between
 * consecutive ones are the ITLs.
 */
typedef struct bb_resp_s {
    bb_endpoint_t ep;
    int stream;
    int keep_text; /* collect the generated text (multi-turn needs it) */

    baton_sse_splitter_t sse;
    baton_buf_t body; /* non-streaming: the whole body */
    baton_buf_t text; /* the generated text (kept when keep_text, for /generate, non-streaming) */

    uint64_t t_first, t_last; /* arrival (ns) of the first / latest content chunk; 0 = none */
    uint32_t n_chunks;        /* content chunks */
    int64_t usage_tokens;     /* completion tokens from usage / meta_info; -1 = not given */
    int64_t usage_prompt;     /* prompt tokens from usage / meta_info; -1 = not given */
    int64_t usage_cached;     /* cached prompt tokens (prompt_tokens_details / meta_info) */
    int done_seen;            /* "data: [DONE]" seen */
    bb_vec_t itl_ms;          /* gaps between consecutive content chunks, in ms */

    bb_err_kind_t err;
    char err_msg[160];
} bb_resp_t;

void bb_resp_init(bb_resp_t *r, bb_endpoint_t ep, int stream, int keep_text);
/* 0, or BATON_ENOMEM (the response is then marked failed). Bytes after an error are ignored. */
int bb_resp_feed(bb_resp_t *r, const char *data, size_t len, uint64_t t_ns);
/*
 * The body ended at t_ns. Non-streaming: parses the JSON (the whole body is one chunk arriving
 * at t_ns). Sets err when the response carried an error or no text.
 */
void bb_resp_finish(bb_resp_t *r, uint64_t t_ns);
/* Output tokens: usage when the server reported it, else content chunks (streaming) or the
 * words of the text (non-streaming). */
uint32_t bb_resp_output_tokens(const bb_resp_t *r);
void bb_resp_free(bb_resp_t *r);

/* Runs of non-whitespace: the simulated worker's token count, and the bench's estimate. */
uint32_t bb_count_words(const char *s, size_t len);

#endif
