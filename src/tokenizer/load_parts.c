/* load_parts.c — the parts of tokenizer.json around the model: normalizer, pre-tokenizer,
 * decoder, added tokens and post-processor, each checked against what encode reproduces
 * exactly; anything else is refused by name. */
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "tokenizer/internal.h"

/* GPT-2's split, used by a ByteLevel pre-tokenizer with use_regex. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char *type_of(json_t *o)
{
    json_t *t = json_object_get(o, "type");
    return json_is_string(t) ? json_string_value(t) : "(no type)";
}

static int parse_normalizer(baton_tok_t *t, json_t *n, int depth, char *err, size_t errlen)
{
    if (json_is_null(n) || !n)
        return 0;
    if (!json_is_object(n) || depth > 4) {
        tok__err(err, errlen, "normalizer is not an object");
        return BATON_EINVAL;
    }
    const char *type = type_of(n);
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list)) {
            tok__err(err, errlen, "normalizer Sequence has no \"normalizers\" array");
            return BATON_EINVAL;
        }
        size_t i;
        json_t *sub;
        json_array_foreach(list, i, sub)
        {
            int rc = parse_normalizer(t, sub, depth + 1, err, errlen);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    static const struct {
        const char *name;
        tok_norm_kind_t kind;
    } forms[] = {{"NFC", NORM_NFC},   {"NFD", NORM_NFD},         {"NFKC", NORM_NFKC},
                 {"NFKD", NORM_NFKD}, {"Prepend", NORM_PREPEND}, {"Replace", NORM_REPLACE}};
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
        if (strcmp(type, forms[i].name) != 0)
            continue;
        if (t->n_norms == TOK_MAX_NORMS) {
            tok__err(err, errlen, "normalizer: more than %d stages", TOK_MAX_NORMS);
            return BATON_ENOTSUP;
        }
        tok_norm_t *nm = &t->norms[t->n_norms];
        nm->kind = forms[i].kind;
        json_t *a = NULL, *b = NULL;
        if (nm->kind == NORM_PREPEND) {
            a = json_object_get(n, "prepend");
            b = a;
        } else if (nm->kind == NORM_REPLACE) {
            a = json_object_get(json_object_get(n, "pattern"), "String");
            b = json_object_get(n, "content");
            if (!json_is_string(a) || json_string_length(a) == 0) {
                tok__err(err, errlen, "normalizer Replace with a Regex pattern is not supported");
                return BATON_ENOTSUP;
            }
        } else {
            t->unicode_forms = true;
        }
        if (nm->kind == NORM_PREPEND || nm->kind == NORM_REPLACE) { /* a missing string too */
            if (!json_is_string(a) || !json_is_string(b)) {
                tok__err(err, errlen, "normalizer %s needs its strings", forms[i].name);
                return BATON_EINVAL;
            }
            nm->alen = json_string_length(a);
            nm->blen = json_string_length(b);
            nm->a = malloc(nm->alen + 1);
            nm->b = malloc(nm->blen + 1);
            if (!nm->a || !nm->b) {
                free(nm->a);
                free(nm->b);
                nm->a = nm->b = NULL;
                return BATON_ENOMEM;
            }
            memcpy(nm->a, json_string_value(a), nm->alen + 1);
            memcpy(nm->b, json_string_value(b), nm->blen + 1);
        }
        t->n_norms++;
        return 0;
    }
    tok__err(err, errlen, "normalizer %.64s is not supported", type);
    return BATON_ENOTSUP;
}

static int add_split(baton_tok_t *t, const char *pattern, size_t plen, bool literal, bool keep_gaps,
                     char *err, size_t errlen)
{
    if (t->n_splits == TOK_MAX_SPLITS) {
        tok__err(err, errlen, "pre_tokenizer: more than %d Split stages", TOK_MAX_SPLITS);
        return BATON_ENOTSUP;
    }
    int ecode;
    PCRE2_SIZE eoff;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, plen, opts, &ecode, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[120];
        pcre2_get_error_message(ecode, msg, sizeof(msg));
        tok__err(err, errlen, "pre_tokenizer Split regex does not compile at offset %zu: %s",
                 (size_t)eoff, (const char *)msg);
        return BATON_ENOTSUP;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter still runs without */
    t->splits[t->n_splits].re = re;
    t->splits[t->n_splits].keep_gaps = keep_gaps;
    t->n_splits++;
    return 0;
}

