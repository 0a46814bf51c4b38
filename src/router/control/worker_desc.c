/* worker_desc.c — what follows from the worker descriptor's one field list: each kind's rules
 * (default, copy, comparison, JSON in and out), applied field by field. */
#include "router/control/worker_desc.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "router/control/registry.h"

/* ---- each kind's rules -------------------------------------------------------------------- */

/* Defaults. */
#define DEF_URL    NULL
#define DEF_ROLE   BATON_ROLE_REGULAR
#define DEF_PORT   (-1)
#define DEF_STR    NULL
#define DEF_ZMQ    NULL
#define DEF_PRIO   50
#define DEF_COST   1.0
#define DEF_LABELS NULL
#define DEF_PROTO  BATON_PD_UNSET
#define DEF_DP     0

/* Whether JSON null is a value of the kind ("none"), in strict mode too. */
#define NULLABLE_URL    0
#define NULLABLE_ROLE   0
#define NULLABLE_PORT   1
#define NULLABLE_STR    1
#define NULLABLE_ZMQ    1
#define NULLABLE_PRIO   0
#define NULLABLE_COST   0
#define NULLABLE_LABELS 0
#define NULLABLE_PROTO  1
#define NULLABLE_DP     0

/* What a value must be (the error message's end). */
#define MUST_URL    "must be a string"
#define MUST_ROLE   "must be \"prefill\", \"decode\" or \"regular\""
#define MUST_PORT   "must be an integer 1..65535 or null"
#define MUST_STR    "must be a string or null"
#define MUST_ZMQ    "must be a ZMQ endpoint tcp://host:port or ipc://path (at most 255 bytes), or null"
#define MUST_PRIO   "must be a non-negative integer"
#define MUST_COST   "must be a number >= 0"
#define MUST_LABELS "must be an object"
#define MUST_PROTO  "must be \"sglang\", \"vllm-nixl\" or \"vllm-mooncake\""
#define MUST_DP     "must be an integer 0..1024"

static int text_dup(char **dst, const char *src)
{
    *dst = NULL;
    return src && !(*dst = strdup(src)) ? BATON_ENOMEM : 0;
}
#define DUP_URL(d, s)    text_dup(&(d), (s))
#define DUP_STR(d, s)    text_dup(&(d), (s))
#define DUP_ZMQ(d, s)    text_dup(&(d), (s))
#define DUP_LABELS(d, s) text_dup(&(d), (s))
#define DUP_ROLE(d, s)   ((d) = (s), 0)
#define DUP_PORT(d, s)   ((d) = (s), 0)
#define DUP_PRIO(d, s)   ((d) = (s), 0)
#define DUP_COST(d, s)   ((d) = (s), 0)
#define DUP_PROTO(d, s)  ((d) = (s), 0)
#define DUP_DP(d, s)     ((d) = (s), 0)

#define FREE_URL(x)    free(x)
#define FREE_STR(x)    free(x)
#define FREE_ZMQ(x)    free(x)
#define FREE_LABELS(x) free(x)
#define FREE_ROLE(x)   (void)0
#define FREE_PORT(x)   (void)0
#define FREE_PRIO(x)   (void)0
#define FREE_COST(x)   (void)0
#define FREE_PROTO(x)  (void)0
#define FREE_DP(x)     (void)0

static int str_eq(const char *a, const char *b)
{
    return a == NULL || b == NULL ? a == b : strcmp(a, b) == 0;
}

static int url_eq(const char *a, const char *b)
{
    char na[BATON_WORKER_URL_MAX], nb[BATON_WORKER_URL_MAX];
    return baton_worker_url_normalize(a, na, sizeof(na), NULL) == 0 &&
           baton_worker_url_normalize(b, nb, sizeof(nb), NULL) == 0 && strcmp(na, nb) == 0;
}

/* Labels are equal as objects: the same keys and values in any order, none = {}. */
static int labels_eq(const char *a, const char *b)
{
    if (str_eq(a ? a : "{}", b ? b : "{}"))
        return 1;
    json_t *ja = json_loads(a ? a : "{}", 0, NULL), *jb = json_loads(b ? b : "{}", 0, NULL);
    int eq = ja && jb && json_equal(ja, jb);
    json_decref(ja);
    json_decref(jb);
    return eq;
}
#define EQ_URL(a, b)    url_eq((a), (b))
#define EQ_STR(a, b)    str_eq((a), (b))
#define EQ_ZMQ(a, b)    str_eq((a), (b))
#define EQ_LABELS(a, b) labels_eq((a), (b))
#define EQ_ROLE(a, b)   ((a) == (b))
#define EQ_PORT(a, b)   ((a) == (b))
#define EQ_PRIO(a, b)   ((a) == (b))
#define EQ_COST(a, b)   ((a) == (b))
#define EQ_PROTO(a, b)  ((a) == (b))
#define EQ_DP(a, b)     ((a) == (b))

