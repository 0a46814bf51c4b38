/* resp.c — turning SSE events or JSON bodies of the three APIs into content-chunk timings. */
#include "resp.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "baton/error.h"

static const char *const err_names[] = {
#define XX(name, str) str,
    BB_ERR_MAP(XX)
#undef XX
};

const char *bb_err_kind_name(bb_err_kind_t k)
{
    return (unsigned)k < BB_ERR_COUNT ? err_names[k] : "unknown";
}

const char *bb_endpoint_name(bb_endpoint_t ep)
{
    switch (ep) {
    case BB_EP_CHAT:
        return "chat";
    case BB_EP_COMPLETIONS:
        return "completions";
    case BB_EP_GENERATE:
        return "generate";
    }
    return "?";
}

const char *bb_endpoint_path(bb_endpoint_t ep)
{
    switch (ep) {
    case BB_EP_CHAT:
        return "/v1/chat/completions";
    case BB_EP_COMPLETIONS:
        return "/v1/completions";
    case BB_EP_GENERATE:
        return "/generate";
    }
    return "/";
}

uint32_t bb_count_words(const char *s, size_t len)
{
    uint32_t n = 0;
    int in = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        int ws = c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
        if (!ws && !in)
            n++;
        in = !ws;
    }
    return n;
}

void bb_resp_init(bb_resp_t *r, bb_endpoint_t ep, int stream, int keep_text)
{
    memset(r, 0, sizeof(*r));
    r->ep = ep;
    r->stream = stream;
    r->keep_text = keep_text;
    r->sse = (baton_sse_splitter_t)BATON_SSE_SPLITTER_INIT;
    r->usage_tokens = -1;
    r->usage_prompt = -1;
    r->usage_cached = -1;
}

void bb_resp_free(bb_resp_t *r)
{
    baton_sse_splitter_free(&r->sse);
    baton_buf_free(&r->body);
    baton_buf_free(&r->text);
    bb_vec_free(&r->itl_ms);
}

static void fail(bb_resp_t *r, bb_err_kind_t kind, const char *what, const char *detail)
{
    if (r->err != BB_ERR_NONE)
        return;
    r->err = kind;
    snprintf(r->err_msg, sizeof(r->err_msg), "%.60s%.90s", what, detail ? detail : "");
}

/* The message of an {"error": ...} object (string or {"message": ...}). */
static const char *error_message(json_t *err)
{
    if (json_is_string(err))
        return json_string_value(err);
    const char *m = json_string_value(json_object_get(err, "message"));
    return m ? m : "(no message)";
}

static void content_chunk(bb_resp_t *r, const char *text, size_t len, uint64_t t)
{
    if (r->n_chunks == 0)
        r->t_first = t;
    else if (bb_vec_push(&r->itl_ms, (double)(t - r->t_last) / 1e6))
        fail(r, BB_ERR_BAD_RESPONSE, "out of memory", NULL);
    r->t_last = t;
    r->n_chunks++;
    /* /generate needs the text to tell cumulative from delta streams; non-streaming bodies
     * keep it to count words when there is no usage. */
    int keep = r->keep_text || r->ep == BB_EP_GENERATE || !r->stream;
    if (keep && baton_buf_append(&r->text, text, len))
        fail(r, BB_ERR_BAD_RESPONSE, "out of memory", NULL);
}

static void take_usage(bb_resp_t *r, json_t *obj)
{
    json_t *u = json_object_get(obj, "usage");
    json_t *ct = u ? json_object_get(u, "completion_tokens") : NULL;
    if (!ct) {
        json_t *mi = json_object_get(obj, "meta_info");
        ct = mi ? json_object_get(mi, "completion_tokens") : NULL;
    }
    if (json_is_integer(ct) && json_integer_value(ct) >= 0)
        r->usage_tokens = json_integer_value(ct);
    /* prompt and cached tokens: OpenAI's usage, else SGLang's meta_info */
    json_t *mi = json_object_get(obj, "meta_info");
    json_t *pt = u ? json_object_get(u, "prompt_tokens") : json_object_get(mi, "prompt_tokens");
    json_t *ck = u ? json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")
                   : json_object_get(mi, "cached_tokens");
    if (json_is_integer(pt) && json_is_integer(ck)) {
        r->usage_prompt = json_integer_value(pt);
        r->usage_cached = json_integer_value(ck);
    }
}

/* The generated text of one streamed event or a whole body, or NULL. */
static json_t *choice0(json_t *obj)
{
    json_t *choices = json_object_get(obj, "choices");
    return json_is_array(choices) ? json_array_get(choices, 0) : NULL;
}

typedef struct {
    bb_resp_t *r;
    uint64_t t;
} event_ctx_t;

