/* tokenizer/chat_template_str.c — the chat-template library's string work with Python's
 * semantics (strip, case mapping, replace, split, join, code-point length) and tojson as
 * json.dumps(ensure_ascii=False) writes it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "baton/error.h"
#include "tokenizer/chat_template_int.h"

/* ---- strings ---- */

int32_t ct_next_cp(const char *s, size_t n, size_t *i)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t r =
        utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (r <= 0) {
        (*i)++;
        return -1;
    }
    *i += (size_t)r;
    return cp;
}

/* Python's str.isspace() */
bool ct_py_space(int32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool in_chars(int32_t c, const ct_value_t *chars)
{
    if (!chars) {
        return ct_py_space(c);
    }
    size_t i = 0;
    while (i < chars->u.s.n) {
        if (ct_next_cp(chars->u.s.p, chars->u.s.n, &i) == c) {
            return true;
        }
    }
    return false;
}

ct_value_t ct_strip(const ct_value_t *s, const ct_value_t *chars, bool left, bool right)
{
    const char *p = s->u.s.p;
    size_t a = 0, b = s->u.s.n;
    while (left && a < b) {
        size_t j = a;
        if (!in_chars(ct_next_cp(p, b, &j), chars)) {
            break;
        }
        a = j;
    }
    while (right && b > a) {
        size_t st = b - 1;
        while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80) {
            st--;
        }
        size_t j = st;
        if (!in_chars(ct_next_cp(p, b, &j), chars)) {
            break;
        }
        b = st;
    }
    return ct_str(p + a, b - a);
}

ct_value_t ct_recase(ct_rt_t *rt, const ct_value_t *s, int mode)
{
    char *o = ct_rt_bytes(rt, s->u.s.n * 3 + 4);
    size_t n = 0, i = 0;
    bool prev_cased = false, first = true;
    while (i < s->u.s.n) {
        size_t st = i;
        int32_t c = ct_next_cp(s->u.s.p, s->u.s.n, &i);
        if (c < 0) {
            memcpy(o + n, s->u.s.p + st, i - st);
            n += i - st;
            continue;
        }
        int32_t r = c;
        switch (mode) {
        case CASE_UPPER:
            r = utf8proc_toupper(c);
            break;
        case CASE_LOWER:
            r = utf8proc_tolower(c);
            break;
        case CASE_TITLE:
            r = prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c);
            break;
        default:
            r = first ? utf8proc_totitle(c) : utf8proc_tolower(c);
            break;
        }
        first = false;
        const utf8proc_property_t *pr = utf8proc_get_property(c);
        prev_cased = pr->category == UTF8PROC_CATEGORY_LU || pr->category == UTF8PROC_CATEGORY_LL ||
                     pr->category == UTF8PROC_CATEGORY_LT;
        n += (size_t)utf8proc_encode_char(r, (utf8proc_uint8_t *)o + n);
    }
    return ct_str(o, n);
}

size_t ct_cp_len(const ct_value_t *s)
{
    size_t k = 0;
    for (size_t i = 0; i < s->u.s.n; i++) {
        k += ((unsigned char)s->u.s.p[i] & 0xC0) != 0x80;
    }
    return k;
}

ct_value_t ct_replace(ct_rt_t *rt, const ct_value_t *s, const ct_value_t *old,
                      const ct_value_t *new, int64_t count)
{
    baton_buf_t *bp = ct_buf_open(rt);
    size_t i = 0;
    int64_t done = 0;
    int rc = 0;
    if (old->u.s.n == 0) { /* Python inserts new between every character */
        while ((count < 0 || done < count) && i <= s->u.s.n) {
            rc |= baton_buf_append(bp, new->u.s.p, new->u.s.n);
            done++;
            if (i == s->u.s.n) {
                i++;
                break;
            }
            size_t st = i;
            ct_next_cp(s->u.s.p, s->u.s.n, &i);
            rc |= baton_buf_append(bp, s->u.s.p + st, i - st);
        }
        if (i <= s->u.s.n) {
            rc |= baton_buf_append(bp, s->u.s.p + i, s->u.s.n - i);
        }
    } else {
        while (count < 0 || done < count) {
            const char *hit = memmem(s->u.s.p + i, s->u.s.n - i, old->u.s.p, old->u.s.n);
            if (!hit) {
                break;
            }
            size_t at = (size_t)(hit - s->u.s.p);
            rc |= baton_buf_append(bp, s->u.s.p + i, at - i);
            rc |= baton_buf_append(bp, new->u.s.p, new->u.s.n);
            i = at + old->u.s.n;
            done++;
            if (bp->len > rt->lim.max_memory) {
                break;
            }
        }
        rc |= baton_buf_append(bp, s->u.s.p + i, s->u.s.n - i);
    }
    if (rc || bp->len > rt->lim.max_memory) {
        ct_throw(rt, BATON_ETOOBIG, "replace: result over the memory limit");
    }
    return ct_buf_close(rt, bp);
}

