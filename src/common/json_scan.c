/* json_scan.c — the one-pass validating JSON scanner, its readers and top-level splicing (the
 * acceptance rules, jansson's, are in json_scan.h). */
#include "common/json_scan.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/buf.h"

/* jansson 2.14's JSON_PARSER_MAX_DEPTH: every value counts, the top-level one is depth 1. */
#define MAX_DEPTH 2048

#define ONES  0x0101010101010101ull
#define HIGHS 0x8080808080808080ull

static int is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && is_ws((unsigned char)*p))
        p++;
    return p;
}

static int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/* The code unit of the 4 hex digits at p (p + 4 <= end), or -1. */
static int hex4(const char *p, const char *end)
{
    int v = 0;
    if (end - p < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        int h = baton_hex_value((unsigned char)p[i]);
        if (h < 0)
            return -1;
        v = v << 4 | h;
    }
    return v;
}

/* 8 bytes with nothing a string scan must stop at: no '"', '\\', control byte or non-ASCII. */
static int plain8(const char *p)
{
    uint64_t v, q, b;
    memcpy(&v, p, 8);
    q = v ^ (ONES * '"');
    b = v ^ (ONES * '\\');
    /* (x - ONES) & ~x & HIGHS is non-zero iff some byte of x is zero; the same with 0x20 finds a
     * byte below 0x20 among bytes below 0x80, and v & HIGHS catches the others. */
    return (((q - ONES) & ~q) | ((b - ONES) & ~b) | ((v - ONES * 0x20) & ~v) | v) & HIGHS ? 0 : 1;
}

