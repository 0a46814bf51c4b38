/* test_store_meta.c — the store master's metadata on a fake clock: the object state machine
 * (put, commit, revoke, takeover, reclaim), leases, LRU eviction at the watermark with its
 * skips, soft pins, namespace quotas, placement by free space, replicas, striping, node loss. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>

#include "store/meta_int.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

static baton__meta_t *mk(void)
{
    baton__meta_config_t cfg;
    baton__meta_config_init(&cfg);
    baton__meta_t *m = NULL;
    assert_int_equal(baton__meta_create(&cfg, &m), 0);
    return m;
}

static uint32_t add_node(baton__meta_t *m, const char *id, uint64_t bytes)
{
    uint32_t node, seg;
    assert_int_equal(baton__meta_node_add(m, id, &node), 0);
    assert_int_equal(baton__meta_segment_add(m, node, bytes, &seg), 0);
    return node;
}

/* Space bookkeeping agrees three ways: the segments, the module's total, the namespaces. */
static void check_books(baton__meta_t *m)
{
    uint64_t segs = 0, nss = 0, held = 0;
    for (size_t i = 0; i < m->n_segs; i++) {
        if (!m->segs[i].alive)
            continue;
        uint64_t f = 0;
        for (size_t j = 0; j < m->segs[i].n_free; j++)
            f += m->segs[i].free[j].len;
        assert_int_equal(f + m->segs[i].used, m->segs[i].capacity);
        segs += m->segs[i].used;
    }
    for (size_t i = 0; i < m->n_ns; i++)
        nss += m->nss[i].used;
    baton__olist_t *lists[] = {&m->lru, &m->lru_pin, &m->putting, &m->revoked};
    for (size_t i = 0; i < 4; i++)
        for (baton__mobj_t *o = lists[i]->head; o; o = o->next)
            held += o->held_bytes;
    assert_int_equal(segs, m->used);
    assert_int_equal(nss, held);
    assert_int_equal(m->st.refused, 0);
}

static int put(baton__meta_t *m, const char *ns, const char *key, uint64_t len, uint32_t replicas,
               uint32_t flags, uint64_t now, uint64_t *id_p)
{
    baton__put_req_t r = {ns, key, len, 0x1234u, replicas, flags};
    baton__obj_view_t v;
    int rc = baton__meta_put_start(m, &r, now, &v);
    if (rc == 0 && id_p)
        *id_p = v.put_id;
    return rc;
}

static int put_commit(baton__meta_t *m, const char *ns, const char *key, uint64_t len,
                      uint32_t flags, uint64_t now)
{
    uint64_t id = 0;
    int rc = put(m, ns, key, len, 1, flags, now, &id);
    return rc ? rc : baton__meta_put_commit(m, ns, key, id, now);
}

static void test_state_table(void **state)
{
    (void)state;
    assert_true(baton__meta_state_allowed(BATON__OBJ_PUTTING, BATON__OBJ_COMPLETE));
    assert_true(baton__meta_state_allowed(BATON__OBJ_PUTTING, BATON__OBJ_REVOKED));
    assert_true(baton__meta_state_allowed(BATON__OBJ_PUTTING, BATON__OBJ_FREED));
    assert_true(baton__meta_state_allowed(BATON__OBJ_COMPLETE, BATON__OBJ_FREED));
    assert_true(baton__meta_state_allowed(BATON__OBJ_REVOKED, BATON__OBJ_FREED));
    assert_false(baton__meta_state_allowed(BATON__OBJ_COMPLETE, BATON__OBJ_PUTTING));
    assert_false(baton__meta_state_allowed(BATON__OBJ_COMPLETE, BATON__OBJ_REVOKED));
    assert_false(baton__meta_state_allowed(BATON__OBJ_REVOKED, BATON__OBJ_COMPLETE));
    assert_false(baton__meta_state_allowed(BATON__OBJ_FREED, BATON__OBJ_PUTTING));
    assert_false(baton__meta_state_allowed(BATON__OBJ_COUNT, BATON__OBJ_FREED));
    assert_string_equal(baton__meta_state_name(BATON__OBJ_REVOKED), "revoked");

    /* An illegal move through the one function is refused, counted, and changes nothing. */
    baton__meta_t *m = mk();
    add_node(m, "n0", MIB);
    uint64_t id = 0;
    assert_int_equal(put(m, NULL, "k", 100, 1, 0, 0, &id), 0);
    assert_int_equal(baton__meta_put_commit(m, NULL, "k", id, 0), 0);
    baton__mobj_t *o = m->lru.head;
    assert_int_equal(baton__meta_obj_set_state(m, o, BATON__OBJ_REVOKED, 0), BATON_XFER_EINVAL);
    assert_int_equal(o->state, BATON__OBJ_COMPLETE);
    assert_int_equal(m->st.refused, 1);
    baton__meta_destroy(m);
}

