/* tokenizer/chat_template_parse.c — the chat-template parser: tokens to an AST with Jinja2's
 * precedence, and the compile-time refusal of every construct outside the supported subset. */
#include <string.h>

#include "baton/error.h"
#include "tokenizer/chat_template_int.h"

typedef struct {
    ct_diag_t *d;
    const ct_tok_t *t;
    size_t i, n;
    int depth;
    ct_nodes_t calls;  /* N_CALL nodes on a bare name: checked once every macro is known */
    ct_nodes_t macros; /* S_MACRO nodes */
} P;

static const ct_tok_t *cur(P *p)
{
    return &p->t[p->i];
}

static bool is_op(const ct_tok_t *k, const char *op)
{
    return k->kind == TK_OP && k->n == strlen(op) && memcmp(k->s, op, k->n) == 0;
}

static bool is_name(const ct_tok_t *k, const char *name)
{
    return k->kind == TK_NAME && k->n == strlen(name) && memcmp(k->s, name, k->n) == 0;
}

static bool accept_op(P *p, const char *op)
{
    if (is_op(cur(p), op)) {
        p->i++;
        return true;
    }
    return false;
}

static bool accept_name(P *p, const char *name)
{
    if (is_name(cur(p), name)) {
        p->i++;
        return true;
    }
    return false;
}

static const char *tok_desc(const ct_tok_t *k)
{
    switch (k->kind) {
    case TK_TEXT: return "text";
    case TK_OPEN_STMT: return "'{%'";
    case TK_CLOSE_STMT: return "'%}'";
    case TK_OPEN_EXPR: return "'{{'";
    case TK_CLOSE_EXPR: return "'}}'";
    case TK_NAME: return "a name";
    case TK_STRING: return "a string";
    case TK_INT:
    case TK_FLOAT: return "a number";
    case TK_OP: return "an operator";
    case TK_EOF: return "the end of the template";
    }
    return "a token";
}

static bool expect_op(P *p, const char *op)
{
    if (accept_op(p, op)) {
        return true;
    }
    ct_fail(p->d, BATON_EINVAL, cur(p)->line, "expected '%s', found %s", op, tok_desc(cur(p)));
    return false;
}

static char *dup_tok(P *p, const ct_tok_t *k)
{
    char *s = ct_alloc(p->d->arena, k->n + 1);
    if (!s) {
        ct_fail(p->d, BATON_ENOMEM, k->line, "out of memory");
        return NULL;
    }
    memcpy(s, k->s, k->n);
    return s;
}

static ct_node_t *node(P *p, ct_node_kind_t kind)
{
    ct_node_t *x = ct_alloc(p->d->arena, sizeof(*x));
    if (!x) {
        ct_fail(p->d, BATON_ENOMEM, cur(p)->line, "out of memory");
        return NULL;
    }
    x->kind = kind;
    x->line = cur(p)->line;
    return x;
}

static bool nodes_push(P *p, ct_nodes_t *v, ct_node_t *x)
{
    if (!x) {
        return false;
    }
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        ct_node_t **nv = ct_alloc(p->d->arena, cap * sizeof(*nv));
        if (!nv) {
            ct_fail(p->d, BATON_ENOMEM, cur(p)->line, "out of memory");
            return false;
        }
        if (v->n) {
            memcpy(nv, v->v, v->n * sizeof(*nv));
        }
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return true;
}

static bool enter(P *p)
{
    if (++p->depth > CT_MAX_PARSE_DEPTH) {
        ct_fail(p->d, BATON_ETOOBIG, cur(p)->line, "nesting deeper than %d", CT_MAX_PARSE_DEPTH);
        return false;
    }
    return true;
}

static ct_node_t *parse_expr(P *p);
static ct_node_t *parse_or(P *p);
static ct_node_t *parse_unary(P *p, bool with_filter);

