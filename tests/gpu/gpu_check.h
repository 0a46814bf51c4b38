/* gpu_check.h — what the two processes of baton-gpu-check agree on: how a room id tells the
 * serving (prefill) process what to do, and where a room's bytes come from in its source. */
#ifndef BATON_GPU_CHECK_H
#define BATON_GPU_CHECK_H

#include <stdint.h>

#define GPU_SEED 0x5eedba70ull
#define POISON   0xEE

/* room id = mode << 56 | flags << 48 | sequence */
enum {
    MODE_LAYER = 1,      /* baton_xfer_write_layer, one call per layer */
    MODE_ROOM = 2,       /* baton_xfer_write_room */
    MODE_EVENT = 3,      /* source poisoned, then per layer: kernel writes it, event recorded,
                            baton_xfer_write_layer_after_event */
    MODE_ABORT = 4,      /* layer 0 written, then baton_xfer_room_abort */
    MODE_SLOW_EVENT = 5, /* as MODE_EVENT with a long kernel (the decode side aborts) */
};
#define FLAG_HOST_SRC 0x01u /* the source is host memory (memfd), not device memory */

static inline uint64_t room_id_make(unsigned mode, unsigned flags, uint64_t seq)
{
    return (uint64_t)mode << 56 | (uint64_t)(flags & 0xff) << 48 | (seq & 0xffffffffffffull);
}
static inline unsigned room_mode(uint64_t id)
{
    return (unsigned)(id >> 56);
}
static inline unsigned room_flags(uint64_t id)
{
    return (unsigned)(id >> 48) & 0xff;
}

/* Page (layer, page) of a room of `ppl` pages per layer of page_len bytes carries the source's
 * bytes at this offset (the pattern's offset too): rooms are laid out contiguously. */
static inline uint64_t page_offset(uint32_t layer, uint32_t page, uint32_t ppl, uint64_t page_len)
{
    return ((uint64_t)layer * ppl + page) * page_len;
}

#define EVENT_DELAY_NS      (20u * 1000u * 1000u)  /* per layer in MODE_EVENT */
#define SLOW_EVENT_DELAY_NS (600u * 1000u * 1000u) /* per layer in MODE_SLOW_EVENT */

/* The serving process (gpu_serve.c): `baton-gpu-check serve ...`. */
int gpu_serve_main(int argc, char **argv);

#endif
