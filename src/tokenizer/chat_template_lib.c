/* tokenizer/chat_template_lib.c — the chat-template library: the filters, tests, globals and
 * string/dict methods of the supported subset, and tojson as Python's json.dumps writes it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "baton/error.h"
#include "tokenizer/chat_template_int.h"

static const char *const FILTERS[] = {
    "abs",        "capitalize", "count",   "d",     "default",    "first", "float",  "indent",
    "int",        "items",      "join",    "last",  "length",     "list",  "lower",  "map",
    "rejectattr", "replace",    "reverse", "safe",  "selectattr", "sort",  "string", "title",
    "tojson",     "trim",       "unique",  "upper", "wordcount"};
static const char *const TESTS[] = {
    "boolean", "callable", "defined",  "divisibleby", "eq",   "equalto",   "even",
    "false",   "float",    "ge",       "gt",          "in",   "integer",   "iterable",
    "le",      "lower",    "lt",       "mapping",     "ne",   "none",      "number",
    "odd",     "sameas",   "sequence", "string",      "true", "undefined", "upper"};
static const char *const GLOBALS[] = {"raise_exception", "namespace", "range", "dict",
                                      "strftime_now"};
static const char *const METHODS[] = {"strip",   "lstrip", "rstrip", "startswith", "endswith",
                                      "split",   "upper",  "lower",  "title",      "capitalize",
                                      "replace", "join",   "find",   "count",      "items",
                                      "keys",    "values", "get",    "cycle"};

static bool in_set(const char *name, const char *const *set, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(name, set[i]) == 0) {
            return true;
        }
    }
    return false;
}
#define IN(name, set) in_set(name, set, sizeof(set) / sizeof(set[0]))

bool ct_filter_known(const char *name)
{
    return IN(name, FILTERS);
}
bool ct_test_known(const char *name)
{
    return IN(name, TESTS);
}
bool ct_global_known(const char *name)
{
    return IN(name, GLOBALS);
}
bool ct_method_known(const char *name)
{
    return IN(name, METHODS);
}

ct_value_t ct_global(const char *name)
{
    ct_value_t v = {.k = V_UNDEF};
    for (size_t i = 0; i < sizeof(GLOBALS) / sizeof(GLOBALS[0]); i++) {
        if (strcmp(name, GLOBALS[i]) == 0) {
            v.k = V_FUNC;
            v.u.func.name = GLOBALS[i];
        }
    }
    return v;
}

/* ---- arguments ---- */

typedef struct {
    int argc;
    const ct_value_t *argv;
    const char *const *kw;
} args_t;

/* Argument pos, or the keyword name; NULL when absent. */
static const ct_value_t *arg(const args_t *a, int pos, const char *name)
{
    int p = 0;
    for (int i = 0; i < a->argc; i++) {
        if (a->kw && a->kw[i]) {
            if (name && strcmp(a->kw[i], name) == 0) {
                return &a->argv[i];
            }
        } else if (p++ == pos) {
            return &a->argv[i];
        }
    }
    return NULL;
}

static void check_args(ct_rt_t *rt, const char *what, const args_t *a, int maxpos,
                       const char *const *names)
{
    int p = 0;
    for (int i = 0; i < a->argc; i++) {
        if (a->kw && a->kw[i]) {
            bool ok = false;
            for (const char *const *n = names; n && *n; n++) {
                ok |= strcmp(*n, a->kw[i]) == 0;
            }
            if (!ok) {
                ct_throw(rt, BATON_ENOTSUP,
                         "%s: keyword argument '%s' is outside the supported subset", what,
                         a->kw[i]);
            }
        } else {
            p++;
        }
    }
    if (p > maxpos) {
        ct_throw(rt, BATON_EINVAL, "%s takes at most %d positional arguments", what, maxpos);
    }
}

static const ct_value_t *need_str(ct_rt_t *rt, const char *what, const ct_value_t *v)
{
    if (!v || v->k != V_STR) {
        ct_throw(rt, BATON_EINVAL, "%s: expected a string, got %s", what,
                 v ? ct_type_name(v) : "nothing");
    }
    return v;
}