/* Length of the valid UTF-8 sequence at p (p[0] >= 0x80), or 0 (Unicode's table 3-7). */
static size_t utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0], lo = 0x80, hi = 0xBF;
    size_t n;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        n = 3;
    else if (c >= 0xF0 && c <= 0xF4)
        n = 4;
    else
        return 0;
    if (c == 0xE0)
        lo = 0xA0; /* overlong */
    else if (c == 0xED)
        hi = 0x9F; /* surrogates */
    else if (c == 0xF0)
        lo = 0x90; /* overlong */
    else if (c == 0xF4)
        hi = 0x8F; /* above U+10FFFF */
    if ((size_t)(end - p) < n || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

typedef struct scanner_s {
    const char *start, *end;
    const char *err_at;
    const char *err_text;
} scanner_t;

static const char *fail_at(scanner_t *sc, const char *at, const char *text)
{
    sc->err_at = at;
    sc->err_text = text;
    return NULL;
}

/* Validates the string whose opening quote is at p; returns the byte after its closing quote. */
static const char *scan_string(scanner_t *sc, const char *p)
{
    const char *end = sc->end;
    p++;
    for (;;) {
        while (end - p >= 8 && plain8(p))
            p += 8;
        if (p >= end)
            return fail_at(sc, p, "premature end of input");
        unsigned char c = (unsigned char)*p;
        if (c == '"')
            return p + 1;
        if (c < 0x20)
            return fail_at(sc, p, "control character in a string");
        if (c >= 0x80) {
            size_t n = utf8_len((const unsigned char *)p, (const unsigned char *)end);
            if (!n)
                return fail_at(sc, p, "invalid UTF-8");
            p += n;
            continue;
        }
        if (c != '\\') {
            p++;
            continue;
        }
        if (end - p < 2)
            return fail_at(sc, p, "premature end of input");
        c = (unsigned char)p[1];
        if (c != 'u') {
            if (c == 0 || !strchr("\"\\/bfnrt", c))
                return fail_at(sc, p, "invalid escape");
            p += 2;
            continue;
        }
        int u = hex4(p + 2, end);
        if (u < 0)
            return fail_at(sc, p, "invalid escape");
        if (u == 0)
            return fail_at(sc, p, "\\u0000 is not allowed");
        if (u >= 0xDC00 && u <= 0xDFFF)
            return fail_at(sc, p, "lone low surrogate");
        if (u >= 0xD800 && u <= 0xDBFF) {
            int lo = end - p >= 8 && p[6] == '\\' && p[7] == 'u' ? hex4(p + 8, end) : -1;
            if (lo < 0xDC00 || lo > 0xDFFF)
                return fail_at(sc, p, "high surrogate without a low one");
            p += 6;
        }
        p += 6;
    }
}

/* Whether the real at p[0..len) (grammar checked) overflows a double, as strtod reports it. */
static int real_overflows(const char *p, size_t len)
{
    const char *q = p, *end = p + len;
    int64_t lead = -1, exp = 0, pos = 0; /* lead: index of the first non-zero digit */
    int64_t int_digits = 0;
    if (*q == '-')
        q++;
    for (; q < end && is_digit((unsigned char)*q); q++, pos++, int_digits++)
        if (lead < 0 && *q != '0')
            lead = pos;
    if (q < end && *q == '.')
        for (q++; q < end && is_digit((unsigned char)*q); q++, pos++)
            if (lead < 0 && *q != '0')
                lead = pos;
    if (lead < 0)
        return 0;  /* zero mantissa: 0 whatever the exponent */
    if (q < end) { /* e or E */
        int neg = q[1] == '-';
        for (q += (q[1] == '-' || q[1] == '+') ? 2 : 1; q < end; q++)
            if (exp < 1000000000)
                exp = exp * 10 + (*q - '0');
        if (neg)
            exp = -exp;
    }
    /* The value lies in [10^m, 10^(m+1)); DBL_MAX is 1.79e308. */
    int64_t m = int_digits - 1 - lead + exp;
    if (m < 308)
        return 0;
    if (m > 308)
        return 1;
    char small[512], *buf = len < sizeof(small) ? small : malloc(len + 1);
    if (!buf)
        return 1; /* no memory for the rare borderline case: refuse rather than guess */
    memcpy(buf, p, len);
    buf[len] = '\0';
    errno = 0;
    double d = strtod(buf, NULL);
    int over = (d == HUGE_VAL || d == -HUGE_VAL) && errno == ERANGE;
    if (buf != small)
        free(buf);
    return over;
}

/* Validates the number at p; its type goes to *type. Returns the byte after it. */
static const char *scan_number(scanner_t *sc, const char *p, baton_json_type_t *type)
{
    const char *q = p, *end = sc->end, *digits;
    int real = 0;
    if (*q == '-')
        q++;
    digits = q;
    if (q >= end || !is_digit((unsigned char)*q))
        return fail_at(sc, p, "invalid number");
    if (*q == '0') {
        q++;
        if (q < end && is_digit((unsigned char)*q))
            return fail_at(sc, p, "invalid number");
    } else {
        while (q < end && is_digit((unsigned char)*q))
            q++;
    }
    size_t n_int = (size_t)(q - digits);
    if (q < end && *q == '.') {
        q++;
        if (q >= end || !is_digit((unsigned char)*q))
            return fail_at(sc, p, "invalid number");
        while (q < end && is_digit((unsigned char)*q))
            q++;
        real = 1;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '+' || *q == '-'))
            q++;
        if (q >= end || !is_digit((unsigned char)*q))
            return fail_at(sc, p, "invalid number");
        while (q < end && is_digit((unsigned char)*q))
            q++;
        real = 1;
    }
    if (real) {
        if (real_overflows(p, (size_t)(q - p)))
            return fail_at(sc, p, "real number overflow");
        *type = BATON_JSON_REAL;
        return q;
    }
    /* json_int_t is int64: 19 digits at most, and those compared with the limit. */
    static const char max_pos[] = "9223372036854775807", max_neg[] = "9223372036854775808";
    if (n_int > 19 || (n_int == 19 && memcmp(digits, *p == '-' ? max_neg : max_pos, 19) > 0))
        return fail_at(sc, p, "too big integer");
    *type = BATON_JSON_INTEGER;
    return q;
}