/* Call arguments after '(' up to ')': positional, then keyword (name=value). */
static bool parse_args(P *p, ct_node_t *x)
{
    const char *names[64];
    size_t n = 0;
    bool any_kw = false;
    while (!accept_op(p, ")")) {
        if (n && !expect_op(p, ",")) {
            return false;
        }
        if (n && accept_op(p, ")")) {
            break; /* a trailing comma */
        }
        if (is_op(cur(p), "*") || is_op(cur(p), "**")) {
            ct_fail(p->d, BATON_ENOTSUP, cur(p)->line,
                    "argument unpacking (*args, **kwargs) is outside the supported subset");
            return false;
        }
        if (n == 64) {
            ct_fail(p->d, BATON_ETOOBIG, cur(p)->line, "more than 64 arguments in one call");
            return false;
        }
        const char *kw = NULL;
        if (cur(p)->kind == TK_NAME && is_op(&p->t[p->i + 1], "=")) {
            kw = dup_tok(p, cur(p));
            if (!kw) {
                return false;
            }
            p->i += 2;
            any_kw = true;
        } else if (any_kw) {
            ct_fail(p->d, BATON_EINVAL, cur(p)->line, "a positional argument after a keyword one");
            return false;
        }
        if (!nodes_push(p, &x->kids, parse_expr(p))) {
            return false;
        }
        names[n++] = kw;
    }
    if (n) {
        x->names = ct_alloc(p->d->arena, n * sizeof(*x->names));
        if (!x->names) {
            ct_fail(p->d, BATON_ENOMEM, cur(p)->line, "out of memory");
            return false;
        }
        memcpy(x->names, names, n * sizeof(*names));
        x->n_names = n;
    }
    return true;
}

static ct_node_t *parse_primary(P *p)
{
    const ct_tok_t *k = cur(p);
    ct_node_t *x;
    switch (k->kind) {
    case TK_NAME: {
        static const struct {
            const char *s;
            ct_vkind_t k;
            bool b;
        } lits[] = {{"true", V_BOOL, true},   {"True", V_BOOL, true}, {"false", V_BOOL, false},
                    {"False", V_BOOL, false}, {"none", V_NONE, 0},    {"None", V_NONE, 0}};
        for (size_t i = 0; i < sizeof(lits) / sizeof(lits[0]); i++) {
            if (is_name(k, lits[i].s)) {
                if (!(x = node(p, N_LIT))) {
                    return NULL;
                }
                x->v.k = lits[i].k;
                x->v.u.b = lits[i].b;
                p->i++;
                return x;
            }
        }
        if (!(x = node(p, N_NAME)) || !(x->s = dup_tok(p, k))) {
            return NULL;
        }
        x->sn = k->n;
        p->i++;
        return x;
    }
    case TK_STRING: {
        /* adjacent literals are one string, as in Python */
        size_t total = 0, j = p->i;
        while (p->t[j].kind == TK_STRING) {
            total += p->t[j++].n;
        }
        char *s = ct_alloc(p->d->arena, total + 1);
        if (!s || !(x = node(p, N_LIT))) {
            ct_fail(p->d, BATON_ENOMEM, k->line, "out of memory");
            return NULL;
        }
        size_t off = 0;
        while (cur(p)->kind == TK_STRING) {
            memcpy(s + off, cur(p)->s, cur(p)->n);
            off += cur(p)->n;
            p->i++;
        }
        x->v = ct_str(s, total);
        return x;
    }
    case TK_INT:
    case TK_FLOAT:
        if (!(x = node(p, N_LIT))) {
            return NULL;
        }
        if (k->kind == TK_INT) {
            x->v = ct_int(k->i);
        } else {
            x->v.k = V_FLOAT;
            x->v.u.f = k->f;
        }
        p->i++;
        return x;
    case TK_OP:
        if (accept_op(p, "(")) {
            if (accept_op(p, ")")) {
                return node(p, N_TUPLE);
            }
            ct_node_t *e = parse_expr(p);
            if (!e) {
                return NULL;
            }
            if (!is_op(cur(p), ",")) {
                return expect_op(p, ")") ? e : NULL;
            }
            if (!(x = node(p, N_TUPLE)) || !nodes_push(p, &x->kids, e)) {
                return NULL;
            }
            while (accept_op(p, ",")) {
                if (is_op(cur(p), ")")) {
                    break;
                }
                if (!nodes_push(p, &x->kids, parse_expr(p))) {
                    return NULL;
                }
            }
            return expect_op(p, ")") ? x : NULL;
        }
        if (accept_op(p, "[")) {
            if (!(x = node(p, N_LIST))) {
                return NULL;
            }
            while (!accept_op(p, "]")) {
                if (x->kids.n && !expect_op(p, ",")) {
                    return NULL;
                }
                if (x->kids.n && accept_op(p, "]")) {
                    break;
                }
                if (!nodes_push(p, &x->kids, parse_expr(p))) {
                    return NULL;
                }
            }
            return x;
        }
        if (accept_op(p, "{")) {
            if (!(x = node(p, N_DICT))) {
                return NULL;
            }
            while (!accept_op(p, "}")) {
                if (x->kids.n && !expect_op(p, ",")) {
                    return NULL;
                }
                if (x->kids.n && accept_op(p, "}")) {
                    break;
                }
                if (!nodes_push(p, &x->kids, parse_expr(p)) || !expect_op(p, ":") ||
                    !nodes_push(p, &x->kids, parse_expr(p))) {
                    return NULL;
                }
            }
            return x;
        }
        break;
    default:
        break;
    }
    ct_fail(p->d, BATON_EINVAL, k->line, "expected an expression, found %s", tok_desc(k));
    return NULL;
}

