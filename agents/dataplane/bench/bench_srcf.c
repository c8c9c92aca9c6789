/* bench_srcf: the format's cost over a bare AES-256-GCM call, one core, in one run.
 *
 * For 4 KiB and 64 KiB chunks, in memory, one thread:
 *   raw     EVP AES-256-GCM under one keyed context: per chunk the IV re-init, the data,
 *           the tag (a fixed nonce, no associated data): the primitive with nothing of
 *           the format around it;
 *   format  srcf_seal_run / srcf_open_run over 1 MiB runs (a FUSE request's size):
 *           fresh random nonces, associated data, the layout checks, the context pool.
 * Each figure is the median of REPEATS measurements of TOTAL bytes, with min and max,
 * in MB/s, and format / raw as a ratio (issue 13's target: >= 90 % at both sizes).
 *
 *   build/bench_srcf [--total MIB] [--repeats N]
 *
 * Run it on a quiet machine; the numbers of a shared one mean nothing. */
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "srcf.h"

#define RUN_BYTES (1u << 20)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void fail(const char *what) {
    fprintf(stderr, "bench_srcf: %s failed\n", what);
    exit(1);
}

struct bench {
    size_t chunk, total;
    EVP_CIPHER_CTX *enc, *dec;
    srcf_file *file;
    uint8_t *plain, *sealed_raw, *stored, *back;
    size_t stored_len;
};

static void raw_encrypt(struct bench *b) {
    static const uint8_t iv[12] = {1};
    int len;
    for (size_t done = 0; done < b->total; done += b->chunk) {
        if (EVP_EncryptInit_ex2(b->enc, NULL, NULL, iv, NULL) != 1 ||
            EVP_EncryptUpdate(b->enc, b->sealed_raw, &len, b->plain, (int)b->chunk) != 1 ||
            EVP_EncryptFinal_ex(b->enc, b->sealed_raw + b->chunk, &len) != 1 ||
            EVP_CIPHER_CTX_ctrl(b->enc, EVP_CTRL_AEAD_GET_TAG, 16, b->sealed_raw + b->chunk) != 1)
            fail("raw encrypt");
    }
}

static void raw_decrypt(struct bench *b) {
    static const uint8_t iv[12] = {1};
    int len;
    for (size_t done = 0; done < b->total; done += b->chunk) {
        if (EVP_DecryptInit_ex2(b->dec, NULL, NULL, iv, NULL) != 1 ||
            EVP_DecryptUpdate(b->dec, b->back, &len, b->sealed_raw, (int)b->chunk) != 1 ||
            EVP_CIPHER_CTX_ctrl(b->dec, EVP_CTRL_AEAD_SET_TAG, 16, b->sealed_raw + b->chunk) != 1 ||
            EVP_DecryptFinal_ex(b->dec, b->back + b->chunk, &len) != 1)
            fail("raw decrypt");
    }
}

static void format_encrypt(struct bench *b) {
    size_t got;
    for (size_t done = 0; done < b->total; done += RUN_BYTES) {
        uint64_t first = done / b->chunk;
        if (srcf_seal_run(b->file, first, SRCF_NO_FINAL, b->plain, RUN_BYTES, b->stored, b->stored_len, &got,
                          NULL) != SRCF_OK)
            fail("srcf_seal_run");
    }
}

static void format_decrypt(struct bench *b) {
    size_t got;
    uint64_t bad;
    for (size_t done = 0; done < b->total; done += RUN_BYTES) {
        if (srcf_open_run(b->file, 0, SRCF_NO_FINAL, b->stored, b->stored_len, b->back, RUN_BYTES, &got, &bad) !=
            SRCF_OK)
            fail("srcf_open_run");
    }
}