ct_value_t ct_split(ct_rt_t *rt, const ct_value_t *s, const ct_value_t *sep, int64_t max)
{
    ct_list_t *l = ct_list_new(rt, 4);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    if (!sep || sep->k == V_NONE) {
        for (;;) {
            while (i < n) { /* skip whitespace */
                size_t j = i;
                if (!ct_py_space(ct_next_cp(p, n, &j))) {
                    break;
                }
                i = j;
            }
            if (i >= n) {
                break;
            }
            if (max >= 0 && (int64_t)l->n >= max) {
                size_t e = n;
                ct_value_t rest =
                    ct_strip(&(ct_value_t){.k = V_STR, .u.s = {p + i, e - i}}, NULL, false, true);
                ct_list_push(rt, l, rest);
                break;
            }
            size_t st = i;
            while (i < n) {
                size_t j = i;
                if (ct_py_space(ct_next_cp(p, n, &j))) {
                    break;
                }
                i = j;
            }
            ct_list_push(rt, l, ct_str(p + st, i - st));
        }
    } else {
        if (sep->k != V_STR) {
            ct_throw(rt, BATON_EINVAL, "split: the separator must be a string");
        }
        if (sep->u.s.n == 0) {
            ct_throw(rt, BATON_EINVAL, "split: empty separator");
        }
        for (;;) {
            const char *hit = (max < 0 || (int64_t)l->n < max)
                                  ? memmem(p + i, n - i, sep->u.s.p, sep->u.s.n)
                                  : NULL;
            if (!hit) {
                ct_list_push(rt, l, ct_str(p + i, n - i));
                break;
            }
            ct_list_push(rt, l, ct_str(p + i, (size_t)(hit - (p + i))));
            i = (size_t)(hit - p) + sep->u.s.n;
        }
    }
    return (ct_value_t){.k = V_LIST, .u.list = l};
}

ct_value_t ct_join(ct_rt_t *rt, const ct_list_t *items, const ct_value_t *sep)
{
    baton_buf_t *b = ct_buf_open(rt);
    for (size_t i = 0; i < items->n; i++) {
        if (i && sep) {
            baton_buf_append(b, sep->u.s.p, sep->u.s.n);
        }
        ct_to_str(rt, &items->v[i], b);
    }
    return ct_buf_close(rt, b);
}

/* ---- tojson: json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=sort_keys) ---- */

static void json_str(baton_buf_t *b, const char *s, size_t n)
{
    baton_buf_append(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = c == '"'    ? "\\\""
                        : c == '\\' ? "\\\\"
                        : c == '\n' ? "\\n"
                        : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t"
                        : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f"
                                    : NULL;
        if (e) {
            baton_buf_append(b, e, 2);
        } else if (c < 0x20) {
            baton_buf_printf(b, "\\u%04x", c);
        } else {
            baton_buf_append(b, &s[i], 1);
        }
    }
    baton_buf_append(b, "\"", 1);
}

static int key_cmp(const void *a, const void *b, void *d_)
{
    const ct_dict_t *d = d_;
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    size_t n = d->klen[x] < d->klen[y] ? d->klen[x] : d->klen[y];
    int c = memcmp(d->keys[x], d->keys[y], n);
    return c ? c : (d->klen[x] > d->klen[y]) - (d->klen[x] < d->klen[y]);
}

static void newline(baton_buf_t *b, int64_t indent, unsigned depth)
{
    baton_buf_append(b, "\n", 1);
    for (uint64_t i = 0; i < (uint64_t)indent * depth; i++) {
        baton_buf_append(b, " ", 1);
    }
}

void ct_to_json(ct_rt_t *rt, const ct_value_t *v, baton_buf_t *b, int64_t indent, bool sort,
                unsigned depth)
{
    if (depth > rt->lim.max_depth) {
        ct_throw(rt, BATON_ETOOBIG, "tojson: value nested deeper than %u", rt->lim.max_depth);
    }
    if (b->len > rt->lim.max_memory) {
        ct_throw(rt, BATON_ETOOBIG, "tojson: output over the memory limit");
    }
    const char *isep = indent >= 0 ? "," : ", ";
    switch (v->k) {
    case V_NONE:
        baton_buf_append_str(b, "null");
        return;
    case V_BOOL:
        baton_buf_append_str(b, v->u.b ? "true" : "false");
        return;
    case V_INT:
        baton_buf_printf(b, "%lld", (long long)v->u.i);
        return;
    case V_FLOAT:
        if (isnan(v->u.f)) {
            baton_buf_append_str(b, "NaN");
        } else if (isinf(v->u.f)) {
            baton_buf_append_str(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        } else {
            ct_to_str(rt, v, b);
        }
        return;
    case V_STR:
        json_str(b, v->u.s.p, v->u.s.n);
        return;
    case V_LIST:
        baton_buf_append(b, "[", 1);
        for (size_t i = 0; i < v->u.list->n; i++) {
            if (i) {
                baton_buf_append_str(b, isep);
            }
            if (indent >= 0) {
                newline(b, indent, depth + 1);
            }
            ct_to_json(rt, &v->u.list->v[i], b, indent, sort, depth + 1);
        }
        if (indent >= 0 && v->u.list->n) {
            newline(b, indent, depth);
        }
        baton_buf_append(b, "]", 1);
        return;
    case V_DICT:
    case V_NS: {
        const ct_dict_t *d = v->u.dict;
        size_t *order = ct_rt_alloc(rt, (d->n + 1) * sizeof(*order));
        for (size_t i = 0; i < d->n; i++) {
            order[i] = i;
        }
        if (sort) {
            qsort_r(order, d->n, sizeof(*order), key_cmp, (void *)d);
        }
        baton_buf_append(b, "{", 1);
        for (size_t k = 0; k < d->n; k++) {
            size_t i = order[k];
            if (k) {
                baton_buf_append_str(b, isep);
            }
            if (indent >= 0) {
                newline(b, indent, depth + 1);
            }
            json_str(b, d->keys[i], d->klen[i]);
            baton_buf_append(b, ": ", 2);
            ct_to_json(rt, &d->vals[i], b, indent, sort, depth + 1);
        }
        if (indent >= 0 && d->n) {
            newline(b, indent, depth);
        }
        baton_buf_append(b, "}", 1);
        return;
    }
    default:
        ct_throw(rt, BATON_EINVAL, "tojson: %s is not JSON serializable",
                 v->k == V_UNDEF && v->undef_name ? v->undef_name : ct_type_name(v));
    }
}
