/* tokenizer/chat_template_value.c — chat-template runtime values with Python's semantics:
 * construction from JSON, attribute and item access, slicing, operators, comparison, str/repr. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "tokenizer/chat_template_int.h"

ct_value_t ct_str(const char *p, size_t n)
{
    ct_value_t v = {.k = V_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}

ct_value_t ct_str_copy(ct_rt_t *rt, const char *p, size_t n)
{
    char *s = ct_rt_bytes(rt, n);
    if (n) {
        memcpy(s, p, n);
    }
    return ct_str(s, n);
}

ct_value_t ct_int(int64_t i)
{
    ct_value_t v = {.k = V_INT};
    v.u.i = i;
    return v;
}

ct_value_t ct_bool(bool b)
{
    ct_value_t v = {.k = V_BOOL};
    v.u.b = b;
    return v;
}

ct_value_t ct_none(void)
{
    ct_value_t v = {.k = V_NONE};
    return v;
}

ct_list_t *ct_list_new(ct_rt_t *rt, size_t cap)
{
    ct_list_t *l = ct_rt_alloc(rt, sizeof(*l));
    l->cap = cap ? cap : 4;
    l->v = ct_rt_alloc(rt, l->cap * sizeof(*l->v));
    return l;
}

void ct_list_push(ct_rt_t *rt, ct_list_t *l, ct_value_t v)
{
    if (l->n == l->cap) {
        ct_value_t *nv = ct_rt_alloc(rt, l->cap * 2 * sizeof(*nv));
        memcpy(nv, l->v, l->n * sizeof(*nv));
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = v;
}

ct_dict_t *ct_dict_new(ct_rt_t *rt, size_t cap)
{
    ct_dict_t *d = ct_rt_alloc(rt, sizeof(*d));
    d->cap = cap ? cap : 4;
    d->keys = ct_rt_alloc(rt, d->cap * sizeof(*d->keys));
    d->klen = ct_rt_alloc(rt, d->cap * sizeof(*d->klen));
    d->vals = ct_rt_alloc(rt, d->cap * sizeof(*d->vals));
    return d;
}

static ptrdiff_t dict_find(const ct_dict_t *d, const char *k, size_t kn)
{
    for (size_t i = 0; i < d->n; i++) {
        if (d->klen[i] == kn && memcmp(d->keys[i], k, kn) == 0) {
            return (ptrdiff_t)i;
        }
    }
    return -1;
}

const ct_value_t *ct_dict_get(const ct_dict_t *d, const char *k, size_t kn)
{
    ptrdiff_t i = dict_find(d, k, kn);
    return i < 0 ? NULL : &d->vals[i];
}

void ct_dict_set(ct_rt_t *rt, ct_dict_t *d, const char *k, size_t kn, ct_value_t v)
{
    ptrdiff_t i = dict_find(d, k, kn);
    if (i >= 0) {
        d->vals[i] = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap * 2;
        const char **keys = ct_rt_alloc(rt, cap * sizeof(*keys));
        size_t *klen = ct_rt_alloc(rt, cap * sizeof(*klen));
        ct_value_t *vals = ct_rt_alloc(rt, cap * sizeof(*vals));
        memcpy(keys, d->keys, d->n * sizeof(*keys));
        memcpy(klen, d->klen, d->n * sizeof(*klen));
        memcpy(vals, d->vals, d->n * sizeof(*vals));
        d->keys = keys;
        d->klen = klen;
        d->vals = vals;
        d->cap = cap;
    }
    d->keys[d->n] = k;
    d->klen[d->n] = kn;
    d->vals[d->n++] = v;
}

bool ct_truthy(const ct_value_t *v)
{
    switch (v->k) {
    case V_UNDEF:
    case V_NONE:
        return false;
    case V_BOOL:
        return v->u.b;
    case V_INT:
        return v->u.i != 0;
    case V_FLOAT:
        return v->u.f != 0.0;
    case V_STR:
        return v->u.s.n != 0;
    case V_LIST:
        return v->u.list->n != 0;
    case V_DICT:
        return v->u.dict->n != 0;
    default:
        return true;
    }
}

const char *ct_type_name(const ct_value_t *v)
{
    switch (v->k) {
    case V_UNDEF:
        return "undefined";
    case V_NONE:
        return "none";
    case V_BOOL:
        return "bool";
    case V_INT:
        return "int";
    case V_FLOAT:
        return "float";
    case V_STR:
        return "str";
    case V_LIST:
        return "list";
    case V_DICT:
        return "dict";
    case V_NS:
        return "namespace";
    case V_LOOP:
        return "loop";
    case V_MACRO:
        return "macro";
    case V_FUNC:
        return "function";
    }
    return "value";
}

static bool is_num(const ct_value_t *v)
{
    return v->k == V_INT || v->k == V_FLOAT || v->k == V_BOOL;
}

static double num_f(const ct_value_t *v)
{
    return v->k == V_FLOAT ? v->u.f : v->k == V_INT ? (double)v->u.i : (double)v->u.b;
}

static int64_t num_i(const ct_value_t *v)
{
    return v->k == V_INT ? v->u.i : (int64_t)v->u.b;
}

bool ct_equal(const ct_value_t *a, const ct_value_t *b)
{
    if (is_num(a) && is_num(b)) {
        if (a->k != V_FLOAT && b->k != V_FLOAT) {
            return num_i(a) == num_i(b);
        }
        return num_f(a) == num_f(b);
    }
    if (a->k != b->k) {
        return false;
    }
    switch (a->k) {
    case V_UNDEF:
    case V_NONE:
        return true;
    case V_STR:
        return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case V_LIST:
        if (a->u.list->n != b->u.list->n) {
            return false;
        }
        for (size_t i = 0; i < a->u.list->n; i++) {
            if (!ct_equal(&a->u.list->v[i], &b->u.list->v[i])) {
                return false;
            }
        }
        return true;
    case V_DICT:
        if (a->u.dict->n != b->u.dict->n) {
            return false;
        }
        for (size_t i = 0; i < a->u.dict->n; i++) {
            const ct_value_t *o = ct_dict_get(b->u.dict, a->u.dict->keys[i], a->u.dict->klen[i]);
            if (!o || !ct_equal(&a->u.dict->vals[i], o)) {
                return false;
            }
        }
        return true;
    case V_NS:
        return a->u.dict == b->u.dict;
    case V_MACRO:
        return a->u.macro == b->u.macro;
    default:
        return false;
    }
}

/* ---- str() and repr() ---- */

