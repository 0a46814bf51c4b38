/* request.c — turns /generate, chat and completions bodies into validated items (request.h). */
#include "worker/request.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/buf.h"
#include "worker/continuation.h"
#include "worker/vllm.h"
#include "worker/wtok.h"

/* Sampling fields shared by every item of one prompt (before bootstrap fields are applied). */
typedef struct params_s {
    uint32_t max_tokens;
    json_t *stop;     /* borrowed */
    json_t *stop_ids; /* borrowed */
    int logprobs;
    int top_logprobs;
    uint32_t logprob_start;
} params_t;

static int fail(wk_parse_err_t *err, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(wk_parse_err_t *err, const char *param, const char *fmt, ...)
{
    err->status = 400;
    err->code = "invalid_request_error";
    snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return BATON_EINVAL;
}

const char *wk_api_name(wk_api_t api)
{
    switch (api) {
    case WK_API_GENERATE:
        return "generate";
    case WK_API_CHAT:
        return "chat";
    case WK_API_COMPLETIONS:
        return "completions";
    case WK_API_RESPONSES:
        return "responses";
    }
    return "?";
}

/* Absent or null → *out = def. */
static int get_uint(json_t *obj, const char *key, uint32_t def, uint32_t max, uint32_t *out,
                    wk_parse_err_t *err)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return fail(err, key, "'%s' must be an integer", key);
    json_int_t n = json_integer_value(v);
    if (n < 0 || (unsigned long long)n > max)
        return fail(err, key, "'%s' must be between 0 and %u", key, max);
    *out = (uint32_t)n;
    return 0;
}

static int get_bool(json_t *obj, const char *key, int def, int *out, wk_parse_err_t *err)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return fail(err, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

/* Ignored sampling knobs still get a type check so a client bug shows. */
static int check_numbers(json_t *obj, const char *const *keys, wk_parse_err_t *err)
{
    for (; *keys; keys++) {
        json_t *v = json_object_get(obj, *keys);
        if (v != NULL && !json_is_null(v) && !json_is_number(v))
            return fail(err, *keys, "'%s' must be a number", *keys);
    }
    return 0;
}

static int check_stop(json_t *v, const char *param, wk_parse_err_t *err)
{
    if (v == NULL || json_is_null(v) || json_is_string(v))
        return 0;
    if (!json_is_array(v))
        return fail(err, param, "'%s' must be a string or an array of strings", param);
    if (json_array_size(v) > WK_MAX_STOPS)
        return fail(err, param, "'%s' has more than %d entries", param, WK_MAX_STOPS);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        if (!json_is_string(e))
            return fail(err, param, "'%s' must be a string or an array of strings", param);
    }
    return 0;
}

static int check_stop_ids(json_t *v, const char *param, wk_parse_err_t *err)
{
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_array(v) || json_array_size(v) > WK_MAX_STOPS)
        return fail(err, param, "'%s' must be an array of at most %d integers", param,
                    WK_MAX_STOPS);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        if (!json_is_integer(e))
            return fail(err, param, "'%s' must be an array of integers", param);
    }
    return 0;
}

/* "stop" and "stop_token_ids" of obj (the body, or /generate's sampling_params). */
static int get_stops(json_t *obj, params_t *p, wk_parse_err_t *err)
{
    int rc;
    p->stop = json_object_get(obj, "stop");
    if ((rc = check_stop(p->stop, "stop", err)) != 0)
        return rc;
    p->stop_ids = json_object_get(obj, "stop_token_ids");
    return check_stop_ids(p->stop_ids, "stop_token_ids", err);
}

static char *dup_mem(const char *s, size_t len)
{
    char *p = malloc(len + 1);
    if (p != NULL) {
        memcpy(p, s, len);
        p[len] = '\0';
    }
    return p;
}

