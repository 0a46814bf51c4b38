/* tokenizer/chat_template_parse.c — the chat-template expression parser: tokens to an AST with
 * Jinja2's precedence, refusing at compile every filter, test and method outside the subset. */
#include "tokenizer/chat_template_parser.h"

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
        if (!nodes_push(p, &x->kids, ct_parse_expr(p))) {
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
            ct_node_t *e = ct_parse_expr(p);
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
                if (!nodes_push(p, &x->kids, ct_parse_expr(p))) {
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
                if (!nodes_push(p, &x->kids, ct_parse_expr(p))) {
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
                if (!nodes_push(p, &x->kids, ct_parse_expr(p)) || !expect_op(p, ":") ||
                    !nodes_push(p, &x->kids, ct_parse_expr(p))) {
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
            ct_fail(p->d, BATON_ENOTSUP, x->line, "method '%s' is outside the supported subset",
                    callee->s);
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
                    if (!(parts[np] = ct_parse_expr(p))) {
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

ct_node_t *ct_parse_or(P *p)
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

ct_node_t *ct_parse_expr(P *p)
{
    if (!enter(p)) {
        return NULL;
    }
    ct_node_t *x = ct_parse_or(p);
    while (x && is_name(cur(p), "if")) {
        p->i++;
        ct_node_t *y = node(p, N_COND);
        if (!y || !(y->a = ct_parse_or(p))) {
            return NULL;
        }
        y->b = x;
        if (accept_name(p, "else") && !(y->c = ct_parse_expr(p))) {
            return NULL;
        }
        x = y;
    }
    p->depth--;
    return x;
}
