/* encode.c — text to ids: added-token matching, normalization, the pre-tokenizer's Split stages
 * (PCRE2), then BPE per piece; decode (ids to bytes); the per-thread scratch. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "baton/error.h"
#include "tokenizer/internal.h"

baton_tok_scratch_t *baton_tok_scratch_new(void)
{
    baton_tok_scratch_t *sc = calloc(1, sizeof(*sc));
    if (!sc)
        return NULL;
    sc->md = pcre2_match_data_create(1, NULL);
    sc->mctx = pcre2_match_context_create(NULL);
    /* JIT backtracking state for long runs (whitespace, a language without spaces); a larger
     * need fails the match with an error, never a wrong split. */
    sc->jit = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL);
    sc->cache = calloc(TOK_CACHE_SLOTS, sizeof(tok_cache_slot_t));
    if (!sc->md || !sc->mctx || !sc->jit || !sc->cache) {
        baton_tok_scratch_free(sc);
        return NULL;
    }
    pcre2_jit_stack_assign(sc->mctx, NULL, sc->jit);
    return sc;
}

void baton_tok_scratch_free(baton_tok_scratch_t *sc)
{
    if (!sc)
        return;
    pcre2_match_data_free(sc->md);
    pcre2_match_context_free(sc->mctx);
    pcre2_jit_stack_free(sc->jit);
    free(sc->norm);
    free(sc->sym);
    free(sc->next);
    free(sc->prev);
    free(sc->rank);
    free(sc->heap);
    free(sc->cache);
    free(sc);
}

void baton_tok_ids_free(baton_tok_ids_t *ids)
{
    free(ids->ids);
    ids->ids = NULL;
    ids->len = ids->cap = 0;
}

/* Whether s[0..len) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
static bool utf8_valid(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        /* ASCII eight bytes at a time */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= len)
            break;
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t min;
        if (c >= 0xC2 && c <= 0xDF) {
            n = 2;
            min = 0x80;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 3;
            min = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 4;
            min = 0x10000;
        } else {
            return false;
        }
        if (i + n > len)
            return false;
        uint32_t cp = c & (0x7F >> n);
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += n;
    }
    return true;
}

static size_t utf8_len(unsigned char c)
{
    return c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
}

typedef struct {
    const baton_tok_t *t;
    baton_tok_scratch_t *sc;
    baton_tok_ids_t *out;
} enc_t;

/* Split stage k over s[0..n): its pieces go to stage k + 1, the last stage's to BPE. */
static int split_stage(enc_t *e, int k, const char *s, size_t n)
{
    if (n == 0)
        return 0;
    if (k == e->t->n_splits)
        return tok__bpe_piece(e->t, e->sc, s, n, e->out);
    const tok_split_t *sp = &e->t->splits[k];
    size_t pos = 0, gap = 0;
    while (pos < n) {
        int rc = pcre2_jit_match(sp->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, e->sc->md,
                                 e->sc->mctx);
        if (rc == PCRE2_ERROR_JIT_BADOPTION) /* JIT unavailable: the interpreter */
            rc = pcre2_match(sp->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, e->sc->md,
                             e->sc->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0)
            return rc == PCRE2_ERROR_NOMEMORY || rc == PCRE2_ERROR_JIT_STACKLIMIT ? BATON_ETOOBIG
                                                                                  : BATON_EINVAL;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->sc->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* an empty match splits nothing: step over one character */
            pos = ms + (ms < n ? utf8_len((unsigned char)s[ms]) : 1);
            continue;
        }
        if (sp->keep_gaps && ms > gap && (rc = split_stage(e, k + 1, s + gap, ms - gap)) < 0)
            return rc;
        if ((rc = split_stage(e, k + 1, s + ms, me - ms)) < 0)
            return rc;
        gap = pos = me;
    }
    if (sp->keep_gaps && gap < n)
        return split_stage(e, k + 1, s + gap, n - gap);
    return 0;
}

