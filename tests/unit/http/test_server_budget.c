/* test_server_budget.c — the HTTP server's memory budget (server.h): bodies are charged while
 * read and held, a body over the budget waits (its reads stop) and resumes when bytes are freed,
 * or gets 503 server_busy after the body timeout; small bodies use the reserve; bytes queued to
 * a client that does not read are charged too; everything is given back at the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>

#include "baton/error.h"
#include "http/server.h"

#include "http_test_util.h"

#define KiB      1024u
#define MAX_HELD 8

typedef struct fx_s {
    uv_loop_t loop;
    baton_http_server_t *srv;
    baton_http_budget_t budget;
    int port;
    uv_async_t cmd; /* the client thread asks the loop to answer the held requests */
    uv_timer_t guard;
    pthread_t th;
    void (*client)(struct fx_s *);
    atomic_int release; /* 1: answer every held request */
    atomic_int client_done;
    atomic_int n_held;
    atomic_size_t held_len[MAX_HELD];
    baton_http_req_t *held[MAX_HELD];
    size_t stream_bytes; /* > 0: answer each request with this many bytes at once */
    char err[256];
} fx_t;

#define CHECK(fx, cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if ((fx)->err[0] == '\0')                                                              \
                snprintf((fx)->err, sizeof((fx)->err), __VA_ARGS__);                               \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static void handler(baton_http_req_t *req, void *ctx)
{
    fx_t *fx = ctx;
    if (fx->stream_bytes) {
        char *big = malloc(fx->stream_bytes);
        memset(big, 'z', fx->stream_bytes);
        baton_http_respond(req, 200, "text/plain", NULL, 0, big, fx->stream_bytes);
        free(big);
        return;
    }
    int i = atomic_load(&fx->n_held);
    fx->held[i] = req;
    atomic_store(&fx->held_len[i], req->body_len);
    atomic_store(&fx->n_held, i + 1);
}

static void on_cmd(uv_async_t *a)
{
    fx_t *fx = a->data;
    if (atomic_exchange(&fx->release, 0)) {
        for (int i = 0; i < atomic_load(&fx->n_held); i++) {
            if (fx->held[i])
                baton_http_respond(fx->held[i], 200, NULL, NULL, 0, "{}", 2);
            fx->held[i] = NULL;
        }
    }
    if (atomic_load(&fx->client_done)) {
        uv_close((uv_handle_t *)&fx->cmd, NULL);
        uv_close((uv_handle_t *)&fx->guard, NULL);
        baton_http_server_close(fx->srv, NULL);
    }
}

static void on_guard(uv_timer_t *t)
{
    fx_t *fx = t->data;
    snprintf(fx->err, sizeof(fx->err), "test took too long");
    atomic_store(&fx->client_done, 1);
    uv_async_send(&fx->cmd);
}

static void *client_main(void *arg)
{
    fx_t *fx = arg;
    fx->client(fx);
    atomic_store(&fx->client_done, 1);
    uv_async_send(&fx->cmd);
    return NULL;
}

/* Polls cond (bounded: 5 s). */
#define WAIT_FOR(fx, cond, what)                                                                   \
    do {                                                                                           \
        int ok_ = 0;                                                                               \
        for (int i_ = 0; i_ < 500 && !(ok_ = (cond)); i_++)                                        \
            usleep(10000);                                                                         \
        CHECK(fx, ok_, "timed out waiting for %s", what);                                          \
    } while (0)

