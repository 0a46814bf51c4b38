/* tokenizer/chat_template_lex.c — the chat-template lexer: whitespace control as transformers
 * configures Jinja (trim_blocks, lstrip_blocks), then text, tags and expression tokens. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "tokenizer/chat_template_int.h"

struct ct_chunk {
    struct ct_chunk *next;
    size_t size, used;
    _Alignas(max_align_t) unsigned char data[];
};

void *ct_alloc(ct_arena_t *a, size_t n)
{
    void *p = ct_alloc_bytes(a, n);
    if (p) {
        memset(p, 0, n);
    }
    return p;
}

void *ct_alloc_bytes(ct_arena_t *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0) {
        n = 16;
    }
    if (a->limit && (n > a->limit || a->used > a->limit - n)) {
        return NULL;
    }
    ct_chunk_t *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > 65536 - sizeof(*c) ? n : 65536 - sizeof(*c);
        c = malloc(sizeof(*c) + size);
        if (!c) {
            return NULL;
        }
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    return p;
}

void ct_arena_free(ct_arena_t *a)
{
    ct_chunk_t *c = a->head;
    while (c) {
        ct_chunk_t *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

void ct_fail(ct_diag_t *d, int rc, int line, const char *fmt, ...)
{
    if (d->rc) {
        return; /* the first error is the one reported */
    }
    d->rc = rc;
    if (!d->err || !d->errlen) {
        return;
    }
    int off = snprintf(d->err, d->errlen, "chat template line %d: ", line);
    if (off < 0 || (size_t)off >= d->errlen) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err + off, d->errlen - (size_t)off, fmt, ap);
    va_end(ap);
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* The source after transformers' whitespace handling: one trailing newline dropped, spaces and
 * tabs before a block or comment tag at the start of a line dropped (lstrip_blocks), the
 * newline after a block or comment tag dropped (trim_blocks). */
static char *preprocess(ct_arena_t *a, const char *src, size_t len, size_t *outlen)
{
    if (len && src[len - 1] == '\n') {
        len--;
    }
    char *tmp = ct_alloc(a, len + 1);
    char *out = ct_alloc(a, len + 1);
    if (!tmp || !out) {
        return NULL;
    }
    size_t n = 0;
    bool line_start = true;
    for (size_t i = 0; i < len;) {
        if (line_start) {
            size_t j = i;
            while (j < len && (src[j] == ' ' || src[j] == '\t')) {
                j++;
            }
            if (j + 1 < len && src[j] == '{' &&
                (src[j + 1] == '#' || src[j + 1] == '%' || src[j + 1] == '-')) {
                i = j;
            }
            line_start = false;
            continue;
        }
        char c = src[i++];
        tmp[n++] = c;
        line_start = c == '\n' || c == '\r';
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        out[m++] = tmp[i];
        if (tmp[i] == '}' && i > 0 && i + 1 < n && tmp[i + 1] == '\n' &&
            (tmp[i - 1] == '#' || tmp[i - 1] == '%' || tmp[i - 1] == '-')) {
            i++;
        }
    }
    out[m] = 0;
    *outlen = m;
    return out;
}

typedef struct {
    ct_diag_t *d;
    ct_tok_t *v;
    size_t n, cap;
    size_t barrier; /* tokens before a comment: whitespace control never reaches past one */
} toks_t;

static ct_tok_t *push(toks_t *t, ct_tok_kind_t kind, const char *s, size_t n, int line)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        ct_tok_t *v = ct_alloc(t->d->arena, cap * sizeof(*v));
        if (!v) {
            ct_fail(t->d, BATON_ENOMEM, line, "out of memory");
            return NULL;
        }
        if (t->n) {
            memcpy(v, t->v, t->n * sizeof(*v));
        }
        t->v = v;
        t->cap = cap;
    }
    ct_tok_t *k = &t->v[t->n++];
    memset(k, 0, sizeof(*k));
    k->kind = kind;
    k->s = s;
    k->n = n;
    k->line = line;
    return k;
}