static void test_put_lifecycle(void **state)
{
    (void)state;
    baton__meta_t *m = mk();
    add_node(m, "n0", MIB);
    uint64_t id = 0;
    baton__obj_view_t v;
    assert_int_equal(put(m, NULL, "a", 1000, 1, 0, 0, &id), 0);
    /* Uncommitted: invisible to readers, and its key is taken. */
    assert_int_equal(baton__meta_get(m, NULL, "a", 1, &v), BATON_XFER_ENOTFOUND);
    assert_int_equal(baton__meta_exists(m, NULL, "a", 1, 1, NULL, NULL), 0);
    assert_int_equal(put(m, NULL, "a", 1000, 1, 0, 1, NULL), BATON_XFER_EEXIST);
    assert_int_equal(baton__meta_put_commit(m, NULL, "a", id + 1, 2), BATON_XFER_ENOTFOUND);
    assert_int_equal(baton__meta_put_commit(m, NULL, "a", id, 2), 0);
    assert_int_equal(baton__meta_get(m, NULL, "a", 3, &v), 0);
    assert_int_equal(v.len, 1000);
    assert_int_equal(v.crc, 0x1234u);
    assert_int_equal(v.n_replicas, 1);
    assert_int_equal(v.n_slices, 1);
    assert_int_equal(v.lease_ms, 10000);
    /* Immutable: a second put is refused; an upsert waits for the lease. */
    assert_int_equal(put(m, NULL, "a", 10, 1, 0, 4, NULL), BATON_XFER_EEXIST);
    assert_int_equal(put(m, NULL, "a", 10, 1, BATON_STORE_PUT_UPSERT, 4, NULL), BATON_XFER_EBUSY);
    assert_int_equal(put(m, NULL, "a", 10, 1, BATON_STORE_PUT_UPSERT, 20000, &id), 0);
    assert_int_equal(baton__meta_put_commit(m, NULL, "a", id, 20000), 0);
    assert_int_equal(baton__meta_get(m, NULL, "a", 20001, &v), 0);
    assert_int_equal(v.len, 10);
    /* A failed write revokes: the key and the space are free at once. */
    uint64_t used = m->used;
    assert_int_equal(put(m, NULL, "b", 5000, 1, 0, 30000, &id), 0);
    assert_true(m->used > used);
    assert_int_equal(baton__meta_put_revoke(m, NULL, "b", id, 30001), 0);
    assert_int_equal(m->used, used);
    assert_int_equal(put(m, NULL, "b", 5000, 1, 0, 30002, NULL), 0);
    /* Bad requests. */
    assert_int_equal(put(m, NULL, "", 1, 1, 0, 0, NULL), BATON_XFER_EINVAL);
    assert_int_equal(put(m, NULL, "z", 0, 1, 0, 0, NULL), BATON_XFER_EINVAL);
    assert_int_equal(put(m, NULL, "z", 1, 0, 0, 0, NULL), BATON_XFER_EINVAL);
    assert_int_equal(put(m, NULL, "z", 1, BATON_STORE_REPLICAS_MAX + 1, 0, 0, NULL),
                     BATON_XFER_EINVAL);
    char longkey[BATON_STORE_KEY_MAX + 2];
    memset(longkey, 'k', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = '\0';
    assert_int_equal(put(m, NULL, longkey, 1, 1, 0, 0, NULL), BATON_XFER_EINVAL);
    assert_int_equal(put(m, NULL, "z", 2 * MIB, 1, 0, 0, NULL), BATON_STORE_ENOSPACE);
    check_books(m);
    baton__meta_destroy(m);
}

static void test_put_takeover(void **state)
{
    (void)state;
    baton__meta_t *m = mk();
    add_node(m, "n0", MIB);
    uint64_t id1 = 0, id2 = 0;
    assert_int_equal(put(m, NULL, "k", 4096, 1, 0, 0, &id1), 0);
    uint64_t one = m->used;
    assert_int_equal(put(m, NULL, "k", 4096, 1, 0, 29999, NULL), BATON_XFER_EEXIST);
    assert_int_equal(put(m, NULL, "k", 4096, 1, 0, 30000, &id2), 0);
    assert_int_equal(m->st.takeovers, 1);
    /* The old writer may still write: its space stays held until the reclaim time. */
    assert_int_equal(m->used, 2 * one);
    assert_int_equal(baton__meta_put_commit(m, NULL, "k", id1, 30001), BATON_XFER_ENOTFOUND);
    assert_int_equal(baton__meta_put_revoke(m, NULL, "k", id1, 30001), BATON_XFER_ENOTFOUND);
    assert_int_equal(baton__meta_put_commit(m, NULL, "k", id2, 30002), 0);
    assert_int_equal(baton__meta_tick(m, 30000 + 599999), 0);
    assert_int_equal(m->used, 2 * one);
    assert_int_equal(baton__meta_tick(m, 30000 + 600000), 1);
    assert_int_equal(m->used, one);
    /* An abandoned put with no successor: the tick times it out and later reclaims it. */
    assert_int_equal(put(m, NULL, "lost", 4096, 1, 0, 1000000, NULL), 0);
    baton__meta_tick(m, 1000000 + 30000);
    assert_int_equal(m->putting.n, 0);
    assert_int_equal(m->revoked.n, 1);
    assert_int_equal(put(m, NULL, "lost", 4096, 1, 0, 1030001, &id1), 0); /* key free again */
    assert_int_equal(baton__meta_put_commit(m, NULL, "lost", id1, 1030002), 0);
    baton__meta_tick(m, 1030000 + 600000);
    assert_int_equal(m->revoked.n, 0);
    check_books(m);
    baton__meta_destroy(m);
}

static void test_lease(void **state)
{
    (void)state;
    baton__meta_t *m = mk();
    add_node(m, "n0", MIB);
    baton__obj_view_t v;
    assert_int_equal(put_commit(m, NULL, "k", 100, 0, 0), 0);
    assert_int_equal(baton__meta_get(m, NULL, "k", 1000, &v), 0); /* lease until 11000 */
    assert_int_equal(baton__meta_remove(m, NULL, "k", 10999), BATON_XFER_EBUSY);
    assert_int_equal(m->st.lease_denials, 1);
    /* exists leases too (HiCache checks, then reads) and extends, never shortens. */
    assert_int_equal(baton__meta_exists(m, NULL, "k", 5000, 1, NULL, NULL), 1);
    assert_int_equal(baton__meta_remove(m, NULL, "k", 14999), BATON_XFER_EBUSY);
    /* the HTTP query grants none */
    assert_int_equal(baton__meta_exists(m, NULL, "k", 14000, 0, NULL, NULL), 1);
    assert_int_equal(baton__meta_remove(m, NULL, "k", 15000), 0);
    assert_int_equal(baton__meta_remove(m, NULL, "k", 15000), BATON_XFER_ENOTFOUND);

    /* A read past its lease fails on the client: by then the master may evict the object. */
    assert_int_equal(put_commit(m, NULL, "r", 100, 0, 20000), 0);
    assert_int_equal(baton__meta_get(m, NULL, "r", 20000, &v), 0);
    assert_true(baton__store_lease_ok(20000, v.lease_ms, 29999));
    assert_false(baton__store_lease_ok(20000, v.lease_ms, 30000));
    assert_int_equal(baton__meta_evict(m, 1, UINT32_MAX, 29999), 0); /* still leased */
    assert_true(baton__meta_evict(m, 1, UINT32_MAX, 30000) > 0);     /* now it may go */
    check_books(m);
    baton__meta_destroy(m);
}

/* 100 objects of 1 KiB fill a 100 KiB segment; the watermark is 90 KiB. */
static void test_eviction_watermark(void **state)
{
    (void)state;
    baton__meta_t *m = mk();
    add_node(m, "n0", 100 * KIB);
    char key[32];
    for (int i = 0; i < 89; i++) {
        snprintf(key, sizeof(key), "o%d", i);
        assert_int_equal(put_commit(m, NULL, key, KIB, 0, (uint64_t)i), 0);
    }
    assert_int_equal(m->st.evictions, 0);
    /* Special cases among the oldest: o0 leased (read now), o1 read long ago (recently used
     * then, lease lapsed), o2 soft pinned is elsewhere; an uncommitted put holds space too. */
    baton__obj_view_t v;
    assert_int_equal(baton__meta_get(m, NULL, "o0", 100000, &v), 0);
    assert_int_equal(baton__meta_get(m, NULL, "o1", 100, &v), 0);
    uint64_t id = 0;
    assert_int_equal(put(m, NULL, "uncommitted", KIB, 1, 0, 100000, &id), 0);
    /* 90 KiB used: the tick evicts 5% of capacity (5 objects) in LRU order. */
    assert_int_equal(baton__meta_tick(m, 100001), 5);
    for (int i = 2; i < 7; i++) {
        snprintf(key, sizeof(key), "o%d", i);
        assert_int_equal(baton__meta_exists(m, NULL, key, 100002, 0, NULL, NULL), 0);
    }
    assert_int_equal(baton__meta_exists(m, NULL, "o0", 100002, 0, NULL, NULL), 1);
    assert_int_equal(baton__meta_exists(m, NULL, "o1", 100002, 0, NULL, NULL), 1);
    assert_int_equal(baton__meta_exists(m, NULL, "o7", 100002, 0, NULL, NULL), 1);
    assert_int_equal(baton__meta_put_commit(m, NULL, "uncommitted", id, 100003), 0);
    /* Below the watermark: nothing more. */
    assert_int_equal(baton__meta_tick(m, 100004), 0);
    check_books(m);
    baton__meta_destroy(m);
}

/* Capacity pressure with every object leased: nothing is evicted, the put fails cleanly. */
static void test_pressure_leased(void **state)
{
    (void)state;
    baton__meta_t *m = mk();
    add_node(m, "n0", 10 * KIB);
    char key[32];
    baton__obj_view_t v;
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "o%d", i);
        assert_int_equal(put_commit(m, NULL, key, KIB, 0, 0), 0);
        assert_int_equal(baton__meta_get(m, NULL, key, 1, &v), 0);
    }
    assert_int_equal(put_commit(m, NULL, "more", KIB, 0, 2), BATON_STORE_ENOSPACE);
    assert_int_equal(m->st.evictions, 0);
    /* Leases over: the put that finds no space evicts and succeeds. */
    assert_int_equal(put_commit(m, NULL, "more", KIB, 0, 10001), 0);
    assert_true(m->st.evictions >= 1);
    assert_int_equal(baton__meta_exists(m, NULL, "more", 10002, 0, NULL, NULL), 1);
    check_books(m);
    baton__meta_destroy(m);
}

