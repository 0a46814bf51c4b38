/* buf.c — growable byte buffer (see buf.h). */
#include "common/buf.h"

#include "baton/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int baton_buf_reserve(baton_buf_t *b, size_t extra)
{
    size_t need = b->len + extra + 1;
    if (need < b->len)
        return BATON_ENOMEM;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (cap > ((size_t)-1) / 2)
            return BATON_ENOMEM;
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (p == NULL)
        return BATON_ENOMEM;
    b->data = p;
    b->cap = cap;
    b->data[b->len] = '\0';
    return 0;
}

int baton_buf_append(baton_buf_t *b, const void *data, size_t len)
{
    if (baton_buf_reserve(b, len) != 0)
        return BATON_ENOMEM;
    if (len > 0)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return 0;
}

size_t baton_fmt_uint(char *out, uint64_t v, unsigned base)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    for (size_t i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    return n;
}

int baton_hex_value(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int baton_buf_append_uint(baton_buf_t *b, uint64_t v)
{
    char d[20];
    return baton_buf_append(b, d, baton_fmt_uint(d, v, 10));
}

int baton_buf_append_str(baton_buf_t *b, const char *s)
{
    return baton_buf_append(b, s, strlen(s));
}

int baton_buf_append_json_string(baton_buf_t *b, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    if (baton_buf_reserve(b, len + 2) != 0 || baton_buf_append(b, "\"", 1) != 0)
        return BATON_ENOMEM;
    size_t run = 0; /* start of the bytes that need no escape */
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        if (baton_buf_append(b, s + run, i - run) != 0)
            return BATON_ENOMEM;
        char esc[6] = {'\\', (char)c, 0, 0, 0, 0};
        size_t n = 2;
        switch (c) {
        case '"':
        case '\\':
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            n = 6;
        }
        if (baton_buf_append(b, esc, n) != 0)
            return BATON_ENOMEM;
        run = i + 1;
    }
    if (baton_buf_append(b, s + run, len - run) != 0 || baton_buf_append(b, "\"", 1) != 0)
        return BATON_ENOMEM;
    return 0;
}

int baton_buf_printf(baton_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return BATON_EINVAL;
    if (baton_buf_reserve(b, (size_t)n) != 0)
        return BATON_ENOMEM;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void baton_buf_consume(baton_buf_t *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data != NULL)
        b->data[b->len] = '\0';
}

void baton_buf_reset(baton_buf_t *b)
{
    b->len = 0;
    if (b->data != NULL)
        b->data[0] = '\0';
}

char *baton_buf_steal(baton_buf_t *b, size_t *len_p)
{
    char *p = b->data;
    if (len_p != NULL)
        *len_p = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

void baton_buf_free(baton_buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
