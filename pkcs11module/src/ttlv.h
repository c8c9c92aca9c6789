/* KMIP 1.4 TTLV: a bounded encoder and a bounded decoder.
 *
 * Decoding never trusts a length: every item is checked against what remains of its
 * parent, nesting is limited to TTLV_MAX_DEPTH and the number of items to
 * TTLV_MAX_NODES, fixed-size types must have their fixed lengths. The decoded tree
 * points into the caller's buffer (no copies). */
#ifndef SR_TTLV_H
#define SR_TTLV_H

#include <stddef.h>
#include <stdint.h>

enum {
    TTLV_STRUCT = 0x01, TTLV_INT = 0x02, TTLV_LONG = 0x03, TTLV_BIGINT = 0x04,
    TTLV_ENUM = 0x05, TTLV_BOOL = 0x06, TTLV_TEXT = 0x07, TTLV_BYTES = 0x08,
    TTLV_DATETIME = 0x09, TTLV_INTERVAL = 0x0A,
};

#define TTLV_MAX_DEPTH 16
#define TTLV_MAX_NODES 65536

/* ---- encoder ---- */
typedef struct {
    uint8_t *p;
    size_t len, cap;
    int err;          /* set on allocation failure: every later call is a no-op */
    size_t stack[TTLV_MAX_DEPTH];
    int depth;
} tbuf;

void tb_init(tbuf *b);
void tb_free(tbuf *b);             /* wipes before freeing (requests carry data) */
void tb_begin(tbuf *b, uint32_t tag);
void tb_end(tbuf *b);
void tb_int(tbuf *b, uint32_t tag, int32_t v);
void tb_enum(tbuf *b, uint32_t tag, uint32_t v);
void tb_long(tbuf *b, uint32_t tag, int64_t v);
void tb_bool(tbuf *b, uint32_t tag, int v);
void tb_datetime(tbuf *b, uint32_t tag, int64_t v);
void tb_text(tbuf *b, uint32_t tag, const char *s, size_t n);
void tb_bytes(tbuf *b, uint32_t tag, const uint8_t *s, size_t n);
/* Appends an already encoded item (e.g. a payload built separately). */
void tb_raw(tbuf *b, const uint8_t *s, size_t n);

/* ---- decoder ---- */
typedef struct {
    uint32_t tag;
    uint8_t type;
    uint32_t len;
    const uint8_t *val;
    int first_child;  /* -1 if none */
    int next;         /* next sibling, -1 if none */
} tnode;

typedef struct {
    tnode *n;
    int count, cap;
} ttree;

/* Parses exactly one top-level item filling `len` bytes. 0 on success, -1 on any
 * malformation. On success the root is node 0. ttree_free releases the nodes. */
int ttlv_parse(ttree *t, const uint8_t *buf, size_t len);
void ttree_free(ttree *t);

/* The first child of `parent` with `tag` after child `after` (-1: from the start), or -1. */
int ttlv_find(const ttree *t, int parent, uint32_t tag, int after);
int ttlv_u32(const ttree *t, int node, uint32_t *out);   /* Integer, Enumeration, Interval */
int ttlv_i64(const ttree *t, int node, int64_t *out);    /* Long Integer, Date-Time */
int ttlv_bool(const ttree *t, int node, int *out);
/* Child of `parent` with `tag` as a u32; 0 on success. */
int ttlv_child_u32(const ttree *t, int parent, uint32_t tag, uint32_t *out);

#endif
