/* render.c — JSON and SSE bodies of the worker's answers (render.h). */
#include "worker/render.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"

/* ---- small builders ---- */

static json_t *str_n(const char *s, size_t n)
{
    return json_stringn(s ? s : "", n);
}

/* Appends pre, j as compact JSON, then post; releases j. */
static int put_framed(baton_buf_t *out, const char *pre, json_t *j, const char *post)
{
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(12)) : NULL;
    json_decref(j);
    if (s == NULL)
        return BATON_ENOMEM;
    int rc = 0;
    if (baton_buf_append_str(out, pre) != 0 || baton_buf_append_str(out, s) != 0 ||
        baton_buf_append_str(out, post) != 0)
        rc = BATON_ENOMEM;
    free(s);
    return rc;
}

static int put_json(baton_buf_t *out, json_t *j)
{
    return put_framed(out, "", j, "");
}

/* One SSE event: "data: <json>\n\n". */
static int sse_json(baton_buf_t *out, json_t *j)
{
    return put_framed(out, "data: ", j, "\n\n");
}

static json_t *token_text(const wk_gen_t *g, uint32_t i)
{
    baton_buf_t b = BATON_BUF_INIT;
    if (wk_gen_token_text(g, i, &b) != 0) {
        baton_buf_free(&b);
        return NULL;
    }
    json_t *j = str_n(b.data, b.len);
    baton_buf_free(&b);
    return j;
}

/* Text of alternative token `id` at position i, as in wk_gen_token_text. */
static json_t *alt_text(uint32_t i, int64_t id)
{
    const char *w = wk_sim_word(id);
    size_t wl = strlen(w);
    char buf[64];
    size_t n = 0;
    if (i > 0)
        buf[n++] = ' ';
    memcpy(buf + n, w, wl);
    n += wl;
    return str_n(buf, n);
}

static json_t *bytes_of(json_t *text)
{
    json_t *a = json_array();
    const char *s = json_string_value(text);
    size_t n = json_string_length(text);
    for (size_t i = 0; a && s && i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

static const char *finish_name(wk_finish_t f)
{
    switch (f) {
    case WK_FINISH_LENGTH:
        return "length";
    case WK_FINISH_STOP:
        return "stop";
    default:
        return NULL;
    }
}

static json_t *matched_stop(const wk_item_t *it, const wk_gen_t *g)
{
    if (g->finish != WK_FINISH_STOP)
        return json_null();
    if (g->matched_str >= 0)
        return str_n(it->stop_strs[g->matched_str], it->stop_lens[g->matched_str]);
    return json_integer(g->matched_id);
}

static json_t *finish_reason(const wk_gen_t *g)
{
    const char *f = finish_name(g->finish);
    return f ? json_string(f) : json_null();
}

void wk_render_usage(const wk_request_t *req, const wk_gen_t *const *gens, uint64_t *prompt_p,
                     uint64_t *completion_p)
{
    uint64_t p = 0, c = 0;
    size_t last = (size_t)-1;
    for (size_t i = 0; i < req->n_items; i++) {
        if (req->items[i].prompt_index != last) {
            last = req->items[i].prompt_index;
            p += req->items[i].prompt_tokens;
        }
        c += gens[i]->n_tokens;
    }
    *prompt_p = p;
    *completion_p = c;
}

/* Prompt tokens found in the prefix cache, each prompt counted once (as wk_render_usage). */
static uint64_t usage_cached(const wk_request_t *req)
{
    uint64_t k = 0;
    size_t last = (size_t)-1;
    for (size_t i = 0; i < req->n_items; i++) {
        if (req->items[i].prompt_index != last) {
            last = req->items[i].prompt_index;
            k += req->items[i].cached_tokens;
        }
    }
    return k;
}

static json_t *usage_json(const wk_request_t *req, const wk_gen_t *const *gens)
{
    uint64_t p, c;
    wk_render_usage(req, gens, &p, &c);
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)p, "completion_tokens",
                     (json_int_t)c, "total_tokens", (json_int_t)(p + c), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)usage_cached(req));
}

/* ---- OpenAI logprobs ---- */