static int parse_split(baton_tok_t *t, json_t *p, char *err, size_t errlen)
{
    json_t *pat = json_object_get(p, "pattern");
    json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    json_t *beh = json_object_get(p, "behavior");
    bool invert = json_is_true(json_object_get(p, "invert"));
    const char *b = json_is_string(beh) ? json_string_value(beh) : "";
    bool keep_gaps;
    if (strcmp(b, "Isolated") == 0 && !invert) {
        keep_gaps = true; /* matches and the text between them are pieces */
    } else if (strcmp(b, "Removed") == 0 && invert) {
        keep_gaps = false; /* the matches are the pieces; the rest is dropped */
    } else {
        tok__err(err, errlen, "pre_tokenizer Split behavior %.32s%s is not supported", b,
                 invert ? " (inverted)" : "");
        return BATON_ENOTSUP;
    }
    if (json_is_string(re))
        return add_split(t, json_string_value(re), json_string_length(re), false, keep_gaps, err,
                         errlen);
    if (json_is_string(lit) && json_string_length(lit) > 0)
        return add_split(t, json_string_value(lit), json_string_length(lit), true, keep_gaps, err,
                         errlen);
    tok__err(err, errlen, "pre_tokenizer Split has no Regex or String pattern");
    return BATON_EINVAL;
}

/* Walks the pre-tokenizer: Split stages, then exactly one ByteLevel, last. */
static int parse_pretok(baton_tok_t *t, json_t *p, int depth, bool *byte_level, char *err,
                        size_t errlen)
{
    if (!json_is_object(p) || depth > 4) {
        tok__err(err, errlen, "pre_tokenizer is not an object");
        return BATON_EINVAL;
    }
    const char *type = type_of(p);
    if (*byte_level) {
        tok__err(err, errlen, "pre_tokenizer %.64s after ByteLevel is not supported", type);
        return BATON_ENOTSUP;
    }
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list)) {
            tok__err(err, errlen, "pre_tokenizer Sequence has no \"pretokenizers\" array");
            return BATON_EINVAL;
        }
        size_t i;
        json_t *sub;
        json_array_foreach(list, i, sub)
        {
            int rc = parse_pretok(t, sub, depth + 1, byte_level, err, errlen);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(type, "Split") == 0)
        return parse_split(t, p, err, errlen);
    if (strcmp(type, "ByteLevel") == 0) {
        if (json_is_true(json_object_get(p, "add_prefix_space"))) {
            tok__err(err, errlen, "pre_tokenizer ByteLevel add_prefix_space is not supported");
            return BATON_ENOTSUP;
        }
        *byte_level = true;
        json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur))
            return add_split(t, GPT2_PATTERN, sizeof(GPT2_PATTERN) - 1, false, true, err, errlen);
        return 0;
    }
    tok__err(err, errlen, "pre_tokenizer %.64s is not supported", type);
    return BATON_ENOTSUP;
}

/* The decoder of SentencePiece-style BPE: Sequence [Replace U+2581 -> " ", ByteFallback, Fuse]
 * and, where the normalizer prepends a U+2581 (Llama 2, Mistral; not Gemma), Strip " " (1, 0):
 * the chains baton_tok_decode reproduces. */