/* Copies the (already checked) stop fields into the item. */
static int apply_params(wk_item_t *it, const params_t *p)
{
    it->max_tokens = p->max_tokens;
    it->logprobs = p->logprobs;
    it->top_logprobs = p->top_logprobs;
    it->logprob_start = p->logprob_start;
    if (p->stop != NULL && !json_is_null(p->stop)) {
        size_t n = json_is_string(p->stop) ? 1 : json_array_size(p->stop);
        if (n > 0) {
            it->stop_strs = calloc(n, sizeof(char *));
            it->stop_lens = calloc(n, sizeof(size_t));
            if (it->stop_strs == NULL || it->stop_lens == NULL)
                return BATON_ENOMEM;
            for (size_t i = 0; i < n; i++) {
                json_t *s = json_is_string(p->stop) ? p->stop : json_array_get(p->stop, i);
                it->stop_strs[i] = dup_mem(json_string_value(s), json_string_length(s));
                if (it->stop_strs[i] == NULL)
                    return BATON_ENOMEM;
                it->stop_lens[i] = json_string_length(s);
                it->n_stop = i + 1;
            }
        }
    }
    if (p->stop_ids != NULL && json_is_array(p->stop_ids) && json_array_size(p->stop_ids) > 0) {
        size_t n = json_array_size(p->stop_ids);
        it->stop_ids = calloc(n, sizeof(int64_t));
        if (it->stop_ids == NULL)
            return BATON_ENOMEM;
        for (size_t i = 0; i < n; i++)
            it->stop_ids[i] = json_integer_value(json_array_get(p->stop_ids, i));
        it->n_stop_ids = n;
    }
    return 0;
}

/* chat: s is a rendered chat prompt (with --tokenizer: special-token text parsed, nothing
 * added); otherwise a completion / generate prompt. */
static int set_text_prompt(wk_item_t *it, const char *s, size_t len, bool chat,
                           wk_parse_err_t *err)
{
    it->prompt = dup_mem(s, len);
    if (it->prompt == NULL)
        return BATON_ENOMEM;
    it->prompt_len = len;
    it->seed = wk_sim_seed_text(s, len);
    it->prompt_tokens = wk_sim_count_words(s, len);
    if (wk_tok_enabled()) {
        uint32_t n;
        int rc = wk_tok_encode(s, len, chat, &it->text_ids, &n);
        if (rc == BATON_EINVAL)
            return fail(err, "prompt", "the prompt is not valid UTF-8");
        if (rc != 0)
            return rc;
        if (n == 0) { /* an empty prompt: one token, as the word tokenizer counts it */
            free(it->text_ids);
            it->text_ids = NULL;
        } else {
            it->prompt_tokens = n;
        }
    }
    return 0;
}

/* `arr` is a checked non-empty array of integers. */
static int set_ids_prompt(wk_item_t *it, json_t *arr)
{
    size_t n = json_array_size(arr);
    it->ids = malloc(n * sizeof(int64_t));
    if (it->ids == NULL)
        return BATON_ENOMEM;
    for (size_t i = 0; i < n; i++)
        it->ids[i] = json_integer_value(json_array_get(arr, i));
    it->n_ids = n;
    it->seed = wk_sim_seed_ids(it->ids, n);
    it->prompt_tokens = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    return 0;
}

/* 1 when v is a non-empty array of non-negative integers; 0 otherwise. */
static int is_id_list(json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) == 0)
        return 0;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return 0;
    }
    return 1;
}

static int alloc_items(wk_request_t *req, size_t n, wk_parse_err_t *err)
{
    if (n == 0)
        return fail(err, NULL, "the request has no prompt");
    if (n > WK_MAX_ITEMS)
        return fail(err, NULL, "the request has %zu sequences; at most %d are accepted", n,
                    WK_MAX_ITEMS);
    req->items = calloc(n, sizeof(wk_item_t));
    if (req->items == NULL)
        return BATON_ENOMEM;
    req->n_items = n;
    for (size_t i = 0; i < n; i++) {
        req->items[i].boot_port = -1;
        req->items[i].choice_index = i;
    }
    return 0;
}

/* ---- bootstrap fields (PD) ---- */

