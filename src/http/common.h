/* common.h — types shared by the HTTP server and client: headers, URLs. */
#ifndef BATON_HTTP_COMMON_H
#define BATON_HTTP_COMMON_H

#include <stddef.h>

typedef struct baton_http_header_s {
    const char *name; /* NUL-terminated */
    const char *value;
} baton_http_header_t;

/* A parsed "http://host:port/prefix" or "https://..." URL. */
typedef struct baton_url_s {
    char host[256];   /* without brackets for IPv6 */
    int port;         /* 80 (443 for https) when absent */
    char prefix[256]; /* path prefix without trailing '/', "" for none */
    int tls;          /* 1 for https:// */
} baton_url_t;

/* 0 or BATON_EINVAL (not http:// or https://, empty host, bad port, too long). */
int baton_url_parse(const char *url, baton_url_t *out);

#endif
