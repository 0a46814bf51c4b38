/* kvev_probe.c — the test suite's handle on src/kvevents over real sockets, for
 * tests/integration/test_kv_events.py: `sub` subscribes and prints each callback as a JSON line;
 * `pub` publishes sample batches in a chosen encoding and reply form and serves replays. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "kvevents/index.h"
#include "kvevents/zsock.h"

static void print_hash(const baton_kvev_hash_t *h)
{
    if (!h->len) {
        printf("%lld", (long long)h->i);
        return;
    }
    printf("\"");
    for (int k = 0; k < h->len; k++)
        printf("%02x", h->b[k]);
    printf("\"");
}

static void on_event(void *ud, baton_kvev_sub_event_t ev, int64_t seq, const baton_kvev_batch_t *b,
                     const char *why)
{
    long *left = ud;
    if (ev != BATON_KVEV_SUB_BATCH) {
        printf("{\"ev\": \"%s\", \"seq\": %lld, \"why\": \"%s\"}\n",
               ev == BATON_KVEV_SUB_RESET ? "reset" : "error", (long long)seq, why);
        fflush(stdout);
        return;
    }
    printf("{\"ev\": \"batch\", \"seq\": %lld, \"dp\": %d, \"skipped\": %u, \"events\": [", (long long)seq,
           b->dp_rank, b->n_skipped);
    for (uint32_t k = 0; k < b->n_events; k++) {
        const baton_kvev_event_t *e = &b->events[k];
        static const char *const names[] = {"", "stored", "removed", "cleared"};
        printf("%s{\"type\": \"%s\", \"medium\": \"%s\", \"hashes\": [", k ? ", " : "", names[e->type],
               e->medium);
        for (uint32_t j = 0; j < e->n_hashes; j++) {
            printf(j ? ", " : "");
            print_hash(&e->hashes[j]);
        }
        printf("]");
        if (e->type == BATON_KVEV_STORED) {
            printf(", \"parent\": ");
            if (e->has_parent)
                print_hash(&e->parent);
            else
                printf("null");
            printf(", \"block_size\": %u, \"tokens\": [", e->block_size);
            for (uint32_t j = 0; j < e->n_tokens; j++)
                printf("%s%u", j ? ", " : "", e->token_ids[j]);
            printf("]");
        }
        printf("}");
    }
    printf("]}\n");
    fflush(stdout);
    (*left)--;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* sub ENDPOINT REPLAY|- BATCHES TIMEOUT_MS [sync]: exits 0 after BATCHES batches, 2 on an error
 * event, 3 on timeout. */
static int run_sub(char **av, int ac)
{
    long left = atol(av[2]);
    long long deadline = now_ms() + atol(av[3]);
    baton_kvev_sub_opts_t o = {.endpoint = av[0], .replay_endpoint = strcmp(av[1], "-") ? av[1] : NULL};
    baton_kvev_limits_default(&o.limits);
    o.limits.max_payload = 1 << 20;
    char err[256];
    baton_kvev_sub_t *s = baton_kvev_sub_open(&o, on_event, &left, err, sizeof(err));
    if (!s) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("{\"ev\": \"ready\"}\n");
    fflush(stdout);
    if (ac > 4 && strcmp(av[4], "sync") == 0) {
        int known = baton_kvev_sub_sync(s);
        printf("{\"ev\": \"synced\", \"known\": %d}\n", known);
        fflush(stdout);
    }
    int rc = 3;
    while (now_ms() < deadline) {
        zmq_pollitem_t it = {.fd = baton_kvev_sub_fd(s), .events = ZMQ_POLLIN};
        zmq_poll(&it, 1, 50);
        if (baton_kvev_sub_poll(s) < 0) {
            rc = 2;
            break;
        }
        if (left <= 0) {
            rc = 0;
            break;
        }
    }
    baton_kvev_sub_stats_t st;
    baton_kvev_sub_stats(s, &st);
    printf("{\"ev\": \"stats\", \"last_seq\": %lld, \"gaps\": %llu, \"replays\": %llu, \"resets\": %llu}\n",
           (long long)st.last_seq, (unsigned long long)st.gaps, (unsigned long long)st.replays,
           (unsigned long long)st.resets);
    baton_kvev_sub_close(s);
    return rc;
}

/* pub ENDPOINT REPLAY map|array TOPIC_REPLY(0|1) BATCHES SECONDS: publishes BATCHES batches at
 * once (sequence 0..), then one more every 100 ms, serving replays, for SECONDS. */
