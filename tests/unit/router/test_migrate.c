/* test_migrate.c — unit tests for what the router keeps of a stream and the continuation it
 * sends (src/router/dataplane/migrate.c), and the continuation in PD bodies (pdreq.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "baton/error.h"
#include "router/dataplane/migrate.h"
#include "router/dataplane/pdreq.h"

static void parse(baton_pdreq_t *r, baton_api_t api, const char *body)
{
    baton_pdreq_error_t err;
    int rc = baton_pdreq_parse(r, api, body, strlen(body), &err);
    if (rc != 0)
        fail_msg("%s: %s", body, err.message);
}

static int feed(baton_mig_t *m, const char *payload, baton_buf_t *out)
{
    return baton_mig_event(m, payload, strlen(payload), out);
}

/* The member's JSON (after ,"baton_continuation":) as a jansson value. */
static json_t *member(baton_mig_t *m)
{
    assert_int_equal(baton_mig_build(m), 0);
    const char *pre = ",\"baton_continuation\":";
    assert_true(m->member.len > strlen(pre));
    assert_memory_equal(m->member.data, pre, strlen(pre));
    json_t *j = json_loadb(m->member.data + strlen(pre), m->member.len - strlen(pre), 0, NULL);
    assert_non_null(j);
    return j;
}

static void test_refused(void **state)
{
    (void)state;
    static const struct {
        baton_api_t api;
        const char *body;
    } no[] = {
        {BATON_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}"},
        {BATON_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true,"
                         "\"logprobs\":true}"},
        {BATON_API_RESPONSES, "{\"input\":\"x\",\"stream\":true}"},
    };
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
        baton_pdreq_t r;
        parse(&r, no[i].api, no[i].body);
        assert_null(baton_mig_new(&r));
        baton_pdreq_free(&r);
    }
}

static void test_chat_n2(void **state)
{
    (void)state;
    baton_pdreq_t r;
    parse(&r, BATON_API_CHAT,
          "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true,\"n\":2}");
    baton_mig_t *m = baton_mig_new(&r);
    assert_non_null(m);
    assert_int_equal(m->n_seq, 2);
    m->capable = 1;
    baton_buf_t out = BATON_BUF_INIT;
    const char *ev[] = {
        "{\"id\":\"chatcmpl-1\",\"created\":5,\"choices\":[{\"index\":0,\"delta\":{\"role\":"
        "\"assistant\",\"content\":\"\"}}]}",
        "{\"id\":\"chatcmpl-1\",\"created\":5,\"choices\":[{\"index\":0,\"delta\":{\"content\":"
        "\"all\"}}]}",
        "{\"id\":\"chatcmpl-1\",\"created\":5,\"choices\":[{\"index\":0,\"delta\":{\"content\":"
        "\" more\"},\"finish_reason\":\"length\"}]}",
    };
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(feed(m, ev[i], &out), 0); /* the first stream goes as it came */
    assert_true(baton_mig_possible(m));
    json_t *j = member(m);
    json_t *c = json_object_get(j, "choices");
    assert_int_equal(json_array_size(c), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(c, 0), "text")),
                        "all more");
    assert_true(json_is_true(json_object_get(json_array_get(c, 0), "finished")));
    assert_null(json_object_get(json_array_get(c, 0), "tokens"));
    assert_true(json_is_null(json_array_get(c, 1))); /* nothing of choice 1 yet */
    json_decref(j);

    /* after a migration: the continued stream's events carry the first stream's id */
    m->migrations = 1;
    assert_int_equal(feed(m,
                          "{\"id\":\"chatcmpl-2\",\"created\":9,\"choices\":[{\"index\":1,"
                          "\"delta\":{\"content\":\"all\"}}]}",
                          &out),
                     1);
    assert_true(out.len > 8 && memcmp(out.data, "data: ", 6) == 0);
    assert_memory_equal(out.data + out.len - 2, "\n\n", 2);
    json_t *e = json_loadb(out.data + 6, out.len - 8, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(e, "id")), "chatcmpl-1");
    assert_int_equal(json_integer_value(json_object_get(e, "created")), 5);
    json_decref(e);
    /* an event that already carries them goes as it came */
    assert_int_equal(feed(m,
                          "{\"id\":\"chatcmpl-1\",\"created\":5,\"choices\":[],\"usage\":"
                          "{\"prompt_tokens\":1}}",
                          &out),
                     0);
    assert_true(m->usage);
    assert_int_equal(feed(m, "[DONE]", &out), 0);
    assert_false(baton_mig_possible(m)); /* [DONE] went out */
    baton_buf_free(&out);
    baton_mig_free(m);
    baton_pdreq_free(&r);
}