static void measure(struct bench *b, void (*fn)(struct bench *), int repeats, double *med, double *lo, double *hi) {
    double *rates = calloc((size_t)repeats, sizeof *rates);
    fn(b);   /* warm up */
    for (int i = 0; i < repeats; i++) {
        double start = now();
        fn(b);
        rates[i] = (double)b->total / (now() - start) / 1e6;
    }
    qsort(rates, (size_t)repeats, sizeof *rates, cmp);
    *med = rates[repeats / 2];
    *lo = rates[0];
    *hi = rates[repeats - 1];
    free(rates);
}

int main(int argc, char **argv) {
    size_t total_mib = 64;
    int repeats = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--total") == 0 && i + 1 < argc) total_mib = (size_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) repeats = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--total MIB] [--repeats N]\n", argv[0]);
            return 2;
        }
    }
    if (total_mib < 1 || repeats < 1) return 2;
    uint8_t key[32], id[16], header[128];
    RAND_bytes(key, 32);
    RAND_bytes(id, 16);
    srcf_key *k;
    if (srcf_key_new(&k, id, 1, key) != SRCF_OK) fail("srcf_key_new");
    EVP_CIPHER *gcm = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
    printf("one thread, %zu MiB per measurement, median of %d (min-max), MB/s\n\n", total_mib, repeats);
    printf("| chunk | operation | format v1 | raw EVP AES-256-GCM | format / raw |\n");
    printf("|---:|---|---:|---:|---:|\n");
    size_t chunks[] = {4096, 65536};
    for (int c = 0; c < 2; c++) {
        struct bench b = {.chunk = chunks[c], .total = total_mib << 20};
        b.enc = EVP_CIPHER_CTX_new();
        b.dec = EVP_CIPHER_CTX_new();
        if (gcm == NULL || EVP_EncryptInit_ex2(b.enc, gcm, key, NULL, NULL) != 1 ||
            EVP_DecryptInit_ex2(b.dec, gcm, key, NULL, NULL) != 1)
            fail("EVP init");
        if (srcf_file_create(&b.file, header, k, (uint32_t)b.chunk) != SRCF_OK) fail("srcf_file_create");
        if (srcf_run_stored_len(RUN_BYTES, (uint32_t)b.chunk, &b.stored_len) != SRCF_OK) fail("sizes");
        b.plain = malloc(RUN_BYTES);
        b.back = malloc(RUN_BYTES);
        b.sealed_raw = malloc(b.chunk + 16);
        b.stored = malloc(b.stored_len);
        RAND_bytes(b.plain, RUN_BYTES);
        size_t got;
        double m[4][3];
        measure(&b, format_encrypt, repeats, &m[0][0], &m[0][1], &m[0][2]);
        measure(&b, raw_encrypt, repeats, &m[1][0], &m[1][1], &m[1][2]);
        /* what format_decrypt opens: one run sealed as chunks 0, 1, ... */
        if (srcf_seal_run(b.file, 0, SRCF_NO_FINAL, b.plain, RUN_BYTES, b.stored, b.stored_len, &got, NULL) != SRCF_OK)
            fail("srcf_seal_run");
        measure(&b, format_decrypt, repeats, &m[2][0], &m[2][1], &m[2][2]);
        measure(&b, raw_decrypt, repeats, &m[3][0], &m[3][1], &m[3][2]);
        for (int op = 0; op < 2; op++) {
            double *f = m[op * 2], *r = m[op * 2 + 1];
            printf("| %zu KiB | %s | %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) | %.0f %% |\n", b.chunk >> 10,
                   op == 0 ? "encrypt" : "decrypt", f[0], f[1], f[2], r[0], r[1], r[2], 100.0 * f[0] / r[0]);
        }
        EVP_CIPHER_CTX_free(b.enc);
        EVP_CIPHER_CTX_free(b.dec);
        srcf_file_free(b.file);
        free(b.plain);
        free(b.back);
        free(b.sealed_raw);
        free(b.stored);
    }
    EVP_CIPHER_free(gcm);
    srcf_key_free(k);
    return 0;
}