static void strip_prev_text(toks_t *t)
{
    if (t->n > t->barrier && t->v[t->n - 1].kind == TK_TEXT) {
        ct_tok_t *k = &t->v[t->n - 1];
        while (k->n && is_ws(k->s[k->n - 1])) {
            k->n--;
        }
        if (!k->n) {
            t->n--;
        }
    }
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string literal from src[*ip] (the opening quote) with Python's escapes. */
static int lex_string(toks_t *t, const char *src, size_t len, size_t *ip, int *line)
{
    size_t i = *ip;
    char q = src[i++];
    char *o = ct_alloc(t->d->arena, len - i + 1);
    if (!o) {
        ct_fail(t->d, BATON_ENOMEM, *line, "out of memory");
        return -1;
    }
    size_t n = 0;
    int start_line = *line;
    for (;;) {
        if (i >= len) {
            ct_fail(t->d, BATON_EINVAL, start_line, "unterminated string literal");
            return -1;
        }
        char c = src[i++];
        if (c == q) {
            break;
        }
        if (c == '\n') {
            (*line)++;
        }
        if (c != '\\') {
            o[n++] = c;
            continue;
        }
        if (i >= len) {
            ct_fail(t->d, BATON_EINVAL, start_line, "unterminated string literal");
            return -1;
        }
        char e = src[i++];
        int hex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (hex) {
            uint32_t cp = 0;
            for (int k = 0; k < hex; k++) {
                int h = i < len ? baton_hex_value((unsigned char)src[i]) : -1;
                if (h < 0) {
                    ct_fail(t->d, BATON_EINVAL, *line, "bad \\%c escape in a string literal", e);
                    return -1;
                }
                cp = cp * 16 + (uint32_t)h;
                i++;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
                ct_fail(t->d, BATON_EINVAL, *line, "bad code point escape in a string literal");
                return -1;
            }
            n += put_utf8(o + n, cp); /* at most 4 bytes for the 3..10 source bytes */
            continue;
        }
        switch (e) {
        case 'n':
            o[n++] = '\n';
            break;
        case 't':
            o[n++] = '\t';
            break;
        case 'r':
            o[n++] = '\r';
            break;
        case 'b':
            o[n++] = '\b';
            break;
        case 'f':
            o[n++] = '\f';
            break;
        case 'v':
            o[n++] = '\v';
            break;
        case '0':
            o[n++] = '\0';
            break;
        case '\\':
            o[n++] = '\\';
            break;
        case '\'':
            o[n++] = '\'';
            break;
        case '"':
            o[n++] = '"';
            break;
        case '\n':
            (*line)++;
            break; /* a backslash-newline continues the literal */
        default:   /* Python keeps an unknown escape as it is */
            o[n++] = '\\';
            o[n++] = e;
        }
    }
    ct_tok_t *k = push(t, TK_STRING, o, n, start_line);
    *ip = i;
    return k ? 0 : -1;
}

static const char *const OPS[] = {"**", "//", "==", "!=", "<=", ">=", "(", ")", "[",
                                  "]",  "{",  "}",  ",",  ".",  ":",  "|", "<", ">",
                                  "+",  "-",  "~",  "*",  "/",  "%",  "="};

int ct_lex(ct_diag_t *d, const char *src0, size_t len0, ct_tok_t **toks, size_t *ntoks)
{
    size_t len;
    const char *src = preprocess(d->arena, src0, len0, &len);
    if (!src) {
        ct_fail(d, BATON_ENOMEM, 0, "out of memory");
        return d->rc;
    }
    toks_t t = {.d = d};
    int line = 1;
    size_t i = 0;
    bool in_tag = false, in_expr = false;
    int curly = 0;
    int tag_line = 1;
    while (i < len) {
        if (!in_tag) {
            size_t j = i;
            while (j < len && !(src[j] == '{' && j + 1 < len &&
                                (src[j + 1] == '%' || src[j + 1] == '{' || src[j + 1] == '#'))) {
                j++;
            }
            if (j > i) {
                if (!push(&t, TK_TEXT, src + i, j - i, line)) {
                    return d->rc;
                }
                for (size_t k = i; k < j; k++) {
                    line += src[k] == '\n';
                }
                i = j;
                continue;
            }
            tag_line = line;
            if (src[i + 1] == '#') {
                size_t j2 = i + 2;
                bool strip_before = j2 < len && src[j2] == '-';
                while (j2 + 1 < len && !(src[j2] == '#' && src[j2 + 1] == '}')) {
                    line += src[j2] == '\n';
                    j2++;
                }
                if (j2 + 1 >= len) {
                    ct_fail(d, BATON_EINVAL, tag_line, "unterminated comment");
                    return d->rc;
                }
                bool strip_after = j2 > i + 2 && src[j2 - 1] == '-';
                if (strip_before) {
                    strip_prev_text(&t);
                }
                i = j2 + 2;
                if (strip_after) {
                    while (i < len && is_ws(src[i])) {
                        line += src[i] == '\n';
                        i++;
                    }
                }
                t.barrier = t.n;
                continue;
            }
            in_expr = src[i + 1] == '{';
            curly = 0;
            if (i + 2 < len && src[i + 2] == '-') {
                strip_prev_text(&t);
                i++;
            } else if (i + 2 < len && src[i + 2] == '+' && !in_expr) {
                i++; /* {%+ : lstrip_blocks off for this tag; the source was already kept */
            }
            if (!push(&t, in_expr ? TK_OPEN_EXPR : TK_OPEN_STMT, src + i, 2, line)) {
                return d->rc;
            }
            i += 2;
            in_tag = true;
            continue;
        }
        char c = src[i];
        if (is_ws(c)) {
            line += c == '\n';
            i++;
            continue;
        }
        bool close_e = in_expr && curly == 0 && i + 1 < len && c == '}' && src[i + 1] == '}';
        bool close_s = !in_expr && i + 1 < len && c == '%' && src[i + 1] == '}';
        bool dash_close = c == '-' && i + 2 < len &&
                          ((in_expr && curly == 0 && src[i + 1] == '}' && src[i + 2] == '}') ||
                           (!in_expr && src[i + 1] == '%' && src[i + 2] == '}'));
        if (close_e || close_s || dash_close) {
            if (!push(&t, in_expr ? TK_CLOSE_EXPR : TK_CLOSE_STMT, src + i, 2, line)) {
                return d->rc;
            }
            i += dash_close ? 3 : 2;
            if (dash_close) {
                while (i < len && is_ws(src[i])) {
                    line += src[i] == '\n';
                    i++;
                }
            }
            in_tag = false;
            continue;
        }
        if (c == '\'' || c == '"') {
            if (lex_string(&t, src, len, &i, &line) < 0) {
                return d->rc;
            }
            continue;
        }
        if (c >= '0' && c <= '9') {
            size_t j = i;
            while (j < len && src[j] >= '0' && src[j] <= '9') {
                j++;
            }
            bool is_float = j + 1 < len && src[j] == '.' && src[j + 1] >= '0' &&
                            src[j + 1] <= '9' &&
                            !(t.n && t.v[t.n - 1].kind == TK_OP && t.v[t.n - 1].s[0] == '.');
            if (is_float) {
                j++;
                while (j < len && src[j] >= '0' && src[j] <= '9') {
                    j++;
                }
            }
            /* an exponent: 1e20, 2.5E-3 */
            size_t e = j;
            if (e < len && (src[e] == 'e' || src[e] == 'E')) {
                e++;
                if (e < len && (src[e] == '+' || src[e] == '-')) {
                    e++;
                }
                if (e < len && src[e] >= '0' && src[e] <= '9') {
                    while (e < len && src[e] >= '0' && src[e] <= '9') {
                        e++;
                    }
                    j = e;
                    is_float = true;
                }
            }
            char num[64];
            if (j - i >= sizeof(num)) {
                ct_fail(d, BATON_EINVAL, line, "number literal too long");
                return d->rc;
            }
            memcpy(num, src + i, j - i);
            num[j - i] = 0;
            ct_tok_t *k = push(&t, is_float ? TK_FLOAT : TK_INT, src + i, j - i, line);
            if (!k) {
                return d->rc;
            }
            if (is_float) {
                k->f = strtod(num, NULL);
            } else {
                char *end;
                unsigned long long v = strtoull(num, &end, 10);
                if (j - i > 18 && v > (unsigned long long)INT64_MAX) {
                    ct_fail(d, BATON_ENOTSUP, line, "integer literal out of range");
                    return d->rc;
                }
                k->i = (int64_t)v;
            }
            i = j;
            continue;
        }
        if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            size_t j = i;
            while (j < len &&
                   (src[j] == '_' || (src[j] >= 'a' && src[j] <= 'z') ||
                    (src[j] >= 'A' && src[j] <= 'Z') || (src[j] >= '0' && src[j] <= '9'))) {
                j++;
            }
            if (!push(&t, TK_NAME, src + i, j - i, line)) {
                return d->rc;
            }
            i = j;
            continue;
        }
        size_t k;
        for (k = 0; k < sizeof(OPS) / sizeof(OPS[0]); k++) {
            size_t on = strlen(OPS[k]);
            if (i + on <= len && memcmp(src + i, OPS[k], on) == 0) {
                break;
            }
        }
        if (k == sizeof(OPS) / sizeof(OPS[0])) {
            ct_fail(d, BATON_EINVAL, line, "unexpected character '%c' in a tag",
                    (c >= 0x20 && c < 0x7f) ? c : '?');
            return d->rc;
        }
        size_t on = strlen(OPS[k]);
        if (OPS[k][0] == '{' && on == 1) {
            curly++;
        } else if (OPS[k][0] == '}' && on == 1 && curly > 0) {
            curly--;
        }
        if (!push(&t, TK_OP, OPS[k], on, line)) {
            return d->rc;
        }
        i += on;
    }
    if (in_tag) {
        ct_fail(d, BATON_EINVAL, tag_line, "unclosed tag at the end of the template");
        return d->rc;
    }
    if (!push(&t, TK_EOF, "", 0, line)) {
        return d->rc;
    }
    *toks = t.v;
    *ntoks = t.n;
    return 0;
}
