/* tokenizer/internal.h — the loaded tokenizer's layout and the scratch, shared by the
 * tokenizer's source files only. */
#ifndef BATON_TOKENIZER_INTERNAL_H
#define BATON_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>

#include "tokenizer/tokenizer.h"

#define TOK_MAX_SPLITS  8    /* pre-tokenizer Split stages */
#define TOK_MAX_NORMS   8    /* normalizer stages */
#define TOK_MAX_AFFIX   8    /* ids the post-processor adds on one side */
#define TOK_CACHE_SLOTS 8192 /* pieces cached per scratch (power of two) */
#define TOK_CACHE_KEY   22
#define TOK_CACHE_IDS   8

typedef enum {
    NORM_NFC,
    NORM_NFD,
    NORM_NFKC,
    NORM_NFKD,
    NORM_PREPEND,
    NORM_REPLACE
} tok_norm_kind_t;

typedef struct {
    tok_norm_kind_t kind;
    char *a, *b; /* PREPEND: a is the prefix; REPLACE: every a becomes b */
    size_t alen, blen;
} tok_norm_t;

typedef struct {
    pcre2_code *re;
    bool keep_gaps; /* "Isolated": the text between matches is a piece too ("Removed"+invert
                     * keeps the matches only) */
} tok_split_t;

/* Added tokens are found by a leftmost-longest scan: a bitmap of first bytes, then the
 * candidates of that first byte, longest first. */
typedef struct {
    uint32_t *ids;            /* the tokens of this set, grouped by first byte, longest first */
    uint32_t start[257];      /* ids[start[b] .. start[b+1]) begin with byte b */
    uint8_t first_any[256];   /* 1: some token starts with this byte */
    uint8_t first_plain[256]; /* 1: some non-special token starts with this byte */
    uint32_t n;
} tok_added_set_t;

/* One open-addressing table of merges: key (left << 32 | right), value (rank << 32 | new). */
typedef struct {
    uint64_t *keys; /* 0 = empty (no pair is (0,0)+1: keys are stored +1) */
    uint64_t *vals;
    uint64_t mask;
} tok_merge_map_t;

/* bytes -> id for the vocabulary. */
typedef struct {
    uint32_t *slots; /* id + 1, 0 = empty */
    uint64_t mask;
} tok_vocab_map_t;

struct baton_tok {
    /* tokens: bytes of id i are blob[off[i] .. off[i+1]) */
    uint32_t n_ids;
    uint64_t *off; /* n_ids + 1 */
    char *blob;
    uint8_t *flags;        /* TOKF_* per id */
    uint32_t byte_id[256]; /* the token of each byte: its byte-level token, or <0xXX> */
    bool byte_level;       /* byte-level BPE; otherwise SentencePiece-style (characters, byte
                            * fallback, the metaspace U+2581 for spaces) */
    bool sp_strip;         /* SentencePiece-style decode drops the leading space */
    tok_vocab_map_t vmap;  /* model vocabulary bytes -> id (not added tokens) */
    tok_merge_map_t merges;
    bool ignore_merges; /* a piece found whole in the vocabulary is that token */

    int n_norms;
    tok_norm_t norms[TOK_MAX_NORMS];
    bool unicode_forms; /* some stage is NFC/NFD/NFKC/NFKD */
    int n_splits;
    tok_split_t splits[TOK_MAX_SPLITS];

    tok_added_set_t added_raw;  /* matched in the text as given */
    tok_added_set_t added_norm; /* matched in normalized text (normalized: true) */

    uint32_t prefix[TOK_MAX_AFFIX], suffix[TOK_MAX_AFFIX];
    int n_prefix, n_suffix;

    json_t *config; /* tokenizer_config.json, or NULL */
    int64_t bos_id, eos_id;
    uint64_t model_max_length;
    uint64_t generation; /* unique per load: scratch caches notice a new tokenizer */
};

enum {
    TOKF_ADDED = 1,   /* an added token: matched in the text before the model runs */
    TOKF_SPECIAL = 2, /* special (control) token */
    TOKF_VOCAB = 4,   /* in the model vocabulary, reachable by byte-level BPE */
    TOKF_TEXT = 8,    /* in the vocabulary but not byte-level text: decodes as its text */
    TOKF_BYTE = 16,   /* a byte-fallback token <0xXX>: decodes as that byte */
};
#define TOKF_KNOWN (TOKF_ADDED | TOKF_VOCAB | TOKF_TEXT)

typedef struct {
    uint64_t h; /* 0 = empty */
    uint8_t klen, n;
    char key[TOK_CACHE_KEY];
    uint32_t ids[TOK_CACHE_IDS];
} tok_cache_slot_t;

struct baton_tok_scratch {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    char *norm;
    size_t norm_cap;
    /* BPE work arrays, sized for the longest piece seen */
    uint32_t *sym;
    int32_t *next, *prev;
    uint32_t *rank;
    uint64_t *heap;
    size_t cap;
    uint64_t cache_gen;
    tok_cache_slot_t *cache;
};

/* load.c / load_parts.c */
int tok__parse_model(baton_tok_t *t, json_t *root, char *err, size_t errlen);
int tok__parse_pipeline(baton_tok_t *t, json_t *root, char *err, size_t errlen);
int tok__parse_added(baton_tok_t *t, json_t *root, char *err, size_t errlen);
int tok__parse_post(baton_tok_t *t, json_t *root, char *err, size_t errlen);
void tok__config(baton_tok_t *t);
int64_t tok__vocab_lookup(const baton_tok_t *t, const char *s, size_t len);
void tok__err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* bpe.c: appends the ids of one pre-tokenized piece. */
int tok__bpe_piece(const baton_tok_t *t, baton_tok_scratch_t *sc, const char *p, size_t n,
                   baton_tok_ids_t *out);

int tok__ids_push(baton_tok_ids_t *out, uint32_t id);

#endif
