/* responses_store.c — the worker's stored responses (previous_response_id): each finished
 * response's conversation, kept by id so a follow-up can continue it. */
#include "worker/responses_store.h"

#include <stdlib.h>
#include <string.h>

#include "baton/error.h"

/* The input as items: a string is one user message. A new reference, NULL when it is neither a
 * string nor an array (the parser then says why). */
static json_t *as_items(json_t *input)
{
    if (json_is_string(input))
        return json_pack("[{s:s,s:O}]", "role", "user", "content", input);
    return json_is_array(input) ? json_incref(input) : NULL;
}

int wk_resp_prepare(wk_worker_t *w, const char *body, size_t len, char **out, json_t **conv,
                    wk_parse_err_t *err)
{
    *out = NULL;
    *conv = NULL;
    json_t *root = json_loadb(body, len, 0, NULL);
    json_t *items = json_is_object(root) ? as_items(json_object_get(root, "input")) : NULL;
    if (!items) {
        json_decref(root);
        return 0; /* not a valid request: the parser answers */
    }
    json_t *prev = json_object_get(root, "previous_response_id");
    if (json_is_string(prev)) {
        json_t *kept = w->responses ? json_object_get(w->responses, json_string_value(prev)) : NULL;
        if (!kept) {
            err->status = 404;
            err->code = "previous_response_not_found";
            snprintf(err->param, sizeof(err->param), "previous_response_id");
            snprintf(err->message, sizeof(err->message),
                     "Previous response with id '%.120s' not found.", json_string_value(prev));
            json_decref(items);
            json_decref(root);
            return BATON_ENOTFOUND;
        }
        json_t *all = json_deep_copy(kept);
        if (!all || json_array_extend(all, items) != 0) {
            json_decref(all);
            json_decref(items);
            json_decref(root);
            return BATON_ENOMEM;
        }
        json_decref(items);
        items = all;
        json_object_set(root, "input", items);
        *out = json_dumps(root, JSON_COMPACT);
        if (!*out) {
            json_decref(items);
            json_decref(root);
            return BATON_ENOMEM;
        }
    }
    json_decref(root);
    *conv = items;
    return 0;
}

void wk_resp_store(wk_worker_t *w, const char *id, json_t *conv, const char *text, size_t len)
{
    if (!conv)
        return;
    if (!w->responses)
        w->responses = json_object();
    if (!w->response_order)
        w->response_order = json_array();
    if (!w->responses || !w->response_order)
        return;
    json_t *all = json_deep_copy(conv);
    json_t *reply = json_pack("{s:s,s:[{s:s,s:s%}]}", "role", "assistant", "content", "type",
                              "output_text", "text", text ? text : "", len);
    if (!all || !reply || json_array_append_new(all, reply) != 0) {
        json_decref(all);
        return;
    }
    json_object_set_new(w->responses, id, all);
    json_array_append_new(w->response_order, json_string(id));
    while (json_array_size(w->response_order) > WK_RESPONSES_KEPT) {
        json_object_del(w->responses, json_string_value(json_array_get(w->response_order, 0)));
        json_array_remove(w->response_order, 0);
    }
}

void wk_resp_free(wk_worker_t *w)
{
    json_decref(w->responses);
    json_decref(w->response_order);
    w->responses = NULL;
    w->response_order = NULL;
}