static void test_soft_pin(void **state)
{
    (void)state;
    baton__meta_t *m = mk();
    add_node(m, "n0", 10 * KIB);
    assert_int_equal(put_commit(m, NULL, "sys", KIB, BATON_STORE_PUT_SOFT_PIN, 0), 0);
    assert_int_equal(put_commit(m, NULL, "a", KIB, 0, 1), 0);
    assert_int_equal(put_commit(m, NULL, "b", KIB, 0, 2), 0);
    /* The pinned object is the oldest, yet the others go first. */
    assert_int_equal(baton__meta_evict(m, 2 * KIB, UINT32_MAX, 100), 2 * KIB);
    assert_int_equal(baton__meta_exists(m, NULL, "sys", 100, 0, NULL, NULL), 1);
    /* Only it left: evicted when nothing else is eligible. */
    assert_int_equal(baton__meta_evict(m, KIB, UINT32_MAX, 101), KIB);
    assert_int_equal(baton__meta_exists(m, NULL, "sys", 102, 0, NULL, NULL), 0);
    /* A pin lapses after its TTL: then it is ordinary LRU. */
    assert_int_equal(put_commit(m, NULL, "sys2", KIB, BATON_STORE_PUT_SOFT_PIN, 1000), 0);
    assert_int_equal(put_commit(m, NULL, "c", KIB, 0, 1001), 0);
    uint64_t after = 1000 + 1800000;
    assert_int_equal(baton__meta_evict(m, KIB, UINT32_MAX, after), KIB);
    assert_int_equal(baton__meta_exists(m, NULL, "c", after, 0, NULL, NULL), 1);
    assert_int_equal(baton__meta_exists(m, NULL, "sys2", after, 0, NULL, NULL), 0);
    check_books(m);
    baton__meta_destroy(m);
}

