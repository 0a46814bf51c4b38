/* test_store_kvev_parse.c — the master's check of a PUT_START's blocks (the KV blocks objects
 * hold, for KV events): what a well-formed client sends is taken, every malformed or hostile
 * form is refused as a whole, and random bytes never crash it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/master.h"

static int parse(const char *text, uint32_t n_items, size_t *n_blocks)
{
    baton__sp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_PUT_START;
    m.n_items = n_items;
    m.text = (char *)text;
    m.text_len = (uint32_t)strlen(text);
    baton__mkvev_req_t r;
    int rc = baton__mkvev_parse(&m, &r);
    if (n_blocks)
        *n_blocks = r.blocks ? json_array_size(r.blocks) : 0;
    json_decref(r.blocks);
    return rc;
}

static void test_well_formed(void **state)
{
    (void)state;
    size_t n;
    assert_int_equal(parse("", 3, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(parse("[]", 3, &n), 0);
    assert_int_equal(parse("[[0,101,null,[1,2,3],null],[2,-5,101,[4294967295],7]]", 3, &n), 0);
    assert_int_equal(n, 2);
}

static void test_refused(void **state)
{
    (void)state;
    char big[4200 * 3 + 64];
    char *p = big + sprintf(big, "[[0,1,null,[");
    for (int i = 0; i < 4097; i++)
        p += sprintf(p, i ? ",1" : "1");
    sprintf(p, "],null]]");
    const char *bad[] = {
        "not json",
        "{}",
        "[1]",
        "[[0,1,null,[1]]]",        /* 4 fields */
        "[[0,1,null,[1],null,6]]", /* 6 fields */
        "[[3,1,null,[1],null]]",   /* index past the batch */
        "[[-1,1,null,[1],null]]",
        "[[0.5,1,null,[1],null]]",
        "[[0,\"h\",null,[1],null]]",
        "[[0,1,\"p\",[1],null]]",
        "[[0,1,null,[],null]]", /* no token ids */
        "[[0,1,null,[-1],null]]",
        "[[0,1,null,[4294967296],null]]",
        "[[0,1,null,[1.5],null]]",
        "[[0,1,null,[[1]],null]]",
        "[[0,1,null,1,null]]",
        "[[0,1,null,[1],\"lora\"]]",
        "[[0,1,null,[1],null],[1,1,null,[1],null],[2,1,null,[1],null],[0,1,null,[1],null]]",
        big, /* 4097 token ids */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        size_t n = 99;
        assert_int_equal(parse(bad[i], 3, &n), BATON_XFER_EINVAL);
        assert_int_equal(n, 0);
    }
}

static void test_random_bytes(void **state)
{
    (void)state;
    srand(7);
    char buf[128];
    const char alphabet[] = "[],0123456789-null\"{}:. e";
    for (int round = 0; round < 20000; round++) {
        size_t len = (size_t)(rand() % (int)(sizeof(buf) - 1));
        for (size_t i = 0; i < len; i++)
            buf[i] = alphabet[rand() % (int)(sizeof(alphabet) - 1)];
        buf[len] = '\0';
        int rc = parse(buf, (uint32_t)(rand() % 4), NULL);
        assert_true(rc == 0 || rc == BATON_XFER_EINVAL);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_well_formed),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_random_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