/* Python's repr of a float: the shortest digits that read back to the same double. */
static void fmt_float(double f, baton_buf_t *b)
{
    if (isnan(f)) {
        baton_buf_append_str(b, "nan");
        return;
    }
    if (isinf(f)) {
        baton_buf_append_str(b, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    for (int p = 0; p < 17; p++) {
        snprintf(e, sizeof(e), "%.*e", p, f);
        if (strtod(e, NULL) == f) {
            break;
        }
    }
    /* e is [-]d[.ddd]e[+-]XX */
    char digits[24];
    size_t nd = 0;
    const char *q = e;
    bool neg = *q == '-';
    q += neg;
    while (*q && *q != 'e') {
        if (*q != '.') {
            digits[nd++] = *q;
        }
        q++;
    }
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') {
        nd--;
    }
    if (neg) {
        baton_buf_append(b, "-", 1);
    }
    if (exp < -4 || exp >= 16) {
        baton_buf_append(b, digits, 1);
        if (nd > 1) {
            baton_buf_append(b, ".", 1);
            baton_buf_append(b, digits + 1, nd - 1);
        }
        baton_buf_printf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        return;
    }
    if (exp < 0) {
        baton_buf_append(b, "0.", 2);
        for (int i = 0; i < -exp - 1; i++) {
            baton_buf_append(b, "0", 1);
        }
        baton_buf_append(b, digits, nd);
        return;
    }
    for (int i = 0; i <= exp; i++) {
        baton_buf_append(b, i < (int)nd ? &digits[i] : "0", 1);
    }
    baton_buf_append(b, ".", 1);
    if ((int)nd > exp + 1) {
        baton_buf_append(b, digits + exp + 1, nd - (size_t)exp - 1);
    } else {
        baton_buf_append(b, "0", 1);
    }
}

static void repr_str(const char *s, size_t n, baton_buf_t *b)
{
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    baton_buf_append(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == (unsigned char)q || c == '\\') {
            char e[2] = {'\\', (char)c};
            baton_buf_append(b, e, 2);
        } else if (c == '\n') {
            baton_buf_append(b, "\\n", 2);
        } else if (c == '\r') {
            baton_buf_append(b, "\\r", 2);
        } else if (c == '\t') {
            baton_buf_append(b, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f) {
            baton_buf_printf(b, "\\x%02x", c);
        } else {
            baton_buf_append(b, &s[i], 1);
        }
    }
    baton_buf_append(b, &q, 1);
}

static void to_str(ct_rt_t *rt, const ct_value_t *v, baton_buf_t *b, bool repr, unsigned depth)
{
    if (depth > rt->lim.max_depth) {
        ct_throw(rt, BATON_ETOOBIG, "value nested deeper than %u", rt->lim.max_depth);
    }
    switch (v->k) {
    case V_UNDEF:
        break;
    case V_NONE:
        baton_buf_append_str(b, "None");
        break;
    case V_BOOL:
        baton_buf_append_str(b, v->u.b ? "True" : "False");
        break;
    case V_INT:
        baton_buf_printf(b, "%lld", (long long)v->u.i);
        break;
    case V_FLOAT:
        fmt_float(v->u.f, b);
        break;
    case V_STR:
        if (repr) {
            repr_str(v->u.s.p, v->u.s.n, b);
        } else {
            baton_buf_append(b, v->u.s.p, v->u.s.n);
        }
        break;
    case V_LIST:
        baton_buf_append(b, "[", 1);
        for (size_t i = 0; i < v->u.list->n; i++) {
            if (i) {
                baton_buf_append(b, ", ", 2);
            }
            to_str(rt, &v->u.list->v[i], b, true, depth + 1);
        }
        baton_buf_append(b, "]", 1);
        break;
    case V_NS:
        baton_buf_append_str(b, "<Namespace ");
        /* fall through */
    case V_DICT:
        baton_buf_append(b, "{", 1);
        for (size_t i = 0; i < v->u.dict->n; i++) {
            if (i) {
                baton_buf_append(b, ", ", 2);
            }
            repr_str(v->u.dict->keys[i], v->u.dict->klen[i], b);
            baton_buf_append(b, ": ", 2);
            to_str(rt, &v->u.dict->vals[i], b, true, depth + 1);
        }
        baton_buf_append(b, "}", 1);
        if (v->k == V_NS) {
            baton_buf_append(b, ">", 1);
        }
        break;
    default:
        baton_buf_printf(b, "<%s>", ct_type_name(v));
        break;
    }
    if (b->len > rt->lim.max_memory) {
        ct_throw(rt, BATON_ETOOBIG, "a string over %zu bytes", rt->lim.max_memory);
    }
}

void ct_to_str(ct_rt_t *rt, const ct_value_t *v, baton_buf_t *b)
{
    to_str(rt, v, b, false, 0);
}

ct_value_t ct_stringify(ct_rt_t *rt, const ct_value_t *v)
{
    if (v->k == V_STR) {
        return *v;
    }
    baton_buf_t *b = ct_buf_open(rt);
    to_str(rt, v, b, false, 0);
    return ct_buf_close(rt, b);
}

/* ---- JSON input ---- */

ct_value_t ct_from_json(ct_rt_t *rt, const json_t *j, unsigned depth)
{
    if (depth > rt->lim.max_depth) {
        ct_throw(rt, BATON_ETOOBIG, "input JSON nested deeper than %u", rt->lim.max_depth);
    }
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        ct_dict_t *d = ct_dict_new(rt, json_object_size(j));
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v)
        {
            ct_dict_set(rt, d, k, strlen(k), ct_from_json(rt, v, depth + 1));
        }
        return (ct_value_t){.k = V_DICT, .u.dict = d};
    }
    case JSON_ARRAY: {
        ct_list_t *l = ct_list_new(rt, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++) {
            ct_list_push(rt, l, ct_from_json(rt, json_array_get(j, i), depth + 1));
        }
        return (ct_value_t){.k = V_LIST, .u.list = l};
    }
    case JSON_STRING:
        return ct_str(json_string_value(j), json_string_length(j));
    case JSON_INTEGER:
        return ct_int((int64_t)json_integer_value(j));
    case JSON_REAL: {
        ct_value_t v = {.k = V_FLOAT};
        v.u.f = json_real_value(j);
        return v;
    }
    case JSON_TRUE:
        return ct_bool(true);
    case JSON_FALSE:
        return ct_bool(false);
    default:
        return ct_none();
    }
}

