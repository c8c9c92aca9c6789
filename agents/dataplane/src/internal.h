/* Internal declarations of libsrcf: not part of the API. */
#ifndef SRCF_INTERNAL_H
#define SRCF_INTERNAL_H

#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "srcf.h"

#include "secmem.h"   /* locked memory for key material */

/* ---- key versions ---- */
struct srcf_key {            /* lives in one secure slot: 52 bytes */
    uint8_t material[SRCF_KEY_SIZE];
    uint8_t key_id[SRCF_ID_SIZE];
    uint32_t version;
};

/* ---- files ---- */
struct srcf_ctx {                /* a thread's keyed contexts, borrowed per call */
    EVP_CIPHER_CTX *enc;
    EVP_CIPHER_CTX *dec;
    struct srcf_ctx *next;
};

struct srcf_file {
    uint8_t *file_key;            /* SRCF_KEY_SIZE bytes in a secure slot */
    uint8_t file_id[SRCF_ID_SIZE];
    uint32_t chunk_size;
    pthread_mutex_t lock;         /* guards `idle` */
    struct srcf_ctx *idle;        /* contexts not in use */
    _Atomic uint64_t sealed;
};

/* AES-256-GCM, fetched once (explicit fetch: no per-init lookup). */
const EVP_CIPHER *srcf_gcm(void);
int srcf_check_chunk_size(uint32_t chunk_size);
int srcf_file_new(srcf_file **file, const uint8_t *file_key, const uint8_t file_id[SRCF_ID_SIZE],
                  uint32_t chunk_size);

static inline void srcf_put_be16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void srcf_put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline void srcf_put_be64(uint8_t *p, uint64_t v) {
    srcf_put_be32(p, (uint32_t)(v >> 32));
    srcf_put_be32(p + 4, (uint32_t)v);
}
static inline uint16_t srcf_get_be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t srcf_get_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Do [a, a+alen) and [b, b+blen) share a byte? */
static inline int srcf_overlap(const void *a, size_t alen, const void *b, size_t blen) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    if (alen == 0 || blen == 0) return 0;
    return x < y + blen && y < x + alen;
}

#endif