static void test_generate_batch(void **state)
{
    (void)state;
    baton_pdreq_t r;
    parse(&r, BATON_API_GENERATE, "{\"text\":[\"a\",\"b\"],\"stream\":true}");
    baton_mig_t *m = baton_mig_new(&r);
    assert_non_null(m);
    assert_int_equal(m->n_seq, 2);
    m->capable = 1;
    baton_buf_t out = BATON_BUF_INIT;
    assert_int_equal(feed(m,
                          "{\"text\":\"x\",\"meta_info\":{\"id\":\"g1\",\"finish_reason\":null,"
                          "\"completion_tokens\":1},\"index\":1}",
                          &out),
                     0);
    assert_int_equal(feed(m,
                          "{\"text\":\"x y\",\"meta_info\":{\"id\":\"g1\",\"finish_reason\":null,"
                          "\"completion_tokens\":3},\"index\":1}",
                          &out),
                     0);
    json_t *j = member(m);
    json_t *s1 = json_array_get(json_object_get(j, "choices"), 1);
    assert_string_equal(json_string_value(json_object_get(s1, "text")), "x y"); /* cumulative */
    assert_int_equal(json_integer_value(json_object_get(s1, "tokens")), 3);
    json_decref(j);
    m->migrations = 1;
    assert_int_equal(feed(m,
                          "{\"text\":\"x y z\",\"meta_info\":{\"id\":\"g2\",\"finish_reason\":null,"
                          "\"completion_tokens\":4},\"index\":1}",
                          &out),
                     1);
    assert_non_null(strstr(out.data, "\"id\":\"g1\""));
    /* an index out of range: the stream is not understood, it cannot be continued */
    assert_int_equal(feed(m,
                          "{\"text\":\"q\",\"meta_info\":{\"id\":\"g1\",\"completion_tokens\":1},"
                          "\"index\":7}",
                          &out),
                     0);
    assert_false(baton_mig_possible(m));
    baton_buf_free(&out);
    baton_mig_free(m);
    baton_pdreq_free(&r);
}

static void test_error_event_ends_it(void **state)
{
    (void)state;
    baton_pdreq_t r;
    parse(&r, BATON_API_COMPLETIONS, "{\"prompt\":\"x\",\"stream\":true}");
    baton_mig_t *m = baton_mig_new(&r);
    m->capable = 1;
    baton_buf_t out = BATON_BUF_INIT;
    assert_int_equal(feed(m, "{\"error\":{\"message\":\"no\"}}", &out), 0);
    assert_false(baton_mig_possible(m));
    baton_buf_free(&out);
    baton_mig_free(m);
    baton_pdreq_free(&r);
}

static void test_pd_body_carries_it(void **state)
{
    (void)state;
    baton_pdreq_t r;
    parse(&r, BATON_API_CHAT,
          "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true,"
          "\"baton_continuation\":{\"choices\":[null]}}");
    uint64_t room = 7;
    baton_buf_t extra = BATON_BUF_INIT;
    baton_buf_append_str(&extra, ",\"baton_continuation\":{\"choices\":[{\"text\":\"a\"}]}");
    r.extra = &extra;
    assert_int_equal(baton_pdreq_inject(&r, "10.0.0.1", 8998, &room), 0);
    json_t *j = json_loadb(r.out.data, r.out.len, 0, NULL);
    assert_non_null(j);
    json_t *c =
        json_array_get(json_object_get(json_object_get(j, "baton_continuation"), "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c, "text")), "a"); /* the router's */
    assert_int_equal(json_integer_value(json_object_get(j, "bootstrap_room")), 7);
    /* the client's own was left out: one member of that name */
    const char *first = strstr(r.out.data, "baton_continuation");
    assert_null(strstr(first + 1, "baton_continuation"));
    json_decref(j);
    baton_buf_free(&extra);
    baton_pdreq_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_chat_n2),
        cmocka_unit_test(test_generate_batch),
        cmocka_unit_test(test_error_event_ends_it),
        cmocka_unit_test(test_pd_body_carries_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
