/* The C tests of libsrcf: golden files byte for byte, every header rejection, runs
 * against single chunks, tampering, holes, size arithmetic, argument checks, threads,
 * locked memory. Run by `make check` and, under ASan + UBSan, `make check-asan`; pytest runs
 * the latter (tests/agents/test_native_format.py).
 *
 * Usage: test_srcf GOLDEN_DIR   (tests/agents/golden/v1) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "internal.h"
#include "srcf.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ASAN_CLANG 1
#endif
#endif
#ifndef ASAN_CLANG
#define ASAN_CLANG 0
#endif

static int passed, failed;
static const char *golden_dir;

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        if (cond) passed++;                                                                 \
        else { failed++; fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); } \
    } while (0)
#define CHECK_RC(expr, want)                                                                \
    do {                                                                                    \
        int rc_ = (expr);                                                                   \
        if (rc_ == (want)) passed++;                                                        \
        else { failed++; fprintf(stderr, "%s:%d: %s = %d (%s), want %d\n", __FILE__, __LINE__, #expr, rc_, \
                                 srcf_strerror(rc_), (int)(want)); }                       \
    } while (0)

static const uint8_t GOLDEN_KEY_ID[16] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
                                          0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff};

static void seq(uint8_t *p, size_t n, uint8_t start) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(start + i);
}

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static srcf_key *golden_key(void) {
    uint8_t material[32];
    srcf_key *k = NULL;
    seq(material, 32, 0);
    CHECK_RC(srcf_key_new(&k, GOLDEN_KEY_ID, 3, material), SRCF_OK);
    return k;
}

static srcf_key *random_key(uint32_t version) {
    uint8_t id[16], material[32];
    srcf_key *k = NULL;
    RAND_bytes(id, 16);
    RAND_bytes(material, 32);
    CHECK_RC(srcf_key_new(&k, id, version, material), SRCF_OK);
    return k;
}

/* ---- golden files: written byte for byte from the fixed inputs, and read back ---- */
static void golden_case(srcf_key *key, const char *name, uint32_t chunk_size) {
    char path[4096];
    size_t plain_len, file_len;
    snprintf(path, sizeof path, "%s/%s.plain", golden_dir, name);
    uint8_t *plain = read_file(path, &plain_len);
    snprintf(path, sizeof path, "%s/%s.srcf", golden_dir, name);
    uint8_t *expected = read_file(path, &file_len);
    CHECK(plain != NULL && expected != NULL);
    if (plain == NULL || expected == NULL) return;

    uint8_t file_key[32], file_id[16], wrap_nonce[12] = {0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5,
                                                           0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab};
    seq(file_key, 32, 0x20);
    seq(file_id, 16, 0x40);
    uint64_t count, stored_size, size;
    CHECK_RC(srcf_chunk_count(plain_len, chunk_size, &count), SRCF_OK);
    uint8_t *nonces = calloc(count, 12);
    for (uint64_t i = 0; i < count; i++) {
        uint8_t *n = nonces + i * 12;
        n[0] = 0xc0; n[1] = 0xff; n[2] = 0xee; n[3] = 0x00;
        srcf_put_be64(n + 4, i);
    }
    CHECK_RC(srcf_stored_size(plain_len, chunk_size, &stored_size), SRCF_OK);
    CHECK(stored_size == file_len);
    uint8_t *out = malloc(stored_size);
    srcf_file *f = NULL;
    size_t written = 0;
    CHECK_RC(srcf_file_create_fixed(&f, out, key, chunk_size, file_key, file_id, wrap_nonce), SRCF_OK);
    CHECK_RC(srcf_seal_run(f, 0, count - 1, plain, plain_len, out + 128, stored_size - 128, &written, nonces),
             SRCF_OK);
    CHECK(written + 128 == file_len && memcmp(out, expected, file_len) == 0);
    srcf_file_free(f);

    /* Read it back as any reader would: header, key, size from the length, one run. */
    srcf_header h;
    CHECK_RC(srcf_header_parse(expected, file_len, &h), SRCF_OK);
    CHECK(h.chunk_size == chunk_size && h.key_version == 3 && memcmp(h.key_id, GOLDEN_KEY_ID, 16) == 0);
    CHECK_RC(srcf_plaintext_size(file_len, h.chunk_size, &size), SRCF_OK);
    CHECK(size == plain_len);
    CHECK_RC(srcf_file_open(&f, expected, file_len, key), SRCF_OK);
    uint8_t *back = malloc(plain_len + 1);
    size_t got = 99;
    uint64_t bad;
    CHECK_RC(srcf_open_run(f, 0, count - 1, expected + 128, file_len - 128, back, plain_len, &got, &bad), SRCF_OK);
    CHECK(got == plain_len && memcmp(back, plain, plain_len) == 0);
    srcf_file_free(f);
    free(back);
    free(out);
    free(nonces);
    free(plain);
    free(expected);
}

