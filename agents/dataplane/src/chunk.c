/* Sealing and opening chunks (FORMAT.md, "Chunks"), one at a time or in runs.
 *
 * A stored chunk is nonce (12) || AES-256-GCM ciphertext || tag (16) under the file
 * key, with associated data file id (16) || index (u64 BE) || last (u8).
 *
 * The run functions are the data plane's hot path: a 1 MiB FUSE request at 4 KiB
 * chunks is 256 chunks. Per call, a thread borrows a cipher context already keyed
 * with the file key (one mutex round trip); per chunk there is only the IV re-init,
 * the AAD, the data and the tag. Nonces come from RAND_bytes, 256 at a time.
 *
 * Holes (FORMAT.md, "Sparse regions"): a stored chunk that is not the file's final
 * chunk, is a whole chunk_size + 28 bytes and is all zero bytes reads as chunk_size zero
 * bytes. It is only looked for after the chunk has failed authentication, so a genuine
 * chunk costs nothing more. */
#include "internal.h"

#include <openssl/rand.h>
#include <stdlib.h>

#define NONCE_BATCH 256u
#define AAD_SIZE (SRCF_ID_SIZE + 8u + 1u)

/* NULL with *rc set: no context (out of memory), or a forked child's wiped file key. The
 * contexts a child inherited would still work, but one rule is simpler: nothing on an
 * inherited file works in a child. */
static struct srcf_ctx *borrow(srcf_file *f, int *rc) {
    if (!srcf_secure_live(f->file_key)) {
        *rc = SRCF_E_FORKED;
        return NULL;
    }
    pthread_mutex_lock(&f->lock);
    struct srcf_ctx *c = f->idle;
    if (c != NULL) f->idle = c->next;
    pthread_mutex_unlock(&f->lock);
    if (c == NULL) c = calloc(1, sizeof *c);
    if (c == NULL) *rc = SRCF_E_NOMEM;
    return c;
}

static void give_back(srcf_file *f, struct srcf_ctx *c) {
    pthread_mutex_lock(&f->lock);
    c->next = f->idle;
    f->idle = c;
    pthread_mutex_unlock(&f->lock);
}

/* The context of this direction, keyed with the file key on first use. */
static EVP_CIPHER_CTX *keyed(const srcf_file *f, struct srcf_ctx *c, int enc) {
    EVP_CIPHER_CTX **slot = enc ? &c->enc : &c->dec;
    if (*slot != NULL) return *slot;
    const EVP_CIPHER *cipher = srcf_gcm();
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (cipher == NULL || ctx == NULL || EVP_CipherInit_ex2(ctx, cipher, f->file_key, NULL, enc, NULL) != 1) {
        EVP_CIPHER_CTX_free(ctx);
        return NULL;
    }
    *slot = ctx;
    return ctx;
}

static void put_aad(uint8_t aad[AAD_SIZE], const uint8_t file_id[SRCF_ID_SIZE], uint64_t index, int last) {
    memcpy(aad, file_id, SRCF_ID_SIZE);
    srcf_put_be64(aad + SRCF_ID_SIZE, index);
    aad[SRCF_ID_SIZE + 8] = last ? 1 : 0;
}

static int seal_one(EVP_CIPHER_CTX *ctx, const uint8_t file_id[SRCF_ID_SIZE], uint64_t index, int last,
                    const uint8_t nonce[SRCF_NONCE_SIZE], const uint8_t *plain, size_t n, uint8_t *out) {
    uint8_t aad[AAD_SIZE];
    int len;
    put_aad(aad, file_id, index, last);
    memcpy(out, nonce, SRCF_NONCE_SIZE);
    if (EVP_EncryptInit_ex2(ctx, NULL, NULL, nonce, NULL) != 1 ||
        EVP_EncryptUpdate(ctx, NULL, &len, aad, AAD_SIZE) != 1 ||
        (n != 0 && EVP_EncryptUpdate(ctx, out + SRCF_NONCE_SIZE, &len, plain, (int)n) != 1) ||
        EVP_EncryptFinal_ex(ctx, out + SRCF_NONCE_SIZE + n, &len) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, SRCF_TAG_SIZE, out + SRCF_NONCE_SIZE + n) != 1)
        return SRCF_E_CRYPTO;
    return SRCF_OK;
}

/* `stored` is one whole stored chunk of n + 28 bytes. */
static int open_one(EVP_CIPHER_CTX *ctx, const uint8_t file_id[SRCF_ID_SIZE], uint64_t index, int last,
                    const uint8_t *stored, size_t n, uint8_t *out) {
    uint8_t aad[AAD_SIZE];
    int len;
    put_aad(aad, file_id, index, last);
    if (EVP_DecryptInit_ex2(ctx, NULL, NULL, stored, NULL) != 1 ||
        EVP_DecryptUpdate(ctx, NULL, &len, aad, AAD_SIZE) != 1 ||
        (n != 0 && EVP_DecryptUpdate(ctx, out, &len, stored + SRCF_NONCE_SIZE, (int)n) != 1) ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, SRCF_TAG_SIZE,
                            (void *)(stored + SRCF_NONCE_SIZE + n)) != 1)
        return SRCF_E_CRYPTO;
    /* The tag is compared inside OpenSSL, in constant time (CRYPTO_memcmp). */
    uint8_t none[SRCF_TAG_SIZE];   /* GCM's final step writes no bytes */
    return EVP_DecryptFinal_ex(ctx, none, &len) == 1 ? SRCF_OK : SRCF_E_INTEGRITY;
}

