/* test_pdproto.c — unit tests for the vLLM PD protocol bodies and the SGLang DP-attention rank
 * and room arithmetic (src/router/dataplane/pdproto.c), and protocol fields at registration. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "baton/error.h"
#include "router/dataplane/pdproto.h"
#include "router/dataplane/pdreq.h"
#include "router/control/registry.h"

static json_t *load(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j)
        fail_msg("bad JSON in test: %s", e.text);
    return j;
}

/* A client body parsed as the router does (the text must outlive the request). */
static baton_pdreq_t *parse_req(baton_api_t api, const char *text)
{
    static baton_pdreq_t r;
    baton_pdreq_error_t err;
    if (baton_pdreq_parse(&r, api, text, strlen(text), &err) != 0)
        fail_msg("bad request in test: %s", err.message);
    return &r;
}

/* Asserts that buf holds JSON equal to `want` (text). */
static void assert_json_buf(const baton_buf_t *buf, const char *want)
{
    json_error_t e;
    json_t *got = json_loadb(buf->data, buf->len, 0, &e), *w = load(want);
    if (!got || !json_equal(got, w))
        fail_msg("got %.*s\nwant %s", (int)buf->len, buf->data, want);
    json_decref(got);
    json_decref(w);
}

static const char *CLIENT = "{\"model\":\"m\",\"prompt\":\"hi\",\"stream\":true,\"max_tokens\":9,"
                            "\"max_completion_tokens\":9,\"min_tokens\":3,"
                            "\"min_completion_tokens\":3,\"stream_options\":{\"a\":1},\"n\":2}";

static void test_nixl_prefill(void **state)
{
    (void)state;
    baton_pdreq_t *root = parse_req(BATON_API_COMPLETIONS, CLIENT);
    baton_buf_t out = BATON_BUF_INIT, again = BATON_BUF_INIT;
    assert_int_equal(baton_pdproto_nixl_prefill(root, &out), 0);
    assert_json_buf(&out, "{\"model\":\"m\",\"prompt\":\"hi\",\"stream\":false,\"max_tokens\":1,"
                          "\"max_completion_tokens\":1,\"n\":2,\"kv_transfer_params\":{"
                          "\"do_remote_decode\":true,\"do_remote_prefill\":false,"
                          "\"remote_engine_id\":null,\"remote_block_ids\":null,"
                          "\"remote_host\":null,\"remote_port\":null}}");
    /* the client's body is untouched: a retry builds the same bytes again */
    assert_int_equal(baton_pdproto_nixl_prefill(root, &again), 0);
    assert_int_equal(again.len, out.len);
    assert_memory_equal(again.data, out.data, out.len);
    baton_pdreq_free(root);
    /* max_completion_tokens only when the client sent it */
    baton_pdreq_t *plain = parse_req(BATON_API_COMPLETIONS, "{\"prompt\":\"x\"}");
    assert_int_equal(baton_pdproto_nixl_prefill(plain, &out), 0);
    assert_null(strstr(out.data, "max_completion_tokens"));
    baton_pdreq_free(plain);
    baton_buf_free(&again);
    baton_buf_free(&out);
}

/* --priority-to-workers: every vLLM leg carries the class's integer in place of the client's
 * own priority; without it the client's field passes as it came. */
static void test_priority_member(void **state)
{
    (void)state;
    baton_pdreq_t *r =
        parse_req(BATON_API_COMPLETIONS, "{\"prompt\":\"x\",\"priority\":7,\"max_tokens\":4}");
    baton_buf_t pb = BATON_BUF_INIT, db = BATON_BUF_INIT;
    assert_int_equal(baton_pdproto_mooncake(r, "t1", "e1", "h:1", &pb, &db), 0);
    assert_non_null(strstr(pb.data, "\"priority\":7"));
    assert_non_null(strstr(db.data, "\"priority\":7"));
    r->priority_set = 1;
    r->priority = -1;
    assert_int_equal(baton_pdproto_mooncake(r, "t1", "e1", "h:1", &pb, &db), 0);
    assert_json_buf(&pb, "{\"prompt\":\"x\",\"stream\":false,\"max_tokens\":1,"
                         "\"kv_transfer_params\":{\"do_remote_decode\":true,"
                         "\"do_remote_prefill\":false,\"transfer_id\":\"t1\"},\"priority\":-1}");
    assert_json_buf(&db, "{\"prompt\":\"x\",\"max_tokens\":4,\"kv_transfer_params\":{"
                         "\"do_remote_decode\":false,\"do_remote_prefill\":true,"
                         "\"transfer_id\":\"t1\",\"remote_engine_id\":\"e1\","
                         "\"remote_bootstrap_addr\":\"h:1\"},\"priority\":-1}");
    assert_int_equal(baton_pdproto_nixl_prefill(r, &pb), 0);
    assert_non_null(strstr(pb.data, "\"priority\":-1"));
    assert_null(strstr(pb.data, "\"priority\":7"));
    baton_pdreq_free(r);
    baton_buf_free(&pb);
    baton_buf_free(&db);
}