static ct_node_t *parse_call(P *p, ct_node_t *callee)
{
    ct_node_t *x = node(p, N_CALL);
    if (!x) {
        return NULL;
    }
    x->a = callee;
    if (!parse_args(p, x)) {
        return NULL;
    }
    if (callee->kind == N_NAME) {
        if (!nodes_push(p, &p->calls, x)) {
            return NULL;
        }
    } else if (callee->kind == N_ATTR) {
        if (!ct_method_known(callee->s)) {
            ct_fail(p->d, BATON_ENOTSUP, x->line,
                    "method '%s' is outside the supported subset", callee->s);
            return NULL;
        }
    }
    return x;
}

static ct_node_t *parse_postfix(P *p, ct_node_t *x)
{
    for (;;) {
        if (!x) {
            return NULL;
        }
        if (accept_op(p, ".")) {
            const ct_tok_t *k = cur(p);
            ct_node_t *y;
            if (k->kind == TK_INT) { /* a.0: an index */
                if (!(y = node(p, N_INDEX)) || !(y->b = node(p, N_LIT))) {
                    return NULL;
                }
                y->b->v = ct_int(k->i);
            } else if (k->kind == TK_NAME) {
                if (!(y = node(p, N_ATTR)) || !(y->s = dup_tok(p, k))) {
                    return NULL;
                }
                y->sn = k->n;
            } else {
                ct_fail(p->d, BATON_EINVAL, k->line, "expected a name after '.'");
                return NULL;
            }
            p->i++;
            y->a = x;
            x = y;
        } else if (accept_op(p, "[")) {
            ct_node_t *parts[3] = {NULL, NULL, NULL};
            int np = 0;
            bool slice = false;
            for (;;) {
                if (!is_op(cur(p), ":") && !is_op(cur(p), "]")) {
                    if (!(parts[np] = parse_expr(p))) {
                        return NULL;
                    }
                }
                if (accept_op(p, ":")) {
                    slice = true;
                    if (++np > 2) {
                        ct_fail(p->d, BATON_EINVAL, cur(p)->line, "too many ':' in a slice");
                        return NULL;
                    }
                    continue;
                }
                break;
            }
            if (!expect_op(p, "]")) {
                return NULL;
            }
            ct_node_t *y = node(p, slice ? N_SLICE : N_INDEX);
            if (!y) {
                return NULL;
            }
            y->a = x;
            if (slice) {
                y->b = parts[0];
                y->c = parts[1];
                if (parts[2] && !nodes_push(p, &y->kids, parts[2])) {
                    return NULL;
                }
            } else if (!(y->b = parts[0])) {
                ct_fail(p->d, BATON_EINVAL, cur(p)->line, "empty subscript");
                return NULL;
            }
            x = y;
        } else if (accept_op(p, "(")) {
            x = parse_call(p, x);
        } else {
            return x;
        }
    }
}