/* A hole: not the final chunk, a whole stored chunk, every byte zero. Only asked after
 * authentication failed (a genuine chunk is all zero with probability 2^-(8 (cs + 28))). */
static int is_hole(const uint8_t *stored, size_t stored_len, size_t chunk_size, int last) {
    return !last && stored_len == chunk_size + SRCF_CHUNK_OVERHEAD && stored[0] == 0 &&
           memcmp(stored, stored + 1, stored_len - 1) == 0;
}

/* Index of the run's last chunk, or SRCF_E_OVERFLOW when its offset would not fit. */
static int run_last(uint64_t first, uint64_t count, uint32_t chunk_size, uint64_t *last) {
    uint64_t offset;
    if (__builtin_add_overflow(first, count - 1, last) || *last == SRCF_NO_FINAL) return SRCF_E_OVERFLOW;
    return srcf_chunk_offset(*last, chunk_size, &offset);
}

int srcf_seal_run(srcf_file *file, uint64_t first_index, uint64_t final_index, const uint8_t *plain,
                  size_t plain_len, uint8_t *out, size_t out_cap, size_t *out_len, const uint8_t *nonces) {
    if (file == NULL || out == NULL || out_len == NULL || (plain == NULL && plain_len != 0))
        return SRCF_E_ARGUMENT;
    const size_t cs = file->chunk_size;
    const uint64_t count = plain_len == 0 ? 1 : plain_len / cs + (plain_len % cs != 0);
    uint64_t last;
    size_t need;
    int rc = run_last(first_index, count, file->chunk_size, &last);
    if (rc != SRCF_OK) return rc;
    if ((rc = srcf_run_stored_len(plain_len, file->chunk_size, &need)) != SRCF_OK) return rc;
    /* The layout: an empty chunk is the whole (empty) file; only the final chunk may be
     * short; nothing lies past the final chunk. */
    if (plain_len == 0 && (first_index != 0 || final_index != 0)) return SRCF_E_ARGUMENT;
    if (plain_len % cs != 0 && last != final_index) return SRCF_E_ARGUMENT;
    if (final_index != SRCF_NO_FINAL && last > final_index) return SRCF_E_ARGUMENT;
    if (out_cap < need || srcf_overlap(plain, plain_len, out, need) ||
        (nonces != NULL && srcf_overlap(nonces, count * SRCF_NONCE_SIZE, out, need)))
        return SRCF_E_ARGUMENT;

    struct srcf_ctx *c = borrow(file, &rc);
    if (c == NULL) return rc;
    EVP_CIPHER_CTX *ctx = keyed(file, c, 1);
    uint8_t pool[NONCE_BATCH * SRCF_NONCE_SIZE];
    size_t pos = 0;
    rc = ctx != NULL ? SRCF_OK : SRCF_E_CRYPTO;
    for (uint64_t j = 0; rc == SRCF_OK && j < count; j++) {
        const uint8_t *nonce;
        if (nonces != NULL) {
            nonce = nonces + j * SRCF_NONCE_SIZE;
        } else {
            if (j % NONCE_BATCH == 0) {
                uint64_t batch = count - j < NONCE_BATCH ? count - j : NONCE_BATCH;
                if (RAND_bytes(pool, (int)(batch * SRCF_NONCE_SIZE)) != 1) {
                    rc = SRCF_E_RANDOM;
                    break;
                }
            }
            nonce = pool + (j % NONCE_BATCH) * SRCF_NONCE_SIZE;
        }
        size_t off = (size_t)j * cs, n = plain_len - off < cs ? plain_len - off : cs;
        rc = seal_one(ctx, file->file_id, first_index + j, first_index + j == final_index, nonce,
                      n != 0 ? plain + off : NULL, n, out + pos);
        pos += n + SRCF_CHUNK_OVERHEAD;
    }
    give_back(file, c);
    if (rc != SRCF_OK) return rc;
    atomic_fetch_add_explicit(&file->sealed, count, memory_order_relaxed);
    *out_len = need;
    return SRCF_OK;
}