static void test_nixl_decode(void **state)
{
    (void)state;
    baton_pdreq_t *root = parse_req(BATON_API_COMPLETIONS, CLIENT);
    json_t *before = load(CLIENT);
    baton_buf_t out = BATON_BUF_INIT, first = BATON_BUF_INIT;
    char why[128], rid[64];
    const char *ans = "{\"id\":\"x\",\"kv_transfer_params\":{\"do_remote_prefill\":true,"
                      "\"remote_block_ids\":[4,5],\"remote_engine_id\":\"e\",\"tp_size\":2,"
                      "\"remote_request_id\":\"r\",\"remote_host\":\"h\",\"remote_port\":7}}";
    assert_int_equal(
        baton_pdproto_nixl_decode(root, ans, strlen(ans), &out, rid, sizeof(rid), why, sizeof(why)),
        0);
    assert_string_equal(rid, "r");
    json_t *want = json_deep_copy(before), *ans_j = load(ans);
    json_object_set_new(want, "kv_transfer_params",
                        json_deep_copy(json_object_get(ans_j, "kv_transfer_params")));
    json_decref(ans_j);
    char *wt = json_dumps(want, JSON_COMPACT);
    assert_json_buf(&out, wt);
    free(wt);
    json_decref(want);
    /* the client's body is untouched: the same answer builds the same bytes again */
    assert_int_equal(baton_buf_append(&first, out.data, out.len), 0);
    assert_int_equal(
        baton_pdproto_nixl_decode(root, ans, strlen(ans), &out, rid, sizeof(rid), why, sizeof(why)),
        0);
    assert_int_equal(first.len, out.len);
    assert_memory_equal(first.data, out.data, out.len);
    /* missing, null, not an object, not JSON: refused with a reason */
    const char *bad[] = {"{\"id\":1}", "{\"kv_transfer_params\":null}",
                         "{\"kv_transfer_params\":[1]}", "not json", "[1]"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why[0] = 0;
        assert_int_equal(baton_pdproto_nixl_decode(root, bad[i], strlen(bad[i]), &out, rid,
                                                   sizeof(rid), why, sizeof(why)),
                         BATON_EUPSTREAM);
        assert_true(why[0] != 0);
    }
    baton_pdreq_free(root);
    json_decref(before);
    baton_buf_free(&first);
    baton_buf_free(&out);
}

static void test_mooncake(void **state)
{
    (void)state;
    baton_pdreq_t *root = parse_req(BATON_API_COMPLETIONS,
                                    "{\"prompt\":\"p\",\"kv_transfer_params\":{\"client\":1}}");
    baton_buf_t p = BATON_BUF_INIT, d = BATON_BUF_INIT;
    assert_int_equal(baton_pdproto_mooncake(root, "xfer-1", "E", "http://h:1", &p, &d), 0);
    assert_json_buf(&p, "{\"prompt\":\"p\",\"stream\":false,\"max_tokens\":1,"
                        "\"kv_transfer_params\":{\"do_remote_decode\":true,"
                        "\"do_remote_prefill\":false,\"transfer_id\":\"xfer-1\"}}");
    assert_json_buf(&d, "{\"prompt\":\"p\",\"kv_transfer_params\":{\"do_remote_decode\":false,"
                        "\"do_remote_prefill\":true,\"transfer_id\":\"xfer-1\","
                        "\"remote_engine_id\":\"E\",\"remote_bootstrap_addr\":\"http://h:1\"}}");
    /* the client's own value is still in the request afterwards */
    const baton_json_val_t *ktp = baton_pdreq_get(root, "kv_transfer_params");
    baton_json_val_t client;
    assert_non_null(ktp);
    assert_true(baton_json_object_get(ktp, "client", &client));
    assert_int_equal(baton_json_int(&client), 1);
    baton_pdreq_free(root);
    baton_buf_free(&p);
    baton_buf_free(&d);
}

