/* tokenizer/chat_template_eval.c — compiling a chat template and rendering it: scopes, the
 * expression evaluator, statements (if, for, set, macro, loop controls) and the render bounds. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "tokenizer/chat_template_int.h"

#define CT_MAX_TMP_BUFS 256

typedef struct ct_scope {
    struct ct_scope *parent;
    ct_dict_t *vars;
} ct_scope_t;

/* Temporary buffers (ct_buf_open) live on the heap; a render error frees them, so they are
 * listed here. */
typedef struct {
    ct_rt_t rt;
    baton_buf_t *tmp[CT_MAX_TMP_BUFS];
    int ntmp;
    ct_scope_t *root;
} ct_render_t;

enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

_Noreturn void ct_throw(ct_rt_t *rt, int rc, const char *fmt, ...)
{
    rt->rc = rc;
    if (rt->err && rt->errlen) {
        int off = snprintf(rt->err, rt->errlen, "chat template: ");
        if (off > 0 && (size_t)off < rt->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(rt->err + off, rt->errlen - (size_t)off, fmt, ap);
            va_end(ap);
        }
    }
    longjmp(rt->fail, 1);
}

void *ct_rt_alloc(ct_rt_t *rt, size_t n)
{
    void *p = ct_alloc(&rt->arena, n);
    if (!p) {
        ct_throw(rt, BATON_ETOOBIG, "working memory over %zu bytes", rt->lim.max_memory);
    }
    return p;
}

char *ct_rt_bytes(ct_rt_t *rt, size_t n)
{
    char *p = n < SIZE_MAX ? ct_alloc_bytes(&rt->arena, n + 1) : NULL;
    if (!p) {
        ct_throw(rt, BATON_ETOOBIG, "working memory over %zu bytes", rt->lim.max_memory);
    }
    p[n] = 0;
    return p;
}

void ct_depth_enter(ct_rt_t *rt)
{
    if (++rt->depth > rt->lim.max_depth * 4) {
        ct_throw(rt, BATON_ETOOBIG, "evaluation nested deeper than the limit");
    }
}

static void step(ct_rt_t *rt)
{
    if (++rt->steps > rt->lim.max_steps) {
        ct_throw(rt, BATON_ETOOBIG, "more than %llu loop iterations and macro calls",
                 (unsigned long long)rt->lim.max_steps);
    }
}

static void emit(ct_rt_t *rt, const char *s, size_t n)
{
    if (rt->out->len - rt->out_start + n > rt->lim.max_output) {
        ct_throw(rt, BATON_ETOOBIG, "output over %zu bytes", rt->lim.max_output);
    }
    if (baton_buf_append(rt->out, s, n) < 0) {
        ct_throw(rt, BATON_ENOMEM, "out of memory");
    }
}

/* ---- scopes ---- */

static ct_scope_t *scope_push(ct_rt_t *rt)
{
    ct_scope_t *s = ct_rt_alloc(rt, sizeof(*s));
    s->parent = rt->scope;
    s->vars = ct_dict_new(rt, 4);
    rt->scope = s;
    return s;
}

static ct_value_t lookup(ct_rt_t *rt, const char *name)
{
    size_t n = strlen(name);
    for (ct_scope_t *s = rt->scope; s; s = s->parent) {
        const ct_value_t *v = ct_dict_get(s->vars, name, n);
        if (v) {
            return *v;
        }
    }
    ct_value_t g = ct_global(name);
    if (g.k == V_UNDEF) {
        g.undef_name = name;
    }
    return g;
}

static void assign(ct_rt_t *rt, const char *name, ct_value_t v)
{
    ct_dict_set(rt, rt->scope->vars, name, strlen(name), v);
}

/* ---- expressions ---- */

static ct_value_t eval(ct_rt_t *rt, const ct_node_t *x);

static void eval_args(ct_rt_t *rt, const ct_node_t *x, ct_value_t **argv)
{
    *argv = x->kids.n ? ct_rt_alloc(rt, x->kids.n * sizeof(**argv)) : NULL;
    for (size_t i = 0; i < x->kids.n; i++) {
        (*argv)[i] = eval(rt, x->kids.v[i]);
    }
}

