/* test_chat_template.c — src/tokenizer's chat templates: Python's Jinja2 semantics where the
 * JavaScript reference differs (strip with characters, printing True/None/containers, floats,
 * floor division and modulo, break keeping its output, for-else), whitespace control as
 * transformers sets it, render bounds (output, steps, depth, memory), refusals at compile with
 * the construct named, and one template rendered by threads at once. Exactness on the models'
 * real templates is tests/integration/test_chat_template.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "tokenizer/chat_template.h"

/* Renders src with vars (JSON text, NULL for none); returns the output (caller frees) or NULL
 * with *rc set and err filled. */
static char *render_lim(const char *src, const char *vars, const baton_tmpl_limits_t *lim, int *rc,
                        char *err, size_t errlen)
{
    baton_tmpl_t *t;
    *rc = baton_tmpl_compile(src, strlen(src), &t, err, errlen);
    if (*rc < 0) {
        return NULL;
    }
    json_t *v = vars ? json_loads(vars, 0, NULL) : NULL;
    if (vars) {
        assert_non_null(v);
    }
    baton_buf_t out = BATON_BUF_INIT;
    *rc = baton_tmpl_render(t, v, lim, &out, err, errlen);
    json_decref(v);
    baton_tmpl_free(t);
    if (*rc < 0) {
        baton_buf_free(&out);
        return NULL;
    }
    char *s = strdup(out.data ? out.data : "");
    baton_buf_free(&out);
    return s;
}

static void expect(const char *src, const char *vars, const char *want)
{
    char err[256];
    int rc;
    char *got = render_lim(src, vars, NULL, &rc, err, sizeof(err));
    if (!got) {
        fail_msg("%s: %s", src, err);
    }
    if (strcmp(got, want) != 0) {
        fail_msg("%s\n got: [%s]\nwant: [%s]", src, got, want);
    }
    free(got);
}

static void expect_error(const char *src, const char *vars, int want_rc, const char *want_msg)
{
    char err[256];
    int rc;
    char *got = render_lim(src, vars, NULL, &rc, err, sizeof(err));
    if (got) {
        fail_msg("%s rendered [%s], expected an error", src, got);
    }
    assert_int_equal(rc, want_rc);
    if (!strstr(err, want_msg)) {
        fail_msg("%s: error [%s] lacks [%s]", src, err, want_msg);
    }
}

static void test_python_semantics(void **state)
{
    (void)state;
    /* strip/lstrip with characters strips those only (the JS reference strips all whitespace) */
    expect("{{ x.lstrip('\\n') }}|{{ x.strip() }}|{{ y.rstrip('ab') }}",
           "{\"x\": \"\\n  hi  \", \"y\": \"xxabba\"}", "  hi  |hi|xx");
    /* Qwen3's answer after </think>, with a space: kept */
    expect("{{ c.split('</think>')[-1].lstrip('\\n') }}", "{\"c\": \"a</think> inside\"}",
           " inside");
    /* printing as Python's str() */
    expect("{{ true }} {{ none }} {{ [1, 'a', none, 2.5] }} {{ {'k': true} }} {{ x }}",
           "{\"x\": 1.0}", "True None [1, 'a', None, 2.5] {'k': True} 1.0");
    expect("{{ 1e20 * 10 }} {{ 0.1 + 0.2 }} {{ 1 / 4 }} {{ 10 / 5 }}", NULL,
           "1e+21 0.30000000000000004 0.25 2.0");
    expect("{{ \"it's\" ~ ['it\\'s'] }}", NULL, "it's[\"it's\"]");
    /* None through a filter: trim(None) is "None" in Python's Jinja2 */
    expect("{{ x | trim }}", "{\"x\": null}", "None");
    /* floor division and modulo round toward minus infinity */
    expect("{{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 3 }}", NULL, "-4 2 -2 8");
    /* length counts code points */
    expect("{{ s | length }} {{ s[1] }}", "{\"s\": \"a🚀é\"}", "3 🚀");
    /* break keeps the iteration's output; else runs only when nothing was iterated */
    expect("{% for i in [1, 2, 3] %}{{ i }}{% if i == 2 %}{% break %}{% endif %}{% else %}E{% "
           "endfor %}",
           NULL, "12");
    expect("{% for i in [] %}{{ i }}{% else %}E{% endfor %}", NULL, "E");
    expect(
        "{% for i in [1, 2, 3] if i != 2 %}{{ loop.index }}{{ i }}{{ loop.length }},{% endfor %}",
        NULL, "112,232,");
    /* a set inside a loop stays in the loop; a namespace carries it out */
    expect("{% set x = 1 %}{% set ns = namespace(y=1) %}{% for i in [5] %}{% set x = i %}{% set "
           "ns.y = i %}{% endfor %}{{ x }}{{ ns.y }}",
           NULL, "15");
    /* tojson is json.dumps(ensure_ascii=False): ", " and ": ", \\b by name, no ASCII escaping */
    expect("{{ x | tojson }}", "{\"x\": {\"a\": [1, 2.5, \"é\\b\\u0001\"], \"b\": null}}",
           "{\"a\": [1, 2.5, \"é\\b\\u0001\"], \"b\": null}");
    expect("{{ x | tojson(indent=2) }}", "{\"x\": {\"a\": [1], \"e\": {}}}",
           "{\n  \"a\": [\n    1\n  ],\n  \"e\": {}\n}");
    expect("{{ x | tojson(sort_keys=true) }}", "{\"x\": {\"b\": 1, \"a\": 2}}",
           "{\"a\": 2, \"b\": 1}");
    /* macros with defaults and keywords; ~ binds tighter than + (Jinja2's grammar) */
    expect("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b='x') }}", NULL,
           "[1B][2x]");
    expect("{{ 'a' + 'b' ~ 1 }}", NULL, "ab1");
    expect("{% set b %}in{{ 1 }}{% endset %}{{ b | upper }}", NULL, "IN1");
    expect("{{ 'ñé'.upper() }} {{ 'ÉA'.lower() }} {{ 'hello wORLD' | title }}", NULL,
           "ÑÉ éa Hello World");
}