static json_t *text_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *labels_json(const char *s)
{
    json_t *j = s ? json_loads(s, 0, NULL) : NULL;
    return j ? j : json_object();
}
#define OUT_URL(v)    text_or_null(v)
#define OUT_STR(v)    text_or_null(v)
#define OUT_ZMQ(v)    text_or_null(v)
#define OUT_LABELS(v) labels_json(v)
#define OUT_ROLE(v)   json_string(baton_worker_role_name(v))
#define OUT_PORT(v)   ((v) >= 0 ? json_integer(v) : json_null())
#define OUT_PRIO(v)   json_integer(v)
#define OUT_COST(v)   json_real(v)
#define OUT_PROTO(v)  ((v) == BATON_PD_UNSET ? json_null() : json_string(baton_pd_protocol_name(v)))
#define OUT_DP(v)     json_integer(v)

/* JSON → value; v is never null here. 0, BATON_EINVAL (wrong type or range), BATON_ENOMEM. */
static int in_text(json_t *v, char **out)
{
    if (!json_is_string(v))
        return BATON_EINVAL;
    free(*out);
    return (*out = strdup(json_string_value(v))) ? 0 : BATON_ENOMEM;
}

/* A ZMQ endpoint the router connects to: tcp://host:port or ipc://path, printable, bounded. */
static int in_zmq(json_t *v, char **out)
{
    if (!json_is_string(v))
        return BATON_EINVAL;
    const char *t = json_string_value(v);
    size_t n = strlen(t);
    if (n > 255 || (strncmp(t, "tcp://", 6) != 0 && strncmp(t, "ipc://", 6) != 0) || n == 6)
        return BATON_EINVAL;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)t[i] <= ' ' || t[i] == 0x7f)
            return BATON_EINVAL;
    if (strncmp(t, "tcp://", 6) == 0) {
        const char *colon = strrchr(t + 6, ':');
        char *end;
        long port = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || colon == t + 6 || *end || port < 1 || port > 65535)
            return BATON_EINVAL;
    }
    return in_text(v, out);
}

static int in_int(json_t *v, json_int_t lo, json_int_t hi, int *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return BATON_EINVAL;
    *out = (int)json_integer_value(v);
    return 0;
}

static int in_cost(json_t *v, double *out)
{
    if (!json_is_number(v) || json_number_value(v) < 0)
        return BATON_EINVAL;
    *out = json_number_value(v);
    return 0;
}

static int in_labels(json_t *v, char **out)
{
    if (!json_is_object(v))
        return BATON_EINVAL;
    free(*out);
    return (*out = json_dumps(v, JSON_COMPACT)) ? 0 : BATON_ENOMEM;
}

static int in_role(json_t *v, baton_worker_role_t *out)
{
    return json_is_string(v) && baton_worker_role_parse(json_string_value(v), out) == 0
               ? 0
               : BATON_EINVAL;
}

static int in_proto(json_t *v, baton_pd_protocol_t *out)
{
    return json_is_string(v) && baton_pd_protocol_parse(json_string_value(v), out) == 0
               ? 0
               : BATON_EINVAL;
}
#define IN_URL(v, p)    in_text((v), (p))
#define IN_STR(v, p)    in_text((v), (p))
#define IN_ZMQ(v, p)    in_zmq((v), (p))
#define IN_LABELS(v, p) in_labels((v), (p))
#define IN_ROLE(v, p)   in_role((v), (p))
#define IN_PORT(v, p)   in_int((v), 1, 65535, (p))
#define IN_PRIO(v, p)   in_int((v), 0, INT32_MAX, (p))
#define IN_COST(v, p)   in_cost((v), (p))
#define IN_PROTO(v, p)  in_proto((v), (p))
#define IN_DP(v, p)     in_int((v), 0, 1024, (p))

/* ---- field by field ----------------------------------------------------------------------- */