/* ---- access ---- */

/* Byte offsets of the code points of s: off[0..cps], off[cps] == n. */
static size_t *cp_offsets(ct_rt_t *rt, const char *s, size_t n, size_t *cps)
{
    size_t *off = ct_rt_alloc(rt, (n + 1) * sizeof(*off));
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            off[k++] = i;
        }
    }
    off[k] = n;
    *cps = k;
    return off;
}

const ct_list_t *ct_iterable(ct_rt_t *rt, const ct_value_t *v, const char *what)
{
    switch (v->k) {
    case V_LIST:
        return v->u.list;
    case V_UNDEF:
        return ct_list_new(rt, 1); /* Jinja2: an undefined value iterates as empty */
    case V_DICT:
    case V_NS: {
        ct_list_t *l = ct_list_new(rt, v->u.dict->n);
        for (size_t i = 0; i < v->u.dict->n; i++) {
            ct_list_push(rt, l, ct_str(v->u.dict->keys[i], v->u.dict->klen[i]));
        }
        return l;
    }
    case V_STR: {
        size_t cps;
        size_t *off = cp_offsets(rt, v->u.s.p, v->u.s.n, &cps);
        ct_list_t *l = ct_list_new(rt, cps);
        for (size_t i = 0; i < cps; i++) {
            ct_list_push(rt, l, ct_str(v->u.s.p + off[i], off[i + 1] - off[i]));
        }
        return l;
    }
    default:
        break;
    }
    ct_throw(rt, BATON_EINVAL, "%s: %s is not iterable", what, ct_type_name(v));
}

