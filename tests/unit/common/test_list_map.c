/* test_list_map.c — common/list.h (the intrusive list) and common/u64map.h (the u64 map). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "baton/error.h"
#include "common/list.h"
#include "common/u64map.h"

typedef struct {
    int id;
    baton_list_t link;
} item_t;

static int ids_of(baton_list_t *head, int *out, int max)
{
    int n = 0;
    for (baton_list_t *it = head->next; it != head && n < max; it = it->next)
        out[n++] = container_of(it, item_t, link)->id;
    return n;
}

static void test_list_order_and_unlink(void **state)
{
    (void)state;
    baton_list_t head;
    baton_list_init(&head);
    assert_true(baton_list_empty(&head));
    assert_null(baton_list_first(&head));
    item_t it[4] = {{.id = 1}, {.id = 2}, {.id = 3}, {.id = 4}};
    baton_list_push(&head, &it[1].link);       /* 2 */
    baton_list_push(&head, &it[2].link);       /* 2 3 */
    baton_list_push_front(&head, &it[0].link); /* 1 2 3 */
    baton_list_push(&head, &it[3].link);       /* 1 2 3 4 */
    int ids[8];
    assert_int_equal(ids_of(&head, ids, 8), 4);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_int_equal(ids[2], 3);
    assert_int_equal(ids[3], 4);
    assert_ptr_equal(baton_list_first(&head), &it[0].link);
    baton_list_remove(&it[1].link); /* 1 3 4 */
    assert_true(baton_list_empty(&it[1].link)); /* an unlinked node points at itself */
    baton_list_remove(&it[1].link);             /* and unlinking it again changes nothing */
    assert_int_equal(ids_of(&head, ids, 8), 3);
    assert_int_equal(ids[1], 3);
    baton_list_t other;
    baton_list_init(&other);
    baton_list_push(&other, &it[1].link);
    baton_list_splice(&other, &head); /* other: 2 1 3 4, head: empty */
    assert_true(baton_list_empty(&head));
    assert_int_equal(ids_of(&other, ids, 8), 4);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[3], 4);
}

static void test_map_basic(void **state)
{
    (void)state;
    baton_u64map_t m;
    memset(&m, 0, sizeof(m)); /* a zeroed map is empty */
    int a, b;
    assert_null(baton_u64map_get(&m, 7));
    assert_null(baton_u64map_del(&m, 7));
    assert_int_equal(baton_u64map_put(&m, 7, &a), 0);
    assert_int_equal(baton_u64map_put(&m, 7, &b), BATON_EEXIST);
    assert_ptr_equal(baton_u64map_get(&m, 7), &a);
    assert_int_equal(baton_u64map_put(&m, 0, &b), 0); /* key 0 is an ordinary key */
    assert_ptr_equal(baton_u64map_get(&m, 0), &b);
    assert_ptr_equal(baton_u64map_del(&m, 7), &a);
    assert_null(baton_u64map_get(&m, 7));
    assert_ptr_equal(baton_u64map_get(&m, 0), &b);
    assert_int_equal(m.count, 1);
    baton_u64map_free(&m);
}

static void test_map_many_keys_and_churn(void **state)
{
    (void)state;
    static int vals[20000];
    baton_u64map_t m;
    baton_u64map_init(&m);
    for (uint64_t k = 0; k < 20000; k++)
        assert_int_equal(baton_u64map_put(&m, k * 0x9E3779B97F4A7C15ull, &vals[k]), 0);
    for (uint64_t k = 0; k < 20000; k++)
        assert_ptr_equal(baton_u64map_get(&m, k * 0x9E3779B97F4A7C15ull), &vals[k]);
    for (uint64_t k = 0; k < 20000; k += 2)
        assert_ptr_equal(baton_u64map_del(&m, k * 0x9E3779B97F4A7C15ull), &vals[k]);
    for (uint64_t k = 0; k < 20000; k++)
        assert_true(baton_u64map_get(&m, k * 0x9E3779B97F4A7C15ull) ==
                    (k % 2 ? &vals[k] : NULL));
    baton_u64map_free(&m);
    /* Rooms come and go forever: tombstones are swept by rehashing, the table stays small. */
    baton_u64map_init(&m);
    for (uint64_t k = 1; k <= 100000; k++) {
        assert_int_equal(baton_u64map_put(&m, k, &vals[k % 20000]), 0);
        if (k > 8)
            assert_non_null(baton_u64map_del(&m, k - 8));
    }
    assert_int_equal(m.count, 8);
    assert_true(m.cap <= 64);
    baton_u64map_free(&m);
}

static void test_map_delete_while_iterating(void **state)
{
    (void)state;
    static int vals[1000];
    baton_u64map_t m;
    baton_u64map_init(&m);
    for (uint64_t k = 0; k < 1000; k++)
        assert_int_equal(baton_u64map_put(&m, k, &vals[k]), 0);
    size_t it = 0, seen = 0;
    uint64_t key;
    void *v;
    while ((v = baton_u64map_next(&m, &it, &key)) != NULL) {
        assert_ptr_equal(v, &vals[key]);
        assert_ptr_equal(baton_u64map_del(&m, key), v); /* the entry being visited */
        seen++;
    }
    assert_int_equal(seen, 1000); /* every entry visited once, none skipped */
    assert_int_equal(m.count, 0);
    baton_u64map_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_order_and_unlink),
        cmocka_unit_test(test_map_basic),
        cmocka_unit_test(test_map_many_keys_and_churn),
        cmocka_unit_test(test_map_delete_while_iterating),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
