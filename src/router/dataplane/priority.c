/* priority.c — priority class names, the class a request asks for, the queue shares and the
 * vLLM priority integer (see priority.h). */
#include "router/dataplane/priority.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "baton/error.h"

static const char *const names[BATON_PRIO_COUNT] = {
    [BATON_PRIO_BULK] = "bulk",
    [BATON_PRIO_DEFAULT] = "default",
    [BATON_PRIO_INTERACTIVE] = "interactive",
    [BATON_PRIO_SYSTEM] = "system",
};

static const unsigned share_pct[BATON_PRIO_COUNT] = {
    [BATON_PRIO_BULK] = 50,
    [BATON_PRIO_DEFAULT] = 100,
    [BATON_PRIO_INTERACTIVE] = 125,
    [BATON_PRIO_SYSTEM] = 150,
};

const char *baton_prio_name(baton_prio_t p)
{
    return (unsigned)p < BATON_PRIO_COUNT ? names[p] : "default";
}

int baton_prio_parse(const char *s, size_t len, baton_prio_t *out)
{
    for (int i = 0; i < BATON_PRIO_COUNT; i++) {
        if (strlen(names[i]) == len && strncasecmp(s, names[i], len) == 0) {
            *out = (baton_prio_t)i;
            return 0;
        }
    }
    return BATON_EINVAL;
}

int baton_prio_vllm_value(baton_prio_t p)
{
    switch (p) {
    case BATON_PRIO_BULK:
        return 1;
    case BATON_PRIO_INTERACTIVE:
        return -1;
    case BATON_PRIO_SYSTEM:
        return -2;
    default:
        return 0;
    }
}

unsigned baton_prio_queue_share_pct(baton_prio_t p)
{
    return (unsigned)p < BATON_PRIO_COUNT ? share_pct[p] : 100;
}

unsigned baton_prio_queue_limit(baton_prio_t p, unsigned queue_size)
{
    if (queue_size == 0)
        return 0;
    unsigned long long n = (unsigned long long)queue_size * baton_prio_queue_share_pct(p) / 100;
    return n ? (unsigned)n : 1;
}

unsigned baton_prio_slot_limit(baton_prio_t p, unsigned max_active, unsigned reserve_pct)
{
    if (max_active == 0 || p < BATON_PRIO_INTERACTIVE || reserve_pct == 0)
        return max_active;
    unsigned long long pct = p == BATON_PRIO_SYSTEM ? 2ull * reserve_pct : reserve_pct;
    unsigned long long extra = (unsigned long long)max_active * pct / 100;
    unsigned long long limit = max_active + (extra ? extra : 1);
    return limit > UINT32_MAX ? UINT32_MAX : (unsigned)limit;
}

static int fail(baton_prio_error_t *err, int status, const char *code, const char *param,
                const char *msg)
{
    err->status = status;
    err->code = code;
    err->param = param;
    snprintf(err->message, sizeof(err->message), "%s", msg);
    return BATON_EINVAL;
}

int baton_prio_resolve(const char *header, const baton_json_val_t *field, int key_class,
                       baton_prio_t *out, baton_prio_error_t *err)
{
    baton_prio_t p = BATON_PRIO_DEFAULT;
    if (header) {
        size_t len = strlen(header);
        while (len && (header[len - 1] == ' ' || header[len - 1] == '\t'))
            len--;
        if (baton_prio_parse(header, len, &p) != 0) {
            /* The value is the client's own: echoed only when short and printable. */
            int show = len <= 32;
            for (size_t i = 0; show && i < len; i++)
                show = header[i] > ' ' && header[i] < 0x7f;
            char msg[sizeof(err->message)];
            snprintf(msg, sizeof(msg),
                     "x-priority must be one of bulk, default, interactive, system (got '%.*s')",
                     show ? (int)len : 1, show ? header : "?");
            return fail(err, 400, "invalid_priority", "x-priority", msg);
        }
    } else if (field && field->type != BATON_JSON_NULL) {
        if (field->type != BATON_JSON_INTEGER)
            return fail(err, 400, "invalid_type", "priority",
                        "priority must be an integer (vLLM's sense: lower runs earlier)");
        int64_t v = baton_json_int(field);
        p = v < 0 ? BATON_PRIO_INTERACTIVE : v > 0 ? BATON_PRIO_BULK : BATON_PRIO_DEFAULT;
    } else if (key_class >= 0 && key_class < BATON_PRIO_COUNT) {
        p = (baton_prio_t)key_class;
    }
    if (p == BATON_PRIO_SYSTEM && key_class != BATON_PRIO_SYSTEM)
        return fail(err, 403, "priority_not_allowed", "x-priority",
                    "the system priority class is reserved for API keys that have it");
    *out = p;
    return 0;
}
