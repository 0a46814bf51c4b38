/* route_ctx.c — what a request tells the routing policies: its prompt text, word count and
 * session key, and whether it may pin a worker (X-Baton-Target-Worker). */
#include "router/dataplane/route_ctx.h"

#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"
#include "router/auth.h"
#include "router/control/worker_models.h"

typedef baton_json_val_t val_t;

/* Appends a decoded string value to the growing text (a '\n' between pieces). */
static int add_str(baton_buf_t *b, const val_t *s)
{
    if (b->len && baton_buf_append(b, "\n", 1))
        return BATON_ENOMEM;
    return baton_json_str_append(s, b);
}

/* Chat content: a string, or a list of parts whose "text" fields count. */
static int add_content(baton_buf_t *b, const val_t *content)
{
    if (content->type == BATON_JSON_STRING)
        return add_str(b, content);
    if (content->type != BATON_JSON_ARRAY)
        return 0;
    baton_json_iter_t it;
    val_t part, t;
    baton_json_iter_init(&it, content);
    while (baton_json_array_next(&it, &part))
        if (baton_json_object_get(&part, "text", &t) && t.type == BATON_JSON_STRING &&
            add_str(b, &t))
            return BATON_ENOMEM;
    return 0;
}

/* A prompt field: a string, a list (its first element: a batch shares no single prefix), or
 * token ids (each id is a word). */
static int add_prompt(baton_buf_t *b, const val_t *prompt)
{
    baton_json_iter_t it;
    val_t first, id, p = *prompt;
    if (p.type == BATON_JSON_ARRAY) {
        baton_json_iter_init(&it, &p);
        if (baton_json_array_next(&it, &first) && first.type != BATON_JSON_INTEGER)
            p = first;
    }
    if (p.type == BATON_JSON_STRING)
        return add_str(b, &p);
    if (p.type == BATON_JSON_ARRAY) {
        baton_json_iter_init(&it, &p);
        while (baton_json_array_next(&it, &id)) {
            char w[32];
            /* json_integer_value() of a non-integer was 0: the same here */
            long long v = id.type == BATON_JSON_INTEGER ? (long long)baton_json_int(&id) : 0;
            int n = snprintf(w, sizeof(w), "%lld ", v);
            if (baton_buf_append(b, w, (size_t)n))
                return BATON_ENOMEM;
        }
    }
    return 0;
}

/* The prompt as one text whose turns extend each other: a follow-up turn's text starts with
 * the previous turn's, which is what makes prefixes match across a session. */
static int prompt_text(const baton_pdreq_t *pd, baton_buf_t *b)
{
    const val_t *v;
    if (pd->api == BATON_API_CHAT) {
        baton_json_iter_t it;
        val_t m, role, content;
        if (!(v = baton_pdreq_get(pd, "messages")) || v->type != BATON_JSON_ARRAY)
            return 0;
        baton_json_iter_init(&it, v);
        while (baton_json_array_next(&it, &m)) {
            if (baton_json_object_get(&m, "role", &role) && role.type == BATON_JSON_STRING &&
                add_str(b, &role))
                return BATON_ENOMEM;
            if (baton_json_object_get(&m, "content", &content) && add_content(b, &content))
                return BATON_ENOMEM;
        }
        return 0;
    }
    if (pd->api == BATON_API_RESPONSES) {
        /* instructions, then the input: a string, or items whose content counts as chat's. */
        baton_json_iter_t it;
        val_t m, content;
        if ((v = baton_pdreq_get(pd, "instructions")) && v->type == BATON_JSON_STRING &&
            add_str(b, v))
            return BATON_ENOMEM;
        if (!(v = baton_pdreq_get(pd, "input")))
            return 0;
        if (v->type == BATON_JSON_STRING)
            return add_str(b, v);
        baton_json_iter_init(&it, v);
        while (baton_json_array_next(&it, &m))
            if (baton_json_object_get(&m, "content", &content) && add_content(b, &content))
                return BATON_ENOMEM;
        return 0;
    }
    if (pd->api == BATON_API_COMPLETIONS)
        v = baton_pdreq_get(pd, "prompt");
    else if (!(v = baton_pdreq_get(pd, "text")))
        v = baton_pdreq_get(pd, "input_ids");
    return v ? add_prompt(b, v) : 0;
}

int baton_pin_allowed(const baton_router_t *r, const baton_http_req_t *req)
{
    /* The one place that decides who may pin: an admin, by the admin routes' rule (the admin
     * token, carried in X-Baton-Admin-Token since the Bearer header holds the API key; without
     * an admin token, loopback clients only). Anyone else's pin is ignored, with a log line. */
    const baton_http_header_t *t = baton_http_req_header(req, "X-Baton-Admin-Token");
    if (baton_auth_check_admin(r->auth, req, t ? t->value : NULL) == BATON_AUTH_OK)
        return 1;
    log_warn_limited("router", "pin_refused", "pin_refused peer=%s reason=\"not an admin\"",
                     req->peer);
    return 0;
}

/* Whether a policy in use reads the prompt (cache_aware its text, least_load its word count):
 * the others need neither, and a long prompt's copy and word count are not free. */
static int prompt_needed(baton_router_t *r)
{
    for (int role = BATON_ROLE_PREFILL; role < BATON_ROLE_COUNT; role++) {
        baton_policy_kind_t k = baton_policy_kind(baton_router_policy(r, role));
        if (k == BATON_POLICY_CACHE_AWARE || k == BATON_POLICY_LEAST_LOAD ||
            k == BATON_POLICY_PRECISE)
            return 1;
    }
    return 0;
}