static ct_node_t *parse_filter_expr(P *p, ct_node_t *x)
{
    for (;;) {
        if (!x) {
            return NULL;
        }
        if (accept_op(p, "|")) {
            const ct_tok_t *k = cur(p);
            if (k->kind != TK_NAME) {
                ct_fail(p->d, BATON_EINVAL, k->line, "expected a filter name after '|'");
                return NULL;
            }
            ct_node_t *y = node(p, N_FILTER);
            if (!y || !(y->s = dup_tok(p, k))) {
                return NULL;
            }
            if (!ct_filter_known(y->s)) {
                ct_fail(p->d, BATON_ENOTSUP, k->line, "filter '%s' is outside the supported subset",
                        y->s);
                return NULL;
            }
            p->i++;
            y->a = x;
            if (accept_op(p, "(") && !parse_args(p, y)) {
                return NULL;
            }
            x = y;
        } else if (accept_name(p, "is")) {
            ct_node_t *y = node(p, N_TEST);
            if (!y) {
                return NULL;
            }
            y->flag = accept_name(p, "not");
            const ct_tok_t *k = cur(p);
            if (k->kind != TK_NAME && !(is_name(k, "none") || is_name(k, "true"))) {
                ct_fail(p->d, BATON_EINVAL, k->line, "expected a test name after 'is'");
                return NULL;
            }
            if (!(y->s = dup_tok(p, k))) {
                return NULL;
            }
            if (!ct_test_known(y->s)) {
                ct_fail(p->d, BATON_ENOTSUP, k->line, "test '%s' is outside the supported subset",
                        y->s);
                return NULL;
            }
            p->i++;
            y->a = x;
            const ct_tok_t *n = cur(p);
            if (accept_op(p, "(")) {
                if (!parse_args(p, y)) {
                    return NULL;
                }
            } else if (n->kind == TK_STRING || n->kind == TK_INT || n->kind == TK_FLOAT ||
                       (n->kind == TK_NAME && !is_name(n, "and") && !is_name(n, "or") &&
                        !is_name(n, "else") && !is_name(n, "is") && !is_name(n, "in") &&
                        !is_name(n, "not") && !is_name(n, "if"))) {
                if (!nodes_push(p, &y->kids, parse_postfix(p, parse_primary(p)))) {
                    return NULL;
                }
            }
            x = y;
        } else if (accept_op(p, "(")) {
            x = parse_call(p, x);
        } else {
            return x;
        }
    }
}

static ct_node_t *parse_unary(P *p, bool with_filter)
{
    if (!enter(p)) {
        return NULL;
    }
    ct_node_t *x;
    if (is_op(cur(p), "-") || is_op(cur(p), "+")) {
        if (!(x = node(p, N_UNARY))) {
            return NULL;
        }
        x->s = cur(p)->s[0] == '-' ? "-" : "+";
        p->i++;
        if (!(x->a = parse_unary(p, false))) {
            return NULL;
        }
    } else {
        x = parse_postfix(p, parse_primary(p));
    }
    if (with_filter) {
        x = parse_filter_expr(p, x);
    }
    p->depth--;
    return x;
}

static ct_node_t *binary(P *p, const char *op, ct_node_t *a, ct_node_t *b)
{
    if (!a || !b) {
        return NULL;
    }
    ct_node_t *x = node(p, N_BINARY);
    if (x) {
        x->s = op;
        x->a = a;
        x->b = b;
    }
    return x;
}

