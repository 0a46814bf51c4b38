/* policy_ring.h — consistent_hash's ring: virtual nodes of worker ids on a 64-bit circle. */
#ifndef BATON_ROUTER_POLICY_RING_H
#define BATON_ROUTER_POLICY_RING_H

#include <stddef.h>
#include <stdint.h>

/*
 * Each worker id is placed `vnodes` times on the circle at hash(id, v); a key goes to the first
 * point at or after hash(key), wrapping. The ring depends only on the ids and the key, so every
 * router replica that sees the same workers maps a session to the same worker without sharing
 * any state; when a worker joins or leaves only the keys of the arcs it gains or loses move
 * (about 1/n of them).
 *
 * Threading: a built ring is immutable and may be read by any thread. Ownership: the ring
 * copies nothing but the points; indices refer to the ids array it was built from.
 */

typedef struct baton_ring_s baton_ring_t;

/* 0, BATON_EINVAL (vnodes 0) or BATON_ENOMEM. n may be 0 (lookups then return SIZE_MAX). */
int baton_ring_build(baton_ring_t **ring_p, const char *const *ids, size_t n, unsigned vnodes);
void baton_ring_free(baton_ring_t *ring);

/* The index (into the ids it was built from) that owns `key`; SIZE_MAX when empty. */
size_t baton_ring_lookup(const baton_ring_t *ring, uint64_t key);

/* The 64-bit hash used for keys and points (FNV-1a, then splitmix64's mixer: stable across builds
 * and machines, so replicas agree). */
uint64_t baton_ring_hash(const void *data, size_t len);

#endif