static bool sp_decoder(baton_tok_t *t, json_t *dec)
{
    json_t *list = json_object_get(dec, "decoders");
    size_t n = json_array_size(list);
    if (!json_is_object(dec) || strcmp(type_of(dec), "Sequence") != 0 || !json_is_array(list) ||
        (n != 3 && n != 4))
        return false;
    json_t *rep = json_array_get(list, 0);
    json_t *pat = json_object_get(json_object_get(rep, "pattern"), "String");
    json_t *content = json_object_get(rep, "content");
    if (strcmp(type_of(rep), "Replace") != 0 || !json_is_string(pat) ||
        strcmp(json_string_value(pat), "\xe2\x96\x81") != 0 || !json_is_string(content) ||
        strcmp(json_string_value(content), " ") != 0 ||
        strcmp(type_of(json_array_get(list, 1)), "ByteFallback") != 0 ||
        strcmp(type_of(json_array_get(list, 2)), "Fuse") != 0)
        return false;
    if (n == 3)
        return true;
    json_t *strip = json_array_get(list, 3), *sc = json_object_get(strip, "content");
    t->sp_strip = true;
    return strcmp(type_of(strip), "Strip") == 0 && json_is_string(sc) &&
           strcmp(json_string_value(sc), " ") == 0 &&
           json_integer_value(json_object_get(strip, "start")) == 1 &&
           json_integer_value(json_object_get(strip, "stop")) == 0;
}

int tok__parse_pipeline(baton_tok_t *t, json_t *root, char *err, size_t errlen)
{
    int rc = parse_normalizer(t, json_object_get(root, "normalizer"), 0, err, errlen);
    if (rc < 0)
        return rc;
    json_t *pre = json_object_get(root, "pre_tokenizer");
    bool byte_level = false;
    if (pre && !json_is_null(pre)) {
        rc = parse_pretok(t, pre, 0, &byte_level, err, errlen);
        if (rc < 0)
            return rc;
    }
    t->byte_level = byte_level;
    json_t *dec = json_object_get(root, "decoder");
    if (byte_level) {
        if (!json_is_object(dec) || strcmp(type_of(dec), "ByteLevel") != 0) {
            tok__err(err, errlen, "decoder %.64s is not supported with a ByteLevel pre-tokenizer",
                     json_is_object(dec) ? type_of(dec) : "(none)");
            return BATON_ENOTSUP;
        }
        return 0;
    }
    /* SentencePiece-style BPE: no pre-tokenizer at all, the metaspace decoder chain. */
    if (t->n_splits > 0) {
        tok__err(err, errlen, "pre_tokenizer Split without ByteLevel is not supported");
        return BATON_ENOTSUP;
    }
    if (!sp_decoder(t, dec)) {
        tok__err(err, errlen,
                 "decoder %.64s is not supported for BPE without ByteLevel (only Sequence "
                 "[Replace U+2581, ByteFallback, Fuse(, Strip)])",
                 json_is_object(dec) ? type_of(dec) : "(none)");
        return BATON_ENOTSUP;
    }
    return 0;
}

/* ---- added tokens ------------------------------------------------------------------------ */

typedef struct {
    uint32_t id;
    const char *content;
    size_t len;
    bool special, normalized;
} added_t;

static int added_cmp(const void *a, const void *b)
{
    const added_t *x = a, *y = b;
    unsigned char fx = (unsigned char)x->content[0], fy = (unsigned char)y->content[0];
    if (fx != fy)
        return fx < fy ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1; /* longest first: leftmost-longest matching */
    return x->id < y->id ? -1 : x->id > y->id;
}

static int build_set(baton_tok_t *t, tok_added_set_t *s, added_t *a, size_t n)
{
    qsort(a, n, sizeof(*a), added_cmp);
    s->ids = malloc((n ? n : 1) * sizeof(uint32_t));
    if (!s->ids)
        return BATON_ENOMEM;
    s->n = (uint32_t)n;
    size_t k = 0;
    for (int b = 0; b < 256; b++) {
        s->start[b] = (uint32_t)k;
        while (k < n && (unsigned char)a[k].content[0] == b) {
            s->ids[k] = a[k].id;
            s->first_any[b] = 1;
            if (!a[k].special)
                s->first_plain[b] = 1;
            k++;
        }
    }
    s->start[256] = (uint32_t)k;
    (void)t;
    return 0;
}

