/* rtok.c — the router's tokenizers: loading the per-model set, the refcounted snapshot the loops
 * share, each loop's scratch, and its cache of multi-turn prompt prefixes. */
#include "router/dataplane/rtok.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include <uv.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/list.h"
#include "common/log.h"
#include "tokenizer/tok_api.h"

/* ---- loading ---- */

static void model_free(baton_rtok_model_t *m)
{
    free(m->model);
    free(m->path);
    baton_tmpl_free(m->tmpl);
    baton_tok_free(m->tok);
    for (size_t i = 0; i < m->n_cuts; i++)
        free(m->cuts[i]);
    free(m->cuts);
    free(m->cut_lens);
}

void baton_rtok_set_unref(baton_rtok_set_t *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    for (size_t i = 0; i < s->n; i++)
        model_free(&s->m[i]);
    free(s->m);
    free(s);
}

/* "MODEL=VALUE" or "VALUE" (a value starting with '/' or '.' is a path even with a '='). */
static void split_entry(const char *e, char *model, size_t mlen, const char **value)
{
    const char *eq = strchr(e, '=');
    model[0] = '\0';
    *value = e;
    if (!eq || e[0] == '/' || e[0] == '.')
        return;
    size_t n = (size_t)(eq - e);
    if (n >= mlen)
        n = mlen - 1;
    memcpy(model, e, n);
    model[n] = '\0';
    *value = eq + 1;
}

static baton_rtok_model_t *find_exact(baton_rtok_set_t *s, const char *model)
{
    for (size_t i = 0; i < s->n; i++)
        if ((!model[0] && !s->m[i].model) ||
            (model[0] && s->m[i].model && strcmp(s->m[i].model, model) == 0))
            return &s->m[i];
    return NULL;
}

/* Whether a's text and b's overlap in a way that could make a match of one cut across the
 * other: one contains the other, or a suffix of one is a prefix of the other. */
static int overlaps(const char *a, size_t la, const char *b, size_t lb)
{
    if (la == lb && memcmp(a, b, la) == 0)
        return 0;
    if (la >= lb ? memmem(a, la, b, lb) != NULL : memmem(b, lb, a, la) != NULL)
        return 1;
    size_t m = la < lb ? la : lb;
    for (size_t k = 1; k < m; k++)
        if (memcmp(a + la - k, b, k) == 0 || memcmp(b + lb - k, a, k) == 0)
            return 1;
    return 0;
}

/* Appends a candidate cut token (its text stays owned by the tokenizer). */
static int add_cand(const char ***v, size_t **l, size_t *n, size_t *cap, const char *t, size_t len)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        const char **nv = realloc(*v, c * sizeof(*nv));
        if (!nv)
            return BATON_ENOMEM;
        *v = nv;
        size_t *nl = realloc(*l, c * sizeof(*nl));
        if (!nl)
            return BATON_ENOMEM;
        *l = nl;
        *cap = c;
    }
    (*v)[*n] = t;
    (*l)[(*n)++] = len;
    return 0;
}

/* The cut tokens: the added tokens' texts (special or not: Qwen's <|im_start|> and <think>,
 * DeepSeek's <｜User｜>), all matched before the model runs, when no two of them overlap; else
 * none (the cache is off for this tokenizer). */
