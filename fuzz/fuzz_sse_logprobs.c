/* fuzz/fuzz_sse_logprobs.c — libFuzzer harness for the SSE splitter (fed in arbitrary chunks,
 * checked against the whole-body walker) and the prefill→decode logprob merge (body and
 * per-event), as the router's relay runs them on worker responses. */
#include <string.h>

#include "baton/error.h"
#include "common/log.h"
#include "fuzz_check.h"
#include "http/sse.h"
#include "router/dataplane/pdreq.h"

typedef struct {
    baton_pdreq_lp_t *lp;
    baton_buf_t scratch;
    baton_buf_t raw; /* every complete event's raw bytes, concatenated */
    size_t events;
} relay_t;

static int on_raw(const char *ev, size_t len, void *arg)
{
    relay_t *r = arg;
    CHECK(len >= 1);
    CHECK(baton_buf_append(&r->raw, ev, len) == 0);
    r->events++;
    const char *payload;
    size_t plen;
    if (baton_sse_single_data(ev, len, &payload, &plen)) {
        CHECK(payload >= ev && payload + plen <= ev + len);
        baton_buf_reset(&r->scratch);
        int rc = baton_pdreq_merge_event(r->lp, payload, plen, &r->scratch);
        CHECK(rc == 0 || rc == 1 || rc == BATON_ENOMEM);
    }
    return 0;
}

static int count_cb(const char *payload, size_t len, void *arg)
{
    (void)payload;
    (void)len;
    (*(size_t *)arg)++;
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    baton_log_set_level(BATON_LOG_ERROR);
    return 0;
}

/* Input: step byte, then prefill's body, a NUL, then decode's body / stream. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t step = (size_t)(data[0] % 32) + 1;
    const char *in = (const char *)data + 1;
    size--;
    const char *sep = memchr(in, '\0', size);
    size_t plen = sep ? (size_t)(sep - in) : size;
    const char *dec = sep ? sep + 1 : in;
    size_t dlen = sep ? size - plen - 1 : size;

    baton_pdreq_lp_t *lp = baton_pdreq_lp_extract(in, plen);
    baton_buf_t merged = BATON_BUF_INIT;
    int rc = baton_pdreq_merge_body(lp, dec, dlen, &merged);
    CHECK(rc == 0 || rc == 1 || rc == BATON_ENOMEM);
    baton_buf_free(&merged);

    relay_t r = {.lp = lp, .scratch = BATON_BUF_INIT, .raw = BATON_BUF_INIT};
    baton_sse_splitter_t s = BATON_SSE_SPLITTER_INIT;
    for (size_t off = 0; off < dlen; off += step) {
        size_t n = dlen - off < step ? dlen - off : step;
        CHECK(baton_sse_feed(&s, dec + off, n, on_raw, &r) == 0);
    }
    /* Chunking must not matter: what came out plus what is held back is the input, and the
     * whole-body walker sees as many complete events. */
    CHECK(r.raw.len + baton_sse_pending(&s) == dlen);
    CHECK(r.raw.len == 0 || memcmp(r.raw.data, dec, r.raw.len) == 0);
    size_t whole = 0;
    baton_sse_each(dec, r.raw.len, count_cb, &whole);
    CHECK(whole <= r.events);
    baton_sse_splitter_free(&s);
    baton_buf_free(&r.raw);
    baton_buf_free(&r.scratch);
    baton_pdreq_lp_free(lp);
    return 0;
}