/* Finds the leftmost-longest added token of set in s[from..n): its start, length and id. */
static bool added_find(const baton_tok_t *t, const tok_added_set_t *set, bool specials,
                       const char *s, size_t n, size_t from, size_t *at, size_t *len, uint32_t *id)
{
    if (set->n == 0)
        return false;
    const uint8_t *first = specials ? set->first_any : set->first_plain;
    for (size_t i = from; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        if (!first[b])
            continue;
        for (uint32_t k = set->start[b]; k < set->start[b + 1]; k++) {
            uint32_t tid = set->ids[k];
            if (!specials && (t->flags[tid] & TOKF_SPECIAL))
                continue;
            size_t l = t->off[tid + 1] - t->off[tid];
            if (l <= n - i && memcmp(s + i, t->blob + t->off[tid], l) == 0) {
                *at = i;
                *len = l;
                *id = tid;
                return true;
            }
        }
    }
    return false;
}

/* Text without raw added tokens: normalized added tokens, then the splits. */
static int encode_normalized(enc_t *e, const char *s, size_t n, bool specials)
{
    size_t pos = 0, at, len;
    uint32_t id;
    while (added_find(e->t, &e->t->added_norm, specials, s, n, pos, &at, &len, &id)) {
        int rc = split_stage(e, 0, s + pos, at - pos);
        if (rc < 0 || (rc = tok__ids_push(e->out, id)) < 0)
            return rc;
        pos = at + len;
    }
    return split_stage(e, 0, s + pos, n - pos);
}

/* One normalizer stage over in[0..len): a new malloc'd string in *out_p, its length in *len_p. */
static int norm_stage(const tok_norm_t *nm, const char *in, size_t len, char **out_p, size_t *len_p)
{
    if (nm->kind == NORM_PREPEND) {
        char *o = malloc(nm->alen + len + 1);
        if (!o)
            return BATON_ENOMEM;
        memcpy(o, nm->a, nm->alen);
        memcpy(o + nm->alen, in, len);
        *out_p = o;
        *len_p = nm->alen + len;
        return 0;
    }
    if (nm->kind == NORM_REPLACE) {
        size_t count = 0;
        for (const char *q = in; (q = memmem(q, len - (size_t)(q - in), nm->a, nm->alen));
             q += nm->alen)
            count++;
        size_t olen = len - count * nm->alen + count * nm->blen, o = 0;
        char *out = malloc(olen + 1);
        if (!out)
            return BATON_ENOMEM;
        for (size_t i = 0; i < len;) {
            if (len - i >= nm->alen && memcmp(in + i, nm->a, nm->alen) == 0) {
                memcpy(out + o, nm->b, nm->blen);
                o += nm->blen;
                i += nm->alen;
            } else {
                out[o++] = in[i++];
            }
        }
        *out_p = out;
        *len_p = o;
        return 0;
    }
    int opt = UTF8PROC_STABLE;
    switch (nm->kind) {
    case NORM_NFC:
        opt |= UTF8PROC_COMPOSE;
        break;
    case NORM_NFD:
        opt |= UTF8PROC_DECOMPOSE;
        break;
    case NORM_NFKC:
        opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        break;
    default:
        opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
        break;
    }
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)len, &res,
                                      (utf8proc_option_t)opt);
    if (r < 0)
        return r == UTF8PROC_ERROR_NOMEM ? BATON_ENOMEM : BATON_EINVAL;
    *out_p = (char *)res;
    *len_p = (size_t)r;
    return 0;
}

/* The normalizer stages over one section of text (between raw added tokens), then the rest. */
static int normalize(enc_t *e, const char *s, size_t n, bool specials)
{
    const baton_tok_t *t = e->t;
    if (t->n_norms == 0 || n == 0) /* an empty section is not normalized (nor prepended to) */
        return encode_normalized(e, s, n, specials);
    bool ascii = true;
    for (size_t i = 0; i < n && ascii; i++)
        ascii = !((unsigned char)s[i] & 0x80);
    char *cur = NULL;
    const char *in = s;
    size_t len = n;
    /* A stage that empties the text ends the chain: every later stage leaves empty text empty
     * (a Prepend skips it, as the reference does), and a stage's empty output may be NULL. */
    for (int i = 0; i < t->n_norms && len > 0; i++) {
        const tok_norm_t *nm = &t->norms[i];
        if (ascii && nm->kind <= NORM_NFKD)
            continue; /* every Unicode normal form leaves ASCII as it is */
        char *next = NULL;
        int rc = norm_stage(nm, in, len, &next, &len);
        free(cur);
        if (rc < 0)
            return rc;
        cur = next;
        in = next;
    }
    int rc = encode_normalized(e, in, len, specials);
    free(cur);
    return rc;
}

