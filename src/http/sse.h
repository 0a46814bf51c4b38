/* sse.h — Server-Sent Events framing: splitting a stream into events, the mid-stream error. */
#ifndef BATON_HTTP_SSE_H
#define BATON_HTTP_SSE_H

#include <stddef.h>

#include "common/buf.h"

/*
 * Called with the data payload of one event (the "data:" lines joined with '\n', the space after
 * the colon removed), not NUL-terminated. Return non-zero to stop.
 */
typedef int (*baton_sse_event_cb)(const char *payload, size_t len, void *arg);

/* Walks the complete events of a whole SSE body. Returns the callback's non-zero result or 0. */
int baton_sse_each(const char *body, size_t len, baton_sse_event_cb cb, void *arg);

/*
 * Incremental splitter for a stream arriving in arbitrary chunks. Bytes not yet forming a
 * complete event (terminated by a blank line) are kept in `pending`.
 */
typedef struct baton_sse_splitter_s {
    baton_buf_t pending;
    size_t scan;       /* bytes of `pending` already scanned */
    size_t line_start; /* start of the current line in `pending` */
} baton_sse_splitter_t;

#define BATON_SSE_SPLITTER_INIT                                                                    \
    {                                                                                              \
        BATON_BUF_INIT, 0, 0                                                                       \
    }

/*
 * Feeds bytes; calls raw_cb(event_bytes, len, arg) for each complete event with its raw bytes,
 * blank-line terminator included, in order. Returns 0, BATON_ENOMEM, or the callback's non-zero
 * result (then the rest of the input is dropped).
 */
int baton_sse_feed(baton_sse_splitter_t *s, const char *data, size_t len, baton_sse_event_cb raw_cb,
                   void *arg);

/* Bytes held back (an incomplete event). */
static inline size_t baton_sse_pending(const baton_sse_splitter_t *s)
{
    return s->pending.len;
}

void baton_sse_splitter_free(baton_sse_splitter_t *s);

/*
 * The payload of a raw event when it has exactly one "data:" line (the common case); sets
 * *payload_p and *len_p into `raw` and returns 1, else 0.
 */
int baton_sse_single_data(const char *raw, size_t len, const char **payload_p, size_t *len_p);

/*
 * Appends `data: {"error":{"message":…,"type":…,"code":…}}\n\ndata: [DONE]\n\n` (valid JSON,
 * escaped). 0 or BATON_ENOMEM.
 */
int baton_sse_error_event(baton_buf_t *out, const char *message, const char *type,
                          const char *code);

#endif
