/* pdreq.h — a client request body for the PD router: validation, batch size, bootstrap
 * injection as a splice of the client's bytes, and prefill→decode logprob merging. */
#ifndef BATON_ROUTER_PDREQ_H
#define BATON_ROUTER_PDREQ_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/buf.h"
#include "common/json_scan.h"

/*
 * The body is scanned once (common/json_scan.h: validated exactly as jansson would, no tree, no
 * per-value allocation), validated for its API, and its top-level members indexed, so every
 * attempt's body is a splice of the client's own bytes: some top-level members left out, a few
 * appended. The body bytes are BORROWED: they must stay valid and unchanged while the
 * baton_pdreq_t builds bodies (the router's request owns them until it is finished). Everything
 * here is plain data: no loop, no locks; a baton_pdreq_t belongs to the one request (and thread)
 * that parsed it.
 *
 * Batch rule (what makes bootstrap_host/port/room arrays): one room per generated sequence,
 * i.e. prompts × n, where "prompts" counts the elements of a prompt list:
 *   chat         n > 1                                       → n
 *   completions  prompt an array of strings or of int arrays → its length × n; else n > 1 → n
 *   generate     text an array, or input_ids an array of int arrays → its length × n;
 *                else sampling_params.n > 1 → n  (n from an object sampling_params)
 * A flat int array (`prompt: [1,2,3]`, `input_ids: [1,2,3]`) is ONE prompt, not a batch.
 * A list of length 1 (`prompt: ["x"]`) is still a batch (arrays of length 1), because the
 * engine sees a list there too. (SGLang's own router uses n alone when n > 1, else the list
 * length; the two agree except for a prompt list with n > 1, where an engine expands the list
 * × n and needs a room for each sequence.)
 */

typedef enum {
    BATON_API_CHAT = 0,    /* POST /v1/chat/completions */
    BATON_API_COMPLETIONS, /* POST /v1/completions */
    BATON_API_GENERATE,    /* POST /generate (SGLang native) */
    BATON_API_RESPONSES,   /* POST /v1/responses (OpenAI Responses API): never a batch */
    /* Regular mode only (baton_api_regular_only): no generation to split into PD legs. */
    BATON_API_EMBEDDINGS, /* POST /v1/embeddings */
    BATON_API_RERANK,     /* POST /v1/rerank */
    BATON_API_SCORE,      /* POST /v1/score */
    BATON_API_TOKENIZE,   /* POST /tokenize (vLLM), when the router has no tokenizer for it */
    BATON_API_DETOKENIZE, /* POST /detokenize (vLLM), likewise */
    BATON_API__COUNT,
} baton_api_t;

/* The route path of an API ("/v1/chat/completions", ...). */
const char *baton_api_path(baton_api_t api);
/* 1 for the APIs served by regular workers only (embeddings, rerank, score). */
int baton_api_regular_only(baton_api_t api);

/* A validation failure, ready for baton_http_respond_error(). */
typedef struct baton_pdreq_error_s {
    int status; /* 400 */
    char message[256];
    char param[64];   /* the offending parameter, "" when none */
    const char *code; /* "invalid_json", "missing_parameter", "invalid_type", "invalid_value" */
} baton_pdreq_error_t;

/* Largest batch accepted (bounds the injected arrays). */
#define BATON_PDREQ_MAX_BATCH 4096

/* Top-level members indexed without a heap allocation (more go to the heap). */
#define BATON_PDREQ_INLINE_MEMBERS 32

typedef struct baton_pdreq_s {
    baton_api_t api;
    const char *body; /* the client's bytes (borrowed); NULL when nothing was parsed */
    size_t body_len;
    baton_json_scan_t scan; /* the body's top-level members (an object) */
    baton_json_member_t members[BATON_PDREQ_INLINE_MEMBERS];
    size_t batch;             /* 0 for a single request, else the batch length (>= 1) */
    int stream;               /* "stream": true */
    int logprobs;             /* logprobs asked: merge prefill's input_token_logprobs */
    baton_buf_t tail;         /* the injected members and the closing brace */
    const baton_buf_t *extra; /* more members every injection appends after its own (a stream's
                               * continuation: migrate.h), ",..." form; NULL or empty: none */
    baton_json_splice_t segs; /* after an injection: the body to send, as segments */
    baton_buf_t out;          /* the body after baton_pdreq_inject(): segs flattened */
} baton_pdreq_t;

/*
 * Parses and validates body[0..len) (borrowed: see above). On success returns 0 and fills *r
 * (free it with baton_pdreq_free). On bad input returns BATON_EINVAL and fills *err (r holds
 * nothing: r->body is NULL). BATON_ENOMEM on allocation failure. The error for bad JSON carries
 * jansson's own wording (line, column, text): only that rare path builds a jansson tree.
 */