static int gcd(int a, int b)
{
    return b ? gcd(b, a % b) : a;
}

static void test_dp_ranks_and_rooms(void **state)
{
    (void)state;
    const int sizes[] = {0, 1, 2, 3, 4, 6, 8, 16, 1024};
    const uint64_t randoms[] = {0, 1, 12345, (uint64_t)INT64_MAX, UINT64_MAX, 1ull << 62};
    size_t ns = sizeof(sizes) / sizeof(sizes[0]);
    for (size_t a = 0; a < ns; a++) {
        for (size_t b = 0; b < ns; b++) {
            int dp_p = sizes[a], dp_d = sizes[b];
            int mp = dp_p > 1 ? dp_p : 1, md = dp_d > 1 ? dp_d : 1;
            for (int rank_p = 0; rank_p < mp; rank_p += (mp > 8 ? 97 : 1)) {
                int seen_d[1024] = {0}, n_seen = 0;
                for (unsigned turn = 0; turn < (unsigned)md; turn++) {
                    int rank_d = baton_pdproto_dp_decode_rank(dp_p, rank_p, dp_d, turn);
                    assert_in_range(rank_d, 0, md - 1);
                    assert_int_equal(rank_d % gcd(mp, md), rank_p % gcd(mp, md));
                    if (!seen_d[rank_d]++)
                        n_seen++;
                    for (size_t k = 0; k < sizeof(randoms) / sizeof(randoms[0]); k++) {
                        uint64_t room =
                            baton_pdproto_dp_room(randoms[k], dp_p, rank_p, dp_d, rank_d);
                        assert_true(room <= (uint64_t)INT64_MAX);
                        assert_int_equal(room % (uint64_t)mp, (uint64_t)rank_p);
                        assert_int_equal(room % (uint64_t)md, (uint64_t)rank_d);
                    }
                }
                /* round robin reaches every compatible decode rank */
                assert_int_equal(n_seen, md / gcd(mp, md));
            }
        }
    }
}

static void test_dp_body(void **state)
{
    (void)state;
    baton_pdreq_t *root = parse_req(BATON_API_GENERATE, "{\"text\":\"x\",\"bootstrap_room\":5}");
    baton_buf_t out = BATON_BUF_INIT;
    assert_int_equal(baton_pdproto_dp_body(root, NULL, 1, -1, &out), 0);
    assert_json_buf(&out, "{\"text\":\"x\",\"bootstrap_room\":5,\"routed_dp_rank\":1}");
    assert_int_equal(baton_pdproto_dp_body(root, NULL, 0, 3, &out), 0);
    assert_json_buf(&out, "{\"text\":\"x\",\"bootstrap_room\":5,\"routed_dp_rank\":0,"
                          "\"disagg_prefill_dp_rank\":3}");
    assert_null(baton_pdreq_get(root, "routed_dp_rank"));
    /* injected bootstrap members replace the client's; the client's ranks never pass */
    baton_pdreq_free(root);
    root = parse_req(BATON_API_GENERATE, "{\"text\":\"x\",\"bootstrap_room\":5,"
                                         "\"routed_dp_rank\":9,\"disagg_prefill_dp_rank\":9}");
    uint64_t room = 6;
    baton_buf_t bs = BATON_BUF_INIT;
    assert_int_equal(baton_pdreq_bootstrap_members(root, "h", 7, &room, &bs), 0);
    assert_int_equal(baton_pdproto_dp_body(root, bs.data, 2, -1, &out), 0);
    assert_json_buf(&out, "{\"text\":\"x\",\"bootstrap_host\":\"h\",\"bootstrap_port\":7,"
                          "\"bootstrap_room\":6,\"routed_dp_rank\":2}");
    baton_buf_free(&bs);
    baton_pdreq_free(root);
    baton_buf_free(&out);
}