static void test_golden(void) {
    srcf_key *key = golden_key();
    golden_case(key, "empty", 4096);
    golden_case(key, "hello", 4096);
    golden_case(key, "three-chunks-512", 512);
    golden_case(key, "exact-chunk-512", 512);
    srcf_key_free(key);
}

/* ---- header rejections, each with its own code ---- */
static void test_header_rejections(void) {
    srcf_key *key = random_key(7);
    srcf_file *f = NULL;
    uint8_t good[128], h[128];
    srcf_header out;
    CHECK_RC(srcf_file_create(&f, good, key, 4096), SRCF_OK);
    srcf_file_free(f);
    CHECK_RC(srcf_header_parse(good, 128, &out), SRCF_OK);
    CHECK(out.key_version == 7 && out.chunk_size == 4096);

    CHECK_RC(srcf_header_parse(good, 0, &out), SRCF_E_BAD_MAGIC);
    CHECK_RC(srcf_header_parse(good, 3, &out), SRCF_E_BAD_MAGIC);
    CHECK_RC(srcf_header_parse(good, 5, &out), SRCF_E_HEADER_TRUNCATED);
    CHECK_RC(srcf_header_parse(good, 127, &out), SRCF_E_HEADER_TRUNCATED);
    CHECK_RC(srcf_header_parse(NULL, 0, &out), SRCF_E_BAD_MAGIC);
    CHECK_RC(srcf_header_parse(good, 128, NULL), SRCF_E_ARGUMENT);
    struct { int offset; uint8_t value; int want; } cases[] = {
        {0, 'X', SRCF_E_BAD_MAGIC},       {3, 'f', SRCF_E_BAD_MAGIC},
        {5, 2, SRCF_E_BAD_VERSION},       {4, 1, SRCF_E_BAD_VERSION},
        {7, 129, SRCF_E_BAD_HEADER_LENGTH}, {6, 1, SRCF_E_BAD_HEADER_LENGTH},
        {10, 0x11, SRCF_E_BAD_CHUNK_SIZE}, {8, 1, SRCF_E_BAD_CHUNK_SIZE}, {10, 0x01, SRCF_E_BAD_CHUNK_SIZE},
        {48, 2, SRCF_E_BAD_WRAPPING},     {48, 0, SRCF_E_BAD_WRAPPING},
        {49, 1, SRCF_E_BAD_FLAGS},        {50, 1, SRCF_E_BAD_RESERVED}, {67, 0x80, SRCF_E_BAD_RESERVED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(h, good, 128);
        h[cases[i].offset] = cases[i].value;
        CHECK_RC(srcf_header_parse(h, 128, &out), cases[i].want);
        CHECK_RC(srcf_file_open(&f, h, 128, key), cases[i].want);
        CHECK(strcmp(srcf_strerror(cases[i].want), "unknown error") != 0);
    }
    memcpy(h, good, 128);
    memset(h + 44, 0, 4);
    CHECK_RC(srcf_header_parse(h, 128, &out), SRCF_E_BAD_KEY_VERSION);
    /* chunk sizes at and past the edges */
    uint32_t sizes[] = {256, 512, 1u << 20, 1u << 21, 4095, 0};
    int wants[] = {SRCF_E_BAD_CHUNK_SIZE, SRCF_OK, SRCF_OK, SRCF_E_BAD_CHUNK_SIZE, SRCF_E_BAD_CHUNK_SIZE,
                   SRCF_E_BAD_CHUNK_SIZE};
    for (size_t i = 0; i < 6; i++) {
        memcpy(h, good, 128);
        srcf_put_be32(h + 8, sizes[i]);
        CHECK_RC(srcf_header_parse(h, 128, &out), wants[i]);
    }
    /* Authenticated fields: the file id, the wrap, the key version (same material). */
    int auth_offsets[] = {12, 27, 68, 79, 80, 111, 112, 127};
    for (size_t i = 0; i < 8; i++) {
        memcpy(h, good, 128);
        h[auth_offsets[i]] ^= 1;
        CHECK_RC(srcf_file_open(&f, h, 128, key), SRCF_E_INTEGRITY);
    }
    memcpy(h, good, 128);
    h[30] ^= 1;   /* key id: now names another key */
    CHECK_RC(srcf_file_open(&f, h, 128, key), SRCF_E_WRONG_KEY);
    srcf_key *other = random_key(7);
    CHECK_RC(srcf_file_open(&f, good, 128, other), SRCF_E_WRONG_KEY);
    srcf_key_free(other);
    srcf_key_free(key);
    CHECK(strcmp(srcf_strerror(12345), "unknown error") == 0);
}

/* ---- runs: seal, open, compare with single chunks, tamper ---- */
static void roundtrip(srcf_key *key, uint32_t cs, size_t len) {
    srcf_file *f = NULL;
    uint8_t header[128];
    CHECK_RC(srcf_file_create(&f, header, key, cs), SRCF_OK);
    uint8_t *plain = malloc(len + 1), *back = malloc(len + 1);
    RAND_bytes(plain, (int)len);
    size_t cap, got;
    uint64_t n, bad;
    CHECK_RC(srcf_run_stored_len(len, cs, &cap), SRCF_OK);
    CHECK_RC(srcf_chunk_count(len, cs, &n), SRCF_OK);
    uint8_t *stored = malloc(cap);
    CHECK_RC(srcf_seal_run(f, 0, n - 1, plain, len, stored, cap, &got, NULL), SRCF_OK);
    CHECK(got == cap);
    uint64_t file_len, size;
    CHECK_RC(srcf_stored_size(len, cs, &file_len), SRCF_OK);
    CHECK(file_len == 128 + cap);
    CHECK_RC(srcf_plaintext_size(file_len, cs, &size), SRCF_OK);
    CHECK(size == len);
    CHECK_RC(srcf_open_run(f, 0, n - 1, stored, cap, back, len, &got, &bad), SRCF_OK);
    CHECK(got == len && memcmp(back, plain, len) == 0);

    /* Reopened from its header, chunk by chunk. */
    srcf_file *g = NULL;
    CHECK_RC(srcf_file_open(&g, header, 128, key), SRCF_OK);
    for (uint64_t i = 0; i < n; i++) {
        size_t piece = i == n - 1 ? len - (size_t)i * cs : cs;
        CHECK_RC(srcf_open_chunk(g, i, i == n - 1, stored + i * (cs + 28), piece + 28, back + i * cs), SRCF_OK);
    }
    CHECK(memcmp(back, plain, len) == 0);
    /* A sub-run from the middle. */
    if (n >= 3) {
        CHECK_RC(srcf_open_run(g, 1, n - 1, stored + cs + 28, cs + 28, back, cs, &got, &bad), SRCF_OK);
        CHECK(got == cs && memcmp(back, plain + cs, cs) == 0);
    }
    /* Every chunk tampered in turn: named, and the output zeroed. */
    for (uint64_t i = 0; i < n; i++) {
        size_t at = (size_t)i * (cs + 28) + 12 + (i % 7);
        stored[at] ^= 0x20;
        memset(back, 0x55, len);
        CHECK_RC(srcf_open_run(g, 0, n - 1, stored, cap, back, len, &got, &bad), SRCF_E_INTEGRITY);
        CHECK(bad == i);
        int zero = 1;
        for (size_t k = 0; k < len; k++) zero &= back[k] == 0;
        CHECK(zero);
        stored[at] ^= 0x20;
    }
    /* Wrong position, wrong finality, wrong file. */
    CHECK_RC(srcf_open_run(g, 1, n, stored, cap, back, len, &got, &bad), SRCF_E_INTEGRITY);
    CHECK(bad == 1);
    CHECK_RC(srcf_open_run(g, 0, SRCF_NO_FINAL, stored, cap, back, len, &got, &bad), SRCF_E_INTEGRITY);
    CHECK(bad == n - 1);
    if (n >= 2) {
        CHECK_RC(srcf_open_run(g, 0, n - 2, stored, cap - (cap - (size_t)(n - 1) * (cs + 28)), back, len, &got,
                               &bad), SRCF_E_INTEGRITY);   /* cut at a chunk boundary */
        CHECK(bad == n - 2);
        /* swapped first two chunks (only when both are full) */
        if (n >= 3) {
            uint8_t *tmp = malloc(cs + 28);
            memcpy(tmp, stored, cs + 28);
            memcpy(stored, stored + cs + 28, cs + 28);
            memcpy(stored + cs + 28, tmp, cs + 28);
            CHECK_RC(srcf_open_run(g, 0, n - 1, stored, cap, back, len, &got, &bad), SRCF_E_INTEGRITY);
            CHECK(bad == 0);
            free(tmp);
        }
    }
    srcf_file *h = NULL;
    uint8_t header2[128];
    CHECK_RC(srcf_file_create(&h, header2, key, cs), SRCF_OK);
    CHECK_RC(srcf_open_run(h, 0, n - 1, stored, cap, back, len, &got, &bad), SRCF_E_INTEGRITY);
    CHECK(bad == 0);
    srcf_file_free(h);
    srcf_file_free(g);
    srcf_file_free(f);
    free(plain);
    free(back);
    free(stored);
}

static void test_runs(void) {
    srcf_key *key = random_key(1);
    uint32_t sizes[] = {512, 4096, 65536, 1u << 20};
    for (size_t s = 0; s < 4; s++) {
        uint32_t cs = sizes[s];
        size_t lens[] = {0, 1, cs - 1, cs, cs + 1, 3 * (size_t)cs, 3 * (size_t)cs + 17, 5 * (size_t)cs - 1};
        for (size_t l = 0; l < 8; l++) roundtrip(key, cs, lens[l]);
    }
    /* 256 chunks of 4 KiB: a 1 MiB request; and more than one nonce batch. */
    roundtrip(key, 4096, 256 * 4096);
    roundtrip(key, 512, 600 * 512 + 3);
    srcf_key_free(key);
}

/* Two seals of the same plaintext never share a nonce. */
/* ---- holes (FORMAT.md, "Sparse regions"): a whole, all-zero, non-final chunk reads as
 * zeros; anything else that is zero stays an integrity error ---- */
static int all_bytes(const uint8_t *p, size_t n, uint8_t v) {
    int same = 1;
    for (size_t i = 0; i < n; i++) same &= p[i] == v;
    return same;
}

static void holes(srcf_key *key, uint32_t cs) {
    const size_t sc = (size_t)cs + 28;
    srcf_file *f = NULL;
    uint8_t header[128];
    CHECK_RC(srcf_file_create(&f, header, key, cs), SRCF_OK);
    /* five chunks, the final one short; and four, the final one full */
    size_t len = 4 * (size_t)cs + 100, full_len = 4 * (size_t)cs, cap, got;
    uint64_t bad;
    uint8_t *plain = malloc(len), *back = malloc(len), *one = malloc(cs);
    RAND_bytes(plain, (int)len);
    CHECK_RC(srcf_run_stored_len(len, cs, &cap), SRCF_OK);
    uint8_t *stored = malloc(cap), *saved = malloc(cap);
    CHECK_RC(srcf_seal_run(f, 0, 4, plain, len, stored, cap, &got, NULL), SRCF_OK);
    memcpy(saved, stored, cap);

    /* A hole in the middle of a run: zeros there, every other chunk as written. */
    memset(stored + 2 * sc, 0, sc);
    memset(back, 0x55, len);
    CHECK_RC(srcf_open_run(f, 0, 4, stored, cap, back, len, &got, &bad), SRCF_OK);
    CHECK(got == len && memcmp(back, plain, 2 * (size_t)cs) == 0 && all_bytes(back + 2 * cs, cs, 0) &&
          memcmp(back + 3 * cs, plain + 3 * cs, len - 3 * (size_t)cs) == 0);
    /* the same hole alone, as a sub-run (no final chunk in it) and as one chunk */
    memset(back, 0x55, cs);
    CHECK_RC(srcf_open_run(f, 2, 4, stored + 2 * sc, sc, back, cs, &got, &bad), SRCF_OK);
    CHECK(got == cs && all_bytes(back, cs, 0));
    memset(back, 0x55, cs);
    CHECK_RC(srcf_open_run(f, 2, SRCF_NO_FINAL, stored + 2 * sc, sc, back, cs, &got, &bad), SRCF_OK);
    CHECK(got == cs && all_bytes(back, cs, 0));
    memset(one, 0x55, cs);
    CHECK_RC(srcf_open_chunk(f, 2, 0, stored + 2 * sc, sc, one), SRCF_OK);
    CHECK(all_bytes(one, cs, 0));
    /* ... but not as a final chunk */
    memset(one, 0x55, cs);
    CHECK_RC(srcf_open_chunk(f, 2, 1, stored + 2 * sc, sc, one), SRCF_E_INTEGRITY);
    CHECK(all_bytes(one, cs, 0));
    memset(back, 0x55, cs);
    CHECK_RC(srcf_open_run(f, 2, 2, stored + 2 * sc, sc, back, cs, &got, &bad), SRCF_E_INTEGRITY);
    CHECK(bad == 2 && all_bytes(back, cs, 0));

    /* Holes at the start and several in a row. */
    memset(stored, 0, 4 * sc);
    CHECK_RC(srcf_open_run(f, 0, 4, stored, cap, back, len, &got, &bad), SRCF_OK);
    CHECK(got == len && all_bytes(back, 4 * (size_t)cs, 0) && memcmp(back + 4 * cs, plain + 4 * cs, 100) == 0);

    /* A hole before a tampered chunk: the tampered one is named, the output zeroed. */
    memcpy(stored, saved, cap);
    memset(stored + sc, 0, sc);
    stored[3 * sc + 40] ^= 1;
    memset(back, 0x55, len);
    CHECK_RC(srcf_open_run(f, 0, 4, stored, cap, back, len, &got, &bad), SRCF_E_INTEGRITY);
    CHECK(bad == 3 && all_bytes(back, len, 0));

    /* A zeroed short final chunk: an integrity error (it is final, and short). */
    memcpy(stored, saved, cap);
    memset(stored + 4 * sc, 0, 128);
    memset(back, 0x55, len);
    CHECK_RC(srcf_open_run(f, 0, 4, stored, cap, back, len, &got, &bad), SRCF_E_INTEGRITY);
    CHECK(bad == 4 && all_bytes(back, len, 0));

    /* An all-zero short chunk that is not final (a run cut inside a chunk): an error. */
    memset(stored + sc, 0, sc);
    memset(back, 0x55, len);
    CHECK_RC(srcf_open_run(f, 0, SRCF_NO_FINAL, stored, sc + 300, back, cs + 272, &got, &bad), SRCF_E_INTEGRITY);
    CHECK(bad == 1 && all_bytes(back, cs + 272, 0));
    memset(one, 0x55, cs);
    CHECK_RC(srcf_open_chunk(f, 1, 0, stored + sc, 300, one), SRCF_E_INTEGRITY);
    CHECK(all_bytes(one, 272, 0));
    CHECK_RC(srcf_open_chunk(f, 1, 0, stored + sc, 28, one), SRCF_E_INTEGRITY);

    /* A chunk zeroed all but one byte (first, middle, last): an integrity error. */
    size_t spots[] = {0, 11, 12, sc / 2, sc - 17, sc - 1};
    for (size_t k = 0; k < sizeof spots / sizeof spots[0]; k++) {
        memcpy(stored, saved, cap);
        memset(stored + 2 * sc, 0, sc);
        stored[2 * sc + spots[k]] = 1;
        memset(back, 0x55, len);
        CHECK_RC(srcf_open_run(f, 0, 4, stored, cap, back, len, &got, &bad), SRCF_E_INTEGRITY);
        CHECK(bad == 2 && all_bytes(back, len, 0));
        memset(one, 0x55, cs);
        CHECK_RC(srcf_open_chunk(f, 2, 0, stored + 2 * sc, sc, one), SRCF_E_INTEGRITY);
        CHECK(all_bytes(one, cs, 0));
    }

    /* A file whose final chunk is full: zeroing that chunk is an integrity error (it is
     * final), while the same zeros one chunk earlier are a hole. */
    size_t full_cap;
    CHECK_RC(srcf_run_stored_len(full_len, cs, &full_cap), SRCF_OK);
    CHECK(full_cap == 4 * sc);
    CHECK_RC(srcf_seal_run(f, 0, 3, plain, full_len, stored, cap, &got, NULL), SRCF_OK);
    memset(stored + 3 * sc, 0, sc);
    memset(back, 0x55, len);
    CHECK_RC(srcf_open_run(f, 0, 3, stored, full_cap, back, full_len, &got, &bad), SRCF_E_INTEGRITY);
    CHECK(bad == 3 && all_bytes(back, full_len, 0));
    memset(one, 0x55, cs);
    CHECK_RC(srcf_open_chunk(f, 3, 1, stored + 3 * sc, sc, one), SRCF_E_INTEGRITY);
    CHECK(all_bytes(one, cs, 0));
    /* Appending a zero chunk after a genuine final chunk: the old final chunk fails. */
    CHECK_RC(srcf_seal_run(f, 0, 3, plain, full_len, stored, cap, &got, NULL), SRCF_OK);
    memcpy(saved, stored, full_cap);
    uint8_t *longer = calloc(1, full_cap + sc);
    memcpy(longer, saved, full_cap);
    uint8_t *back2 = malloc(full_len + cs);
    CHECK_RC(srcf_open_run(f, 0, 4, longer, full_cap + sc, back2, full_len + cs, &got, &bad), SRCF_E_INTEGRITY);
    CHECK(bad == 3);

    free(back2);
    free(longer);
    free(plain);
    free(back);
    free(one);
    free(stored);
    free(saved);
    srcf_file_free(f);
}

static void test_holes(void) {
    srcf_key *key = random_key(1);
    holes(key, 512);
    holes(key, 4096);
    srcf_key_free(key);
}

static void test_fresh_nonces(void) {
    srcf_key *key = random_key(1);
    srcf_file *f = NULL;
    uint8_t header[128], plain[4096] = {0}, a[4096 + 28], b[4096 + 28];
    size_t got;
    CHECK_RC(srcf_file_create(&f, header, key, 4096), SRCF_OK);
    CHECK_RC(srcf_seal_run(f, 0, SRCF_NO_FINAL, plain, 4096, a, sizeof a, &got, NULL), SRCF_OK);
    CHECK_RC(srcf_seal_run(f, 0, SRCF_NO_FINAL, plain, 4096, b, sizeof b, &got, NULL), SRCF_OK);
    CHECK(memcmp(a, b, 12) != 0 && memcmp(a + 12, b + 12, 4096) != 0);
    CHECK_RC(srcf_seal_chunk(f, 0, 0, plain, 4096, b, NULL), SRCF_OK);
    CHECK(memcmp(a, b, 12) != 0);
    CHECK(srcf_file_chunks_sealed(f) == 3);
    srcf_file_free(f);
    srcf_key_free(key);
}

/* ---- rotation: a new header over the same data ---- */
static void test_rewrap(void) {
    srcf_key *v1 = random_key(1), *v2 = NULL;
    uint8_t material[32], h1[128], h2[128], plain[1000], stored[1028], back[1000];
    RAND_bytes(material, 32);
    CHECK_RC(srcf_key_new(&v2, v1->key_id, 2, material), SRCF_OK);
    srcf_file *f = NULL, *g = NULL;
    size_t got;
    uint64_t bad;
    RAND_bytes(plain, sizeof plain);
    CHECK_RC(srcf_file_create(&f, h1, v1, 4096), SRCF_OK);
    CHECK_RC(srcf_seal_run(f, 0, 0, plain, sizeof plain, stored, sizeof stored, &got, NULL), SRCF_OK);
    CHECK_RC(srcf_file_rewrap(f, v2, h2, NULL), SRCF_OK);
    CHECK(memcmp(h1 + 12, h2 + 12, 16) == 0 && memcmp(h1, h2, 128) != 0);
    CHECK_RC(srcf_file_open(&g, h2, 128, v1), SRCF_E_WRONG_KEY);
    CHECK_RC(srcf_file_open(&g, h2, 128, v2), SRCF_OK);
    CHECK_RC(srcf_open_run(g, 0, 0, stored, got, back, sizeof back, &got, &bad), SRCF_OK);
    CHECK(memcmp(back, plain, sizeof plain) == 0);
    srcf_file_free(g);
    srcf_file_free(f);
    srcf_key_free(v1);
    srcf_key_free(v2);
}

/* ---- sizes ---- */
static void test_sizes(void) {
    uint64_t v;
    uint32_t cs = 4096;
    for (uint64_t size = 0; size < 3 * 4096 + 5; size += 97) {
        uint64_t len, back;
        CHECK_RC(srcf_stored_size(size, cs, &len), SRCF_OK);
        CHECK_RC(srcf_plaintext_size(len, cs, &back), SRCF_OK);
        CHECK(back == size);
    }
    /* every file length in a window: accepted exactly when it is some size's length */
    int ok = 1;
    for (uint64_t len = 0; len < 128 + 4 * (512 + 28) + 40; len++) {
        uint64_t size, again;
        int rc = srcf_plaintext_size(len, 512, &size);
        if (rc == SRCF_OK) ok &= srcf_stored_size(size, 512, &again) == SRCF_OK && again == len;
        else ok &= rc == SRCF_E_FILE_LENGTH;
    }
    CHECK(ok);
    CHECK_RC(srcf_plaintext_size(128 + 27, cs, &v), SRCF_E_FILE_LENGTH);
    CHECK_RC(srcf_plaintext_size(128 + 28, cs, &v), SRCF_OK);
    CHECK(v == 0);
    CHECK_RC(srcf_plaintext_size(128 + 28 + 4097, cs, &v), SRCF_E_FILE_LENGTH);   /* final > chunk */
    CHECK_RC(srcf_plaintext_size(128 + 2 * (4096 + 28), cs, &v), SRCF_OK);
    CHECK(v == 2 * 4096);
    CHECK_RC(srcf_plaintext_size(128 + 4096 + 28 + 28, cs, &v), SRCF_E_FILE_LENGTH); /* empty final after a chunk */
    CHECK_RC(srcf_plaintext_size(UINT64_MAX, cs, &v), SRCF_E_OVERFLOW);
    CHECK_RC(srcf_plaintext_size(1000, 4000, &v), SRCF_E_CHUNK_SIZE);
    CHECK_RC(srcf_plaintext_size(1000, cs, NULL), SRCF_E_ARGUMENT);
    CHECK_RC(srcf_stored_size(INT64_MAX, cs, &v), SRCF_E_OVERFLOW);
    CHECK_RC(srcf_stored_size(UINT64_MAX, cs, &v), SRCF_E_OVERFLOW);
    CHECK_RC(srcf_stored_size((uint64_t)INT64_MAX - 128 - 28 * ((INT64_MAX / 4096) + 1) - 4096, cs, &v), SRCF_OK);
    CHECK_RC(srcf_chunk_count(0, cs, &v), SRCF_OK);
    CHECK(v == 1);
    CHECK_RC(srcf_chunk_count(4097, cs, &v), SRCF_OK);
    CHECK(v == 2);
    CHECK_RC(srcf_chunk_offset(2, 512, &v), SRCF_OK);
    CHECK(v == 128 + 2 * 540);
    CHECK_RC(srcf_chunk_offset(UINT64_MAX / 100, 512, &v), SRCF_E_OVERFLOW);
    CHECK_RC(srcf_chunk_offset((uint64_t)INT64_MAX / 540 + 1, 512, &v), SRCF_E_OVERFLOW);
    size_t s;
    CHECK_RC(srcf_run_stored_len(0, 512, &s), SRCF_OK);
    CHECK(s == 28);
    CHECK_RC(srcf_run_stored_len(SIZE_MAX - 10, 512, &s), SRCF_E_OVERFLOW);
    CHECK_RC(srcf_run_plain_len(540 + 30, 512, &s), SRCF_OK);
    CHECK(s == 514);
    CHECK_RC(srcf_run_plain_len(540 + 27, 512, &s), SRCF_E_FILE_LENGTH);
    CHECK_RC(srcf_run_plain_len(0, 512, &s), SRCF_E_FILE_LENGTH);
}

/* ---- caller mistakes ---- */
static void test_arguments(void) {
    srcf_key *key = random_key(1);
    srcf_file *f = NULL;
    uint8_t header[128], buf[8192], out[8192];
    size_t got;
    uint64_t bad;
    CHECK_RC(srcf_key_new(NULL, buf, 1, buf), SRCF_E_ARGUMENT);
    srcf_key *k0 = NULL;
    CHECK_RC(srcf_key_new(&k0, buf, 0, buf), SRCF_E_ARGUMENT);
    CHECK_RC(srcf_file_create(&f, header, key, 1000), SRCF_E_CHUNK_SIZE);
    CHECK_RC(srcf_file_create(&f, header, NULL, 512), SRCF_E_ARGUMENT);
    CHECK_RC(srcf_file_create(&f, header, key, 512), SRCF_OK);
    CHECK_RC(srcf_seal_run(f, 0, 0, buf, 600, out, 600 + 55, &got, NULL), SRCF_E_ARGUMENT); /* out too small */
    CHECK_RC(srcf_seal_run(f, 0, 5, buf, 600, out, sizeof out, &got, NULL), SRCF_E_ARGUMENT); /* short, not final */
    CHECK_RC(srcf_seal_run(f, 0, 0, buf, 1024, out, sizeof out, &got, NULL), SRCF_E_ARGUMENT); /* past the final */
    CHECK_RC(srcf_seal_run(f, 3, 3, buf, 0, out, sizeof out, &got, NULL), SRCF_E_ARGUMENT);  /* empty, not chunk 0 */
    CHECK_RC(srcf_seal_run(f, 0, 1, buf, 1024, buf + 100, 2000, &got, NULL), SRCF_E_ARGUMENT); /* overlap */
    CHECK_RC(srcf_seal_run(f, UINT64_MAX - 1, SRCF_NO_FINAL, buf, 1024, out, sizeof out, &got, NULL),
             SRCF_E_OVERFLOW);
    CHECK_RC(srcf_seal_run(f, 0, 1, NULL, 10, out, sizeof out, &got, NULL), SRCF_E_ARGUMENT);
    CHECK_RC(srcf_seal_run(f, 0, 1, buf, 1024, out, sizeof out, &got, NULL), SRCF_OK);
    CHECK_RC(srcf_open_run(f, 0, 1, out, got, out + 2000, 1000, &got, &bad), SRCF_E_ARGUMENT); /* too small */
    CHECK_RC(srcf_open_run(f, 0, 1, out, 0, buf, sizeof buf, &got, &bad), SRCF_E_ARGUMENT);
    CHECK_RC(srcf_open_run(f, 0, 1, out, 540 + 20, buf, sizeof buf, &got, &bad), SRCF_E_INTEGRITY);
    CHECK(bad == 1);
    CHECK_RC(srcf_seal_chunk(f, 0, 0, buf, 100, out, NULL), SRCF_E_ARGUMENT);   /* short, not last */
    CHECK_RC(srcf_seal_chunk(f, 0, 1, buf, 513, out, NULL), SRCF_E_ARGUMENT);
    CHECK_RC(srcf_open_chunk(f, 0, 1, out, 20, buf), SRCF_E_INTEGRITY);
    CHECK_RC(srcf_open_chunk(f, 0, 1, out, 541, buf), SRCF_E_ARGUMENT);
    CHECK(srcf_file_chunk_size(f) == 512);
    srcf_file_free(f);
    srcf_file_free(NULL);
    srcf_key_free(NULL);
    srcf_key_free(key);
    CHECK(srcf_abi_version() == SRCF_ABI_VERSION);
}

/* ---- many threads on one file ---- */
struct worker { srcf_file *file; int ok; };

static void *work(void *arg) {
    struct worker *w = arg;
    static const size_t len = 64 * 4096 + 100;
    uint8_t *plain = malloc(len), *stored = malloc(len + 65 * 28), *back = malloc(len);
    size_t got;
    uint64_t bad;
    w->ok = 1;
    for (int round = 0; round < 20; round++) {
        RAND_bytes(plain, (int)len);
        w->ok &= srcf_seal_run(w->file, 0, 64, plain, len, stored, len + 65 * 28, &got, NULL) == SRCF_OK;
        w->ok &= srcf_open_run(w->file, 0, 64, stored, got, back, len, &got, &bad) == SRCF_OK;
        w->ok &= memcmp(plain, back, len) == 0;
    }
    free(plain);
    free(stored);
    free(back);
    return NULL;
}

static void test_threads(void) {
    srcf_key *key = random_key(1);
    srcf_file *f = NULL;
    uint8_t header[128];
    CHECK_RC(srcf_file_create(&f, header, key, 4096), SRCF_OK);
    pthread_t t[8];
    struct worker w[8];
    for (int i = 0; i < 8; i++) {
        w[i].file = f;
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        CHECK(w[i].ok);
    }
    CHECK(srcf_file_chunks_sealed(f) == 8 * 20 * 65);
    srcf_file_free(f);
    srcf_key_free(key);
}

/* ---- locked memory: many slots, across arenas, reused, wiped ---- */
static void test_secure_memory(void) {
    enum { N = 300 };
    uint8_t *slots[N];
    int ok = 1;
    for (int i = 0; i < N; i++) {
        slots[i] = srcf_secure_alloc();
        ok &= slots[i] != NULL;
        if (slots[i] != NULL) memset(slots[i], 0xa5, SECMEM_USABLE);
    }
    CHECK(ok);
    for (int i = 0; i < N; i += 2) srcf_secure_free(slots[i]);
    for (int i = 0; i < N; i += 2) {
        slots[i] = srcf_secure_alloc();
        ok &= slots[i] != NULL && slots[i][0] == 0 && slots[i][SECMEM_USABLE - 1] == 0 && srcf_secure_live(slots[i]);
    }
    CHECK(ok);
    for (int i = 0; i < N; i++) srcf_secure_free(slots[i]);
    /* The slots are locked and out of core dumps: /proc/self/smaps says so. */
    uint8_t *probe = srcf_secure_alloc();
    char line[512];
    FILE *smaps = fopen("/proc/self/smaps", "r");
    int in = 0, locked = 0, dontdump = 0;
    while (smaps != NULL && fgets(line, sizeof line, smaps) != NULL) {
        unsigned long lo, hi;
        char c;
        if (sscanf(line, "%lx-%lx %c", &lo, &hi, &c) == 3)   /* a mapping's first line */
            in = lo <= (uintptr_t)probe && (uintptr_t)probe < hi;
        if (in && strncmp(line, "Locked:", 7) == 0) locked = atoi(line + 7) > 0;
        if (in && strncmp(line, "VmFlags:", 8) == 0) dontdump = strstr(line, " dd") != NULL;
    }
    if (smaps != NULL) fclose(smaps);
#if defined(__SANITIZE_ADDRESS__) || ASAN_CLANG
    locked = 1;   /* ASan makes mlock() a no-op (its shadow memory); the call is still made */
#endif
    CHECK(locked && dontdump);
    /* A forked child does not see key material (MADV_WIPEONFORK), and refuses to use
     * what it inherited rather than encrypt under a zeroed key. */
    memset(probe, 0x77, SECMEM_USABLE);
    srcf_key *key = random_key(1);
    srcf_file *f = NULL;
    uint8_t header[128], plain[512] = {1}, out[540], back[512];
    size_t got;
    uint64_t bad;
    CHECK_RC(srcf_file_create(&f, header, key, 512), SRCF_OK);
    CHECK_RC(srcf_seal_run(f, 0, 0, plain, 512, out, sizeof out, &got, NULL), SRCF_OK);
    pid_t pid = fork();
    if (pid == 0) {
        srcf_file *g = NULL;
        int child_ok = probe[0] == 0 && !srcf_secure_live(probe) &&
                       srcf_seal_run(f, 0, 0, plain, 512, out, sizeof out, &got, NULL) == SRCF_E_FORKED &&
                       srcf_open_run(f, 0, 0, out, sizeof out, back, 512, &got, &bad) == SRCF_E_FORKED &&
                       srcf_file_open(&g, header, 128, key) == SRCF_E_FORKED &&
                       srcf_file_create(&g, header, key, 512) == SRCF_E_FORKED &&
                       srcf_file_rewrap(f, key, header, NULL) == SRCF_E_FORKED;
        /* keys the child makes itself live in fresh locked arenas and work */
        srcf_key *mine = NULL;
        child_ok = child_ok && srcf_key_new(&mine, header, 1, plain) == SRCF_OK &&
                   srcf_file_create(&g, header, mine, 512) == SRCF_OK &&
                   srcf_seal_run(g, 0, 0, plain, 512, out, sizeof out, &got, NULL) == SRCF_OK;
        srcf_file_free(g);
        srcf_key_free(mine);
        _exit(child_ok ? 0 : 1);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_RC(srcf_open_run(f, 0, 0, out, sizeof out, back, 512, &got, &bad), SRCF_OK);   /* the parent still can */
    srcf_file_free(f);
    srcf_key_free(key);
    srcf_secure_free(probe);
}

static void test_harden(void) {
    pid_t pid = fork();
    if (pid == 0) _exit(srcf_harden_process() == SRCF_OK ? 0 : 1);
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s GOLDEN_DIR\n", argv[0]);
        return 2;
    }
    golden_dir = argv[1];
    test_golden();
    test_header_rejections();
    test_runs();
    test_holes();
    test_fresh_nonces();
    test_rewrap();
    test_sizes();
    test_arguments();
    test_threads();
    test_secure_memory();
    test_harden();
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
