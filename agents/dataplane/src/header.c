/* The 128-byte header (FORMAT.md, "Header"): parse and validate without a key; build
 * a new one; unwrap and re-wrap the file key.
 *
 *     0   4  magic "SRCF"            48   1  file-key wrapping (1 = AES-256-GCM)
 *     4   2  format version (1)      49   1  flags (0)
 *     6   2  header length (128)     50  18  reserved (zero)
 *     8   4  chunk size              68  12  wrap nonce
 *    12  16  file id                 80  32  wrapped file key
 *    28  16  key id                 112  16  wrap tag
 *    44   4  key version
 *
 * The wrap's associated data is bytes 0..67, so every field is authenticated. */
#include "internal.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdlib.h>

#define OFF_VERSION 4
#define OFF_LENGTH 6
#define OFF_CHUNK 8
#define OFF_FILE_ID 12
#define OFF_KEY_ID 28
#define OFF_KEY_VERSION 44
#define OFF_WRAPPING 48
#define OFF_FLAGS 49
#define OFF_RESERVED 50
#define RESERVED_LEN 18
#define OFF_NONCE 68
#define OFF_WRAPPED 80
#define OFF_TAG 112
#define WRAP_AES_256_GCM 1
#define FORMAT_VERSION 1

_Static_assert(OFF_NONCE == SRCF_HEADER_AAD_SIZE, "the AAD ends where the wrap begins");
_Static_assert(OFF_TAG + SRCF_TAG_SIZE == SRCF_HEADER_SIZE, "the header is 128 bytes");

/* Fetched on first use and kept for the life of the process. A compare-and-swap rather
 * than pthread_once: the library then needs nothing newer than glibc 2.4. */
static _Atomic(EVP_CIPHER *) gcm;

const EVP_CIPHER *srcf_gcm(void) {
    EVP_CIPHER *c = atomic_load_explicit(&gcm, memory_order_acquire), *none = NULL;
    if (c != NULL) return c;
    c = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
    if (c == NULL) return NULL;
    if (!atomic_compare_exchange_strong_explicit(&gcm, &none, c, memory_order_acq_rel, memory_order_acquire)) {
        EVP_CIPHER_free(c);   /* another thread won */
        return none;
    }
    return c;
}

int srcf_header_parse(const uint8_t *data, size_t len, srcf_header *out) {
    if (data == NULL && len != 0) return SRCF_E_ARGUMENT;
    if (out == NULL) return SRCF_E_ARGUMENT;
    if (len < 4 || memcmp(data, "SRCF", 4) != 0) return SRCF_E_BAD_MAGIC;
    if (len < 6) return SRCF_E_HEADER_TRUNCATED;
    if (srcf_get_be16(data + OFF_VERSION) != FORMAT_VERSION) return SRCF_E_BAD_VERSION;
    if (len < SRCF_HEADER_SIZE) return SRCF_E_HEADER_TRUNCATED;
    if (srcf_get_be16(data + OFF_LENGTH) != SRCF_HEADER_SIZE) return SRCF_E_BAD_HEADER_LENGTH;
    uint32_t chunk_size = srcf_get_be32(data + OFF_CHUNK);
    if (srcf_check_chunk_size(chunk_size) != SRCF_OK) return SRCF_E_BAD_CHUNK_SIZE;
    if (data[OFF_WRAPPING] != WRAP_AES_256_GCM) return SRCF_E_BAD_WRAPPING;
    if (data[OFF_FLAGS] != 0) return SRCF_E_BAD_FLAGS;
    for (size_t i = 0; i < RESERVED_LEN; i++)
        if (data[OFF_RESERVED + i] != 0) return SRCF_E_BAD_RESERVED;
    uint32_t key_version = srcf_get_be32(data + OFF_KEY_VERSION);
    if (key_version == 0) return SRCF_E_BAD_KEY_VERSION;
    out->chunk_size = chunk_size;
    memcpy(out->file_id, data + OFF_FILE_ID, SRCF_ID_SIZE);
    memcpy(out->key_id, data + OFF_KEY_ID, SRCF_ID_SIZE);
    out->key_version = key_version;
    return SRCF_OK;
}