static void test_quota(void **state)
{
    (void)state;
    baton__meta_t *m = mk();
    add_node(m, "n0", MIB);
    assert_int_equal(baton__meta_ns_quota(m, "modelA", 8 * KIB), 0);
    char key[32];
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof(key), "b%d", i);
        assert_int_equal(put_commit(m, "modelB", key, KIB, 0, (uint64_t)i), 0);
    }
    for (int i = 0; i < 8; i++) {
        snprintf(key, sizeof(key), "a%d", i);
        assert_int_equal(put_commit(m, "modelA", key, KIB, 0, 10 + (uint64_t)i), 0);
    }
    assert_int_equal(baton__meta_ns_used(m, "modelA"), 8 * KIB);
    /* Over quota: A evicts its own oldest, never B's (older still). */
    assert_int_equal(put_commit(m, "modelA", "a8", KIB, 0, 100), 0);
    assert_int_equal(baton__meta_exists(m, "modelA", "a0", 101, 0, NULL, NULL), 0);
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof(key), "b%d", i);
        assert_int_equal(baton__meta_exists(m, "modelB", key, 101, 0, NULL, NULL), 1);
    }
    assert_int_equal(baton__meta_ns_used(m, "modelA"), 8 * KIB);
    /* Same key, other namespace: another object. */
    assert_int_equal(baton__meta_exists(m, "modelB", "a1", 101, 0, NULL, NULL), 0);
    /* Larger than the quota, or everything of A leased: refused. */
    assert_int_equal(put_commit(m, "modelA", "huge", 9 * KIB, 0, 102), BATON_STORE_EQUOTA);
    baton__obj_view_t v;
    for (int i = 1; i < 9; i++) {
        snprintf(key, sizeof(key), "a%d", i);
        assert_int_equal(baton__meta_get(m, "modelA", key, 200, &v), 0);
    }
    assert_int_equal(put_commit(m, "modelA", "a9", KIB, 0, 201), BATON_STORE_EQUOTA);
    check_books(m);
    baton__meta_destroy(m);
}

