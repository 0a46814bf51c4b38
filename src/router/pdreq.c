/* pdreq.c — request body validation, batch detection, bootstrap injection and logprob merging
 * for the PD router. */
#include "router/pdreq.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "http/sse.h"

static const char *const api_paths[BATON_API__COUNT] = {
    [BATON_API_CHAT] = "/v1/chat/completions",
    [BATON_API_COMPLETIONS] = "/v1/completions",
    [BATON_API_GENERATE] = "/generate",
};

const char *baton_api_path(baton_api_t api)
{
    return (unsigned)api < BATON_API__COUNT ? api_paths[api] : "?";
}

/* ---- validation ---- */

static int fail(baton_pdreq_error_t *err, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(baton_pdreq_error_t *err, const char *param, const char *code, const char *fmt, ...)
{
    va_list ap;
    err->status = 400;
    err->code = code;
    snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return BATON_EINVAL;
}

/* null counts as absent everywhere: OpenAI clients send "stop": null and the like. */
static json_t *opt(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

enum kind { K_BOOL, K_NUMBER, K_INT, K_UINT, K_POS, K_STRING, K_STOP, K_OBJECT, K_LOGPROBS };

static const char *kind_desc(enum kind k)
{
    switch (k) {
    case K_BOOL:
        return "a boolean";
    case K_NUMBER:
        return "a number";
    case K_INT:
        return "an integer";
    case K_UINT:
        return "a non-negative integer";
    case K_POS:
        return "an integer >= 1";
    case K_STRING:
        return "a string";
    case K_STOP:
        return "a string or an array of strings";
    case K_OBJECT:
        return "an object";
    case K_LOGPROBS:
        return "a boolean or a non-negative integer";
    }
    return "?";
}

/* v is an array and every element passes ok (an empty array does). */
static int array_all(const json_t *v, int (*ok)(const json_t *e))
{
    size_t i;
    json_t *e;
    if (!json_is_array(v))
        return 0;
    json_array_foreach(v, i, e)
    {
        if (!ok(e))
            return 0;
    }
    return 1;
}

static int is_string(const json_t *v)
{
    return json_is_string(v);
}

static int is_integer(const json_t *v)
{
    return json_is_integer(v);
}

static int is_string_array(const json_t *v)
{
    return array_all(v, is_string);
}

static int kind_ok(const json_t *v, enum kind k)
{
    switch (k) {
    case K_BOOL:
        return json_is_boolean(v);
    case K_NUMBER:
        return json_is_number(v);
    case K_INT:
        return json_is_integer(v);
    case K_UINT:
        return json_is_integer(v) && json_integer_value(v) >= 0;
    case K_POS:
        return json_is_integer(v) && json_integer_value(v) >= 1;
    case K_STRING:
        return json_is_string(v);
    case K_STOP:
        return json_is_string(v) || is_string_array(v);
    case K_OBJECT:
        return json_is_object(v);
    case K_LOGPROBS:
        return json_is_boolean(v) || (json_is_integer(v) && json_integer_value(v) >= 0);
    }
    return 0;
}

typedef struct field_s {
    const char *name;
    enum kind kind;
} field_t;

/* Optional fields type-checked for every API (unknown fields pass through untouched). */
static const field_t common_fields[] = {
    {"model", K_STRING},
    {"stream", K_BOOL},
    {"max_tokens", K_UINT},
    {"max_completion_tokens", K_UINT},
    {"n", K_POS},
    {"stop", K_STOP},
    {"temperature", K_NUMBER},
    {"top_p", K_NUMBER},
    {"top_k", K_INT},
    {"min_p", K_NUMBER},
    {"presence_penalty", K_NUMBER},
    {"frequency_penalty", K_NUMBER},
    {"repetition_penalty", K_NUMBER},
    {"seed", K_INT},
    {"logprobs", K_LOGPROBS},
    {"top_logprobs", K_UINT},
    {"echo", K_BOOL},
    {"ignore_eos", K_BOOL},
    {"stream_options", K_OBJECT},
};

/* Inside /generate's sampling_params. */
static const field_t sampling_fields[] = {
    {"max_new_tokens", K_UINT},
    {"min_new_tokens", K_UINT},
    {"n", K_POS},
    {"stop", K_STOP},
    {"temperature", K_NUMBER},
    {"top_p", K_NUMBER},
    {"top_k", K_INT},
    {"min_p", K_NUMBER},
    {"presence_penalty", K_NUMBER},
    {"frequency_penalty", K_NUMBER},
    {"repetition_penalty", K_NUMBER},
    {"ignore_eos", K_BOOL},
};

#define N_SAMPLING_FIELDS (sizeof(sampling_fields) / sizeof(*sampling_fields))

static int check_fields(json_t *obj, const field_t *f, size_t n, const char *prefix,
                        baton_pdreq_error_t *err)
{
    for (size_t i = 0; i < n; i++) {
        json_t *v = opt(obj, f[i].name);
        if (v && !kind_ok(v, f[i].kind)) {
            char param[64];
            snprintf(param, sizeof(param), "%s%s", prefix, f[i].name);
            return fail(err, param, "invalid_type", "'%s' must be %s", param, kind_desc(f[i].kind));
        }
    }
    return 0;
}

static int is_int_array(const json_t *v)
{
    return array_all(v, is_integer);
}

static int is_nonempty_int_array(const json_t *v)
{
    return json_array_size(v) > 0 && is_int_array(v);
}

/* A non-empty array of non-empty integer arrays (a batch of token-id prompts). */
static int is_int_array_array(const json_t *v)
{
    return json_array_size(v) > 0 && array_all(v, is_nonempty_int_array);
}

/* Sequences = prompts (0: one prompt, not a list) × n; each gets its own room. */
static int set_batch(baton_pdreq_t *r, size_t prompts, json_t *n, baton_pdreq_error_t *err)
{
    json_int_t nv = n ? json_integer_value(n) : 1; /* validated: >= 1 */
    if (prompts == 0 && nv <= 1) {
        r->batch = 0;
        return 0;
    }
    size_t p = prompts ? prompts : 1;
    if (nv > BATON_PDREQ_MAX_BATCH || p * (size_t)nv > BATON_PDREQ_MAX_BATCH)
        return fail(err, NULL, "invalid_value",
                    "a batch of %zu prompt(s) x n=%lld exceeds %d "
                    "sequences",
                    p, (long long)nv, BATON_PDREQ_MAX_BATCH);
    r->batch = p * (size_t)nv;
    return 0;
}

static int validate_chat(baton_pdreq_t *r, baton_pdreq_error_t *err)
{
    json_t *msgs = opt(r->root, "messages"), *m;
    size_t i;
    if (!msgs)
        return fail(err, "messages", "missing_parameter", "'messages' is required");
    if (!json_is_array(msgs))
        return fail(err, "messages", "invalid_type", "'messages' must be an array");
    if (json_array_size(msgs) == 0)
        return fail(err, "messages", "invalid_value", "'messages' must not be empty");
    json_array_foreach(msgs, i, m)
    {
        if (!json_is_object(m))
            return fail(err, "messages", "invalid_type", "'messages[%zu]' must be an object", i);
        if (!json_is_string(json_object_get(m, "role")))
            return fail(err, "messages", "invalid_type", "'messages[%zu].role' must be a string",
                        i);
    }
    json_t *lp = opt(r->root, "logprobs");
    r->logprobs = lp && !json_is_false(lp);
    return set_batch(r, 0, opt(r->root, "n"), err);
}

static int validate_completions(baton_pdreq_t *r, baton_pdreq_error_t *err)
{
    json_t *p = opt(r->root, "prompt");
    size_t prompts = 0;
    if (!p)
        return fail(err, "prompt", "missing_parameter", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 0)
        return fail(err, "prompt", "invalid_value", "'prompt' must not be empty");
    if (is_string_array(p) || is_int_array_array(p))
        prompts = json_array_size(p);
    else if (!json_is_string(p) && !is_int_array(p)) /* a string or a flat int array: one */
        return fail(err, "prompt", "invalid_type",
                    "'prompt' must be a string, an array of strings, an array of integers or "
                    "an array of non-empty integer arrays");
    json_t *lp = opt(r->root, "logprobs");
    r->logprobs = lp && !json_is_false(lp);
    return set_batch(r, prompts, opt(r->root, "n"), err);
}

static int validate_generate(baton_pdreq_t *r, baton_pdreq_error_t *err)
{
    json_t *text = opt(r->root, "text"), *ids = opt(r->root, "input_ids"), *n = NULL;
    size_t prompts = 0;
    if (!text && !ids)
        return fail(err, "text", "missing_parameter", "'text' or 'input_ids' is required");
    if (text && !json_is_string(text) && (json_array_size(text) == 0 || !is_string_array(text)))
        return fail(err, "text", "invalid_type",
                    "'text' must be a string or a non-empty array of strings");
    if (json_is_array(text))
        prompts = json_array_size(text);
    if (ids) {
        if (is_int_array_array(ids)) {
            if (prompts && prompts != json_array_size(ids))
                return fail(err, "input_ids", "invalid_value",
                            "'input_ids' and 'text' batch sizes differ");
            prompts = json_array_size(ids);
        } else if (!is_int_array(ids) || json_array_size(ids) == 0) {
            return fail(err, "input_ids", "invalid_type",
                        "'input_ids' must be a non-empty array of integers or of non-empty "
                        "integer arrays");
        }
    }
    /* sampling_params: one object, or one per batch element */
    json_t *sp = opt(r->root, "sampling_params");
    if (sp && json_is_object(sp)) {
        int rc = check_fields(sp, sampling_fields, N_SAMPLING_FIELDS, "sampling_params.", err);
        if (rc)
            return rc;
        n = opt(sp, "n");
    } else if (sp && json_is_array(sp)) {
        size_t i;
        json_t *e;
        json_array_foreach(sp, i, e)
        {
            if (!json_is_object(e))
                return fail(err, "sampling_params", "invalid_type",
                            "'sampling_params' must be an object or an array of objects");
            int rc = check_fields(e, sampling_fields, N_SAMPLING_FIELDS, "sampling_params.", err);
            if (rc)
                return rc;
        }
    } else if (sp) {
        return fail(err, "sampling_params", "invalid_type",
                    "'sampling_params' must be an object or an array of objects");
    }
    json_t *rl = opt(r->root, "return_logprob");
    if (rl) {
        if (json_is_boolean(rl)) {
            r->logprobs = json_is_true(rl);
        } else if (json_is_array(rl)) {
            size_t i;
            json_t *e;
            json_array_foreach(rl, i, e)
            {
                if (!json_is_boolean(e))
                    return fail(err, "return_logprob", "invalid_type",
                                "'return_logprob' must be a boolean or an array of booleans");
                r->logprobs |= json_is_true(e);
            }
        } else {
            return fail(err, "return_logprob", "invalid_type",
                        "'return_logprob' must be a boolean or an array of booleans");
        }
    }
    return set_batch(r, prompts, n, err);
}

int baton_pdreq_parse(baton_pdreq_t *r, baton_api_t api, const char *body, size_t len,
                      baton_pdreq_error_t *err)
{
    json_error_t jerr;
    int rc;

    memset(r, 0, sizeof(*r));
    r->api = api;
    if ((unsigned)api >= BATON_API__COUNT)
        return fail(err, NULL, "invalid_value", "unknown API");
    if (len == 0)
        return fail(err, NULL, "invalid_json", "request body is empty; expected a JSON object");
    r->root = json_loadb(body, len, JSON_DECODE_ANY, &jerr);
    if (!r->root) {
        if (json_error_code(&jerr) == json_error_out_of_memory)
            return BATON_ENOMEM;
        return fail(err, NULL, "invalid_json", "invalid JSON at line %d column %d: %s", jerr.line,
                    jerr.column, jerr.text);
    }
    if (!json_is_object(r->root)) {
        rc = fail(err, NULL, "invalid_type", "request body must be a JSON object");
        goto bad;
    }
    rc = check_fields(r->root, common_fields, sizeof(common_fields) / sizeof(*common_fields), "",
                      err);
    if (rc)
        goto bad;
    json_t *st = opt(r->root, "stream");
    r->stream = st && json_is_true(st);
    switch (api) {
    case BATON_API_CHAT:
        rc = validate_chat(r, err);
        break;
    case BATON_API_COMPLETIONS:
        rc = validate_completions(r, err);
        break;
    default:
        rc = validate_generate(r, err);
        break;
    }
    if (rc)
        goto bad;
    if (r->batch > BATON_PDREQ_MAX_BATCH) {
        rc = fail(err, NULL, "invalid_value", "batch of %zu requests exceeds the limit of %d",
                  r->batch, BATON_PDREQ_MAX_BATCH);
        goto bad;
    }
    return 0;
bad:
    json_decref(r->root);
    r->root = NULL;
    return rc;
}

void baton_pdreq_free(baton_pdreq_t *r)
{
    if (!r)
        return;
    json_decref(r->root);
    r->root = NULL;
    baton_buf_free(&r->out);
}

/* ---- injection and serialization ---- */

static int dump_cb(const char *buffer, size_t size, void *data)
{
    return baton_buf_append(data, buffer, size) ? -1 : 0;
}

/* One pass into `out` (json_dumpb would need a sizing pass first). */
int baton_pdreq_dump(const json_t *j, baton_buf_t *out)
{
    baton_buf_reset(out);
    if (json_dump_callback(j, dump_cb, out, JSON_COMPACT) != 0)
        return BATON_ENOMEM;
    if (!out->data && baton_buf_append(out, "", 0))
        return BATON_ENOMEM;
    return 0;
}

static json_t *port_value(int port)
{
    return port < 0 ? json_null() : json_integer(port);
}

int baton_pdreq_inject(baton_pdreq_t *r, const char *host, int bootstrap_port,
                       const uint64_t *rooms)
{
    json_t *h, *p, *rm;
    if (!r->batch) {
        h = json_string(host);
        p = port_value(bootstrap_port);
        rm = json_integer((json_int_t)(rooms[0] & INT64_MAX));
    } else {
        h = json_array();
        p = json_array();
        rm = json_array();
        for (size_t i = 0; h && p && rm && i < r->batch; i++) {
            if (json_array_append_new(h, json_string(host)) ||
                json_array_append_new(p, port_value(bootstrap_port)) ||
                json_array_append_new(rm, json_integer((json_int_t)(rooms[i] & INT64_MAX))))
                break;
            if (i + 1 == r->batch)
                goto built;
        }
        goto nomem;
    }
built:
    if (!h || !p || !rm)
        goto nomem;
    /* json_object_set_new consumes its value, also when it fails. */
    if (json_object_set_new(r->root, "bootstrap_host", h)) {
        h = NULL;
        goto nomem;
    }
    if (json_object_set_new(r->root, "bootstrap_port", p)) {
        h = p = NULL;
        goto nomem;
    }
    if (json_object_set_new(r->root, "bootstrap_room", rm))
        return BATON_ENOMEM;
    return baton_pdreq_dump(r->root, &r->out);
nomem:
    json_decref(h);
    json_decref(p);
    json_decref(rm);
    return BATON_ENOMEM;
}

/* ---- logprob merging ---- */

#define LP_MAX_INDEX 4096

struct baton_pdreq_lp_s {
    json_t *by_index; /* array; element i = prefill's input_token_logprobs for index i, or null */
};

void baton_pdreq_lp_free(baton_pdreq_lp_t *lp)
{
    if (!lp)
        return;
    json_decref(lp->by_index);
    free(lp);
}

static json_t *input_lp(json_t *elem)
{
    json_t *a = json_object_get(json_object_get(elem, "meta_info"), "input_token_logprobs");
    return json_is_array(a) ? a : NULL;
}

static size_t event_index(json_t *ev)
{
    json_t *i = json_object_get(ev, "index");
    return json_is_integer(i) && json_integer_value(i) >= 0 ? (size_t)json_integer_value(i) : 0;
}

static int lp_put(baton_pdreq_lp_t *lp, size_t idx, json_t *arr)
{
    if (idx >= LP_MAX_INDEX)
        return 0;
    while (json_array_size(lp->by_index) <= idx)
        if (json_array_append_new(lp->by_index, json_null()))
            return BATON_ENOMEM;
    if (!json_is_null(json_array_get(lp->by_index, idx)))
        return 0; /* first one wins */
    return json_array_set(lp->by_index, idx, arr) ? BATON_ENOMEM : 1;
}

struct sse_lp_ctx {
    baton_pdreq_lp_t *lp;
    int found;
};

static int sse_lp_cb(const char *payload, size_t len, void *arg)
{
    struct sse_lp_ctx *c = arg;
    if (!memmem(payload, len, "input_token_logprobs", 20))
        return 0;
    json_t *ev = json_loadb(payload, len, 0, NULL);
    json_t *a = input_lp(ev);
    if (a && lp_put(c->lp, event_index(ev), a) > 0)
        c->found = 1;
    json_decref(ev);
    return 0;
}

baton_pdreq_lp_t *baton_pdreq_lp_extract(const char *body, size_t len)
{
    baton_pdreq_lp_t *lp;
    int found = 0;

    if (!body || len == 0 || !memmem(body, len, "input_token_logprobs", 20))
        return NULL;
    lp = calloc(1, sizeof(*lp));
    if (!lp)
        return NULL;
    lp->by_index = json_array();
    if (!lp->by_index)
        goto none;
    json_t *root = json_loadb(body, len, JSON_DECODE_ANY, NULL);
    if (json_is_object(root)) {
        json_t *a = input_lp(root);
        found = a && lp_put(lp, 0, a) > 0;
    } else if (json_is_array(root)) {
        size_t i;
        json_t *e;
        json_array_foreach(root, i, e)
        {
            json_t *a = input_lp(e);
            if (a && lp_put(lp, i, a) > 0)
                found = 1;
        }
    } else if (!root) {
        struct sse_lp_ctx c = {lp, 0};
        baton_sse_each(body, len, sse_lp_cb, &c);
        found = c.found;
    }
    json_decref(root);
    if (found)
        return lp;
none:
    baton_pdreq_lp_free(lp);
    return NULL;
}

/* Prepends prefill's array for `idx` to elem's meta_info.input_token_logprobs. 1 if merged. */
static int merge_elem(const baton_pdreq_lp_t *lp, size_t idx, json_t *elem)
{
    json_t *d = input_lp(elem);
    json_t *p = json_array_get(lp->by_index, idx);
    if (!d || !json_is_array(p))
        return 0;
    json_t *merged = json_copy(p);
    if (!merged || json_array_extend(merged, d) ||
        json_object_set_new(json_object_get(elem, "meta_info"), "input_token_logprobs", merged))
        return BATON_ENOMEM;
    return 1;
}

int baton_pdreq_merge_body(const baton_pdreq_lp_t *lp, const char *decode_body, size_t len,
                           baton_buf_t *out)
{
    int merged = 0, rc;
    if (!lp || !decode_body || len == 0)
        return 0;
    json_t *root = json_loadb(decode_body, len, JSON_DECODE_ANY, NULL);
    if (json_is_object(root)) {
        merged = merge_elem(lp, 0, root);
    } else if (json_is_array(root)) {
        size_t i;
        json_t *e;
        json_array_foreach(root, i, e)
        {
            rc = merge_elem(lp, i, e);
            if (rc < 0) {
                merged = rc;
                break;
            }
            merged |= rc;
        }
    }
    if (merged > 0 && (rc = baton_pdreq_dump(root, out)) != 0)
        merged = rc;
    json_decref(root);
    return merged;
}

int baton_pdreq_merge_event(const baton_pdreq_lp_t *lp, const char *payload, size_t len,
                            uint64_t *merged_mask, baton_buf_t *out)
{
    int rc = 0;
    if (!lp || !memmem(payload, len, "input_token_logprobs", 20))
        return 0;
    json_t *ev = json_loadb(payload, len, 0, NULL);
    if (!json_is_object(ev))
        goto done;
    size_t idx = event_index(ev);
    uint64_t bit = idx < 64 ? (uint64_t)1 << idx : 0;
    if (*merged_mask & bit)
        goto done;
    rc = merge_elem(lp, idx, ev);
    if (rc > 0) {
        *merged_mask |= bit;
        int drc = baton_pdreq_dump(ev, out);
        if (drc)
            rc = drc;
    }
done:
    json_decref(ev);
    return rc;
}
