/* roommap.h — a small open-addressing hash map from room (u64) to a pointer. */
#ifndef BATON_WORKER_ROOMMAP_H
#define BATON_WORKER_ROOMMAP_H

#include <stddef.h>
#include <stdint.h>

/* Keys are unique; values are not owned. Not thread-safe. A zeroed map is empty. */
typedef struct wk_roommap_slot_s {
    uint64_t key;
    void *val; /* NULL marks an empty slot */
} wk_roommap_slot_t;

typedef struct wk_roommap_s {
    wk_roommap_slot_t *slots;
    size_t cap; /* power of two, or 0 */
    size_t n;
} wk_roommap_t;

void *wk_roommap_get(const wk_roommap_t *m, uint64_t key);
/* val must not be NULL. Returns 0, BATON_EEXIST or BATON_ENOMEM. */
int wk_roommap_put(wk_roommap_t *m, uint64_t key, void *val);
/* Returns the removed value or NULL. */
void *wk_roommap_del(wk_roommap_t *m, uint64_t key);
void wk_roommap_free(wk_roommap_t *m);

#endif
