/* json_scan.h — a validating one-pass JSON scanner (no tree, no per-value allocation), readers
 * for the values it validated, and top-level member splicing into scatter-gather segments. */
#ifndef BATON_COMMON_JSON_SCAN_H
#define BATON_COMMON_JSON_SCAN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "common/buf.h"

/*
 * What the scanner accepts: EXACTLY what jansson's json_loadb(buf, len, JSON_DECODE_ANY, ...)
 * accepts (the router's previous parse; fuzz/fuzz_json_scan.c checks the two agree), i.e.
 *  - RFC 8259 grammar for any value at the top (object, array, string, number, literal), with
 *    optional whitespace (space, \t, \n, \r) before and after it; any other trailing byte, a NUL
 *    included, is rejected ("end of file expected"). Empty or whitespace-only input is rejected.
 *  - NUL bytes are rejected everywhere but one place: ONE NUL right after a number or a literal
 *    (true/false/null) is skipped, as jansson's lexer loses a NUL it pushes back after reading
 *    one byte ahead ("[1\0]", "12\0", "true\0 " are accepted; "0\0\0", "{}\0", "\"a\0\""
 *    are not). Value spans never include it, and splicing leaves it out.
 *  - depth: jansson counts every value, scalars included, the top-level one being depth 1, and
 *    rejects depth > 2048 (JSON_PARSER_MAX_DEPTH in libjansson 2.14, Debian 12): 2047 nested
 *    arrays around a scalar pass, 2048 do not; 2048 nested empty arrays pass.
 *  - UTF-8: strings must be valid UTF-8 — no overlong forms (C0, C1, E0 80..9F, F0 80..8F), no
 *    encoded surrogates (ED A0..BF), nothing above U+10FFFF (F4 90.., F5..FF), no stray or
 *    missing continuation bytes. Non-ASCII bytes outside strings are invalid tokens anyway.
 *  - strings: raw control characters (bytes 0x00..0x1F) rejected; escapes \" \\ \/ \b \f \n \r
 *    \t and \uXXXX (hex, either case); a high surrogate \uD800..\uDBFF must be followed at once by
 *    a low one \uDC00..\uDFFF written as \uXXXX, a lone low surrogate is rejected; \u0000 is
 *    rejected in values and in keys (no JSON_ALLOW_NUL).
 *  - numbers: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?; without '.', 'e' or 'E' it is an
 *    integer and must fit json_int_t (int64: "too big integer" / "too big negative integer");
 *    otherwise a real, rejected when strtod overflows to ±HUGE_VAL ("real number overflow";
 *    underflow to 0 or a denormal passes). "-0" is the integer 0.
 *  - literals true, false, null (lower case, nothing glued to them).
 *  - duplicate keys are accepted; the LAST one wins (jansson without JSON_REJECT_DUPLICATES).
 *    The scan index keeps every member in order; the lookups below return the last match.
 * Keys are compared DECODED ("\u0073tream" is "stream").
 *
 * Plain data: no loop, no locks, no global state. A scan borrows the caller's bytes, which must
 * outlive it and every value or segment taken from it.
 */

typedef enum {
    BATON_JSON_OBJECT = 0, /* the same order as jansson's json_type */
    BATON_JSON_ARRAY,
    BATON_JSON_STRING,
    BATON_JSON_INTEGER,
    BATON_JSON_REAL,
    BATON_JSON_TRUE,
    BATON_JSON_FALSE,
    BATON_JSON_NULL,
} baton_json_type_t;

/* A validated value: p[0..len) is exactly its bytes (a string's quotes included). */
typedef struct baton_json_val_s {
    const char *p;
    size_t len;
    baton_json_type_t type;
} baton_json_val_t;

typedef struct baton_json_member_s {
    baton_json_val_t key; /* a STRING */
    baton_json_val_t val;
} baton_json_member_t;

typedef struct baton_json_scan_s {
    baton_json_val_t root;        /* the top-level value */
    baton_json_member_t *members; /* root's members when it is an object, in order, duplicates
                                     included; NULL/0 otherwise */
    size_t n_members;
    size_t cap;
    baton_json_member_t *heap; /* storage grown past the caller's space; freed by _free */
    size_t err_pos;            /* on failure: the byte offset where the input went wrong */
    const char *err_text;      /* on failure: a static description */
    int nul_skipped;           /* the input had a NUL jansson ignores (below) */
} baton_json_scan_t;