static int64_t need_int(ct_rt_t *rt, const char *what, const ct_value_t *v, int64_t dflt)
{
    if (!v || v->k == V_NONE) {
        return dflt;
    }
    if (v->k != V_INT && v->k != V_BOOL) {
        ct_throw(rt, BATON_EINVAL, "%s: expected an integer, got %s", what, ct_type_name(v));
    }
    return v->k == V_INT ? v->u.i : v->u.b;
}

static ct_value_t list_val(ct_list_t *l)
{
    return (ct_value_t){.k = V_LIST, .u.list = l};
}

/* attribute path "a.b" of an item, as Jinja's attribute= arguments read it */
static ct_value_t attr_path(ct_rt_t *rt, const ct_value_t *item, const ct_value_t *path)
{
    ct_value_t cur = *item;
    size_t i = 0;
    while (i <= path->u.s.n) {
        const char *dot = memchr(path->u.s.p + i, '.', path->u.s.n - i);
        size_t e = dot ? (size_t)(dot - path->u.s.p) : path->u.s.n;
        ct_value_t key = ct_str_copy(rt, path->u.s.p + i, e - i);
        if (cur.k == V_UNDEF) {
            return cur;
        }
        cur = ct_getitem(rt, &cur, &key);
        i = e + 1;
    }
    return cur;
}

/* ---- filters ---- */

static ct_value_t select_attr(ct_rt_t *rt, const ct_value_t *v, const args_t *a, bool keep)
{
    const ct_list_t *items = ct_iterable(rt, v, keep ? "selectattr" : "rejectattr");
    const ct_value_t *path = need_str(rt, "selectattr", arg(a, 0, NULL));
    const ct_value_t *test = arg(a, 1, NULL);
    if (test) {
        need_str(rt, "selectattr", test);
    }
    char tname[32] = "";
    if (test) {
        if (test->u.s.n >= sizeof(tname)) {
            ct_throw(rt, BATON_ENOTSUP, "selectattr: unknown test");
        }
        memcpy(tname, test->u.s.p, test->u.s.n);
        tname[test->u.s.n] = 0;
        if (!ct_test_known(tname)) {
            ct_throw(rt, BATON_ENOTSUP, "test '%s' is outside the supported subset", tname);
        }
    }
    int targc = a->argc > 2 ? a->argc - 2 : 0;
    ct_list_t *out = ct_list_new(rt, items->n);
    for (size_t i = 0; i < items->n; i++) {
        ct_value_t x = attr_path(rt, &items->v[i], path);
        bool r = test ? ct_apply_test(rt, tname, &x, targc, a->argv + 2) : ct_truthy(&x);
        if (r == keep) {
            ct_list_push(rt, out, items->v[i]);
        }
    }
    return list_val(out);
}

static int value_cmp(const void *x, const void *y, void *rt_)
{
    return ct_compare(rt_, "<", x, y) ? -1 : ct_compare(rt_, ">", x, y) ? 1 : 0;
}

