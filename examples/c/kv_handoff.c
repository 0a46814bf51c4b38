/* examples/c/kv_handoff.c — a tiny third-party engine: one prefill and one decode process hand
 * off a room of KV pages through the installed libbaton (own-progress mode: no libuv loop).
 *
 *   kv_handoff prefill tcp|shm          listens on 127.0.0.1 (ephemeral), prints "port=N",
 *                                       serves one room, exits 0 when DONE went out
 *   kv_handoff decode tcp|shm PORT      offers one room to 127.0.0.1:PORT, exits 0 when every
 *                                       byte arrived and matches the pattern
 *
 * Build: cc kv_handoff.c $(pkg-config --cflags --libs baton)
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <baton/transfer.h>

#define N_LAYERS    4
#define N_PAGES     8 /* pages per layer */
#define PAGE_LEN    (64 * 1024)
#define ROOM_ID     0x1234abcdull
#define FIRST_TOKEN 42
#define DEADLINE_S  60

/* The byte the prefill side writes at offset i of page `page` of layer `layer`. */
static uint8_t pattern(uint32_t layer, uint32_t page, size_t i)
{
    return (uint8_t)(i * 31u + layer * 7u + page * 13u + (ROOM_ID & 0xff));
}

static void die(const char *what, int err)
{
    fprintf(stderr, "kv_handoff: %s: %s\n", what, baton_xfer_strerror(err));
    exit(1);
}

/* Host logging: libbaton's lines arrive here instead of stderr's default format. */
static void on_log(void *data, baton_xfer_log_level_t level, const char *msg)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    fprintf(stderr, "[%s] libbaton %s: %s\n", (const char *)data, names[level & 3], msg);
}

/* Polls the engine's fd and runs completions on this thread until *flag is set. */
static void pump(baton_xfer_engine_t *eng, const int *flag)
{
    time_t end = time(NULL) + DEADLINE_S;
    while (!*flag) {
        if (time(NULL) > end) {
            fprintf(stderr, "kv_handoff: timed out\n");
            exit(1);
        }
        struct pollfd pfd = {.fd = baton_xfer_engine_fd(eng), .events = POLLIN};
        if (poll(&pfd, 1, 500) < 0 && errno != EINTR)
            die("poll", -errno);
        baton_xfer_engine_dispatch(eng); /* may run the close callback: eng is gone after it */
    }
}

static int engine_closed;
static void on_engine_closed(baton_xfer_engine_t *eng, void *data)
{
    engine_closed = 1;
}

static baton_xfer_transport_t parse_transport(const char *name)
{
    baton_xfer_transport_t t;
    if (baton_xfer_transport_parse(name, &t) != 0) {
        fprintf(stderr, "kv_handoff: unknown transport %s\n", name);
        exit(2);
    }
    return t;
}

/* ---- prefill ---------------------------------------------------------------------------- */

static baton_xfer_mem_t *src_mem;
static int room_ended, room_status = 1;

static void on_written(baton_xfer_room_t *room, uint32_t layer, int status, void *data)
{
    if (status != 0) {
        fprintf(stderr, "kv_handoff: write failed: %s\n", baton_xfer_strerror(status));
        return; /* room_closed_cb reports the room's end */
    }
    const char note[] = "hello from prefill";
    baton_xfer_done_t done = {0, FIRST_TOKEN, (const uint8_t *)note, sizeof(note)};
    int rc = baton_xfer_room_complete(room, &done);
    if (rc != 0)
        die("room_complete", rc);
}

static void on_room(baton_xfer_engine_t *eng, baton_xfer_room_t *room, void *data)
{
    uint32_t layers = baton_xfer_room_layers(room), ppl = baton_xfer_room_pages_per_layer(room);
    if (baton_xfer_room_id(room) != ROOM_ID || layers != N_LAYERS || ppl != N_PAGES) {
        baton_xfer_room_abort(room, BATON_XFER_EINVAL);
        return;
    }
    baton_xfer_iov_t src[N_LAYERS * N_PAGES];
    uint8_t *base = baton_xfer_mem_addr(src_mem);
    for (uint32_t j = 0; j < N_LAYERS * N_PAGES; j++) {
        src[j].addr = base + (size_t)j * PAGE_LEN;
        src[j].len = baton_xfer_room_page_len(room, j / N_PAGES, j % N_PAGES);
    }
    int rc = baton_xfer_write_room(room, src, N_LAYERS * N_PAGES, on_written, NULL);
    if (rc != 0)
        die("write_room", rc);
}

static void on_room_closed(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int status,
                           void *data)
{
    room_status = status;
    room_ended = 1;
}

