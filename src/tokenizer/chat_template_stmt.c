/* tokenizer/chat_template_stmt.c — the chat-template statement parser (if, for, set, macro,
 * loop controls) and the compile-time refusal of statements and calls outside the subset. */
#include "tokenizer/chat_template_parser.h"

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
    if (!(x->a = ct_parse_expr(p)) || !close_stmt(p)) {
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
    if (!(x->a = ct_parse_or(p))) {
        return false;
    }
    if (accept_name(p, "if") && !(x->b = ct_parse_or(p))) {
        return false;
    }
    if (is_name(cur(p), "recursive")) {
        ct_fail(p->d, BATON_ENOTSUP, cur(p)->line,
                "recursive for loops are outside the supported subset");
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
        ct_fail(p->d, BATON_ENOTSUP, cur(p)->line,
                "set with several targets is outside the supported subset");
        return false;
    }
    if (accept_op(p, "=")) {
        return (x->a = ct_parse_expr(p)) && close_stmt(p);
    }
    if (x->b) {
        ct_fail(p->d, BATON_ENOTSUP, cur(p)->line,
                "a block set of an attribute is outside the supported subset");
        return false;
    }
    if (is_op(cur(p), "|")) {
        ct_fail(p->d, BATON_ENOTSUP, cur(p)->line,
                "a filtered block set is outside the supported subset");
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
            if (!(def = ct_parse_expr(p))) {
                return false;
            }
            defaults = true;
        } else if (defaults) {
            ct_fail(p->d, BATON_EINVAL, cur(p)->line,
                    "macro: a parameter without a default after one with");
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

static const char *const UNSUPPORTED_TAGS[] = {"include",    "import", "from",   "extends",
                                               "block",      "call",   "filter", "with",
                                               "autoescape", "raw",    "do",     "trans"};

static int parse_block(P *p, ct_nodes_t *body, const char *const *stops, int nstops)
{
    if (!enter(p)) {
        return -1;
    }
    for (;;) {
        const ct_tok_t *k = cur(p);
        if (k->kind == TK_EOF) {
            if (nstops) {
                ct_fail(p->d, BATON_EINVAL, k->line,
                        "missing '{%% %s %%}' at the end of the template", stops[nstops - 1]);
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
            if (!x || !(x->a = ct_parse_expr(p))) {
                return -1;
            }
            if (cur(p)->kind != TK_CLOSE_EXPR) {
                ct_fail(p->d, BATON_EINVAL, cur(p)->line, "expected '}}', found %s",
                        tok_desc(cur(p)));
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
