/* head.c — an HTTP message head: begin and finish (the per-piece calls are inline in head.h). */
#include "http/head.h"

void baton__http_head_begin(baton__http_head_t *h, size_t max_bytes, size_t max_headers)
{
    baton_buf_reset(&h->arena);
    baton_buf_reset(&h->hdrs);
    h->n_hdrs = 0;
    h->bytes = 0;
    h->max_bytes = max_bytes;
    h->max_headers = max_headers;
    h->in_field = 0;
    h->done = 0;
}

int baton__http_head_finish(baton__http_head_t *h, const baton_http_header_t **headers_p,
                            size_t *n_p)
{
    /* The pointers go after the offsets, aligned, in the same buffer. */
    size_t n = h->n_hdrs;
    size_t off_bytes = n * sizeof(baton__http_hdr_off_t);
    size_t align = (off_bytes + 15) & ~(size_t)15;
    if (baton_buf_reserve(&h->hdrs, align - off_bytes + n * sizeof(baton_http_header_t) + 16) != 0)
        return BATON__HEAD_NOMEM;
    const char *base = h->arena.data ? h->arena.data : "";
    const baton__http_hdr_off_t *offs = (const baton__http_hdr_off_t *)h->hdrs.data;
    baton_http_header_t *hs = (baton_http_header_t *)(h->hdrs.data + align);
    for (size_t i = 0; i < n; i++) {
        hs[i].name = base + offs[i].name;
        hs[i].value = offs[i].value == BATON__HEAD_NO_VALUE ? "" : base + offs[i].value;
    }
    h->done = 1;
    *headers_p = n ? hs : NULL;
    *n_p = n;
    return 0;
}