/* Three nodes 80% full, a fourth joins empty: it gets more puts than any other, not all. */
static void test_placement_empty_node(void **state)
{
    (void)state;
    baton__meta_t *m = mk();
    uint32_t n[4];
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "n%d", i);
        n[i] = add_node(m, id, 1000 * KIB);
    }
    char key[32];
    for (int i = 0; i < 2400; i++) { /* 2400 KiB of 3000 */
        snprintf(key, sizeof(key), "old%d", i);
        assert_int_equal(put_commit(m, NULL, key, KIB, 0, 0), 0);
    }
    n[3] = add_node(m, "n3", 1000 * KIB);
    unsigned count[4] = {0};
    baton__obj_view_t v;
    for (int i = 0; i < 400; i++) {
        snprintf(key, sizeof(key), "new%d", i);
        baton__put_req_t r = {NULL, key, KIB, 0, 1, 0};
        assert_int_equal(baton__meta_put_start(m, &r, 1, &v), 0);
        count[v.slices[0].node]++;
        assert_int_equal(baton__meta_put_commit(m, NULL, key, v.put_id, 1), 0);
    }
    for (int i = 0; i < 3; i++) {
        assert_true(count[n[3]] > count[n[i]]);
        assert_true(count[n[i]] > 20); /* the old nodes still take writes */
    }
    assert_true(count[n[3]] < 400 * 7 / 10);
    check_books(m);
    baton__meta_destroy(m);
}

static void test_replicas_and_striping(void **state)
{
    (void)state;
    baton__meta_t *m = mk();
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "n%d", i);
        add_node(m, id, 64 * MIB);
    }
    baton__obj_view_t v;
    /* replicas 2, 10 MiB: striped into 3 slices (4 MiB stripes), replica r's slice s on
     * distinct nodes, and one replica's slices spread over the nodes. */
    baton__put_req_t r = {NULL, "big", 10 * MIB, 0, 2, 0};
    assert_int_equal(baton__meta_put_start(m, &r, 0, &v), 0);
    assert_int_equal(v.n_replicas, 2);
    assert_int_equal(v.n_slices, 3);
    for (uint32_t rep = 0; rep < 2; rep++) {
        uint64_t sum = 0;
        unsigned nodes_seen = 0;
        for (uint32_t s = 0; s < 3; s++) {
            const baton__slice_t *x = &v.slices[rep * 3 + s];
            sum += x->len;
            nodes_seen |= 1u << x->node;
            assert_int_equal(x->off % BATON__META_ALIGN, 0);
        }
        assert_int_equal(sum, 10 * MIB);
        assert_int_equal(nodes_seen, 7u);
    }
    for (uint32_t s = 0; s < 3; s++)
        assert_int_not_equal(v.slices[s].node, v.slices[3 + s].node);
    assert_int_equal(baton__meta_put_commit(m, NULL, "big", v.put_id, 0), 0);
    /* Best effort: 4 replicas over 3 segments gives 3, each on its own node. */
    baton__put_req_t r4 = {NULL, "r4", 100, 0, 4, 0};
    assert_int_equal(baton__meta_put_start(m, &r4, 0, &v), 0);
    assert_int_equal(v.n_replicas, 3);
    assert_int_equal(v.n_slices, 1);
    assert_int_not_equal(v.slices[0].node, v.slices[1].node);
    assert_int_not_equal(v.slices[1].node, v.slices[2].node);
    assert_int_not_equal(v.slices[0].node, v.slices[2].node);
    baton__meta_destroy(m);

    /* One node with two segments: two replicas share the node, never the segment. */
    m = mk();
    uint32_t node, s0, s1;
    assert_int_equal(baton__meta_node_add(m, "solo", &node), 0);
    assert_int_equal(baton__meta_segment_add(m, node, MIB, &s0), 0);
    assert_int_equal(baton__meta_segment_add(m, node, MIB, &s1), 0);
    baton__put_req_t r2 = {NULL, "k", 100, 0, 2, 0};
    assert_int_equal(baton__meta_put_start(m, &r2, 0, &v), 0);
    assert_int_equal(v.n_replicas, 2);
    assert_int_not_equal(v.slices[0].seg, v.slices[1].seg);
    check_books(m);
    baton__meta_destroy(m);
}