static ct_value_t undef(const char *name)
{
    ct_value_t u = {.k = V_UNDEF, .undef_name = name};
    return u;
}

static ct_value_t bound(ct_rt_t *rt, const ct_value_t *obj, const char *name)
{
    ct_value_t *self = ct_rt_alloc(rt, sizeof(*self));
    *self = *obj;
    ct_value_t f = {.k = V_FUNC};
    f.u.func.fn = NULL; /* resolved by ct_call_value through the method table */
    f.u.func.name = name;
    f.u.func.self = self;
    return f;
}

ct_value_t ct_getattr(ct_rt_t *rt, const ct_value_t *obj, const char *name, size_t n)
{
    static const char *const dict_methods[] = {"items", "keys", "values", "get"};
    static const char *const str_methods[] = {
        "strip", "lstrip", "rstrip",     "startswith", "endswith", "split", "upper",
        "lower", "title",  "capitalize", "replace",    "join",     "find",  "count"};
    switch (obj->k) {
    case V_UNDEF:
        ct_throw(rt, BATON_EINVAL, "'%s' is undefined (reading its attribute '%s')",
                 obj->undef_name ? obj->undef_name : "value", name);
    case V_DICT:
        for (size_t i = 0; i < 4; i++) {
            if (strcmp(name, dict_methods[i]) == 0) {
                return bound(rt, obj, dict_methods[i]);
            }
        }
        /* fall through */
    case V_NS: {
        const ct_value_t *v = ct_dict_get(obj->u.dict, name, n);
        return v ? *v : undef(name);
    }
    case V_STR:
        for (size_t i = 0; i < sizeof(str_methods) / sizeof(str_methods[0]); i++) {
            if (strcmp(name, str_methods[i]) == 0) {
                return bound(rt, obj, str_methods[i]);
            }
        }
        return undef(name);
    case V_LOOP: {
        const ct_loop_t *l = obj->u.loop;
        size_t len = l->items->n, i = l->index0;
        if (!strcmp(name, "index0"))
            return ct_int((int64_t)i);
        if (!strcmp(name, "index"))
            return ct_int((int64_t)i + 1);
        if (!strcmp(name, "revindex"))
            return ct_int((int64_t)(len - i));
        if (!strcmp(name, "revindex0"))
            return ct_int((int64_t)(len - i - 1));
        if (!strcmp(name, "first"))
            return ct_bool(i == 0);
        if (!strcmp(name, "last"))
            return ct_bool(i + 1 == len);
        if (!strcmp(name, "length"))
            return ct_int((int64_t)len);
        if (!strcmp(name, "previtem"))
            return i ? l->items->v[i - 1] : undef(name);
        if (!strcmp(name, "nextitem"))
            return i + 1 < len ? l->items->v[i + 1] : undef(name);
        if (!strcmp(name, "cycle"))
            return bound(rt, obj, "cycle");
        return undef(name);
    }
    default:
        return undef(name);
    }
}

