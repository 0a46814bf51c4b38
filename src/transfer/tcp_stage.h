/* transfer/tcp_stage.h — the tcp transport's bounce buffers for CUDA device memory: a bounded
 * pool of pinned host chunks per peer, and the driver copies between them and device pages. */
#ifndef BATON_TRANSFER_TCP_STAGE_H
#define BATON_TRANSFER_TCP_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "transfer/transport.h"

/*
 * A socket cannot read or fill device memory, so tcp moves it through host memory:
 *
 *   sender (INITIATOR), device source: the progress thread takes a chunk, cuMemcpyDtoH's the
 *   slice's source into it (the call returns once the bytes are in the chunk), then writev()s
 *   header + chunk. The chunk goes back to the pool in the slice's write callback (the kernel
 *   holds the bytes by then), before its WACK.
 *
 *   receiver (TARGET), device destination: the progress thread reads the slice's payload into
 *   the lane's chunk and cuMemcpyHtoD's each full chunk (and the last, partial one) to the
 *   destination page. The chunk is pinned, so the copy has finished when the call returns; the
 *   slice's WACK is queued only after its last copy returned, so "completed" still means every
 *   byte is in the device page. The lane gives the chunk back when the slice ends.
 *
 * Owner: the tcp peer (one pool each), allocated lazily on the first device slice, freed when
 * the peer is destroyed. Only the progress thread touches a pool, and it makes a context
 * current there first (the device that owns the first device pointer it copies, as
 * registration does on caller threads). Bound: `max` chunks of `chunk` bytes each; a sender
 * that finds the pool empty waits (its slices stay queued) until a write callback returns one;
 * a receiver pool has one chunk per lane, so a lane always finds one. The bytes held are the
 * gauge stage_buffer_bytes and the bytes copied the counter staged_bytes of the engine's stats.
 *
 * Errors, all on the progress thread, each failing only the slice's write (the peer stays up):
 * no driver or no context -> BATON_ENODEV; no pinned memory -> BATON_ENOMEM; a failed copy ->
 * BATON_EINVAL. A sender fails the write with it and sends none of its remaining slices; a
 * receiver drains the rest of the slice and answers its WACK with the error, so the room fails
 * on the prefill side and nothing reports the page as written.
 */

#define TCP_STAGE_BOUND      (8u << 20)   /* sender: bytes of chunks per peer (at least 2) */
#define TCP_STAGE_RECV_CHUNK (512u << 10) /* receiver: bytes per lane's chunk */

typedef struct {
    const baton__tp_env_t *env;
    size_t chunk;    /* bytes per chunk */
    uint32_t max;    /* bound on chunks allocated */
    uint32_t n_all;  /* chunks allocated */
    uint32_t n_free; /* of which in free[] */
    uint8_t **all;   /* every chunk allocated (freed at fini) */
    uint8_t **free;  /* chunks not in use */
    int ctx;         /* 0 unknown, 1 a context is current on the progress thread, -1 none */
} tcp_stage_t;

#ifdef BATON_HAVE_CUDA
#define TCP_STAGE_CUDA 1
#else
#define TCP_STAGE_CUDA 0 /* no device memory is ever registered */
#endif

/* Sets the pool's shape; allocates nothing. A receiver's (`target`) has one
 * TCP_STAGE_RECV_CHUNK chunk per lane (`lanes`), a sender's max(2, TCP_STAGE_BOUND / slice)
 * chunks of `slice` bytes. */
void tcp_stage_init(tcp_stage_t *st, const baton__tp_env_t *env, int target, uint64_t slice,
                    uint32_t lanes);

/* Registration (caller thread): 0 when [addr, addr+len) lies in one device allocation the
 * driver knows (making a context current there first), else BATON_ENOTSUP. */
int tcp_stage_reg(void *addr, size_t len);

/* A chunk for copies to or from device pointer `dev`. NULL with *err 0: the bound is reached
 * (wait for tcp_stage_put); NULL with *err set: BATON_ENODEV or BATON_ENOMEM. */
uint8_t *tcp_stage_get(tcp_stage_t *st, const void *dev, int *err);
void tcp_stage_put(tcp_stage_t *st, uint8_t *chunk);

/* Sender: a chunk holding the `len` bytes of device source `src` in *chunk_p (0); *chunk_p
 * NULL and 0: the bound is reached, wait; or an error (no chunk held then). */
int tcp_stage_source(tcp_stage_t *st, const void *src, size_t len, uint8_t **chunk_p);

/* Receiver: `n` more bytes are in `chunk` after the *fill ones not copied yet. A full chunk,
 * or the slice's last bytes (`left` 0), are copied to *dst now (*dst advances, *fill is 0).
 * 0 or BATON_EINVAL. */
int tcp_stage_arrived(tcp_stage_t *st, const uint8_t *chunk, size_t *fill, size_t n, uint8_t **dst,
                      uint64_t left);

/* Device -> chunk and chunk -> device; both return once the copy has finished. 0 or
 * BATON_EINVAL. */
int tcp_stage_dtoh(tcp_stage_t *st, uint8_t *chunk, const void *dev, size_t n);
int tcp_stage_htod(tcp_stage_t *st, void *dev, const uint8_t *chunk, size_t n);

/* Frees every chunk, in use or not (the peer is gone: no copy or socket uses them anymore). */
void tcp_stage_fini(tcp_stage_t *st);

#endif