static void test_node_lost(void **state)
{
    (void)state;
    baton__meta_t *m = mk();
    uint32_t n[3];
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "n%d", i);
        n[i] = add_node(m, id, MIB);
    }
    char key[32];
    baton__obj_view_t v;
    for (int i = 0; i < 60; i++) {
        snprintf(key, sizeof(key), "two%d", i);
        baton__put_req_t r = {NULL, key, KIB, 0, 2, 0};
        assert_int_equal(baton__meta_put_start(m, &r, 0, &v), 0);
        assert_int_equal(baton__meta_put_commit(m, NULL, key, v.put_id, 0), 0);
    }
    int ones_on_n1 = 0;
    for (int i = 0; i < 30; i++) {
        snprintf(key, sizeof(key), "one%d", i);
        baton__put_req_t r = {NULL, key, KIB, 0, 1, 0};
        assert_int_equal(baton__meta_put_start(m, &r, 0, &v), 0);
        ones_on_n1 += v.slices[0].node == n[1];
        assert_int_equal(baton__meta_put_commit(m, NULL, key, v.put_id, 0), 0);
    }
    /* A put under way with its only replica on n1 fails at commit. */
    uint64_t pending_id = 0;
    for (int i = 0; i < 50 && pending_id == 0; i++) {
        snprintf(key, sizeof(key), "pending%d", i);
        baton__put_req_t r = {NULL, key, KIB, 0, 1, 0};
        assert_int_equal(baton__meta_put_start(m, &r, 0, &v), 0);
        if (v.slices[0].node == n[1])
            pending_id = v.put_id;
        else
            assert_int_equal(baton__meta_put_revoke(m, NULL, key, v.put_id, 0), 0);
    }
    assert_int_not_equal(pending_id, 0);
    uint64_t cap = m->capacity;
    assert_int_equal(baton__meta_node_lost(m, n[1], 1), (size_t)ones_on_n1);
    assert_int_equal(m->capacity, cap - MIB);
    assert_int_equal(baton__meta_put_commit(m, NULL, key, pending_id, 2), BATON_STORE_ENOREPLICA);
    for (int i = 0; i < 60; i++) {
        snprintf(key, sizeof(key), "two%d", i);
        assert_int_equal(baton__meta_get(m, NULL, key, 2, &v), 0);
        assert_int_equal(v.n_replicas, 2);
        uint32_t live = 0;
        for (uint32_t j = 0; j < v.n_replicas * v.n_slices; j++) {
            assert_int_not_equal(v.slices[j].node, n[1]);
            live += v.slices[j].node != BATON__SLICE_LOST;
        }
        assert_true(live >= 1);
    }
    check_books(m);
    /* A striped object with 2 replicas over 3 nodes: no replica stays whole, every stripe has a
     * copy, so it stays readable. */
    baton__meta_destroy(m);
    m = mk();
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "n%d", i);
        n[i] = add_node(m, id, 64 * MIB);
    }
    baton__put_req_t big = {NULL, "big", 10 * MIB, 0, 2, 0};
    assert_int_equal(baton__meta_put_start(m, &big, 0, &v), 0);
    assert_int_equal(v.n_slices, 3);
    assert_int_equal(baton__meta_put_commit(m, NULL, "big", v.put_id, 0), 0);
    assert_int_equal(baton__meta_node_lost(m, n[0], 1), 0);
    assert_int_equal(baton__meta_get(m, NULL, "big", 2, &v), 0);
    for (uint32_t s = 0; s < 3; s++)
        assert_true(v.slices[s].node != BATON__SLICE_LOST ||
                    v.slices[3 + s].node != BATON__SLICE_LOST);
    check_books(m);
    /* A second node lost: some stripe had both copies on n1 and n2 → gone. */
    assert_int_equal(baton__meta_node_lost(m, n[1], 3), 1);
    assert_int_equal(baton__meta_get(m, NULL, "big", 4, &v), BATON_XFER_ENOTFOUND);
    check_books(m);
    /* No more placement on the lost nodes. */
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof(key), "after%d", i);
        baton__put_req_t r = {NULL, key, KIB, 0, 1, 0};
        assert_int_equal(baton__meta_put_start(m, &r, 3, &v), 0);
        assert_int_equal(v.slices[0].node, n[2]);
    }
    /* It comes back (re-registers): placed on again. */
    uint32_t again;
    assert_int_equal(baton__meta_node_add(m, "n1", &again), 0);
    assert_int_equal(again, n[1]);
    check_books(m);
    baton__meta_destroy(m);
}

