/* store/elect.h — baton-store's masters elect a leader through etcd (a lease and a create-only
 * transaction on one key), and clients and nodes find the leader by reading that key. */
#ifndef BATON_STORE_ELECT_H
#define BATON_STORE_ELECT_H

#include <stdint.h>

#include <uv.h>

/*
 * The key is <prefix>/store/leader of the etcd:// URL (the router's registry URL form); its
 * value the leader's control address "host:port", attached to the leader's lease. A master
 * campaigns with a transaction that puts the key only when it does not exist (create_revision
 * 0); the one that succeeded leads while it keeps its lease alive (keepalive every ttl / 3).
 * A leader that cannot renew within the TTL, or learns the lease is gone, has lost: it steps
 * down (the caller stops serving). Standbys keep their own lease alive as well and campaign
 * again every 250 ms; one whose campaign fails tries the holder's address and revokes the
 * holder's lease when the port refuses (the process is gone), so a leader killed with -9 is
 * replaced at once, and one that does not answer within the TTL plus etcd's expiry sweep.
 */
typedef struct baton__elect_s baton__elect_t;

/* leader: 1 when this master became the leader, 0 when it lost the leadership. */
typedef void (*baton__elect_cb)(void *data, int leader);

int baton__elect_start(uv_loop_t *loop, const char *url, const char *value, uint32_t ttl_s,
                       baton__elect_cb cb, void *data, baton__elect_t **e_p);
int baton__elect_is_leader(const baton__elect_t *e);
/* Gives up: the campaign stops and the lease is revoked (the key goes with it, so a standby
 * takes over at once instead of at the lease's expiry); done(data) when etcd answered or the
 * revoke could not be sent. */
void baton__elect_resign(baton__elect_t *e, void (*done)(void *data), void *data);
/* The election's etcd client, its lease (the leader's fence: 0 while none) and the leader key
 * ("<prefix>/store/leader"), for the leader's operation log (master_log.c). */
struct baton_etcd_s;
struct baton_etcd_s *baton__elect_etcd(const baton__elect_t *e);
int64_t baton__elect_lease(const baton__elect_t *e);
const char *baton__elect_key(const baton__elect_t *e);

/* Reads the leader's address: cb(data, 0, host, port) or cb(data, error, NULL, 0)
 * (BATON_STORE_ENOLEADER when the key is absent). */
typedef struct baton__resolver_s baton__resolver_t;
typedef void (*baton__resolve_cb)(void *data, int status, const char *host, int port);
int baton__resolver_create(uv_loop_t *loop, const char *url, baton__resolver_t **r_p);
int baton__resolve(baton__resolver_t *r, baton__resolve_cb cb, void *data);
void baton__resolver_close(baton__resolver_t *r);

#endif
