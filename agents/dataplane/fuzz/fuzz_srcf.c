/* libFuzzer target of libsrcf: everything that reads untrusted bytes.
 *
 * One input is used three ways:
 *   1. as a whole encrypted file: header parse, unwrap under the golden test key
 *      (tests/agents/golden/v1/keys.json: the seeds are real files under it, so the
 *      fuzzer starts past the wrap), size from the length, every chunk opened as one run
 *      and again chunk by chunk, and the two must agree; an all-zero chunk that
 *      opens must be a hole (whole, not final) and read as zeros;
 *   2. as plaintext: sealed as a run under a fixed file (chunk size from the first
 *      byte), opened back (must round-trip), then one byte flipped at a position taken
 *      from the input (must fail, naming a chunk of the run, with the output zeroed);
 *   3. as numbers: the size arithmetic on 64-bit values from the input, checking that
 *      stored size and plaintext size are inverse wherever both succeed.
 * Any broken invariant aborts. Built with clang -fsanitize=fuzzer,address,undefined
 * (make fuzz); run bounded over fuzz/corpus by make fuzz-run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "srcf.h"

#define MAX_ROUNDTRIP 8192

static srcf_key *golden;
static srcf_file *fixed[3];   /* chunk sizes 512, 1024, 4096 */

static void die(const char *what) {
    fprintf(stderr, "invariant broken: %s\n", what);
    abort();
}

static void setup(void) {
    uint8_t id[16] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff};
    uint8_t material[32], header[128];
    for (int i = 0; i < 32; i++) material[i] = (uint8_t)i;
    if (srcf_key_new(&golden, id, 3, material) != SRCF_OK) die("key");
    for (int i = 0; i < 3; i++)
        if (srcf_file_create(&fixed[i], header, golden, 512u << (i == 2 ? 3 : i)) != SRCF_OK) die("file");
}

static uint64_t get64(const uint8_t *p, size_t len, size_t at) {
    uint64_t v = 0;
    for (size_t i = 0; i < 8; i++) v = (v << 8) | (at + i < len ? p[at + i] : 0);
    return v;
}

static int all_zero(const uint8_t *p, size_t n) {
    return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

static void as_file(const uint8_t *data, size_t len) {
    srcf_header h;
    srcf_file *f = NULL;
    uint64_t size, count, bad = 0, bad2 = 0;
    if (srcf_header_parse(data, len, &h) != SRCF_OK) return;
    if (srcf_file_open(&f, data, len, golden) != SRCF_OK) return;
    if (srcf_plaintext_size(len, h.chunk_size, &size) == SRCF_OK) {
        if (srcf_chunk_count(size, h.chunk_size, &count) != SRCF_OK) die("count of a valid size");
        uint8_t *run = malloc(size + 1), *one = malloc(h.chunk_size);
        size_t got = 0;
        int rc = srcf_open_run(f, 0, count - 1, data + 128, len - 128, run, size, &got, &bad);
        if (rc != SRCF_OK && rc != SRCF_E_INTEGRITY) die("open_run of a well-sized file");
        if (rc == SRCF_OK && got != size) die("open_run length");
        /* chunk by chunk: the same verdict, the same first bad chunk */
        int verdict = SRCF_OK;
        for (uint64_t i = 0; i < count && verdict == SRCF_OK; i++) {
            size_t piece = i == count - 1 ? (size_t)(size - i * h.chunk_size) : h.chunk_size;
            const uint8_t *stored = data + 128 + i * (h.chunk_size + 28ull);
            verdict = srcf_open_chunk(f, i, i == count - 1, stored, piece + 28, one);
            if (verdict == SRCF_OK && rc == SRCF_OK && memcmp(one, run + i * h.chunk_size, piece) != 0)
                die("run and chunk disagree");
            if (verdict == SRCF_OK && all_zero(stored, piece + 28) &&
                (i == count - 1 || piece != h.chunk_size || !all_zero(one, piece)))
                die("an all-zero chunk opened that is no hole, or not as zeros");
            bad2 = i;
        }
        if (verdict != rc || (rc == SRCF_E_INTEGRITY && bad != bad2)) die("run and chunk verdicts differ");
        free(run);
        free(one);
    }
    uint8_t header[128];
    if (srcf_file_rewrap(f, golden, header, NULL) != SRCF_OK) die("rewrap");
    srcf_file_free(f);
}

static void as_plaintext(const uint8_t *data, size_t len) {
    if (len == 0) return;
    srcf_file *f = fixed[data[0] % 3];
    uint32_t cs = srcf_file_chunk_size(f);
    const uint8_t *plain = data + 1;
    size_t n = len - 1 > MAX_ROUNDTRIP ? MAX_ROUNDTRIP : len - 1, cap, got, back_len;
    uint64_t first = len > 1 ? data[1] % 4 : 0, count, bad;
    if (n == 0) first = 0;
    if (srcf_run_stored_len(n, cs, &cap) != SRCF_OK) die("stored len");
    count = n == 0 ? 1 : (n + cs - 1) / cs;
    uint8_t *stored = malloc(cap), *back = malloc(n + 1);
    if (srcf_seal_run(f, first, first + count - 1, plain, n, stored, cap, &got, NULL) != SRCF_OK || got != cap)
        die("seal_run");
    if (srcf_run_plain_len(cap, cs, &back_len) != SRCF_OK || back_len != n) die("plain len");
    if (srcf_open_run(f, first, first + count - 1, stored, cap, back, n, &got, &bad) != SRCF_OK || got != n ||
        memcmp(back, plain, n) != 0)
        die("round trip");
    size_t at = (size_t)(get64(data, len, 0) % cap);
    stored[at] ^= (uint8_t)(1u << (data[len - 1] % 8));
    int rc = srcf_open_run(f, first, first + count - 1, stored, cap, back, n, &got, &bad);
    if (rc != SRCF_E_INTEGRITY || bad != first + at / (cs + 28)) die("tampering unnoticed or misplaced");
    for (size_t i = 0; i < n; i++)
        if (back[i] != 0) die("unauthenticated bytes left");
    free(stored);
    free(back);
}

static void as_numbers(const uint8_t *data, size_t len) {
    uint32_t sizes[] = {512, 4096, 65536, 1u << 20};
    for (size_t at = 0; at + 8 <= len && at < 64; at += 8) {
        uint64_t v = get64(data, len, at), size, file_len, again, count, offset;
        uint32_t cs = sizes[data[at] % 4];
        if (srcf_plaintext_size(v, cs, &size) == SRCF_OK) {
            if (srcf_stored_size(size, cs, &again) != SRCF_OK || again != v) die("stored(plaintext(x)) != x");
        }
        if (srcf_stored_size(v, cs, &file_len) == SRCF_OK) {
            if (srcf_plaintext_size(file_len, cs, &again) != SRCF_OK || again != v) die("plaintext(stored(x)) != x");
            if (srcf_chunk_count(v, cs, &count) != SRCF_OK) die("count");
            if (srcf_chunk_offset(count - 1, cs, &offset) != SRCF_OK || offset >= file_len) die("offset");
        }
        (void)srcf_chunk_offset(v, cs, &offset);
        size_t plain_len;
        (void)srcf_run_plain_len((size_t)v, cs, &plain_len);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    if (golden == NULL) setup();
    as_file(data, len);
    as_plaintext(data, len);
    as_numbers(data, len);
    return 0;
}