static int encode_body(enc_t *e, const char *text, size_t len, unsigned flags)
{
    bool specials = flags & BATON_TOK_PARSE_SPECIAL;
    size_t pos = 0, at, alen;
    uint32_t id;
    int rc;
    while (added_find(e->t, &e->t->added_raw, specials, text, len, pos, &at, &alen, &id)) {
        if ((rc = normalize(e, text + pos, at - pos, specials)) < 0 ||
            (rc = tok__ids_push(e->out, id)) < 0)
            return rc;
        pos = at + alen;
    }
    return normalize(e, text + pos, len - pos, specials);
}

int baton_tok_encode(const baton_tok_t *t, baton_tok_scratch_t *sc, const char *text, size_t len,
                     unsigned flags, baton_tok_ids_t *out)
{
    if (!t || !sc || !out || (!text && len))
        return BATON_EINVAL;
    if (!utf8_valid((const unsigned char *)text, len))
        return BATON_EINVAL;
    size_t before = out->len;
    enc_t e = {t, sc, out};
    int rc = 0;
    if (flags & BATON_TOK_ADD_SPECIAL)
        for (int i = 0; i < t->n_prefix && rc == 0; i++)
            rc = tok__ids_push(out, t->prefix[i]);
    if (rc == 0 && len)
        rc = encode_body(&e, text, len, flags);
    if (flags & BATON_TOK_ADD_SPECIAL)
        for (int i = 0; i < t->n_suffix && rc == 0; i++)
            rc = tok__ids_push(out, t->suffix[i]);
    if (rc < 0)
        out->len = before;
    return rc;
}

int baton_tok_count(const baton_tok_t *t, baton_tok_scratch_t *sc, const char *text, size_t len,
                    unsigned flags, size_t *n_p)
{
    baton_tok_ids_t ids = BATON_TOK_IDS_INIT;
    int rc = baton_tok_encode(t, sc, text, len, flags, &ids);
    *n_p = rc == 0 ? ids.len : 0;
    baton_tok_ids_free(&ids);
    return rc;
}

int baton_tok_decode(const baton_tok_t *t, const uint32_t *ids, size_t n, unsigned flags,
                     baton_buf_t *out)
{
    size_t need = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        if (id >= t->n_ids || !(t->flags[id] & TOKF_KNOWN))
            return BATON_EINVAL;
        need += t->off[id + 1] - t->off[id];
    }
    if (baton_buf_reserve(out, need) < 0)
        return BATON_ENOMEM;
    size_t start = out->len;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        const char *p = t->blob + t->off[id];
        size_t len = t->off[id + 1] - t->off[id];
        if ((flags & BATON_TOK_SKIP_SPECIAL) && (t->flags[id] & TOKF_SPECIAL))
            continue;
        if (t->byte_level) {
            baton_buf_append(out, p, len);
        } else if (t->flags[id] & TOKF_BYTE) {
            char b = (char)(baton_hex_value(p[3]) * 16 + baton_hex_value(p[4])); /* <0xXX> */
            baton_buf_append(out, &b, 1);
        } else {
            /* The metaspace stands for a space. */
            for (size_t k = 0; k < len;) {
                const char *m = memmem(p + k, len - k, "\xe2\x96\x81", 3);
                size_t upto = m ? (size_t)(m - p) : len;
                baton_buf_append(out, p + k, upto - k);
                if (!m)
                    break;
                baton_buf_append(out, " ", 1);
                k = upto + 3;
            }
        }
    }
    /* SentencePiece's decoder strips the one space its normalizer put in front. */
    if (t->sp_strip && out->len > start && out->data[start] == ' ') {
        memmove(out->data + start, out->data + start + 1, out->len - start - 1);
        out->len--;
        out->data[out->len] = 0;
    }
    return 0;
}