ct_value_t ct_apply_filter(ct_rt_t *rt, const char *name, const ct_value_t *v, int argc,
                           const ct_value_t *argv, const char *const *kwnames)
{
    args_t a = {argc, argv, kwnames};
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        static const char *const kw[] = {"default_value", "boolean", NULL};
        check_args(rt, name, &a, 2, kw);
        const ct_value_t *dv = arg(&a, 0, "default_value");
        const ct_value_t *bo = arg(&a, 1, "boolean");
        bool use = v->k == V_UNDEF || (bo && ct_truthy(bo) && !ct_truthy(v));
        return use ? (dv ? *dv : ct_str("", 0)) : *v;
    }
    if (!strcmp(name, "tojson")) {
        static const char *const kw[] = {"indent", "sort_keys", NULL};
        check_args(rt, name, &a, 1, kw);
        const ct_value_t *ind = arg(&a, 0, "indent");
        const ct_value_t *sk = arg(&a, -1, "sort_keys");
        int64_t indent = ind && ind->k != V_NONE ? need_int(rt, "tojson", ind, -1) : -1;
        if (indent > 64) {
            ct_throw(rt, BATON_EINVAL, "tojson: indent over 64");
        }
        baton_buf_t *b = ct_buf_open(rt);
        ct_to_json(rt, v, b, indent, sk && ct_truthy(sk), 0);
        return ct_buf_close(rt, b);
    }
    if (!strcmp(name, "safe")) {
        return *v;
    }
    if (v->k == V_UNDEF && strcmp(name, "string") && strcmp(name, "length") &&
        strcmp(name, "count") && strcmp(name, "list")) {
        ct_throw(rt, BATON_EINVAL, "'%s' is undefined (filter %s)",
                 v->undef_name ? v->undef_name : "value", name);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        check_args(rt, name, &a, 0, NULL);
        if (v->k == V_STR) {
            return ct_int((int64_t)ct_cp_len(v));
        }
        if (v->k == V_UNDEF) {
            return ct_int(0);
        }
        return ct_int((int64_t)ct_iterable(rt, v, name)->n);
    }
    if (!strcmp(name, "string")) {
        return v->k == V_UNDEF ? ct_str("", 0) : ct_stringify(rt, v);
    }
    if (!strcmp(name, "list")) {
        const ct_list_t *l = ct_iterable(rt, v, name);
        ct_list_t *c = ct_list_new(rt, l->n);
        for (size_t i = 0; i < l->n; i++) {
            ct_list_push(rt, c, l->v[i]);
        }
        return list_val(c);
    }
    if (!strcmp(name, "trim")) {
        check_args(rt, name, &a, 1, NULL);
        const ct_value_t *chars = arg(&a, 0, NULL);
        ct_value_t s = ct_stringify(rt, v);
        return ct_strip(&s, chars ? need_str(rt, name, chars) : NULL, true, true);
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") ||
        !strcmp(name, "capitalize")) {
        ct_value_t s = ct_stringify(rt, v);
        int mode = name[0] == 'u'   ? CASE_UPPER
                   : name[0] == 'l' ? CASE_LOWER
                   : name[0] == 't' ? CASE_TITLE
                                    : CASE_CAPITALIZE;
        return ct_recase(rt, &s, mode);
    }
    if (!strcmp(name, "replace")) {
        check_args(rt, name, &a, 3, NULL);
        ct_value_t s = ct_stringify(rt, v);
        return ct_replace(rt, &s, need_str(rt, name, arg(&a, 0, NULL)),
                          need_str(rt, name, arg(&a, 1, NULL)),
                          need_int(rt, name, arg(&a, 2, NULL), -1));
    }
    if (!strcmp(name, "join")) {
        static const char *const kw[] = {"d", "attribute", NULL};
        check_args(rt, name, &a, 1, kw);
        const ct_value_t *sep = arg(&a, 0, "d");
        const ct_value_t *attr = arg(&a, 1, "attribute");
        const ct_list_t *l = ct_iterable(rt, v, name);
        if (attr) {
            ct_list_t *m = ct_list_new(rt, l->n);
            for (size_t i = 0; i < l->n; i++) {
                ct_list_push(rt, m, attr_path(rt, &l->v[i], need_str(rt, name, attr)));
            }
            l = m;
        }
        return ct_join(rt, l, sep ? need_str(rt, name, sep) : NULL);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        const ct_list_t *l = ct_iterable(rt, v, name);
        if (!l->n) {
            return (ct_value_t){.k = V_UNDEF, .undef_name = name};
        }
        return l->v[name[0] == 'f' ? 0 : l->n - 1];
    }
    if (!strcmp(name, "reverse")) {
        if (v->k == V_STR) {
            ct_value_t none = ct_none(), m1 = ct_int(-1);
            return ct_slice(rt, v, &none, &none, &m1);
        }
        const ct_list_t *l = ct_iterable(rt, v, name);
        ct_list_t *r = ct_list_new(rt, l->n);
        for (size_t i = l->n; i-- > 0;) {
            ct_list_push(rt, r, l->v[i]);
        }
        return list_val(r);
    }
    if (!strcmp(name, "items")) {
        if (v->k != V_DICT && v->k != V_NS) {
            ct_throw(rt, BATON_EINVAL, "items: expected a mapping, got %s", ct_type_name(v));
        }
        ct_list_t *r = ct_list_new(rt, v->u.dict->n);
        for (size_t i = 0; i < v->u.dict->n; i++) {
            ct_list_t *pair = ct_list_new(rt, 2);
            ct_list_push(rt, pair, ct_str(v->u.dict->keys[i], v->u.dict->klen[i]));
            ct_list_push(rt, pair, v->u.dict->vals[i]);
            ct_list_push(rt, r, list_val(pair));
        }
        return list_val(r);
    }
    if (!strcmp(name, "map")) {
        static const char *const kw[] = {"attribute", "default", NULL};
        check_args(rt, name, &a, 1, kw);
        const ct_list_t *l = ct_iterable(rt, v, name);
        const ct_value_t *attr = arg(&a, -1, "attribute");
        const ct_value_t *filt = arg(&a, 0, NULL);
        const ct_value_t *dflt = arg(&a, -1, "default");
        ct_list_t *r = ct_list_new(rt, l->n);
        char fname[32] = "";
        if (!attr) {
            need_str(rt, name, filt);
            if (filt->u.s.n >= sizeof(fname)) {
                ct_throw(rt, BATON_ENOTSUP, "map: unknown filter");
            }
            memcpy(fname, filt->u.s.p, filt->u.s.n);
            if (!ct_filter_known(fname) || !strcmp(fname, "map")) {
                ct_throw(rt, BATON_ENOTSUP, "filter '%s' is outside the supported subset", fname);
            }
        }
        for (size_t i = 0; i < l->n; i++) {
            ct_value_t x;
            if (attr) {
                x = attr_path(rt, &l->v[i], need_str(rt, name, attr));
                if (x.k == V_UNDEF && dflt) {
                    x = *dflt;
                }
            } else {
                x = ct_apply_filter(rt, fname, &l->v[i], 0, NULL, NULL);
            }
            ct_list_push(rt, r, x);
        }
        return list_val(r);
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr")) {
        return select_attr(rt, v, &a, name[0] == 's');
    }
    if (!strcmp(name, "unique")) {
        const ct_list_t *l = ct_iterable(rt, v, name);
        ct_list_t *r = ct_list_new(rt, l->n);
        for (size_t i = 0; i < l->n; i++) {
            bool seen = false;
            for (size_t j = 0; j < r->n && !seen; j++) {
                seen = ct_equal(&r->v[j], &l->v[i]);
            }
            if (!seen) {
                ct_list_push(rt, r, l->v[i]);
            }
        }
        return list_val(r);
    }
    if (!strcmp(name, "sort")) {
        static const char *const kw[] = {"reverse", "attribute", NULL};
        check_args(rt, name, &a, 0, kw);
        if (arg(&a, -1, "attribute")) {
            ct_throw(rt, BATON_ENOTSUP, "sort: attribute= is outside the supported subset");
        }
        const ct_list_t *l = ct_iterable(rt, v, name);
        ct_list_t *r = ct_list_new(rt, l->n);
        for (size_t i = 0; i < l->n; i++) {
            ct_list_push(rt, r, l->v[i]);
        }
        qsort_r(r->v, r->n, sizeof(*r->v), value_cmp, rt);
        const ct_value_t *rev = arg(&a, -1, "reverse");
        if (rev && ct_truthy(rev)) {
            for (size_t i = 0; i < r->n / 2; i++) {
                ct_value_t t = r->v[i];
                r->v[i] = r->v[r->n - 1 - i];
                r->v[r->n - 1 - i] = t;
            }
        }
        return list_val(r);
    }
    if (!strcmp(name, "int")) {
        if (v->k == V_INT) {
            return *v;
        }
        if (v->k == V_FLOAT && isfinite(v->u.f) && fabs(v->u.f) < 9.2e18) {
            return ct_int((int64_t)v->u.f);
        }
        if (v->k == V_BOOL) {
            return ct_int(v->u.b);
        }
        if (v->k == V_STR) {
            char buf[32];
            ct_value_t s = ct_strip(v, NULL, true, true);
            if (s.u.s.n && s.u.s.n < sizeof(buf)) {
                memcpy(buf, s.u.s.p, s.u.s.n);
                buf[s.u.s.n] = 0;
                char *end;
                long long x = strtoll(buf, &end, 10);
                if (!*end) {
                    return ct_int(x);
                }
            }
        }
        return ct_int(0);
    }
    if (!strcmp(name, "float")) {
        ct_value_t r = {.k = V_FLOAT};
        if (v->k == V_INT || v->k == V_BOOL) {
            r.u.f = v->k == V_INT ? (double)v->u.i : v->u.b;
        } else if (v->k == V_FLOAT) {
            r = *v;
        } else if (v->k == V_STR && v->u.s.n < 64) {
            char buf[64], *end;
            memcpy(buf, v->u.s.p, v->u.s.n);
            buf[v->u.s.n] = 0;
            r.u.f = strtod(buf, &end);
            if (*end || end == buf) {
                r.u.f = 0;
            }
        }
        return r;
    }
    if (!strcmp(name, "abs")) {
        if (v->k == V_INT && v->u.i != INT64_MIN) {
            return ct_int(v->u.i < 0 ? -v->u.i : v->u.i);
        }
        if (v->k == V_FLOAT) {
            ct_value_t r = *v;
            r.u.f = fabs(r.u.f);
            return r;
        }
        ct_throw(rt, BATON_EINVAL, "abs: bad operand %s", ct_type_name(v));
    }
    if (!strcmp(name, "indent")) {
        static const char *const kw[] = {"width", "first", "blank", NULL};
        check_args(rt, name, &a, 3, kw);
        const ct_value_t *w = arg(&a, 0, "width");
        const ct_value_t *first = arg(&a, 1, "first");
        const ct_value_t *blank = arg(&a, 2, "blank");
        ct_value_t pad = ct_str("    ", 4);
        if (w && w->k == V_STR) {
            pad = *w;
        } else if (w) {
            int64_t n = need_int(rt, name, w, 4);
            if (n < 0 || n > 256) {
                ct_throw(rt, BATON_EINVAL, "indent: width out of range");
            }
            char *sp = ct_rt_alloc(rt, (size_t)n + 1);
            memset(sp, ' ', (size_t)n);
            pad = ct_str(sp, (size_t)n);
        }
        ct_value_t s = ct_stringify(rt, v);
        baton_buf_t *bp = ct_buf_open(rt);
        size_t i = 0;
        bool first_line = true;
        while (i <= s.u.s.n) {
            const char *nl = memchr(s.u.s.p + i, '\n', s.u.s.n - i);
            size_t e = nl ? (size_t)(nl - s.u.s.p) : s.u.s.n;
            bool empty = e == i;
            if ((!first_line || (first && ct_truthy(first))) &&
                (!empty || (blank && ct_truthy(blank)))) {
                baton_buf_append(bp, pad.u.s.p, pad.u.s.n);
            }
            baton_buf_append(bp, s.u.s.p + i, e - i);
            if (!nl) {
                break;
            }
            baton_buf_append(bp, "\n", 1);
            i = e + 1;
            first_line = false;
            if (bp->len > rt->lim.max_memory) {
                break;
            }
        }
        return ct_buf_close(rt, bp);
    }
    if (!strcmp(name, "wordcount")) {
        ct_value_t s = ct_stringify(rt, v);
        return ct_int((int64_t)ct_split(rt, &s, NULL, -1).u.list->n);
    }
    ct_throw(rt, BATON_ENOTSUP, "filter '%s' is outside the supported subset", name);
}