/* One-shot AES-256-GCM of the 32-byte file key (the wrap). */
static int wrap_key(const uint8_t kek[SRCF_KEY_SIZE], const uint8_t nonce[SRCF_NONCE_SIZE],
                    const uint8_t aad[SRCF_HEADER_AAD_SIZE], const uint8_t file_key[SRCF_KEY_SIZE],
                    uint8_t wrapped[SRCF_KEY_SIZE], uint8_t tag[SRCF_TAG_SIZE]) {
    const EVP_CIPHER *cipher = srcf_gcm();
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int len, ok = cipher != NULL && ctx != NULL && EVP_EncryptInit_ex2(ctx, cipher, kek, nonce, NULL) == 1 &&
                  EVP_EncryptUpdate(ctx, NULL, &len, aad, SRCF_HEADER_AAD_SIZE) == 1 &&
                  EVP_EncryptUpdate(ctx, wrapped, &len, file_key, SRCF_KEY_SIZE) == 1 &&
                  EVP_EncryptFinal_ex(ctx, wrapped + len, &len) == 1 &&
                  EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, SRCF_TAG_SIZE, tag) == 1;
    EVP_CIPHER_CTX_free(ctx);   /* cleanses the key schedule */
    return ok ? SRCF_OK : SRCF_E_CRYPTO;
}

static int unwrap_key(const uint8_t kek[SRCF_KEY_SIZE], const uint8_t header[SRCF_HEADER_SIZE],
                      uint8_t file_key[SRCF_KEY_SIZE]) {
    const EVP_CIPHER *cipher = srcf_gcm();
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int len, rc = SRCF_E_CRYPTO;
    if (cipher != NULL && ctx != NULL && EVP_DecryptInit_ex2(ctx, cipher, kek, header + OFF_NONCE, NULL) == 1 &&
        EVP_DecryptUpdate(ctx, NULL, &len, header, SRCF_HEADER_AAD_SIZE) == 1 &&
        EVP_DecryptUpdate(ctx, file_key, &len, header + OFF_WRAPPED, SRCF_KEY_SIZE) == 1 &&
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, SRCF_TAG_SIZE, (void *)(header + OFF_TAG)) == 1)
        rc = EVP_DecryptFinal_ex(ctx, file_key + len, &len) == 1 ? SRCF_OK : SRCF_E_INTEGRITY;
    EVP_CIPHER_CTX_free(ctx);
    if (rc != SRCF_OK) OPENSSL_cleanse(file_key, SRCF_KEY_SIZE);  /* unauthenticated bytes */
    return rc;
}

static void put_prefix(uint8_t h[SRCF_HEADER_SIZE], uint32_t chunk_size, const uint8_t file_id[SRCF_ID_SIZE],
                       const srcf_key *key) {
    memset(h, 0, SRCF_HEADER_SIZE);
    memcpy(h, "SRCF", 4);
    srcf_put_be16(h + OFF_VERSION, FORMAT_VERSION);
    srcf_put_be16(h + OFF_LENGTH, SRCF_HEADER_SIZE);
    srcf_put_be32(h + OFF_CHUNK, chunk_size);
    memcpy(h + OFF_FILE_ID, file_id, SRCF_ID_SIZE);
    memcpy(h + OFF_KEY_ID, key->key_id, SRCF_ID_SIZE);
    srcf_put_be32(h + OFF_KEY_VERSION, key->version);
    h[OFF_WRAPPING] = WRAP_AES_256_GCM;
}

static int seal_header(uint8_t out[SRCF_HEADER_SIZE], const srcf_key *key, uint32_t chunk_size,
                       const uint8_t file_id[SRCF_ID_SIZE], const uint8_t file_key[SRCF_KEY_SIZE],
                       const uint8_t *wrap_nonce) {
    uint8_t h[SRCF_HEADER_SIZE];
    put_prefix(h, chunk_size, file_id, key);
    if (wrap_nonce != NULL) memcpy(h + OFF_NONCE, wrap_nonce, SRCF_NONCE_SIZE);
    else if (RAND_bytes(h + OFF_NONCE, SRCF_NONCE_SIZE) != 1) return SRCF_E_RANDOM;
    int rc = wrap_key(key->material, h + OFF_NONCE, h, file_key, h + OFF_WRAPPED, h + OFF_TAG);
    if (rc == SRCF_OK) memcpy(out, h, SRCF_HEADER_SIZE);
    return rc;
}

int srcf_file_new(srcf_file **file, const uint8_t *file_key, const uint8_t file_id[SRCF_ID_SIZE],
                  uint32_t chunk_size) {
    srcf_file *f = calloc(1, sizeof *f);
    if (f == NULL) return SRCF_E_NOMEM;
    f->file_key = srcf_secure_alloc();
    if (f->file_key == NULL) {
        free(f);
        return SRCF_E_MLOCK;
    }
    if (pthread_mutex_init(&f->lock, NULL) != 0) {
        srcf_secure_free(f->file_key);
        free(f);
        return SRCF_E_NOMEM;
    }
    memcpy(f->file_key, file_key, SRCF_KEY_SIZE);
    memcpy(f->file_id, file_id, SRCF_ID_SIZE);
    f->chunk_size = chunk_size;
    atomic_init(&f->sealed, 0);
    *file = f;
    return SRCF_OK;
}