static ct_node_t *parse_pow(P *p)
{
    ct_node_t *x = parse_unary(p, true);
    while (x && accept_op(p, "**")) {
        x = binary(p, "**", x, parse_unary(p, true));
    }
    return x;
}

static ct_node_t *parse_math2(P *p)
{
    ct_node_t *x = parse_pow(p);
    for (;;) {
        const char *op = is_op(cur(p), "*")    ? "*"
                         : is_op(cur(p), "/")  ? "/"
                         : is_op(cur(p), "//") ? "//"
                         : is_op(cur(p), "%")  ? "%"
                                               : NULL;
        if (!x || !op) {
            return x;
        }
        p->i++;
        x = binary(p, op, x, parse_pow(p));
    }
}

static ct_node_t *parse_concat(P *p)
{
    ct_node_t *x = parse_math2(p);
    while (x && accept_op(p, "~")) {
        x = binary(p, "~", x, parse_math2(p));
    }
    return x;
}

static ct_node_t *parse_math1(P *p)
{
    ct_node_t *x = parse_concat(p);
    for (;;) {
        const char *op = is_op(cur(p), "+") ? "+" : is_op(cur(p), "-") ? "-" : NULL;
        if (!x || !op) {
            return x;
        }
        p->i++;
        x = binary(p, op, x, parse_concat(p));
    }
}

static ct_node_t *parse_compare(P *p)
{
    ct_node_t *x = parse_math1(p);
    if (!x) {
        return NULL;
    }
    ct_node_t *cmp = NULL;
    const char *ops[16];
    for (;;) {
        const char *op = NULL;
        static const char *const cops[] = {"==", "!=", "<=", ">=", "<", ">"};
        for (size_t i = 0; i < 6; i++) {
            if (is_op(cur(p), cops[i])) {
                op = cops[i];
            }
        }
        if (op) {
            p->i++;
        } else if (is_name(cur(p), "in")) {
            op = "in";
            p->i++;
        } else if (is_name(cur(p), "not") && is_name(&p->t[p->i + 1], "in")) {
            op = "not in";
            p->i += 2;
        } else {
            break;
        }
        if (!cmp) {
            if (!(cmp = node(p, N_COMPARE))) {
                return NULL;
            }
            cmp->a = x;
        }
        if (cmp->kids.n == 16) {
            ct_fail(p->d, BATON_ETOOBIG, cur(p)->line, "more than 16 chained comparisons");
            return NULL;
        }
        ops[cmp->kids.n] = op;
        if (!nodes_push(p, &cmp->kids, parse_math1(p))) {
            return NULL;
        }
    }
    if (!cmp) {
        return x;
    }
    cmp->ops = ct_alloc(p->d->arena, cmp->kids.n * sizeof(*cmp->ops));
    if (!cmp->ops) {
        ct_fail(p->d, BATON_ENOMEM, cur(p)->line, "out of memory");
        return NULL;
    }
    memcpy(cmp->ops, ops, cmp->kids.n * sizeof(*ops));
    return cmp;
}

static ct_node_t *parse_not(P *p)
{
    if (is_name(cur(p), "not")) {
        if (!enter(p)) {
            return NULL;
        }
        ct_node_t *x = node(p, N_UNARY);
        if (!x) {
            return NULL;
        }
        p->i++;
        x->s = "not";
        x->a = parse_not(p);
        p->depth--;
        return x->a ? x : NULL;
    }
    return parse_compare(p);
}

static ct_node_t *parse_and(P *p)
{
    ct_node_t *x = parse_not(p);
    while (x && accept_name(p, "and")) {
        ct_node_t *y = node(p, N_AND);
        if (!y || !(y->b = parse_not(p))) {
            return NULL;
        }
        y->a = x;
        x = y;
    }
    return x;
}

static ct_node_t *parse_or(P *p)
{
    ct_node_t *x = parse_and(p);
    while (x && accept_name(p, "or")) {
        ct_node_t *y = node(p, N_OR);
        if (!y || !(y->b = parse_and(p))) {
            return NULL;
        }
        y->a = x;
        x = y;
    }
    return x;
}