/* The allocator: first fit, coalescing both ways, fragmentation handled by placement. */
static void test_segment_allocator(void **state)
{
    (void)state;
    baton__seg_t s = {0};
    s.free = malloc(4 * sizeof(*s.free));
    s.cap_free = 4;
    s.free[0] = (baton__extent_t){0, 64 * 10};
    s.n_free = 1;
    s.capacity = 640;
    s.alive = 1;
    uint64_t off[10];
    for (int i = 0; i < 10; i++)
        assert_int_equal(baton__seg_alloc(&s, 1, &off[i]), 0);
    assert_int_equal(baton__seg_alloc(&s, 1, &off[0]), BATON_STORE_ENOSPACE);
    for (int i = 0; i < 10; i += 2)
        baton__seg_free(&s, off[i], 1);
    assert_int_equal(s.n_free, 5);
    assert_int_equal(baton__seg_alloc(&s, 128, &off[0]), BATON_STORE_ENOSPACE); /* fragmented */
    for (int i = 1; i < 10; i += 2)
        baton__seg_free(&s, off[i], 1);
    assert_int_equal(s.n_free, 1);
    assert_int_equal(s.used, 0);
    free(s.free);
}

/* The master's cost per object and per lookup: printed, never asserted (the machine is shared).
 * 200k objects keep the suite light; the target is 1M on one core. */
static void test_scale(void **state)
{
    (void)state;
    baton__meta_t *m = mk();
    add_node(m, "n0", 1ull << 40);
    enum { N = 200000 };
    char key[80];
    struct mallinfo2 before = mallinfo2();
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "%064x_%d_k", i * 2654435761u, i % 8);
        assert_int_equal(put_commit(m, NULL, key, 64 * KIB, 0, 0), 0);
    }
    struct mallinfo2 after = mallinfo2();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int hits = 0;
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "%064x_%d_k", i * 2654435761u, i % 8);
        hits += baton__meta_exists(m, NULL, key, 1, 1, NULL, NULL);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(hits, N);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("meta: %d objects (72-byte keys), %.0f bytes of heap per object, %.0f exists/s with a "
           "lease (key formatting included)\n",
           N, (double)(after.uordblks - before.uordblks) / N, N / s);
    baton__meta_destroy(m);
}

/* ---- the journal and a successor's restore ---- */

typedef struct {
    baton__meta_rec_t rec;
    char ns[64], key[256];
    baton__slice_t slices[64];
    int live;
} logged_t;

typedef struct {
    logged_t e[64];
    int n, frees;
} jlog_t;

/* What oplog.c does with etcd, in memory: put_id -> the latest record, FREED deletes it. */
static void on_journal(void *data, const baton__meta_rec_t *rec)
{
    jlog_t *j = data;
    logged_t *x = NULL;
    for (int i = 0; i < j->n; i++)
        if (j->e[i].live && j->e[i].rec.put_id == rec->put_id)
            x = &j->e[i];
    if (rec->state == BATON__OBJ_FREED) {
        assert_non_null(x);
        x->live = 0;
        j->frees++;
        return;
    }
    if (x == NULL) {
        assert_true(j->n < 64);
        x = &j->e[j->n++];
    }
    x->live = 1;
    x->rec = *rec;
    snprintf(x->ns, sizeof(x->ns), "%s", rec->ns);
    snprintf(x->key, sizeof(x->key), "%s", rec->key);
    memcpy(x->slices, rec->slices, rec->n_replicas * rec->n_slices * sizeof(*rec->slices));
    x->rec.ns = x->ns;
    x->rec.key = x->key;
    x->rec.slices = x->slices;
}

