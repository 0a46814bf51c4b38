/* bpe.c — byte-pair merging of one pre-tokenized piece (lowest merge rank first, leftmost among
 * equals, as Hugging Face's BPE), and the per-scratch cache of pieces seen recently. */
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/hash.h"
#include "tokenizer/internal.h"

#define NO_RANK UINT32_MAX

int tok__ids_push(baton_tok_ids_t *out, uint32_t id)
{
    if (out->len == out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 256;
        uint32_t *n = realloc(out->ids, cap * sizeof(uint32_t));
        if (!n)
            return BATON_ENOMEM;
        out->ids = n;
        out->cap = cap;
    }
    out->ids[out->len++] = id;
    return 0;
}

/* The merge of (a, b): its rank and the merged token, or NO_RANK. */
static inline uint32_t merge_get(const tok_merge_map_t *m, uint32_t a, uint32_t b, uint32_t *id)
{
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    for (uint64_t i = baton_hash_u64(key) & m->mask;; i = (i + 1) & m->mask) {
        uint64_t k = m->keys[i];
        if (k == key) {
            *id = (uint32_t)m->vals[i];
            return (uint32_t)(m->vals[i] >> 32);
        }
        if (k == 0)
            return NO_RANK;
    }
}

static int reserve(baton_tok_scratch_t *sc, size_t n)
{
    if (n <= sc->cap)
        return 0;
    size_t cap = n < 64 ? 64 : n * 2;
    uint32_t *sym = realloc(sc->sym, cap * sizeof(uint32_t));
    if (sym)
        sc->sym = sym;
    int32_t *next = realloc(sc->next, cap * sizeof(int32_t));
    if (next)
        sc->next = next;
    int32_t *prev = realloc(sc->prev, cap * sizeof(int32_t));
    if (prev)
        sc->prev = prev;
    uint32_t *rank = realloc(sc->rank, cap * sizeof(uint32_t));
    if (rank)
        sc->rank = rank;
    /* The heap never holds more than 2n entries (n - 1 pairs, then each merge pops one and
     * pushes at most two); 3n leaves room. */
    uint64_t *heap = realloc(sc->heap, cap * 3 * sizeof(uint64_t));
    if (heap)
        sc->heap = heap;
    if (!sym || !next || !prev || !rank || !heap)
        return BATON_ENOMEM;
    sc->cap = cap;
    return 0;
}

/* A min-heap of (rank << 32 | position): the lowest rank, then the leftmost position. */
static inline void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v)
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static inline uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1] < h[c])
            c++;
        if (h[c] >= v)
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

