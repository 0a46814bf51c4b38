/* fuzz/fuzz_pdreq.c — libFuzzer harness for the PD router's request path: a client body for one
 * of the three APIs → validation → bootstrap injection → the serialized body sent to workers. */
#include <string.h>

#include <jansson.h>

#include "baton/error.h"
#include "common/log.h"
#include "fuzz_check.h"
#include "router/dataplane/pdreq.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    baton_log_set_level(BATON_LOG_ERROR);
    return 0;
}

/* The injected body must be one JSON object whose bootstrap fields have the batch's shape. */
static void check_injected(const baton_pdreq_t *r, size_t n_rooms, const uint64_t *rooms)
{
    json_error_t jerr;
    json_t *o = json_loadb(r->out.data, r->out.len, 0, &jerr);
    CHECK(json_is_object(o));
    json_t *room = json_object_get(o, "bootstrap_room");
    json_t *host = json_object_get(o, "bootstrap_host");
    CHECK(room != NULL && host != NULL && json_object_get(o, "bootstrap_port") != NULL);
    if (r->batch) {
        CHECK(json_is_array(room) && json_array_size(room) == n_rooms);
        CHECK(json_is_array(host) && json_array_size(host) == n_rooms);
        for (size_t i = 0; i < n_rooms; i++)
            CHECK((uint64_t)json_integer_value(json_array_get(room, i)) == rooms[i]);
    } else {
        CHECK(json_is_integer(room) && (uint64_t)json_integer_value(room) == rooms[0]);
        CHECK(json_is_string(host) && strcmp(json_string_value(host), "10.0.0.1") == 0);
    }
    json_decref(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    baton_api_t api = (baton_api_t)(data[0] % BATON_API__COUNT);
    baton_pdreq_t r;
    baton_pdreq_error_t err;
    memset(&err, 0, sizeof(err));
    int rc = baton_pdreq_parse(&r, api, (const char *)data + 1, size - 1, &err);
    if (rc != 0) {
        CHECK(rc == BATON_EINVAL || rc == BATON_ENOMEM);
        if (rc == BATON_EINVAL) {
            CHECK(err.status == 400 && err.code != NULL);
            CHECK(memchr(err.message, '\0', sizeof(err.message)) != NULL);
            CHECK(memchr(err.param, '\0', sizeof(err.param)) != NULL);
        }
        return 0;
    }
    CHECK(r.body != NULL && r.scan.root.type == BATON_JSON_OBJECT);
    CHECK(r.batch <= BATON_PDREQ_MAX_BATCH);
    size_t n = baton_pdreq_n_rooms(&r);
    static uint64_t rooms[BATON_PDREQ_MAX_BATCH];
    for (size_t i = 0; i < n; i++)
        rooms[i] = (0x5bd1e995ull * (i + 1)) & 0x7fffffffffffffffull;
    /* Twice, as a retry with a new pair does: the second injection replaces the first. */
    CHECK(baton_pdreq_inject(&r, "10.0.0.9", -1, rooms) == 0);
    CHECK(baton_pdreq_inject(&r, "10.0.0.1", 8998, rooms) == 0);
    check_injected(&r, n, rooms);
    baton_pdreq_free(&r);
    return 0;
}