static void run(fx_t *fx, size_t max, uint64_t body_timeout_ms, void (*client)(fx_t *))
{
    baton_http_limits_t lim;
    baton_http_limits_default(&lim);
    lim.body_timeout_ms = body_timeout_ms;
    fx->budget.max = max;
    fx->client = client;
    assert_int_equal(uv_loop_init(&fx->loop), 0);
    assert_int_equal(baton_http_server_create(&fx->srv, &fx->loop, &lim, handler, fx), 0);
    baton_http_server_set_budget(fx->srv, &fx->budget);
    assert_int_equal(baton_http_server_listen(fx->srv, "127.0.0.1", 0, 0), 0);
    fx->port = baton_http_server_port(fx->srv);
    fx->cmd.data = fx;
    fx->guard.data = fx;
    uv_async_init(&fx->loop, &fx->cmd, on_cmd);
    uv_timer_init(&fx->loop, &fx->guard);
    uv_timer_start(&fx->guard, on_guard, 20000, 0);
    assert_int_equal(pthread_create(&fx->th, NULL, client_main, fx), 0);
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    pthread_join(fx->th, NULL);
    if (fx->err[0]) /* before the loop check: a failed client leaves requests held */
        fail_msg("%s", fx->err);
    assert_int_equal(uv_loop_close(&fx->loop), 0);
    /* every byte was given back */
    assert_int_equal(atomic_load(&fx->budget.used), 0);
    assert_int_equal(atomic_load(&fx->budget.reserve_used), 0);
}

static void send_head(tconn_t *c, size_t len)
{
    char head[160];
    snprintf(head, sizeof(head), "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n", len);
    tc_send(c, head);
}

static void send_fill(tconn_t *c, size_t len)
{
    static char block[64 * KiB];
    memset(block, 'a', sizeof(block));
    while (len > 0) {
        size_t n = len < sizeof(block) ? len : sizeof(block);
        if (tc_send_n(c, block, n) != 0)
            return;
        len -= n;
    }
}

/* Sends up to len filler bytes without blocking for long: what the kernel takes within ~1 s. */
static size_t send_some(tconn_t *c, size_t len)
{
    static char block[64 * KiB];
    memset(block, 'a', sizeof(block));
    size_t sent = 0;
    for (int idle = 0; sent < len && idle < 20;) {
        size_t n = len - sent < sizeof(block) ? len - sent : sizeof(block);
        ssize_t w = send(c->fd, block, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            sent += (size_t)w;
            idle = 0;
        } else {
            idle++;
            usleep(50000);
        }
    }
    return sent;
}

/* Reads one response head; its status, or -1. */
static int read_status(tconn_t *c)
{
    while (find_crlfcrlf(c->buf, c->len) == NULL)
        if (tc_fill(c) <= 0)
            return -1;
    return atoi(c->buf + 9);
}

/* A held 700 KiB body fills a 1 MiB budget; a 2 MiB body then waits, and goes on once the
 * first is answered. */
static void client_wait_resume(fx_t *fx)
{
    tconn_t a, b;
    CHECK(fx, tc_connect(&a, fx->port) == 0 && tc_connect(&b, fx->port) == 0, "connect");
    send_head(&a, 700 * KiB);
    send_fill(&a, 700 * KiB);
    WAIT_FOR(fx, atomic_load(&fx->n_held) == 1, "the first body");
    CHECK(fx, atomic_load(&fx->budget.used) >= 700 * KiB, "held body not charged: %zu",
          atomic_load(&fx->budget.used));
    send_head(&b, 2048 * KiB);
    /* the kernel buffers take part of it; the server stops reading */
    size_t sent = send_some(&b, 2048 * KiB);
    WAIT_FOR(fx, atomic_load(&fx->budget.waits) >= 1, "the second body to wait");
    CHECK(fx, atomic_load(&fx->budget.used) <= 1024 * KiB + 64 * KiB, "budget overshot: %zu",
          atomic_load(&fx->budget.used));
    CHECK(fx, atomic_load(&fx->n_held) == 1, "the waiting body was dispatched");
    /* (the kernel's loopback buffers may hold all of it: the server just did not read it) */
    atomic_store(&fx->release, 1);
    uv_async_send(&fx->cmd);
    CHECK(fx, read_status(&a) == 200, "first answer");
    send_fill(&b, 2048 * KiB - sent); /* the server reads again: the rest goes through */
    WAIT_FOR(fx, atomic_load(&fx->n_held) == 2, "the second body after the release");
    CHECK(fx, atomic_load(&fx->held_len[1]) == 2048 * KiB, "second body length %zu",
          atomic_load(&fx->held_len[1]));
    atomic_store(&fx->release, 1);
    uv_async_send(&fx->cmd);
    CHECK(fx, read_status(&b) == 200, "second answer");
    tc_close(&a);
    tc_close(&b);
}