static int run_prefill(baton_xfer_transport_t tp)
{
    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    cfg.engine_id = "example-prefill";
    cfg.listen_host = "127.0.0.1";
    cfg.transports[0] = tp;
    cfg.n_transports = 1;
    cfg.log_cb = on_log;
    cfg.log_data = "prefill";
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, NULL};
    baton_xfer_engine_t *eng;
    int rc = baton_xfer_engine_create(NULL, &cfg, &cbs, &eng);
    if (rc != 0)
        die("engine_create", rc);
    rc = baton_xfer_mem_alloc(eng, (size_t)N_LAYERS * N_PAGES * PAGE_LEN, &src_mem);
    if (rc != 0)
        die("mem_alloc", rc);
    uint8_t *p = baton_xfer_mem_addr(src_mem);
    for (uint32_t l = 0; l < N_LAYERS; l++)
        for (uint32_t pg = 0; pg < N_PAGES; pg++)
            for (size_t i = 0; i < PAGE_LEN; i++)
                *p++ = pattern(l, pg, i);
    printf("port=%d\n", baton_xfer_engine_listen_port(eng));
    fflush(stdout);
    pump(eng, &room_ended);
    baton_xfer_mem_deregister(eng, src_mem);
    baton_xfer_engine_destroy(eng, on_engine_closed, NULL);
    pump(eng, &engine_closed);
    printf("prefill room status=%s\n", baton_xfer_err_name(room_status));
    return room_status == 0 ? 0 : 1;
}

/* ---- decode ----------------------------------------------------------------------------- */

static int offer_ended, offer_ok;

static void on_offer_done(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done)
{
    offer_ended = 1;
    if (status != 0) {
        fprintf(stderr, "kv_handoff: room failed: %s\n", baton_xfer_err_name(status));
        return;
    }
    const uint8_t *p = baton_xfer_mem_addr(data);
    size_t bad = 0;
    for (uint32_t l = 0; l < N_LAYERS; l++)
        for (uint32_t pg = 0; pg < N_PAGES; pg++)
            for (size_t i = 0; i < PAGE_LEN; i++)
                bad += *p++ != pattern(l, pg, i);
    printf("decode room done: first_token=%lld payload=\"%.*s\" bad_bytes=%zu of %zu\n",
           (long long)done->first_token, (int)done->payload_len, (const char *)done->payload, bad,
           (size_t)N_LAYERS * N_PAGES * PAGE_LEN);
    offer_ok = bad == 0 && done->status == 0 && done->first_token == FIRST_TOKEN;
}

static int run_decode(int port, baton_xfer_transport_t tp)
{
    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    cfg.engine_id = "example-decode";
    cfg.transports[0] = tp;
    cfg.n_transports = 1;
    cfg.log_cb = on_log;
    cfg.log_data = "decode";
    baton_xfer_engine_t *eng;
    int rc = baton_xfer_engine_create(NULL, &cfg, NULL, &eng);
    if (rc != 0)
        die("engine_create", rc);
    baton_xfer_mem_t *dst;
    rc = baton_xfer_mem_alloc(eng, (size_t)N_LAYERS * N_PAGES * PAGE_LEN, &dst);
    if (rc != 0)
        die("mem_alloc", rc);
    baton_xfer_iov_t pages[N_LAYERS * N_PAGES];
    uint8_t *base = baton_xfer_mem_addr(dst);
    for (uint32_t j = 0; j < N_LAYERS * N_PAGES; j++) {
        pages[j].addr = base + (size_t)j * PAGE_LEN;
        pages[j].len = PAGE_LEN;
    }
    baton_xfer_offer_t offer = {ROOM_ID, N_LAYERS, N_PAGES, pages, NULL};
    rc = baton_xfer_offer(eng, "127.0.0.1", port, &offer, on_offer_done, dst);
    if (rc != 0)
        die("offer", rc);
    pump(eng, &offer_ended);
    baton_xfer_mem_deregister(eng, dst);
    baton_xfer_engine_destroy(eng, on_engine_closed, NULL);
    pump(eng, &engine_closed);
    return offer_ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (baton_version() != BATON_VERSION_HEX) {
        fprintf(stderr, "kv_handoff: built against libbaton %s, running %s\n", BATON_VERSION_STRING,
                baton_version_string());
        return 1;
    }
    if (argc == 3 && strcmp(argv[1], "prefill") == 0)
        return run_prefill(parse_transport(argv[2]));
    if (argc == 4 && strcmp(argv[1], "decode") == 0)
        return run_decode(atoi(argv[3]), parse_transport(argv[2]));
    fprintf(stderr, "usage: kv_handoff prefill tcp|shm | kv_handoff decode tcp|shm PORT\n");
    return 2;
}
