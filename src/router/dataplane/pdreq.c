/* pdreq.c — request body validation, batch detection, bootstrap injection and logprob merging
 * for the PD router. */
#include "router/dataplane/pdreq.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "http/sse.h"

static const char *const api_paths[BATON_API__COUNT] = {
    [BATON_API_CHAT] = "/v1/chat/completions", [BATON_API_COMPLETIONS] = "/v1/completions",
    [BATON_API_GENERATE] = "/generate",        [BATON_API_RESPONSES] = "/v1/responses",
    [BATON_API_EMBEDDINGS] = "/v1/embeddings", [BATON_API_RERANK] = "/v1/rerank",
    [BATON_API_SCORE] = "/v1/score",           [BATON_API_TOKENIZE] = "/tokenize",
    [BATON_API_DETOKENIZE] = "/detokenize",
};

int baton_api_regular_only(baton_api_t api)
{
    return api == BATON_API_EMBEDDINGS || api == BATON_API_RERANK || api == BATON_API_SCORE ||
           api == BATON_API_TOKENIZE || api == BATON_API_DETOKENIZE;
}

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

typedef baton_json_val_t val_t;

/* null counts as absent everywhere: OpenAI clients send "stop": null and the like. */
static const val_t *opt(const baton_pdreq_t *r, const char *key)
{
    const baton_json_member_t *m = baton_json_scan_get(&r->scan, key);
    return m && m->val.type != BATON_JSON_NULL ? &m->val : NULL;
}

/* The same inside a nested object: 1 and *out when present and not null. */
static int opt_in(const val_t *obj, const char *key, val_t *out)
{
    return baton_json_object_get(obj, key, out) && out->type != BATON_JSON_NULL;
}

static int is_type(const val_t *v, baton_json_type_t t)
{
    return v && v->type == t;
}

static int is_bool(const val_t *v)
{
    return is_type(v, BATON_JSON_TRUE) || is_type(v, BATON_JSON_FALSE);
}

static int is_int(const val_t *v)
{
    return is_type(v, BATON_JSON_INTEGER);
}

static int is_array(const val_t *v)
{
    return is_type(v, BATON_JSON_ARRAY);
}

static int is_string(const val_t *v)
{
    return is_type(v, BATON_JSON_STRING);
}