static void test_body_waits_then_resumes(void **state)
{
    (void)state;
    static fx_t fx;
    memset(&fx, 0, sizeof(fx));
    run(&fx, 1024 * KiB, 10000, client_wait_resume);
}

/* A body kept waiting past the body timeout gets 503 server_busy; a small one still passes. */
static void client_busy(fx_t *fx)
{
    tconn_t a, b, s;
    CHECK(fx, tc_connect(&a, fx->port) == 0 && tc_connect(&b, fx->port) == 0, "connect");
    send_head(&a, 511 * KiB); /* leaves less than the small body in the main budget */
    send_fill(&a, 511 * KiB);
    WAIT_FOR(fx, atomic_load(&fx->n_held) == 1, "the first body");
    send_head(&b, 1024 * KiB);
    send_some(&b, 1024 * KiB);
    WAIT_FOR(fx, atomic_load(&fx->budget.waits) >= 1, "the big body to wait");
    /* 2 KiB <= max/64: the reserve (max/8) lets it in while the big body waits */
    CHECK(fx, tc_connect(&s, fx->port) == 0, "connect");
    send_head(&s, 2 * KiB);
    send_fill(&s, 2 * KiB);
    WAIT_FOR(fx, atomic_load(&fx->n_held) == 2, "the small body");
    CHECK(fx, atomic_load(&fx->held_len[1]) == 2 * KiB, "small body length");
    CHECK(fx, atomic_load(&fx->budget.reserve_used) == 2 * KiB, "small body not in the reserve");
    int st = read_status(&b);
    CHECK(fx, st == 503 && strstr(b.buf, "server_busy") != NULL, "waiting body got %d: %.200s", st,
          b.buf);
    atomic_store(&fx->release, 1);
    uv_async_send(&fx->cmd);
    CHECK(fx, read_status(&a) == 200 && read_status(&s) == 200, "held answers");
    tc_close(&a);
    tc_close(&b);
    tc_close(&s);
}

static void test_body_busy_after_timeout(void **state)
{
    (void)state;
    static fx_t fx;
    memset(&fx, 0, sizeof(fx));
    run(&fx, 512 * KiB, 400, client_busy);
}

/* 16 MiB answered to a client that does not read: the queued bytes are charged until read, in
 * the responses' share. */
static void client_slow_reader(fx_t *fx)
{
    tconn_t a;
    CHECK(fx, tc_connect(&a, fx->port) == 0, "connect");
    tc_send(&a, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n");
    WAIT_FOR(fx, atomic_load(&fx->budget.out_used) >= 4096 * KiB, "queued response bytes charged");
    /* in their own share: a request body is not kept waiting by a client that does not read */
    CHECK(fx, atomic_load(&fx->budget.used) == 0, "response bytes in the bodies' budget");
    size_t total = 0;
    while (total < fx->stream_bytes) {
        ssize_t n = tc_fill(&a);
        CHECK(fx, n > 0, "read failed after %zu", total);
        total += (size_t)n;
        a.len = 0;
    }
    WAIT_FOR(fx, atomic_load(&fx->budget.out_used) == 0, "queued bytes given back");
    tc_close(&a);
}

static void test_response_bytes_charged(void **state)
{
    (void)state;
    static fx_t fx;
    memset(&fx, 0, sizeof(fx));
    fx.stream_bytes = 16384 * KiB;
    run(&fx, 1024 * KiB, 10000, client_slow_reader);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_body_waits_then_resumes),
        cmocka_unit_test(test_body_busy_after_timeout),
        cmocka_unit_test(test_response_bytes_charged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
