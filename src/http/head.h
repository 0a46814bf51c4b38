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

/* Raw bytes of the head (the request target, its NUL) appended to the arena and counted. */
int baton__http_head_append(baton__http_head_t *h, const char *at, size_t len);

/* The llhttp callbacks of the same names, for header fields and values (and trailers). */
int baton__http_head_field(baton__http_head_t *h, const char *at, size_t len);
int baton__http_head_field_done(baton__http_head_t *h);
int baton__http_head_value(baton__http_head_t *h, const char *at, size_t len);
int baton__http_head_value_done(baton__http_head_t *h);

/* The head is complete: *headers_p (NULL when none) and *n_p are the headers, pointing into the
 * arena; later fields are trailers. 0 or BATON__HEAD_NOMEM. */
int baton__http_head_finish(baton__http_head_t *h, const baton_http_header_t **headers_p,
                            size_t *n_p);

#endif
