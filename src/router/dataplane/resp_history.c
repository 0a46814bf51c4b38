/* resp_history.c — the conversations of relayed Responses answers, and follow-ups sent with
 * their whole conversation (resp_history.h). */
#include "router/dataplane/resp_history.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"

#define ID_MAX 128

typedef struct {
    char id[ID_MAX];
    char *conv; /* compact JSON array, owned */
} hist_entry_t;

/* A ring of the last conversations (newest overwrites oldest), searched newest first. */
static pthread_mutex_t hist_mu = PTHREAD_MUTEX_INITIALIZER;
static hist_entry_t *hist_ring;
static size_t hist_next, hist_count;

static void keep(const char *id, char *conv)
{
    pthread_mutex_lock(&hist_mu);
    if (!hist_ring)
        hist_ring = calloc(BATON_RESP_HISTORY_KEPT, sizeof(*hist_ring));
    if (hist_ring) {
        hist_entry_t *e = &hist_ring[hist_next];
        free(e->conv);
        snprintf(e->id, sizeof(e->id), "%s", id);
        e->conv = conv;
        conv = NULL;
        hist_next = (hist_next + 1) % BATON_RESP_HISTORY_KEPT;
        if (hist_count < BATON_RESP_HISTORY_KEPT)
            hist_count++;
    }
    pthread_mutex_unlock(&hist_mu);
    free(conv);
}

/* A copy of the conversation kept for id, or NULL. */
static json_t *find(const char *id)
{
    json_t *conv = NULL;
    pthread_mutex_lock(&hist_mu);
    for (size_t k = 0; k < hist_count; k++) {
        size_t i = (hist_next + BATON_RESP_HISTORY_KEPT - 1 - k) % BATON_RESP_HISTORY_KEPT;
        if (strcmp(hist_ring[i].id, id) == 0) {
            conv = json_loads(hist_ring[i].conv, 0, NULL);
            break;
        }
    }
    pthread_mutex_unlock(&hist_mu);
    return conv;
}

/* The input as items: a string is one user message. */
static json_t *as_items(json_t *input)
{
    if (json_is_string(input))
        return json_pack("[{s:s,s:O}]", "role", "user", "content", input);
    return json_is_array(input) ? json_incref(input) : NULL;
}

int baton_resp_history_prepare(const char *body, size_t len, baton_buf_t *expanded, char **conv)
{
    *conv = NULL;
    baton_buf_reset(expanded);
    json_t *root = json_loadb(body, len, 0, NULL);
    json_t *items = json_is_object(root) ? as_items(json_object_get(root, "input")) : NULL;
    json_t *prev = json_object_get(root, "previous_response_id");
    int rc = 0;
    if (!items)
        goto out; /* not understood: the worker answers it */
    json_t *kept = json_is_string(prev) ? find(json_string_value(prev)) : NULL;
    if (kept) {
        if (json_array_extend(kept, items) != 0 || json_object_set(root, "input", kept) != 0 ||
            json_object_del(root, "previous_response_id") != 0) {
            json_decref(kept);
            rc = BATON_ENOMEM;
            goto out;
        }
        json_decref(items);
        items = kept;
        char *s = json_dumps(root, JSON_COMPACT);
        rc = s && baton_buf_append_str(expanded, s) == 0 ? 0 : BATON_ENOMEM;
        free(s);
        if (rc)
            goto out;
    }
    *conv = json_dumps(items, JSON_COMPACT);
    if (!*conv)
        rc = BATON_ENOMEM;
out:
    json_decref(items);
    json_decref(root);
    return rc;
}

int baton_resp_history_final_event(const char *data, size_t len)
{
    return memmem(data, len, "\"response.completed\"", 20) ||
           memmem(data, len, "\"response.incomplete\"", 21);
}

/* The output text of a response object: its messages' output_text parts, in order. */
static int output_text(json_t *resp, baton_buf_t *out)
{
    json_t *item, *part;
    size_t i, k;
    json_array_foreach(json_object_get(resp, "output"), i, item)
    {
        if (!json_is_string(json_object_get(item, "type")) ||
            strcmp(json_string_value(json_object_get(item, "type")), "message") != 0)
            continue;
        json_array_foreach(json_object_get(item, "content"), k, part)
        {
            json_t *t = json_object_get(part, "text");
            if (json_is_string(t) &&
                baton_buf_append(out, json_string_value(t), json_string_length(t)) != 0)
                return BATON_ENOMEM;
        }
    }
    return 0;
}

void baton_resp_history_note(const char *conv, const char *answer, size_t len)
{
    if (!conv)
        return;
    json_t *root = json_loadb(answer, len, 0, NULL);
    json_t *resp = json_is_object(json_object_get(root, "response"))
                       ? json_object_get(root, "response")
                       : root;
    json_t *id = json_object_get(resp, "id");
    json_t *all =
        json_is_string(id) && json_string_length(id) < ID_MAX ? json_loads(conv, 0, NULL) : NULL;
    baton_buf_t text = BATON_BUF_INIT;
    if (all && output_text(resp, &text) == 0) {
        json_t *reply = json_pack("{s:s,s:[{s:s,s:s%}]}", "role", "assistant", "content", "type",
                                  "output_text", "text", text.data ? text.data : "", text.len);
        char *s =
            reply && json_array_append_new(all, reply) == 0 ? json_dumps(all, JSON_COMPACT) : NULL;
        if (s && strlen(s) <= BATON_RESP_HISTORY_MAX_BYTES)
            keep(json_string_value(id), s);
        else
            free(s);
    }
    baton_buf_free(&text);
    json_decref(all);
    json_decref(root);
}
