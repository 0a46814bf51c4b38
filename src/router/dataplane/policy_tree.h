/* policy_tree.h — cache_aware's approximate prefix tree: per worker, the prompt prefixes the
 * router sent there (word blocks, hashed), bounded with LRU; longest-match lookups. */
#ifndef BATON_ROUTER_POLICY_TREE_H
#define BATON_ROUTER_POLICY_TREE_H

#include <stddef.h>
#include <stdint.h>

#include "router/control/registry.h"

/*
 * A prompt is cut into words (runs of non-whitespace, the simulated engine's tokens) and the
 * words into blocks of `block_words`; a prefix is named by the chained hash of its words at
 * every block boundary and at its end. A worker's tree is the set of prefix names the router
 * sent it: because a name covers the whole prefix before it, the set is a radix tree over
 * blocks stored flat (a node is its path's hash), and "longest match" is the last name of the
 * request's chain the set holds. Approximate as SGLang's is: it records what was sent, not what
 * the worker kept, and a 64-bit hash collision could claim a false match (ignored; the cost is
 * one less well placed request).
 *
 * Memory bound: at most max_blocks names per worker; inserting past it drops that worker's
 * least recently used names. A worker's tree is dropped entirely when its incarnation changes
 * (the health layer saw it down and up again: its cache is gone) and by baton_ptree_drop().
 *
 * Why it shares no core with the worker's prefix cache (worker/prefix_cache.h), though both are
 * LRU-bounded prefix trees: this one is a flat set of hashed names per worker (a node is its
 * path's 64-bit hash, no parent links, no contents kept: a collision is tolerated), evicts any
 * name, not only leaves, holds nothing on behalf of a request, and is shared by every router
 * thread under a mutex; the worker's keeps each page's token ids to compare (never a false hit),
 * links children to parents, evicts only unheld leaves so a matched path cannot vanish under a
 * prefill, and is owned by one loop thread. What the two have in common is an LRU list, which
 * common/list.h already is.
 *
 * Threading: thread-safe; one mutex guards the tree (every call holds it for a short, bounded
 * walk: no allocation under it but the inserted names). Workers are named by id, never kept.
 */

typedef struct baton_ptree_s baton_ptree_t;

/* Longest prefix chain kept for one request: prompts longer than this many blocks are matched
 * on their first blocks only. */
#define BATON_PTREE_MAX_CHAIN 4096

/* The prefix chain of one prompt text. */
typedef struct baton_ptree_chain_s {
    uint64_t *hash; /* hash[i]: the prefix ending at ends[i] words */
    uint32_t *ends; /* increasing; the last is `words` */
    size_t n;
    uint32_t words; /* words in the text */
} baton_ptree_chain_t;

/* Words (runs of non-whitespace: space \t \n \v \f \r) in text[0..len), the engine's tokens. */
uint32_t baton_ptree_words(const char *text, size_t len);

/* Builds the chain of text[0..len) (block_words >= 1). 0 or BATON_ENOMEM; an empty text gives
 * n == 0. Free with baton_ptree_chain_free. */
int baton_ptree_chain(const char *text, size_t len, unsigned block_words, baton_ptree_chain_t *c);
void baton_ptree_chain_free(baton_ptree_chain_t *c);

/* 0, BATON_EINVAL (max_blocks 0) or BATON_ENOMEM. */
int baton_ptree_create(baton_ptree_t **t_p, size_t max_blocks);
void baton_ptree_destroy(baton_ptree_t *t);

/* For each ws[i]: the words of the chain's longest prefix its tree holds, into matched[i]. */
void baton_ptree_match(baton_ptree_t *t, const baton_ptree_chain_t *c, baton_worker_t *const *ws,
                       size_t n, uint32_t *matched);

/* Records that the chain's prompt went to w (every prefix of it, most recently used). */
void baton_ptree_insert(baton_ptree_t *t, const baton_worker_t *w, const baton_ptree_chain_t *c);

/* Forgets w's tree (a worker that restarted or left). */
void baton_ptree_drop(baton_ptree_t *t, const char *worker_id);

/* Names held for the worker (0 when none) and the bytes they take. */
size_t baton_ptree_size(baton_ptree_t *t, const char *worker_id, size_t *bytes_p);

/* Names and bytes over every worker. */
size_t baton_ptree_total(baton_ptree_t *t, size_t *bytes_p);

#endif