static int add(baton_registry_t *reg, const char *url, baton_worker_role_t role,
               baton_pd_protocol_t proto, const char *engine, const char *addr, int bport, int dp)
{
    baton_worker_spec_t s;
    baton_worker_spec_init(&s);
    s.url = url;
    s.role = role;
    s.pd_protocol = proto;
    s.engine_id = engine;
    s.bootstrap_addr = addr;
    s.bootstrap_port = bport;
    s.dp_size = dp;
    char err[256] = "";
    baton_worker_t *w = NULL;
    int rc = baton_registry_add(reg, &s, &w, err, sizeof(err));
    if (rc == 0) {
        assert_int_equal(w->pd_protocol, proto == BATON_PD_UNSET ? BATON_PD_VLLM_NIXL : proto);
        baton_worker_unref(w);
    } else {
        assert_true(err[0] != 0);
    }
    return rc;
}

static void test_registry_fields(void **state)
{
    (void)state;
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    baton_registry_set_pd_default(reg, BATON_PD_VLLM_NIXL);
    const baton_worker_role_t P = BATON_ROLE_PREFILL, D = BATON_ROLE_DECODE;
    /* refused: each a field of another protocol, or a missing one */
    assert_int_equal(add(reg, "http://a:1", P, BATON_PD_UNSET, NULL, NULL, 8998, 0), BATON_EINVAL);
    assert_int_equal(add(reg, "http://a:1", D, BATON_PD_UNSET, NULL, NULL, -1, 2), BATON_EINVAL);
    assert_int_equal(add(reg, "http://a:1", P, BATON_PD_VLLM_MOONCAKE, NULL, NULL, -1, 0),
                     BATON_EINVAL);
    assert_int_equal(add(reg, "http://a:1", P, BATON_PD_VLLM_MOONCAKE, "E", "h:1", -1, 0),
                     BATON_EINVAL);
    assert_int_equal(add(reg, "http://a:1", D, BATON_PD_VLLM_MOONCAKE, "E", "http://h:1", -1, 0),
                     BATON_EINVAL);
    assert_int_equal(
        add(reg, "http://a:1", BATON_ROLE_REGULAR, BATON_PD_VLLM_NIXL, NULL, NULL, -1, 0),
        BATON_EINVAL);
    assert_int_equal(add(reg, "http://a:1", P, BATON_PD_SGLANG, NULL, NULL, -1, 1025),
                     BATON_EINVAL);
    assert_int_equal(add(reg, "http://a:1", P, (baton_pd_protocol_t)7, NULL, NULL, -1, 0),
                     BATON_EINVAL);
    assert_int_equal(baton_registry_size(reg), 0);
    /* accepted */
    assert_int_equal(add(reg, "http://a:1", P, BATON_PD_UNSET, NULL, NULL, -1, 0), 0);
    assert_int_equal(add(reg, "http://b:1", P, BATON_PD_VLLM_MOONCAKE, "E", "http://h:1", -1, 0),
                     0);
    assert_int_equal(add(reg, "http://c:1", P, BATON_PD_SGLANG, NULL, NULL, 8998, 4), 0);
    baton_worker_t *w = baton_registry_find_url(reg, "http://b:1");
    assert_non_null(w);
    assert_string_equal(w->engine_id, "E");
    assert_string_equal(w->bootstrap_addr, "http://h:1");
    baton_worker_unref(w);
    baton_registry_destroy(reg);

    baton_pd_protocol_t p;
    assert_int_equal(baton_pd_protocol_parse("vllm-mooncake", &p), 0);
    assert_int_equal(p, BATON_PD_VLLM_MOONCAKE);
    assert_string_equal(baton_pd_protocol_name(p), "vllm-mooncake");
    assert_int_equal(baton_pd_protocol_parse("VLLM-NIXL", &p), BATON_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nixl_prefill),       cmocka_unit_test(test_nixl_decode),
        cmocka_unit_test(test_priority_member),    cmocka_unit_test(test_mooncake),
        cmocka_unit_test(test_dp_ranks_and_rooms), cmocka_unit_test(test_dp_body),
        cmocka_unit_test(test_registry_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