void baton_worker_spec_init(baton_worker_spec_t *spec)
{
#define X(kind, name, key) spec->name = DEF_##kind;
    BATON_WORKER_DESC_FIELDS(X)
#undef X
}

void baton_worker_desc_init(baton_worker_desc_t *d)
{
#define X(kind, name, key) d->name = DEF_##kind;
    BATON_WORKER_DESC_FIELDS(X)
#undef X
}

void baton_worker_desc_free(baton_worker_desc_t *d)
{
#define X(kind, name, key) FREE_##kind(d->name);
    BATON_WORKER_DESC_FIELDS(X)
#undef X
    baton_worker_desc_init(d);
}

int baton_worker_desc_dup(baton_worker_desc_t *dst, const baton_worker_spec_t *src)
{
    int rc = 0;
    baton_worker_desc_init(dst);
#define X(kind, name, key) rc |= DUP_##kind(dst->name, src->name);
    BATON_WORKER_DESC_FIELDS(X)
#undef X
    if (rc) {
        baton_worker_desc_free(dst);
        return BATON_ENOMEM;
    }
    return 0;
}

int baton_worker_spec_equal(const baton_worker_spec_t *a, const baton_worker_spec_t *b)
{
#define X(kind, name, key)                                                                         \
    if (!EQ_##kind(a->name, b->name))                                                              \
        return 0;
    BATON_WORKER_DESC_FIELDS(X)
#undef X
    return 1;
}

json_t *baton_worker_spec_to_json(const baton_worker_spec_t *s, int secrets)
{
    json_t *j = json_object();
    int rc = j ? 0 : -1;
#define X(kind, name, key)                                                                         \
    if (rc == 0 && (secrets || strcmp(key, "api_key") != 0))                                       \
        rc = json_object_set_new(j, key, OUT_##kind(s->name));
    BATON_WORKER_DESC_FIELDS(X)
#undef X
    if (rc != 0) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static int bad(char *err, size_t errlen, int rc, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int bad(char *err, size_t errlen, int rc, const char *where, const char *fmt, ...)
{
    if (err && errlen) {
        int n = where && where[0] ? snprintf(err, errlen, "%s", where) : 0;
        if (n < 0 || (size_t)n >= errlen)
            n = 0;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* One member of the object: 1 when `key` is this list's, with *rc_p its outcome. */
static int in_member(baton_worker_desc_t *d, const char *key, json_t *v, int strict,
                     const char *where, char *err, size_t errlen, int *rc_p)
{
    const char *sep = where && where[0] ? "." : "";
#define X(kind, name, jkey)                                                                        \
    if (strcmp(key, jkey) == 0) {                                                                  \
        if (json_is_null(v) && (NULLABLE_##kind || !strict)) {                                     \
            FREE_##kind(d->name);                                                                  \
            d->name = DEF_##kind;                                                                  \
            *rc_p = 0;                                                                             \
        } else {                                                                                   \
            *rc_p = IN_##kind(v, &d->name);                                                        \
            if (*rc_p == BATON_EINVAL)                                                             \
                bad(err, errlen, *rc_p, where, "%s%s%s " MUST_##kind, sep, jkey,                   \
                    where &&where[0] ? ":" : "");                                                  \
            else if (*rc_p)                                                                        \
                bad(err, errlen, *rc_p, NULL, "out of memory");                                    \
        }                                                                                          \
        return 1;                                                                                  \
    }
    BATON_WORKER_DESC_FIELDS(X)
#undef X
    return 0;
}

int baton_worker_desc_from_json(baton_worker_desc_t *d, json_t *obj, int strict, const char *where,
                                char *err, size_t errlen)
{
    baton_worker_desc_init(d);
    if (!json_is_object(obj))
        return where && where[0]
                   ? bad(err, errlen, BATON_EINVAL, where, ": must be an object")
                   : bad(err, errlen, BATON_EINVAL, NULL, "the body must be a JSON object");
    int rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v)
    {
        if (!in_member(d, key, v, strict, where, err, errlen, &rc) && strict)
            rc = bad(err, errlen, BATON_EINVAL, where, ": unknown key '%s'", key);
        if (rc != 0)
            break;
    }
    if (rc == 0 && d->url == NULL)
        rc = where && where[0]
                 ? bad(err, errlen, BATON_EINVAL, where, ": \"url\" is required")
                 : bad(err, errlen, BATON_EINVAL, NULL, "url is required and must be a string");
    if (rc != 0)
        baton_worker_desc_free(d);
    return rc;
}