static int on_payload(const char *p, size_t n, void *arg)
{
    event_ctx_t *ctx = arg;
    bb_resp_t *r = ctx->r;
    if (r->err != BB_ERR_NONE)
        return 1;
    if (n == 6 && memcmp(p, "[DONE]", 6) == 0) {
        r->done_seen = 1;
        return 0;
    }
    json_error_t jerr;
    json_t *obj = json_loadb(p, n, 0, &jerr);
    if (!obj) {
        fail(r, BB_ERR_BAD_RESPONSE, "event is not JSON: ", jerr.text);
        return 1;
    }
    json_t *e = json_object_get(obj, "error");
    if (e && !json_is_null(e)) {
        fail(r, BB_ERR_STREAM, "error event: ", error_message(e));
        json_decref(obj);
        return 1;
    }
    take_usage(r, obj);
    const char *s = NULL;
    size_t len = 0;
    if (r->ep == BB_EP_GENERATE) {
        json_t *t = json_object_get(obj, "text");
        if (json_is_string(t)) {
            const char *all = json_string_value(t);
            size_t all_len = json_string_length(t);
            /* SGLang streams the cumulative text (the new part is what follows the text seen so
             * far); a server streaming deltas (--stream-output) works too. */
            size_t seen = r->text.len;
            if (all_len >= seen && (seen == 0 || memcmp(all, r->text.data, seen) == 0)) {
                s = all + seen;
                len = all_len - seen;
            } else {
                s = all;
                len = all_len;
            }
        }
    } else {
        json_t *c = choice0(obj);
        json_t *t = NULL;
        if (c)
            t = r->ep == BB_EP_CHAT ? json_object_get(json_object_get(c, "delta"), "content")
                                    : json_object_get(c, "text");
        if (json_is_string(t)) {
            s = json_string_value(t);
            len = json_string_length(t);
        }
    }
    if (s && len)
        content_chunk(r, s, len, ctx->t);
    json_decref(obj);
    return 0;
}

static int on_raw_event(const char *raw, size_t len, void *arg)
{
    return baton_sse_each(raw, len, on_payload, arg);
}

int bb_resp_feed(bb_resp_t *r, const char *data, size_t len, uint64_t t_ns)
{
    if (r->err != BB_ERR_NONE)
        return 0;
    if (!r->stream) {
        if (baton_buf_append(&r->body, data, len)) {
            fail(r, BB_ERR_BAD_RESPONSE, "out of memory", NULL);
            return BATON_ENOMEM;
        }
        return 0;
    }
    event_ctx_t ctx = {r, t_ns};
    int rc = baton_sse_feed(&r->sse, data, len, on_raw_event, &ctx);
    if (rc == BATON_ENOMEM) {
        fail(r, BB_ERR_BAD_RESPONSE, "out of memory", NULL);
        return rc;
    }
    return 0;
}

static void finish_body(bb_resp_t *r, uint64_t t_ns)
{
    json_error_t jerr;
    json_t *obj = json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, &jerr);
    if (!obj) {
        fail(r, BB_ERR_BAD_RESPONSE, "body is not JSON: ", jerr.text);
        return;
    }
    json_t *o = obj;
    if (json_is_array(obj)) /* a /generate batch: the bench sends one prompt, take the first */
        o = json_array_get(obj, 0);
    json_t *e = json_object_get(o, "error");
    if (e && !json_is_null(e)) {
        fail(r, BB_ERR_STREAM, "error in body: ", error_message(e));
        json_decref(obj);
        return;
    }
    take_usage(r, o);
    json_t *t = NULL;
    if (r->ep == BB_EP_GENERATE) {
        t = json_object_get(o, "text");
    } else {
        json_t *c = choice0(o);
        if (c)
            t = r->ep == BB_EP_CHAT ? json_object_get(json_object_get(c, "message"), "content")
                                    : json_object_get(c, "text");
    }
    if (json_is_string(t) && json_string_length(t) > 0)
        content_chunk(r, json_string_value(t), json_string_length(t), t_ns);
    json_decref(obj);
}

void bb_resp_finish(bb_resp_t *r, uint64_t t_ns)
{
    if (r->err != BB_ERR_NONE)
        return;
    if (!r->stream) {
        finish_body(r, t_ns);
    } else if (baton_sse_pending(&r->sse) > 0 || !r->done_seen) {
        /* Tolerate a missing final blank line after [DONE], nothing else. */
        if (!r->done_seen)
            fail(r, BB_ERR_BAD_RESPONSE, "stream ended without data: [DONE]", NULL);
    }
    if (r->err == BB_ERR_NONE && r->n_chunks == 0)
        fail(r, BB_ERR_NO_CONTENT, "response carried no generated text", NULL);
}

uint32_t bb_resp_output_tokens(const bb_resp_t *r)
{
    if (r->usage_tokens >= 0)
        return r->usage_tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)r->usage_tokens;
    if (r->stream)
        return r->n_chunks;
    return bb_count_words(r->text.data ? r->text.data : "", r->text.len);
}