/* ---- tests ---- */

bool ct_apply_test(ct_rt_t *rt, const char *name, const ct_value_t *v, int argc,
                   const ct_value_t *argv)
{
    const ct_value_t *x = argc > 0 ? &argv[0] : NULL;
    if (!strcmp(name, "defined"))
        return v->k != V_UNDEF;
    if (!strcmp(name, "undefined"))
        return v->k == V_UNDEF;
    if (!strcmp(name, "none"))
        return v->k == V_NONE;
    if (!strcmp(name, "boolean"))
        return v->k == V_BOOL;
    if (!strcmp(name, "true"))
        return v->k == V_BOOL && v->u.b;
    if (!strcmp(name, "false"))
        return v->k == V_BOOL && !v->u.b;
    if (!strcmp(name, "string"))
        return v->k == V_STR;
    if (!strcmp(name, "number"))
        return v->k == V_INT || v->k == V_FLOAT || v->k == V_BOOL;
    if (!strcmp(name, "integer"))
        return v->k == V_INT;
    if (!strcmp(name, "float"))
        return v->k == V_FLOAT;
    if (!strcmp(name, "mapping"))
        return v->k == V_DICT || v->k == V_NS;
    if (!strcmp(name, "iterable"))
        return v->k == V_LIST || v->k == V_DICT || v->k == V_STR || v->k == V_NS;
    if (!strcmp(name, "sequence"))
        return v->k == V_LIST || v->k == V_DICT || v->k == V_STR;
    if (!strcmp(name, "callable"))
        return v->k == V_FUNC || v->k == V_MACRO;
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v->k != V_STR) {
            return false;
        }
        ct_value_t r = ct_recase(rt, v, name[0] == 'l' ? CASE_LOWER : CASE_UPPER);
        return ct_equal(&r, v);
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v->k != V_INT) {
            ct_throw(rt, BATON_EINVAL, "test %s: expected an integer, got %s", name,
                     ct_type_name(v));
        }
        int64_t d = name[0] == 'd' ? need_int(rt, name, x, 1) : 2;
        if (d == 0) {
            ct_throw(rt, BATON_EINVAL, "divisibleby 0");
        }
        int64_t m = d == -1 ? 0 : v->u.i % d;
        return name[0] == 'o' ? m != 0 : m == 0;
    }
    if (!x) {
        ct_throw(rt, BATON_EINVAL, "test %s needs an argument", name);
    }
    if (!strcmp(name, "eq") || !strcmp(name, "equalto"))
        return ct_equal(v, x);
    if (!strcmp(name, "ne"))
        return !ct_equal(v, x);
    if (!strcmp(name, "sameas")) {
        if (v->k != x->k)
            return false;
        if (v->k == V_BOOL)
            return v->u.b == x->u.b;
        return v->k == V_NONE || v->k == V_UNDEF || ct_equal(v, x);
    }
    if (!strcmp(name, "lt"))
        return ct_compare(rt, "<", v, x);
    if (!strcmp(name, "le"))
        return ct_compare(rt, "<=", v, x);
    if (!strcmp(name, "gt"))
        return ct_compare(rt, ">", v, x);
    if (!strcmp(name, "ge"))
        return ct_compare(rt, ">=", v, x);
    if (!strcmp(name, "in"))
        return ct_compare(rt, "in", v, x);
    ct_throw(rt, BATON_ENOTSUP, "test '%s' is outside the supported subset", name);
}

