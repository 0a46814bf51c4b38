/* continuation.c — a request that continues a stream another worker began (continuation.h):
 * parsing "baton_continuation" and replaying a sequence up to where the client's stream stopped. */
#include "worker/continuation.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"

static int refuse(wk_parse_err_t *err, const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    err->status = 400;
    err->code = code;
    snprintf(err->param, sizeof(err->param), "baton_continuation");
    return BATON_EINVAL;
}

void wk_cont_free(wk_cont_item_t *cont, size_t n)
{
    for (size_t i = 0; cont && i < n; i++)
        free(cont[i].text);
    free(cont);
}

static int parse_entry(json_t *e, size_t i, wk_cont_item_t *c, wk_parse_err_t *err)
{
    c->tokens = -1;
    if (json_is_null(e))
        return 0;
    json_t *text = json_object_get(e, "text");
    json_t *fin = json_object_get(e, "finished");
    json_t *tok = json_object_get(e, "tokens");
    if (!json_is_object(e) || !json_is_string(text) || (fin && !json_is_boolean(fin)) ||
        (tok && !json_is_null(tok) &&
         (!json_is_integer(tok) || json_integer_value(tok) < 0 ||
          json_integer_value(tok) > WK_MAX_TOKENS_CAP)))
        return refuse(err, "invalid_type",
                      "'baton_continuation.choices[%zu]' must be null or an object with a string "
                      "'text', a boolean 'finished' and a count 'tokens'",
                      i);
    c->present = 1;
    c->len = json_string_length(text);
    c->text = malloc(c->len + 1);
    if (c->text == NULL)
        return BATON_ENOMEM;
    memcpy(c->text, json_string_value(text), c->len + 1);
    c->finished = json_is_true(fin);
    if (json_is_integer(tok))
        c->tokens = json_integer_value(tok);
    return 0;
}

int wk_cont_parse(json_t *root, wk_request_t *req, wk_parse_err_t *err)
{
    json_t *v = json_object_get(root, "baton_continuation");
    if (v == NULL || json_is_null(v))
        return 0;
    json_t *ch = json_object_get(v, "choices");
    if (!json_is_object(v) || !json_is_array(ch))
        return refuse(err, "invalid_type",
                      "'baton_continuation' must be an object with a 'choices' array");
    if (!req->stream || req->api == WK_API_RESPONSES)
        return refuse(err, "invalid_value",
                      "a continuation is taken by streamed chat, completions and generate "
                      "requests only");
    for (size_t i = 0; i < req->n_items; i++)
        if (req->items[i].logprobs)
            return refuse(err, "invalid_value", "a continuation cannot carry logprobs");
    if (json_array_size(ch) != req->n_items)
        return refuse(err, "invalid_value",
                      "'baton_continuation.choices' has %zu entries; the request has %zu "
                      "sequences",
                      json_array_size(ch), req->n_items);
    req->cont = calloc(req->n_items, sizeof(*req->cont));
    if (req->cont == NULL)
        return BATON_ENOMEM;
    for (size_t i = 0; i < req->n_items; i++) {
        size_t at = req->items[i].choice_index;
        int rc = parse_entry(json_array_get(ch, at), at, &req->cont[i], err);
        if (rc != 0)
            return rc; /* wk_request_free frees req->cont */
    }
    return 0;
}

/* Whether the replay has reached the point the client's stream stopped at. */
static int reached(const wk_cont_item_t *c, const wk_gen_t *g)
{
    if (g->finish != WK_FINISH_NONE)
        return 1;
    if (c->tokens >= 0)
        return g->n_tokens >= (unsigned long long)c->tokens;
    /* the chunk that ended the sequence may add no text: replay to the end then */
    return !c->finished && wk_gen_visible_len(g) >= c->len;
}

int wk_cont_replay(const wk_cont_item_t *c, wk_gen_t *g, wk_stream_state_t *st)
{
    if (c == NULL || !c->present)
        return 0;
    while (!reached(c, g)) {
        int rc = wk_gen_push(g, wk_gen_next_id(g));
        if (rc != 0)
            return rc;
    }
    size_t vis = wk_gen_visible_len(g);
    if (vis < c->len || (c->len && memcmp(g->text.data, c->text, c->len) != 0) ||
        (c->finished && (g->finish == WK_FINISH_NONE || g->final_len != c->len)) ||
        (c->tokens >= 0 && g->n_tokens != (unsigned long long)c->tokens))
        return BATON_EINVAL;
    st->sent_bytes = c->len;
    st->sent_tokens = g->n_tokens;
    st->started = 1;
    st->finished = c->finished;
    return 0;
}