static int parse_bootstrap(json_t *root, wk_request_t *req, wk_parse_err_t *err)
{
    json_t *host = json_object_get(root, "bootstrap_host");
    json_t *port = json_object_get(root, "bootstrap_port");
    json_t *room = json_object_get(root, "bootstrap_room");
    if (host != NULL && json_is_null(host))
        host = NULL;
    if (port != NULL && json_is_null(port))
        port = NULL;
    if (room != NULL && json_is_null(room))
        room = NULL;
    if (host == NULL && port == NULL && room == NULL)
        return 0;
    req->has_boot = 1;
    if (room == NULL)
        return fail(err, "bootstrap_room", "'bootstrap_room' is required with bootstrap fields");
    size_t n = req->n_items;
    if (json_is_array(room)) {
        if (json_array_size(room) != n)
            return fail(err, "bootstrap_room",
                        "'bootstrap_room' has %zu elements but the request has %zu sequences",
                        json_array_size(room), n);
    } else if (n != 1) {
        return fail(err, "bootstrap_room",
                    "'bootstrap_room' must be an array of %zu rooms for this batch request", n);
    }
    if (host != NULL && json_is_array(host) && json_array_size(host) != n)
        return fail(err, "bootstrap_host", "'bootstrap_host' must have %zu elements", n);
    if (port != NULL && json_is_array(port) && json_array_size(port) != n)
        return fail(err, "bootstrap_port", "'bootstrap_port' must have %zu elements", n);
    for (size_t i = 0; i < n; i++) {
        wk_item_t *it = &req->items[i];
        json_t *r = json_is_array(room) ? json_array_get(room, i) : room;
        if (!json_is_integer(r) || json_integer_value(r) < 0)
            return fail(err, "bootstrap_room", "'bootstrap_room' must be a non-negative integer");
        it->room = (uint64_t)json_integer_value(r);
        it->has_boot = 1;
        json_t *h = host != NULL && json_is_array(host) ? json_array_get(host, i) : host;
        if (h != NULL && !json_is_null(h)) {
            if (!json_is_string(h) || json_string_length(h) == 0 || json_string_length(h) > 255)
                return fail(err, "bootstrap_host", "'bootstrap_host' must be a host name");
            it->boot_host = dup_mem(json_string_value(h), json_string_length(h));
            if (it->boot_host == NULL)
                return BATON_ENOMEM;
        }
        json_t *p = port != NULL && json_is_array(port) ? json_array_get(port, i) : port;
        if (p != NULL && !json_is_null(p)) {
            if (!json_is_integer(p) || json_integer_value(p) < 1 || json_integer_value(p) > 65535)
                return fail(err, "bootstrap_port", "'bootstrap_port' must be a port number");
            it->boot_port = (int)json_integer_value(p);
        }
    }
    return 0;
}

/* ---- OpenAI chat ---- */

static int render_messages(json_t *msgs, baton_buf_t *out, wk_parse_err_t *err)
{
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return fail(err, "messages", "'messages' must be a non-empty array");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        if (!json_is_object(m))
            return fail(err, "messages", "messages[%zu] must be an object", i);
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role))
            return fail(err, "messages", "messages[%zu].role must be a string", i);
        if (baton_buf_append(out, json_string_value(role), json_string_length(role)) != 0 ||
            baton_buf_append(out, ": ", 2) != 0)
            return BATON_ENOMEM;
        json_t *content = json_object_get(m, "content");
        if (content == NULL || json_is_null(content)) {
            /* an assistant turn with tool calls only: no text */
        } else if (json_is_string(content)) {
            if (baton_buf_append(out, json_string_value(content), json_string_length(content)))
                return BATON_ENOMEM;
        } else if (json_is_array(content)) {
            size_t j;
            json_t *part;
            json_array_foreach(content, j, part)
            {
                json_t *type = json_object_get(part, "type");
                json_t *text = json_object_get(part, "text");
                if (!json_is_object(part) || !json_is_string(type) ||
                    strcmp(json_string_value(type), "text") != 0 || !json_is_string(text))
                    return fail(err, "messages",
                                "messages[%zu].content[%zu]: only text parts are supported", i, j);
                if (baton_buf_append(out, json_string_value(text), json_string_length(text)))
                    return BATON_ENOMEM;
            }
        } else {
            return fail(err, "messages", "messages[%zu].content must be a string or an array", i);
        }
        if (baton_buf_append(out, "\n", 1) != 0)
            return BATON_ENOMEM;
    }
    return 0;
}

static const char *const ignored_numbers[] = {
    "temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "top_k",
    "min_p",       NULL};

static int parse_openai_common(json_t *root, wk_request_t *req, params_t *p, uint32_t *n_p,
                               wk_parse_err_t *err)
{
    int rc;
    if ((rc = check_numbers(root, ignored_numbers, err)) != 0)
        return rc;
    json_t *model = json_object_get(root, "model");
    if (model != NULL && !json_is_null(model)) {
        if (!json_is_string(model))
            return fail(err, "model", "'model' must be a string");
        req->model = dup_mem(json_string_value(model), json_string_length(model));
        if (req->model == NULL)
            return BATON_ENOMEM;
    }
    if ((rc = get_bool(root, "stream", 0, &req->stream, err)) != 0)
        return rc;
    json_t *so = json_object_get(root, "stream_options");
    if (so != NULL && !json_is_null(so)) {
        if (!json_is_object(so))
            return fail(err, "stream_options", "'stream_options' must be an object");
        if ((rc = get_bool(so, "include_usage", 0, &req->include_usage, err)) != 0)
            return rc;
    }
    if ((rc = get_uint(root, "n", 1, WK_MAX_N, n_p, err)) != 0)
        return rc;
    if (*n_p == 0)
        return fail(err, "n", "'n' must be at least 1");
    return get_stops(root, p, err);
}

