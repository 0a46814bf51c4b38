/* store/meta.h — the master's metadata, pure: objects and their one state machine, segments and
 * their allocators, placement, leases, soft pins, namespace quotas and eviction. No I/O and no
 * clock: every call takes the time (monotonic ms) from its caller, so tests drive a fake clock. */
#ifndef BATON_STORE_META_H
#define BATON_STORE_META_H

#include <stddef.h>
#include <stdint.h>

#include "baton/store.h"

/*
 * Where baton-store's parts live (src/store/):
 *   meta.c        this module's object table and the objects' state machine: the table of legal
 *                 moves and baton__meta_obj_set_state, the only function that moves an object
 *   meta_place.c  nodes, segments (free extents per segment), placement of replicas and slices
 *   meta_evict.c  LRU eviction at the watermark, within a namespace for quotas, soft pins last
 *   proto.c       the control protocol's frames (client/node <-> master) and their bounded
 *                 decoder (fuzzed: fuzz/fuzz_store_proto.c)
 *   crc32c.c      the object checksum
 * The master process holds one baton__meta_t on its loop; nodes and clients never see it.
 *
 * Object states (baton__meta_obj_set_state is the only place a state changes; the table of legal
 * moves is in meta_state.c, an illegal move is refused and counted in stats.refused):
 *
 *   PUTTING ──commit──► COMPLETE ──remove / evict / node lost──► FREED
 *      │  └──revoke by its putter (writes fenced)────────────────► FREED
 *      └──taken over after put_timeout_ms──► REVOKED ──reclaim_ms──► FREED
 *
 * PUTTING is invisible to readers. REVOKED no longer owns its key (a new put may use it) but
 * keeps its space until reclaim_ms after the takeover, because its old writer may still be
 * writing into it. FREED objects are unlinked and released at once.
 */
typedef enum {
    BATON__OBJ_PUTTING = 0,
    BATON__OBJ_COMPLETE = 1,
    BATON__OBJ_REVOKED = 2,
    BATON__OBJ_FREED = 3,
    BATON__OBJ_COUNT
} baton__obj_state_t;

/* 1 when from → to is in the table; the state's name. */
int baton__meta_state_allowed(baton__obj_state_t from, baton__obj_state_t to);
const char *baton__meta_state_name(baton__obj_state_t s);

struct baton__meta_rec_s;

typedef struct {
    uint64_t lease_ttl_ms;   /* default 10000: a get / exists protects the object this long */
    uint64_t put_timeout_ms; /* default 30000: an uncommitted put may be taken over after it */
    uint64_t reclaim_ms;     /* default 600000: a taken-over put's space is freed after it */
    uint64_t pin_ttl_ms;     /* default 1800000: a soft pin lapses this long after the commit */
    double high_watermark;   /* default 0.90 of capacity */
    double evict_ratio;      /* default 0.05 of capacity freed per eviction */
    uint64_t stripe_bytes;   /* default 4 MiB: objects above it are striped into slices */
    uint32_t max_slices;     /* default 16 per replica */
    uint64_t seed;           /* placement's random state */
    /* The journal (optional): told every durable change of an object, so that the master can
     * log it where a successor finds it (src/store/oplog.c). */
    void (*journal)(void *data, const struct baton__meta_rec_s *rec);
    void *journal_data;
} baton__meta_config_t;

void baton__meta_config_init(baton__meta_config_t *cfg);

/* A range of one segment. */
#define BATON__SLICE_LOST UINT32_MAX /* the node holding the slice was lost */
typedef struct {
    uint32_t node; /* node index (baton__meta_node_add), or BATON__SLICE_LOST */
    uint32_t seg;  /* segment index (baton__meta_segment_add), unique in the master */
    uint64_t off;  /* byte offset in the segment */
    uint64_t len;
} baton__slice_t;

/* An object's placement as handed out: n_replicas * n_slices slices, replica-major. Valid until
 * the next call on the module. */
typedef struct {
    uint64_t put_id; /* put: the id commit / revoke must name */
    uint64_t len;
    uint32_t crc;
    uint32_t n_replicas;
    uint32_t n_slices;
    const baton__slice_t *slices;
    uint64_t lease_ms; /* get: the lease granted (from the time of the call) */
} baton__obj_view_t;

typedef struct {
    const char *ns; /* NULL: "default" */
    const char *key;
    uint64_t len;      /* > 0 */
    uint32_t crc;      /* CRC32C of the whole object, written by the putter */
    uint32_t replicas; /* 1..BATON_STORE_REPLICAS_MAX */
    uint32_t flags;    /* BATON_STORE_PUT_* */
} baton__put_req_t;

typedef struct {
    uint64_t capacity, used, objects, putting, revoked;
    uint64_t puts, commits, revokes, takeovers, gets, hits, misses, lease_denials, evictions,
        evicted_bytes, removes, nodes_lost, objects_lost, refused;
    uint32_t nodes, segments;
} baton__meta_stats_t;

typedef struct baton__meta_s baton__meta_t;