static ct_value_t eval_inner(ct_rt_t *rt, const ct_node_t *x)
{
    switch (x->kind) {
    case N_LIT:
        return x->v;
    case N_NAME:
        return lookup(rt, x->s);
    case N_LIST:
    case N_TUPLE: {
        ct_list_t *l = ct_list_new(rt, x->kids.n);
        for (size_t i = 0; i < x->kids.n; i++) {
            ct_list_push(rt, l, eval(rt, x->kids.v[i]));
        }
        return (ct_value_t){.k = V_LIST, .u.list = l};
    }
    case N_DICT: {
        ct_dict_t *d = ct_dict_new(rt, x->kids.n / 2);
        for (size_t i = 0; i + 1 < x->kids.n; i += 2) {
            ct_value_t k = eval(rt, x->kids.v[i]);
            if (k.k != V_STR) {
                ct_throw(rt, BATON_ENOTSUP, "a dict key that is not a string (%s)",
                         ct_type_name(&k));
            }
            ct_dict_set(rt, d, k.u.s.p, k.u.s.n, eval(rt, x->kids.v[i + 1]));
        }
        return (ct_value_t){.k = V_DICT, .u.dict = d};
    }
    case N_ATTR: {
        ct_value_t o = eval(rt, x->a);
        return ct_getattr(rt, &o, x->s, x->sn);
    }
    case N_INDEX: {
        ct_value_t o = eval(rt, x->a);
        ct_value_t k = eval(rt, x->b);
        return ct_getitem(rt, &o, &k);
    }
    case N_SLICE: {
        ct_value_t o = eval(rt, x->a);
        ct_value_t none = ct_none();
        ct_value_t a = x->b ? eval(rt, x->b) : none;
        ct_value_t b = x->c ? eval(rt, x->c) : none;
        ct_value_t c = x->kids.n ? eval(rt, x->kids.v[0]) : none;
        return ct_slice(rt, &o, &a, &b, &c);
    }
    case N_CALL: {
        ct_value_t fn = eval(rt, x->a);
        ct_value_t *argv;
        eval_args(rt, x, &argv);
        return ct_call_value(rt, &fn, (int)x->kids.n, argv, x->names);
    }
    case N_FILTER: {
        ct_value_t v = eval(rt, x->a);
        ct_value_t *argv;
        eval_args(rt, x, &argv);
        return ct_apply_filter(rt, x->s, &v, (int)x->kids.n, argv, x->names);
    }
    case N_TEST: {
        ct_value_t v = eval(rt, x->a);
        ct_value_t *argv;
        eval_args(rt, x, &argv);
        bool r = ct_apply_test(rt, x->s, &v, (int)x->kids.n, argv);
        return ct_bool(x->flag ? !r : r);
    }
    case N_UNARY: {
        ct_value_t v = eval(rt, x->a);
        if (x->s[0] == 'n') {
            return ct_bool(!ct_truthy(&v));
        }
        if (v.k == V_INT) {
            if (x->s[0] == '-' && v.u.i == INT64_MIN) {
                ct_throw(rt, BATON_EINVAL, "integer overflow");
            }
            return ct_int(x->s[0] == '-' ? -v.u.i : v.u.i);
        }
        if (v.k == V_FLOAT) {
            v.u.f = x->s[0] == '-' ? -v.u.f : v.u.f;
            return v;
        }
        if (v.k == V_BOOL) {
            return ct_int(x->s[0] == '-' ? -(int64_t)v.u.b : (int64_t)v.u.b);
        }
        ct_throw(rt, BATON_EINVAL, "bad operand type for unary %s: %s", x->s, ct_type_name(&v));
    }
    case N_BINARY: {
        ct_value_t a = eval(rt, x->a);
        ct_value_t b = eval(rt, x->b);
        return ct_binop(rt, x->s, &a, &b);
    }
    case N_AND: {
        ct_value_t a = eval(rt, x->a);
        return ct_truthy(&a) ? eval(rt, x->b) : a;
    }
    case N_OR: {
        ct_value_t a = eval(rt, x->a);
        return ct_truthy(&a) ? a : eval(rt, x->b);
    }
    case N_COMPARE: {
        ct_value_t a = eval(rt, x->a);
        for (size_t i = 0; i < x->kids.n; i++) {
            ct_value_t b = eval(rt, x->kids.v[i]);
            if (!ct_compare(rt, x->ops[i], &a, &b)) {
                return ct_bool(false);
            }
            a = b;
        }
        return ct_bool(true);
    }
    case N_COND: {
        ct_value_t c = eval(rt, x->a);
        if (ct_truthy(&c)) {
            return eval(rt, x->b);
        }
        if (x->c) {
            return eval(rt, x->c);
        }
        ct_value_t u = {.k = V_UNDEF, .undef_name = "the else branch of a conditional"};
        return u;
    }
    default:
        break;
    }
    ct_throw(rt, BATON_EINVAL, "not an expression");
}

