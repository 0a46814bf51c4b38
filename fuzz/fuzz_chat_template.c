/* fuzz/fuzz_chat_template.c — libFuzzer harness for chat templates. The first byte picks the
 * mode: even, the rest is a template's source, compiled and rendered over a fixed conversation;
 * odd, the rest is the variables (messages JSON), rendered by a fixed template that uses most
 * of the subset. Either way: no crash, no leak, only the documented errors, and the output
 * within its bound. */
#include <jansson.h>
#include <string.h>

#include "baton/error.h"
#include "fuzz_check.h"
#include "tokenizer/chat_template.h"

static const char FIXED_TEMPLATE[] =
    "{%- set ns = namespace(n=0, sys='') -%}"
    "{%- if messages[0] is defined and messages[0].role == 'system' %}{% set ns.sys = "
    "messages[0].content %}{% endif -%}"
    "{{ bos_token }}{% if tools %}{% for t in tools %}{{ t | tojson(indent=2) }}{% endfor %}{% "
    "endif %}"
    "{%- for m in messages if m is mapping -%}"
    "{%- set ns.n = ns.n + 1 -%}"
    "{%- if m.content is string %}{% set c = m.content %}{% else %}{% set c = m.content | "
    "tojson %}{% endif -%}"
    "<{{ m.role | default('?') | upper }}>{{ c.split('</think>')[-1].lstrip('\\n') | trim }}"
    "{%- for tc in m.tool_calls or [] %}{{ tc.function.name if tc.function is mapping }}"
    "{{ tc.function.arguments if tc.function is mapping and tc.function.arguments is string "
    "else tc | tojson }}{% endfor -%}"
    "{%- if loop.last and add_generation_prompt %}<assistant>{% endif -%}"
    "{%- endfor -%}{{ ns.n }}{{ messages | length }}{{ messages[::-1][:2] | tojson }}";

static const char FIXED_VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", "
    "\"content\": \"hi <|im_start|> {{ x }}\"}, {\"role\": \"assistant\", \"content\": null, "
    "\"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
    "{\"a\": [1, 2.5, true]}}}]}], \"tools\": [{\"type\": \"function\"}], \"bos_token\": \"<s>\", "
    "\"eos_token\": \"</s>\", \"add_generation_prompt\": true}";

static baton_tmpl_t *fixed;
static json_t *fixed_vars;
static const baton_tmpl_limits_t LIM = {
    .max_output = 1 << 20, .max_memory = 32 << 20, .max_steps = 20000, .max_depth = 32};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char err[256];
    CHECK(baton_tmpl_compile(FIXED_TEMPLATE, strlen(FIXED_TEMPLATE), &fixed, err, sizeof(err)) ==
          0);
    fixed_vars = json_loads(FIXED_VARS, 0, NULL);
    CHECK(fixed_vars != NULL);
    return 0;
}

static void render(const baton_tmpl_t *t, const json_t *vars)
{
    baton_buf_t out = BATON_BUF_INIT;
    char err[256];
    int rc = baton_tmpl_render(t, vars, &LIM, &out, err, sizeof(err));
    CHECK(rc == 0 || rc == BATON_EINVAL || rc == BATON_ENOTSUP || rc == BATON_ETOOBIG);
    CHECK(out.len <= LIM.max_output);
    if (rc < 0) {
        CHECK(err[0] != 0 && memchr(err, 0, sizeof(err)) != NULL);
    }
    baton_buf_free(&out);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (size == 0) {
        return 0;
    }
    const char *rest = (const char *)data + 1;
    size_t len = size - 1;
    if ((data[0] & 1) == 0) {
        baton_tmpl_t *t = NULL;
        char err[256];
        int rc = baton_tmpl_compile(rest, len, &t, err, sizeof(err));
        if (rc != 0) {
            CHECK(rc == BATON_EINVAL || rc == BATON_ENOTSUP || rc == BATON_ETOOBIG);
            CHECK(t == NULL && err[0] != 0);
            return 0;
        }
        render(t, fixed_vars);
        baton_tmpl_free(t);
        return 0;
    }
    json_t *vars = json_loadb(rest, len, JSON_DECODE_ANY, NULL);
    if (vars) {
        render(fixed, vars);
        json_decref(vars);
    }
    return 0;
}