/*
 * An object as the journal reports it and a successor restores it. state: PUTTING when the put
 * started (space allocated), COMPLETE at the commit, FREED when it is gone (removed, evicted,
 * revoked, reclaimed, lost with its node); the move to REVOKED is not reported: a restore makes
 * every PUTTING record REVOKED anyway. Slices name node and segment indexes of this module.
 */
typedef struct baton__meta_rec_s {
    uint64_t put_id; /* unique among the live objects of one master and its successors */
    baton__obj_state_t state;
    const char *ns, *key;
    uint64_t len;
    uint32_t crc;
    uint32_t flags; /* BATON_STORE_PUT_SOFT_PIN */
    uint32_t n_replicas, n_slices;
    const baton__slice_t *slices; /* replica-major; node BATON__SLICE_LOST for a lost copy */
} baton__meta_rec_t;

int baton__meta_create(const baton__meta_config_t *cfg, baton__meta_t **m_p);
void baton__meta_destroy(baton__meta_t *m);
void baton__meta_stats(const baton__meta_t *m, baton__meta_stats_t *st);

/* ---- nodes and segments ---- */

/* A node by its id (created on first sight; the same id again returns the same index). */
int baton__meta_node_add(baton__meta_t *m, const char *node_id, uint32_t *node_p);
/* A segment of `bytes` on a node. */
int baton__meta_segment_add(baton__meta_t *m, uint32_t node, uint64_t bytes, uint32_t *seg_p);
/* The node is gone: its segments leave and the slices on them are marked BATON__SLICE_LOST;
 * an object with a stripe that has no copy left is freed (a put: fails at commit). Returns the
 * committed objects lost. */
size_t baton__meta_node_lost(baton__meta_t *m, uint32_t node, uint64_t now_ms);
const char *baton__meta_node_id(const baton__meta_t *m, uint32_t node);
/* Free bytes and capacity of a live segment, or 0 for an unknown or lost one. */
uint64_t baton__meta_segment_free(const baton__meta_t *m, uint32_t seg);
uint64_t baton__meta_segment_capacity(const baton__meta_t *m, uint32_t seg);

/* ---- namespaces ---- */

/* Sets a namespace's byte quota (0: unlimited, the default). */
int baton__meta_ns_quota(baton__meta_t *m, const char *ns, uint64_t bytes);
uint64_t baton__meta_ns_used(const baton__meta_t *m, const char *ns);

/* ---- objects ---- */

/* Allocates the replicas of a new object. BATON_XFER_EEXIST (committed, or a live put under
 * way and not yet timed out), BATON_STORE_EQUOTA, BATON_STORE_ENOSPACE, BATON_XFER_EINVAL. */
int baton__meta_put_start(baton__meta_t *m, const baton__put_req_t *req, uint64_t now_ms,
                          baton__obj_view_t *view);
/* BATON_XFER_ENOTFOUND (no such put: taken over, revoked), BATON_STORE_ENOREPLICA (a node
 * holding a slice was lost meanwhile: the put is freed). */
int baton__meta_put_commit(baton__meta_t *m, const char *ns, const char *key, uint64_t put_id,
                           uint64_t now_ms);
int baton__meta_put_revoke(baton__meta_t *m, const char *ns, const char *key, uint64_t put_id,
                           uint64_t now_ms);
/* A committed object's placement and a lease (touching it in the LRU). ENOTFOUND otherwise. */
int baton__meta_get(baton__meta_t *m, const char *ns, const char *key, uint64_t now_ms,
                    baton__obj_view_t *view);
/* 1 when committed (granting a lease when `lease` is set), 0 when not. len/replicas optional. */
int baton__meta_exists(baton__meta_t *m, const char *ns, const char *key, uint64_t now_ms,
                       int lease, uint64_t *len_p, uint32_t *replicas_p);
/* BATON_XFER_ENOTFOUND, BATON_XFER_EBUSY (leased). */
int baton__meta_remove(baton__meta_t *m, const char *ns, const char *key, uint64_t now_ms);

/* A successor master restores an object from its predecessor's journal: a PUTTING record comes
 * back REVOKED (it owns no key, its space is held for reclaim_ms: its writer may still write), a
 * COMPLETE one committed and leased for lease_ttl_ms from now_ms (a read its predecessor granted
 * may still be running), soft pin restarted. Its slices' ranges are taken out of their segments'
 * free space. BATON_XFER_EEXIST (the key or a range is taken), BATON_STORE_ENOREPLICA (a stripe
 * has no live copy), BATON_XFER_EINVAL; nothing is kept then. Not journaled. */
int baton__meta_restore(baton__meta_t *m, const baton__meta_rec_t *rec, uint64_t now_ms);

/* Periodic work: reclaims revoked puts past reclaim_ms, evicts when above the watermark.
 * Returns objects freed. */
size_t baton__meta_tick(baton__meta_t *m, uint64_t now_ms);

/* The client side of a lease: a read that started (request sent) at start_ms and was granted
 * lease_ms may hand its bytes over only when it ends before start_ms + lease_ms. */
static inline int baton__store_lease_ok(uint64_t start_ms, uint64_t lease_ms, uint64_t end_ms)
{
    return end_ms < start_ms + lease_ms;
}

#endif