static void test_journal_restore(void **state)
{
    (void)state;
    jlog_t j;
    memset(&j, 0, sizeof(j));
    baton__meta_config_t cfg;
    baton__meta_config_init(&cfg);
    cfg.journal = on_journal;
    cfg.journal_data = &j;
    baton__meta_t *a = NULL;
    assert_int_equal(baton__meta_create(&cfg, &a), 0);
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "n%d", i);
        add_node(a, id, 64 * MIB);
    }
    uint64_t now = 1000, id_open = 0, id_striped = 0;
    assert_int_equal(put_commit(a, NULL, "kept", 100 * KIB, 0, now), 0);
    assert_int_equal(put_commit(a, "tenant", "pinned", 1 * MIB, BATON_STORE_PUT_SOFT_PIN, now), 0);
    assert_int_equal(put(a, NULL, "striped", 10 * MIB, 2, 0, now, &id_striped), 0);
    assert_int_equal(baton__meta_put_commit(a, NULL, "striped", id_striped, now), 0);
    assert_int_equal(put_commit(a, NULL, "removed", 4 * KIB, 0, now), 0);
    assert_int_equal(baton__meta_remove(a, NULL, "removed", now), 0);
    assert_int_equal(put(a, NULL, "open", 2 * MIB, 1, 0, now, &id_open), 0); /* never committed */
    assert_int_equal(j.frees, 1);
    check_books(a);

    /* the successor: the same nodes (same indexes), then every live record */
    cfg.journal = NULL;
    baton__meta_t *b = NULL;
    assert_int_equal(baton__meta_create(&cfg, &b), 0);
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "n%d", i);
        add_node(b, id, 64 * MIB);
    }
    uint64_t later = 5000;
    int restored = 0;
    for (int i = 0; i < j.n; i++)
        if (j.e[i].live) {
            assert_int_equal(baton__meta_restore(b, &j.e[i].rec, later), 0);
            restored++;
        }
    assert_int_equal(restored, 4);
    check_books(b);
    baton__meta_stats_t sa, sb;
    baton__meta_stats(a, &sa);
    baton__meta_stats(b, &sb);
    assert_int_equal(sb.used, sa.used); /* the uncommitted put's space is held too */
    assert_int_equal(sb.objects, 3);
    assert_int_equal(sb.revoked, 1);
    const char *keys[] = {"kept", "striped"};
    for (int k = 0; k < 2; k++) { /* the same placement, byte for byte */
        baton__obj_view_t va, vb;
        assert_int_equal(baton__meta_get(a, NULL, keys[k], now, &va), 0);
        baton__slice_t sla[64];
        memcpy(sla, va.slices, va.n_replicas * va.n_slices * sizeof(*sla));
        assert_int_equal(baton__meta_get(b, NULL, keys[k], later, &vb), 0);
        assert_int_equal(vb.len, va.len);
        assert_int_equal(vb.crc, va.crc);
        assert_int_equal(vb.n_replicas * vb.n_slices, va.n_replicas * va.n_slices);
        assert_memory_equal(vb.slices, sla, va.n_replicas * va.n_slices * sizeof(*sla));
    }
    assert_true(baton__meta_exists(b, "tenant", "pinned", later, 0, NULL, NULL));
    assert_false(baton__meta_exists(b, NULL, "removed", later, 0, NULL, NULL));
    assert_false(baton__meta_exists(b, NULL, "open", later, 0, NULL, NULL));
    /* the old putter's commit is refused: its put was taken over */
    assert_int_equal(baton__meta_put_commit(b, NULL, "open", id_open, later), BATON_XFER_ENOTFOUND);
    /* restored objects are leased for a lease TTL: a read the predecessor granted may run */
    assert_int_equal(baton__meta_remove(b, NULL, "kept", later), BATON_XFER_EBUSY);
    /* a new put gets a fresh id and a range no restored object holds */
    uint64_t id_new = 0;
    assert_int_equal(put(b, NULL, "new", 60 * MIB, 1, 0, later, &id_new), 0);
    assert_true(id_new > id_open && id_new > id_striped);
    check_books(b);
    /* a record whose range is taken is refused and changes nothing */
    baton__meta_stats(b, &sa);
    assert_int_equal(baton__meta_restore(b, &j.e[0].rec, later), BATON_XFER_EEXIST);
    baton__meta_rec_t dup = j.e[0].rec;
    dup.key = "other-key";
    assert_int_equal(baton__meta_restore(b, &dup, later), BATON_XFER_EEXIST);
    baton__meta_stats(b, &sb);
    assert_int_equal(sb.used, sa.used);
    check_books(b);
    baton__meta_destroy(a);
    baton__meta_destroy(b);

    /* a successor whose node n1 did not come back: a stripe with no copy is not restored, one
     * with a copy on another node is (its copy on n1 lost) */
    baton__meta_t *c = NULL;
    assert_int_equal(baton__meta_create(&cfg, &c), 0);
    add_node(c, "n0", 64 * MIB);
    uint32_t n1 = add_node(c, "n1", 64 * MIB);
    add_node(c, "n2", 64 * MIB);
    baton__meta_node_lost(c, n1, later);
    for (int i = 0; i < j.n; i++) {
        if (!j.e[i].live)
            continue;
        int dead = 0; /* some stripe has every copy on n1 */
        const baton__meta_rec_t *r = &j.e[i].rec;
        for (uint32_t s = 0; s < r->n_slices; s++) {
            int live = 0;
            for (uint32_t x = 0; x < r->n_replicas; x++)
                live |= r->slices[x * r->n_slices + s].node != n1;
            dead |= !live;
        }
        assert_int_equal(baton__meta_restore(c, r, later), dead ? BATON_STORE_ENOREPLICA : 0);
    }
    check_books(c);
    baton__meta_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_table),
        cmocka_unit_test(test_put_lifecycle),
        cmocka_unit_test(test_put_takeover),
        cmocka_unit_test(test_lease),
        cmocka_unit_test(test_eviction_watermark),
        cmocka_unit_test(test_pressure_leased),
        cmocka_unit_test(test_soft_pin),
        cmocka_unit_test(test_quota),
        cmocka_unit_test(test_placement_empty_node),
        cmocka_unit_test(test_replicas_and_striping),
        cmocka_unit_test(test_node_lost),
        cmocka_unit_test(test_segment_allocator),
        cmocka_unit_test(test_scale),
        cmocka_unit_test(test_journal_restore),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