static ct_node_t *parse_expr(P *p)
{
    if (!enter(p)) {
        return NULL;
    }
    ct_node_t *x = parse_or(p);
    while (x && is_name(cur(p), "if")) {
        p->i++;
        ct_node_t *y = node(p, N_COND);
        if (!y || !(y->a = parse_or(p))) {
            return NULL;
        }
        y->b = x;
        if (accept_name(p, "else") && !(y->c = parse_expr(p))) {
            return NULL;
        }
        x = y;
    }
    p->depth--;
    return x;
}

/* ---- statements ---- */

static bool close_stmt(P *p)
{
    if (cur(p)->kind == TK_CLOSE_STMT) {
        p->i++;
        return true;
    }
    ct_fail(p->d, BATON_EINVAL, cur(p)->line, "expected '%%}', found %s", tok_desc(cur(p)));
    return false;
}

/* Parses statements into body until a tag named in stops; returns its index with the position
 * after the tag's name, or -1 (error, or the end of the template where stops is empty). */
static int parse_block(P *p, ct_nodes_t *body, const char *const *stops, int nstops);

static bool parse_if(P *p, ct_node_t *x)
{
    static const char *const stops[] = {"elif", "else", "endif"};
    if (!(x->a = parse_expr(p)) || !close_stmt(p)) {
        return false;
    }
    int which = parse_block(p, &x->body, stops, 3);
    if (which < 0) {
        return false;
    }
    if (which == 0) {
        ct_node_t *y = node(p, S_IF);
        return nodes_push(p, &x->els, y) && parse_if(p, y);
    }
    if (which == 1) {
        if (!close_stmt(p) || parse_block(p, &x->els, stops + 2, 1) < 0) {
            return false;
        }
    }
    return close_stmt(p);
}

static bool parse_for(P *p, ct_node_t *x)
{
    static const char *const stops[] = {"else", "endfor"};
    const char *names[8];
    size_t n = 0;
    do {
        if (cur(p)->kind != TK_NAME || n == 8) {
            ct_fail(p->d, BATON_ENOTSUP, cur(p)->line, "for: expected up to 8 loop variable names");
            return false;
        }
        if (!(names[n++] = dup_tok(p, cur(p)))) {
            return false;
        }
        p->i++;
    } while (accept_op(p, ","));
    if (!accept_name(p, "in")) {
        ct_fail(p->d, BATON_EINVAL, cur(p)->line, "for: expected 'in'");
        return false;
    }
    x->names = ct_alloc(p->d->arena, n * sizeof(*names));
    if (!x->names) {
        ct_fail(p->d, BATON_ENOMEM, cur(p)->line, "out of memory");
        return false;
    }
    memcpy(x->names, names, n * sizeof(*names));
    x->n_names = n;
    if (!(x->a = parse_or(p))) {
        return false;
    }
    if (accept_name(p, "if") && !(x->b = parse_or(p))) {
        return false;
    }
    if (is_name(cur(p), "recursive")) {
        ct_fail(p->d, BATON_ENOTSUP, cur(p)->line, "recursive for loops are outside the supported subset");
        return false;
    }
    if (!close_stmt(p)) {
        return false;
    }
    int which = parse_block(p, &x->body, stops, 2);
    if (which < 0) {
        return false;
    }
    if (which == 0 && (!close_stmt(p) || parse_block(p, &x->els, stops + 1, 1) < 0)) {
        return false;
    }
    return close_stmt(p);
}

