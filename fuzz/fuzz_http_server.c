/* fuzz/fuzz_http_server.c — libFuzzer harness for the HTTP server's request path: bytes in
 * arbitrary chunks → llhttp → limits → requests handed to a handler (pipelining, chunked bodies,
 * 100-continue, error responses), on a socketpair instead of an accepted TCP connection. */

/* White-box: the parsing path is reached only from a socket's read callback, so the harness
 * uses the server's private header and drives baton__hs_feed() the way on_read() does. */
#include "http/server_internal.h"

#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_check.h"
#include <fcntl.h>

static uv_loop_t loop;
static srv_t *srv;

/* Checks what the server promises the handler, then answers in one of three ways. */
static void handler(baton_http_req_t *req, void *ctx)
{
    (void)ctx;
    const baton_http_limits_t *lim = &baton__hs_srv(req->server)->limits;
    CHECK(req->method != NULL && req->path != NULL && req->query != NULL);
    CHECK(req->body != NULL && req->body[req->body_len] == '\0');
    CHECK(req->body_len <= lim->max_body_bytes);
    CHECK(req->n_headers <= lim->max_headers);
    CHECK(strlen(req->path) + strlen(req->query) <= lim->max_header_bytes);
    for (size_t i = 0; i < req->n_headers; i++)
        CHECK(req->headers[i].name != NULL && req->headers[i].value != NULL);
    (void)baton_http_req_header(req, "content-type");
    switch (req->body_len % 3) {
    case 0:
        baton_http_respond(req, 200, NULL, NULL, 0, req->body, req->body_len);
        break;
    case 1:
        baton_http_respond_error(req, 400, req->path, "invalid_request_error", req->query, NULL);
        break;
    default:
        baton_http_stream_start(req, 200, "text/event-stream", NULL, 0);
        baton_http_stream_write(req, req->body, req->body_len);
        baton_http_stream_end(req);
        break;
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    baton_log_set_level(BATON_LOG_ERROR);
    uv_loop_init(&loop);
    /* Small limits so that inputs of a few KiB reach every 413 / 431 path. */
    baton_http_limits_t lim;
    baton_http_limits_default(&lim);
    lim.max_header_bytes = 1024;
    lim.max_headers = 12;
    lim.max_body_bytes = 2048;
    baton_http_server_t *pub;
    if (baton_http_server_create(&pub, &loop, &lim, handler, NULL) != 0)
        abort();
    srv = baton__hs_srv(pub);
    return 0;
}

/* What on_connection() does for an accepted socket, on one end of a socketpair. */
static conn_t *fake_conn(int fd)
{
    conn_t *c = baton__hs_conn_new(srv, fd);
    if (c == NULL)
        abort();
    snprintf(c->req.peer, sizeof(c->req.peer), "fuzz");
    baton__hs_conn_admit(c);
    return c;
}

static void drain(int fd)
{
    char sink[4096];
    while (read(fd, sink, sizeof(sink)) > 0) {
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    /* The first byte picks the read sizes the socket would have delivered. */
    size_t step = (size_t)(data[0] % 64) + 1;
    if (data[0] >= 192)
        step = SIZE_MAX;
    data++;
    size--;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    unsigned live = srv->n_live;
    conn_t *c = fake_conn(sv[0]);
    size_t off = 0;
    while (off < size && !baton__hs_closing(c)) {
        size_t n = size - off < step ? size - off : step;
        /* on_read()'s rule: bytes behind a request in the handler's hands wait in `pending`. */
        if (c->state == CS_HANDLER || c->pending.len > 0)
            baton__hs_stash(c, (const char *)data + off, n);
        else
            baton__hs_feed(c, (const char *)data + off, n);
        off += n;
        uv_run(&loop, UV_RUN_NOWAIT); /* resume timers, write completions */
        drain(sv[1]);
    }
    for (int i = 0; i < 4 && !baton__hs_closing(c); i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        drain(sv[1]);
    }
    baton__hs_close_hard(c);
    for (int i = 0; i < 64 && srv->n_live > live; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    CHECK(srv->n_live == live);     /* the connection and all it held were freed */
    CHECK(srv->state_refused == 0); /* every state move was a legal one */
    close(sv[1]);
    return 0;
}
