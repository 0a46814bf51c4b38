/* migrate.c — what the client has of a stream and the continuation that carries it (migrate.h).
 */
#include "router/dataplane/migrate.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/json_scan.h"

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

/* The sequence an index names (absent: 0), or NULL (the stream is then not understood). */
static baton_mig_seq_t *seq_at(baton_mig_t *m, const baton_json_val_t *index)
{
    if (!index)
        return m->n_seq ? &m->seq[0] : NULL;
    if (index->type != BATON_JSON_INTEGER)
        return NULL;
    int64_t i = baton_json_int(index);
    return i >= 0 && (uint64_t)i < m->n_seq ? &m->seq[i] : NULL;
}

/* The members of one small object, read in one walk (every event is read: no lookup walks an
 * object twice). Absent members stay NULL; the last duplicate wins, as everywhere. */
typedef struct fields_s {
    const char *const *keys;
    size_t n;
    baton_json_val_t val[6];
    const baton_json_val_t *got[6];
} fields_t;

static void fields_read(fields_t *f, const baton_json_val_t *obj)
{
    baton_json_iter_t it;
    baton_json_val_t k, v;
    for (size_t i = 0; i < f->n; i++)
        f->got[i] = NULL;
    if (obj->type != BATON_JSON_OBJECT)
        return;
    baton_json_iter_init(&it, obj);
    while (baton_json_object_next(&it, &k, &v)) {
        for (size_t i = 0; i < f->n; i++) {
            if (baton_json_str_eq(&k, f->keys[i])) {
                f->val[i] = v;
                f->got[i] = &f->val[i];
                break;
            }
        }
    }
}

static int is_set(const baton_json_val_t *v)
{
    return v && v->type != BATON_JSON_NULL;
}

static const baton_json_val_t *top(const baton_json_scan_t *sc, const char *key)
{
    const baton_json_member_t *m = baton_json_scan_get(sc, key);
    return m ? &m->val : NULL;
}

/* chat / completions: every choice's piece of text and whether it finished. */
static int note_choices(baton_mig_t *m, const baton_json_scan_t *sc)
{
    static const char *const keys[] = {"index", "delta", "text", "finish_reason"};
    enum { K_INDEX, K_DELTA, K_TEXT, K_FINISH };
    const baton_json_val_t *choices = top(sc, "choices");
    baton_json_val_t c, t;
    if (is_set(top(sc, "usage")))
        m->usage = 1;
    if (!choices)
        return 0;
    if (choices->type != BATON_JSON_ARRAY)
        return BATON_EINVAL;
    baton_json_iter_t it;
    baton_json_iter_init(&it, choices);
    while (baton_json_array_next(&it, &c)) {
        fields_t f = {keys, 4, {{0}}, {0}};
        fields_read(&f, &c);
        baton_mig_seq_t *s = c.type == BATON_JSON_OBJECT ? seq_at(m, f.got[K_INDEX]) : NULL;
        if (!s)
            return BATON_EINVAL;
        int has = m->api == BATON_API_CHAT
                      ? f.got[K_DELTA] && baton_json_object_get(f.got[K_DELTA], "content", &t)
                      : f.got[K_TEXT] && (t = *f.got[K_TEXT], 1);
        if (has && t.type == BATON_JSON_STRING && baton_json_str_append(&t, &s->text) != 0)
            return BATON_ENOMEM;
        if (has && t.type != BATON_JSON_STRING && t.type != BATON_JSON_NULL)
            return BATON_EINVAL;
        s->seen = 1;
        if (is_set(f.got[K_FINISH]))
            s->finished = 1;
    }
    return 0;
}

