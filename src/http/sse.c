/* sse.c — SSE event splitting (whole bodies and incremental) and the router's error event. */
#include "http/sse.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "baton/error.h"

/*
 * Finds complete events in buf[0..len): an event ends after an empty line ("\n\n", "\r\n\r\n",
 * or mixed). *scan_p and *line_p carry the scan position across calls; returns the end offset of
 * the first complete event, or 0 when there is none yet.
 */
static size_t next_event_end(const char *buf, size_t len, size_t *scan_p, size_t *line_p)
{
    size_t ls = *line_p;
    for (size_t i = *scan_p; i < len; i++) {
        const char *nl = memchr(buf + i, '\n', len - i); /* the relay runs this on every byte */
        if (!nl)
            break;
        i = (size_t)(nl - buf);
        if (i == ls || (i == ls + 1 && buf[ls] == '\r')) {
            *scan_p = *line_p = 0;
            return i + 1;
        }
        ls = i + 1;
    }
    *scan_p = len;
    *line_p = ls;
    return 0;
}

/* The value of the next "data:" line of raw[*i_p..len) (one leading space dropped), moving *i_p
 * past it; 0 when there is none left. */
static int next_data(const char *raw, size_t len, size_t *i_p, const char **d_p, size_t *n_p)
{
    size_t i = *i_p;
    while (i < len) {
        const char *nl = memchr(raw + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - raw) : len;
        size_t l = end - i;
        const char *line = raw + i;
        i = end + 1;
        if (l > 0 && line[l - 1] == '\r')
            l--;
        if (l >= 5 && memcmp(line, "data:", 5) == 0) {
            const char *d = line + 5;
            size_t n = l - 5;
            if (n && *d == ' ') {
                d++;
                n--;
            }
            *i_p = i;
            *d_p = d;
            *n_p = n;
            return 1;
        }
    }
    *i_p = i;
    return 0;
}

int baton_sse_single_data(const char *raw, size_t len, const char **payload_p, size_t *len_p)
{
    const char *payload = NULL, *d;
    size_t plen = 0, n, i = 0;
    while (next_data(raw, len, &i, &d, &n)) {
        if (payload)
            return 0; /* several data lines: not the simple case */
        payload = d;
        plen = n;
    }
    if (!payload)
        return 0;
    *payload_p = payload;
    *len_p = plen;
    return 1;
}

/* Joins the data lines of one raw event into `tmp` (or points into raw for one line). */
static int event_payload(const char *raw, size_t len, baton_buf_t *tmp, const char **p, size_t *n)
{
    if (baton_sse_single_data(raw, len, p, n))
        return 1;
    baton_buf_reset(tmp);
    int any = 0;
    const char *d;
    size_t dl, i = 0;
    while (next_data(raw, len, &i, &d, &dl)) {
        if ((any && baton_buf_append(tmp, "\n", 1)) || baton_buf_append(tmp, d, dl))
            return BATON_ENOMEM;
        any = 1;
    }
    if (!any)
        return 0;
    *p = tmp->data ? tmp->data : "";
    *n = tmp->len;
    return 1;
}

int baton_sse_each(const char *body, size_t len, baton_sse_event_cb cb, void *arg)
{
    baton_buf_t tmp = BATON_BUF_INIT;
    size_t off = 0, scan = 0, line = 0;
    int rc = 0;
    while (off < len && rc == 0) {
        size_t end = next_event_end(body + off, len - off, &scan, &line);
        if (!end)
            break;
        const char *p;
        size_t n;
        int has = event_payload(body + off, end, &tmp, &p, &n);
        if (has < 0)
            rc = has;
        else if (has)
            rc = cb(p, n, arg);
        off += end;
    }
    baton_buf_free(&tmp);
    return rc;
}

int baton_sse_feed(baton_sse_splitter_t *s, const char *data, size_t len, baton_sse_event_cb raw_cb,
                   void *arg)
{
    int rc;
    if (s->pending.len == 0) {
        /* Fast path: events wholly inside this chunk go out without a copy. */
        size_t off = 0;
        s->scan = s->line_start = 0;
        while (off < len) {
            size_t end = next_event_end(data + off, len - off, &s->scan, &s->line_start);
            if (!end)
                break;
            if ((rc = raw_cb(data + off, end, arg)) != 0) {
                s->scan = s->line_start = 0;
                return rc;
            }
            off += end;
        }
        if (off < len && baton_buf_append(&s->pending, data + off, len - off))
            return BATON_ENOMEM;
        return 0;
    }
    if (baton_buf_append(&s->pending, data, len))
        return BATON_ENOMEM;
    size_t off = 0;
    for (;;) {
        size_t scan = s->scan - off, line = s->line_start - off;
        size_t end = next_event_end(s->pending.data + off, s->pending.len - off, &scan, &line);
        s->scan = scan + off;
        s->line_start = line + off;
        if (!end)
            break;
        rc = raw_cb(s->pending.data + off, end, arg);
        off += end;
        s->scan = s->line_start = off;
        if (rc) {
            baton_buf_reset(&s->pending);
            s->scan = s->line_start = 0;
            return rc;
        }
    }
    baton_buf_consume(&s->pending, off);
    s->scan -= off;
    s->line_start -= off;
    return 0;
}

void baton_sse_splitter_free(baton_sse_splitter_t *s)
{
    baton_buf_free(&s->pending);
    s->scan = s->line_start = 0;
}

int baton_sse_error_event(baton_buf_t *out, const char *message, const char *type, const char *code)
{
    json_t *err = json_pack("{s:{s:s,s:s,s:s?}}", "error", "message", message ? message : "",
                            "type", type ? type : "upstream_error", "code", code);
    if (!err)
        return BATON_ENOMEM;
    char *s = json_dumps(err, JSON_COMPACT);
    json_decref(err);
    if (!s)
        return BATON_ENOMEM;
    int rc = baton_buf_printf(out, "data: %s\n\ndata: [DONE]\n\n", s);
    free(s);
    return rc;
}
