/* tokenizer/chat_template_parser.h — the chat-template parser's state and token helpers,
 * shared by its expression (chat_template_parse.c) and statement (chat_template_stmt.c) files. */
#ifndef BATON_TOKENIZER_CHAT_TEMPLATE_PARSER_H
#define BATON_TOKENIZER_CHAT_TEMPLATE_PARSER_H

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
} ct_parser_t;
typedef ct_parser_t P;

static inline const ct_tok_t *cur(P *p)
{
    return &p->t[p->i];
}

static inline bool is_op(const ct_tok_t *k, const char *op)
{
    return k->kind == TK_OP && k->n == strlen(op) && memcmp(k->s, op, k->n) == 0;
}

static inline bool is_name(const ct_tok_t *k, const char *name)
{
    return k->kind == TK_NAME && k->n == strlen(name) && memcmp(k->s, name, k->n) == 0;
}

static inline bool accept_op(P *p, const char *op)
{
    if (is_op(cur(p), op)) {
        p->i++;
        return true;
    }
    return false;
}

static inline bool accept_name(P *p, const char *name)
{
    if (is_name(cur(p), name)) {
        p->i++;
        return true;
    }
    return false;
}

static inline const char *tok_desc(const ct_tok_t *k)
{
    switch (k->kind) {
    case TK_TEXT:
        return "text";
    case TK_OPEN_STMT:
        return "'{%'";
    case TK_CLOSE_STMT:
        return "'%}'";
    case TK_OPEN_EXPR:
        return "'{{'";
    case TK_CLOSE_EXPR:
        return "'}}'";
    case TK_NAME:
        return "a name";
    case TK_STRING:
        return "a string";
    case TK_INT:
    case TK_FLOAT:
        return "a number";
    case TK_OP:
        return "an operator";
    case TK_EOF:
        return "the end of the template";
    }
    return "a token";
}

static inline bool expect_op(P *p, const char *op)
{
    if (accept_op(p, op)) {
        return true;
    }
    ct_fail(p->d, BATON_EINVAL, cur(p)->line, "expected '%s', found %s", op, tok_desc(cur(p)));
    return false;
}

static inline char *dup_tok(P *p, const ct_tok_t *k)
{
    char *s = ct_alloc(p->d->arena, k->n + 1);
    if (!s) {
        ct_fail(p->d, BATON_ENOMEM, k->line, "out of memory");
        return NULL;
    }
    memcpy(s, k->s, k->n);
    return s;
}

static inline ct_node_t *node(P *p, ct_node_kind_t kind)
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

static inline bool nodes_push(P *p, ct_nodes_t *v, ct_node_t *x)
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

static inline bool enter(P *p)
{
    if (++p->depth > CT_MAX_PARSE_DEPTH) {
        ct_fail(p->d, BATON_ETOOBIG, cur(p)->line, "nesting deeper than %d", CT_MAX_PARSE_DEPTH);
        return false;
    }
    return true;
}

/* chat_template_parse.c: an expression (a conditional at the top), and one without the
 * conditional (a for loop's iterable and filter). NULL on an error (p->d filled). */
ct_node_t *ct_parse_expr(P *p);
ct_node_t *ct_parse_or(P *p);

#endif