/* ---- calls: globals and methods ---- */

static ct_value_t call_method(ct_rt_t *rt, const char *name, const ct_value_t *self,
                              const args_t *a)
{
    if (self->k == V_LOOP) { /* loop.cycle(a, b, ...) */
        if (a->argc == 0) {
            ct_throw(rt, BATON_EINVAL, "loop.cycle needs arguments");
        }
        return a->argv[self->u.loop->index0 % (size_t)a->argc];
    }
    if (self->k == V_DICT) {
        const ct_dict_t *d = self->u.dict;
        if (!strcmp(name, "get")) {
            check_args(rt, "get", a, 2, NULL);
            const ct_value_t *k = arg(a, 0, NULL);
            const ct_value_t *v = k && k->k == V_STR ? ct_dict_get(d, k->u.s.p, k->u.s.n) : NULL;
            const ct_value_t *dflt = arg(a, 1, NULL);
            return v ? *v : dflt ? *dflt : ct_none();
        }
        check_args(rt, name, a, 0, NULL);
        if (!strcmp(name, "items")) {
            return ct_apply_filter(rt, "items", self, 0, NULL, NULL);
        }
        ct_list_t *r = ct_list_new(rt, d->n);
        for (size_t i = 0; i < d->n; i++) {
            ct_list_push(rt, r, name[0] == 'k' ? ct_str(d->keys[i], d->klen[i]) : d->vals[i]);
        }
        return list_val(r);
    }
    /* string methods */
    static const char *const kw_split[] = {"sep", "maxsplit", NULL};
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        check_args(rt, name, a, 1, NULL);
        const ct_value_t *chars = arg(a, 0, NULL);
        if (chars && chars->k == V_NONE) {
            chars = NULL;
        }
        return ct_strip(self, chars ? need_str(rt, name, chars) : NULL, name[0] != 'r',
                        name[0] != 'l');
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        check_args(rt, name, a, 1, NULL);
        const ct_value_t *p = arg(a, 0, NULL);
        const ct_value_t *opts = p;
        size_t n = 1;
        if (p && p->k == V_LIST) {
            opts = p->u.list->v;
            n = p->u.list->n;
        }
        for (size_t i = 0; i < n; i++) {
            const ct_value_t *o = need_str(rt, name, &opts[i]);
            if (o->u.s.n <= self->u.s.n &&
                memcmp(self->u.s.p + (name[0] == 's' ? 0 : self->u.s.n - o->u.s.n), o->u.s.p,
                       o->u.s.n) == 0) {
                return ct_bool(true);
            }
        }
        return ct_bool(false);
    }
    if (!strcmp(name, "split")) {
        check_args(rt, name, a, 2, kw_split);
        return ct_split(rt, self, arg(a, 0, "sep"), need_int(rt, name, arg(a, 1, "maxsplit"), -1));
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") ||
        !strcmp(name, "capitalize")) {
        check_args(rt, name, a, 0, NULL);
        return ct_apply_filter(rt, name, self, 0, NULL, NULL);
    }
    if (!strcmp(name, "replace")) {
        static const char *const kw[] = {"count", NULL};
        check_args(rt, name, a, 3, kw);
        return ct_replace(rt, self, need_str(rt, name, arg(a, 0, NULL)),
                          need_str(rt, name, arg(a, 1, NULL)),
                          need_int(rt, name, arg(a, 2, "count"), -1));
    }
    if (!strcmp(name, "join")) {
        check_args(rt, name, a, 1, NULL);
        const ct_value_t *it = arg(a, 0, NULL);
        if (!it) {
            ct_throw(rt, BATON_EINVAL, "join needs an argument");
        }
        const ct_list_t *l = ct_iterable(rt, it, "join");
        for (size_t i = 0; i < l->n; i++) {
            need_str(rt, "join", &l->v[i]);
        }
        return ct_join(rt, l, self);
    }
    if (!strcmp(name, "find") || !strcmp(name, "count")) {
        check_args(rt, name, a, 1, NULL);
        const ct_value_t *sub = need_str(rt, name, arg(a, 0, NULL));
        if (name[0] == 'f') {
            const char *hit =
                sub->u.s.n ? memmem(self->u.s.p, self->u.s.n, sub->u.s.p, sub->u.s.n) : self->u.s.p;
            if (!hit) {
                return ct_int(-1);
            }
            ct_value_t pre = ct_str(self->u.s.p, (size_t)(hit - self->u.s.p));
            return ct_int((int64_t)ct_cp_len(&pre));
        }
        if (!sub->u.s.n) {
            return ct_int((int64_t)ct_cp_len(self) + 1);
        }
        int64_t c = 0;
        size_t i = 0;
        const char *hit;
        while ((hit = memmem(self->u.s.p + i, self->u.s.n - i, sub->u.s.p, sub->u.s.n))) {
            c++;
            i = (size_t)(hit - self->u.s.p) + sub->u.s.n;
        }
        return ct_int(c);
    }
    ct_throw(rt, BATON_ENOTSUP, "method '%s' of %s is outside the supported subset", name,
             ct_type_name(self));
}

