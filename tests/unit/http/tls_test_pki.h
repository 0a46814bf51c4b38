/* tls_test_pki.h — certificates made by a test itself (mbedTLS x509write) in a temporary
 * directory: a CA, server certificates for localhost/127.0.0.1 (valid, expired, self-signed, a
 * second key). setup_pki/teardown_pki are cmocka group fixtures; path() names a file there.
 * Include after cmocka.h (it asserts with cmocka). */
#ifndef BATON_TEST_TLS_PKI_H
#define BATON_TEST_TLS_PKI_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecp.h>
#include <mbedtls/entropy.h>
#include <mbedtls/oid.h>
#include <mbedtls/pk.h>
#include <mbedtls/x509_crt.h>

typedef struct pki_s {
    char dir[256];
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
    mbedtls_pk_context ca_key;
} pki_t;

static pki_t pki;

static char *path(const char *name)
{
    static char buf[8][320];
    static int i;
    char *p = buf[i++ & 7];
    snprintf(p, sizeof(buf[0]), "%s/%s", pki.dir, name);
    return p;
}

static void write_file(const char *name, const unsigned char *data)
{
    FILE *f = fopen(path(name), "w");
    assert_non_null(f);
    fputs((const char *)data, f);
    fclose(f);
}

static void gen_key(mbedtls_pk_context *k, const char *name)
{
    mbedtls_pk_init(k);
    assert_int_equal(mbedtls_pk_setup(k, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY)), 0);
    assert_int_equal(mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(*k),
                                         mbedtls_ctr_drbg_random, &pki.drbg),
                     0);
    unsigned char pem[2048];
    assert_int_equal(mbedtls_pk_write_key_pem(k, pem, sizeof(pem)), 0);
    write_file(name, pem);
}

/*
 * A certificate for `subject` signed by the CA (or self-signed when issuer_key is NULL);
 * san: DER of a GeneralNames SEQUENCE or NULL. Validity from/to as YYYYMMDDhhmmss.
 */
static void make_cert(const char *name, const char *subject, mbedtls_pk_context *key,
                      mbedtls_pk_context *issuer_key, const char *issuer, int is_ca,
                      const unsigned char *san, size_t san_len, const char *from, const char *to,
                      int serial)
{
    mbedtls_x509write_cert w;
    mbedtls_x509write_crt_init(&w);
    mbedtls_x509write_crt_set_version(&w, MBEDTLS_X509_CRT_VERSION_3);
    mbedtls_x509write_crt_set_md_alg(&w, MBEDTLS_MD_SHA256);
    mbedtls_x509write_crt_set_subject_key(&w, key);
    mbedtls_x509write_crt_set_issuer_key(&w, issuer_key ? issuer_key : key);
    assert_int_equal(mbedtls_x509write_crt_set_subject_name(&w, subject), 0);
    assert_int_equal(mbedtls_x509write_crt_set_issuer_name(&w, issuer ? issuer : subject), 0);
    mbedtls_mpi sn;
    mbedtls_mpi_init(&sn);
    mbedtls_mpi_lset(&sn, serial);
    assert_int_equal(mbedtls_x509write_crt_set_serial(&w, &sn), 0);
    mbedtls_mpi_free(&sn);
    assert_int_equal(mbedtls_x509write_crt_set_validity(&w, from, to), 0);
    assert_int_equal(mbedtls_x509write_crt_set_basic_constraints(&w, is_ca, -1), 0);
    if (san)
        assert_int_equal(mbedtls_x509write_crt_set_extension(
                             &w, MBEDTLS_OID_SUBJECT_ALT_NAME,
                             MBEDTLS_OID_SIZE(MBEDTLS_OID_SUBJECT_ALT_NAME), 0, san, san_len),
                         0);
    unsigned char pem[4096];
    assert_int_equal(
        mbedtls_x509write_crt_pem(&w, pem, sizeof(pem), mbedtls_ctr_drbg_random, &pki.drbg), 0);
    write_file(name, pem);
    mbedtls_x509write_crt_free(&w);
}

/* SAN = { dNSName "localhost", iPAddress 127.0.0.1 } */
static const unsigned char san_local[] = {0x30, 0x11, 0x82, 0x09, 'l',  'o',  'c',  'a',  'l', 'h',
                                          'o',  's',  't',  0x87, 0x04, 0x7f, 0x00, 0x00, 0x01};
#define NOW_FROM "20200101000000"
#define NOW_TO   "20991231235959"

static int setup_pki(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(pki.dir, sizeof(pki.dir), "%s/baton-tls-unit-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(pki.dir));
    mbedtls_entropy_init(&pki.entropy);
    mbedtls_ctr_drbg_init(&pki.drbg);
    assert_int_equal(mbedtls_ctr_drbg_seed(&pki.drbg, mbedtls_entropy_func, &pki.entropy, NULL, 0),
                     0);
    gen_key(&pki.ca_key, "ca.key");
    make_cert("ca.pem", "CN=Unit CA", &pki.ca_key, NULL, NULL, 1, NULL, 0, NOW_FROM, NOW_TO, 1);
    mbedtls_pk_context k;
    gen_key(&k, "srv.key");
    make_cert("srv.pem", "CN=localhost", &k, &pki.ca_key, "CN=Unit CA", 0, san_local,
              sizeof(san_local), NOW_FROM, NOW_TO, 2);
    make_cert("expired.pem", "CN=localhost", &k, &pki.ca_key, "CN=Unit CA", 0, san_local,
              sizeof(san_local), "20200101000000", "20200102000000", 3);
    make_cert("self.pem", "CN=localhost", &k, NULL, NULL, 0, san_local, sizeof(san_local), NOW_FROM,
              NOW_TO, 4);
    mbedtls_pk_free(&k);
    gen_key(&k, "srv2.key");
    make_cert("srv2.pem", "CN=localhost", &k, &pki.ca_key, "CN=Unit CA", 0, san_local,
              sizeof(san_local), NOW_FROM, NOW_TO, 5);
    mbedtls_pk_free(&k);
    return 0;
}

static int teardown_pki(void **state)
{
    (void)state;
    const char *names[] = {"ca.key",   "ca.pem",   "srv.key",  "srv.pem",  "srv2.key",
                           "srv2.pem", "self.pem", "live.pem", "live.key", "expired.pem"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        unlink(path(names[i]));
    rmdir(pki.dir);
    mbedtls_pk_free(&pki.ca_key);
    mbedtls_ctr_drbg_free(&pki.drbg);
    mbedtls_entropy_free(&pki.entropy);
    return 0;
}

#endif
