/* libFuzzer target for the I/O core (volume_io.c), differential against a plaintext
 * model and against a plain reference encryption of the model.
 *
 * Input: byte 0 picks the geometry (sector size 512 to 4096, a few sectors more than
 * 16 KiB of segment, the data offset, the IV tweak, including one that wraps 2^64);
 * then 6 bytes per operation: kind, offset (16 bits), length (16 bits), fill byte.
 * Offsets and lengths reach past the end; the build's VIO_MAX_IO is 8 KiB, so long
 * calls are cut into pieces. Every read must equal the model; after the last operation
 * the container must hold exactly the model encrypted sector by sector (a separate,
 * whole-sector encryption here), with the bytes before and after the segment untouched.
 * Any difference aborts. */
#define _GNU_SOURCE
#include "volume_io.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Fixed test key; its two halves differ (OpenSSL refuses equal halves for XTS). */
static const unsigned char KEY[VIO_KEY_SIZE] = {
	0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
	0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
	0xf0, 0xe1, 0xd2, 0xc3, 0xb4, 0xa5, 0x96, 0x87, 0x78, 0x69, 0x5a, 0x4b, 0x3c, 0x2d, 0x1e, 0x0f,
	0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x00,
};
static const uint64_t IV_OFFSETS[4] = { 0, 1, 2048, UINT64_MAX - 40 };
#define HEAD_BYTE 0xa5 /* before the segment: the LUKS2 header's place */
#define TAIL_BYTE 0x5a /* after it: the part of a last sector a dynamic segment drops */
#define TAIL_LEN 100

static void check(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "fuzz-volume-io: %s\n", what);
		abort();
	}
}

/* The reference: one whole sector at a time, the IV written out as dm-crypt's plain64
 * with 512-byte units, from a fresh context. */
static void reference(const struct vio_geometry *g, const unsigned char *plain, unsigned char *out)
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	check(ctx != NULL, "EVP_CIPHER_CTX_new");
	for (uint64_t at = 0; at < g->size; at += g->sector_size) {
		uint64_t unit = at / 512 + g->iv_offset;
		unsigned char iv[16];
		memset(iv, 0, sizeof(iv));
		for (int i = 0; i < 8; i++)
			iv[i] = (unsigned char)(unit >> (8 * i));
		int n = 0;
		check(EVP_EncryptInit_ex(ctx, EVP_aes_256_xts(), NULL, KEY, iv) &&
			      EVP_EncryptUpdate(ctx, out + at, &n, plain + at, (int)g->sector_size) && n == (int)g->sector_size,
		      "reference encryption");
	}
	EVP_CIPHER_CTX_free(ctx);
}

static void pread_all(int fd, unsigned char *p, size_t len, off_t off)
{
	check(pread(fd, p, len, off) == (ssize_t)len, "pread of the container");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	struct vio_geometry g;
	g.sector_size = 512u << (data[0] & 3);
	g.size = (16u << 10) + (uint64_t)((data[0] >> 2) & 3) * g.sector_size;
	g.data_offset = (data[0] & 0x10) ? 4096 : 512;
	g.iv_offset = IV_OFFSETS[(data[0] >> 5) & 3];
	data++;
	size--;

	size_t total = (size_t)(g.data_offset + g.size + TAIL_LEN);
	unsigned char *model = malloc(g.size), *image = malloc(total), *buf = malloc(3 * VIO_MAX_IO);
	check(model && image && buf, "malloc");
	for (uint64_t i = 0; i < g.size; i++)
		model[i] = (unsigned char)(i * 7 + 3);
	memset(image, HEAD_BYTE, g.data_offset);
	reference(&g, model, image + g.data_offset);
	memset(image + g.data_offset + g.size, TAIL_BYTE, TAIL_LEN);
	int fd = memfd_create("fuzz-volume-io", MFD_CLOEXEC);
	check(fd >= 0 && pwrite(fd, image, total, 0) == (ssize_t)total, "memfd");

	struct vio *v;
	check(vio_open(&v, fd, &g, KEY) == 0, "vio_open");
	for (; size >= 6; data += 6, size -= 6) {
		uint64_t off = ((unsigned)data[1] << 8 | data[2]) % (g.size + 2 * g.sector_size);
		size_t len = ((unsigned)data[3] << 8 | data[4]) % (3 * VIO_MAX_IO);
		size_t fits = off >= g.size ? 0 : (size_t)(g.size - off) < len ? (size_t)(g.size - off) : len;
		switch (data[0] % 4) {
		case 0: {
			ssize_t n = vio_read(v, buf, len, off);
			check(n == (ssize_t)fits, "read returned the wrong count");
			check(fits == 0 || memcmp(buf, model + off, fits) == 0, "read differs from the model");
			break;
		}
		case 1:
		case 2: {
			for (size_t i = 0; i < len; i++)
				buf[i] = (unsigned char)(data[5] + i);
			ssize_t n = vio_write(v, buf, len, off);
			if (len == 0)
				check(n == 0, "empty write");
			else if (off >= g.size)
				check(n == -ENOSPC, "write past the end is not ENOSPC");
			else
				check(n == (ssize_t)fits, "write returned the wrong count");
			if (n > 0)
				memcpy(model + off, buf, (size_t)n);
			break;
		}
		default: /* nothing may live only in the contexts or the pool */
			vio_close(v);
			check(vio_open(&v, fd, &g, KEY) == 0, "vio_open again");
		}
	}
	check(vio_sync(v) == 0, "vio_sync");
	vio_close(v);

	/* The container is the model, encrypted by the reference; nothing else moved. */
	unsigned char *now = malloc(total);
	check(now != NULL, "malloc");
	pread_all(fd, now, total, 0);
	reference(&g, model, image + g.data_offset);
	check(memcmp(now, image, total) == 0, "container differs from the model's reference encryption");
	free(now);
	close(fd);
	free(model);
	free(image);
	free(buf);
	return 0;
}
