/* http_test_util.h — helpers for the HTTP tests: a blocking socket client (run on its own
 * thread, since the server runs on the test's loop) and a bounded loop runner. */
#ifndef BATON_TEST_HTTP_UTIL_H
#define BATON_TEST_HTTP_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

/* Every blocking read gives up after this long, so a broken server cannot hang a test. */
#define TC_RECV_TIMEOUT_S 5

typedef struct tconn_s {
    int fd;
    char buf[256 * 1024];
    size_t len;
    int eof;
} tconn_t;

typedef struct tresp_s {
    int status;
    char head[16384]; /* status line + headers, NUL-terminated */
    char *body;       /* de-chunked, NUL-terminated, malloc'd */
    size_t body_len;
    int chunked;
} tresp_t;

static inline void tresp_free(tresp_t *r)
{
    free(r->body);
    r->body = NULL;
}

static inline int tc_connect(tconn_t *c, int port)
{
    memset(c, 0, sizeof(*c));
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0)
        return -1;
    struct timeval tv = {TC_RECV_TIMEOUT_S, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    return 0;
}

static inline void tc_close(tconn_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

static inline int tc_send_n(tconn_t *c, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static inline int tc_send(tconn_t *c, const char *s)
{
    return tc_send_n(c, s, strlen(s));
}

/* Reads more bytes into the buffer: >0 bytes, 0 on EOF, -1 on error or timeout. */
static inline ssize_t tc_fill(tconn_t *c)
{
    if (c->len >= sizeof(c->buf) - 1)
        return -1;
    for (;;) {
        ssize_t n = recv(c->fd, c->buf + c->len, sizeof(c->buf) - 1 - c->len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            c->eof = 1;
        if (n > 0) {
            c->len += (size_t)n;
            c->buf[c->len] = '\0';
        }
        return n;
    }
}

static inline void tc_consume(tconn_t *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
    c->buf[c->len] = '\0';
}

/* Waits for EOF with nothing else arriving: 1 when the server closed cleanly, 0 otherwise. */
static inline int tc_wait_eof(tconn_t *c)
{
    size_t before = c->len;
    for (;;) {
        ssize_t n = tc_fill(c);
        if (n == 0)
            return c->len == before;
        if (n < 0)
            return errno == ECONNRESET && c->len == before;
    }
}

static inline const char *find_crlfcrlf(const char *s, size_t len)
{
    for (size_t i = 0; i + 3 < len; i++)
        if (s[i] == '\r' && s[i + 1] == '\n' && s[i + 2] == '\r' && s[i + 3] == '\n')
            return s + i;
    return NULL;
}

/* Case-insensitive header value from a raw head; copies into out. 1 when found. */
static inline int head_get(const char *head, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    const char *p = strstr(head, "\r\n");
    while (p) {
        p += 2;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            const char *e = strstr(v, "\r\n");
            size_t l = e ? (size_t)(e - v) : strlen(v);
            if (l >= cap)
                l = cap - 1;
            memcpy(out, v, l);
            out[l] = '\0';
            return 1;
        }
        p = strstr(p, "\r\n");
    }
    return 0;
}

/* Reads one response head (skipping nothing). 0 or -1. */
static inline int tc_read_head(tconn_t *c, tresp_t *r)
{
    memset(r, 0, sizeof(*r));
    const char *end;
    while ((end = find_crlfcrlf(c->buf, c->len)) == NULL)
        if (tc_fill(c) <= 0)
            return -1;
    size_t hl = (size_t)(end - c->buf) + 4;
    if (hl >= sizeof(r->head))
        return -1;
    memcpy(r->head, c->buf, hl);
    r->head[hl] = '\0';
    tc_consume(c, hl);
    if (sscanf(r->head, "HTTP/1.%*d %d", &r->status) != 1)
        return -1;
    char v[64];
    r->chunked =
        head_get(r->head, "transfer-encoding", v, sizeof(v)) && strcasecmp(v, "chunked") == 0;
    return 0;
}

/* Reads one chunk of a chunked body: its length (0 = last chunk), or -1. */
static inline ssize_t tc_read_chunk(tconn_t *c, char *out, size_t cap)
{
    const char *nl;
    while ((nl = memchr(c->buf, '\n', c->len)) == NULL)
        if (tc_fill(c) <= 0)
            return -1;
    size_t size = strtoul(c->buf, NULL, 16);
    tc_consume(c, (size_t)(nl - c->buf) + 1);
    while (c->len < size + 2)
        if (tc_fill(c) <= 0)
            return -1;
    if (size >= cap || c->buf[size] != '\r' || c->buf[size + 1] != '\n')
        return -1;
    memcpy(out, c->buf, size);
    out[size] = '\0';
    tc_consume(c, size + 2);
    return (ssize_t)size;
}

/* Reads a whole response (Content-Length, chunked, or until close). 0 or -1. */
static inline int tc_read_response(tconn_t *c, tresp_t *r)
{
    if (tc_read_head(c, r) != 0)
        return -1;
    char v[64];
    if (r->status == 204 || r->status == 304 || r->status < 200) {
        r->body = calloc(1, 1);
        return 0;
    }
    if (r->chunked) {
        size_t cap = 1 << 20;
        r->body = malloc(cap);
        char *tmp = malloc(cap);
        for (;;) {
            ssize_t n = tc_read_chunk(c, tmp, cap);
            if (n < 0 || r->body_len + (size_t)n >= cap) {
                free(tmp);
                return -1;
            }
            if (n == 0)
                break;
            memcpy(r->body + r->body_len, tmp, (size_t)n);
            r->body_len += (size_t)n;
        }
        free(tmp);
        r->body[r->body_len] = '\0';
        return 0;
    }
    if (head_get(r->head, "content-length", v, sizeof(v))) {
        size_t len = strtoul(v, NULL, 10);
        while (c->len < len)
            if (tc_fill(c) <= 0)
                return -1;
        r->body = malloc(len + 1);
        memcpy(r->body, c->buf, len);
        r->body[len] = '\0';
        r->body_len = len;
        tc_consume(c, len);
        return 0;
    }
    while (tc_fill(c) > 0)
        ;
    if (!c->eof)
        return -1;
    r->body = malloc(c->len + 1);
    memcpy(r->body, c->buf, c->len);
    r->body[c->len] = '\0';
    r->body_len = c->len;
    tc_consume(c, c->len);
    return 0;
}

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* A port nothing listens on: bound, read back, closed again. */
static inline int unused_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &l) != 0)
        return -1;
    close(fd);
    return ntohs(a.sin_port);
}

#endif