static int find_cuts(baton_rtok_model_t *m)
{
    uint32_t n = baton_tok_vocab_size(m->tok);
    size_t cap = 0, na = 0, len;
    const char **added = NULL, *t;
    size_t *alen = NULL;
    int rc = 0, ok = 1;
    for (uint32_t id = 0; id < n && rc == 0; id++)
        if (baton_tok_is_added(m->tok, id) && (t = baton_tok_token_bytes(m->tok, id, &len)) &&
            len > 0)
            rc = add_cand(&added, &alen, &na, &cap, t, len);
    for (size_t i = 0; i < na && ok && rc == 0; i++)
        for (size_t j = i + 1; j < na && ok; j++)
            if (overlaps(added[i], alen[i], added[j], alen[j]))
                ok = 0;
    if (rc == 0 && ok && na) {
        m->cuts = calloc(na, sizeof(*m->cuts));
        m->cut_lens = calloc(na, sizeof(*m->cut_lens));
        if (!m->cuts || !m->cut_lens)
            rc = BATON_ENOMEM;
        for (size_t i = 0; i < na && rc == 0; i++) {
            if (alen[i] > BATON_RTOK_CUT_MAX)
                continue;
            if (!(m->cuts[m->n_cuts] = strndup(added[i], alen[i]))) {
                rc = BATON_ENOMEM;
                break;
            }
            m->cut_lens[m->n_cuts++] = alen[i];
            unsigned char b = (unsigned char)added[i][0];
            m->cut_first[b >> 6] |= 1ull << (b & 63);
        }
    }
    free(added);
    free(alen);
    return rc;
}

static int load_model(baton_rtok_model_t *m, const char *path, char *err, size_t errlen)
{
    char why[400] = "";
    int rc = baton_tok_load(path, &m->tok, why, sizeof(why));
    if (rc) {
        snprintf(err, errlen, "%s", why[0] ? why : baton_strerror(rc));
        return rc;
    }
    const char *src = baton_tok_config_str(m->tok, "chat_template");
    if (src && (rc = baton_tmpl_compile(src, strlen(src), &m->tmpl, why, sizeof(why))) != 0) {
        snprintf(err, errlen, "chat_template: %s", why);
        return rc;
    }
    /* transformers' Llama tokenizers add bos themselves when tokenizer_config.json says
     * add_bos_token and the post-processor adds nothing (DeepSeek V3). */
    baton_tok_scratch_t *sc = baton_tok_scratch_new();
    if (!sc) {
        snprintf(err, errlen, "out of memory");
        return BATON_ENOMEM;
    }
    m->add_bos = baton_tok_prompt_adds_bos(m->tok, sc);
    baton_tok_scratch_free(sc);
    if ((rc = find_cuts(m)) != 0)
        snprintf(err, errlen, "out of memory");
    return rc;
}

