/* buf.h — a growable byte buffer; the owner frees it with baton_buf_free. */
#ifndef BATON_COMMON_BUF_H
#define BATON_COMMON_BUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *data; /* always NUL-terminated when non-NULL (len excludes the NUL) */
    size_t len;
    size_t cap;
} baton_buf_t;

#define BATON_BUF_INIT                                                                             \
    {                                                                                              \
        NULL, 0, 0                                                                                 \
    }

/* All return 0 or BATON_ENOMEM; on failure the buffer is unchanged. */
int baton_buf_reserve(baton_buf_t *b, size_t extra);
int baton_buf_append(baton_buf_t *b, const void *data, size_t len);
int baton_buf_append_str(baton_buf_t *b, const char *s);
int baton_buf_printf(baton_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* v in base 10 or 16 (lower case) into out (room for 20 bytes), no NUL; returns its length. By
 * hand: snprintf costs ~600 instructions, and the HTTP hot path formats numbers per request. */
size_t baton_fmt_uint(char *out, uint64_t v, unsigned base);
/* The value of hex digit c (either case), or -1. */
int baton_hex_value(int c);
/* Appends v in decimal. 0 or BATON_ENOMEM. */
int baton_buf_append_uint(baton_buf_t *b, uint64_t v);
/* Appends s[0..len) as a JSON string literal, quotes included: '"', '\\' and control characters
 * escaped (\n \r \t by name, the rest as \u00XX), every other byte (UTF-8 included) as it is.
 * 0 or BATON_ENOMEM; unlike the calls above, a failure may leave part of it appended. */
int baton_buf_append_json_string(baton_buf_t *b, const char *s, size_t len);
/* Drops the first n bytes (n <= len). */
void baton_buf_consume(baton_buf_t *b, size_t n);
void baton_buf_reset(baton_buf_t *b);
/* Hands the storage to the caller (free() it); the buffer becomes empty. */
char *baton_buf_steal(baton_buf_t *b, size_t *len_p);
void baton_buf_free(baton_buf_t *b);

#endif
