/* route_ctx.c — what a request tells the routing policies: its prompt text, word count and
 * session key, and whether it may pin a worker (X-Baton-Target-Worker). */
#include "router/proxy_internal.h"

#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"
#include "router/auth.h"

/* Appends s to the growing text (a '\n' between pieces). 0 or BATON_ENOMEM. */
static int add(baton_buf_t *b, const char *s, size_t len)
{
    if (b->len && baton_buf_append(b, "\n", 1))
        return BATON_ENOMEM;
    return baton_buf_append(b, s, len);
}

/* Chat content: a string, or a list of parts whose "text" fields count. */
static int add_content(baton_buf_t *b, json_t *content)
{
    if (json_is_string(content))
        return add(b, json_string_value(content), json_string_length(content));
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part)
    {
        json_t *t = json_object_get(part, "text");
        if (json_is_string(t) && add(b, json_string_value(t), json_string_length(t)))
            return BATON_ENOMEM;
    }
    return 0;
}

/* A prompt field: a string, a list (its first element: a batch shares no single prefix), or
 * token ids (each id is a word). */
static int add_prompt(baton_buf_t *b, json_t *p)
{
    if (json_is_array(p) && json_array_size(p) > 0 && !json_is_integer(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (json_is_string(p))
        return add(b, json_string_value(p), json_string_length(p));
    if (json_is_array(p)) {
        size_t i;
        json_t *id;
        json_array_foreach(p, i, id)
        {
            char w[32];
            int n = snprintf(w, sizeof(w), "%lld ", (long long)json_integer_value(id));
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
    json_t *root = pd->root;
    if (pd->api == BATON_API_CHAT) {
        size_t i;
        json_t *m;
        json_array_foreach(json_object_get(root, "messages"), i, m)
        {
            json_t *role = json_object_get(m, "role");
            if (json_is_string(role) && add(b, json_string_value(role), json_string_length(role)))
                return BATON_ENOMEM;
            if (add_content(b, json_object_get(m, "content")))
                return BATON_ENOMEM;
        }
        return 0;
    }
    if (pd->api == BATON_API_COMPLETIONS)
        return add_prompt(b, json_object_get(root, "prompt"));
    json_t *t = json_object_get(root, "text");
    return add_prompt(b, t ? t : json_object_get(root, "input_ids"));
}

int baton__pin_allowed(const baton_router_t *r, const baton_http_req_t *req)
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
        if (k == BATON_POLICY_CACHE_AWARE || k == BATON_POLICY_LEAST_LOAD)
            return 1;
    }
    return 0;
}

int baton__route_ctx_build(baton__preq_t *pr)
{
    baton_router_t *r = pr->pl->router;
    baton_route_ctx_t *ctx = &pr->rctx;
    const baton_http_req_t *req = pr->req;
    memset(ctx, 0, sizeof(*ctx));

    baton_buf_t b = BATON_BUF_INIT;
    if (prompt_needed(r) && prompt_text(&pr->pd, &b)) {
        baton_buf_free(&b);
        return BATON_ENOMEM;
    }
    if (b.len && baton_buf_append(&b, "", 1) == 0) {
        ctx->owned = b.data; /* NUL-terminated, owned by the context */
        ctx->text = b.data;
        ctx->text_len = b.len - 1;
        ctx->words = baton_ptree_words(ctx->text, ctx->text_len);
    } else {
        baton_buf_free(&b);
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
    const char *fields[] = {"user", r->cfg->session_key_field};
    for (size_t i = 0; i < 2 && !ctx->session; i++) {
        json_t *v = fields[i] ? json_object_get(pr->pd.root, fields[i]) : NULL;
        if (json_is_string(v) && json_string_length(v)) {
            ctx->session = json_string_value(v);
            ctx->session_len = json_string_length(v);
        }
    }
    const baton_http_header_t *pin = baton_http_req_header(req, "X-Baton-Target-Worker");
    if (pin && pin->value[0] && baton__pin_allowed(r, req))
        ctx->pin = pin->value;
    return 0;
}