static int is_object(const val_t *v)
{
    return is_type(v, BATON_JSON_OBJECT);
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
static int array_all(const val_t *v, int (*ok)(const val_t *e))
{
    baton_json_iter_t it;
    val_t e;
    if (!is_array(v))
        return 0;
    baton_json_iter_init(&it, v);
    while (baton_json_array_next(&it, &e))
        if (!ok(&e))
            return 0;
    return 1;
}

static int is_string_array(const val_t *v)
{
    return array_all(v, is_string);
}

static int kind_ok(const val_t *v, enum kind k)
{
    switch (k) {
    case K_BOOL:
        return is_bool(v);
    case K_NUMBER:
        return is_int(v) || is_type(v, BATON_JSON_REAL);
    case K_INT:
        return is_int(v);
    case K_UINT:
        return is_int(v) && baton_json_int(v) >= 0;
    case K_POS:
        return is_int(v) && baton_json_int(v) >= 1;
    case K_STRING:
        return is_string(v);
    case K_STOP:
        return is_string(v) || is_string_array(v);
    case K_OBJECT:
        return is_type(v, BATON_JSON_OBJECT);
    case K_LOGPROBS:
        return is_bool(v) || (is_int(v) && baton_json_int(v) >= 0);
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
#define N_COMMON_FIELDS   (sizeof(common_fields) / sizeof(*common_fields))

static int field_fail(baton_pdreq_error_t *err, const char *prefix, const field_t *f)
{
    char param[64];
    snprintf(param, sizeof(param), "%s%s", prefix, f->name);
    return fail(err, param, "invalid_type", "'%s' must be %s", param, kind_desc(f->kind));
}

/* The top-level fields: one look-up each in the member index. */
static int check_top_fields(const baton_pdreq_t *r, baton_pdreq_error_t *err)
{
    for (size_t i = 0; i < N_COMMON_FIELDS; i++) {
        const val_t *v = opt(r, common_fields[i].name);
        if (v && !kind_ok(v, common_fields[i].kind))
            return field_fail(err, "", &common_fields[i]);
    }
    return 0;
}

static int check_sampling_fields(const val_t *obj, baton_pdreq_error_t *err)
{
    val_t v;
    for (size_t i = 0; i < N_SAMPLING_FIELDS; i++)
        if (opt_in(obj, sampling_fields[i].name, &v) && !kind_ok(&v, sampling_fields[i].kind))
            return field_fail(err, "sampling_params.", &sampling_fields[i]);
    return 0;
}

static int is_int_array(const val_t *v)
{
    return array_all(v, is_int);
}

static int is_nonempty_int_array(const val_t *v)
{
    return baton_json_array_size(v) > 0 && is_int_array(v);
}

/* A non-empty array of non-empty integer arrays (a batch of token-id prompts). */
static int is_int_array_array(const val_t *v)
{
    return baton_json_array_size(v) > 0 && array_all(v, is_nonempty_int_array);
}

/* Sequences = prompts (0: one prompt, not a list) × n; each gets its own room. */
static int set_batch(baton_pdreq_t *r, size_t prompts, const val_t *n, baton_pdreq_error_t *err)
{
    int64_t nv = n ? baton_json_int(n) : 1; /* validated: >= 1 */
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

static int logprobs_asked(const baton_pdreq_t *r)
{
    const val_t *lp = opt(r, "logprobs");
    return lp && lp->type != BATON_JSON_FALSE;
}

static int validate_chat(baton_pdreq_t *r, baton_pdreq_error_t *err)
{
    const val_t *msgs = opt(r, "messages");
    baton_json_iter_t it;
    val_t m, role;
    size_t i = 0;
    if (!msgs)
        return fail(err, "messages", "missing_parameter", "'messages' is required");
    if (!is_array(msgs))
        return fail(err, "messages", "invalid_type", "'messages' must be an array");
    baton_json_iter_init(&it, msgs);
    for (; baton_json_array_next(&it, &m); i++) {
        if (m.type != BATON_JSON_OBJECT)
            return fail(err, "messages", "invalid_type", "'messages[%zu]' must be an object", i);
        if (!baton_json_object_get(&m, "role", &role) || role.type != BATON_JSON_STRING)
            return fail(err, "messages", "invalid_type", "'messages[%zu].role' must be a string",
                        i);
    }
    if (i == 0)
        return fail(err, "messages", "invalid_value", "'messages' must not be empty");
    r->logprobs = logprobs_asked(r);
    return set_batch(r, 0, opt(r, "n"), err);
}

static int validate_completions(baton_pdreq_t *r, baton_pdreq_error_t *err)
{
    const val_t *p = opt(r, "prompt");
    size_t prompts = 0;
    if (!p)
        return fail(err, "prompt", "missing_parameter", "'prompt' is required");
    size_t np = baton_json_array_size(p);
    if (is_array(p) && np == 0)
        return fail(err, "prompt", "invalid_value", "'prompt' must not be empty");
    if (is_string_array(p) || is_int_array_array(p))
        prompts = np;
    else if (!is_string(p) && !is_int_array(p)) /* a string or a flat int array: one */
        return fail(err, "prompt", "invalid_type",
                    "'prompt' must be a string, an array of strings, an array of integers or "
                    "an array of non-empty integer arrays");
    r->logprobs = logprobs_asked(r);
    return set_batch(r, prompts, opt(r, "n"), err);
}

/* The Responses API: `input` a string or a non-empty array of input items (objects); one
 * sequence per request (the API has no n), so never a batch. */
static int validate_responses(baton_pdreq_t *r, baton_pdreq_error_t *err)
{
    static const field_t fields[] = {{"max_output_tokens", K_UINT},
                                     {"instructions", K_STRING},
                                     {"previous_response_id", K_STRING}};
    const val_t *in = opt(r, "input");
    if (!in)
        return fail(err, "input", "missing_parameter", "'input' is required");
    if (!is_string(in) &&
        !(is_array(in) && baton_json_array_size(in) > 0 && array_all(in, is_object)))
        return fail(err, "input", "invalid_type",
                    "'input' must be a string or a non-empty array of input items");
    for (size_t i = 0; i < sizeof(fields) / sizeof(*fields); i++) {
        const val_t *v = opt(r, fields[i].name);
        if (v && !kind_ok(v, fields[i].kind))
            return field_fail(err, "", &fields[i]);
    }
    return 0;
}

static int validate_sampling(const val_t *sp, val_t *n, int *has_n, baton_pdreq_error_t *err)
{
    if (sp->type == BATON_JSON_OBJECT) {
        int rc = check_sampling_fields(sp, err);
        if (rc)
            return rc;
        *has_n = opt_in(sp, "n", n);
        return 0;
    }
    if (sp->type == BATON_JSON_ARRAY) {
        baton_json_iter_t it;
        val_t e;
        baton_json_iter_init(&it, sp);
        while (baton_json_array_next(&it, &e)) {
            if (e.type != BATON_JSON_OBJECT)
                return fail(err, "sampling_params", "invalid_type",
                            "'sampling_params' must be an object or an array of objects");
            int rc = check_sampling_fields(&e, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    return fail(err, "sampling_params", "invalid_type",
                "'sampling_params' must be an object or an array of objects");
}

static int validate_return_logprob(baton_pdreq_t *r, const val_t *rl, baton_pdreq_error_t *err)
{
    if (is_bool(rl)) {
        r->logprobs = rl->type == BATON_JSON_TRUE;
        return 0;
    }
    if (is_array(rl)) {
        baton_json_iter_t it;
        val_t e;
        baton_json_iter_init(&it, rl);
        while (baton_json_array_next(&it, &e)) {
            if (!is_bool(&e))
                return fail(err, "return_logprob", "invalid_type",
                            "'return_logprob' must be a boolean or an array of booleans");
            r->logprobs |= e.type == BATON_JSON_TRUE;
        }
        return 0;
    }
    return fail(err, "return_logprob", "invalid_type",
                "'return_logprob' must be a boolean or an array of booleans");
}

static int validate_generate(baton_pdreq_t *r, baton_pdreq_error_t *err)
{
    const val_t *text = opt(r, "text"), *ids = opt(r, "input_ids");
    val_t n;
    int has_n = 0, rc;
    size_t prompts = 0;
    if (!text && !ids)
        return fail(err, "text", "missing_parameter", "'text' or 'input_ids' is required");
    if (text && !is_string(text) && (baton_json_array_size(text) == 0 || !is_string_array(text)))
        return fail(err, "text", "invalid_type",
                    "'text' must be a string or a non-empty array of strings");
    if (is_array(text))
        prompts = baton_json_array_size(text);
    if (ids) {
        if (is_int_array_array(ids)) {
            size_t nids = baton_json_array_size(ids);
            if (prompts && prompts != nids)
                return fail(err, "input_ids", "invalid_value",
                            "'input_ids' and 'text' batch sizes differ");
            prompts = nids;
        } else if (!is_int_array(ids) || baton_json_array_size(ids) == 0) {
            return fail(err, "input_ids", "invalid_type",
                        "'input_ids' must be a non-empty array of integers or of non-empty "
                        "integer arrays");
        }
    }
    /* sampling_params: one object, or one per batch element */
    const val_t *sp = opt(r, "sampling_params");
    if (sp && (rc = validate_sampling(sp, &n, &has_n, err)) != 0)
        return rc;
    const val_t *rl = opt(r, "return_logprob");
    if (rl && (rc = validate_return_logprob(r, rl, err)) != 0)
        return rc;
    return set_batch(r, prompts, has_n ? &n : NULL, err);
}

/* The rare bad body: jansson words the error as the router always did (line, column, text). */
static int json_fail(const baton_pdreq_t *r, const char *body, size_t len, baton_pdreq_error_t *err)
{
    json_error_t jerr;
    json_t *j = json_loadb(body, len, JSON_DECODE_ANY, &jerr);
    if (j) { /* the two disagree: the fuzz harness exists so that this never happens */
        json_decref(j);
        return fail(err, NULL, "invalid_json", "invalid JSON at byte %zu: %s", r->scan.err_pos,
                    r->scan.err_text);
    }
    if (json_error_code(&jerr) == json_error_out_of_memory)
        return BATON_ENOMEM;
    return fail(err, NULL, "invalid_json", "invalid JSON at line %d column %d: %s", jerr.line,
                jerr.column, jerr.text);
}

int baton_pdreq_parse(baton_pdreq_t *r, baton_api_t api, const char *body, size_t len,
                      baton_pdreq_error_t *err)
{
    int rc;

    memset(r, 0, sizeof(*r));
    r->api = api;
    baton_json_scan_init(&r->scan, r->members, BATON_PDREQ_INLINE_MEMBERS);
    baton_json_splice_free(&r->segs); /* empty, inline */
    if ((unsigned)api >= BATON_API__COUNT)
        return fail(err, NULL, "invalid_value", "unknown API");
    if (len == 0)
        return fail(err, NULL, "invalid_json", "request body is empty; expected a JSON object");
    rc = baton_json_scan(&r->scan, body, len);
    if (rc == BATON_EINVAL)
        rc = json_fail(r, body, len, err);
    if (rc)
        goto bad;
    if (r->scan.root.type != BATON_JSON_OBJECT) {
        rc = fail(err, NULL, "invalid_type", "request body must be a JSON object");
        goto bad;
    }
    r->body = body;
    r->body_len = len;
    if ((rc = check_top_fields(r, err)) != 0)
        goto bad;
    r->stream = is_type(opt(r, "stream"), BATON_JSON_TRUE);
    switch (api) {
    case BATON_API_CHAT:
        rc = validate_chat(r, err);
        break;
    case BATON_API_COMPLETIONS:
        rc = validate_completions(r, err);
        break;
    case BATON_API_RESPONSES:
        rc = validate_responses(r, err);
        break;
    case BATON_API_EMBEDDINGS:
    case BATON_API_RERANK:
    case BATON_API_SCORE:
    case BATON_API_TOKENIZE:
    case BATON_API_DETOKENIZE:
        rc = 0; /* the worker judges its own fields: passed through untouched */
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
    baton_json_scan_free(&r->scan);
    r->body = NULL;
    r->body_len = 0;
    return rc;
}

void baton_pdreq_move(baton_pdreq_t *dst, baton_pdreq_t *src)
{
    *dst = *src;
    if (src->scan.members == src->members)
        dst->scan.members = dst->members;
    if (src->segs.iov == src->segs.inline_iov)
        dst->segs.iov = dst->segs.inline_iov;
    memset(src, 0, sizeof(*src));
    baton_json_splice_free(&src->segs);
}

const baton_json_val_t *baton_pdreq_get(const baton_pdreq_t *r, const char *key)
{
    const baton_json_member_t *m = r->body ? baton_json_scan_get(&r->scan, key) : NULL;
    return m ? &m->val : NULL;
}

void baton_pdreq_free(baton_pdreq_t *r)
{
    if (!r)
        return;
    baton_json_scan_free(&r->scan);
    baton_json_splice_free(&r->segs);
    r->body = NULL;
    baton_buf_free(&r->tail);
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

const char *const baton_pdreq_bootstrap_keys[3] = {"bootstrap_host", "bootstrap_port",
                                                   "bootstrap_room"};

/* `n` copies of one value (an array when batch), separated by commas. */
static int put_repeated(baton_buf_t *out, int batch, size_t n, const char *v, size_t len)
{
    int rc = batch ? baton_buf_append(out, "[", 1) : 0;
    for (size_t i = 0; !rc && i < n; i++) {
        if (i)
            rc = baton_buf_append(out, ",", 1);
        if (!rc)
            rc = baton_buf_append(out, v, len);
    }
    if (!rc && batch)
        rc = baton_buf_append(out, "]", 1);
    return rc ? BATON_ENOMEM : 0;
}

int baton_pdreq_bootstrap_members(const baton_pdreq_t *r, const char *host, int bootstrap_port,
                                  const uint64_t *rooms, baton_buf_t *out)
{
    baton_buf_t h = BATON_BUF_INIT;
    char port[16];
    size_t n = baton_pdreq_n_rooms(r);
    int batch = r->batch != 0, rc;
    int plen = bootstrap_port < 0 ? snprintf(port, sizeof(port), "null")
                                  : snprintf(port, sizeof(port), "%d", bootstrap_port);
    rc = baton_buf_append_json_string(&h, host, strlen(host));
    if (!rc)
        rc = baton_buf_append_str(out, "\"bootstrap_host\":");
    if (!rc)
        rc = put_repeated(out, batch, n, h.data, h.len);
    if (!rc)
        rc = baton_buf_append_str(out, ",\"bootstrap_port\":");
    if (!rc)
        rc = put_repeated(out, batch, n, port, (size_t)plen);
    if (!rc)
        rc = baton_buf_append_str(out, batch ? ",\"bootstrap_room\":[" : ",\"bootstrap_room\":");
    for (size_t i = 0; !rc && i < n; i++)
        rc = baton_buf_printf(out, "%s%" PRIu64, i ? "," : "", rooms[i] & INT64_MAX);
    if (!rc && batch)
        rc = baton_buf_append(out, "]", 1);
    baton_buf_free(&h);
    return rc ? BATON_ENOMEM : 0;
}

int baton_pdreq_splice(const baton_pdreq_t *r, const char *const *drop, size_t n_drop,
                       const char *tail, size_t tail_len, baton_json_splice_t *sp)
{
    int rc = baton_json_splice(&r->scan, drop, n_drop, tail, tail_len, sp);
    return rc == BATON_EINVAL ? BATON_ENOMEM : rc; /* a parsed request is always an object */
}

int baton_pdreq_inject_segs(baton_pdreq_t *r, const char *host, int bootstrap_port,
                            const uint64_t *rooms)
{
    static const char *const drop[] = {"bootstrap_host", "bootstrap_port", "bootstrap_room",
                                       "baton_continuation"};
    baton_buf_reset(&r->tail);
    baton_json_splice_free(&r->segs);
    if (baton_buf_append(&r->tail, ",", 1) ||
        baton_pdreq_bootstrap_members(r, host, bootstrap_port, rooms, &r->tail) ||
        (r->extra && r->extra->len && baton_buf_append(&r->tail, r->extra->data, r->extra->len)) ||
        baton_buf_append(&r->tail, "}", 1))
        return BATON_ENOMEM;
    return baton_pdreq_splice(r, drop, 4, r->tail.data, r->tail.len, &r->segs);
}

int baton_pdreq_inject(baton_pdreq_t *r, const char *host, int bootstrap_port,
                       const uint64_t *rooms)
{
    int rc = baton_pdreq_inject_segs(r, host, bootstrap_port, rooms);
    return rc ? rc : baton_json_splice_flatten(&r->segs, &r->out);
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

int baton_pdreq_merge_event(baton_pdreq_lp_t *lp, const char *payload, size_t len, baton_buf_t *out)
{
    int rc = 0;
    if (!lp || !memmem(payload, len, "input_token_logprobs", 20))
        return 0;
    json_t *ev = json_loadb(payload, len, 0, NULL);
    if (!json_is_object(ev))
        goto done;
    size_t idx = event_index(ev);
    rc = merge_elem(lp, idx, ev);
    if (rc > 0) {
        /* Merged once per index: its later events are left as they are. */
        if (json_array_set_new(lp->by_index, idx, json_null()))
            rc = BATON_ENOMEM;
        int drc = rc > 0 ? baton_pdreq_dump(ev, out) : 0;
        if (drc)
            rc = drc;
    }
done:
    json_decref(ev);
    return rc;
}
