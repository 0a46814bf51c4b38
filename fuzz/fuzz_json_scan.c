/* fuzz/fuzz_json_scan.c — libFuzzer harness for the one-pass body scanner: the same bytes go to
 * baton_json_scan and to json_loadb(JSON_DECODE_ANY), which must agree on valid/invalid and on
 * every value read (top-level keys and types, strings decoded, integers, nested lookups). */
#include <string.h>

#include <jansson.h>

#include "baton/error.h"
#include "common/json_scan.h"
#include "fuzz_check.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static baton_json_type_t type_of(const json_t *j)
{
    return (baton_json_type_t)json_typeof(j); /* json_scan.h keeps jansson's order */
}

/* The decoded string equals jansson's (length first: jansson's strings may not hold NUL here). */
static void check_string(const baton_json_val_t *v, const char *s, size_t len)
{
    baton_buf_t b = BATON_BUF_INIT;
    CHECK(baton_json_str_append(v, &b) == 0);
    CHECK(b.len == len && (len == 0 || memcmp(b.data, s, len) == 0));
    CHECK(baton_json_str_len(v) == len);
    CHECK(baton_json_str_eq(v, s) == (strlen(s) == len));
    baton_buf_free(&b);
}

/* One value read through the scanner's readers against jansson's tree, nested containers too. */
static void check_value(const baton_json_val_t *v, const json_t *j, int depth)
{
    CHECK(v->type == type_of(j));
    switch (v->type) {
    case BATON_JSON_STRING:
        check_string(v, json_string_value(j), json_string_length(j));
        break;
    case BATON_JSON_INTEGER:
        CHECK(baton_json_int(v) == json_integer_value(j));
        break;
    case BATON_JSON_REAL: {
        double a = baton_json_number(v), b = json_real_value(j);
        CHECK(a == b || (a != a && b != b));
        break;
    }
    case BATON_JSON_ARRAY: {
        baton_json_iter_t it;
        baton_json_val_t e;
        size_t i = 0;
        CHECK(baton_json_array_size(v) == json_array_size(j));
        baton_json_iter_init(&it, v);
        while (baton_json_array_next(&it, &e)) {
            CHECK(i < json_array_size(j));
            if (depth < 64)
                check_value(&e, json_array_get(j, i), depth + 1);
            i++;
        }
        CHECK(i == json_array_size(j));
        break;
    }
    case BATON_JSON_OBJECT: {
        baton_json_iter_t it;
        baton_json_val_t k, e, last;
        size_t n = 0;
        baton_json_iter_init(&it, v);
        while (baton_json_object_next(&it, &k, &e)) {
            CHECK(k.type == BATON_JSON_STRING);
            baton_buf_t key = BATON_BUF_INIT;
            CHECK(baton_json_str_append(&k, &key) == 0);
            json_t *je = json_object_get(j, key.data); /* no NUL in keys: rejected */
            CHECK(je != NULL);
            /* The last duplicate is the one jansson kept. */
            CHECK(baton_json_object_get(v, key.data, &last) == 1);
            if (depth < 64)
                check_value(&last, je, depth + 1);
            baton_buf_free(&key);
            n++;
        }
        CHECK(n >= json_object_size(j));
        break;
    }
    default:
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    baton_json_member_t space[4];
    baton_json_scan_t s;
    json_error_t jerr;
    baton_json_scan_init(&s, space, 4);
    int rc = baton_json_scan(&s, (const char *)data, size);
    json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY, &jerr);
    if (!j && json_error_code(&jerr) == json_error_out_of_memory)
        return 0;
    CHECK(rc == 0 || rc == BATON_EINVAL);
    if (!j) {
        if (rc == 0)
            fprintf(stderr, "scanner accepts, jansson rejects: %s\n", jerr.text);
        CHECK(rc == BATON_EINVAL);
        CHECK(s.err_text != NULL && s.err_pos <= size);
        baton_json_scan_free(&s);
        return 0;
    }
    if (rc != 0)
        fprintf(stderr, "scanner rejects at %zu (%s), jansson accepts\n", s.err_pos, s.err_text);
    CHECK(rc == 0);
    check_value(&s.root, j, 0);
    if (json_is_object(j)) {
        /* The top-level index: every member in order, the last duplicate winning. */
        CHECK(s.n_members >= json_object_size(j));
        for (size_t i = 0; i < s.n_members; i++) {
            baton_buf_t key = BATON_BUF_INIT;
            CHECK(baton_json_str_append(&s.members[i].key, &key) == 0);
            const baton_json_member_t *m = baton_json_scan_get(&s, key.data);
            CHECK(m != NULL && m >= &s.members[i]);
            json_t *je = json_object_get(j, key.data);
            CHECK(je != NULL);
            check_value(&m->val, je, 1);
            baton_buf_free(&key);
        }
        /* Splicing out the first member's key and adding one: still a JSON object jansson reads,
         * without that key and with the new one. */
        baton_json_splice_t sp;
        baton_buf_t out = BATON_BUF_INIT;
        baton_buf_t drop = BATON_BUF_INIT;
        const char *dk = "";
        if (s.n_members) {
            CHECK(baton_json_str_append(&s.members[0].key, &drop) == 0);
            dk = drop.data;
        }
        static const char tail[] = ",\"__baton_added\":[1,\"x\"]}";
        CHECK(baton_json_splice(&s, &dk, s.n_members ? 1 : 0, tail, sizeof(tail) - 1, &sp) == 0);
        CHECK(baton_json_splice_flatten(&sp, &out) == 0);
        CHECK(out.len == sp.total);
        json_t *o = json_loadb(out.data, out.len, 0, &jerr);
        CHECK(json_is_object(o));
        if (s.n_members && strcmp(dk, "__baton_added") != 0)
            CHECK(json_object_get(o, dk) == NULL);
        CHECK(json_array_size(json_object_get(o, "__baton_added")) == 2);
        CHECK(json_object_size(o) ==
              json_object_size(j) - (s.n_members && json_object_get(j, dk) ? 1 : 0) +
                  (json_object_get(j, "__baton_added") && strcmp(dk, "__baton_added") ? 0 : 1));
        json_decref(o);
        baton_buf_free(&out);
        baton_buf_free(&drop);
        baton_json_splice_free(&sp);
    } else {
        CHECK(s.n_members == 0);
    }
    json_decref(j);
    baton_json_scan_free(&s);
    return 0;
}
