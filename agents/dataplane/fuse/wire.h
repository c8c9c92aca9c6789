/* The control channel's wire helpers (README.md, "The control channel"): big-endian
 * integers and a bounds-checked reader over one message's payload. */
#ifndef SR_WIRE_H
#define SR_WIRE_H

#include <stddef.h>
#include <stdint.h>

static inline void sr_put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void sr_put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline void sr_put64(uint8_t *p, uint64_t v)
{
	sr_put32(p, (uint32_t)(v >> 32));
	sr_put32(p + 4, (uint32_t)v);
}
static inline uint16_t sr_get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static inline uint32_t sr_get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reading past the end sets `bad` and yields zeros: a parser checks `bad` once. */
struct sr_rd { const uint8_t *p; size_t left; int bad; };

static inline const uint8_t *sr_take(struct sr_rd *r, size_t n)
{
	if (r->bad || r->left < n) {
		r->bad = 1;
		return NULL;
	}
	const uint8_t *p = r->p;
	r->p += n;
	r->left -= n;
	return p;
}
static inline uint32_t sr_rd8(struct sr_rd *r) { const uint8_t *p = sr_take(r, 1); return p ? p[0] : 0; }
static inline uint32_t sr_rd16(struct sr_rd *r) { const uint8_t *p = sr_take(r, 2); return p ? sr_get16(p) : 0; }
static inline uint32_t sr_rd32(struct sr_rd *r) { const uint8_t *p = sr_take(r, 4); return p ? sr_get32(p) : 0; }

#endif