int baton_pdreq_parse(baton_pdreq_t *r, baton_api_t api, const char *body, size_t len,
                      baton_pdreq_error_t *err);

/* Moves a parsed request to another place (it points into itself); src is left empty. */
void baton_pdreq_move(baton_pdreq_t *dst, baton_pdreq_t *src);

/* The last top-level member named `key` (decoded), or NULL. */
const baton_json_val_t *baton_pdreq_get(const baton_pdreq_t *r, const char *key);

/* Rooms needed for one injection: max(batch, 1). */
static inline size_t baton_pdreq_n_rooms(const baton_pdreq_t *r)
{
    return r->batch ? r->batch : 1;
}

/* The members every injection replaces: bootstrap_host, bootstrap_port, bootstrap_room. */
extern const char *const baton_pdreq_bootstrap_keys[3];

/*
 * Appends `"bootstrap_host":H,"bootstrap_port":P,"bootstrap_room":R` to out — arrays of the
 * batch length for a batch — with bootstrap_port < 0 written as null and rooms[0..n_rooms) (drawn
 * with baton_bootstrap_room()) masked to [0, 2^63-1]. 0 or BATON_ENOMEM.
 */
int baton_pdreq_bootstrap_members(const baton_pdreq_t *r, const char *host, int bootstrap_port,
                                  const uint64_t *rooms, baton_buf_t *out);

/*
 * The client's body as segments (json_scan.h's splice): every top-level member whose decoded key
 * is in drop[0..n_drop) left out, all duplicates of it, then `tail` (","k":v,...}" or "}"),
 * which must outlive sp. 0, BATON_ENOMEM.
 */
int baton_pdreq_splice(const baton_pdreq_t *r, const char *const *drop, size_t n_drop,
                       const char *tail, size_t tail_len, baton_json_splice_t *sp);

/*
 * Injects bootstrap_host, bootstrap_port and bootstrap_room (baton_pdreq_bootstrap_members),
 * and r->extra's members when set (a client's own baton_continuation is always left out),
 * replacing every one the client sent, as a splice: r->segs is the client's bytes without those
 * members plus the injected tail (r->tail). The same bytes go to both legs. Safe to call again
 * for a retry with a new pair. 0 or BATON_ENOMEM.
 */
int baton_pdreq_inject_segs(baton_pdreq_t *r, const char *host, int bootstrap_port,
                            const uint64_t *rooms);

/* baton_pdreq_inject_segs, then r->segs flattened into r->out (replacing what was there): one
 * memcpy per segment, for senders without scatter-gather writes. 0 or BATON_ENOMEM. */
int baton_pdreq_inject(baton_pdreq_t *r, const char *host, int bootstrap_port,
                       const uint64_t *rooms);

void baton_pdreq_free(baton_pdreq_t *r);

/* Serializes j compactly into out (replacing what was there). 0 or BATON_ENOMEM. */
int baton_pdreq_dump(const json_t *j, baton_buf_t *out);

/* ---- logprob merging ---- */

/*
 * Prefill's input logprobs, extracted from prefill's complete response body (a JSON object, a
 * JSON array for a batch, or an SSE stream of JSON events). Keyed by element index: a JSON array
 * body gives index i to element i; SSE events use their "index" field (0 when absent), the first
 * event carrying meta_info.input_token_logprobs per index wins. Returns NULL when there are none
 * (or the body is not understood); free with baton_pdreq_lp_free.
 */
typedef struct baton_pdreq_lp_s baton_pdreq_lp_t;
baton_pdreq_lp_t *baton_pdreq_lp_extract(const char *body, size_t len);
void baton_pdreq_lp_free(baton_pdreq_lp_t *lp);

/*
 * Non-streaming merge: decode's body (object or batch array) with prefill's logprobs put in
 * front of decode's meta_info.input_token_logprobs, per element, where both have that array.
 * Returns 1 and fills `out` when something was merged; 0 when nothing to merge (use decode's
 * body as is); BATON_ENOMEM.
 */
int baton_pdreq_merge_body(const baton_pdreq_lp_t *lp, const char *decode_body, size_t len,
                           baton_buf_t *out);

/*
 * Streaming merge of one SSE event payload (the JSON after "data: "): prefill's logprobs for the
 * event's index go in front of its meta_info.input_token_logprobs, in the first event of that
 * index that has the array; lp then forgets that index, so its later events are left as they
 * are (every index alike, whatever the batch size). Returns 1 and fills `out` with the new
 * payload when merged; 0 when the event is left as is; BATON_ENOMEM.
 */
int baton_pdreq_merge_event(baton_pdreq_lp_t *lp, const char *payload, size_t len,
                            baton_buf_t *out);

#endif