/* chat: {"content":[{token, logprob, bytes, top_logprobs}...]} for tokens [from, to). */
static json_t *chat_logprobs(const wk_item_t *it, const wk_gen_t *g, uint32_t from, uint32_t to)
{
    json_t *content = json_array();
    for (uint32_t i = from; content && i < to; i++) {
        double lp = wk_sim_output_logprob(g->seed, i);
        json_t *tt = token_text(g, i);
        json_t *top = json_array();
        for (int r = 0; top && r < it->top_logprobs; r++) {
            int64_t id = (g->ids[i] + r) % WK_SIM_VOCAB_SIZE;
            json_t *at = r == 0 ? json_incref(tt) : alt_text(i, id);
            json_array_append_new(top, json_pack("{s:O,s:f,s:o}", "token", at, "logprob", lp - r,
                                                 "bytes", bytes_of(at)));
            json_decref(at);
        }
        json_array_append_new(content, json_pack("{s:O,s:f,s:o,s:o}", "token", tt, "logprob", lp,
                                                 "bytes", bytes_of(tt), "top_logprobs", top));
        json_decref(tt);
    }
    return json_pack("{s:o}", "content", content);
}

/* completions: {tokens, token_logprobs, top_logprobs, text_offset} for tokens [from, to).
 * Offsets count from the start of the completion text. */
static json_t *completion_logprobs(const wk_item_t *it, const wk_gen_t *g, uint32_t from,
                                   uint32_t to)
{
    json_t *tokens = json_array(), *lps = json_array(), *offs = json_array();
    json_t *tops = it->top_logprobs > 0 ? json_array() : json_null();
    size_t limit = g->finish != WK_FINISH_NONE ? g->final_len : g->text.len;
    for (uint32_t i = from; i < to; i++) {
        double lp = wk_sim_output_logprob(g->seed, i);
        json_t *tt = token_text(g, i);
        size_t off = i == 0 ? 0 : g->tok_end[i - 1];
        if (off > limit)
            off = limit;
        if (json_is_array(tops)) {
            json_t *d = json_object();
            for (int r = 0; d && r < it->top_logprobs; r++) {
                int64_t id = (g->ids[i] + r) % WK_SIM_VOCAB_SIZE;
                json_t *at = r == 0 ? json_incref(tt) : alt_text(i, id);
                if (at)
                    json_object_set_new(d, json_string_value(at), json_real(lp - r));
                json_decref(at);
            }
            json_array_append_new(tops, d);
        }
        json_array_append_new(tokens, tt);
        json_array_append_new(lps, json_real(lp));
        json_array_append_new(offs, json_integer((json_int_t)off));
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs",
                     tops, "text_offset", offs);
}

/* ---- SGLang /generate ---- */

/* The tokenizer's whitespace (simtext.c counts words the same way). */
static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static json_t *input_logprobs(const wk_render_ctx_t *ctx, const wk_item_t *it)
{
    json_t *a = json_array();
    if (!ctx->input_logprobs || a == NULL)
        return a;
    uint32_t j = 0;
    if (it->prompt == NULL || it->text_ids != NULL) { /* ids given, or the model's (--tokenizer) */
        const int64_t *ids = it->prompt == NULL ? it->ids : it->text_ids;
        size_t n_ids = it->prompt == NULL ? it->n_ids : it->prompt_tokens;
        for (size_t k = 0; k < n_ids; k++, j++) {
            if (j < it->logprob_start)
                continue;
            json_t *lp = j == 0 ? json_null() : json_real(wk_sim_input_logprob(it->seed, j));
            json_array_append_new(a, json_pack("[o,I,n]", lp, (json_int_t)ids[k]));
        }
        return a;
    }
    const char *s = it->prompt;
    size_t n = it->prompt_len, k = 0;
    int any = 0;
    while (k < n) {
        while (k < n && is_ws(s[k]))
            k++;
        if (k >= n)
            break;
        size_t start = k;
        while (k < n && !is_ws(s[k]))
            k++;
        any = 1;
        if (j >= it->logprob_start) {
            json_t *lp = j == 0 ? json_null() : json_real(wk_sim_input_logprob(it->seed, j));
            json_array_append_new(
                a, json_pack("[o,I,n]", lp, (json_int_t)wk_sim_word_id(s + start, k - start)));
        }
        j++;
    }
    if (!any && it->logprob_start == 0) /* an empty prompt still counts as one token */
        json_array_append_new(a, json_pack("[n,I,n]", (json_int_t)wk_sim_word_id("", 0)));
    return a;
}