/*
 * Sets up a scan that records members into space[0..cap) (cap may be 0) and grows onto the heap
 * past that. A scan may be reused for another input after baton_json_scan_free.
 */
void baton_json_scan_init(baton_json_scan_t *s, baton_json_member_t *space, size_t cap);

/* Validates buf[0..len). 0, BATON_EINVAL (err_pos, err_text set) or BATON_ENOMEM. */
int baton_json_scan(baton_json_scan_t *s, const char *buf, size_t len);

/* Frees what the scan grew onto the heap; the caller's space is left alone. */
void baton_json_scan_free(baton_json_scan_t *s);

/* The last top-level member whose decoded key is `key`, or NULL. */
const baton_json_member_t *baton_json_scan_get(const baton_json_scan_t *s, const char *key);

/* ---- readers: only for values this scanner validated ---- */

/* 1 when the STRING value decodes to exactly key[0..strlen(key)). */
int baton_json_str_eq(const baton_json_val_t *str, const char *key);
/* Appends the decoded STRING value (escapes resolved, UTF-8) to out. 0 or BATON_ENOMEM. */
int baton_json_str_append(const baton_json_val_t *str, baton_buf_t *out);
/* The decoded length of a STRING value. */
size_t baton_json_str_len(const baton_json_val_t *str);

/* An INTEGER's value (it fits: the scan checked). */
int64_t baton_json_int(const baton_json_val_t *v);
/* An INTEGER's or REAL's value as a double (strtod, as jansson reads it). */
double baton_json_number(const baton_json_val_t *v);

/* Iterating an ARRAY's elements or an OBJECT's members. */
typedef struct baton_json_iter_s {
    const char *p, *end;
} baton_json_iter_t;

void baton_json_iter_init(baton_json_iter_t *it, const baton_json_val_t *container);
/* 1 and the next element, or 0 at the end. */
int baton_json_array_next(baton_json_iter_t *it, baton_json_val_t *elem);
/* 1 and the next member (duplicates included), or 0 at the end. */
int baton_json_object_next(baton_json_iter_t *it, baton_json_val_t *key, baton_json_val_t *val);
size_t baton_json_array_size(const baton_json_val_t *arr);
/* The last member of OBJECT `obj` named `key` (decoded): 1 and *out, or 0 (also when obj is
 * not an object). */
int baton_json_object_get(const baton_json_val_t *obj, const char *key, baton_json_val_t *out);

/* ---- splicing the top-level object ---- */

#define BATON_JSON_SPLICE_INLINE 8

/*
 * A body as scatter-gather segments: the scanned object's own bytes (borrowed) with some members
 * left out, then a caller-owned tail. Segments in `iov` (inline for the common case; `n` of them)
 * are ready for writev(); `total` is their summed length.
 */
typedef struct baton_json_splice_s {
    struct iovec inline_iov[BATON_JSON_SPLICE_INLINE];
    struct iovec *iov;
    size_t n;
    size_t cap;
    size_t total;
} baton_json_splice_t;

/*
 * Builds sp from the scanned top-level OBJECT: its bytes minus every member whose decoded key is
 * one of drop[0..n_drop) (every duplicate of it), followed by `tail`, which closes the object:
 * "}" or ",\"k\":v,...}" (its leading comma is skipped when no member is kept). Bytes before the
 * object and after it (whitespace) are not included. `tail` and the scanned bytes must outlive
 * sp. sp is (re)initialised here; free it with baton_json_splice_free. 0, BATON_EINVAL (the root
 * is not an object, or the tail does not start with ',' or '}') or BATON_ENOMEM.
 */
int baton_json_splice(const baton_json_scan_t *s, const char *const *drop, size_t n_drop,
                      const char *tail, size_t tail_len, baton_json_splice_t *sp);

/* Copies the segments into out (replacing what was there): one memcpy each. 0 or BATON_ENOMEM. */
int baton_json_splice_flatten(const baton_json_splice_t *sp, baton_buf_t *out);

void baton_json_splice_free(baton_json_splice_t *sp);

#endif