static int add_member(baton_json_scan_t *s, const baton_json_member_t *m)
{
    if (s->n_members == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        baton_json_member_t *h = realloc(s->heap, cap * sizeof(*h));
        if (!h)
            return BATON_ENOMEM;
        if (!s->heap && s->n_members)
            memcpy(h, s->members, s->n_members * sizeof(*h));
        s->heap = s->members = h;
        s->cap = cap;
    }
    s->members[s->n_members++] = *m;
    return 0;
}

void baton_json_scan_init(baton_json_scan_t *s, baton_json_member_t *space, size_t cap)
{
    memset(s, 0, sizeof(*s));
    s->members = space;
    s->cap = space ? cap : 0;
}

void baton_json_scan_free(baton_json_scan_t *s)
{
    if (s->heap) {
        free(s->heap);
        s->heap = NULL;
        s->members = NULL;
        s->cap = 0;
    }
    s->n_members = 0;
}

/*
 * One pass with an explicit stack (one bit per open container: object or array), so deep input
 * costs no C stack. Only members of a top-level object are recorded.
 */
int baton_json_scan(baton_json_scan_t *s, const char *buf, size_t len)
{
    scanner_t sc = {buf, buf + len, NULL, NULL};
    const char *p = buf, *end = buf + len, *vend = buf;
    uint8_t stack[MAX_DEPTH / 8 + 1]; /* bit set: an object */
    int depth = 0;                    /* containers open */
    int root_obj = 0;
    baton_json_member_t m = {{NULL, 0, BATON_JSON_NULL}, {NULL, 0, BATON_JSON_NULL}};
    baton_json_type_t type = BATON_JSON_NULL;

    s->n_members = 0;
    s->err_text = NULL;
    s->nul_skipped = 0;
    memset(&s->root, 0, sizeof(s->root));
    p = skip_ws(p, end);
    if (p >= end) {
        fail_at(&sc, p, "'[' or '{' expected");
        goto bad;
    }
    s->root.p = p;

value:
    if (depth + 1 > MAX_DEPTH) {
        fail_at(&sc, p, "maximum parsing depth reached");
        goto bad;
    }
    if (p >= end) {
        fail_at(&sc, p, "unexpected end of input");
        goto bad;
    }
    if (depth == 1 && root_obj)
        m.val.p = p;
    switch (*p) {
    case '{':
    case '[':
        if (*p == '{')
            stack[depth / 8] |= (uint8_t)(1u << (depth % 8));
        else
            stack[depth / 8] &= (uint8_t) ~(1u << (depth % 8));
        type = *p == '{' ? BATON_JSON_OBJECT : BATON_JSON_ARRAY;
        if (depth == 0) {
            s->root.type = type;
            root_obj = type == BATON_JSON_OBJECT;
        } else if (depth == 1 && root_obj) {
            m.val.type = type;
        }
        depth++;
        p = skip_ws(p + 1, end);
        if (p < end && *p == (type == BATON_JSON_OBJECT ? '}' : ']')) {
            p++;
            depth--;
            goto closed;
        }
        if (type == BATON_JSON_OBJECT)
            goto key;
        goto value;
    case '"':
        type = BATON_JSON_STRING;
        p = scan_string(&sc, p);
        break;
    case 't':
    case 'f':
    case 'n': {
        static const char *const lit[] = {"true", "false", "null"};
        int k = *p == 't' ? 0 : *p == 'f' ? 1 : 2;
        size_t n = strlen(lit[k]);
        if ((size_t)(end - p) < n || memcmp(p, lit[k], n) != 0) {
            fail_at(&sc, p, "invalid token");
            goto bad;
        }
        type = k == 0 ? BATON_JSON_TRUE : k == 1 ? BATON_JSON_FALSE : BATON_JSON_NULL;
        p += n;
        /* jansson reads a whole identifier: "truex" is one invalid token, not true + x */
        if (p < end && ((*p | 0x20) >= 'a' && (*p | 0x20) <= 'z')) {
            fail_at(&sc, p, "invalid token");
            goto bad;
        }
        break;
    }
    default:
        if (*p == '-' || is_digit((unsigned char)*p)) {
            p = scan_number(&sc, p, &type);
            break;
        }
        fail_at(&sc, p, "unexpected token");
        goto bad;
    }
    if (!p)
        goto bad;
    if (depth == 0)
        s->root.type = type;
    else if (depth == 1 && root_obj)
        m.val.type = type;
    vend = p;
    /* jansson's lexer reads one byte past a number or literal and pushes it back; a NUL pushed
     * back is lost (its one-byte look-ahead buffer reads as empty), so ONE NUL right after such a
     * token is skipped: "[1\0]" and "true\0" are accepted. Same here, to accept what it does. */
    if (type != BATON_JSON_STRING && p < end && *p == '\0') {
        p++;
        s->nul_skipped = 1;
    }
    goto after;

closed: /* a container ended at p */
    vend = p;

after: /* a value ended at vend (p: where scanning goes on); depth is its parent's */
    if (depth == 1 && root_obj) {
        m.val.len = (size_t)(vend - m.val.p);
        if (add_member(s, &m))
            return BATON_ENOMEM;
    }
    if (depth == 0) {
        s->root.len = (size_t)(vend - s->root.p);
        p = skip_ws(p, end);
        if (p != end) {
            fail_at(&sc, p, "end of file expected");
            goto bad;
        }
        return 0;
    }
    p = skip_ws(p, end);
    if (p >= end) {
        fail_at(&sc, p, "premature end of input");
        goto bad;
    }
    int in_obj = stack[(depth - 1) / 8] >> ((depth - 1) % 8) & 1;
    if (*p == ',') {
        p = skip_ws(p + 1, end);
        if (in_obj)
            goto key;
        goto value;
    }
    if (*p == (in_obj ? '}' : ']')) {
        p++;
        depth--;
        goto closed;
    }
    fail_at(&sc, p, in_obj ? "'}' expected" : "']' expected");
    goto bad;

key:
    if (p >= end || *p != '"') {
        fail_at(&sc, p, "string or '}' expected");
        goto bad;
    }
    {
        const char *k = p;
        p = scan_string(&sc, p);
        if (!p)
            goto bad;
        if (depth == 1 && root_obj)
            m.key = (baton_json_val_t){k, (size_t)(p - k), BATON_JSON_STRING};
    }
    p = skip_ws(p, end);
    if (p >= end || *p != ':') {
        fail_at(&sc, p, "':' expected");
        goto bad;
    }
    p = skip_ws(p + 1, end);
    goto value;

bad:
    s->err_pos = (size_t)(sc.err_at - buf);
    s->err_text = sc.err_text;
    s->n_members = 0;
    return BATON_EINVAL;
}