int baton_rtok_set_load(const baton_config_t *cfg, baton_rtok_set_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (cfg->tokenizers.n == 0 && cfg->max_model_lens.n == 0)
        return 0;
    baton_rtok_set_t *s = calloc(1, sizeof(*s));
    if (!s || !(s->m = calloc(cfg->tokenizers.n + 1, sizeof(*s->m)))) {
        free(s);
        snprintf(err, errlen, "out of memory");
        return BATON_ENOMEM;
    }
    atomic_init(&s->refs, 1);
    int rc = 0;
    char model[512];
    const char *value;
    for (size_t i = 0; i < cfg->tokenizers.n && rc == 0; i++) {
        split_entry(cfg->tokenizers.v[i], model, sizeof(model), &value);
        baton_rtok_model_t *m = find_exact(s, model);
        if (m) { /* a later entry for the same model wins (the command line over the file) */
            model_free(m);
            memset(m, 0, sizeof(*m));
        } else {
            m = &s->m[s->n++];
        }
        char why[480] = "";
        if ((model[0] && !(m->model = strdup(model))) || !(m->path = strdup(value))) {
            rc = BATON_ENOMEM;
            snprintf(err, errlen, "out of memory");
        } else if (!value[0]) {
            rc = BATON_EINVAL;
            snprintf(err, errlen, "--tokenizer %s: no path", cfg->tokenizers.v[i]);
        } else if ((rc = load_model(m, value, why, sizeof(why))) != 0) {
            snprintf(err, errlen, "--tokenizer %s%s%s: %s", model, model[0] ? "=" : "", value, why);
        }
    }
    for (size_t i = 0; i < cfg->max_model_lens.n && rc == 0; i++) {
        split_entry(cfg->max_model_lens.v[i], model, sizeof(model), &value);
        char *end;
        unsigned long long v = strtoull(value, &end, 10);
        if (!value[0] || *end || value[0] == '-' || v == 0 || v > ((uint64_t)1 << 40)) {
            rc = BATON_EINVAL;
            snprintf(err, errlen, "--max-model-len %s: expected [MODEL=]N with N in 1..2^40",
                     cfg->max_model_lens.v[i]);
            break;
        }
        if (!model[0]) {
            for (size_t j = 0; j < s->n; j++) /* every model without its own */
                if (!s->m[j].max_model_len || !s->m[j].model)
                    s->m[j].max_model_len = v;
            continue;
        }
        baton_rtok_model_t *m = find_exact(s, model);
        if (!m) {
            rc = BATON_EINVAL;
            snprintf(err, errlen,
                     "--max-model-len %s: the router has no tokenizer for model '%s' (give it "
                     "--tokenizer %s=PATH)",
                     cfg->max_model_lens.v[i], model, model);
            break;
        }
        m->max_model_len = v;
    }
    if (rc == 0 && s->n == 0) {
        rc = BATON_EINVAL;
        snprintf(err, errlen,
                 "--max-model-len needs a --tokenizer (prompts are counted in tokens)");
    }
    for (size_t i = 0; i < s->n && rc == 0; i++) {
        baton_rtok_model_t *m = &s->m[i];
        m->report_len = m->max_model_len ? m->max_model_len : baton_tok_model_max_length(m->tok);
    }
    if (rc) {
        baton_rtok_set_unref(s);
        return rc;
    }
    *out = s;
    return 0;
}

const baton_rtok_model_t *baton_rtok_find(const baton_rtok_set_t *s, const char *model)
{
    if (!s)
        return NULL;
    const baton_rtok_model_t *dflt = NULL;
    for (size_t i = 0; i < s->n; i++) {
        if (!s->m[i].model)
            dflt = &s->m[i];
        else if (model && strcmp(s->m[i].model, model) == 0)
            return &s->m[i];
    }
    if (!dflt && !model && s->n == 1)
        return &s->m[0];
    return dflt;
}

/* ---- the shared holder ---- */

struct baton_rtok_s {
    pthread_mutex_t mu;
    baton_rtok_set_t *cur;
    atomic_uint_fast64_t gen;
    size_t cache_bytes, cache_entries;
    baton_metric_family_t *refused, *failed;
    baton_metric_child_t *seconds[2], *tokens[2]; /* [0] completions, [1] chat */
    baton_metric_child_t *hits, *misses, *reused, *c_bytes, *c_entries;
};

/* Time to tokenize one prompt: 10 µs .. 1 s. */
static const double tok_buckets[] = {1e-5, 2.5e-5, 5e-5,   1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
                                     5e-3, 1e-2,   2.5e-2, 5e-2, 0.1,    0.25, 1.0};