/* The token ids a client sent itself (/v1/completions' prompt as an array of integers, or its
 * first such array; /generate's input_ids): the prompt as the engine sees it, no tokenizer
 * needed. Left unset when the router's tokenizer already filled them, or for anything else. */
static int client_tokens(baton_route_ctx_t *ctx, const baton_pdreq_t *pd)
{
    const val_t *v = NULL;
    if (ctx->tokens)
        return 0;
    if (pd->api == BATON_API_COMPLETIONS)
        v = baton_pdreq_get(pd, "prompt");
    else if (pd->api == BATON_API_GENERATE)
        v = baton_pdreq_get(pd, "input_ids");
    if (!v || v->type != BATON_JSON_ARRAY)
        return 0;
    baton_json_iter_t it;
    val_t p = *v, first, id;
    baton_json_iter_init(&it, &p);
    if (!baton_json_array_next(&it, &first))
        return 0;
    if (first.type == BATON_JSON_ARRAY)
        p = first; /* a batch: its first prompt */
    else if (first.type != BATON_JSON_INTEGER)
        return 0;
    size_t n = 0, cap = 0;
    uint32_t *ids = NULL;
    baton_json_iter_init(&it, &p);
    while (baton_json_array_next(&it, &id)) {
        long long t = id.type == BATON_JSON_INTEGER ? (long long)baton_json_int(&id) : -1;
        if (t < 0 || t > UINT32_MAX) {
            free(ids);
            return 0; /* not token ids: the worker refuses it, no routing on it */
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            uint32_t *g = realloc(ids, cap * sizeof(*ids));
            if (!g) {
                free(ids);
                return BATON_ENOMEM;
            }
            ids = g;
        }
        ids[n++] = (uint32_t)t;
    }
    ctx->client_ids = ids;
    ctx->tokens = ids;
    ctx->n_tokens = n;
    return 0;
}

int baton_route_ctx_build(baton_route_ctx_t *ctx, baton_router_t *r, const baton_pdreq_t *pd,
                          const baton_http_req_t *req)
{
    memset(ctx, 0, sizeof(*ctx));

    baton_buf_t b = BATON_BUF_INIT;
    if (prompt_needed(r) && prompt_text(pd, &b)) {
        baton_buf_free(&b);
        return BATON_ENOMEM;
    }
    size_t text_len = b.len;
    if (b.len && baton_buf_append(&b, "", 1)) {
        baton_buf_free(&b);
        return BATON_ENOMEM;
    }

    /* Session key: headers first (SGLang's x-session-affinity, the common X-Session-ID), then
     * the OpenAI `user` field, then the configured field. */
    static const char *const hdrs[] = {"x-session-affinity", "X-Session-ID"};
    for (size_t i = 0; i < 2 && !ctx->session; i++) {
        const baton_http_header_t *h = baton_http_req_header(req, hdrs[i]);
        if (h && h->value[0]) {
            ctx->session = h->value;
            ctx->session_len = strlen(h->value);
        }
    }
    /* A body field is decoded into the context's own buffer, after the text (and its NUL). */
    size_t session_at = 0, session_len = 0;
    const char *fields[] = {"user", r->cfg->session_key_field};
    for (size_t i = 0; i < 2 && !ctx->session && !session_len; i++) {
        const baton_json_val_t *v = fields[i] ? baton_pdreq_get(pd, fields[i]) : NULL;
        if (v && v->type == BATON_JSON_STRING && baton_json_str_len(v)) {
            session_at = b.len;
            if (baton_json_str_append(v, &b) || baton_buf_append(&b, "", 1)) {
                baton_buf_free(&b);
                return BATON_ENOMEM;
            }
            session_len = b.len - 1 - session_at;
        }
    }
    /* The model, decoded after the session key: its pool is chosen once per request. */
    size_t model_at = 0;
    int has_model = 0;
    const baton_json_val_t *mv = baton_pdreq_get(pd, "model");
    if (mv && mv->type == BATON_JSON_STRING && baton_json_str_len(mv)) {
        model_at = b.len;
        if (baton_json_str_append(mv, &b) || baton_buf_append(&b, "", 1)) {
            baton_buf_free(&b);
            return BATON_ENOMEM;
        }
        has_model = 1;
    }
    if (b.data) {
        ctx->owned = b.data; /* NUL-terminated pieces, owned by the context */
        if (text_len) {
            ctx->text = b.data;
            ctx->text_len = text_len;
            ctx->words = baton_ptree_words(ctx->text, ctx->text_len);
        }
        if (session_len) {
            ctx->session = b.data + session_at;
            ctx->session_len = session_len;
        }
        if (has_model)
            ctx->model = b.data + model_at;
    }
    ctx->model_pool = (int)baton_models_classify(r->registry, ctx->model);
    ctx->kv = r->kv;
    if (client_tokens(ctx, pd) != 0) {
        baton_route_ctx_free(ctx);
        return BATON_ENOMEM;
    }
    const baton_http_header_t *pin = baton_http_req_header(req, "X-Baton-Target-Worker");
    if (pin && pin->value[0] && baton_pin_allowed(r, req))
        ctx->pin = pin->value;
    return 0;
}