static bool norm_index(int64_t i, size_t n, size_t *out)
{
    if (i < 0) {
        i += (int64_t)n;
    }
    if (i < 0 || (uint64_t)i >= n) {
        return false;
    }
    *out = (size_t)i;
    return true;
}

ct_value_t ct_getitem(ct_rt_t *rt, const ct_value_t *obj, const ct_value_t *key)
{
    size_t i;
    switch (obj->k) {
    case V_UNDEF:
        ct_throw(rt, BATON_EINVAL, "'%s' is undefined (reading an item)",
                 obj->undef_name ? obj->undef_name : "value");
    case V_DICT:
    case V_NS:
        if (key->k == V_STR) {
            const ct_value_t *v = ct_dict_get(obj->u.dict, key->u.s.p, key->u.s.n);
            if (v) {
                return *v;
            }
            char *name = ct_rt_alloc(rt, key->u.s.n + 1);
            memcpy(name, key->u.s.p, key->u.s.n);
            return obj->k == V_DICT ? ct_getattr(rt, obj, name, key->u.s.n) : undef(name);
        }
        return undef("item");
    case V_LIST:
        if ((key->k == V_INT || key->k == V_BOOL) && norm_index(num_i(key), obj->u.list->n, &i)) {
            return obj->u.list->v[i];
        }
        return undef("item");
    case V_STR:
        if (key->k == V_INT) {
            size_t cps;
            size_t *off = cp_offsets(rt, obj->u.s.p, obj->u.s.n, &cps);
            if (norm_index(key->u.i, cps, &i)) {
                return ct_str(obj->u.s.p + off[i], off[i + 1] - off[i]);
            }
        }
        return undef("item");
    default:
        return undef("item");
    }
}

static int64_t slice_arg(ct_rt_t *rt, const ct_value_t *v, int64_t dflt)
{
    if (v->k == V_NONE || v->k == V_UNDEF) {
        return dflt;
    }
    if (v->k != V_INT && v->k != V_BOOL) {
        ct_throw(rt, BATON_EINVAL, "slice indices must be integers, not %s", ct_type_name(v));
    }
    return num_i(v);
}

ct_value_t ct_slice(ct_rt_t *rt, const ct_value_t *obj, const ct_value_t *start,
                    const ct_value_t *stop, const ct_value_t *stepv)
{
    size_t n, *off = NULL;
    if (obj->k == V_LIST) {
        n = obj->u.list->n;
    } else if (obj->k == V_STR) {
        off = cp_offsets(rt, obj->u.s.p, obj->u.s.n, &n);
    } else {
        ct_throw(rt, BATON_EINVAL, "%s cannot be sliced", ct_type_name(obj));
    }
    int64_t step = slice_arg(rt, stepv, 1);
    if (step == 0) {
        ct_throw(rt, BATON_EINVAL, "slice step cannot be zero");
    }
    int64_t len = (int64_t)n;
    int64_t lo = slice_arg(rt, start, step > 0 ? 0 : len - 1);
    int64_t hi = slice_arg(rt, stop, step > 0 ? len : -len - 1);
    /* Python's PySlice_AdjustIndices */
    if (lo < 0) {
        lo += len;
        if (lo < 0) {
            lo = step < 0 ? -1 : 0;
        }
    } else if (lo >= len) {
        lo = step < 0 ? len - 1 : len;
    }
    if (hi < 0) {
        hi += len;
        if (hi < 0) {
            hi = step < 0 ? -1 : 0;
        }
    } else if (hi >= len) {
        hi = step < 0 ? len - 1 : len;
    }
    ct_list_t *l = ct_list_new(rt, 4);
    baton_buf_t *b = obj->k == V_STR ? ct_buf_open(rt) : NULL;
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
        if (obj->k == V_LIST) {
            ct_list_push(rt, l, obj->u.list->v[i]);
        } else if (baton_buf_append(b, obj->u.s.p + off[i], off[i + 1] - off[i]) < 0) {
            ct_throw(rt, BATON_ENOMEM, "out of memory");
        }
    }
    if (obj->k == V_LIST) {
        return (ct_value_t){.k = V_LIST, .u.list = l};
    }
    return ct_buf_close(rt, b);
}

