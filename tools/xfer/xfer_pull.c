/* tools/xfer/xfer_pull.c — baton-xfer-pull: a libbaton pull-mode test peer. As holder it
 * exports keys 1..N over pattern pages and reports each export's end; as puller it pulls them
 * from a holder and verifies every byte. One line per event on stdout (tests/integration). */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "baton/transfer.h"
#include "xfer_pattern.h"

typedef struct {
    int hold;
    int stay; /* holder: keep serving (ordinary offers) after every export ended */
    int push; /* holder: no exports; the application writes each offered key (push, to compare) */
    const char *host;
    int port;
    uint32_t keys, layers, ppl, page;
    uint32_t timeout_ms;
    uint64_t seed;
    baton_xfer_transport_t tp;
    uint32_t slice, lanes;
} opts_t;

static opts_t o = {.host = "127.0.0.1",
                   .keys = 1,
                   .layers = 4,
                   .ppl = 4,
                   .page = 65536,
                   .seed = 7,
                   .tp = BATON_XFER_TRANSPORT_TCP};
static uv_loop_t *loop;
static baton_xfer_engine_t *eng;
static baton_xfer_mem_t *mem;
static uint8_t *base;
static uint32_t ended;
static uint64_t t0_ns;
static int failures;
static uv_timer_t progress;
static uint64_t last_landed;

static size_t key_bytes(void);

/* Puller: "progress pages_landed=N" when pages of key 1 stop being poison (the holder's bytes
 * arrive straight in them), so a test can act in the middle of a pull. */
static void on_progress(uv_timer_t *t)
{
    (void)t;
    uint64_t landed = 0;
    for (size_t off = 0; off < key_bytes(); off += o.page)
        landed += base[off] != XFER_POISON;
    if (landed != last_landed && landed < (uint64_t)o.layers * o.ppl) {
        last_landed = landed;
        printf("progress pages_landed=%" PRIu64 "\n", landed);
        fflush(stdout);
    }
}

static size_t key_bytes(void)
{
    return (size_t)o.layers * o.ppl * o.page;
}

/* Key k's pages are the k-th slab of the region; the pattern differs per key. */
static uint8_t *slab(uint32_t k)
{
    return base + (size_t)(k - 1) * key_bytes();
}

static void fill_iovs(uint32_t k, baton_xfer_iov_t *iov)
{
    for (uint32_t j = 0; j < o.layers * o.ppl; j++)
        iov[j] = (baton_xfer_iov_t){slab(k) + (size_t)j * o.page, o.page};
}

/* Puller: the statuses and first tokens, checked with the bytes after the timing. */
static int *pull_status;
static int64_t *pull_first;

/* Every byte of key k against the pattern; the number that differ. */
static size_t bad_bytes(uint32_t k)
{
    size_t bad = 0;
    uint8_t *want = malloc(key_bytes());
    if (want == NULL)
        return key_bytes();
    xfer_fill_source(want, key_bytes(), o.seed + k);
    for (size_t i = 0; i < key_bytes(); i++)
        bad += slab(k)[i] != want[i];
    free(want);
    return bad + (pull_first[k - 1] != (int64_t)k);
}

static void finish_if_done(void)
{
    if (ended != o.keys)
        return;
    /* seconds from the first pull (or export) to the last end: pull vs push throughput */
    double s = (double)(uv_hrtime() - t0_ns) / 1e9;
    for (uint32_t k = 1; !o.hold && k <= o.keys; k++) {
        int st = pull_status[k - 1];
        size_t bad = st == 0 ? bad_bytes(k) : 0;
        failures += st != 0 || bad != 0;
        printf("pull_end key=%" PRIu32 " status=%s bad_bytes=%zu\n", k,
               st ? baton_xfer_err_name(st) : "ok", bad);
    }
    printf("done failures=%d seconds=%.6f bytes=%zu gbps=%.3f\n", failures, s, key_bytes() * o.keys,
           (double)(key_bytes() * o.keys) * 8 / s / 1e9);
    fflush(stdout);
    if (!o.stay) {
        if (!o.hold)
            uv_close((uv_handle_t *)&progress, NULL);
        baton_xfer_engine_destroy(eng, NULL, NULL);
    }
}

static void on_export(baton_xfer_engine_t *e, uint64_t key, int status, void *data)
{
    (void)e;
    (void)data;
    printf("export_end key=%" PRIu64 " status=%s\n", key,
           status ? baton_xfer_err_name(status) : "pulled");
    fflush(stdout);
    ended++;
    finish_if_done();
}

static void on_pulled(void *data, uint64_t key, int status, const baton_xfer_done_t *done)
{
    (void)data;
    pull_status[key - 1] = status;
    pull_first[key - 1] = status == 0 ? done->first_token : -1;
    ended++;
    finish_if_done();
}

static void on_push_written(baton_xfer_room_t *room, uint32_t layer, int status, void *data)
{
    (void)room;
    (void)layer;
    (void)status;
    (void)data;
}

/* Holder: an offer for a key not (or no longer) exported is refused (or, with --push, written
 * by the application: the same bytes through the ordinary write path). */
static void on_room(baton_xfer_engine_t *e, baton_xfer_room_t *room, void *data)
{
    (void)e;
    (void)data;
    uint64_t k = baton_xfer_room_id(room);
    printf("ordinary_offer key=%" PRIu64 "\n", k);
    fflush(stdout);
    if (o.push && k >= 1 && k <= o.keys) { /* the same writes as a pull, by the application */
        baton_xfer_iov_t *iov = malloc(sizeof(*iov) * o.layers * o.ppl);
        fill_iovs((uint32_t)k, iov);
        baton_xfer_done_t done = {0, (int64_t)k, NULL, 0};
        if (iov &&
            baton_xfer_write_room(room, iov, (size_t)o.layers * o.ppl, on_push_written, NULL) ==
                0 &&
            baton_xfer_room_complete(room, &done) == 0) {
            free(iov);
            return;
        }
        free(iov);
    }
    baton_xfer_room_abort(room, BATON_XFER_EABORTED);
}

