/* tokenizer/chat_template_chat.c — an OpenAI chat request rendered with a model's template: the
 * variables the engines pass (messages, tools, add_generation_prompt, bos/eos, the keys of
 * chat_template_kwargs) built from the request body, for the router and the worker alike. */
#include <jansson.h>

#include "baton/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

int baton_tmpl_render_chat(const baton_tmpl_t *t, const baton_tok_t *tok, const json_t *body,
                           const baton_tmpl_limits_t *lim, baton_buf_t *out, char *err,
                           size_t errlen)
{
    json_t *vars = json_object();
    if (!vars) {
        return BATON_ENOMEM;
    }
    /* chat_template_kwargs first: the request's own fields below take precedence */
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (json_is_object(kw)) {
        json_object_update(vars, kw);
    }
    json_object_set(vars, "messages", json_object_get(body, "messages"));
    json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_null(tools)) {
        json_object_set(vars, "tools", tools);
    }
    json_t *agp = json_object_get(body, "add_generation_prompt");
    json_object_set_new(vars, "add_generation_prompt", json_boolean(!json_is_false(agp)));
    const char *bos = tok ? baton_tok_config_str(tok, "bos_token") : NULL;
    const char *eos = tok ? baton_tok_config_str(tok, "eos_token") : NULL;
    json_object_set_new(vars, "bos_token", json_string(bos ? bos : ""));
    json_object_set_new(vars, "eos_token", json_string(eos ? eos : ""));
    int rc = baton_tmpl_render(t, vars, lim, out, err, errlen);
    json_decref(vars);
    return rc;
}