static ct_value_t eval(ct_rt_t *rt, const ct_node_t *x)
{
    ct_depth_enter(rt);
    ct_value_t v = eval_inner(rt, x);
    rt->depth--;
    return v;
}

/* ---- statements ---- */

static int exec_body(ct_rt_t *rt, const ct_nodes_t *body);

static ct_render_t *R(ct_rt_t *rt)
{
    return (ct_render_t *)rt; /* rt is the first member of ct_render_t */
}

baton_buf_t *ct_buf_open(ct_rt_t *rt)
{
    ct_render_t *r = R(rt);
    if (r->ntmp == CT_MAX_TMP_BUFS) {
        ct_throw(rt, BATON_ETOOBIG, "strings built inside each other deeper than the limit");
    }
    baton_buf_t *b = calloc(1, sizeof(*b));
    if (!b) {
        ct_throw(rt, BATON_ENOMEM, "out of memory");
    }
    r->tmp[r->ntmp++] = b;
    return b;
}

ct_value_t ct_buf_close(ct_rt_t *rt, baton_buf_t *b)
{
    ct_render_t *r = R(rt);
    for (int i = r->ntmp - 1; i >= 0; i--) {
        if (r->tmp[i] == b) {
            r->tmp[i] = r->tmp[--r->ntmp];
            break;
        }
    }
    ct_value_t s = {.k = V_STR};
    bool fits = b->len <= rt->lim.max_memory;
    if (fits) {
        s = ct_str(NULL, 0);
        char *p = ct_alloc_bytes(&rt->arena, b->len + 1);
        if (p) {
            if (b->len) {
                memcpy(p, b->data, b->len);
            }
            s = ct_str(p, b->len);
        } else {
            fits = false;
        }
    }
    baton_buf_free(b);
    free(b);
    if (!fits) {
        ct_throw(rt, BATON_ETOOBIG, "working memory over %zu bytes", rt->lim.max_memory);
    }
    return s;
}

/* Runs body with the output captured; returns it as a string value. */
static ct_value_t capture(ct_rt_t *rt, const ct_nodes_t *body, int *flow)
{
    baton_buf_t *b = ct_buf_open(rt);
    baton_buf_t *saved = rt->out;
    size_t saved_start = rt->out_start;
    rt->out = b;
    rt->out_start = 0;
    int f = exec_body(rt, body);
    if (flow) {
        *flow = f;
    }
    rt->out = saved;
    rt->out_start = saved_start;
    return ct_buf_close(rt, b);
}

ct_value_t ct_call_macro(ct_rt_t *rt, const ct_node_t *m, int argc, const ct_value_t *argv,
                         const char *const *kwnames)
{
    step(rt);
    if (rt->depth > rt->lim.max_depth) {
        ct_throw(rt, BATON_ETOOBIG, "macro calls nested deeper than %u", rt->lim.max_depth);
    }
    ct_scope_t *saved = rt->scope;
    rt->scope = R(rt)->root;
    scope_push(rt);
    size_t npos = 0;
    for (int i = 0; i < argc; i++) {
        if (kwnames && kwnames[i]) {
            size_t k;
            for (k = 0; k < m->n_names && strcmp(m->names[k], kwnames[i]) != 0; k++) {
            }
            if (k == m->n_names) {
                ct_throw(rt, BATON_EINVAL, "macro '%s' has no parameter '%s'", m->s, kwnames[i]);
            }
            assign(rt, m->names[k], argv[i]);
        } else {
            if (npos >= m->n_names) {
                ct_throw(rt, BATON_EINVAL, "macro '%s' takes %zu arguments", m->s, m->n_names);
            }
            assign(rt, m->names[npos++], argv[i]);
        }
    }
    for (size_t k = 0; k < m->n_names; k++) {
        if (!ct_dict_get(rt->scope->vars, m->names[k], strlen(m->names[k]))) {
            ct_value_t v = {.k = V_UNDEF, .undef_name = m->names[k]};
            if (m->kids.v[k]) {
                v = eval(rt, m->kids.v[k]);
            }
            assign(rt, m->names[k], v);
        }
    }
    rt->depth++;
    ct_value_t s = capture(rt, &m->body, NULL);
    rt->depth--;
    rt->scope = saved;
    return s;
}

