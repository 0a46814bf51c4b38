/* url.c — parsing of upstream "http[s]://host:port/prefix" URLs (see common.h). */
#include "http/common.h"

#include "baton/error.h"

#include <string.h>
#include <strings.h>
#include <uv.h>

/* Characters allowed in a registered name or IPv4 literal (RFC 3986 unreserved subset). */
static int host_char_ok(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_';
}

/* Path characters: anything visible except the ones that would start a query or fragment. */
static int path_char_ok(char c)
{
    return c > 0x20 && c < 0x7f && c != '?' && c != '#' && c != '\\';
}

int baton_url_parse(const char *url, baton_url_t *out)
{
    if (url == NULL || out == NULL)
        return BATON_EINVAL;
    baton_url_t u;
    memset(&u, 0, sizeof(u));
    const char *p;
    if (strncasecmp(url, "http://", 7) == 0) {
        p = url + 7;
        u.port = 80;
    } else if (strncasecmp(url, "https://", 8) == 0) {
        p = url + 8;
        u.port = 443;
        u.tls = 1;
    } else {
        return BATON_EINVAL;
    }

    size_t hlen;
    if (*p == '[') {
        const char *end = strchr(p + 1, ']');
        if (end == NULL)
            return BATON_EINVAL;
        hlen = (size_t)(end - (p + 1));
        if (hlen == 0 || hlen >= sizeof(u.host))
            return BATON_EINVAL;
        memcpy(u.host, p + 1, hlen);
        u.host[hlen] = '\0';
        unsigned char tmp[16];
        if (uv_inet_pton(AF_INET6, u.host, tmp) != 0)
            return BATON_EINVAL;
        p = end + 1;
    } else {
        const char *s = p;
        while (host_char_ok(*p))
            p++;
        hlen = (size_t)(p - s);
        if (hlen == 0 || hlen >= sizeof(u.host))
            return BATON_EINVAL;
        memcpy(u.host, s, hlen);
        u.host[hlen] = '\0';
    }

    if (*p == ':') {
        p++;
        long port = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9') {
            port = port * 10 + (*p - '0');
            if (port > 65535)
                return BATON_EINVAL;
            p++;
            digits++;
        }
        if (digits == 0 || port == 0)
            return BATON_EINVAL;
        u.port = (int)port;
    }

    if (*p != '\0' && *p != '/')
        return BATON_EINVAL;
    size_t plen = strlen(p);
    for (size_t i = 0; i < plen; i++)
        if (!path_char_ok(p[i]))
            return BATON_EINVAL;
    while (plen > 0 && p[plen - 1] == '/')
        plen--;
    if (plen >= sizeof(u.prefix))
        return BATON_EINVAL;
    memcpy(u.prefix, p, plen);
    u.prefix[plen] = '\0';

    *out = u;
    return 0;
}