static ct_value_t call_global(ct_rt_t *rt, const char *name, const args_t *a)
{
    if (!strcmp(name, "raise_exception")) {
        const ct_value_t *m = arg(a, 0, NULL);
        ct_value_t s = m ? ct_stringify(rt, m) : ct_str("error", 5);
        ct_throw(rt, BATON_EINVAL, "%.*s", (int)(s.u.s.n > 400 ? 400 : s.u.s.n), s.u.s.p);
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        ct_dict_t *d = ct_dict_new(rt, (size_t)a->argc);
        for (int i = 0; i < a->argc; i++) {
            if (a->kw && a->kw[i]) {
                ct_dict_set(rt, d, a->kw[i], strlen(a->kw[i]), a->argv[i]);
            } else if (a->argv[i].k == V_DICT || a->argv[i].k == V_NS) {
                const ct_dict_t *src = a->argv[i].u.dict;
                for (size_t k = 0; k < src->n; k++) {
                    ct_dict_set(rt, d, src->keys[k], src->klen[k], src->vals[k]);
                }
            } else {
                ct_throw(rt, BATON_EINVAL, "%s: positional arguments must be mappings", name);
            }
        }
        return (ct_value_t){.k = name[0] == 'n' ? V_NS : V_DICT, .u.dict = d};
    }
    if (!strcmp(name, "range")) {
        check_args(rt, name, a, 3, NULL);
        int64_t lo = 0, hi, st = 1;
        if (a->argc == 1) {
            hi = need_int(rt, name, arg(a, 0, NULL), 0);
        } else {
            lo = need_int(rt, name, arg(a, 0, NULL), 0);
            hi = need_int(rt, name, arg(a, 1, NULL), 0);
            st = need_int(rt, name, arg(a, 2, NULL), 1);
        }
        if (st == 0) {
            ct_throw(rt, BATON_EINVAL, "range: step must not be zero");
        }
        ct_list_t *l = ct_list_new(rt, 8);
        for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
            if (l->n >= rt->lim.max_steps) {
                ct_throw(rt, BATON_ETOOBIG, "range over the step limit");
            }
            ct_list_push(rt, l, ct_int(i));
            if ((st > 0 && i > INT64_MAX - st) || (st < 0 && i < INT64_MIN - st)) {
                break;
            }
        }
        return list_val(l);
    }
    if (!strcmp(name, "strftime_now")) {
        const ct_value_t *f = need_str(rt, name, arg(a, 0, NULL));
        char fmt[128], out[256];
        if (f->u.s.n >= sizeof(fmt)) {
            ct_throw(rt, BATON_EINVAL, "strftime_now: format too long");
        }
        memcpy(fmt, f->u.s.p, f->u.s.n);
        fmt[f->u.s.n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral" /* the template's own format, as Python's */
        size_t n = strftime(out, sizeof(out), fmt, &tm);
#pragma GCC diagnostic pop
        return ct_str_copy(rt, out, n);
    }
    ct_throw(rt, BATON_ENOTSUP, "function '%s' is outside the supported subset", name);
}

ct_value_t ct_call_value(ct_rt_t *rt, const ct_value_t *fn, int argc, const ct_value_t *argv,
                         const char *const *kwnames)
{
    args_t a = {argc, argv, kwnames};
    if (fn->k == V_MACRO) {
        return ct_call_macro(rt, fn->u.macro, argc, argv, kwnames);
    }
    if (fn->k != V_FUNC) {
        if (fn->k == V_UNDEF) {
            ct_throw(rt, BATON_EINVAL, "'%s' is undefined (called)",
                     fn->undef_name ? fn->undef_name : "value");
        }
        ct_throw(rt, BATON_EINVAL, "%s is not callable", ct_type_name(fn));
    }
    if (fn->u.func.self) {
        return call_method(rt, fn->u.func.name, fn->u.func.self, &a);
    }
    return call_global(rt, fn->u.func.name, &a);
}