static int run_pub(char **av)
{
    baton_kvev_pub_opts_t o = {.endpoint = av[0], .replay_endpoint = av[1], .topic = "kv",
                               .encoding = strcmp(av[2], "array") == 0 ? BATON_KVEV_ENC_ARRAY : BATON_KVEV_ENC_MAP,
                               .reply_with_topic = atoi(av[3])};
    char err[256];
    baton_kvev_pub_t *p = baton_kvev_pub_open(&o, err, sizeof(err));
    if (!p) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    long n = atol(av[4]);
    long long end = now_ms() + atol(av[5]) * 1000, next = 0;
    for (long k = 0;; k++) {
        if (k >= n) {
            while (now_ms() < next) {
                zmq_pollitem_t it = {.fd = baton_kvev_pub_replay_fd(p), .events = ZMQ_POLLIN};
                zmq_poll(&it, 1, 10);
                baton_kvev_pub_service(p);
            }
            if (now_ms() >= end)
                break;
            next = now_ms() + 100;
        }
        baton_kvev_hash_t h[2] = {{.i = 1000 + 2 * k}, {.len = 32}};
        memset(h[1].b, (int)k, 32);
        uint32_t tok[8];
        for (int j = 0; j < 8; j++)
            tok[j] = (uint32_t)(k * 8 + j);
        baton_kvev_event_t ev = {.type = BATON_KVEV_STORED, .hashes = h, .n_hashes = 2, .token_ids = tok,
                                 .n_tokens = 8, .block_size = 4};
        strcpy(ev.medium, "GPU");
        baton_kvev_batch_t b = {.ts = 1.0 * k, .dp_rank = 0, .events = &ev, .n_events = 1};
        if (baton_kvev_pub_send(p, &b) < 0)
            return 1;
        if (k == 0) {
            printf("{\"ev\": \"ready\", \"endpoint\": \"%s\", \"replay\": \"%s\"}\n",
                   baton_kvev_pub_endpoint(p, 0), baton_kvev_pub_endpoint(p, 1));
            fflush(stdout);
        }
    }
    baton_kvev_pub_close(p);
    return 0;
}

/* bench BLOCKS: one thread decodes and applies BLOCKS blocks (block size 16, 64 blocks a
 * batch, chained, 32-byte digests, current vLLM's map encoding) spread over 8 sources, then
 * removes them all; prints blocks/s for each and the index's bytes per 1 M blocks. */
static int run_bench(long total)
{
    enum { BS = 16, PER = 64, SOURCES = 8 };
    long nb = total / PER;
    baton_buf_t *enc = calloc((size_t)nb, sizeof(*enc));
    baton_buf_t *rem = calloc((size_t)nb, sizeof(*rem));
    static baton_kvev_hash_t h[PER];
    static uint32_t ids[PER * BS];
    for (long b = 0; b < nb; b++) {
        for (int k = 0; k < PER; k++) {
            h[k].len = 32;
            uint64_t v = (uint64_t)b * PER + k;
            memset(h[k].b, 0, 32);
            memcpy(h[k].b, &v, 8);
        }
        for (int k = 0; k < PER * BS; k++)
            ids[k] = (uint32_t)((b * 7919 + k) & 0xffffff);
        baton_kvev_event_t e = {.type = BATON_KVEV_STORED, .hashes = h, .n_hashes = PER,
                                .token_ids = ids, .n_tokens = PER * BS, .block_size = BS};
        strcpy(e.medium, "GPU");
        baton_kvev_batch_t bt = {.ts = 1, .dp_rank = 0, .events = &e, .n_events = 1};
        baton_kvev_encode(&bt, BATON_KVEV_ENC_MAP, &enc[b]);
        e.type = BATON_KVEV_REMOVED;
        baton_kvev_encode(&bt, BATON_KVEV_ENC_MAP, &rem[b]);
    }
    baton_kvidx_t *x = baton_kvidx_create(BS);
    char err[128];
    struct timespec t0, t1, t2;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long b = 0; b < nb; b++) {
        baton_kvev_batch_t d;
        if (baton_kvev_decode((uint8_t *)enc[b].data, enc[b].len, NULL, &d, err, sizeof(err)) < 0)
            return 1;
        baton_kvidx_apply(x, (int)(b % SOURCES), &d);
        baton_kvev_batch_free(&d);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint64_t blocks;
    size_t bytes;
    baton_kvidx_size(x, &blocks, &bytes);
    for (long b = 0; b < nb; b++) {
        baton_kvev_batch_t d;
        if (baton_kvev_decode((uint8_t *)rem[b].data, rem[b].len, NULL, &d, err, sizeof(err)) < 0)
            return 1;
        baton_kvidx_apply(x, (int)(b % SOURCES), &d);
        baton_kvev_batch_free(&d);
    }
    clock_gettime(CLOCK_MONOTONIC, &t2);
    uint64_t after;
    size_t bytes_after;
    baton_kvidx_size(x, &after, &bytes_after);
    double s1 = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    double s2 = (double)(t2.tv_sec - t1.tv_sec) + (t2.tv_nsec - t1.tv_nsec) / 1e9;
    printf("{\"blocks\": %llu, \"stored_blocks_per_s\": %.0f, \"removed_blocks_per_s\": %.0f, "
           "\"index_bytes\": %zu, \"bytes_per_1M_blocks\": %.0f, \"left_after_removal\": %llu}\n",
           (unsigned long long)blocks, nb * PER / s1, nb * PER / s2, bytes,
           (double)bytes / (double)blocks * 1e6, (unsigned long long)after);
    baton_kvidx_destroy(x);
    for (long b = 0; b < nb; b++) {
        baton_buf_free(&enc[b]);
        baton_buf_free(&rem[b]);
    }
    free(enc);
    free(rem);
    return 0;
}

int main(int ac, char **av)
{
    if (ac == 3 && strcmp(av[1], "bench") == 0)
        return run_bench(atol(av[2]));
    if (ac >= 6 && strcmp(av[1], "sub") == 0)
        return run_sub(av + 2, ac - 2);
    if (ac >= 8 && strcmp(av[1], "pub") == 0)
        return run_pub(av + 2);
    fprintf(stderr, "usage: kvev_probe sub EP REPLAY|- BATCHES TIMEOUT_MS [sync]\n"
                    "       kvev_probe pub EP REPLAY map|array TOPIC_REPLY BATCHES SECONDS\n");
    return 64;
}