int baton_rtok_create(baton_rtok_t **out, baton_rtok_set_t *set, size_t cache_bytes,
                      size_t cache_entries, baton_metrics_t *reg)
{
    baton_rtok_t *rt = calloc(1, sizeof(*rt));
    if (!rt)
        return BATON_ENOMEM;
    pthread_mutex_init(&rt->mu, NULL);
    rt->cur = set;
    atomic_init(&rt->gen, 1);
    rt->cache_bytes = cache_bytes;
    rt->cache_entries = cache_entries;
    if (reg) {
        static const char *const api[] = {"api"}, *const param[] = {"param"},
                                 *const reason[] = {"reason"};
        baton_metric_family_t *sec = baton_metrics_histogram(
            reg, "baton_tokenize_seconds",
            "Time the router took to compute a routed request's prompt token ids (chat template "
            "rendered and encoded), by API.",
            1, api, tok_buckets, sizeof(tok_buckets) / sizeof(tok_buckets[0]));
        baton_metric_family_t *tok = baton_metrics_counter(
            reg, "baton_prompt_tokens_total",
            "Prompt tokens of routed requests the router counted with the model's tokenizer, by "
            "API.",
            1, api);
        rt->refused = baton_metrics_counter(
            reg, "baton_context_length_refusals_total",
            "Requests refused with 400 because prompt tokens (+ max_tokens) exceed the model's "
            "context length (--max-model-len), by the parameter vLLM names.",
            1, param);
        rt->failed = baton_metrics_counter(
            reg, "baton_tokenize_failures_total",
            "Requests the router could not tokenize (sent on without token ids), by reason.", 1,
            reason);
        static const char *const apis[2] = {"completions", "chat"};
        for (int i = 0; i < 2; i++) {
            rt->seconds[i] = baton_metric_child(sec, &apis[i]);
            rt->tokens[i] = baton_metric_child(tok, &apis[i]);
        }
        baton_metric_family_t *f;
        f = baton_metrics_counter(reg, "baton_tokenize_cache_hits_total",
                                  "Chat prompts whose beginning was found in the router's "
                                  "prompt-prefix cache.",
                                  0, NULL);
        rt->hits = baton_metric_child(f, NULL);
        f = baton_metrics_counter(reg, "baton_tokenize_cache_misses_total",
                                  "Chat prompts with no prefix in the router's prompt-prefix "
                                  "cache.",
                                  0, NULL);
        rt->misses = baton_metric_child(f, NULL);
        f = baton_metrics_counter(reg, "baton_tokenize_cache_reused_tokens_total",
                                  "Token ids taken from the prompt-prefix cache instead of "
                                  "being computed.",
                                  0, NULL);
        rt->reused = baton_metric_child(f, NULL);
        f = baton_metrics_gauge(reg, "baton_tokenize_cache_bytes",
                                "Bytes held by the prompt-prefix caches of all threads "
                                "(bounded per thread by --tokenize-cache-bytes).",
                                0, NULL);
        rt->c_bytes = baton_metric_child(f, NULL);
        f = baton_metrics_gauge(reg, "baton_tokenize_cache_entries",
                                "Prefixes held by the prompt-prefix caches of all threads "
                                "(bounded per thread by --tokenize-cache-entries).",
                                0, NULL);
        rt->c_entries = baton_metric_child(f, NULL);
    }
    *out = rt;
    return 0;
}

void baton_rtok_destroy(baton_rtok_t *rt)
{
    if (!rt)
        return;
    baton_rtok_set_unref(rt->cur);
    pthread_mutex_destroy(&rt->mu);
    free(rt);
}

void baton_rtok_install(baton_rtok_t *rt, baton_rtok_set_t *set)
{
    pthread_mutex_lock(&rt->mu);
    baton_rtok_set_t *old = rt->cur;
    rt->cur = set;
    atomic_fetch_add(&rt->gen, 1);
    pthread_mutex_unlock(&rt->mu);
    baton_rtok_set_unref(old);
}

/* ---- a loop's side ---- */

typedef struct centry_s {
    baton_list_t link; /* LRU: most recent at the front */
    const baton_rtok_model_t *m;
    uint64_t head, hash; /* hash of the first CACHE_HEAD bytes, and of the whole text */
    size_t len, n_ids, bytes;
    char *text;
    uint32_t *ids;
} centry_t;

struct baton_rtok_local_s {
    baton_rtok_t *rt;
    baton_rtok_set_t *set; /* this loop's reference */
    uint64_t gen;
    baton_tok_scratch_t *sc;
    baton_list_t lru;
    size_t entries, bytes;
    baton_rtok_cache_stats_t st;
    centry_t **cand; /* lookup scratch */
    size_t cand_cap;
};

