/* store/bench_scale.c — `baton-store bench --meta-objects N`: the master's object table (the code
 * the master runs, in this process, one thread) filled with N committed objects: heap bytes per
 * object and exists lookups per second, the figures that size a master. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "store/meta.h"

int baton__bench_meta_scale(uint64_t n);

/* The i-th key: 72 bytes, spread like hashes of token prefixes. */
static void key_of(char *buf, size_t cap, uint64_t i)
{
    snprintf(buf, cap, "%064llx_%d_k", (unsigned long long)(i * 2654435761u), (int)(i % 8));
}

int baton__bench_meta_scale(uint64_t n)
{
    baton__meta_config_t cfg;
    baton__meta_config_init(&cfg);
    baton__meta_t *m = NULL;
    uint32_t node, seg;
    if (n == 0 || baton__meta_create(&cfg, &m) != 0 || baton__meta_node_add(m, "n0", &node) != 0 ||
        baton__meta_segment_add(m, node, 1ull << 40, &seg) != 0) {
        fprintf(stderr, "baton-store bench: cannot set up the object table\n");
        return 2;
    }
    char key[96];
    struct mallinfo2 before = mallinfo2();
    uint64_t t0 = uv_hrtime();
    for (uint64_t i = 0; i < n; i++) {
        key_of(key, sizeof(key), i);
        baton__put_req_t pr = {NULL, key, 64 * 1024, 0, 1, 0};
        baton__obj_view_t v;
        if (baton__meta_put_start(m, &pr, 1, &v) != 0 ||
            baton__meta_put_commit(m, NULL, key, v.put_id, 1) != 0) {
            fprintf(stderr, "baton-store bench: put %llu failed\n", (unsigned long long)i);
            return 2;
        }
    }
    uint64_t t1 = uv_hrtime();
    struct mallinfo2 after = mallinfo2();
    /* the same keys formatted without a lookup: what the lookup loop spends on keys alone */
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        key_of(key, sizeof(key), i);
        sum += (uint8_t)key[5];
    }
    uint64_t t2 = uv_hrtime();
    uint64_t hits = 0;
    for (uint64_t i = 0; i < n; i++) {
        key_of(key, sizeof(key), i);
        hits += (uint64_t)baton__meta_exists(m, NULL, key, 2, 1, NULL, NULL);
    }
    uint64_t t3 = uv_hrtime();
    double fmt_s = (double)(t2 - t1) / 1e9, look_s = (double)(t3 - t2) / 1e9;
    double net_s = look_s > fmt_s ? look_s - fmt_s : look_s;
    printf("{\"meta_objects\":%llu,\"key_bytes\":72,\"heap_bytes_per_object\":%.0f,"
           "\"puts_per_s\":%.0f,\"exists_per_s\":%.0f,\"exists_per_s_without_key_formatting\":%.0f,"
           "\"hits\":%llu,\"check\":%llu}\n",
           (unsigned long long)n, (double)(after.uordblks - before.uordblks) / (double)n,
           (double)n / ((double)(t1 - t0) / 1e9), (double)n / look_s, (double)n / net_s,
           (unsigned long long)hits, (unsigned long long)(sum & 1));
    fflush(stdout);
    baton__meta_destroy(m);
    return hits == n ? 0 : 1;
}