static json_t *gen_finish_reason(const wk_item_t *it, const wk_gen_t *g)
{
    if (g->finish == WK_FINISH_LENGTH)
        return json_pack("{s:s,s:I}", "type", "length", "length", (json_int_t)g->n_tokens);
    if (g->finish == WK_FINISH_STOP)
        return json_pack("{s:s,s:o}", "type", "stop", "matched", matched_stop(it, g));
    return json_null();
}

static json_t *generate_obj(const wk_render_ctx_t *ctx, const wk_item_t *it, const wk_gen_t *g,
                            size_t text_len, int with_index, size_t index)
{
    json_t *ids = json_array();
    for (uint32_t i = 0; ids && i < g->n_tokens; i++)
        json_array_append_new(ids, json_integer(g->ids[i]));
    json_t *meta =
        json_pack("{s:s,s:o,s:I,s:I,s:I,s:f}", "id", it->rid ? it->rid : ctx->id, "finish_reason",
                  gen_finish_reason(it, g), "prompt_tokens", (json_int_t)it->prompt_tokens,
                  "completion_tokens", (json_int_t)g->n_tokens, "cached_tokens",
                  (json_int_t)it->cached_tokens, "e2e_latency", ctx->e2e_s);
    if (meta && it->tiered) /* SGLang's HiCache breakdown: device (L1), host (L2), storage (L3) */
        json_object_set_new(meta, "cached_tokens_details",
                            json_pack("{s:I,s:I,s:I}", "device", (json_int_t)it->cached_l1, "host",
                                      (json_int_t)it->cached_l2, "storage",
                                      (json_int_t)it->cached_l3));
    if (meta && it->logprobs) {
        json_t *out = json_array();
        for (uint32_t i = 0; out && i < g->n_tokens; i++)
            json_array_append_new(out, json_pack("[f,I,n]", wk_sim_output_logprob(g->seed, i),
                                                 (json_int_t)g->ids[i]));
        json_object_set_new(meta, "input_token_logprobs", input_logprobs(ctx, it));
        json_object_set_new(meta, "output_token_logprobs", out);
    }
    json_t *o = json_pack("{s:o,s:o,s:o}", "text", str_n(g->text.data, text_len), "output_ids", ids,
                          "meta_info", meta);
    if (o && with_index)
        json_object_set_new(o, "index", json_integer((json_int_t)index));
    return o;
}

/* ---- whole answers ---- */

int wk_render_full(const wk_render_ctx_t *ctx, const wk_request_t *req, const wk_gen_t *const *gens,
                   baton_buf_t *out)
{
    if (req->api == WK_API_RESPONSES)
        return wk_render_responses_full(ctx, req, gens, out);
    if (req->api == WK_API_GENERATE) {
        if (!req->is_batch)
            return put_json(out,
                            generate_obj(ctx, &req->items[0], gens[0], gens[0]->final_len, 0, 0));
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < req->n_items; i++)
            json_array_append_new(
                arr, generate_obj(ctx, &req->items[i], gens[i], gens[i]->final_len, 0, 0));
        return put_json(out, arr);
    }
    int chat = req->api == WK_API_CHAT;
    json_t *choices = json_array();
    for (size_t i = 0; choices && i < req->n_items; i++) {
        const wk_item_t *it = &req->items[i];
        const wk_gen_t *g = gens[i];
        json_t *lp = json_null();
        if (it->logprobs)
            lp = chat ? chat_logprobs(it, g, 0, g->n_tokens)
                      : completion_logprobs(it, g, 0, g->n_tokens);
        json_t *c;
        if (chat)
            c = json_pack("{s:I,s:{s:s,s:o},s:o,s:o,s:o}", "index", (json_int_t)it->choice_index,
                          "message", "role", "assistant", "content",
                          str_n(g->text.data, g->final_len), "logprobs", lp, "finish_reason",
                          finish_reason(g), "matched_stop", matched_stop(it, g));
        else
            c = json_pack("{s:I,s:o,s:o,s:o,s:o}", "index", (json_int_t)it->choice_index, "text",
                          str_n(g->text.data, g->final_len), "logprobs", lp, "finish_reason",
                          finish_reason(g), "matched_stop", matched_stop(it, g));
        json_array_append_new(choices, c);
    }
    return put_json(out, json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", ctx->id, "object",
                                   chat ? "chat.completion" : "text_completion", "created",
                                   (json_int_t)ctx->created, "model", ctx->model, "choices",
                                   choices, "usage", usage_json(req, gens)));
}