int srcf_open_run(srcf_file *file, uint64_t first_index, uint64_t final_index, const uint8_t *stored,
                  size_t stored_len, uint8_t *out, size_t out_cap, size_t *out_len, uint64_t *bad_index) {
    if (file == NULL || stored == NULL || stored_len == 0 || out_len == NULL || bad_index == NULL)
        return SRCF_E_ARGUMENT;
    const size_t cs = file->chunk_size, stored_chunk = cs + SRCF_CHUNK_OVERHEAD;
    const uint64_t count = stored_len / stored_chunk + (stored_len % stored_chunk != 0);
    uint64_t last;
    size_t need;
    int rc = run_last(first_index, count, file->chunk_size, &last);
    if (rc != SRCF_OK) return rc;
    if (srcf_run_plain_len(stored_len, file->chunk_size, &need) != SRCF_OK) {
        *bad_index = last;   /* a last piece shorter than nonce + tag cannot authenticate */
        return SRCF_E_INTEGRITY;
    }
    if ((out == NULL && need != 0) || out_cap < need || srcf_overlap(stored, stored_len, out, need))
        return SRCF_E_ARGUMENT;

    struct srcf_ctx *c = borrow(file, &rc);
    if (c == NULL) return rc;
    EVP_CIPHER_CTX *ctx = keyed(file, c, 0);
    rc = ctx != NULL ? SRCF_OK : SRCF_E_CRYPTO;
    size_t pos = 0, opos = 0;
    uint64_t j = 0;
    for (; rc == SRCF_OK && j < count; j++) {
        size_t piece = stored_len - pos < stored_chunk ? stored_len - pos : stored_chunk;
        size_t n = piece - SRCF_CHUNK_OVERHEAD;
        int is_last = first_index + j == final_index;
        rc = open_one(ctx, file->file_id, first_index + j, is_last, stored + pos, n, n != 0 ? out + opos : NULL);
        if (rc == SRCF_E_INTEGRITY && is_hole(stored + pos, piece, cs, is_last)) {
            memset(out + opos, 0, n);   /* a hole reads as zeros */
            rc = SRCF_OK;
        }
        pos += piece;
        opos += n;
    }
    give_back(file, c);
    if (rc != SRCF_OK) {
        if (need != 0) memset(out, 0, need);   /* no unauthenticated byte stays behind */
        if (rc == SRCF_E_INTEGRITY) *bad_index = first_index + j - 1;
        return rc;
    }
    *out_len = need;
    return SRCF_OK;
}

int srcf_seal_chunk(srcf_file *file, uint64_t index, int last, const uint8_t *plain, size_t plain_len,
                    uint8_t *out, const uint8_t *nonce) {
    uint64_t offset;
    uint8_t fresh[SRCF_NONCE_SIZE];
    if (file == NULL || out == NULL || (plain == NULL && plain_len != 0) || plain_len > file->chunk_size ||
        (!last && plain_len != file->chunk_size) ||
        srcf_overlap(plain, plain_len, out, plain_len + SRCF_CHUNK_OVERHEAD))
        return SRCF_E_ARGUMENT;
    int rc = srcf_chunk_offset(index, file->chunk_size, &offset);
    if (rc != SRCF_OK) return rc;
    if (nonce == NULL) {
        if (RAND_bytes(fresh, SRCF_NONCE_SIZE) != 1) return SRCF_E_RANDOM;
        nonce = fresh;
    }
    struct srcf_ctx *c = borrow(file, &rc);
    if (c == NULL) return rc;
    EVP_CIPHER_CTX *ctx = keyed(file, c, 1);
    rc = ctx != NULL ? seal_one(ctx, file->file_id, index, last, nonce, plain, plain_len, out) : SRCF_E_CRYPTO;
    give_back(file, c);
    if (rc == SRCF_OK) atomic_fetch_add_explicit(&file->sealed, 1, memory_order_relaxed);
    return rc;
}

int srcf_open_chunk(srcf_file *file, uint64_t index, int last, const uint8_t *stored, size_t stored_len,
                    uint8_t *out) {
    uint64_t offset;
    if (file == NULL || stored == NULL || stored_len > (size_t)file->chunk_size + SRCF_CHUNK_OVERHEAD)
        return SRCF_E_ARGUMENT;
    int rc = srcf_chunk_offset(index, file->chunk_size, &offset);
    if (rc != SRCF_OK) return rc;
    if (stored_len < SRCF_CHUNK_OVERHEAD) return SRCF_E_INTEGRITY;
    size_t n = stored_len - SRCF_CHUNK_OVERHEAD;
    if ((out == NULL && n != 0) || srcf_overlap(stored, stored_len, out, n)) return SRCF_E_ARGUMENT;
    struct srcf_ctx *c = borrow(file, &rc);
    if (c == NULL) return rc;
    EVP_CIPHER_CTX *ctx = keyed(file, c, 0);
    rc = ctx != NULL ? open_one(ctx, file->file_id, index, last, stored, n, out) : SRCF_E_CRYPTO;
    give_back(file, c);
    if (rc == SRCF_E_INTEGRITY && is_hole(stored, stored_len, file->chunk_size, last)) {
        memset(out, 0, n);   /* a hole reads as zeros */
        return SRCF_OK;
    }
    if (rc != SRCF_OK && n != 0) memset(out, 0, n);
    return rc;
}
