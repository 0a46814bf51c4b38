/* test_tier_key.c — HiCache page keys against vectors that python3's hashlib computes at test
 * time with SGLang's rule (an independent implementation), and the object names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/tier_key.h"

/* SGLang's get_hash_str, written from its definition: prior key's bytes, then each id as u32
 * little-endian; chained page by page. Prints one key per line. */
static const char PY[] =
    "import hashlib,sys\n"
    "P=int(sys.argv[1]); ids=[int(x) for x in sys.argv[2].split(',')]\n"
    "prev=None\n"
    "for i in range(len(ids)//P):\n"
    "  h=hashlib.sha256()\n"
    "  if prev: h.update(bytes.fromhex(prev))\n"
    "  for t in ids[i*P:(i+1)*P]: h.update((t & 0xffffffff).to_bytes(4,'little',signed=False))\n"
    "  prev=h.hexdigest(); print(prev)\n";

/* Runs the reference over ids and compares every key. */
static void check_against_python(const int64_t *ids, uint32_t n, uint32_t P)
{
    char *arg = malloc((size_t)n * 24 + 1);
    assert_non_null(arg);
    size_t o = 0;
    for (uint32_t i = 0; i < n; i++)
        o += (size_t)sprintf(arg + o, "%s%lld", i ? "," : "", (long long)ids[i]);
    char path[] = "/tmp/baton-tierkey-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs(PY, f);
    fclose(f);
    char *cmd = malloc(o + 200);
    sprintf(cmd, "python3 %s %u %s", path, P, arg);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    wk_tier_key_t *keys = calloc(n / P + 1, sizeof(*keys));
    uint32_t got = wk_tier_keys(ids, n, P, UINT32_MAX, keys);
    assert_int_equal(got, n / P);
    char line[128];
    uint32_t i = 0;
    while (fgets(line, sizeof(line), p)) {
        line[strcspn(line, "\n")] = '\0';
        assert_true(i < got);
        assert_string_equal(keys[i].hex, line);
        i++;
    }
    assert_int_equal(pclose(p), 0);
    assert_int_equal(i, got);
    unlink(path);
    free(keys);
    free(cmd);
    free(arg);
}

static void test_keys_match_reference(void **state)
{
    (void)state;
    int64_t ids[200];
    for (int i = 0; i < 200; i++)
        ids[i] = (int64_t)((uint64_t)i * 2654435761u % 151936);
    check_against_python(ids, 200, 16); /* 12 pages, 8 tokens left over */
    check_against_python(ids, 64, 64);
    check_against_python(ids, 7, 1);
    /* ids at the ends of u32 and beyond it (taken modulo 2^32, as the reference does) */
    int64_t odd[8] = {0, 1, 0xffffffffLL, 0x7fffffffLL, 0x100000001LL, 42, 151935, 65536};
    check_against_python(odd, 8, 4);
}

static void test_chain_and_limits(void **state)
{
    (void)state;
    int64_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {9, 2, 3, 4, 5, 6, 7, 8};
    wk_tier_key_t ka[2], kb[2];
    assert_int_equal(wk_tier_keys(a, 8, 4, 2, ka), 2);
    assert_int_equal(wk_tier_keys(b, 8, 4, 1, kb), 1); /* max_pages bounds it */
    wk_tier_keys(b, 8, 4, 2, kb);
    /* the same second page after a different first one gets another key */
    assert_string_not_equal(ka[1].hex, kb[1].hex);
    assert_int_equal(wk_tier_keys(a, 3, 4, 9, ka), 0); /* no whole page */
    /* the empty-hash first page of SGLang: sha256 of the ids alone */
    int64_t z[1] = {0};
    wk_tier_keys(z, 1, 1, 1, ka);
    assert_string_equal(ka[0].hex,
                        "df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119");
}

static void test_object_names(void **state)
{
    (void)state;
    wk_tier_key_t k;
    memset(k.hex, 'a', WK_TIER_KEY_HEX);
    k.hex[WK_TIER_KEY_HEX] = '\0';
    char out[256];
    int n = wk_tier_object_name(out, sizeof(out), "meta-llama/Llama-3-8B", &k, 3, 'k');
    assert_true(n > 0);
    assert_string_equal(out,
                        "meta-llama-Llama-3-8B_"
                        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa_3_k");
    assert_int_equal(n, (int)strlen(out));
    wk_tier_object_name(out, sizeof(out), NULL, &k, 0, 'v');
    assert_string_equal(out,
                        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa_0_v");
    assert_int_equal(wk_tier_object_name(out, 60, "m", &k, 0, 'k'), -1); /* does not fit */
    char big[300];
    memset(big, 'm', 299);
    big[299] = '\0';
    assert_int_equal(wk_tier_object_name(out, sizeof(out), big, &k, 0, 'k'), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys_match_reference),
        cmocka_unit_test(test_chain_and_limits),
        cmocka_unit_test(test_object_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