int srcf_file_create_fixed(srcf_file **file, uint8_t header[SRCF_HEADER_SIZE], const srcf_key *key,
                           uint32_t chunk_size, const uint8_t *file_key, const uint8_t *file_id,
                           const uint8_t *wrap_nonce) {
    if (file == NULL || header == NULL || key == NULL) return SRCF_E_ARGUMENT;
    if (!srcf_secure_live(key)) return SRCF_E_FORKED;
    int rc = srcf_check_chunk_size(chunk_size);
    if (rc != SRCF_OK) return rc;
    uint8_t id[SRCF_ID_SIZE];
    if (file_id != NULL) memcpy(id, file_id, SRCF_ID_SIZE);
    else if (RAND_bytes(id, SRCF_ID_SIZE) != 1) return SRCF_E_RANDOM;
    srcf_file *f;
    /* The file key is made straight into the file's locked slot, never on the stack. */
    static const uint8_t placeholder[SRCF_KEY_SIZE];
    rc = srcf_file_new(&f, file_key != NULL ? file_key : placeholder, id, chunk_size);
    if (rc != SRCF_OK) return rc;
    if (file_key == NULL && RAND_priv_bytes(f->file_key, SRCF_KEY_SIZE) != 1) rc = SRCF_E_RANDOM;
    if (rc == SRCF_OK) rc = seal_header(header, key, chunk_size, id, f->file_key, wrap_nonce);
    if (rc != SRCF_OK) {
        srcf_file_free(f);
        return rc;
    }
    *file = f;
    return SRCF_OK;
}

int srcf_file_create(srcf_file **file, uint8_t header[SRCF_HEADER_SIZE], const srcf_key *key,
                     uint32_t chunk_size) {
    return srcf_file_create_fixed(file, header, key, chunk_size, NULL, NULL, NULL);
}

int srcf_file_open(srcf_file **file, const uint8_t *header, size_t len, const srcf_key *key) {
    srcf_header h;
    if (file == NULL || key == NULL) return SRCF_E_ARGUMENT;
    if (!srcf_secure_live(key)) return SRCF_E_FORKED;
    int rc = srcf_header_parse(header, len, &h);
    if (rc != SRCF_OK) return rc;
    if (h.key_version != key->version || memcmp(h.key_id, key->key_id, SRCF_ID_SIZE) != 0)
        return SRCF_E_WRONG_KEY;
    static const uint8_t placeholder[SRCF_KEY_SIZE];
    srcf_file *f;
    rc = srcf_file_new(&f, placeholder, h.file_id, h.chunk_size);
    if (rc != SRCF_OK) return rc;
    rc = unwrap_key(key->material, header, f->file_key);
    if (rc != SRCF_OK) {
        srcf_file_free(f);
        return rc;
    }
    *file = f;
    return SRCF_OK;
}

int srcf_file_rewrap(const srcf_file *file, const srcf_key *new_key, uint8_t header[SRCF_HEADER_SIZE],
                     const uint8_t *wrap_nonce) {
    if (file == NULL || new_key == NULL || header == NULL) return SRCF_E_ARGUMENT;
    if (!srcf_secure_live(file->file_key) || !srcf_secure_live(new_key)) return SRCF_E_FORKED;
    return seal_header(header, new_key, file->chunk_size, file->file_id, file->file_key, wrap_nonce);
}

void srcf_file_free(srcf_file *file) {
    if (file == NULL) return;
    struct srcf_ctx *c = file->idle;
    while (c != NULL) {
        struct srcf_ctx *next = c->next;
        EVP_CIPHER_CTX_free(c->enc);   /* OpenSSL cleanses the GCM key schedule */
        EVP_CIPHER_CTX_free(c->dec);
        free(c);
        c = next;
    }
    pthread_mutex_destroy(&file->lock);
    srcf_secure_free(file->file_key);
    OPENSSL_cleanse(file, sizeof *file);
    free(file);
}

uint32_t srcf_file_chunk_size(const srcf_file *file) { return file->chunk_size; }

void srcf_file_id(const srcf_file *file, uint8_t out[SRCF_ID_SIZE]) { memcpy(out, file->file_id, SRCF_ID_SIZE); }

uint64_t srcf_file_chunks_sealed(const srcf_file *file) {
    return atomic_load_explicit(&((srcf_file *)file)->sealed, memory_order_relaxed);
}
