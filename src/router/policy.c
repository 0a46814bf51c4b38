/* policy.c — round_robin / random / power_of_two selection and the per-thread RNG. */
#include "router/policy.h"

#include "baton/error.h"
#include "common/rand.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

struct baton_policy_s {
    baton_policy_kind_t kind;
    atomic_ullong rr_next; /* round_robin position; shared by all threads */
};

static const char *const policy_names[] = {"round_robin", "random", "power_of_two"};

const char *baton_policy_name(baton_policy_kind_t kind)
{
    if ((unsigned)kind < sizeof(policy_names) / sizeof(policy_names[0]))
        return policy_names[kind];
    return "unknown";
}

int baton_policy_parse(const char *name, baton_policy_kind_t *kind_p)
{
    if (name == NULL)
        return BATON_EINVAL;
    for (size_t i = 0; i < sizeof(policy_names) / sizeof(policy_names[0]); i++) {
        if (strcmp(name, policy_names[i]) == 0) {
            *kind_p = (baton_policy_kind_t)i;
            return 0;
        }
    }
    return BATON_EINVAL;
}

int baton_policy_create(baton_policy_t **policy_p, baton_policy_kind_t kind)
{
    if ((unsigned)kind > BATON_POLICY_POWER_OF_TWO)
        return BATON_EINVAL;
    baton_policy_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return BATON_ENOMEM;
    p->kind = kind;
    atomic_init(&p->rr_next, 0);
    *policy_p = p;
    return 0;
}

void baton_policy_destroy(baton_policy_t *policy)
{
    free(policy);
}

baton_policy_kind_t baton_policy_kind(const baton_policy_t *policy)
{
    return policy->kind;
}

/* ---- RNG: xoshiro256** per thread, seeded once from getrandom(2) through splitmix64 ---- */

static _Thread_local uint64_t rng_state[4];
static _Thread_local int rng_seeded;

static void rng_seed(void)
{
    uint64_t seed = 0;
    ssize_t got = -1;
    for (int tries = 0; tries < 4 && got != (ssize_t)sizeof(seed); tries++)
        got = getrandom(&seed, sizeof(seed), 0);
    if (got != (ssize_t)sizeof(seed)) {
        /* No entropy source (very old kernel / seccomp): mix time, pid and a stack address so
         * threads still diverge. Rooms then are less unpredictable, but still unique enough. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)getpid() ^
               (uint64_t)(uintptr_t)&ts;
    }
    baton_xoshiro_seed(rng_state, seed);
    rng_seeded = 1;
}

uint64_t baton_rand_u64(void)
{
    if (!rng_seeded)
        rng_seed();
    return baton_xoshiro_next(rng_state);
}

uint64_t baton_rand_below(uint64_t n)
{
    if (n == 0)
        return 0;
    /* Reject the top partial range so every residue is equally likely. */
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t r = baton_rand_u64();
        if (r >= threshold)
            return r % n;
    }
}

uint64_t baton_bootstrap_room(void)
{
    return baton_rand_u64() >> 1;
}

/* ---- selection ---- */

baton_worker_t *baton_policy_select(baton_policy_t *policy, baton_worker_t *const *cands, size_t n)
{
    if (policy == NULL || cands == NULL || n == 0)
        return NULL;
    if (n == 1)
        return cands[0];
    switch (policy->kind) {
    case BATON_POLICY_ROUND_ROBIN: {
        unsigned long long i = atomic_fetch_add_explicit(&policy->rr_next, 1, memory_order_relaxed);
        return cands[i % n];
    }
    case BATON_POLICY_RANDOM:
        return cands[baton_rand_below(n)];
    case BATON_POLICY_POWER_OF_TWO: {
        size_t i = (size_t)baton_rand_below(n);
        size_t j = (size_t)baton_rand_below(n - 1);
        if (j >= i)
            j++; /* two distinct candidates */
        long li = baton_worker_in_flight(cands[i]);
        long lj = baton_worker_in_flight(cands[j]);
        if (li < lj)
            return cands[i];
        if (lj < li)
            return cands[j];
        return (baton_rand_u64() & 1) ? cands[i] : cands[j];
    }
    }
    return NULL;
}

#define PICK_STACK 64

baton_worker_t *baton_policy_pick(baton_policy_t *policy, baton_registry_t *reg,
                                  baton_worker_role_t role)
{
    baton_worker_t *stack[PICK_STACK], **cands;
    size_t n =
        baton_registry_snapshot_all(reg, role, BATON_SNAP_ELIGIBLE, stack, PICK_STACK, &cands);
    baton_worker_t *chosen = baton_policy_select(policy, cands, n);
    if (chosen != NULL)
        baton_worker_ref(chosen);
    baton_workers_release(cands, n, stack);
    return chosen;
}