/* Reads tokenizer.json's added_tokens, places their content at their ids (growing the id
 * space past the vocabulary when they lie beyond it) and builds the two matching sets. */
int tok__parse_added(baton_tok_t *t, json_t *root, char *err, size_t errlen)
{
    json_t *list = json_object_get(root, "added_tokens");
    size_t n = json_is_array(list) ? json_array_size(list) : 0;
    if (list && !json_is_null(list) && !json_is_array(list)) {
        tok__err(err, errlen, "added_tokens is not an array");
        return BATON_EINVAL;
    }
    added_t *a = calloc(n ? n : 1, sizeof(*a));
    if (!a)
        return BATON_ENOMEM;
    uint32_t max_id = t->n_ids - 1;
    size_t extra = 0;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(list, i);
        json_t *id = json_object_get(o, "id"), *c = json_object_get(o, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (1 << 24) || !json_is_string(c) ||
            json_string_length(c) == 0) {
            tok__err(err, errlen, "added_tokens[%zu] needs an id and a non-empty content", i);
            rc = BATON_EINVAL;
            goto out;
        }
        const char *opts[] = {"lstrip", "rstrip", "single_word"};
        for (size_t k = 0; k < 3; k++) {
            if (json_is_true(json_object_get(o, opts[k]))) {
                tok__err(err, errlen, "added token %.64s with %s is not supported",
                         json_string_value(c), opts[k]);
                rc = BATON_ENOTSUP;
                goto out;
            }
        }
        a[i].id = (uint32_t)json_integer_value(id);
        a[i].content = json_string_value(c);
        a[i].len = json_string_length(c);
        a[i].special = json_is_true(json_object_get(o, "special"));
        json_t *norm = json_object_get(o, "normalized");
        a[i].normalized = norm ? json_is_true(norm) : !a[i].special;
        if (a[i].id < t->n_ids && (t->flags[a[i].id] & (TOKF_VOCAB | TOKF_TEXT)) &&
            (t->off[a[i].id + 1] - t->off[a[i].id] != a[i].len ||
             memcmp(t->blob + t->off[a[i].id], a[i].content, a[i].len) != 0)) {
            tok__err(err, errlen, "added token %.64s takes id %u from another vocabulary token",
                     a[i].content, a[i].id);
            rc = BATON_ENOTSUP;
            goto out;
        }
        for (size_t j = 0; j < i; j++) {
            if (a[j].id == a[i].id) {
                tok__err(err, errlen, "added_tokens gives id %u twice", a[i].id);
                rc = BATON_EINVAL;
                goto out;
            }
        }
        if (a[i].id > max_id)
            max_id = a[i].id;
        extra += a[i].len;
    }
    /* Lay the id space out again with the added tokens' content. */
    uint32_t n_ids = max_id + 1;
    uint64_t *off = calloc((size_t)n_ids + 1, sizeof(uint64_t));
    uint8_t *flags = calloc(n_ids, 1);
    char *blob = malloc(t->off[t->n_ids] + extra + 1);
    const added_t **by_id = calloc(n_ids, sizeof(*by_id));
    if (!off || !flags || !blob || !by_id) {
        free(off);
        free(flags);
        free(blob);
        free(by_id);
        rc = BATON_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        by_id[a[i].id] = &a[i];
    uint64_t o = 0;
    for (uint32_t id = 0; id < n_ids; id++) {
        off[id] = o;
        if (by_id[id]) {
            memcpy(blob + o, by_id[id]->content, by_id[id]->len);
            o += by_id[id]->len;
            flags[id] = TOKF_ADDED | (by_id[id]->special ? TOKF_SPECIAL : 0) |
                        (id < t->n_ids ? (t->flags[id] & (TOKF_VOCAB | TOKF_TEXT)) : 0);
        } else if (id < t->n_ids) {
            size_t l = t->off[id + 1] - t->off[id];
            memcpy(blob + o, t->blob + t->off[id], l);
            o += l;
            flags[id] = t->flags[id];
        }
    }
    off[n_ids] = o;
    free(by_id);
    free(t->off);
    free(t->flags);
    free(t->blob);
    t->off = off;
    t->flags = flags;
    t->blob = blob;
    t->n_ids = n_ids;

    /* A normalized token is matched after the normalizer ran; without a normalizer the two
     * are the same text. */
    size_t n_norm = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i].normalized && t->n_norms > 0) {
            added_t tmp = a[n_norm];
            a[n_norm++] = a[i];
            a[i] = tmp;
        }
    }
    rc = build_set(t, &t->added_norm, a, n_norm);
    if (rc == 0)
        rc = build_set(t, &t->added_raw, a + n_norm, n - n_norm);
