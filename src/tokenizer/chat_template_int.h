/* tokenizer/chat_template_int.h — the chat-template engine's AST, runtime values and arena,
 * shared by the chat_template*.c files only. */
#ifndef BATON_TOKENIZER_CHAT_TEMPLATE_INT_H
#define BATON_TOKENIZER_CHAT_TEMPLATE_INT_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "tokenizer/chat_template.h"

#define CT_MAX_PARSE_DEPTH 96 /* nesting of expressions and blocks in the source */

/* ---- lexer ---- */
typedef enum {
    TK_TEXT,
    TK_OPEN_STMT,  /* {% */
    TK_CLOSE_STMT, /* %} */
    TK_OPEN_EXPR,  /* {{ */
    TK_CLOSE_EXPR, /* }} */
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_OP, /* punctuation and operators: text in s */
    TK_EOF,
} ct_tok_kind_t;

typedef struct {
    ct_tok_kind_t kind;
    const char *s; /* TEXT/NAME/OP: into the source or the lexer's arena; STRING: unescaped */
    size_t n;
    int64_t i;
    double f;
    int line;
} ct_tok_t;

/* ---- AST ---- */
typedef enum {
    /* expressions */
    N_LIT,    /* literal value v */
    N_NAME,   /* name s */
    N_LIST,   /* kids[] */
    N_TUPLE,  /* kids[] (a list at runtime) */
    N_DICT,   /* kids[] alternating key, value */
    N_ATTR,   /* a.s */
    N_INDEX,  /* a[b] */
    N_SLICE,  /* a[b:c:d], absent parts NULL */
    N_CALL,   /* a(kids..., names[i] for keyword args (NULL positional)) */
    N_FILTER, /* a | s(kids...) */
    N_TEST,   /* a is [not] s(kids...); flag = negated */
    N_UNARY,  /* op s: "not" or "-" or "+" ; a */
    N_BINARY, /* a op b */
    N_AND,
    N_OR,
    N_COMPARE, /* a then kids[] with ops[] */
    N_COND,    /* b if a else c (c may be NULL) */
    /* statements */
    S_TEXT,   /* s */
    S_OUTPUT, /* {{ a }} */
    S_IF,     /* if a: body else: els (an elif is an S_IF alone in els) */
    S_FOR,    /* for targets(names) in a [if b]: body else els */
    S_SET,    /* set target (name s, or a.s via ns) = a ; or block body */
    S_MACRO,  /* macro s(params names / defaults kids) body */
    S_BREAK,
    S_CONTINUE,
    S_NOOP, /* generation / endgeneration */
} ct_node_kind_t;

typedef struct ct_value ct_value_t;
typedef struct ct_node ct_node_t;

typedef struct {
    ct_node_t **v;
    size_t n, cap;
} ct_nodes_t;

typedef enum {
    V_UNDEF,
    V_NONE,
    V_BOOL,
    V_INT,
    V_FLOAT,
    V_STR,
    V_LIST,
    V_DICT,
    V_NS,    /* namespace(): a dict whose attributes can be set */
    V_LOOP,  /* the loop variable of a for */
    V_MACRO, /* a macro defined by the template */
    V_FUNC,  /* a global function or a bound method */
} ct_vkind_t;

typedef struct ct_list ct_list_t;
typedef struct ct_dict ct_dict_t;
typedef struct ct_loop ct_loop_t;
typedef struct ct_rt ct_rt_t;

typedef int (*ct_fn_t)(ct_rt_t *rt, const ct_value_t *self, const char *name, int argc,
                       const ct_value_t *argv, const char *const *kwnames, ct_value_t *out);

struct ct_value {
    ct_vkind_t k;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        ct_list_t *list;
        ct_dict_t *dict;
        ct_loop_t *loop;
        const ct_node_t *macro;
        struct {
            ct_fn_t fn;
            const char *name;
            const ct_value_t *self; /* bound method: the value it was read from */
        } func;
    } u;
    const char *undef_name; /* V_UNDEF: what was undefined, for the error message */
};

struct ct_list {
    ct_value_t *v;
    size_t n, cap;
};

struct ct_dict {
    const char **keys; /* string keys only */
    size_t *klen;
    ct_value_t *vals;
    size_t n, cap;
};

struct ct_loop {
    const ct_list_t *items;
    size_t index0;
};

struct ct_node {
    ct_node_kind_t kind;
    int line;
    bool flag;
    const char *s;
    size_t sn;
    ct_node_t *a, *b, *c;
    ct_nodes_t kids;
    const char **names; /* per kid: keyword-argument name, or NULL; S_FOR: loop targets */
    size_t n_names;
    const char **ops; /* N_COMPARE: one operator per kid */
    ct_nodes_t body, els;
    ct_value_t v; /* N_LIT */
};

/* ---- arena: every allocation of a compile or a render, freed at once ---- */
typedef struct ct_chunk ct_chunk_t;
typedef struct {
    ct_chunk_t *head;
    size_t used, limit; /* limit 0: unbounded */
} ct_arena_t;

void *ct_alloc(ct_arena_t *a, size_t n);       /* zeroed; NULL over the limit or out of memory */
void *ct_alloc_bytes(ct_arena_t *a, size_t n); /* not zeroed: for string bytes */
void ct_arena_free(ct_arena_t *a);

struct baton_tmpl {
    ct_arena_t arena;
    ct_nodes_t body;
};

/* ---- compile ---- */
typedef struct {
    ct_arena_t *arena;
    char *err;
    size_t errlen;
    int rc;
} ct_diag_t;