/* ---- readers ---- */

/* In validated input a NUL appears only where the scan skipped one (after a number or literal):
 * the readers step over it like whitespace. */
static const char *skip_gap(const char *p, const char *end)
{
    while (p < end && (is_ws((unsigned char)*p) || *p == '\0'))
        p++;
    return p;
}

/* The byte after the (valid) string whose opening quote is at p. */
static const char *skip_string(const char *p, const char *end)
{
    const char *q = p + 1;
    for (;;) {
        q = memchr(q, '"', (size_t)(end - q));
        if (!q)
            return end; /* not reached for validated input */
        size_t bs = 0;
        while (q - bs > p + 1 && q[-1 - (ptrdiff_t)bs] == '\\')
            bs++;
        if (bs % 2 == 0)
            return q + 1;
        q++;
    }
}

/* The byte after the (valid) value at p. */
static const char *skip_value(const char *p, const char *end)
{
    if (*p == '"')
        return skip_string(p, end);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (p < end) {
            char c = *p;
            if (c == '"') {
                p = skip_string(p, end);
                continue;
            }
            p++;
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0)
                return p;
        }
        return end;
    }
    while (p < end && *p != ',' && *p != ']' && *p != '}' && *p != '\0' &&
           !is_ws((unsigned char)*p))
        p++;
    return p;
}

