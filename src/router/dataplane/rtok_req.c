/* rtok_req.c — a request's prompt tokens in the router: chat and completions prompts become the
 * engine's token ids, the context-length refusal, and the /tokenize and /detokenize answers. */
#include "router/dataplane/rtok_req.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "baton/error.h"
#include "common/log.h"

typedef baton_json_val_t val_t;

/* A member of the body as a jansson value (only the members the template reads are parsed:
 * never the whole body). NULL when absent or on an error. */
static json_t *member_json(const baton_pdreq_t *pd, const char *key)
{
    const val_t *v = baton_pdreq_get(pd, key);
    return v ? json_loadb(v->p, v->len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL) : NULL;
}

/* The body's members a chat template reads, as vLLM passes them. */
static json_t *chat_vars(const baton_pdreq_t *pd)
{
    static const char *const keys[] = {"messages", "tools", "add_generation_prompt",
                                       "chat_template_kwargs"};
    json_t *o = json_object();
    for (size_t i = 0; o && i < sizeof(keys) / sizeof(keys[0]); i++) {
        json_t *v = member_json(pd, keys[i]);
        if (v && json_object_set_new(o, keys[i], v) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

/* The prompt's ids: encode `text`, or take a token-id prompt as it is. */
static int prompt_ids(baton_rtok_local_t *L, const baton_rtok_model_t *m, const baton_pdreq_t *pd,
                      baton_tok_ids_t *ids, const char **why)
{
    int rc;
    if (pd->api == BATON_API_CHAT) {
        if (!m->tmpl) {
            *why = "no_chat_template";
            return BATON_ENOTSUP;
        }
        json_t *vars = chat_vars(pd);
        if (!vars)
            return BATON_ENOMEM;
        baton_buf_t text = BATON_BUF_INIT;
        char err[256];
        rc = baton_tmpl_render_chat(m->tmpl, m->tok, vars, NULL, &text, err, sizeof(err));
        json_decref(vars);
        if (rc == 0)
            rc = baton_rtok_encode(L, m, text.data ? text.data : "", text.len, 1, 0, ids);
        else if (rc != BATON_ENOMEM)
            *why = "template";
        baton_buf_free(&text);
        return rc;
    }
    const val_t *p = baton_pdreq_get(pd, "prompt");
    if (!p || pd->batch) { /* a batch has no single prompt */
        *why = "batch";
        return BATON_ENOTSUP;
    }
    if (p->type == BATON_JSON_ARRAY) { /* token ids: as they are */
        baton_json_iter_t it;
        val_t id;
        size_t n = baton_json_array_size(p);
        if (n > BATON_TOK_API_MAX_IDS || !(ids->ids = malloc((n ? n : 1) * sizeof(uint32_t))))
            return n > BATON_TOK_API_MAX_IDS ? BATON_ETOOBIG : BATON_ENOMEM;
        ids->cap = n ? n : 1;
        baton_json_iter_init(&it, p);
        while (baton_json_array_next(&it, &id)) {
            int64_t v = id.type == BATON_JSON_INTEGER ? baton_json_int(&id) : -1;
            if (v < 0 || v > UINT32_MAX) {
                *why = "ids";
                return BATON_EINVAL;
            }
            ids->ids[ids->len++] = (uint32_t)v;
        }
        return 0;
    }
    if (p->type != BATON_JSON_STRING) {
        *why = "prompt";
        return BATON_ENOTSUP;
    }
    const val_t *as = baton_pdreq_get(pd, "add_special_tokens");
    int add_special = !(as && as->type == BATON_JSON_FALSE);
    baton_buf_t text = BATON_BUF_INIT;
    if (baton_json_str_append(p, &text))
        return BATON_ENOMEM;
    rc = baton_rtok_encode(L, m, text.data ? text.data : "", text.len, 0, add_special, ids);
    if (rc == BATON_EINVAL)
        *why = "utf8";
    baton_buf_free(&text);
    return rc;
}

/* max_completion_tokens (chat, when not null or 0) or max_tokens; -1 when neither is given. */
static int64_t max_tokens_of(const baton_pdreq_t *pd)
{
    const val_t *v =
        pd->api == BATON_API_CHAT ? baton_pdreq_get(pd, "max_completion_tokens") : NULL;
    if (!v || v->type != BATON_JSON_INTEGER || baton_json_int(v) == 0)
        v = baton_pdreq_get(pd, "max_tokens");
    return v && v->type == BATON_JSON_INTEGER && baton_json_int(v) >= 0 ? baton_json_int(v) : -1;
}

int baton_rtok_context_check(uint64_t max_len, size_t n, int64_t max_tokens,
                             baton_rtok_refusal_t *ref)
{
    if (!max_len)
        return 0;
    if (n >= max_len) {
        ref->param = "input_tokens";
        snprintf(ref->message, sizeof(ref->message),
                 "This model's maximum context length is %llu tokens. However, your request has "
                 "%zu input tokens. Please reduce the length of the input messages.",
                 (unsigned long long)max_len, n);
        return 1;
    }
    if (max_tokens >= 0 && (uint64_t)max_tokens + n > max_len) {
        ref->param = "max_tokens";
        snprintf(ref->message, sizeof(ref->message),
                 "'max_tokens' or 'max_completion_tokens' is too large: %lld. This model's "
                 "maximum context length is %llu tokens and your request has %zu input tokens "
                 "(%lld > %llu - %zu).",
                 (long long)max_tokens, (unsigned long long)max_len, n, (long long)max_tokens,
                 (unsigned long long)max_len, n);
        return 1;
    }
    return 0;
}

int baton_rtok_request(baton_rtok_local_t *L, const baton_pdreq_t *pd, baton_route_ctx_t *ctx,
                       baton_rtok_refusal_t *ref)
{
    if (pd->api != BATON_API_CHAT && pd->api != BATON_API_COMPLETIONS)
        return 0;
    const baton_rtok_model_t *m = baton_rtok_find(baton_rtok_local_set(L), ctx->model);
    if (!m)
        return 0;
    baton_tok_ids_t ids = BATON_TOK_IDS_INIT;
    const char *why = "other";
    uint64_t t0 = uv_hrtime();
    int rc = prompt_ids(L, m, pd, &ids, &why);
    if (rc == BATON_ENOMEM) {
        baton_tok_ids_free(&ids);
        return rc;
    }
    if (rc) { /* the worker judges what the router cannot tokenize */
        baton_tok_ids_free(&ids);
        baton_rtok_count_failure(L, why);
        return 0;
    }
    baton_rtok_observe(L, pd->api == BATON_API_CHAT, t0, ids.len);
    ctx->owned_tokens = ids.ids;
    ctx->tokens = ids.ids;
    ctx->n_tokens = ids.len;
    if (baton_rtok_context_check(m->max_model_len, ids.len, max_tokens_of(pd), ref)) {
        baton_rtok_count_refusal(L, ref->param);
        return 1;
    }
    return 0;
}

typedef struct {
    baton_rtok_local_t *L;
    const baton_rtok_model_t *m;
} api_arg_t;

static int api_encode(void *arg, const char *text, size_t len, int chat, int add_special,
                      baton_tok_ids_t *out)
{
    api_arg_t *a = arg;
    return baton_rtok_encode(a->L, a->m, text, len, chat, add_special, out);
}

int baton_rtok_api(baton_rtok_local_t *L, int detok, const char *body, size_t len, json_t **resp,
                   baton_rtok_refusal_t *ref)
{
    *resp = NULL;
    memset(ref, 0, sizeof(*ref));
    json_error_t jerr;
    json_t *j = json_loadb(body, len, 0, &jerr);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        ref->param = NULL;
        snprintf(ref->message, sizeof(ref->message), "request body must be a JSON object");
        return 1;
    }
    json_t *model = json_object_get(j, "model");
    const baton_rtok_model_t *m = baton_rtok_find(
        baton_rtok_local_set(L), json_is_string(model) ? json_string_value(model) : NULL);
    api_arg_t arg = {L, m};
    baton_tok_api_t a = {m ? m->tok : NULL, m ? m->tmpl : NULL, m ? m->report_len : 0, api_encode,
                         &arg};
    int rc = !m      ? BATON_ENOTFOUND
             : detok ? baton_tok_api_detokenize(&a, j, resp, ref)
                     : baton_tok_api_tokenize(&a, j, resp, ref);
    json_decref(j);
    return rc;
}