void ct_fail(ct_diag_t *d, int rc, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Lexes src into toks (arena memory). 0 or an error (d filled). */
int ct_lex(ct_diag_t *d, const char *src, size_t len, ct_tok_t **toks, size_t *ntoks);
int ct_parse(ct_diag_t *d, const ct_tok_t *toks, size_t ntoks, ct_nodes_t *body);

/* ---- render ---- */
struct ct_rt {
    ct_arena_t arena;
    baton_tmpl_limits_t lim;
    baton_buf_t *out;
    size_t out_start;
    uint64_t steps;
    unsigned depth;
    char *err;
    size_t errlen;
    int rc;
    jmp_buf fail; /* a render error unwinds to baton_tmpl_render */
    struct ct_scope *scope;
};

/* Heap buffers for building a string (output captured, a value printed): listed in the render
 * so that an error unwinding past them frees them. close copies the text into the arena. */
baton_buf_t *ct_buf_open(ct_rt_t *rt);
ct_value_t ct_buf_close(ct_rt_t *rt, baton_buf_t *b);

_Noreturn void ct_throw(ct_rt_t *rt, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void *ct_rt_alloc(ct_rt_t *rt, size_t n);
char *ct_rt_bytes(ct_rt_t *rt, size_t n); /* n bytes and a NUL, not zeroed */
void ct_depth_enter(ct_rt_t *rt);

/* values (chat_template_lib.c) */
ct_value_t ct_str(const char *p, size_t n);
ct_value_t ct_str_copy(ct_rt_t *rt, const char *p, size_t n);
ct_value_t ct_int(int64_t i);
ct_value_t ct_bool(bool b);
ct_value_t ct_none(void);
ct_list_t *ct_list_new(ct_rt_t *rt, size_t cap);
void ct_list_push(ct_rt_t *rt, ct_list_t *l, ct_value_t v);
ct_dict_t *ct_dict_new(ct_rt_t *rt, size_t cap);
void ct_dict_set(ct_rt_t *rt, ct_dict_t *d, const char *k, size_t kn, ct_value_t v);
const ct_value_t *ct_dict_get(const ct_dict_t *d, const char *k, size_t kn);
bool ct_truthy(const ct_value_t *v);
bool ct_equal(const ct_value_t *a, const ct_value_t *b);
const char *ct_type_name(const ct_value_t *v);
/* str(v) as Python prints it, appended to b (repr for the items of a container). */
void ct_to_str(ct_rt_t *rt, const ct_value_t *v, baton_buf_t *b);
ct_value_t ct_stringify(ct_rt_t *rt, const ct_value_t *v);
/* Iterating: a list as it is, a dict's keys, a string's characters. */
const ct_list_t *ct_iterable(ct_rt_t *rt, const ct_value_t *v, const char *what);
ct_value_t ct_from_json(ct_rt_t *rt, const struct json_t *j, unsigned depth);
ct_value_t ct_getattr(ct_rt_t *rt, const ct_value_t *obj, const char *name, size_t n);
ct_value_t ct_getitem(ct_rt_t *rt, const ct_value_t *obj, const ct_value_t *key);
ct_value_t ct_slice(ct_rt_t *rt, const ct_value_t *obj, const ct_value_t *start,
                    const ct_value_t *stop, const ct_value_t *step);
int ct_compare(ct_rt_t *rt, const char *op, const ct_value_t *a, const ct_value_t *b);
ct_value_t ct_binop(ct_rt_t *rt, const char *op, const ct_value_t *a, const ct_value_t *b);

/* strings and tojson (chat_template_str.c) */
enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE };
int32_t ct_next_cp(const char *s, size_t n, size_t *i); /* -1 (one byte skipped): not UTF-8 */
bool ct_py_space(int32_t c);                            /* Python's str.isspace() */
/* chars NULL: Python's whitespace */
ct_value_t ct_strip(const ct_value_t *s, const ct_value_t *chars, bool left, bool right);
ct_value_t ct_recase(ct_rt_t *rt, const ct_value_t *s, int mode);
size_t ct_cp_len(const ct_value_t *s);
ct_value_t ct_replace(ct_rt_t *rt, const ct_value_t *s, const ct_value_t *old,
                      const ct_value_t *new, int64_t count);
ct_value_t ct_split(ct_rt_t *rt, const ct_value_t *s, const ct_value_t *sep, int64_t max);
ct_value_t ct_join(ct_rt_t *rt, const ct_list_t *items, const ct_value_t *sep);
/* indent < 0: one line */
void ct_to_json(ct_rt_t *rt, const ct_value_t *v, baton_buf_t *b, int64_t indent, bool sort,
                unsigned depth);

/* the library: names known at compile time, applied at render */
bool ct_filter_known(const char *name);
bool ct_test_known(const char *name);
bool ct_global_known(const char *name);
bool ct_method_known(const char *name);
ct_value_t ct_apply_filter(ct_rt_t *rt, const char *name, const ct_value_t *v, int argc,
                           const ct_value_t *argv, const char *const *kwnames);
bool ct_apply_test(ct_rt_t *rt, const char *name, const ct_value_t *v, int argc,
                   const ct_value_t *argv);
ct_value_t ct_global(const char *name);
/* A call of a V_FUNC or V_MACRO value (macros through the evaluator's hook). */
ct_value_t ct_call_value(ct_rt_t *rt, const ct_value_t *fn, int argc, const ct_value_t *argv,
                         const char *const *kwnames);
ct_value_t ct_call_macro(ct_rt_t *rt, const ct_node_t *m, int argc, const ct_value_t *argv,
                         const char *const *kwnames);

#endif