static baton_json_type_t type_at(const char *p, size_t len)
{
    switch (*p) {
    case '{':
        return BATON_JSON_OBJECT;
    case '[':
        return BATON_JSON_ARRAY;
    case '"':
        return BATON_JSON_STRING;
    case 't':
        return BATON_JSON_TRUE;
    case 'f':
        return BATON_JSON_FALSE;
    case 'n':
        return BATON_JSON_NULL;
    default:
        for (size_t i = 0; i < len; i++)
            if (p[i] == '.' || p[i] == 'e' || p[i] == 'E')
                return BATON_JSON_REAL;
        return BATON_JSON_INTEGER;
    }
}

void baton_json_iter_init(baton_json_iter_t *it, const baton_json_val_t *c)
{
    if (c->type == BATON_JSON_OBJECT || c->type == BATON_JSON_ARRAY) {
        it->p = c->p + 1;
        it->end = c->p + c->len - 1; /* the closing bracket */
    } else {
        it->p = it->end = c->p;
    }
}

static int next_val(baton_json_iter_t *it, baton_json_val_t *v)
{
    const char *p = skip_gap(it->p, it->end);
    const char *q = skip_value(p, it->end);
    *v = (baton_json_val_t){p, (size_t)(q - p), type_at(p, (size_t)(q - p))};
    it->p = q;
    return 1;
}

/* Steps over the separator before the next element; 0 at the end. */
static int next_start(baton_json_iter_t *it)
{
    const char *p = skip_gap(it->p, it->end);
    if (p < it->end && *p == ',')
        p = skip_gap(p + 1, it->end);
    it->p = p;
    return p < it->end;
}

int baton_json_array_next(baton_json_iter_t *it, baton_json_val_t *elem)
{
    return next_start(it) && next_val(it, elem);
}

int baton_json_object_next(baton_json_iter_t *it, baton_json_val_t *key, baton_json_val_t *val)
{
    if (!next_start(it))
        return 0;
    const char *k = it->p, *q = skip_string(k, it->end);
    *key = (baton_json_val_t){k, (size_t)(q - k), BATON_JSON_STRING};
    q = skip_gap(q, it->end); /* ':' */
    it->p = q + 1;
    return next_val(it, val);
}

size_t baton_json_array_size(const baton_json_val_t *arr)
{
    baton_json_iter_t it;
    baton_json_val_t e;
    size_t n = 0;
    if (arr->type != BATON_JSON_ARRAY)
        return 0;
    baton_json_iter_init(&it, arr);
    while (baton_json_array_next(&it, &e))
        n++;
    return n;
}

int baton_json_object_get(const baton_json_val_t *obj, const char *key, baton_json_val_t *out)
{
    baton_json_iter_t it;
    baton_json_val_t k, v;
    int found = 0;
    if (obj->type != BATON_JSON_OBJECT)
        return 0;
    baton_json_iter_init(&it, obj);
    while (baton_json_object_next(&it, &k, &v)) {
        if (baton_json_str_eq(&k, key)) {
            *out = v; /* keep going: the last duplicate wins */
            found = 1;
        }
    }
    return found;
}

const baton_json_member_t *baton_json_scan_get(const baton_json_scan_t *s, const char *key)
{
    for (size_t i = s->n_members; i-- > 0;)
        if (baton_json_str_eq(&s->members[i].key, key))
            return &s->members[i];
    return NULL;
}

/*
 * Decodes one unit of a valid string body at *pp into out (up to 4 bytes) and advances. Returns
 * the bytes written.
 */