static void on_room_closed(baton_xfer_engine_t *e, baton_xfer_room_t *room, int status, void *d)
{
    (void)e;
    (void)d;
    uint64_t k = baton_xfer_room_id(room);
    if (o.push && k >= 1 && k <= o.keys) {
        printf("export_end key=%" PRIu64 " status=%s\n", k,
               status ? baton_xfer_err_name(status) : "pulled");
        fflush(stdout);
        ended++;
        finish_if_done();
    }
}

static int parse(int argc, char **argv)
{
    static const struct option lo[] = {{"hold", no_argument, NULL, 'H'},
                                       {"stay", no_argument, NULL, 'Y'},
                                       {"push", no_argument, NULL, 'U'},
                                       {"pull", required_argument, NULL, 'P'},
                                       {"keys", required_argument, NULL, 'k'},
                                       {"layers", required_argument, NULL, 'l'},
                                       {"ppl", required_argument, NULL, 'p'},
                                       {"page", required_argument, NULL, 's'},
                                       {"timeout-ms", required_argument, NULL, 't'},
                                       {"transport", required_argument, NULL, 'T'},
                                       {"slice", required_argument, NULL, 'S'},
                                       {"lanes", required_argument, NULL, 'L'},
                                       {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'H':
            o.hold = 1;
            break;
        case 'Y':
            o.stay = 1;
            break;
        case 'U':
            o.push = 1;
            break;
        case 'P': {
            char *colon = strrchr(optarg, ':');
            if (!colon)
                return -1;
            *colon = '\0';
            o.host = optarg;
            o.port = atoi(colon + 1);
            break;
        }
        case 'k':
            o.keys = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'l':
            o.layers = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'p':
            o.ppl = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 's':
            o.page = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 't':
            o.timeout_ms = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'T':
            if (baton_xfer_transport_parse(optarg, &o.tp) != 0)
                return -1;
            break;
        case 'S':
            o.slice = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'L':
            o.lanes = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        default:
            return -1;
        }
    }
    if (!o.keys || !o.layers || !o.ppl || !o.page || (!o.hold && !o.port))
        return -1;
    return 0;
}

int main(int argc, char **argv)
{
    if (parse(argc, argv) != 0) {
        fprintf(stderr, "usage: baton-xfer-pull --hold [--stay] [--push] | --pull HOST:PORT "
                        "[--keys N] [--layers N]"
                        " [--ppl N] [--page BYTES] [--timeout-ms MS] [--transport tcp|shm]"
                        " [--slice BYTES] [--lanes N]\n");
        return 2;
    }
    loop = uv_default_loop();
    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    cfg.transports[0] = o.tp;
    cfg.n_transports = 1;
    cfg.slice_size = o.slice;
    cfg.lanes = o.lanes;
    cfg.engine_id = o.hold ? "pull-holder" : "pull-puller";
    if (o.hold) {
        cfg.listen_host = o.host;
        cfg.listen_port = 0;
    }
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, NULL};
    if (baton_xfer_engine_create(loop, &cfg, &cbs, &eng) != 0 ||
        baton_xfer_mem_alloc(eng, key_bytes() * o.keys, &mem) != 0) {
        fprintf(stderr, "baton-xfer-pull: engine or memory failed\n");
        return 1;
    }
    base = baton_xfer_mem_addr(mem);
    baton_xfer_iov_t *iov = malloc(sizeof(*iov) * o.layers * o.ppl);
    pull_status = calloc(o.keys, sizeof(*pull_status));
    pull_first = calloc(o.keys, sizeof(*pull_first));
    if (!o.hold) /* connected before the clock starts: the pulls alone are timed */
        baton_xfer_connect(eng, o.host, o.port);
    t0_ns = uv_hrtime();
    for (uint32_t k = 1; k <= o.keys; k++) {
        fill_iovs(k, iov);
        int rc;
        if (o.hold && o.push) {
            xfer_fill_source(slab(k), key_bytes(), o.seed + k);
            rc = 0;
        } else if (o.hold) {
            xfer_fill_source(slab(k), key_bytes(), o.seed + k);
            baton_xfer_export_t ex = {k, o.layers, o.ppl, iov, o.timeout_ms, {0, k, NULL, 0}};
            rc = baton_xfer_export(eng, &ex, on_export, NULL);
        } else {
            memset(slab(k), XFER_POISON, key_bytes());
            baton_xfer_offer_t off = {k, o.layers, o.ppl, iov, NULL};
            rc = baton_xfer_pull(eng, o.host, o.port, &off, on_pulled, NULL);
        }
        if (rc != 0) {
            fprintf(stderr, "baton-xfer-pull: key %u: %s\n", k, baton_xfer_err_name(rc));
            return 1;
        }
    }
    free(iov);
    if (!o.hold) {
        uv_timer_init(loop, &progress);
        uv_timer_start(&progress, on_progress, 2, 2);
    }
    if (o.hold)
        printf("holding port=%d keys=%u bytes=%zu\n", baton_xfer_engine_listen_port(eng), o.keys,
               key_bytes() * o.keys);
    else
        printf("pulling keys=%u\n", o.keys);
    fflush(stdout);
    uv_run(loop, UV_RUN_DEFAULT);
    return failures ? 1 : 0;
}