/* A prefix is looked up by its first bytes; shorter ones are not kept. */
#define CACHE_HEAD 32
/* How far back from a prompt's end a cut token is looked for. */
#define CUT_SCAN 4096

baton_rtok_local_t *baton_rtok_local_new(baton_rtok_t *rt)
{
    baton_rtok_local_t *L = calloc(1, sizeof(*L));
    if (!L || !(L->sc = baton_tok_scratch_new())) {
        free(L);
        return NULL;
    }
    L->rt = rt;
    baton_list_init(&L->lru);
    return L;
}

static void entry_drop(baton_rtok_local_t *L, centry_t *e)
{
    baton_list_remove(&e->link);
    L->entries--;
    L->bytes -= e->bytes;
    baton_gauge_add(L->rt->c_entries, -1);
    baton_gauge_add(L->rt->c_bytes, -(double)e->bytes);
    free(e->text);
    free(e->ids);
    free(e);
}

static void cache_clear(baton_rtok_local_t *L)
{
    while (!baton_list_empty(&L->lru))
        entry_drop(L, container_of(L->lru.next, centry_t, link));
}

void baton_rtok_local_free(baton_rtok_local_t *L)
{
    if (!L)
        return;
    cache_clear(L);
    baton_rtok_set_unref(L->set);
    baton_tok_scratch_free(L->sc);
    free(L->cand);
    free(L);
}

const baton_rtok_set_t *baton_rtok_local_set(baton_rtok_local_t *L)
{
    if (!L)
        return NULL;
    uint64_t g = atomic_load_explicit(&L->rt->gen, memory_order_acquire);
    if (g != L->gen) {
        cache_clear(L); /* its entries point into the old set's models */
        pthread_mutex_lock(&L->rt->mu);
        baton_rtok_set_t *s = L->rt->cur;
        if (s)
            atomic_fetch_add(&s->refs, 1);
        g = atomic_load(&L->rt->gen);
        pthread_mutex_unlock(&L->rt->mu);
        baton_rtok_set_unref(L->set);
        L->set = s;
        L->gen = g;
    }
    return L->set;
}

baton_tok_scratch_t *baton_rtok_scratch(baton_rtok_local_t *L)
{
    return L->sc;
}

void baton_rtok_count_refusal(baton_rtok_local_t *L, const char *param)
{
    if (L)
        baton_counter_inc_labels(L->rt->refused, &param);
}

void baton_rtok_count_failure(baton_rtok_local_t *L, const char *reason)
{
    if (L)
        baton_counter_inc_labels(L->rt->failed, &reason);
}

void baton_rtok_cache_stats(const baton_rtok_local_t *L, baton_rtok_cache_stats_t *st)
{
    *st = L->st;
    st->entries = L->entries;
    st->bytes = L->bytes;
}

/* Hash of text[0..len), eight bytes a step (the prefix cache hashes long prompts). */
typedef struct {
    uint64_t h;
    size_t at; /* bytes consumed, a multiple of 8 */
} whash_t;