static void set_targets(ct_rt_t *rt, const ct_node_t *x, const ct_value_t *item)
{
    if (x->n_names == 1) {
        assign(rt, x->names[0], *item);
        return;
    }
    const ct_list_t *l = item->k == V_LIST ? item->u.list : NULL;
    if (!l || l->n != x->n_names) {
        ct_throw(rt, BATON_EINVAL, "cannot unpack %s into %zu loop variables", ct_type_name(item),
                 x->n_names);
    }
    for (size_t i = 0; i < x->n_names; i++) {
        assign(rt, x->names[i], l->v[i]);
    }
}

static int exec_for(ct_rt_t *rt, const ct_node_t *x)
{
    ct_value_t seq = eval(rt, x->a);
    const ct_list_t *items = ct_iterable(rt, &seq, "for loop");
    ct_scope_t *saved = rt->scope;
    if (x->b) { /* for x in xs if cond: filter first, loop.length counts what is kept */
        ct_list_t *kept = ct_list_new(rt, items->n);
        for (size_t i = 0; i < items->n; i++) {
            step(rt);
            rt->scope = saved;
            scope_push(rt);
            set_targets(rt, x, &items->v[i]);
            ct_value_t c = eval(rt, x->b);
            if (ct_truthy(&c)) {
                ct_list_push(rt, kept, items->v[i]);
            }
        }
        items = kept;
    }
    ct_loop_t *loop = ct_rt_alloc(rt, sizeof(*loop));
    loop->items = items;
    for (size_t i = 0; i < items->n; i++) {
        step(rt);
        rt->scope = saved;
        scope_push(rt);
        loop->index0 = i;
        /* loop values are read from a copy: a macro or nested loop never sees a later index */
        ct_loop_t *snap = ct_rt_alloc(rt, sizeof(*snap));
        *snap = *loop;
        assign(rt, "loop", (ct_value_t){.k = V_LOOP, .u.loop = snap});
        set_targets(rt, x, &items->v[i]);
        int f = exec_body(rt, &x->body);
        if (f == FLOW_BREAK) {
            break;
        }
    }
    rt->scope = saved;
    if (items->n == 0 && x->els.n) {
        return exec_body(rt, &x->els);
    }
    return FLOW_NEXT;
}

static int exec_stmt(ct_rt_t *rt, const ct_node_t *x)
{
    switch (x->kind) {
    case S_TEXT:
        emit(rt, x->s, x->sn);
        return FLOW_NEXT;
    case S_OUTPUT: {
        ct_value_t v = eval(rt, x->a);
        if (v.k == V_STR) {
            emit(rt, v.u.s.p, v.u.s.n);
        } else if (v.k != V_UNDEF) {
            baton_buf_t *o = rt->out;
            size_t before = o->len;
            ct_to_str(rt, &v, o);
            if (o->len - rt->out_start > rt->lim.max_output) {
                o->len = before;
                ct_throw(rt, BATON_ETOOBIG, "output over %zu bytes", rt->lim.max_output);
            }
        }
        return FLOW_NEXT;
    }
    case S_IF: {
        ct_value_t c = eval(rt, x->a);
        return exec_body(rt, ct_truthy(&c) ? &x->body : &x->els);
    }
    case S_FOR:
        return exec_for(rt, x);
    case S_SET: {
        ct_value_t v = x->flag ? capture(rt, &x->body, NULL) : eval(rt, x->a);
        if (!x->b) {
            assign(rt, x->s, v);
            return FLOW_NEXT;
        }
        ct_value_t ns = lookup(rt, x->s);
        if (ns.k != V_NS) {
            ct_throw(rt, BATON_EINVAL, "cannot assign attribute '%s' of %s (not a namespace)",
                     x->b->s, ct_type_name(&ns));
        }
        ct_dict_set(rt, ns.u.dict, x->b->s, strlen(x->b->s), v);
        return FLOW_NEXT;
    }
    case S_MACRO:
        assign(rt, x->s, (ct_value_t){.k = V_MACRO, .u.macro = x});
        return FLOW_NEXT;
    case S_BREAK:
        return FLOW_BREAK;
    case S_CONTINUE:
        return FLOW_CONTINUE;
    case S_NOOP:
        return FLOW_NEXT;
    default:
        break;
    }
    ct_throw(rt, BATON_EINVAL, "not a statement");
}