static size_t decode_unit(const char **pp, const char *end, char out[4])
{
    const char *p = *pp;
    if (*p != '\\') {
        out[0] = *p;
        *pp = p + 1;
        return 1;
    }
    char c = p[1];
    if (c != 'u') {
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        out[0] = to[strchr(from, c) - from];
        *pp = p + 2;
        return 1;
    }
    uint32_t u = (uint32_t)hex4(p + 2, end);
    *pp = p + 6;
    if (u >= 0xD800 && u <= 0xDBFF) {
        u = 0x10000 + ((u - 0xD800) << 10) + ((uint32_t)hex4(p + 8, end) - 0xDC00);
        *pp = p + 12;
    }
    if (u < 0x80) {
        out[0] = (char)u;
        return 1;
    }
    if (u < 0x800) {
        out[0] = (char)(0xC0 | u >> 6);
        out[1] = (char)(0x80 | (u & 0x3F));
        return 2;
    }
    if (u < 0x10000) {
        out[0] = (char)(0xE0 | u >> 12);
        out[1] = (char)(0x80 | (u >> 6 & 0x3F));
        out[2] = (char)(0x80 | (u & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | u >> 18);
    out[1] = (char)(0x80 | (u >> 12 & 0x3F));
    out[2] = (char)(0x80 | (u >> 6 & 0x3F));
    out[3] = (char)(0x80 | (u & 0x3F));
    return 4;
}

int baton_json_str_eq(const baton_json_val_t *str, const char *key)
{
    const char *p = str->p + 1, *end = str->p + str->len - 1;
    size_t klen = strlen(key);
    if (!memchr(p, '\\', (size_t)(end - p)))
        return (size_t)(end - p) == klen && memcmp(p, key, klen) == 0;
    size_t at = 0;
    while (p < end) {
        char u[4];
        size_t n = decode_unit(&p, end, u);
        if (at + n > klen || memcmp(key + at, u, n) != 0)
            return 0;
        at += n;
    }
    return at == klen;
}

int baton_json_str_append(const baton_json_val_t *str, baton_buf_t *out)
{
    const char *p = str->p + 1, *end = str->p + str->len - 1;
    const char *bs = memchr(p, '\\', (size_t)(end - p));
    if (!bs)
        return baton_buf_append(out, p, (size_t)(end - p));
    if (baton_buf_reserve(out, (size_t)(end - p))) /* decoding never lengthens */
        return BATON_ENOMEM;
    char *w = out->data + out->len;
    memcpy(w, p, (size_t)(bs - p));
    w += bs - p;
    p = bs;
    while (p < end) {
        if (*p != '\\') {
            *w++ = *p++;
            continue;
        }
        w += decode_unit(&p, end, w);
    }
    out->len = (size_t)(w - out->data);
    out->data[out->len] = '\0';
    return 0;
}

size_t baton_json_str_len(const baton_json_val_t *str)
{
    const char *p = str->p + 1, *end = str->p + str->len - 1;
    size_t n = 0;
    char u[4];
    if (!memchr(p, '\\', (size_t)(end - p)))
        return (size_t)(end - p);
    while (p < end)
        n += decode_unit(&p, end, u);
    return n;
}

int64_t baton_json_int(const baton_json_val_t *v)
{
    const char *p = v->p, *end = v->p + v->len;
    int neg = *p == '-';
    uint64_t u = 0;
    for (p += neg; p < end; p++)
        u = u * 10 + (uint64_t)(*p - '0');
    return neg ? (int64_t)(0 - u) : (int64_t)u;
}

double baton_json_number(const baton_json_val_t *v)
{
    if (v->type == BATON_JSON_INTEGER)
        return (double)baton_json_int(v);
    char small[64], *buf = v->len < sizeof(small) ? small : malloc(v->len + 1);
    if (!buf)
        return 0;
    memcpy(buf, v->p, v->len);
    buf[v->len] = '\0';
    double d = strtod(buf, NULL);
    if (buf != small)
        free(buf);
    return d;
}

/* ---- splicing ---- */

static int seg_add(baton_json_splice_t *sp, const char *p, size_t len)
{
    if (!len)
        return 0;
    if (sp->n == sp->cap) {
        size_t cap = sp->cap * 2;
        struct iovec *v = sp->iov == sp->inline_iov ? malloc(cap * sizeof(*v))
                                                    : realloc(sp->iov, cap * sizeof(*v));
        if (!v)
            return BATON_ENOMEM;
        if (sp->iov == sp->inline_iov)
            memcpy(v, sp->inline_iov, sizeof(sp->inline_iov));
        sp->iov = v;
        sp->cap = cap;
    }
    sp->iov[sp->n++] = (struct iovec){(void *)p, len};
    sp->total += len;
    return 0;
}

/* A run of the scanned bytes; NULs the scan skipped are left out (a rare, odd input). */
static int run_add(baton_json_splice_t *sp, const baton_json_scan_t *s, const char *p, size_t len)
{
    const char *z;
    while (s->nul_skipped && (z = memchr(p, '\0', len)) != NULL) {
        if (seg_add(sp, p, (size_t)(z - p)))
            return BATON_ENOMEM;
        len -= (size_t)(z - p) + 1;
        p = z + 1;
    }
    return seg_add(sp, p, len);
}

static int dropped(const baton_json_member_t *m, const char *const *drop, size_t n_drop)
{
    for (size_t i = 0; i < n_drop; i++)
        if (baton_json_str_eq(&m->key, drop[i]))
            return 1;
    return 0;
}

void baton_json_splice_free(baton_json_splice_t *sp)
{
    if (sp->iov && sp->iov != sp->inline_iov)
        free(sp->iov);
    sp->iov = sp->inline_iov;
    sp->cap = BATON_JSON_SPLICE_INLINE;
    sp->n = sp->total = 0;
}

/*
 * Runs of kept members are copied as one segment, separators included: with nothing dropped
 * the body is two segments, "{...last value" and the tail.
 */
int baton_json_splice(const baton_json_scan_t *s, const char *const *drop, size_t n_drop,
                      const char *tail, size_t tail_len, baton_json_splice_t *sp)
{
    sp->iov = sp->inline_iov;
    sp->cap = BATON_JSON_SPLICE_INLINE;
    sp->n = sp->total = 0;
    if (s->root.type != BATON_JSON_OBJECT || tail_len == 0 || (tail[0] != ',' && tail[0] != '}'))
        return BATON_EINVAL;
    const char *run = s->root.p, *run_end = s->root.p + 1; /* "{" */
    const char *prev_end = run_end;
    int kept = 0;
    for (size_t i = 0; i < s->n_members; i++) {
        const baton_json_member_t *m = &s->members[i];
        const char *m_end = m->val.p + m->val.len;
        if (dropped(m, drop, n_drop)) {
            if (run && run_add(sp, s, run, (size_t)(run_end - run)))
                goto nomem;
            run = NULL;
        } else {
            if (!run) /* after a dropped one: from its end, the comma between included */
                run = kept ? prev_end : m->key.p;
            run_end = m_end;
            kept = 1;
        }
        prev_end = m_end;
    }
    if (run && run_add(sp, s, run, (size_t)(run_end - run)))
        goto nomem;
    if (!kept && tail[0] == ',') {
        tail++;
        tail_len--;
    }
    if (seg_add(sp, tail, tail_len))
        goto nomem;
    return 0;
nomem:
    baton_json_splice_free(sp);
    return BATON_ENOMEM;
}

int baton_json_splice_flatten(const baton_json_splice_t *sp, baton_buf_t *out)
{
    baton_buf_reset(out);
    if (baton_buf_reserve(out, sp->total))
        return BATON_ENOMEM;
    for (size_t i = 0; i < sp->n; i++) {
        memcpy(out->data + out->len, sp->iov[i].iov_base, sp->iov[i].iov_len);
        out->len += sp->iov[i].iov_len;
    }
    out->data[out->len] = '\0';
    return 0;
}
