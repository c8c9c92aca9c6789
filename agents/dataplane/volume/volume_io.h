/* The I/O core of strongroom-volume: plaintext reads and writes at any byte offset of a
 * LUKS2 aes-xts-plain64 data segment, over a container descriptor. No FUSE, no
 * libcryptsetup here: the caller supplies the geometry and the 64-byte volume key. */
#ifndef SV_VOLUME_IO_H
#define SV_VOLUME_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Most bytes one call moves in one piece (one buffer, one set of locks). Larger calls
 * are cut into pieces of this size; the fuzz build makes it small so that cutting is
 * exercised on a container of a few sectors. */
#ifndef VIO_MAX_IO
#define VIO_MAX_IO (1u << 20)
#endif

#define VIO_KEY_SIZE 64u     /* AES-256-XTS: two 256-bit keys */

struct vio_geometry {
	uint64_t data_offset; /* bytes from the container's start to the segment */
	uint64_t size;        /* bytes served: a positive multiple of sector_size */
	uint32_t sector_size; /* encryption sector (one XTS data unit): 512 to 4096, a power of two */
	uint64_t iv_offset;   /* LUKS2 iv_tweak, added to the 512-byte unit count */
};

struct vio;

/* Key the cipher contexts from `key` (the caller wipes it afterwards: nothing here keeps
 * a copy outside OpenSSL's contexts) and serve `g` on `fd`, which stays the caller's.
 * 0, or -EINVAL (geometry), -ENOMEM, -EIO (OpenSSL refused the key). */
int vio_open(struct vio **out, int fd, const struct vio_geometry *g, const unsigned char key[VIO_KEY_SIZE]);

/* Bytes read (0 at or past the end, fewer than len across it), or -EIO, -ENOMEM. */
ssize_t vio_read(struct vio *v, void *buf, size_t len, uint64_t off);

/* Bytes written (fewer than len across the end), or -ENOSPC (starts at or past the
 * end), -EFBIG (offset beyond what off_t holds), -EIO, -ENOMEM. */
ssize_t vio_write(struct vio *v, const void *buf, size_t len, uint64_t off);

/* fdatasync of the container: 0 or -errno. */
int vio_sync(struct vio *v);

/* Free the contexts (OpenSSL wipes the key schedules); NULL is a no-op. */
void vio_close(struct vio *v);

#endif
