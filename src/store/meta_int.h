/* store/meta_int.h — the metadata module's private types, shared by meta.c, meta_place.c and
 * meta_evict.c (never included outside them and their unit test). */
#ifndef BATON_STORE_META_INT_H
#define BATON_STORE_META_INT_H

#include "store/meta.h"

#define BATON__META_ALIGN 64u /* slice offsets and lengths in a segment */

typedef struct baton__mobj_s baton__mobj_t;

/* An intrusive doubly linked list of objects (LRU lists: head = least recently used). */
typedef struct {
    baton__mobj_t *head, *tail;
    uint64_t n;
} baton__olist_t;

struct baton__mobj_s {
    baton__mobj_t *hnext;       /* hash chain (PUTTING and COMPLETE own their key) */
    baton__mobj_t *prev, *next; /* the list of its state (see baton__meta_obj_list) */
    baton__olist_t *list;       /* the list it is on, NULL when none */
    baton__obj_state_t state;   /* changed only by baton__meta_obj_set_state */
    uint32_t ns;
    uint64_t hash;
    uint64_t put_id;
    uint64_t len;
    uint32_t crc;
    uint32_t n_replicas, n_slices;
    baton__slice_t *slices; /* n_replicas * n_slices, replica-major */
    uint64_t since_ms;      /* PUTTING: put start; REVOKED: takeover */
    uint64_t atime_ms;      /* COMPLETE: last commit / get / exists (the LRU lists' order) */
    uint64_t lease_until;   /* ms; a lease protects the object while now < lease_until */
    uint64_t pin_until;     /* ms; soft pinned while now < pin_until (0: never pinned) */
    uint64_t held_bytes;    /* bytes allocated to it in segments (charged to its namespace) */
    uint8_t soft_pin;       /* asked for at put; the pin starts at commit */
    uint8_t lost;           /* PUTTING: a node holding one of its slices was lost */
    uint16_t key_len;
    char key[];
};

typedef struct {
    uint64_t off, len;
} baton__extent_t;

typedef struct {
    uint32_t node;
    int alive;
    uint64_t capacity, used;
    baton__extent_t *free; /* sorted by offset, coalesced */
    size_t n_free, cap_free;
} baton__seg_t;

typedef struct {
    char *id;
    int alive;
} baton__node_t;

typedef struct {
    char name[BATON_STORE_NAMESPACE_MAX + 1];
    uint64_t quota, used;
} baton__ns_t;

struct baton__meta_s {
    baton__meta_config_t cfg;
    baton__mobj_t **buckets;
    size_t n_buckets, n_keyed;
    baton__olist_t lru;     /* COMPLETE, not soft pinned at commit */
    baton__olist_t lru_pin; /* COMPLETE, soft pinned at commit (pin may have lapsed since) */
    baton__olist_t putting; /* PUTTING, oldest first */
    baton__olist_t revoked; /* REVOKED, oldest first */
    baton__seg_t *segs;
    size_t n_segs;
    baton__node_t *nodes;
    size_t n_nodes;
    baton__ns_t *nss;
    size_t n_ns;
    uint64_t capacity, used; /* of live segments */
    uint64_t next_put_id;
    uint64_t rng[4];
    baton__meta_stats_t st;
    /* placement scratch (the last view's slices) */
    baton__slice_t *view_slices;
    size_t view_cap;
};

/* meta.c */
int baton__meta_obj_set_state(baton__meta_t *m, baton__mobj_t *o, baton__obj_state_t to,
                              uint64_t now_ms);
int baton__meta_leased(const baton__mobj_t *o, uint64_t now_ms);
void baton__olist_remove(baton__olist_t *l, baton__mobj_t *o);
void baton__olist_push(baton__olist_t *l, baton__mobj_t *o);

/* meta_place.c: allocation in segments, and placement of a new object's slices. */
int baton__seg_alloc(baton__seg_t *s, uint64_t len, uint64_t *off_p);
void baton__seg_free(baton__seg_t *s, uint64_t off, uint64_t len);
/* Takes [off, off + len) out of the free extents (a restore). BATON_XFER_EEXIST when some of
 * it is not free. */
int baton__seg_reserve(baton__seg_t *s, uint64_t off, uint64_t len);
/* Fills o->slices / n_replicas / n_slices / held_bytes for replicas (best effort: at least
 * one). BATON_STORE_ENOSPACE when not even one fits; nothing is held then. */
int baton__meta_place(baton__meta_t *m, baton__mobj_t *o, uint32_t replicas);
/* Gives every slice's space back (live segments only). */
void baton__meta_release_space(baton__meta_t *m, baton__mobj_t *o);

/* meta_evict.c: frees LRU objects until `goal` bytes are freed; ns == UINT32_MAX: any
 * namespace. Returns bytes freed. */
uint64_t baton__meta_evict(baton__meta_t *m, uint64_t goal, uint32_t ns, uint64_t now_ms);
/* Evicts evict_ratio of capacity when used is above the high watermark. Objects freed. */
size_t baton__meta_evict_watermark(baton__meta_t *m, uint64_t now_ms);

#endif
