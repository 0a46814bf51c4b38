/* common/u64map.h — an open-addressing hash map from u64 keys to pointers (rooms, regions). */
#ifndef BATON_TRANSFER_U64MAP_H
#define BATON_TRANSFER_U64MAP_H

#include <stddef.h>
#include <stdint.h>

/* Not thread-safe. A zeroed map is empty. Values are never NULL. Iteration order is unspecified; removing the entry
 * being visited during baton_u64map_next is allowed. */
typedef struct {
    uint64_t *keys;
    void **vals; /* NULL: empty; TOMB: deleted */
    size_t cap;  /* power of two, or 0 */
    size_t count;
    size_t used; /* count + tombstones */
} baton_u64map_t;

void baton_u64map_init(baton_u64map_t *m);
void baton_u64map_free(baton_u64map_t *m);
void *baton_u64map_get(const baton_u64map_t *m, uint64_t key);
/* 0, BATON_EEXIST (key present, nothing changed) or BATON_ENOMEM. */
int baton_u64map_put(baton_u64map_t *m, uint64_t key, void *val);
/* Returns the removed value or NULL. */
void *baton_u64map_del(baton_u64map_t *m, uint64_t key);
/* Iteration: size_t it = 0; while ((v = baton_u64map_next(m, &it, &key))) ... */
void *baton_u64map_next(const baton_u64map_t *m, size_t *it, uint64_t *key_p);

#endif