static int exec_body(ct_rt_t *rt, const ct_nodes_t *body)
{
    ct_depth_enter(rt);
    for (size_t i = 0; i < body->n; i++) {
        int f = exec_stmt(rt, body->v[i]);
        if (f != FLOW_NEXT) {
            rt->depth--;
            return f;
        }
    }
    rt->depth--;
    return FLOW_NEXT;
}

/* ---- entry points ---- */

int baton_tmpl_compile(const char *src, size_t len, baton_tmpl_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (err && errlen) {
        err[0] = 0;
    }
    baton_tmpl_t *t = calloc(1, sizeof(*t));
    if (!t) {
        return BATON_ENOMEM;
    }
    ct_diag_t d = {.arena = &t->arena, .err = err, .errlen = errlen};
    if (len > BATON_TMPL_MAX_SOURCE) {
        ct_fail(&d, BATON_ETOOBIG, 0, "template of %zu bytes is over the %u-byte limit", len,
                BATON_TMPL_MAX_SOURCE);
    } else if (memchr(src, 0, len)) {
        ct_fail(&d, BATON_EINVAL, 0, "template contains a NUL byte");
    } else {
        ct_tok_t *toks;
        size_t ntoks;
        if (ct_lex(&d, src, len, &toks, &ntoks) == 0) {
            ct_parse(&d, toks, ntoks, &t->body);
        }
    }
    if (d.rc) {
        baton_tmpl_free(t);
        return d.rc;
    }
    *out = t;
    return 0;
}

void baton_tmpl_free(baton_tmpl_t *t)
{
    if (t) {
        ct_arena_free(&t->arena);
        free(t);
    }
}

int baton_tmpl_render(const baton_tmpl_t *t, const json_t *vars, const baton_tmpl_limits_t *lim,
                      baton_buf_t *out, char *err, size_t errlen)
{
    ct_render_t *r = calloc(1, sizeof(*r));
    if (!r) {
        return BATON_ENOMEM;
    }
    ct_rt_t *rt = &r->rt;
    rt->lim.max_output = lim && lim->max_output ? lim->max_output : BATON_TMPL_DEFAULT_MAX_OUTPUT;
    rt->lim.max_memory = lim && lim->max_memory ? lim->max_memory : BATON_TMPL_DEFAULT_MAX_MEMORY;
    rt->lim.max_steps = lim && lim->max_steps ? lim->max_steps : BATON_TMPL_DEFAULT_MAX_STEPS;
    rt->lim.max_depth = lim && lim->max_depth ? lim->max_depth : BATON_TMPL_DEFAULT_MAX_DEPTH;
    rt->arena.limit = rt->lim.max_memory;
    rt->out = out;
    rt->out_start = out->len;
    rt->err = err;
    rt->errlen = errlen;
    if (err && errlen) {
        err[0] = 0;
    }
    volatile int rc = 0;
    if (setjmp(rt->fail) == 0) {
        scope_push(rt);
        if (vars) {
            if (!json_is_object(vars)) {
                ct_throw(rt, BATON_EINVAL, "the variables are not a JSON object");
            }
            const char *k;
            json_t *v;
            json_object_foreach((json_t *)vars, k, v)
            {
                assign(rt, k, ct_from_json(rt, v, 0));
            }
        }
        /* the template's own top-level sets (and macros) shadow the caller's variables */
        r->root = scope_push(rt);
        exec_body(rt, &t->body);
    } else {
        rc = rt->rc ? rt->rc : BATON_EINVAL;
        for (int i = 0; i < r->ntmp; i++) {
            baton_buf_free(r->tmp[i]);
            free(r->tmp[i]);
        }
    }
    ct_arena_free(&rt->arena);
    free(r);
    return rc;
}