static uint64_t whash_mix(uint64_t h, uint64_t w)
{
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

static void whash_advance(whash_t *s, const char *t, size_t to)
{
    for (; s->at + 8 <= to; s->at += 8) {
        uint64_t w;
        memcpy(&w, t + s->at, 8);
        s->h = whash_mix(s->h, w);
    }
}

/* The hash of t[0..len) given a state advanced to at most len. */
static uint64_t whash_at(whash_t s, const char *t, size_t len)
{
    whash_advance(&s, t, len);
    uint64_t w = 0;
    memcpy(&w, t + s.at, len - s.at);
    return whash_mix(whash_mix(s.h, w), len);
}

static uint64_t whash(const char *t, size_t len)
{
    whash_t s = {BATON_FNV1A64_INIT, 0};
    return whash_at(s, t, len);
}

/* The end of the last cut token in t[from..len) after which the text goes on with an ASCII
 * byte (or ends), or 0: a cut there leaves the same tokens on both sides whatever follows. */
static size_t last_cut(const baton_rtok_model_t *m, const char *t, size_t from, size_t len)
{
    /* The last cut is the generation prompt's, at the very end: look no further back than a
     * few KiB (a prompt without one there is only not cached). */
    if (len - from > CUT_SCAN)
        from = len - CUT_SCAN;
    for (size_t i = len; i > from; i--) {
        size_t at = i - 1;
        unsigned char b = (unsigned char)t[at];
        if (!(m->cut_first[b >> 6] & (1ull << (b & 63))))
            continue;
        for (size_t c = 0; c < m->n_cuts; c++) {
            size_t cl = m->cut_lens[c];
            if (m->cuts[c][0] != t[at] || at + cl > len || memcmp(t + at, m->cuts[c], cl) != 0)
                continue;
            size_t end = at + cl;
            if (end == len || (unsigned char)t[end] < 0x80)
                return end >= CACHE_HEAD ? end : 0;
        }
    }
    return 0;
}

/* The longest cached prefix of t for model m, or NULL. */
static centry_t *cache_find(baton_rtok_local_t *L, const baton_rtok_model_t *m, const char *t,
                            size_t len)
{
    if (len < CACHE_HEAD || L->entries == 0)
        return NULL;
    uint64_t head = whash(t, CACHE_HEAD);
    size_t n = 0;
    if (L->cand_cap < L->entries) {
        centry_t **c = realloc(L->cand, L->entries * sizeof(*c));
        if (!c)
            return NULL;
        L->cand = c;
        L->cand_cap = L->entries;
    }
    for (baton_list_t *it = L->lru.next; it != &L->lru; it = it->next) {
        centry_t *e = container_of(it, centry_t, link);
        if (e->m == m && e->head == head && e->len <= len &&
            (e->len == len || (unsigned char)t[e->len] < 0x80)) {
            /* insertion sort by length, ascending: the running hash checks them in one pass */
            size_t j = n++;
            while (j > 0 && L->cand[j - 1]->len > e->len) {
                L->cand[j] = L->cand[j - 1];
                j--;
            }
            L->cand[j] = e;
        }
    }
    centry_t *best = NULL;
    whash_t s = {BATON_FNV1A64_INIT, 0};
    for (size_t i = 0; i < n; i++) {
        centry_t *e = L->cand[i];
        whash_advance(&s, t, e->len & ~(size_t)7);
        if (whash_at(s, t, e->len) == e->hash)
            best = e;
    }
    /* the hash found it; the bytes decide */
    while (best && memcmp(best->text, t, best->len) != 0)
        best = NULL;
    return best;
}

static void cache_put(baton_rtok_local_t *L, const baton_rtok_model_t *m, const char *t, size_t len,
                      const uint32_t *ids, size_t n_ids)
{
    size_t bytes = sizeof(centry_t) + len + n_ids * sizeof(uint32_t);
    if (bytes > L->rt->cache_bytes || !L->rt->cache_entries)
        return;
    while (L->entries &&
           (L->entries >= L->rt->cache_entries || L->bytes + bytes > L->rt->cache_bytes))
        entry_drop(L, container_of(L->lru.prev, centry_t, link));
    centry_t *e = calloc(1, sizeof(*e));
    if (!e || !(e->text = malloc(len)) || !(e->ids = malloc(n_ids * sizeof(*ids) + 1))) {
        if (e)
            free(e->text);
        free(e);
        return;
    }
    memcpy(e->text, t, len);
    memcpy(e->ids, ids, n_ids * sizeof(*ids));
    e->m = m;
    e->len = len;
    e->n_ids = n_ids;
    e->bytes = bytes;
    e->head = whash(t, CACHE_HEAD);
    e->hash = whash(t, len);
    baton_list_push_front(&L->lru, &e->link);
    L->entries++;
    L->bytes += bytes;
    baton_gauge_add(L->rt->c_entries, 1);
    baton_gauge_add(L->rt->c_bytes, (double)bytes);
}

static int ids_append(baton_tok_ids_t *out, const uint32_t *ids, size_t n)
{
    if (out->len + n > out->cap) {
        size_t cap = out->cap ? out->cap : 64;
        while (cap < out->len + n)
            cap *= 2;
        uint32_t *p = realloc(out->ids, cap * sizeof(*p));
        if (!p)
            return BATON_ENOMEM;
        out->ids = p;
        out->cap = cap;
    }
    memcpy(out->ids + out->len, ids, n * sizeof(*ids));
    out->len += n;
    return 0;
}

/* A rendered chat prompt: [cached prefix] + ids(t[from..cut)) + ids(t[cut..len)), where cut is
 * the last cut token; t[0..cut) and its ids become the cache entry (replacing the prefix it
 * extends). */
static int encode_chat(baton_rtok_local_t *L, const baton_rtok_model_t *m, const char *t,
                       size_t len, baton_tok_ids_t *out)
{
    const unsigned fl = BATON_TOK_PARSE_SPECIAL;
    size_t base = out->len;
    if (!m->n_cuts || !L->rt->cache_entries || !L->rt->cache_bytes)
        return baton_tok_encode(m->tok, L->sc, t, len, fl, out);
    centry_t *hit = cache_find(L, m, t, len);
    size_t from = 0;
    int rc, replaced = 0;
    if (hit) {
        L->st.hits++;
        L->st.tokens_reused += hit->n_ids;
        baton_counter_add(L->rt->hits, 1);
        baton_counter_add(L->rt->reused, (double)hit->n_ids);
        if ((rc = ids_append(out, hit->ids, hit->n_ids)) != 0)
            return rc;
        from = hit->len;
    } else {
        L->st.misses++;
        baton_counter_add(L->rt->misses, 1);
    }
    size_t cut = last_cut(m, t, from, len);
    if (cut > from) {
        if ((rc = baton_tok_encode(m->tok, L->sc, t + from, cut - from, fl, out)) != 0)
            goto fail;
        if (hit) {
            entry_drop(L, hit); /* the longer prefix replaces it */
            replaced = 1;
        }
        cache_put(L, m, t, cut, out->ids + base, out->len - base);
        from = cut;
    }
    if ((rc = baton_tok_encode(m->tok, L->sc, t + from, len - from, fl, out)) != 0)
        goto fail;
    if (hit && !replaced) /* used: most recent */
    {
        baton_list_remove(&hit->link);
        baton_list_push_front(&L->lru, &hit->link);
    }
    return 0;
fail:
    out->len = base;
    return rc;
}

int baton_rtok_encode(baton_rtok_local_t *L, const baton_rtok_model_t *m, const char *text,
                      size_t len, int chat, int add_special, baton_tok_ids_t *out)
{
    size_t base = out->len;
    int rc;
    if (chat) {
        rc = encode_chat(L, m, text, len, out);
    } else {
        unsigned fl = BATON_TOK_PARSE_SPECIAL | (add_special ? BATON_TOK_ADD_SPECIAL : 0);
        if (add_special && m->add_bos) {
            uint32_t bos = (uint32_t)baton_tok_bos_id(m->tok);
            if ((rc = ids_append(out, &bos, 1)) != 0)
                return rc;
        }
        rc = baton_tok_encode(m->tok, L->sc, text, len, fl, out);
        if (rc)
            out->len = base;
    }
    return rc;
}

void baton_rtok_observe(baton_rtok_local_t *L, int chat, uint64_t t0_ns, size_t n_tokens)
{
    baton_histogram_observe(L->rt->seconds[!!chat], baton_seconds_since(t0_ns));
    baton_counter_add(L->rt->tokens[!!chat], (double)n_tokens);
}
