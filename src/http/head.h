/* head.h — one HTTP message head as llhttp delivers it (server requests and client responses). */
#ifndef BATON_HTTP_HEAD_H
#define BATON_HTTP_HEAD_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "http/common.h"

/*
 * llhttp hands a head over in pieces (a name or value may be split across reads). They are
 * copied into one arena, each NUL-terminated, and each header is recorded as a pair of offsets
 * into it, because the arena may move while it grows. baton__http_head_finish() turns the
 * offsets into baton_http_header_t pointers once the head is complete; from then on the arena
 * must not move: trailers of a chunked body (reported through the same llhttp callbacks) are
 * counted against the byte limit and dropped (the trailer guard; the HTTP fuzz harness found
 * the dangling pointers a growing arena leaves).
 *
 * Ownership: the arena and the table belong to the head's owner (the server's connection, the
 * client's request), which may hand their storage in (a reused buffer) before
 * baton__http_head_begin() and takes it back after; the pointers that finish() hands out are
 * valid until the next begin() or until the owner frees the buffers. Runs on the loop that
 * parses; nothing here is thread-safe.
 */
typedef struct baton__http_head_s {
    baton_buf_t arena; /* the request target (server), header names and values */
    baton_buf_t hdrs;  /* offset pairs while parsing, then the header array after them */
    size_t n_hdrs;
    size_t bytes;          /* the head's size on the wire, counted against max_bytes */
    size_t max_bytes;      /* over it: BATON__HEAD_TOO_LARGE */
    size_t max_headers;    /* over it: BATON__HEAD_TOO_MANY */
    unsigned in_field : 1; /* inside a header name */
    unsigned done : 1;     /* finish() ran: later fields are trailers */
} baton__http_head_t;

/* What the calls below return besides 0; the caller answers each its own way (431, 500, -1). */
enum {
    BATON__HEAD_TOO_LARGE = -1, /* the head passed max_bytes */
    BATON__HEAD_TOO_MANY = -2,  /* more than max_headers headers */
    BATON__HEAD_NOMEM = -3,
};

/* Empties the head (keeps the buffers' storage) for a new message with these limits. */
void baton__http_head_begin(baton__http_head_t *h, size_t max_bytes, size_t max_headers);

/* The offsets of one header while the head is parsed (the arena may still move). */
typedef struct baton__http_hdr_off_s {
    uint32_t name;
    uint32_t value; /* BATON__HEAD_NO_VALUE until the value starts */
} baton__http_hdr_off_t;

#define BATON__HEAD_NO_VALUE UINT32_MAX

/* The calls below run for every piece of every head llhttp reports (several per request on the
 * router's hot path): inline, so a callback costs no call of its own. */

static inline int baton__http_head_count(baton__http_head_t *h, size_t len)
{
    h->bytes += len;
    return h->bytes > h->max_bytes ? BATON__HEAD_TOO_LARGE : 0;
}

/* Raw bytes of the head (the request target, its NUL) appended to the arena and counted. */
static inline int baton__http_head_append(baton__http_head_t *h, const char *at, size_t len)
{
    if (baton__http_head_count(h, len) != 0)
        return BATON__HEAD_TOO_LARGE;
    return baton_buf_append(&h->arena, at, len) == 0 ? 0 : BATON__HEAD_NOMEM;
}

/* The llhttp callbacks of the same names, for header fields and values (and trailers: after
 * finish() they are counted and dropped). */
static inline int baton__http_head_field(baton__http_head_t *h, const char *at, size_t len)
{
    if (h->done) /* a trailer */
        return baton__http_head_count(h, len);
    if (!h->in_field) {
        if (h->n_hdrs >= h->max_headers)
            return BATON__HEAD_TOO_MANY;
        baton__http_hdr_off_t o = {(uint32_t)h->arena.len, BATON__HEAD_NO_VALUE};
        if (baton_buf_append(&h->hdrs, &o, sizeof(o)) != 0)
            return BATON__HEAD_NOMEM;
        h->n_hdrs++;
        h->in_field = 1;
        if (baton__http_head_count(h, 4) != 0) /* ": " and CRLF */
            return BATON__HEAD_TOO_LARGE;
    }
    return baton__http_head_append(h, at, len);
}

static inline int baton__http_head_field_done(baton__http_head_t *h)
{
    if (h->done)
        return 0;
    h->in_field = 0;
    return baton__http_head_append(h, "", 1);
}

/* The value of the last header starts here when it has not started yet. */
static inline void baton__http_head_value_start(baton__http_head_t *h)
{
    baton__http_hdr_off_t *o = (baton__http_hdr_off_t *)h->hdrs.data + (h->n_hdrs - 1);
    if (o->value == BATON__HEAD_NO_VALUE)
        o->value = (uint32_t)h->arena.len;
}

static inline int baton__http_head_value(baton__http_head_t *h, const char *at, size_t len)
{
    if (h->done || h->n_hdrs == 0) /* a trailer; llhttp reports no value before a name */
        return baton__http_head_count(h, len);
    baton__http_head_value_start(h);
    return baton__http_head_append(h, at, len);
}

static inline int baton__http_head_value_done(baton__http_head_t *h)
{
    if (h->done || h->n_hdrs == 0)
        return 0;
    baton__http_head_value_start(h);
    return baton__http_head_append(h, "", 1);
}

/* The head is complete: *headers_p (NULL when none) and *n_p are the headers, pointing into the
 * arena; later fields are trailers. 0 or BATON__HEAD_NOMEM. */
int baton__http_head_finish(baton__http_head_t *h, const baton_http_header_t **headers_p,
                            size_t *n_p);

#endif