out:
    free(a);
    return rc;
}

/* ---- post-processor ---------------------------------------------------------------------- */

static int template_ids(baton_tok_t *t, json_t *tp, json_t *item, bool after, char *err,
                        size_t errlen)
{
    json_t *st = json_object_get(item, "SpecialToken");
    json_t *name = json_object_get(st, "id");
    json_t *spec = json_object_get(json_object_get(tp, "special_tokens"), json_string_value(name));
    json_t *ids = json_object_get(spec, "ids");
    if (!json_is_string(name) || !json_is_array(ids)) {
        tok__err(err, errlen, "post_processor TemplateProcessing: unknown special token");
        return BATON_EINVAL;
    }
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v)
    {
        int *n = after ? &t->n_suffix : &t->n_prefix;
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= t->n_ids ||
            *n == TOK_MAX_AFFIX || !(t->flags[json_integer_value(v)] & TOKF_KNOWN)) {
            tok__err(err, errlen, "post_processor TemplateProcessing: bad special token id");
            return BATON_EINVAL;
        }
        (after ? t->suffix : t->prefix)[(*n)++] = (uint32_t)json_integer_value(v);
    }
    return 0;
}

static int parse_post_one(baton_tok_t *t, json_t *p, int depth, char *err, size_t errlen)
{
    if (!p || json_is_null(p))
        return 0;
    const char *type = json_is_object(p) ? type_of(p) : "(not an object)";
    if (strcmp(type, "ByteLevel") == 0)
        return 0; /* offsets only: the ids are unchanged */
    if (strcmp(type, "Sequence") == 0 && depth < 4) {
        json_t *list = json_object_get(p, "processors");
        size_t i;
        json_t *sub;
        json_array_foreach(list, i, sub)
        {
            int rc = parse_post_one(t, sub, depth + 1, err, errlen);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        if (t->n_prefix || t->n_suffix) {
            tok__err(err, errlen, "post_processor: two TemplateProcessing stages");
            return BATON_ENOTSUP;
        }
        json_t *single = json_object_get(p, "single");
        if (!json_is_array(single)) {
            tok__err(err, errlen, "post_processor TemplateProcessing has no \"single\" array");
            return BATON_EINVAL;
        }
        bool seen_a = false;
        size_t i;
        json_t *item;
        json_array_foreach(single, i, item)
        {
            json_t *seq = json_object_get(item, "Sequence");
            if (seq) {
                json_t *sid = json_object_get(seq, "id");
                if (seen_a || !json_is_string(sid) || strcmp(json_string_value(sid), "A") != 0) {
                    tok__err(err, errlen,
                             "post_processor TemplateProcessing: single must hold "
                             "sequence A once");
                    return BATON_ENOTSUP;
                }
                seen_a = true;
                continue;
            }
            int rc = template_ids(t, p, item, seen_a, err, errlen);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    tok__err(err, errlen, "post_processor %.64s is not supported", type);
    return BATON_ENOTSUP;
}

int tok__parse_post(baton_tok_t *t, json_t *root, char *err, size_t errlen)
{
    return parse_post_one(t, json_object_get(root, "post_processor"), 0, err, errlen);
}
