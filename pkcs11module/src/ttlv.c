/* KMIP TTLV encoding and bounded decoding (see ttlv.h). */
#include "ttlv.h"

#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

/* ---------------------------------------------------------------- encoder */

void tb_init(tbuf *b)
{
    memset(b, 0, sizeof(*b));
}

void tb_free(tbuf *b)
{
    if (b->p != NULL) {
        OPENSSL_cleanse(b->p, b->cap);
        free(b->p);
    }
    memset(b, 0, sizeof(*b));
}

static int tb_reserve(tbuf *b, size_t extra)
{
    if (b->err)
        return -1;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->err = 1;
        return -1;
    }
    if (b->len + extra <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra)
        cap *= 2;
    uint8_t *p = malloc(cap);
    if (p == NULL) {
        b->err = 1;
        return -1;
    }
    if (b->p != NULL) {
        memcpy(p, b->p, b->len);
        OPENSSL_cleanse(b->p, b->cap);
        free(b->p);
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static void put_header(tbuf *b, uint32_t tag, uint8_t type, uint32_t len)
{
    uint8_t *h = b->p + b->len;
    h[0] = (uint8_t)(tag >> 16);
    h[1] = (uint8_t)(tag >> 8);
    h[2] = (uint8_t)tag;
    h[3] = type;
    h[4] = (uint8_t)(len >> 24);
    h[5] = (uint8_t)(len >> 16);
    h[6] = (uint8_t)(len >> 8);
    h[7] = (uint8_t)len;
    b->len += 8;
}

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

void tb_begin(tbuf *b, uint32_t tag)
{
    if (b->depth >= TTLV_MAX_DEPTH) {
        b->err = 1;
        return;
    }
    if (tb_reserve(b, 8))
        return;
    b->stack[b->depth++] = b->len;
    put_header(b, tag, TTLV_STRUCT, 0);
}

void tb_end(tbuf *b)
{
    if (b->err || b->depth == 0) {
        b->err = 1;
        return;
    }
    size_t start = b->stack[--b->depth];
    size_t body = b->len - start - 8;
    if (body > UINT32_MAX) {
        b->err = 1;
        return;
    }
    put_be(b->p + start + 4, body, 4);
}

static void tb_fixed(tbuf *b, uint32_t tag, uint8_t type, uint64_t v, int n)
{
    if (tb_reserve(b, 16))
        return;
    put_header(b, tag, type, (uint32_t)n);
    memset(b->p + b->len, 0, 8);
    put_be(b->p + b->len, v, n);
    b->len += 8;
}

void tb_int(tbuf *b, uint32_t tag, int32_t v) { tb_fixed(b, tag, TTLV_INT, (uint32_t)v, 4); }
void tb_enum(tbuf *b, uint32_t tag, uint32_t v) { tb_fixed(b, tag, TTLV_ENUM, v, 4); }
void tb_long(tbuf *b, uint32_t tag, int64_t v) { tb_fixed(b, tag, TTLV_LONG, (uint64_t)v, 8); }
void tb_bool(tbuf *b, uint32_t tag, int v) { tb_fixed(b, tag, TTLV_BOOL, v ? 1u : 0u, 8); }
void tb_datetime(tbuf *b, uint32_t tag, int64_t v) { tb_fixed(b, tag, TTLV_DATETIME, (uint64_t)v, 8); }

static void tb_var(tbuf *b, uint32_t tag, uint8_t type, const uint8_t *s, size_t n)
{
    if (n > UINT32_MAX - 8) {
        b->err = 1;
        return;
    }
    size_t padded = (n + 7) & ~(size_t)7;
    if (tb_reserve(b, 8 + padded))
        return;
    put_header(b, tag, type, (uint32_t)n);
    if (n)
        memcpy(b->p + b->len, s, n);
    memset(b->p + b->len + n, 0, padded - n);
    b->len += padded;
}

void tb_text(tbuf *b, uint32_t tag, const char *s, size_t n) { tb_var(b, tag, TTLV_TEXT, (const uint8_t *)s, n); }
void tb_bytes(tbuf *b, uint32_t tag, const uint8_t *s, size_t n) { tb_var(b, tag, TTLV_BYTES, s, n); }

void tb_raw(tbuf *b, const uint8_t *s, size_t n)
{
    if (tb_reserve(b, n))
        return;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
}

/* ---------------------------------------------------------------- decoder */

static uint32_t get_be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static int new_node(ttree *t)
{
    if (t->count >= TTLV_MAX_NODES)
        return -1;
    if (t->count == t->cap) {
        int cap = t->cap ? t->cap * 2 : 64;
        tnode *n = realloc(t->n, (size_t)cap * sizeof(*n));
        if (n == NULL)
            return -1;
        t->n = n;
        t->cap = cap;
    }
    return t->count++;
}

/* Parses the items in buf[0..len) as siblings; returns the first one's index via
 * *first (-1 if len == 0). */
static int parse_items(ttree *t, const uint8_t *buf, size_t len, int depth, int *first)
{
    int prev = -1;
    size_t off = 0;
    *first = -1;
    if (depth > TTLV_MAX_DEPTH)
        return -1;
    while (off < len) {
        if (len - off < 8)
            return -1;
        const uint8_t *h = buf + off;
        uint32_t tag = ((uint32_t)h[0] << 16) | ((uint32_t)h[1] << 8) | h[2];
        uint8_t type = h[3];
        uint32_t vlen = get_be32(h + 4);
        size_t room = len - off - 8;
        size_t padded;
        switch (type) {
        case TTLV_INT: case TTLV_ENUM: case TTLV_INTERVAL:
            if (vlen != 4)
                return -1;
            padded = 8;
            break;
        case TTLV_LONG: case TTLV_BOOL: case TTLV_DATETIME:
            if (vlen != 8)
                return -1;
            padded = 8;
            break;
        case TTLV_BIGINT:
            if (vlen % 8 != 0)
                return -1;
            padded = vlen;
            break;
        case TTLV_STRUCT:
            padded = vlen;   /* a structure's length is a multiple of 8 */
            if (vlen % 8 != 0)
                return -1;
            break;
        case TTLV_TEXT: case TTLV_BYTES:
            padded = ((size_t)vlen + 7) & ~(size_t)7;
            break;
        default:
            return -1;
        }
        if (padded > room)
            return -1;
        int idx = new_node(t);
        if (idx < 0)
            return -1;
        t->n[idx].tag = tag;
        t->n[idx].type = type;
        t->n[idx].len = vlen;
        t->n[idx].val = h + 8;
        t->n[idx].first_child = -1;
        t->n[idx].next = -1;
        if (prev >= 0)
            t->n[prev].next = idx;
        else
            *first = idx;
        prev = idx;
        if (type == TTLV_STRUCT) {
            int child;
            if (parse_items(t, h + 8, vlen, depth + 1, &child))
                return -1;
            t->n[idx].first_child = child;
        }
        off += 8 + padded;
    }
    return 0;
}

int ttlv_parse(ttree *t, const uint8_t *buf, size_t len)
{
    int first;
    memset(t, 0, sizeof(*t));
    if (buf == NULL || len < 8)
        return -1;
    if (parse_items(t, buf, len, 0, &first) || first != 0 || t->n[0].next != -1) {
        ttree_free(t);
        return -1;
    }
    return 0;
}

void ttree_free(ttree *t)
{
    free(t->n);
    memset(t, 0, sizeof(*t));
}

int ttlv_find(const ttree *t, int parent, uint32_t tag, int after)
{
    if (parent < 0 || parent >= t->count || t->n[parent].type != TTLV_STRUCT)
        return -1;
    int i = after >= 0 ? t->n[after].next : t->n[parent].first_child;
    for (; i >= 0; i = t->n[i].next)
        if (t->n[i].tag == tag)
            return i;
    return -1;
}

int ttlv_u32(const ttree *t, int node, uint32_t *out)
{
    if (node < 0 || node >= t->count)
        return -1;
    const tnode *n = &t->n[node];
    if ((n->type != TTLV_INT && n->type != TTLV_ENUM && n->type != TTLV_INTERVAL) || n->len != 4)
        return -1;
    *out = get_be32(n->val);
    return 0;
}

int ttlv_i64(const ttree *t, int node, int64_t *out)
{
    if (node < 0 || node >= t->count)
        return -1;
    const tnode *n = &t->n[node];
    if ((n->type != TTLV_LONG && n->type != TTLV_DATETIME) || n->len != 8)
        return -1;
    uint64_t v = ((uint64_t)get_be32(n->val) << 32) | get_be32(n->val + 4);
    *out = (int64_t)v;
    return 0;
}

int ttlv_bool(const ttree *t, int node, int *out)
{
    int64_t v;
    if (node < 0 || node >= t->count || t->n[node].type != TTLV_BOOL || t->n[node].len != 8)
        return -1;
    uint64_t u = ((uint64_t)get_be32(t->n[node].val) << 32) | get_be32(t->n[node].val + 4);
    v = (int64_t)u;
    *out = v != 0;
    return 0;
}

int ttlv_child_u32(const ttree *t, int parent, uint32_t tag, uint32_t *out)
{
    return ttlv_u32(t, ttlv_find(t, parent, tag, -1), out);
}
