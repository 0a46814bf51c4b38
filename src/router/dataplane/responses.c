/* responses.c — the router's own events in the OpenAI Responses API's shape. */
#include "router/dataplane/responses.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "baton/error.h"

int baton_responses_error_event(baton_buf_t *out, const char *message, const char *code,
                                uint64_t seq)
{
    json_t *j = json_pack(
        "{s:s,s:s,s:s,s:n,s:I}", "type", "error", "code", code ? code : "upstream_error", "message",
        message ? message : "upstream request failed", "param", "sequence_number", (json_int_t)seq);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    int rc = s ? baton_buf_printf(out, "event: error\ndata: %s\n\n", s) : BATON_ENOMEM;
    free(s);
    return rc ? BATON_ENOMEM : 0;
}
