/* migrate.c — what the client has of a stream and the continuation that carries it (migrate.h).
 */
#include "router/dataplane/migrate.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"

baton_mig_t *baton_mig_new(const baton_pdreq_t *req)
{
    if (!req->stream || req->logprobs ||
        (req->api != BATON_API_CHAT && req->api != BATON_API_COMPLETIONS &&
         req->api != BATON_API_GENERATE))
        return NULL;
    baton_mig_t *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->api = req->api;
    m->n_seq = baton_pdreq_n_rooms(req);
    m->seq = calloc(m->n_seq, sizeof(*m->seq));
    if (!m->seq) {
        free(m);
        return NULL;
    }
    for (size_t i = 0; i < m->n_seq; i++)
        m->seq[i].tokens = -1;
    return m;
}

void baton_mig_free(baton_mig_t *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_seq; i++)
        baton_buf_free(&m->seq[i].text);
    free(m->seq);
    baton_buf_free(&m->member);
    free(m);
}

int baton_mig_possible(const baton_mig_t *m)
{
    return m && m->capable && !m->broken && !m->done;
}

/* The sequence an index names, or NULL (the stream is then not understood). */
static baton_mig_seq_t *seq_at(baton_mig_t *m, json_t *index)
{
    json_int_t i = index ? (json_is_integer(index) ? json_integer_value(index) : -1) : 0;
    return i >= 0 && (size_t)i < m->n_seq ? &m->seq[i] : NULL;
}

static int note_choices(baton_mig_t *m, json_t *ev)
{
    json_t *choices = json_object_get(ev, "choices"), *c;
    size_t k;
    if (json_object_get(ev, "usage") && !json_is_null(json_object_get(ev, "usage")))
        m->usage = 1;
    json_array_foreach(choices, k, c)
    {
        baton_mig_seq_t *s = seq_at(m, json_object_get(c, "index"));
        if (!s)
            return BATON_EINVAL;
        json_t *t = m->api == BATON_API_CHAT
                        ? json_object_get(json_object_get(c, "delta"), "content")
                        : json_object_get(c, "text");
        if (t && !json_is_null(t) && !json_is_string(t))
            return BATON_EINVAL;
        if (json_is_string(t) &&
            baton_buf_append(&s->text, json_string_value(t), json_string_length(t)) != 0)
            return BATON_ENOMEM;
        s->seen = 1;
        json_t *f = json_object_get(c, "finish_reason");
        if (f && !json_is_null(f))
            s->finished = 1;
    }
    return 0;
}

static int note_generate(baton_mig_t *m, json_t *ev)
{
    baton_mig_seq_t *s = seq_at(m, json_object_get(ev, "index"));
    json_t *t = json_object_get(ev, "text");
    json_t *meta = json_object_get(ev, "meta_info");
    json_t *ct = json_object_get(meta, "completion_tokens");
    if (!s || !json_is_string(t) || !json_is_integer(ct))
        return BATON_EINVAL;
    baton_buf_reset(&s->text); /* /generate's text is the whole text so far */
    if (baton_buf_append(&s->text, json_string_value(t), json_string_length(t)) != 0)
        return BATON_ENOMEM;
    s->tokens = json_integer_value(ct);
    s->seen = 1;
    json_t *f = json_object_get(meta, "finish_reason");
    if (f && !json_is_null(f))
        s->finished = 1;
    return 0;
}

/* The first stream's id and created on this event (after a migration). 1 when changed. */
static int rewrite(baton_mig_t *m, json_t *ev)
{
    json_t *holder = m->api == BATON_API_GENERATE ? json_object_get(ev, "meta_info") : ev;
    json_t *id = json_object_get(holder, "id");
    int changed = 0;
    if (json_is_string(id) && strcmp(json_string_value(id), m->id) != 0) {
        json_object_set_new(holder, "id", json_string(m->id));
        changed = 1;
    }
    json_t *cr = json_object_get(ev, "created");
    if (json_is_integer(cr) && json_integer_value(cr) != m->created) {
        json_object_set_new(ev, "created", json_integer(m->created));
        changed = 1;
    }
    return changed;
}

int baton_mig_event(baton_mig_t *m, const char *payload, size_t len, baton_buf_t *out)
{
    if (m->broken)
        return 0;
    if (len == 6 && memcmp(payload, "[DONE]", 6) == 0) {
        m->done = 1;
        return 0;
    }
    json_t *ev = json_loadb(payload, len, 0, NULL);
    int rc = 0;
    if (!json_is_object(ev) || json_object_get(ev, "error")) {
        m->broken = 1; /* the worker's own error event: it goes out, and the stream ends */
        goto out;
    }
    rc = m->api == BATON_API_GENERATE ? note_generate(m, ev) : note_choices(m, ev);
    if (rc == BATON_EINVAL) {
        m->broken = 1;
        rc = 0;
        goto out;
    }
    if (rc)
        goto out;
    if (!m->id[0]) {
        json_t *holder = m->api == BATON_API_GENERATE ? json_object_get(ev, "meta_info") : ev;
        const char *id = json_string_value(json_object_get(holder, "id"));
        size_t n = id ? strlen(id) : 0;
        if (!id || !n || n >= sizeof(m->id)) {
            m->broken = 1;
            goto out;
        }
        memcpy(m->id, id, n + 1);
        m->created = json_integer_value(json_object_get(ev, "created"));
    } else if (m->migrations && rewrite(m, ev)) {
        char *s = json_dumps(ev, JSON_COMPACT | JSON_REAL_PRECISION(12));
        baton_buf_reset(out);
        rc = s && baton_buf_append_str(out, "data: ") == 0 && baton_buf_append_str(out, s) == 0 &&
                     baton_buf_append_str(out, "\n\n") == 0
                 ? 1
                 : BATON_ENOMEM;
        free(s);
    }
out:
    json_decref(ev);
    return rc;
}

int baton_mig_build(baton_mig_t *m)
{
    json_t *choices = json_array();
    for (size_t i = 0; choices && i < m->n_seq; i++) {
        baton_mig_seq_t *s = &m->seq[i];
        json_t *e = !s->seen ? json_null()
                             : json_pack("{s:s%,s:b}", "text", s->text.data ? s->text.data : "",
                                         s->text.len, "finished", (int)s->finished);
        if (e && s->seen && s->tokens >= 0)
            json_object_set_new(e, "tokens", json_integer(s->tokens));
        if (!e || json_array_append_new(choices, e) != 0) {
            json_decref(choices);
            return BATON_ENOMEM;
        }
    }
    json_t *j = choices ? json_pack("{s:o}", "choices", choices) : NULL;
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    baton_buf_reset(&m->member);
    int rc = s && baton_buf_append_str(&m->member, ",\"baton_continuation\":") == 0 &&
                     baton_buf_append_str(&m->member, s) == 0
                 ? 0
                 : BATON_ENOMEM;
    free(s);
    return rc;
}