static void test_whitespace_control(void **state)
{
    (void)state;
    /* trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before it */
    expect("{% if true %}\n    a\n    {% endif %}\nb\n", NULL, "    a\nb");
    expect("x  {%- if true -%}  y  {%- endif -%}  z", NULL, "xyz");
    expect("{{ 'a' }}\n{{ 'b' }}", NULL, "a\nb");
    expect("a {#- note -#} b{# c #}\n{{- 'd' }}", NULL, "abd");
    expect("a {# c #}  \n{{- 'd' }}", NULL, "a d");
}

static void test_errors_and_undefined(void **state)
{
    (void)state;
    expect("[{{ missing }}]{% if missing is not defined %}u{% endif %}", NULL, "[]u");
    expect_error("{{ raise_exception('Conversation roles must alternate') }}", NULL, BATON_EINVAL,
                 "Conversation roles must alternate");
    expect_error("{{ missing.attr }}", NULL, BATON_EINVAL, "'missing' is undefined");
    expect_error("{{ 'a' + 1 }}", NULL, BATON_EINVAL, "unsupported operand types for +");
    expect_error("{{ 1 // 0 }}", NULL, BATON_EINVAL, "division by zero");
    expect_error("{{ x.strip() }}", "{\"x\": [1]}", BATON_EINVAL, "undefined");
    expect_error("{{ 9223372036854775807 + 1 }}", NULL, BATON_EINVAL, "integer overflow");
}

static void refused(const char *src, int want_rc, const char *want)
{
    baton_tmpl_t *t = NULL;
    char err[256];
    int rc = baton_tmpl_compile(src, strlen(src), &t, err, sizeof(err));
    assert_null(t);
    assert_int_equal(rc, want_rc);
    if (!strstr(err, want)) {
        fail_msg("%s: [%s] lacks [%s]", src, err, want);
    }
}

