/* `make check`: the KMIP response decoder over the committed corpus, under ASan and
 * UBSan (gcc, no libFuzzer). Each seed must decode and read as the module expects
 * (the values fuzz/make_corpus.py wrote); every proper prefix of a seed must be
 * refused; every single-byte change and every length field set to extremes must be
 * decoded or refused without a memory error; nesting beyond TTLV_MAX_DEPTH is refused.
 * Usage: build/check_ttlv fuzz/corpus */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmip.h"

static int failures;

#define EXPECT(cond, what) do { \
        if (!(cond)) { fprintf(stderr, "check_ttlv: %s: %s\n", name, what); failures++; } \
    } while (0)

/* Everything the module reads from a decoded response (as fuzz_ttlv.c does). */
static void read_all(const kresponse *r)
{
    for (int i = 0; i < r->nitems; i++) {
        int pl = r->items[i].payload;
        if (pl < 0)
            continue;
        kattrs a;
        (void)kmip_parse_attributes(r, pl, &a);
        const uint8_t *p;
        size_t n;
        uint32_t fmt, v;
        int wrapped, b;
        int64_t x;
        (void)kmip_parse_key_material(r, pl, &p, &n, &fmt, &wrapped);
        (void)kmip_payload_bytes(r, pl, T_DATA, &p, &n);
        (void)kmip_payload_u32(r, pl, T_VALIDITY_INDICATOR, &v);
        for (int k = 0; k < r->tree.count; k++) {
            (void)ttlv_i64(&r->tree, k, &x);
            (void)ttlv_bool(&r->tree, k, &b);
        }
    }
}

static int decode(const uint8_t *buf, size_t len)
{
    kresponse r;
    if (kmip_parse_response(&r, buf, len) != 0)
        return -1;
    read_all(&r);
    kresponse_free(&r);
    return 0;
}

/* What the module must read from the seeds that make_corpus.py wrote. */
static void check_values(const char *name, const uint8_t *buf, size_t len)
{
    kresponse r;
    if (kmip_parse_response(&r, buf, len) != 0)
        return;
    if (strcmp(name, "get_attributes") == 0) {
        kattrs a;
        EXPECT(r.nitems == 3, "three batch items");
        EXPECT(kmip_parse_attributes(&r, r.items[0].payload, &a) == 0, "attributes of item 0");
        EXPECT(strcmp(a.name, "payments master") == 0 && a.key_version == 2 && a.state == STATE_ACTIVE
               && a.algorithm == ALG_AES && a.length == 256 && a.usage_mask == 0x3C, "item 0's values");
        EXPECT(a.sensitive == 0, "Sensitive false read");
        EXPECT(kmip_parse_attributes(&r, r.items[1].payload, &a) == 0 && a.sensitive == 1,
               "no Sensitive attribute: sensitive");
        EXPECT(r.items[2].status != 0 && r.items[2].reason == REASON_ITEM_NOT_FOUND, "item 2 failed");
    } else if (strcmp(name, "get_plain") == 0 || strcmp(name, "get_wrapped") == 0) {
        const uint8_t *p;
        size_t n;
        uint32_t fmt;
        int wrapped;
        int plain = strcmp(name, "get_plain") == 0;
        EXPECT(kmip_parse_key_material(&r, r.items[0].payload, &p, &n, &fmt, &wrapped) == 0, "key material");
        EXPECT(wrapped == !plain && n == (plain ? 32u : 40u) && p[0] == (plain ? 0x11 : 0x22),
               "key material's form and bytes");
    } else if (strcmp(name, "failure") == 0) {
        EXPECT(r.nitems == 1 && r.items[0].status != 0 && r.items[0].reason == REASON_CRYPTO_FAILURE,
               "a failed item");
    }
    kresponse_free(&r);
}

static void check_seed(const char *name, uint8_t *buf, size_t len)
{
    EXPECT(decode(buf, len) == 0, "the seed decodes");
    check_values(name, buf, len);
    for (size_t cut = 0; cut < len; cut++)
        EXPECT(decode(buf, cut) != 0, "a truncated message is refused");
    for (size_t i = 0; i < len; i++) {
        static const uint8_t flips[] = { 0x00, 0x01, 0x7f, 0x80, 0xff };
        uint8_t keep = buf[i];
        for (size_t f = 0; f < sizeof(flips); f++) {
            buf[i] = keep ^ flips[f];
            (void)decode(buf, len);
            buf[i] = flips[f];
            (void)decode(buf, len);
        }
        buf[i] = keep;
    }
    /* every 4-byte big-endian length word (bytes 4..7 of a header) at extremes */
    for (size_t i = 4; i + 4 <= len; i += 8) {
        uint8_t keep[4];
        memcpy(keep, buf + i, 4);
        static const uint32_t lens[] = { 0, 1, 7, 8, 0x7fffffff, 0xfffffff8, 0xffffffff };
        for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
            buf[i] = (uint8_t)(lens[k] >> 24);
            buf[i + 1] = (uint8_t)(lens[k] >> 16);
            buf[i + 2] = (uint8_t)(lens[k] >> 8);
            buf[i + 3] = (uint8_t)lens[k];
            (void)decode(buf, len);
        }
        memcpy(buf + i, keep, 4);
    }
}

/* Structures nested deeper than TTLV_MAX_DEPTH: refused. */
static void check_depth(void)
{
    const char *name = "nesting";
    enum { DEPTH = TTLV_MAX_DEPTH + 4 };
    uint8_t buf[DEPTH * 8];
    for (int d = 0; d < DEPTH; d++) {
        uint32_t len = (uint32_t)((DEPTH - d - 1) * 8);
        uint8_t *h = buf + d * 8;
        h[0] = 0x42; h[1] = 0x00; h[2] = 0x7B; h[3] = 0x01;
        h[4] = (uint8_t)(len >> 24); h[5] = (uint8_t)(len >> 16); h[6] = (uint8_t)(len >> 8); h[7] = (uint8_t)len;
    }
    EXPECT(decode(buf, sizeof(buf)) != 0, "too deep a nesting is refused");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <corpus directory>\n", argv[0]);
        return 2;
    }
    DIR *d = opendir(argv[1]);
    if (d == NULL) {
        perror(argv[1]);
        return 2;
    }
    int seeds = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", argv[1], e->d_name);
        FILE *f = fopen(path, "rb");
        if (f == NULL) {
            perror(path);
            return 2;
        }
        uint8_t *buf = malloc(1 << 16);
        size_t len = buf ? fread(buf, 1, 1 << 16, f) : 0;
        fclose(f);
        if (buf == NULL || len == 0 || len == (1 << 16)) {
            fprintf(stderr, "check_ttlv: %s: empty or larger than 64 KiB\n", path);
            return 2;
        }
        /* exactly `len` bytes, so that ASan sees any read past the message */
        uint8_t *exact = malloc(len);
        memcpy(exact, buf, len);
        free(buf);
        check_seed(e->d_name, exact, len);
        free(exact);
        seeds++;
    }
    closedir(d);
    const char *name = "corpus";
    EXPECT(seeds >= 7, "the corpus holds the seven seeds of make_corpus.py");
    check_depth();
    if (failures) {
        fprintf(stderr, "check_ttlv: %d failure(s)\n", failures);
        return 1;
    }
    printf("check_ttlv: %d seeds, truncations, byte changes and length extremes: ok\n", seeds);
    return 0;
}