/* ---- streaming ---- */

static json_t *chunk(const wk_render_ctx_t *ctx, int chat, json_t *choice)
{
    return json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", ctx->id, "object",
                     chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)ctx->created, "model", ctx->model, "choices", choice);
}

int wk_render_stream_progress(const wk_render_ctx_t *ctx, const wk_request_t *req, size_t i,
                              const wk_gen_t *g, wk_stream_state_t *st, baton_buf_t *out)
{
    const wk_item_t *it = &req->items[i];
    if (st->finished)
        return 0;
    if (req->api == WK_API_RESPONSES)
        return wk_render_responses_progress(ctx, req, g, st, out);
    int done = g->finish != WK_FINISH_NONE;
    size_t vis = wk_gen_visible_len(g);
    if (vis < st->sent_bytes)
        vis = st->sent_bytes;
    int rc = 0;

    if (req->api == WK_API_GENERATE) {
        if (g->n_tokens == st->sent_tokens && !done)
            return 0;
        rc = sse_json(out, generate_obj(ctx, it, g, vis, req->is_batch, it->choice_index));
        st->sent_tokens = g->n_tokens;
        st->sent_bytes = vis;
        st->finished = done;
        return rc;
    }

    int chat = req->api == WK_API_CHAT;
    json_t *index = json_integer((json_int_t)it->choice_index);
    if (chat && !st->started) {
        st->started = 1;
        rc = sse_json(out,
                      chunk(ctx, chat,
                            json_pack("{s:O,s:{s:s,s:s},s:n,s:n}", "index", index, "delta", "role",
                                      "assistant", "content", "", "logprobs", "finish_reason")));
        if (rc != 0)
            goto out;
    }
    if (!done && vis == st->sent_bytes)
        goto out; /* nothing visible yet; logprobs ride with the next piece */
    json_t *piece = str_n(g->text.data + st->sent_bytes, vis - st->sent_bytes);
    json_t *lp = json_null();
    if (it->logprobs && g->n_tokens > st->sent_tokens)
        lp = chat ? chat_logprobs(it, g, st->sent_tokens, g->n_tokens)
                  : completion_logprobs(it, g, st->sent_tokens, g->n_tokens);
    json_t *choice;
    if (chat) {
        json_t *delta = json_object();
        if (delta && vis > st->sent_bytes)
            json_object_set(delta, "content", piece);
        choice = json_pack("{s:O,s:o,s:o,s:o,s:o}", "index", index, "delta", delta, "logprobs", lp,
                           "finish_reason", finish_reason(g), "matched_stop", matched_stop(it, g));
        json_decref(piece);
    } else {
        choice = json_pack("{s:O,s:o,s:o,s:o,s:o}", "index", index, "text", piece, "logprobs", lp,
                           "finish_reason", finish_reason(g), "matched_stop", matched_stop(it, g));
    }
    rc = sse_json(out, chunk(ctx, chat, choice));
    st->sent_bytes = vis;
    st->sent_tokens = g->n_tokens;
    st->finished = done;
out:
    json_decref(index);
    return rc;
}

int wk_render_stream_tail(const wk_render_ctx_t *ctx, const wk_request_t *req,
                          const wk_gen_t *const *gens, baton_buf_t *out)
{
    if (req->api == WK_API_RESPONSES)
        return wk_render_responses_tail(ctx, req, gens, out);
    if (req->api != WK_API_GENERATE && req->include_usage) {
        int chat = req->api == WK_API_CHAT;
        int rc = sse_json(out, json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", ctx->id, "object",
                                         chat ? "chat.completion.chunk" : "text_completion",
                                         "created", (json_int_t)ctx->created, "model", ctx->model,
                                         "choices", "usage", usage_json(req, gens)));
        if (rc != 0)
            return rc;
    }
    return baton_buf_append_str(out, "data: [DONE]\n\n");
}

int wk_render_stream_error(const char *message, const char *type, const char *code,
                           baton_buf_t *out)
{
    int rc = sse_json(out, json_pack("{s:{s:s,s:s,s:s?}}", "error", "message", message, "type",
                                     type, "code", code));
    if (rc != 0)
        return rc;
    return baton_buf_append_str(out, "data: [DONE]\n\n");
}