/* ---- operators ---- */

static bool contains(ct_rt_t *rt, const ct_value_t *hay, const ct_value_t *needle)
{
    switch (hay->k) {
    case V_STR:
        if (needle->k != V_STR) {
            ct_throw(rt, BATON_EINVAL, "'in <string>' requires a string, not %s",
                     ct_type_name(needle));
        }
        if (needle->u.s.n == 0) {
            return true;
        }
        return memmem(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n) != NULL;
    case V_LIST:
        for (size_t i = 0; i < hay->u.list->n; i++) {
            if (ct_equal(&hay->u.list->v[i], needle)) {
                return true;
            }
        }
        return false;
    case V_DICT:
    case V_NS:
        return needle->k == V_STR && ct_dict_get(hay->u.dict, needle->u.s.p, needle->u.s.n) != NULL;
    default:
        ct_throw(rt, BATON_EINVAL, "'in' on %s", ct_type_name(hay));
    }
}

int ct_compare(ct_rt_t *rt, const char *op, const ct_value_t *a, const ct_value_t *b)
{
    if (!strcmp(op, "==")) {
        return ct_equal(a, b);
    }
    if (!strcmp(op, "!=")) {
        return !ct_equal(a, b);
    }
    if (!strcmp(op, "in")) {
        return contains(rt, b, a);
    }
    if (!strcmp(op, "not in")) {
        return !contains(rt, b, a);
    }
    int c;
    if (is_num(a) && is_num(b)) {
        if (a->k != V_FLOAT && b->k != V_FLOAT) {
            c = num_i(a) < num_i(b) ? -1 : num_i(a) > num_i(b);
        } else {
            double x = num_f(a), y = num_f(b);
            if (isnan(x) || isnan(y)) {
                return false;
            }
            c = x < y ? -1 : x > y;
        }
    } else if (a->k == V_STR && b->k == V_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        c = memcmp(a->u.s.p, b->u.s.p, n);
        if (c == 0) {
            c = a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
        }
    } else {
        ct_throw(rt, BATON_EINVAL, "'%s' not supported between %s and %s", op, ct_type_name(a),
                 ct_type_name(b));
    }
    if (!strcmp(op, "<")) {
        return c < 0;
    }
    if (!strcmp(op, ">")) {
        return c > 0;
    }
    if (!strcmp(op, "<=")) {
        return c <= 0;
    }
    return c >= 0;
}

static ct_value_t concat_str(ct_rt_t *rt, const ct_value_t *a, const ct_value_t *b)
{
    size_t n = a->u.s.n + b->u.s.n;
    char *s = ct_rt_bytes(rt, n);
    memcpy(s, a->u.s.p, a->u.s.n);
    memcpy(s + a->u.s.n, b->u.s.p, b->u.s.n);
    return ct_str(s, n);
}

static ct_value_t fl(double f)
{
    ct_value_t v = {.k = V_FLOAT};
    v.u.f = f;
    return v;
}

static ct_value_t repeat(ct_rt_t *rt, const ct_value_t *seq, int64_t times)
{
    if (times < 0) {
        times = 0;
    }
    size_t unit = seq->k == V_STR ? seq->u.s.n : seq->u.list->n * sizeof(ct_value_t);
    if (unit && (uint64_t)times > rt->lim.max_memory / unit) {
        ct_throw(rt, BATON_ETOOBIG, "repetition over the memory limit");
    }
    if (seq->k == V_STR) {
        char *s = ct_rt_bytes(rt, unit * (size_t)times);
        for (int64_t i = 0; i < times; i++) {
            memcpy(s + unit * (size_t)i, seq->u.s.p, unit);
        }
        return ct_str(s, unit * (size_t)times);
    }
    ct_list_t *l = ct_list_new(rt, seq->u.list->n * (size_t)times);
    for (int64_t i = 0; i < times; i++) {
        for (size_t j = 0; j < seq->u.list->n; j++) {
            ct_list_push(rt, l, seq->u.list->v[j]);
        }
    }
    return (ct_value_t){.k = V_LIST, .u.list = l};
}

