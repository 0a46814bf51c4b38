/* baton/store.h — the client API of baton-store, Baton's external KV cache (masters, nodes). */
#ifndef BATON_STORE_H
#define BATON_STORE_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "baton/export.h"
#include "baton/transfer.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Model
 * -----
 * A MASTER holds metadata only: which object (a key, at most BATON_STORE_KEY_MAX bytes) lives
 * where — key → replicas → slices, each slice a range of one NODE's segment —, the object's
 * state, leases, soft pins, per-namespace byte quotas and every node's capacity. NODES contribute
 * memory segments registered with libbaton and serve nothing but that memory. Bytes move between
 * a client's registered buffers and the nodes' segments directly over libbaton's transports (tcp
 * direct placement, shm on one host, rdma); they never pass through the master.
 *
 *   put:    PUT_START to the master (sizes, replicas, namespace, CRC32C of each object) → the
 *           master allocates `replicas` replicas (each on a different segment and, when there
 *           are enough, a different node; large objects striped into slices over several
 *           segments) → the client has every node pull its slices from the client's buffers
 *           (baton_xfer_export / baton_xfer_pull: the node places the bytes, the client's
 *           engine must therefore listen) → PUT_COMMIT; a failed write sends PUT_REVOKE.
 *           An uncommitted object is invisible to readers; a put left uncommitted for longer
 *           than the master's put timeout may be taken over by a new put of the same key, and
 *           its space is reclaimed only after the longer reclaim time (the old writer may still
 *           be writing into it). Committed objects are immutable (BATON_STORE_PUT_UPSERT
 *           replaces one that no reader holds).
 *   get:    GET to the master → a lease (the master's --lease-ttl-ms, default 10 s) and the
 *           replica list → the client offers its destination buffers to a node holding each
 *           slice (baton_xfer_offer; striped slices are read in parallel), checks the CRC32C
 *           the putter stored, and checks that the lease has not expired on its own monotonic
 *           clock (measured from before the request was sent). A read that ends after its lease
 *           fails with BATON_STORE_ELEASE, a checksum mismatch with BATON_STORE_ECHECKSUM: a
 *           get never hands back bytes that may have been evicted and reused. A failed slice
 *           read is retried once on another replica.
 *   exists: EXISTS to the master; grants the same lease to present keys (HiCache checks, then
 *           reads). The result also counts the keys present *from the start* of the batch
 *           (`prefix`): the prefix cache semantics of HiCache's batch_exists.
 *   remove: REMOVE; refused with BATON_XFER_EBUSY while a lease is held.
 *
 * Eviction, pins and quotas are the master's (docs/STORE.md): above the high watermark (default
 * 90% of capacity) it evicts a ratio (default 5%) by LRU, never a leased, uncommitted or pinned
 * object while another is eligible; a soft pin (BATON_STORE_PUT_SOFT_PIN) is evicted last and
 * lapses after the master's pin TTL. A namespace's puts never evict another namespace's objects
 * to stay within its quota: over quota, a put evicts that namespace's own LRU objects or fails
 * with BATON_STORE_EQUOTA.
 *
 * Threads and ownership
 * ---------------------
 * The client uses the caller's libbaton engine (baton_store_config_t.engine): buffers passed to
 * put and get must be registered with that engine (baton_xfer_mem_register / _alloc), and the
 * engine must listen (cfg.listen_host) so that nodes can pull the puts' bytes. The client adopts
 * the engine's mode:
 *   Loop mode (the engine was created with a loop): the client must be created with the SAME
 *   loop; every baton_store_* call on the loop's thread; every callback on it.
 *   Own-progress mode (loop == NULL, and an engine created with loop == NULL): the client runs
 *   its own loop on a thread of its own, and that thread dispatches the ENGINE too (so the host
 *   must not call baton_xfer_engine_dispatch on it while the client lives, and the engine's own
 *   callbacks, for rooms the host offers on it, run on the client's thread: give the client an
 *   engine of its own). Every baton_store_* call may come from any thread (calls are posted to
 *   the client's thread in the order they were made); completions are queued, and
 *   baton_store_client_fd() becomes readable (POLLIN) when some are; baton_store_client_dispatch()
 *   runs their callbacks on the calling thread, inside that call, as baton_xfer_engine_dispatch
 *   does. A call that returns 0 gets its callback through dispatch even when it failed on the
 *   client's thread (the error is in status). baton_store_client_destroy's close_cb also runs
 *   inside dispatch, after every other callback; the client and its fd are gone when it
 *   returns. After that the host dispatches the engine again (to destroy it, for instance).
 *   A client whose mode differs from its engine's is refused (BATON_XFER_EINVAL).
 * Callbacks never fire inside the call that started the operation: a call that returns an error
 * fires none; a call that returns 0 fires its callback exactly once, later.
 * Inline reads (cfg.inline_max) BLOCK the thread that runs them for the round trip to the node
 * (at most 200 ms per socket call, or request_timeout_ms when shorter, for a node that does not
 * answer; a node that failed is left to the engines for a second): in loop mode the caller's
 * loop thread; in own-progress mode the CALLING thread when the location cache places every
 * object of the get (its completion is queued for dispatch at once: no hand-off to the client's
 * thread and back), else the client's own thread. A thread holds an inline connection only
 * while it reads (each node keeps up to 4 idle, shared by all threads) and reads into a buffer
 * of its own call. A loop-mode get read wholly inline completes on the loop's next iteration.
 * Buffers: a put's sources must stay valid and unchanged, a get's destinations untouched, until
 * the operation's callback (the engine may read or write them until then). Keys are copied.
 * Results passed to a callback are valid only during the callback.
 * The engine must outlive the client (destroy the client first; its close callback says when).
 *
 * ABI: as baton/transfer.h — config and option structs carry their size and grow only at the
 * end; enum values and error codes are never renumbered; functions only added.
 *
 * Errors: 0 or negative: baton/transfer_error.h's codes, libuv's, and the BATON_STORE_* codes
 * below (baton_store_strerror knows all of them).
 */

#define BATON_STORE_KEY_MAX       255  /* bytes of a key (any bytes but NUL) */
#define BATON_STORE_NAMESPACE_MAX 63   /* bytes of a namespace name */
#define BATON_STORE_BATCH_MAX     1024 /* objects per batch call */
#define BATON_STORE_REPLICAS_MAX  8

/* XX(name, value, message): the store's own codes, beside libbaton's (-20001..-20099). */
#define BATON_STORE_ERRNO_MAP(XX)                                                                  \
    XX(ENOSPACE, -20100, "no space left in the store")                                             \
    XX(EQUOTA, -20101, "namespace quota exceeded")                                                 \
    XX(ELEASE, -20102, "lease expired before the read finished")                                   \
    XX(ECHECKSUM, -20103, "object checksum mismatch")                                              \
    XX(ENOLEADER, -20104, "no master leader reachable")                                            \
    XX(ENOREPLICA, -20105, "no live replica of the object")                                        \
    XX(ETOOSMALL, -20106, "destination buffer smaller than the object")

typedef enum {
#define XX(name, value, msg) BATON_STORE_##name = (value),
    BATON_STORE_ERRNO_MAP(XX)
#undef XX
} baton_store_errno_t;

/* A static message for a store, libbaton or libuv code. Any thread. */
BATON_API const char *baton_store_strerror(int err);

typedef struct baton_store_client_s baton_store_client_t;

typedef struct {
    /* sizeof(baton_store_config_t) as compiled; set by baton_store_config_init. */
    size_t size;
    /* The master: "host:port", or "etcd://h1:p1,h2:p2/prefix" (the leader elected there; the
     * same URL form as the router's registry). Copied. Required. */
    const char *master;
    /* The libbaton engine that moves the bytes (see Threads and ownership). Required. */
    baton_xfer_engine_t *engine;
    /* The address nodes reach this engine's listener at, to pull the bytes of a put (copied).
     * NULL: "127.0.0.1". */
    const char *host;
    /* The control channel's shared secret (the libbaton KV secret, BATON_XFER_SECRET_MIN..MAX
     * bytes; copied). NULL: none (a master with a secret refuses the client). */
    const void *secret;
    size_t secret_len;
    /* Namespace of puts, gets and removes (NULL: "default"). Copied. */
    const char *ns;
    /* One request to the master, and one slice transfer, fail after this long. Default 5000. */
    uint32_t request_timeout_ms;
    /* Reconnect back-off to the master (exponential, full jitter). Defaults 50 .. 2000 ms; the
     * client never gives up: operations during an outage fail with BATON_STORE_ENOLEADER and
     * the next one after it succeeds without any call from the caller. Behind an etcd:// URL a
     * call that times out, or a standby's answer, makes the next call look the leader up. */
    uint32_t reconnect_min_ms;
    uint32_t reconnect_max_ms;
    /* Objects whose location the client remembers (default 4096; 0: none). A get or exists
     * grants a lease; within it the object can be neither evicted nor removed, so a get of an
     * object located less than half a lease ago (and with at least request_timeout_ms of the
     * lease left) reads straight from the nodes, without a request to the master: exists then
     * get costs one master round trip, not two. Such gets are not seen by the master (its
     * gets_total, hits and LRU order count the exists or get that located the object); a
     * cached read that fails, or a master connection that dropped since, falls back to asking
     * the master. Direct mapped: at most one entry per hash slot. */
    uint32_t location_cache;
    /* Inline reads: a get whose objects total at most this many bytes (default 65536; 0: never;
     * at most 1 MiB), their placement known (location cache or the master's answer), asks the
     * nodes for the bytes over their authenticated control ports, on the client's thread (see
     * Threads and ownership), instead of offering the buffers to the nodes' libbaton engines:
     * one TCP round trip per object, no engine thread on either side, one copy. The CRC32C is
     * checked as for every get; any failure (node gone or restarted, refused — a node answers
     * at most its own --inline-max —, bytes that do not match) reads that object through the
     * engines in the same call. Larger gets always go through the engines (zero copy, objects
     * in parallel), so the thread never blocks for more than this many bytes' round trips. */
    uint32_t inline_max;
} baton_store_config_t;

/* Fills the defaults and cfg->size. Any thread. */
BATON_API void baton_store_config_init(baton_store_config_t *cfg);

/* Creates a client (cfg copied). `loop`: as the engine's (see Threads). 0 and *client_p, or
 * BATON_XFER_EINVAL (missing master / engine, bad URL or secret), BATON_XFER_ENOMEM. */
BATON_API int baton_store_client_create(uv_loop_t *loop, const baton_store_config_t *cfg,
                                        baton_store_client_t **client_p);

/* Own-progress mode: the descriptor to poll (owned by the client: never read or close it; -1 in
 * loop mode), then dispatch: runs the pending callbacks on the calling thread and returns how
 * many ran (0 after a spurious wake-up), or BATON_XFER_EINVAL in loop mode. One thread at a time
 * dispatches; never from a callback. Any thread. */
BATON_API int baton_store_client_fd(const baton_store_client_t *client);
BATON_API int baton_store_client_dispatch(baton_store_client_t *client);

typedef void (*baton_store_close_cb)(baton_store_client_t *client, void *data);
/* Every pending operation fails with BATON_XFER_ESHUTDOWN (after its transfers are fenced),
 * then close_cb runs and the client is freed when it returns. */
BATON_API void baton_store_client_destroy(baton_store_client_t *client,
                                          baton_store_close_cb close_cb, void *data);

/* ---- batch operations ----------------------------------------------------------------------- */

/* One object of a batch: put reads addr[0..len), get writes at most len bytes at addr. */
typedef struct {
    const char *key;
    void *addr; /* inside memory registered with the client's engine */
    uint64_t len;
} baton_store_obj_t;

/* One object's outcome. */
typedef struct {
    int status;        /* 0, BATON_XFER_ENOTFOUND (missing), or an error */
    uint64_t len;      /* get / exists: the object's size; put: bytes stored */
    uint32_t replicas; /* put: replicas placed (may be fewer than asked: best effort) */
} baton_store_result_t;

/*
 * A batch finished. status: 0 when the batch was carried out (each object's own outcome is in
 * res[i]), else why none was (BATON_STORE_ENOLEADER, BATON_XFER_ESHUTDOWN, ...; res then
 * carries the same code for every object). prefix: how many objects from the start of the batch
 * have res[i].status == 0 (exists / get: the prefix-cache hit length).
 */
typedef void (*baton_store_batch_cb)(void *data, int status, const baton_store_result_t *res,
                                     size_t n, size_t prefix);

enum {
    BATON_STORE_PUT_SOFT_PIN = 1u << 0, /* evicted last, for the master's pin TTL */
    BATON_STORE_PUT_UPSERT = 1u << 1,   /* replace a committed object no reader holds */
};

/*
 * The KV block an object holds, for the master's KV events (docs/STORE.md, "KV events"): when
 * the object commits the master publishes a vLLM BlockStored event for it (medium "L3"), when it
 * is freed a BlockRemoved, so a router's index can count the blocks reachable in the store. The
 * engine's block hash in vLLM's integer form, its parent's (has_parent 0 for a first block), and
 * the block's token ids (n_tokens, the engine's block size, at most 4096). Copied by the call.
 */
typedef struct {
    int64_t hash;
    int64_t parent_hash;
    int has_parent;
    const uint32_t *token_ids;
    uint32_t n_tokens;
    int has_lora;
    int64_t lora_id;
} baton_store_block_t;

typedef struct {
    size_t size;       /* set by baton_store_put_opts_init */
    uint32_t replicas; /* 1..BATON_STORE_REPLICAS_MAX, default 1 */
    uint32_t flags;    /* BATON_STORE_PUT_* */
    /* NULL, or one per object of the batch: the block it holds (n_tokens 0: none) */
    const baton_store_block_t *blocks;
} baton_store_put_opts_t;

BATON_API void baton_store_put_opts_init(baton_store_put_opts_t *opts);

/* Stores n objects (1..BATON_STORE_BATCH_MAX). opts NULL: defaults. A key already committed
 * gets BATON_XFER_EEXIST in its result (nothing is written), unless UPSERT. */
BATON_API int baton_store_put(baton_store_client_t *client, const baton_store_obj_t *objs, size_t n,
                              const baton_store_put_opts_t *opts, baton_store_batch_cb cb,
                              void *data);

/* Reads n objects into the given buffers (zero copy: the node places the bytes there). An
 * object larger than its buffer: BATON_STORE_ETOOSMALL (res.len says how large). */
BATON_API int baton_store_get(baton_store_client_t *client, const baton_store_obj_t *objs, size_t n,
                              baton_store_batch_cb cb, void *data);

/* Which of n keys are committed (res[i].status 0 or BATON_XFER_ENOTFOUND), and the prefix. */
BATON_API int baton_store_exists(baton_store_client_t *client, const char *const *keys, size_t n,
                                 baton_store_batch_cb cb, void *data);

/* Removes n keys; a leased key: BATON_XFER_EBUSY in its result. */
BATON_API int baton_store_remove(baton_store_client_t *client, const char *const *keys, size_t n,
                                 baton_store_batch_cb cb, void *data);

/* CRC32C (Castagnoli) of len bytes, continuing from `crc` (0 to start): SSE4.2 where the CPU has
 * it, else a table. The store's object checksum. Any thread. */
BATON_API uint32_t baton_store_crc32c(uint32_t crc, const void *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