static int parse_chat(json_t *root, wk_request_t *req, wk_parse_err_t *err)
{
    params_t p = {0};
    uint32_t n = 1;
    int rc;
    baton_buf_t prompt = BATON_BUF_INIT;
    if ((rc = render_messages(json_object_get(root, "messages"), &prompt, err)) != 0)
        goto out;
    if (wk_tok_has_template()) { /* the model's own rendering replaces the simple one */
        char terr[256];
        baton_buf_reset(&prompt);
        if ((rc = wk_tok_render_chat(root, &prompt, terr, sizeof(terr))) != 0) {
            if (rc != BATON_ENOMEM)
                rc = fail(err, "messages", "%s", terr);
            goto out;
        }
    }
    if ((rc = parse_openai_common(root, req, &p, &n, err)) != 0)
        goto out;
    json_t *mct = json_object_get(root, "max_completion_tokens");
    const char *mt_key = mct != NULL && !json_is_null(mct) ? "max_completion_tokens" : "max_tokens";
    if ((rc = get_uint(root, mt_key, WK_DEFAULT_MAX_TOKENS_CHAT, WK_MAX_TOKENS_CAP, &p.max_tokens,
                       err)) != 0)
        goto out;
    if ((rc = get_bool(root, "logprobs", 0, &p.logprobs, err)) != 0)
        goto out;
    uint32_t top = 0;
    if ((rc = get_uint(root, "top_logprobs", 0, 20, &top, err)) != 0)
        goto out;
    p.top_logprobs = p.logprobs ? (int)top : 0;
    req->n_prompts = 1;
    if ((rc = alloc_items(req, n, err)) != 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        wk_item_t *it = &req->items[i];
        if ((rc = set_text_prompt(it, prompt.data ? prompt.data : "", prompt.len, true, err)) != 0 ||
            (rc = apply_params(it, &p)) != 0)
            goto out;
    }
out:
    baton_buf_free(&prompt);
    return rc;
}

/* ---- OpenAI Responses ---- */

/* One input item's content as chat content: a string, or its text parts (input_text,
 * output_text) as chat's text parts. NULL when it has another kind of part. */