static void test_refused_at_compile(void **state)
{
    (void)state;
    refused("{% include 'x' %}", BATON_ENOTSUP, "statement 'include'");
    refused("{% import 'x' as y %}", BATON_ENOTSUP, "statement 'import'");
    refused("a\nb\n{{ x | pprint }}", BATON_ENOTSUP, "line 3: filter 'pprint'");
    refused("{{ x is sameprefix }}", BATON_ENOTSUP, "test 'sameprefix'");
    refused("{{ cycler(1, 2) }}", BATON_ENOTSUP, "function 'cycler'");
    refused("{{ x.append(1) }}", BATON_ENOTSUP, "method 'append'");
    refused("{{ x.__class__() }}", BATON_ENOTSUP, "method '__class__'");
    refused("{% set a, b = 1, 2 %}", BATON_ENOTSUP, "several targets");
    refused("{% if x %}", BATON_EINVAL, "missing '{% endif %}'");
    refused("{% frobnicate %}", BATON_EINVAL, "unknown or misplaced statement 'frobnicate'");
    refused("{{ (((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
            "((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((1 }}",
            BATON_ETOOBIG, "nesting deeper than");
    char *big = malloc(BATON_TMPL_MAX_SOURCE + 2);
    memset(big, 'a', BATON_TMPL_MAX_SOURCE + 1);
    big[BATON_TMPL_MAX_SOURCE + 1] = 0;
    refused(big, BATON_ETOOBIG, "over the");
    free(big);
    /* a macro of the template may be called; an unknown bare name may not */
    baton_tmpl_t *t;
    char err[128];
    const char *ok = "{% macro f() %}x{% endmacro %}{{ f() }}";
    assert_int_equal(baton_tmpl_compile(ok, strlen(ok), &t, err, sizeof(err)), 0);
    baton_tmpl_free(t);
}

static void test_render_bounds(void **state)
{
    (void)state;
    char err[256];
    int rc;
    baton_tmpl_limits_t lim = {.max_output = 1000};
    char *s =
        render_lim("{% for i in range(2000) %}x{% endfor %}", NULL, &lim, &rc, err, sizeof(err));
    assert_null(s);
    assert_int_equal(rc, BATON_ETOOBIG);
    assert_non_null(strstr(err, "output over 1000 bytes"));

    baton_tmpl_limits_t steps = {.max_steps = 100};
    s = render_lim("{% for i in range(50) %}{% for j in range(50) %}{% endfor %}{% endfor %}", NULL,
                   &steps, &rc, err, sizeof(err));
    assert_null(s);
    assert_int_equal(rc, BATON_ETOOBIG);

    /* unbounded recursion of a macro stops at the depth bound */
    s = render_lim("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, NULL, &rc, err,
                   sizeof(err));
    assert_null(s);
    assert_int_equal(rc, BATON_ETOOBIG);

    /* string doubling stops at the memory bound */
    baton_tmpl_limits_t mem = {.max_memory = 1 << 20};
    s = render_lim("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = "
                   "ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
                   NULL, &mem, &rc, err, sizeof(err));
    assert_null(s);
    assert_int_equal(rc, BATON_ETOOBIG);

    /* deeply nested input JSON */
    char deep[2048] = "{\"x\": ";
    size_t n = strlen(deep);
    for (int i = 0; i < 500; i++) {
        deep[n++] = '[';
    }
    for (int i = 0; i < 500; i++) {
        deep[n++] = ']';
    }
    deep[n++] = '}';
    deep[n] = 0;
    s = render_lim("{{ x }}", deep, NULL, &rc, err, sizeof(err));
    assert_null(s);
    assert_int_equal(rc, BATON_ETOOBIG);
}

typedef struct {
    const baton_tmpl_t *t;
    json_t *vars;
    const char *want;
    bool ok;
} thr_arg_t;

static void *thr_main(void *p)
{
    thr_arg_t *a = p;
    a->ok = true;
    for (int i = 0; i < 200 && a->ok; i++) {
        baton_buf_t out = BATON_BUF_INIT;
        char err[128];
        a->ok = baton_tmpl_render(a->t, a->vars, NULL, &out, err, sizeof(err)) == 0 &&
                strcmp(out.data, a->want) == 0;
        baton_buf_free(&out);
    }
    return NULL;
}

static void test_shared_by_threads(void **state)
{
    (void)state;
    const char *src = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}";
    baton_tmpl_t *t;
    char err[128];
    assert_int_equal(baton_tmpl_compile(src, strlen(src), &t, err, sizeof(err)), 0);
    json_t *v1 = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
                            "\"add_generation_prompt\": true}",
                            0, NULL);
    json_t *v2 =
        json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"b\"}]}", 0, NULL);
    thr_arg_t args[4] = {{t, v1, "<user>a<assistant>", false},
                         {t, v2, "<system>b", false},
                         {t, v1, "<user>a<assistant>", false},
                         {t, v2, "<system>b", false}};
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_create(&th[i], NULL, thr_main, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
    }
    json_decref(v1);
    json_decref(v2);
    baton_tmpl_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_python_semantics),     cmocka_unit_test(test_whitespace_control),
        cmocka_unit_test(test_errors_and_undefined), cmocka_unit_test(test_refused_at_compile),
        cmocka_unit_test(test_render_bounds),        cmocka_unit_test(test_shared_by_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