ct_value_t ct_binop(ct_rt_t *rt, const char *op, const ct_value_t *a, const ct_value_t *b)
{
    if (op[0] == '~') {
        ct_value_t x = a->k == V_UNDEF ? ct_str("", 0) : ct_stringify(rt, a);
        ct_value_t y = b->k == V_UNDEF ? ct_str("", 0) : ct_stringify(rt, b);
        return concat_str(rt, &x, &y);
    }
    if (op[0] == '+' && a->k == V_STR && b->k == V_STR) {
        return concat_str(rt, a, b);
    }
    if (op[0] == '+' && a->k == V_LIST && b->k == V_LIST) {
        ct_list_t *l = ct_list_new(rt, a->u.list->n + b->u.list->n);
        for (size_t i = 0; i < a->u.list->n; i++) {
            ct_list_push(rt, l, a->u.list->v[i]);
        }
        for (size_t i = 0; i < b->u.list->n; i++) {
            ct_list_push(rt, l, b->u.list->v[i]);
        }
        return (ct_value_t){.k = V_LIST, .u.list = l};
    }
    if (op[0] == '*' && !op[1]) {
        if ((a->k == V_STR || a->k == V_LIST) && (b->k == V_INT || b->k == V_BOOL)) {
            return repeat(rt, a, num_i(b));
        }
        if ((b->k == V_STR || b->k == V_LIST) && (a->k == V_INT || a->k == V_BOOL)) {
            return repeat(rt, b, num_i(a));
        }
    }
    if (!is_num(a) || !is_num(b)) {
        ct_throw(rt, BATON_EINVAL, "unsupported operand types for %s: %s and %s", op,
                 ct_type_name(a), ct_type_name(b));
    }
    bool ints = a->k != V_FLOAT && b->k != V_FLOAT;
    int64_t x = ints ? num_i(a) : 0, y = ints ? num_i(b) : 0, r;
    double fx = num_f(a), fy = num_f(b);
    switch (op[0]) {
    case '+':
        if (!ints) {
            return fl(fx + fy);
        }
        if (__builtin_add_overflow(x, y, &r)) {
            ct_throw(rt, BATON_EINVAL, "integer overflow");
        }
        return ct_int(r);
    case '-':
        if (!ints) {
            return fl(fx - fy);
        }
        if (__builtin_sub_overflow(x, y, &r)) {
            ct_throw(rt, BATON_EINVAL, "integer overflow");
        }
        return ct_int(r);
    case '*':
        if (op[1] == '*') {
            if (ints && y >= 0) {
                int64_t acc = 1;
                for (int64_t i = 0; i < y; i++) {
                    if (__builtin_mul_overflow(acc, x, &acc)) {
                        ct_throw(rt, BATON_EINVAL, "integer overflow");
                    }
                    if (acc == 0 || acc == 1) {
                        break;
                    }
                }
                return ct_int(acc);
            }
            return fl(pow(fx, fy));
        }
        if (!ints) {
            return fl(fx * fy);
        }
        if (__builtin_mul_overflow(x, y, &r)) {
            ct_throw(rt, BATON_EINVAL, "integer overflow");
        }
        return ct_int(r);
    case '/':
        if (ints ? y == 0 : fy == 0.0) {
            ct_throw(rt, BATON_EINVAL, "division by zero");
        }
        if (op[1] == '/') {
            if (!ints) {
                return fl(floor(fx / fy));
            }
            if (x == INT64_MIN && y == -1) {
                ct_throw(rt, BATON_EINVAL, "integer overflow");
            }
            r = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) {
                r--;
            }
            return ct_int(r);
        }
        return fl(fx / fy);
    case '%':
        if (ints ? y == 0 : fy == 0.0) {
            ct_throw(rt, BATON_EINVAL, "modulo by zero");
        }
        if (!ints) {
            double m = fmod(fx, fy);
            if (m != 0 && ((m < 0) != (fy < 0))) {
                m += fy;
            }
            return fl(m);
        }
        if (y == -1) {
            return ct_int(0);
        }
        r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
            r += y;
        }
        return ct_int(r);
    default:
        break;
    }
    ct_throw(rt, BATON_EINVAL, "unknown operator %s", op);
}