/* /generate: the whole text so far, its token count, whether it finished. */
static int note_generate(baton_mig_t *m, const baton_json_scan_t *sc,
                         const baton_json_val_t *const *meta)
{
    const baton_json_val_t *t = top(sc, "text"), *ct = meta[1];
    baton_mig_seq_t *s = seq_at(m, top(sc, "index"));
    if (!s || !t || t->type != BATON_JSON_STRING || !ct || ct->type != BATON_JSON_INTEGER)
        return BATON_EINVAL;
    baton_buf_reset(&s->text);
    if (baton_json_str_append(t, &s->text) != 0)
        return BATON_ENOMEM;
    s->tokens = baton_json_int(ct);
    s->seen = 1;
    if (is_set(meta[2]))
        s->finished = 1;
    return 0;
}

/* The event with the first stream's id and created, as a whole event into out. */
static int rewrite(baton_mig_t *m, const char *payload, size_t len, baton_buf_t *out)
{
    json_t *ev = json_loadb(payload, len, 0, NULL);
    json_t *holder = m->api == BATON_API_GENERATE ? json_object_get(ev, "meta_info") : ev;
    if (json_is_object(holder))
        json_object_set_new(holder, "id", json_string(m->id));
    if (json_is_integer(json_object_get(ev, "created")))
        json_object_set_new(ev, "created", json_integer(m->created));
    char *s = ev ? json_dumps(ev, JSON_COMPACT | JSON_REAL_PRECISION(12)) : NULL;
    json_decref(ev);
    baton_buf_reset(out);
    int rc = s && baton_buf_append_str(out, "data: ") == 0 && baton_buf_append_str(out, s) == 0 &&
                     baton_buf_append_str(out, "\n\n") == 0
                 ? 1
                 : BATON_ENOMEM;
    free(s);
    return rc;
}

/* Every event of a continued stream is read with the scanner (no tree, no allocation, each
 * object walked once): this runs for every event of every stream of a worker that takes
 * continuations. */
int baton_mig_event(baton_mig_t *m, const char *payload, size_t len, baton_buf_t *out)
{
    static const char *const meta_keys[] = {"id", "completion_tokens", "finish_reason"};
    if (m->broken)
        return 0;
    if (len == 6 && memcmp(payload, "[DONE]", 6) == 0) {
        m->done = 1;
        return 0;
    }
    baton_json_member_t space[16];
    baton_json_scan_t sc;
    baton_json_scan_init(&sc, space, sizeof(space) / sizeof(space[0]));
    fields_t meta = {meta_keys, 3, {{0}}, {0}};
    const baton_json_val_t *id = NULL, *cr = NULL;
    int rc = baton_json_scan(&sc, payload, len);
    if (rc == BATON_ENOMEM)
        goto out;
    if (rc == 0 && sc.root.type == BATON_JSON_OBJECT && !top(&sc, "error")) {
        if (m->api == BATON_API_GENERATE) {
            const baton_json_val_t *mi = top(&sc, "meta_info");
            if (mi)
                fields_read(&meta, mi);
            id = meta.got[0];
        } else {
            id = top(&sc, "id");
        }
        cr = top(&sc, "created");
    }
    if (!id || id->type != BATON_JSON_STRING) {
        rc = 0;
        m->broken = 1; /* the worker's own error event, or not understood: the stream ends */
        goto out;
    }
    int64_t created = cr && cr->type == BATON_JSON_INTEGER ? baton_json_int(cr) : 0;
    rc = m->api == BATON_API_GENERATE ? note_generate(m, &sc, meta.got) : note_choices(m, &sc);
    if (rc == BATON_EINVAL) {
        rc = 0;
        m->broken = 1;
        goto out;
    }
    if (rc)
        goto out;
    if (!m->id[0]) {
        size_t n = baton_json_str_len(id);
        baton_buf_t b = BATON_BUF_INIT;
        if (n == 0 || n >= sizeof(m->id) || baton_json_str_append(id, &b) != 0) {
            baton_buf_free(&b);
            m->broken = 1;
            goto out;
        }
        memcpy(m->id, b.data, n);
        m->id[n] = '\0';
        baton_buf_free(&b);
        m->created = created;
    } else if (m->migrations && (!baton_json_str_eq(id, m->id) || created != m->created)) {
        rc = rewrite(m, payload, len, out);
    }
out:
    baton_json_scan_free(&sc);
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