static json_t *item_content(json_t *content)
{
    if (json_is_string(content))
        return json_incref(content);
    if (!json_is_array(content))
        return NULL;
    json_t *parts = json_array();
    size_t j;
    json_t *part;
    json_array_foreach(content, j, part)
    {
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (!type || !json_is_string(text) ||
            (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text"))) {
            json_decref(parts);
            return NULL;
        }
        json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", text));
    }
    return parts;
}

/* The Responses request as the chat it amounts to: instructions as the system turn, the input
 * (a string: one user turn; items: their roles and text), max_output_tokens as max_tokens. */
static int parse_responses(json_t *root, wk_request_t *req, wk_parse_err_t *err)
{
    json_t *input = json_object_get(root, "input");
    json_t *instr = json_object_get(root, "instructions");
    json_t *prev = json_object_get(root, "previous_response_id");
    if (!json_is_string(input) && !(json_is_array(input) && json_array_size(input) > 0))
        return fail(err, "input", "'input' must be a string or a non-empty array of items");
    if (instr && !json_is_null(instr) && !json_is_string(instr))
        return fail(err, "instructions", "'instructions' must be a string");
    if (prev && !json_is_null(prev) && !json_is_string(prev))
        return fail(err, "previous_response_id", "'previous_response_id' must be a string");
    json_t *chat = json_deep_copy(root), *msgs = json_array();
    if (!chat || !msgs) {
        json_decref(chat);
        json_decref(msgs);
        return BATON_ENOMEM;
    }
    if (json_is_string(instr))
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", instr));
    if (json_is_string(input)) {
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", input));
    } else {
        size_t i;
        json_t *item;
        json_array_foreach(input, i, item)
        {
            json_t *role = json_object_get(item, "role");
            json_t *content =
                json_is_object(item) ? item_content(json_object_get(item, "content")) : NULL;
            if (!json_is_string(role) || !content) {
                json_decref(content);
                json_decref(chat);
                json_decref(msgs);
                return fail(err, "input",
                            "input[%zu]: only messages with text content are supported", i);
            }
            json_array_append_new(msgs, json_pack("{s:O,s:o}", "role", role, "content", content));
        }
    }
    json_object_set_new(chat, "messages", msgs);
    json_t *mot = json_object_get(root, "max_output_tokens");
    json_object_del(chat, "max_completion_tokens");
    if (mot && !json_is_null(mot))
        json_object_set(chat, "max_tokens", mot);
    else
        json_object_del(chat, "max_tokens");
    json_object_del(chat, "n"); /* one output per response */
    int rc = parse_chat(chat, req, err);
    json_decref(chat);
    if (rc == 0 && json_is_string(prev) &&
        !(req->prev_id = dup_mem(json_string_value(prev), json_string_length(prev))))
        rc = BATON_ENOMEM;
    if (rc == BATON_EINVAL && strcmp(err->param, "max_tokens") == 0)
        snprintf(err->param, sizeof(err->param), "max_output_tokens");
    return rc;
}

/* ---- OpenAI completions ---- */

static int parse_completions(json_t *root, wk_request_t *req, wk_parse_err_t *err)
{
    params_t p = {0};
    uint32_t n = 1;
    int rc;
    json_t *prompt = json_object_get(root, "prompt");
    /* prompt: string | [string...] | [int...] (one tokenized prompt) | [[int...]...] */
    size_t n_prompts;
    int kind; /* 0 string, 1 strings, 2 ids, 3 id lists */
    if (json_is_string(prompt)) {
        kind = 0;
        n_prompts = 1;
    } else if (is_id_list(prompt)) {
        kind = 2;
        n_prompts = 1;
    } else if (json_is_array(prompt) && json_array_size(prompt) > 0) {
        json_t *first = json_array_get(prompt, 0);
        kind = json_is_string(first) ? 1 : 3;
        n_prompts = json_array_size(prompt);
        size_t i;
        json_t *e;
        json_array_foreach(prompt, i, e)
        {
            if (kind == 1 ? !json_is_string(e) : !is_id_list(e))
                return fail(err, "prompt",
                            "'prompt' must be a string, an array of strings, an array of token "
                            "ids or an array of non-empty token-id arrays");
        }
    } else {
        return fail(err, "prompt",
                    "'prompt' is required: a string, an array of strings, an array of token ids "
                    "or an array of non-empty token-id arrays");
    }
    if ((rc = parse_openai_common(root, req, &p, &n, err)) != 0)
        return rc;
    if ((rc = get_uint(root, "max_tokens", WK_DEFAULT_MAX_TOKENS_COMPLETIONS, WK_MAX_TOKENS_CAP,
                       &p.max_tokens, err)) != 0)
        return rc;
    json_t *lp = json_object_get(root, "logprobs");
    if (lp != NULL && !json_is_null(lp)) {
        if (!json_is_integer(lp) || json_integer_value(lp) < 0 || json_integer_value(lp) > 5)
            return fail(err, "logprobs", "'logprobs' must be an integer between 0 and 5");
        p.logprobs = 1;
        p.top_logprobs = (int)json_integer_value(lp);
    }
    int echo = 0;
    if ((rc = get_bool(root, "echo", 0, &echo, err)) != 0)
        return rc;
    if (echo)
        return fail(err, "echo", "'echo' is not supported by this worker");
    if (n_prompts > WK_MAX_ITEMS || (size_t)n * n_prompts > WK_MAX_ITEMS)
        return fail(err, "prompt", "too many sequences (prompts × n > %d)", WK_MAX_ITEMS);
    req->n_prompts = n_prompts;
    if ((rc = alloc_items(req, n_prompts * n, err)) != 0)
        return rc;
    for (size_t pi = 0; pi < n_prompts; pi++) {
        for (size_t j = 0; j < n; j++) {
            wk_item_t *it = &req->items[pi * n + j];
            it->prompt_index = pi;
            switch (kind) {
            case 0:
                rc = set_text_prompt(it, json_string_value(prompt), json_string_length(prompt),
                                     false, err);
                break;
            case 1: {
                json_t *s = json_array_get(prompt, pi);
                rc = set_text_prompt(it, json_string_value(s), json_string_length(s), false, err);
                break;
            }
            case 2:
                rc = set_ids_prompt(it, prompt);
                break;
            default:
                rc = set_ids_prompt(it, json_array_get(prompt, pi));
                break;
            }
            if (rc != 0 || (rc = apply_params(it, &p)) != 0)
                return rc;
        }
    }
    return 0;
}

/* ---- SGLang /generate ---- */

/* Element i of a field that is either one value for all, or an array (when per_item). */
static json_t *per_item(json_t *v, size_t i, int is_list)
{
    return is_list ? json_array_get(v, i) : v;
}

static int parse_sampling(json_t *sp, params_t *p, wk_parse_err_t *err)
{
    int rc;
    if (sp == NULL || json_is_null(sp)) {
        p->max_tokens = WK_DEFAULT_MAX_TOKENS_GENERATE;
        return 0;
    }
    if (!json_is_object(sp))
        return fail(err, "sampling_params", "'sampling_params' must be an object");
    if ((rc = check_numbers(sp, ignored_numbers, err)) != 0)
        return rc;
    if ((rc = get_uint(sp, "max_new_tokens", WK_DEFAULT_MAX_TOKENS_GENERATE, WK_MAX_TOKENS_CAP,
                       &p->max_tokens, err)) != 0)
        return rc;
    uint32_t n = 1;
    if ((rc = get_uint(sp, "n", 1, WK_MAX_N, &n, err)) != 0)
        return rc;
    if (n != 1)
        return fail(err, "n", "sampling_params.n other than 1 is not supported; send a batch");
    return get_stops(sp, p, err);
}

static int parse_generate(json_t *root, wk_request_t *req, wk_parse_err_t *err)
{
    int rc;
    json_t *text = json_object_get(root, "text");
    json_t *ids = json_object_get(root, "input_ids");
    if (text != NULL && json_is_null(text))
        text = NULL;
    if (ids != NULL && json_is_null(ids))
        ids = NULL;
    json_t *emb = json_object_get(root, "input_embeds");
    if (emb != NULL && !json_is_null(emb))
        return fail(err, "input_embeds", "'input_embeds' is not supported by this worker");
    if ((text == NULL) == (ids == NULL))
        return fail(err, "text", "exactly one of 'text' and 'input_ids' is required");
    size_t n;
    if (text != NULL) {
        if (json_is_string(text)) {
            n = 1;
        } else if (json_is_array(text) && json_array_size(text) > 0) {
            req->is_batch = 1;
            n = json_array_size(text);
            size_t i;
            json_t *e;
            json_array_foreach(text, i, e)
            {
                if (!json_is_string(e))
                    return fail(err, "text", "'text' must be a string or an array of strings");
            }
        } else {
            return fail(err, "text", "'text' must be a string or a non-empty array of strings");
        }
    } else if (is_id_list(ids)) {
        n = 1;
    } else if (json_is_array(ids) && json_array_size(ids) > 0) {
        req->is_batch = 1;
        n = json_array_size(ids);
        size_t i;
        json_t *e;
        json_array_foreach(ids, i, e)
        {
            if (!is_id_list(e))
                return fail(err, "input_ids",
                            "'input_ids' must be a non-empty array of token ids or of such arrays");
        }
    } else {
        return fail(err, "input_ids",
                    "'input_ids' must be a non-empty array of token ids or of such arrays");
    }
    if ((rc = get_bool(root, "stream", 0, &req->stream, err)) != 0)
        return rc;

    json_t *sp = json_object_get(root, "sampling_params");
    int sp_list = json_is_array(sp);
    if (sp_list && (!req->is_batch || json_array_size(sp) != n))
        return fail(err, "sampling_params",
                    "'sampling_params' as an array needs one object per batch element (%zu)", n);
    json_t *rl = json_object_get(root, "return_logprob");
    int rl_list = json_is_array(rl);
    if (rl_list && json_array_size(rl) != n)
        return fail(err, "return_logprob", "'return_logprob' must have %zu elements", n);
    json_t *ls = json_object_get(root, "logprob_start_len");
    int ls_list = json_is_array(ls);
    if (ls_list && json_array_size(ls) != n)
        return fail(err, "logprob_start_len", "'logprob_start_len' must have %zu elements", n);
    json_t *rid = json_object_get(root, "rid");
    int rid_list = json_is_array(rid);
    if (rid_list && json_array_size(rid) != n)
        return fail(err, "rid", "'rid' must have %zu elements", n);

    req->n_prompts = n;
    if ((rc = alloc_items(req, n, err)) != 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        wk_item_t *it = &req->items[i];
        it->prompt_index = i;
        params_t p = {0};
        if ((rc = parse_sampling(per_item(sp, i, sp_list), &p, err)) != 0)
            return rc;
        json_t *r = per_item(rl, i, rl_list);
        if (r != NULL && !json_is_null(r)) {
            if (!json_is_boolean(r))
                return fail(err, "return_logprob", "'return_logprob' must be a boolean");
            p.logprobs = json_is_true(r);
        }
        json_t *l = per_item(ls, i, ls_list);
        if (l != NULL && !json_is_null(l)) {
            if (!json_is_integer(l) || json_integer_value(l) < -1)
                return fail(err, "logprob_start_len",
                            "'logprob_start_len' must be an integer >= -1");
            json_int_t v = json_integer_value(l);
            p.logprob_start = v < 0 ? 0 : v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
        }
        json_t *rd = per_item(rid, i, rid_list);
        if (rd != NULL && !json_is_null(rd)) {
            if (!json_is_string(rd))
                return fail(err, "rid", "'rid' must be a string");
            it->rid = dup_mem(json_string_value(rd), json_string_length(rd));
            if (it->rid == NULL)
                return BATON_ENOMEM;
        }
        if (text != NULL) {
            json_t *s = req->is_batch ? json_array_get(text, i) : text;
            rc = set_text_prompt(it, json_string_value(s), json_string_length(s), false, err);
        } else {
            rc = set_ids_prompt(it, req->is_batch ? json_array_get(ids, i) : ids);
        }
        if (rc != 0 || (rc = apply_params(it, &p)) != 0)
            return rc;
    }
    return 0;
}

int wk_request_parse(wk_request_t *req, wk_api_t api, const char *body, size_t len,
                     wk_parse_err_t *err)
{
    memset(req, 0, sizeof(*req));
    req->api = api;
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (root == NULL)
        return fail(err, NULL, "request body is not valid JSON: %s (line %d, column %d)", jerr.text,
                    jerr.line, jerr.column);
    int rc;
    if (!json_is_object(root)) {
        rc = fail(err, NULL, "request body must be a JSON object");
        goto out;
    }
    switch (api) {
    case WK_API_GENERATE:
        rc = parse_generate(root, req, err);
        break;
    case WK_API_CHAT:
        rc = parse_chat(root, req, err);
        break;
    case WK_API_RESPONSES:
        rc = parse_responses(root, req, err);
        break;
    default:
        rc = parse_completions(root, req, err);
        break;
    }
    if (rc == 0)
        rc = parse_bootstrap(root, req, err);
    if (rc == 0)
        rc = wk_vllm_parse(root, req, err); /* kv_transfer_params */
    if (rc == 0)
        rc = wk_cont_parse(root, req, err); /* baton_continuation */
out:
    json_decref(root);
    if (rc != 0)
        wk_request_free(req);
    if (rc == BATON_ENOMEM) {
        err->status = 500;
        err->code = "internal_error";
        snprintf(err->message, sizeof(err->message), "out of memory");
        err->param[0] = '\0';
    }
    return rc;
}

void wk_request_free(wk_request_t *req)
{
    for (size_t i = 0; i < req->n_items; i++) {
        wk_item_t *it = &req->items[i];
        free(it->prompt);
        free(it->ids);
        free(it->text_ids);
        for (size_t j = 0; j < it->n_stop; j++)
            free(it->stop_strs[j]);
        free(it->stop_strs);
        free(it->stop_lens);
        free(it->stop_ids);
        free(it->rid);
        free(it->boot_host);
    }
    free(req->items);
    free(req->model);
    free(req->prev_id);
    req->prev_id = NULL;
    wk_cont_free(req->cont, req->n_items);
    req->cont = NULL;
    free(req->vllm_rid);
    req->vllm_rid = NULL;
    req->items = NULL;
    req->n_items = 0;
    req->model = NULL;
}

void wk_item_stop(const wk_item_t *it, wk_stop_t *out)
{
    out->strs = (const char *const *)it->stop_strs;
    out->lens = it->stop_lens;
    out->n = it->n_stop;
    out->ids = it->stop_ids;
    out->n_ids = it->n_stop_ids;
}