static bool parse_set(P *p, ct_node_t *x)
{
    static const char *const stops[] = {"endset"};
    if (cur(p)->kind != TK_NAME || !(x->s = dup_tok(p, cur(p)))) {
        ct_fail(p->d, BATON_EINVAL, cur(p)->line, "set: expected a name");
        return false;
    }
    p->i++;
    if (accept_op(p, ".")) { /* set ns.attr = ... */
        if (cur(p)->kind != TK_NAME) {
            ct_fail(p->d, BATON_EINVAL, cur(p)->line, "set: expected an attribute name");
            return false;
        }
        ct_node_t *t = node(p, N_NAME);
        if (!t || !(t->s = dup_tok(p, cur(p)))) {
            return false;
        }
        x->b = t;
        p->i++;
    }
    if (is_op(cur(p), ",")) {
        ct_fail(p->d, BATON_ENOTSUP, cur(p)->line, "set with several targets is outside the supported subset");
        return false;
    }
    if (accept_op(p, "=")) {
        return (x->a = parse_expr(p)) && close_stmt(p);
    }
    if (x->b) {
        ct_fail(p->d, BATON_ENOTSUP, cur(p)->line, "a block set of an attribute is outside the supported subset");
        return false;
    }
    if (is_op(cur(p), "|")) {
        ct_fail(p->d, BATON_ENOTSUP, cur(p)->line, "a filtered block set is outside the supported subset");
        return false;
    }
    x->flag = true; /* a block set: the body rendered to a string */
    return close_stmt(p) && parse_block(p, &x->body, stops, 1) == 0 && close_stmt(p);
}

static bool parse_macro(P *p, ct_node_t *x)
{
    static const char *const stops[] = {"endmacro"};
    if (cur(p)->kind != TK_NAME || !(x->s = dup_tok(p, cur(p)))) {
        ct_fail(p->d, BATON_EINVAL, cur(p)->line, "macro: expected a name");
        return false;
    }
    p->i++;
    const char *names[32];
    size_t n = 0;
    if (!expect_op(p, "(")) {
        return false;
    }
    bool defaults = false;
    while (!accept_op(p, ")")) {
        if (n && !expect_op(p, ",")) {
            return false;
        }
        if (cur(p)->kind != TK_NAME || n == 32) {
            ct_fail(p->d, BATON_EINVAL, cur(p)->line, "macro: expected up to 32 parameter names");
            return false;
        }
        if (!(names[n] = dup_tok(p, cur(p)))) {
            return false;
        }
        p->i++;
        ct_node_t *def = NULL;
        if (accept_op(p, "=")) {
            if (!(def = parse_expr(p))) {
                return false;
            }
            defaults = true;
        } else if (defaults) {
            ct_fail(p->d, BATON_EINVAL, cur(p)->line, "macro: a parameter without a default after one with");
            return false;
        }
        /* kids[i] is parameter i's default (NULL: none); nodes_push refuses NULL, so place it */
        if (!nodes_push(p, &x->kids, (ct_node_t *)x)) {
            return false;
        }
        x->kids.v[x->kids.n - 1] = def;
        n++;
    }
    x->names = ct_alloc(p->d->arena, (n ? n : 1) * sizeof(*names));
    if (!x->names) {
        ct_fail(p->d, BATON_ENOMEM, cur(p)->line, "out of memory");
        return false;
    }
    if (n) {
        memcpy(x->names, names, n * sizeof(*names));
    }
    x->n_names = n;
    return close_stmt(p) && parse_block(p, &x->body, stops, 1) == 0 && close_stmt(p) &&
           nodes_push(p, &p->macros, x);
}

static const char *const UNSUPPORTED_TAGS[] = {
    "include", "import", "from", "extends", "block", "call", "filter", "with", "autoescape",
    "raw",     "do",     "trans"};

