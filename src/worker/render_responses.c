/* render_responses.c — the worker's OpenAI Responses API answers: the response object (text
 * output, usage) and its stream of typed events. */
#include "worker/render.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "baton/error.h"

/* One typed event: "event: <type>\ndata: <json with type and sequence_number>\n\n". */
static int event(const wk_render_ctx_t *ctx, baton_buf_t *out, const char *type, json_t *j)
{
    if (!j)
        return BATON_ENOMEM;
    json_object_set_new(j, "type", json_string(type));
    json_object_set_new(j, "sequence_number", json_integer((json_int_t)(*ctx->seq)++));
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s)
        return BATON_ENOMEM;
    int rc = baton_buf_printf(out, "event: %s\ndata: %s\n\n", type, s);
    free(s);
    return rc ? BATON_ENOMEM : 0;
}

static json_t *msg_id(const wk_render_ctx_t *ctx)
{
    /* one message per response: its id follows the response's */
    size_t n = strlen(ctx->id);
    const char *tail = n > 5 ? ctx->id + 5 : ctx->id; /* past "resp_" */
    return json_sprintf("msg_%s", tail);
}

static json_t *text_part(const char *text, size_t len)
{
    return json_pack("{s:s,s:s%,s:[]}", "type", "output_text", "text", text ? text : "", len,
                     "annotations");
}

static json_t *message_item(const wk_render_ctx_t *ctx, const char *status, json_t *content)
{
    return json_pack("{s:s,s:o,s:s,s:s,s:o}", "type", "message", "id", msg_id(ctx), "status",
                     status, "role", "assistant", "content", content);
}

static json_t *usage(const wk_request_t *req, const wk_gen_t *const *gens)
{
    uint64_t p, c;
    wk_render_usage(req, gens, &p, &c);
    return json_pack("{s:I,s:{s:I},s:I,s:{s:I},s:I}", "input_tokens", (json_int_t)p,
                     "input_tokens_details", "cached_tokens",
                     (json_int_t)req->items[0].cached_tokens, "output_tokens", (json_int_t)c,
                     "output_tokens_details", "reasoning_tokens", (json_int_t)0, "total_tokens",
                     (json_int_t)(p + c));
}

/* The response object: `gens` NULL while in progress (no output, no usage yet). */
static json_t *response_obj(const wk_render_ctx_t *ctx, const wk_request_t *req,
                            const wk_gen_t *const *gens)
{
    const wk_gen_t *g = gens ? gens[0] : NULL;
    int incomplete = g && g->finish == WK_FINISH_LENGTH;
    json_t *output = json_array();
    if (g)
        json_array_append_new(
            output, message_item(ctx, incomplete ? "incomplete" : "completed",
                                 json_pack("[o]", text_part(g->text.data, g->final_len))));
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:o,s:o,s:b}", "id", ctx->id, "object",
                          "response", "created_at", (json_int_t)ctx->created, "status",
                          !g           ? "in_progress"
                          : incomplete ? "incomplete"
                                       : "completed",
                          "model", ctx->model, "output", output, "previous_response_id",
                          req->prev_id ? json_string(req->prev_id) : json_null(), "usage",
                          g ? usage(req, gens) : json_null(), "parallel_tool_calls", 0);
    if (o)
        json_object_set_new(o, "incomplete_details",
                            incomplete ? json_pack("{s:s}", "reason", "max_output_tokens")
                                       : json_null());
    return o;
}

int wk_render_responses_full(const wk_render_ctx_t *ctx, const wk_request_t *req,
                             const wk_gen_t *const *gens, baton_buf_t *out)
{
    char *s = NULL;
    json_t *o = response_obj(ctx, req, gens);
    s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s)
        return BATON_ENOMEM;
    int rc = baton_buf_append_str(out, s);
    free(s);
    return rc ? BATON_ENOMEM : 0;
}

int wk_render_responses_progress(const wk_render_ctx_t *ctx, const wk_request_t *req,
                                 const wk_gen_t *g, wk_stream_state_t *st, baton_buf_t *out)
{
    int rc = 0;
    if (!st->started) {
        st->started = 1;
        if ((rc = event(ctx, out, "response.created",
                        json_pack("{s:o}", "response", response_obj(ctx, req, NULL)))) ||
            (rc = event(ctx, out, "response.in_progress",
                        json_pack("{s:o}", "response", response_obj(ctx, req, NULL)))) ||
            (rc = event(ctx, out, "response.output_item.added",
                        json_pack("{s:i,s:o}", "output_index", 0, "item",
                                  message_item(ctx, "in_progress", json_array())))) ||
            (rc = event(ctx, out, "response.content_part.added",
                        json_pack("{s:o,s:i,s:i,s:o}", "item_id", msg_id(ctx), "output_index", 0,
                                  "content_index", 0, "part", text_part("", 0)))))
            return rc;
    }
    size_t vis = wk_gen_visible_len(g);
    if (vis > st->sent_bytes) {
        rc = event(ctx, out, "response.output_text.delta",
                   json_pack("{s:o,s:i,s:i,s:s%,s:[]}", "item_id", msg_id(ctx), "output_index", 0,
                             "content_index", 0, "delta", g->text.data + st->sent_bytes,
                             vis - st->sent_bytes, "logprobs"));
        st->sent_bytes = vis;
    }
    st->sent_tokens = g->n_tokens;
    st->finished = g->finish != WK_FINISH_NONE;
    return rc;
}

int wk_render_responses_tail(const wk_render_ctx_t *ctx, const wk_request_t *req,
                             const wk_gen_t *const *gens, baton_buf_t *out)
{
    const wk_gen_t *g = gens[0];
    const char *text = g->text.data ? g->text.data : "";
    int rc;
    if ((rc = event(ctx, out, "response.output_text.done",
                    json_pack("{s:o,s:i,s:i,s:s%,s:[]}", "item_id", msg_id(ctx), "output_index", 0,
                              "content_index", 0, "text", text, g->final_len, "logprobs"))) ||
        (rc = event(ctx, out, "response.content_part.done",
                    json_pack("{s:o,s:i,s:i,s:o}", "item_id", msg_id(ctx), "output_index", 0,
                              "content_index", 0, "part", text_part(text, g->final_len)))) ||
        (rc = event(
             ctx, out, "response.output_item.done",
             json_pack("{s:i,s:o}", "output_index", 0, "item",
                       message_item(ctx, g->finish == WK_FINISH_LENGTH ? "incomplete" : "completed",
                                    json_pack("[o]", text_part(text, g->final_len)))))))
        return rc;
    const char *done = g->finish == WK_FINISH_LENGTH ? "response.incomplete" : "response.completed";
    return event(ctx, out, done, json_pack("{s:o}", "response", response_obj(ctx, req, gens)));
}

int wk_render_responses_error(const wk_render_ctx_t *ctx, const char *message, const char *code,
                              baton_buf_t *out)
{
    return event(ctx, out, "error",
                 json_pack("{s:s?,s:s,s:n}", "code", code, "message", message, "param"));
}