/* Merges p[0..n) into tokens, appended to out. */
static int merge_piece(const baton_tok_t *t, baton_tok_scratch_t *sc, const unsigned char *p,
                       size_t n, baton_tok_ids_t *out)
{
    if (reserve(sc, n) < 0)
        return BATON_ENOMEM;
    uint32_t *sym = sc->sym, *rank = sc->rank;
    int32_t *next = sc->next, *prev = sc->prev;
    uint64_t *heap = sc->heap;
    size_t hn = 0;
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++)
            sym[i] = t->byte_id[p[i]];
    } else {
        /* SentencePiece-style: one symbol per character, or its bytes' <0xXX> tokens when the
         * character is not in the vocabulary (byte fallback). The input is valid UTF-8. */
        size_t k = 0;
        for (size_t i = 0; i < n;) {
            size_t cl = p[i] < 0x80 ? 1 : p[i] >= 0xF0 ? 4 : p[i] >= 0xE0 ? 3 : 2;
            if (cl > n - i)
                cl = n - i;
            int64_t id = tok__vocab_lookup(t, (const char *)p + i, cl);
            if (id >= 0)
                sym[k++] = (uint32_t)id;
            else
                for (size_t b = 0; b < cl; b++)
                    sym[k++] = t->byte_id[p[i + b]];
            i += cl;
        }
        n = k;
    }
    for (size_t i = 0; i < n; i++) {
        next[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prev[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t id;
        rank[i] = merge_get(&t->merges, sym[i], sym[i + 1], &id);
        if (rank[i] != NO_RANK)
            heap_push(heap, &hn, ((uint64_t)rank[i] << 32) | i);
    }
    rank[n - 1] = NO_RANK;
    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        uint32_t r = (uint32_t)(top >> 32), i = (uint32_t)top;
        if (rank[i] != r) /* stale: position i was merged away or its pair changed */
            continue;
        int32_t j = next[i];
        uint32_t merged = 0;
        merge_get(&t->merges, sym[i], sym[j], &merged);
        sym[i] = merged;
        rank[j] = NO_RANK; /* j is gone */
        next[i] = next[j];
        if (next[j] >= 0)
            prev[next[j]] = (int32_t)i;
        /* The two pairs around the new symbol. */
        if (next[i] >= 0) {
            uint32_t id;
            rank[i] = merge_get(&t->merges, sym[i], sym[next[i]], &id);
            if (rank[i] != NO_RANK)
                heap_push(heap, &hn, ((uint64_t)rank[i] << 32) | i);
        } else {
            rank[i] = NO_RANK;
        }
        if (prev[i] >= 0) {
            uint32_t id, k = (uint32_t)prev[i];
            rank[k] = merge_get(&t->merges, sym[k], sym[i], &id);
            if (rank[k] != NO_RANK)
                heap_push(heap, &hn, ((uint64_t)rank[k] << 32) | k);
        }
    }
    for (int32_t i = 0; i >= 0; i = next[i]) {
        int rc = tok__ids_push(out, sym[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The cache's hash of a short piece, eight bytes at a time (FNV-1a's byte loop costs more
 * than the cache saves on short pieces). Never 0: 0 marks an empty slot. */
static inline uint64_t piece_hash(const char *p, size_t n)
{
    uint64_t h = (uint64_t)n * 0x9E3779B97F4A7C15ull, w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    if (n) {
        w = 0;
        memcpy(&w, p, n);
        h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
        h ^= h >> 29;
    }
    return h | 1;
}

int tok__bpe_piece(const baton_tok_t *t, baton_tok_scratch_t *sc, const char *p, size_t n,
                   baton_tok_ids_t *out)
{
    if (n == 0)
        return 0;
    if (n == 1 && t->byte_level)
        return tok__ids_push(out, t->byte_id[(unsigned char)p[0]]);
    if (t->ignore_merges) {
        int64_t id = tok__vocab_lookup(t, p, n);
        if (id >= 0)
            return tok__ids_push(out, (uint32_t)id);
    }
    tok_cache_slot_t *slot = NULL;
    uint64_t h = 0;
    if (n <= TOK_CACHE_KEY && sc->cache) {
        if (sc->cache_gen != t->generation) {
            memset(sc->cache, 0, TOK_CACHE_SLOTS * sizeof(tok_cache_slot_t));
            sc->cache_gen = t->generation;
        }
        h = piece_hash(p, n);
        slot = &sc->cache[(h >> 7) & (TOK_CACHE_SLOTS - 1)];
        if (slot->h == h && slot->klen == n && memcmp(slot->key, p, n) == 0) {
            for (unsigned i = 0; i < slot->n; i++) {
                int rc = tok__ids_push(out, slot->ids[i]);
                if (rc < 0)
                    return rc;
            }
            return 0;
        }
    }
    size_t before = out->len;
    int rc = merge_piece(t, sc, (const unsigned char *)p, n, out);
    if (rc == 0 && slot && out->len - before <= TOK_CACHE_IDS) {
        slot->h = h;
        slot->klen = (uint8_t)n;
        slot->n = (uint8_t)(out->len - before);
        memcpy(slot->key, p, n);
        memcpy(slot->ids, out->ids + before, slot->n * sizeof(uint32_t));
    }
    return rc;
}