static int parse_block(P *p, ct_nodes_t *body, const char *const *stops, int nstops)
{
    if (!enter(p)) {
        return -1;
    }
    for (;;) {
        const ct_tok_t *k = cur(p);
        if (k->kind == TK_EOF) {
            if (nstops) {
                ct_fail(p->d, BATON_EINVAL, k->line, "missing '{%% %s %%}' at the end of the template",
                        stops[nstops - 1]);
                return -1;
            }
            p->depth--;
            return 0;
        }
        if (k->kind == TK_TEXT) {
            ct_node_t *x = node(p, S_TEXT);
            if (!x) {
                return -1;
            }
            x->s = k->s;
            x->sn = k->n;
            p->i++;
            if (!nodes_push(p, body, x)) {
                return -1;
            }
            continue;
        }
        if (k->kind == TK_OPEN_EXPR) {
            p->i++;
            ct_node_t *x = node(p, S_OUTPUT);
            if (!x || !(x->a = parse_expr(p))) {
                return -1;
            }
            if (cur(p)->kind != TK_CLOSE_EXPR) {
                ct_fail(p->d, BATON_EINVAL, cur(p)->line, "expected '}}', found %s", tok_desc(cur(p)));
                return -1;
            }
            p->i++;
            if (!nodes_push(p, body, x)) {
                return -1;
            }
            continue;
        }
        if (k->kind != TK_OPEN_STMT) {
            ct_fail(p->d, BATON_EINVAL, k->line, "unexpected %s", tok_desc(k));
            return -1;
        }
        p->i++;
        const ct_tok_t *name = cur(p);
        if (name->kind != TK_NAME) {
            ct_fail(p->d, BATON_EINVAL, name->line, "expected a statement name after '{%%'");
            return -1;
        }
        for (int s = 0; s < nstops; s++) {
            if (is_name(name, stops[s])) {
                p->i++;
                p->depth--;
                return s;
            }
        }
        p->i++;
        ct_node_t *x = NULL;
        bool ok = false;
        if (is_name(name, "if")) {
            ok = (x = node(p, S_IF)) && parse_if(p, x);
        } else if (is_name(name, "for")) {
            ok = (x = node(p, S_FOR)) && parse_for(p, x);
        } else if (is_name(name, "set")) {
            ok = (x = node(p, S_SET)) && parse_set(p, x);
        } else if (is_name(name, "macro")) {
            ok = (x = node(p, S_MACRO)) && parse_macro(p, x);
        } else if (is_name(name, "break") || is_name(name, "continue")) {
            ok = (x = node(p, is_name(name, "break") ? S_BREAK : S_CONTINUE)) && close_stmt(p);
        } else if (is_name(name, "generation") || is_name(name, "endgeneration")) {
            ok = (x = node(p, S_NOOP)) && close_stmt(p);
        } else {
            char tag[32];
            size_t tn = name->n < sizeof(tag) - 1 ? name->n : sizeof(tag) - 1;
            memcpy(tag, name->s, tn);
            tag[tn] = 0;
            bool known = false;
            for (size_t i = 0; i < sizeof(UNSUPPORTED_TAGS) / sizeof(UNSUPPORTED_TAGS[0]); i++) {
                known |= strcmp(tag, UNSUPPORTED_TAGS[i]) == 0;
            }
            if (known) {
                ct_fail(p->d, BATON_ENOTSUP, name->line,
                        "statement '%s' is outside the supported subset", tag);
            } else {
                ct_fail(p->d, BATON_EINVAL, name->line, "unknown or misplaced statement '%s'", tag);
            }
            return -1;
        }
        if (!ok || !nodes_push(p, body, x)) {
            return -1;
        }
    }
}

int ct_parse(ct_diag_t *d, const ct_tok_t *toks, size_t ntoks, ct_nodes_t *body)
{
    P p = {.d = d, .t = toks, .n = ntoks};
    if (parse_block(&p, body, NULL, 0) < 0) {
        return d->rc ? d->rc : BATON_EINVAL;
    }
    /* A call of a bare name must reach a global or a macro of this template. */
    for (size_t i = 0; i < p.calls.n; i++) {
        const ct_node_t *c = p.calls.v[i];
        const char *name = c->a->s;
        bool ok = ct_global_known(name);
        for (size_t m = 0; !ok && m < p.macros.n; m++) {
            ok = strcmp(p.macros.v[m]->s, name) == 0;
        }
        if (!ok) {
            ct_fail(d, BATON_ENOTSUP, c->line,
                    "function '%s' is outside the supported subset (not a global or a macro of "
                    "the template)",
                    name);
            return d->rc;
        }
    }
    return 0;
}
