/* wtok.c — baton-worker's optional real tokenizer: one loaded tokenizer and chat template
 * shared read-only by the worker's threads, a scratch per thread. */
#include "worker/wtok.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tok_api.h"
#include "tokenizer/tokenizer.h"

static baton_tok_t *g_tok;
static baton_tmpl_t *g_tmpl;
static pthread_key_t g_key;
static bool g_key_made;
static int g_add_bos; /* completions get the bos transformers adds (tok_api.h) */

static void scratch_free(void *p)
{
    baton_tok_scratch_free(p);
}

int wk_tok_load(const char *path, char *err, size_t errlen)
{
    int rc = baton_tok_load(path, &g_tok, err, errlen);
    if (rc < 0) {
        return rc;
    }
    const char *src = baton_tok_config_str(g_tok, "chat_template");
    if (src && (rc = baton_tmpl_compile(src, strlen(src), &g_tmpl, err, errlen)) < 0) {
        wk_tok_unload();
        return rc;
    }
    baton_tok_scratch_t *sc = baton_tok_scratch_new();
    if (!sc) {
        wk_tok_unload();
        return BATON_ENOMEM;
    }
    g_add_bos = baton_tok_prompt_adds_bos(g_tok, sc);
    baton_tok_scratch_free(sc);
    if (!g_key_made) {
        if (pthread_key_create(&g_key, scratch_free) != 0) {
            wk_tok_unload();
            return BATON_ENOMEM;
        }
        g_key_made = true;
    }
    return 0;
}

void wk_tok_unload(void)
{
    baton_tmpl_free(g_tmpl);
    g_tmpl = NULL;
    baton_tok_free(g_tok);
    g_tok = NULL;
}

bool wk_tok_enabled(void)
{
    return g_tok != NULL;
}

bool wk_tok_has_template(void)
{
    return g_tmpl != NULL;
}

static baton_tok_scratch_t *scratch(void)
{
    baton_tok_scratch_t *sc = pthread_getspecific(g_key);
    if (!sc) {
        sc = baton_tok_scratch_new();
        if (sc && pthread_setspecific(g_key, sc) != 0) {
            baton_tok_scratch_free(sc);
            sc = NULL;
        }
    }
    return sc;
}

/* vLLM's encoding: a rendered chat template as it is, a prompt with add_special_tokens
 * (the post-processor's tokens and the bos transformers adds). */
static int encode(void *arg, const char *s, size_t len, int chat, int add_special,
                  baton_tok_ids_t *out)
{
    (void)arg;
    baton_tok_scratch_t *sc = scratch();
    if (!sc)
        return BATON_ENOMEM;
    size_t base = out->len;
    if (!chat && add_special && g_add_bos) {
        if (out->len == out->cap) {
            uint32_t *p = realloc(out->ids, (out->cap + 16) * sizeof(*p));
            if (!p)
                return BATON_ENOMEM;
            out->ids = p;
            out->cap += 16;
        }
        out->ids[out->len++] = (uint32_t)baton_tok_bos_id(g_tok);
    }
    unsigned flags = BATON_TOK_PARSE_SPECIAL | (!chat && add_special ? BATON_TOK_ADD_SPECIAL : 0);
    int rc = baton_tok_encode(g_tok, sc, s, len, flags, out);
    if (rc)
        out->len = base;
    return rc;
}

int wk_tok_api(int detok, const char *body, size_t len, json_t **resp, baton_tok_api_err_t *e)
{
    *resp = NULL;
    memset(e, 0, sizeof(*e));
    json_t *j = json_loadb(body, len, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        snprintf(e->message, sizeof(e->message), "request body must be a JSON object");
        return 1;
    }
    baton_tok_api_t a = {g_tok, g_tmpl, baton_tok_model_max_length(g_tok), encode, NULL};
    int rc =
        detok ? baton_tok_api_detokenize(&a, j, resp, e) : baton_tok_api_tokenize(&a, j, resp, e);
    json_decref(j);
    return rc;
}

int wk_tok_encode(const char *s, size_t len, bool chat, int64_t **ids_p, uint32_t *n_p)
{
    *ids_p = NULL;
    *n_p = 0;
    baton_tok_ids_t ids = BATON_TOK_IDS_INIT;
    int rc = encode(NULL, s, len, chat, !chat, &ids);
    if (rc < 0) {
        return rc;
    }
    if (ids.len > UINT32_MAX) {
        baton_tok_ids_free(&ids);
        return BATON_EINVAL;
    }
    int64_t *out = malloc((ids.len ? ids.len : 1) * sizeof(*out));
    if (!out) {
        baton_tok_ids_free(&ids);
        return BATON_ENOMEM;
    }
    for (size_t i = 0; i < ids.len; i++) {
        out[i] = ids.ids[i];
    }
    *ids_p = out;
    *n_p = (uint32_t)ids.len;
    baton_tok_ids_free(&ids);
    return 0;
}

int wk_tok_render_chat(const json_t *body, baton_buf_t *out, char *err, size_t errlen)
{
    return baton_tmpl_render_chat(g_tmpl, g_tok, body, NULL, out, err, errlen);
}
