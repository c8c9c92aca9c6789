/* The I/O core: see volume_io.h, and README.md for the IV scheme and the locking. */
#define _GNU_SOURCE
#include "volume_io.h"

#include <errno.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Requests lock 64 KiB units of the segment, hashed onto STRIPES rwlocks. A unit holds
 * whole encryption sectors (every sector size up to 4096 divides it), so every sector is
 * covered by exactly one lock, and a 1 MiB request takes at most 17 locks, not 2048. */
#define LOCK_UNIT (64u << 10)
#define STRIPES 256u

/* One request's cipher contexts and buffer, borrowed from the pool for a call: a mutex
 * round trip per call, none per sector, and no allocation per request. */
struct worker {
	EVP_CIPHER_CTX *enc;
	EVP_CIPHER_CTX *dec;
	unsigned char *buf; /* VIO_MAX_IO plus a partial sector at either end */
	struct worker *next;
};

struct vio {
	int fd;
	struct vio_geometry g;
	EVP_CIPHER_CTX *enc; /* keyed templates, copied into every new worker: the raw */
	EVP_CIPHER_CTX *dec; /* key is not needed (nor kept) after vio_open */
	pthread_mutex_t pool_lock; /* guards idle and the templates */
	struct worker *idle;
	pthread_rwlock_t stripe[STRIPES];
};

static void worker_free(struct worker *w)
{
	if (!w)
		return;
	EVP_CIPHER_CTX_free(w->enc);
	EVP_CIPHER_CTX_free(w->dec);
	free(w->buf);
	free(w);
}

static struct worker *borrow(struct vio *v)
{
	pthread_mutex_lock(&v->pool_lock);
	struct worker *w = v->idle;
	if (w) {
		v->idle = w->next;
		pthread_mutex_unlock(&v->pool_lock);
		return w;
	}
	w = calloc(1, sizeof(*w));
	if (w) {
		w->enc = EVP_CIPHER_CTX_new();
		w->dec = EVP_CIPHER_CTX_new();
		w->buf = malloc(VIO_MAX_IO + 2 * (size_t)v->g.sector_size);
		if (!w->enc || !w->dec || !w->buf || !EVP_CIPHER_CTX_copy(w->enc, v->enc) ||
		    !EVP_CIPHER_CTX_copy(w->dec, v->dec)) {
			worker_free(w);
			w = NULL;
		}
	}
	pthread_mutex_unlock(&v->pool_lock);
	return w;
}

static void give_back(struct vio *v, struct worker *w)
{
	pthread_mutex_lock(&v->pool_lock);
	w->next = v->idle;
	v->idle = w;
	pthread_mutex_unlock(&v->pool_lock);
}

/* Stripes are taken in ascending index order whatever the range (it may wrap around the
 * table), so two requests can never wait for each other in a cycle. */
static void stripes(struct vio *v, uint64_t first_byte, uint64_t end_byte, int op)
{
	uint64_t u0 = first_byte / LOCK_UNIT, n = (end_byte - 1) / LOCK_UNIT - u0 + 1;
	uint64_t s0 = u0 % STRIPES;
	if (n >= STRIPES) {
		s0 = 0;
		n = STRIPES;
	}
	uint64_t wrapped = s0 + n > STRIPES ? s0 + n - STRIPES : 0;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t s = i < wrapped ? i : s0 + (i - wrapped);
		if (op == 'r')
			pthread_rwlock_rdlock(&v->stripe[s]);
		else if (op == 'w')
			pthread_rwlock_wrlock(&v->stripe[s]);
		else
			pthread_rwlock_unlock(&v->stripe[s]);
	}
}

/* aes-xts-plain64 as LUKS2 and dm-crypt use it without iv_large_sectors: the IV counts
 * 512-byte units from the segment's start (plus the iv_tweak), whatever the sector
 * size, little-endian in the first 8 of 16 bytes; the count wraps at 2^64 like the
 * kernel's. */
static int crypt_sectors(const struct vio *v, EVP_CIPHER_CTX *ctx, unsigned char *p, uint64_t sector,
			 uint64_t count)
{
	const uint32_t s = v->g.sector_size;
	for (uint64_t i = 0; i < count; i++, p += s) {
		uint64_t n = (sector + i) * (s / 512u) + v->g.iv_offset;
		unsigned char iv[16] = { 0 };
		for (int b = 0; b < 8; b++)
			iv[b] = (unsigned char)(n >> (8 * b));
		int out = 0;
		if (!EVP_CipherInit_ex(ctx, NULL, NULL, NULL, iv, -1) || !EVP_CipherUpdate(ctx, p, &out, p, (int)s) ||
		    out != (int)s)
			return -EIO;
	}
	return 0;
}

/* A short read is an error, not a hole: the container shrank under us. */
static int pread_full(int fd, unsigned char *p, size_t len, uint64_t off)
{
	while (len) {
		ssize_t r = pread(fd, p, len, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -EIO;
		p += r;
		len -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

static int pwrite_full(int fd, const unsigned char *p, size_t len, uint64_t off)
{
	while (len) {
		ssize_t r = pwrite(fd, p, len, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 && errno == ENOSPC ? -ENOSPC : -EIO;
		p += r;
		len -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

/* [off, off+n) lies inside the segment, n <= VIO_MAX_IO. */
static int read_piece(struct vio *v, struct worker *w, unsigned char *out, size_t n, uint64_t off)
{
	const uint64_t s = v->g.sector_size, first = off / s, last = (off + n + s - 1) / s;
	const size_t bytes = (size_t)((last - first) * s);
	/* Shared with other readers, exclusive of writers: a sector half rewritten by a
	 * concurrent pwrite would decrypt to noise, bytes nobody wrote included. */
	stripes(v, first * s, last * s, 'r');
	int r = pread_full(v->fd, w->buf, bytes, v->g.data_offset + first * s);
	stripes(v, first * s, last * s, 'u');
	if (!r)
		r = crypt_sectors(v, w->dec, w->buf, first, last - first);
	if (!r)
		memcpy(out, w->buf + (off - first * s), n);
	return r;
}

static int write_piece(struct vio *v, struct worker *w, const unsigned char *in, size_t n, uint64_t off)
{
	const uint64_t s = v->g.sector_size, first = off / s, end = off + n, last = (end + s - 1) / s;
	const uint64_t count = last - first, at = v->g.data_offset + first * s;
	const size_t bytes = (size_t)(count * s);
	const int head = off % s != 0 || (count == 1 && end % s != 0), tail = count > 1 && end % s != 0;
	/* Exclusive over every sector written, whole ones too: a whole-sector write landing
	 * between another writer's read and write-back of that sector would be lost. */
	stripes(v, first * s, last * s, 'w');
	int r = 0;
	if (head && !(r = pread_full(v->fd, w->buf, s, at)))
		r = crypt_sectors(v, w->dec, w->buf, first, 1);
	if (!r && tail && !(r = pread_full(v->fd, w->buf + bytes - s, s, at + bytes - s)))
		r = crypt_sectors(v, w->dec, w->buf + bytes - s, last - 1, 1);
	if (!r) {
		memcpy(w->buf + (off - first * s), in, n);
		r = crypt_sectors(v, w->enc, w->buf, first, count);
	}
	if (!r)
		r = pwrite_full(v->fd, w->buf, bytes, at);
	stripes(v, first * s, last * s, 'u');
	return r;
}

ssize_t vio_read(struct vio *v, void *buf, size_t len, uint64_t off)
{
	if (off >= v->g.size || len == 0)
		return 0;
	if (len > v->g.size - off)
		len = (size_t)(v->g.size - off);
	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	struct worker *w = borrow(v);
	if (!w)
		return -ENOMEM;
	int r = 0;
	for (size_t done = 0; !r && done < len;) {
		size_t n = len - done < VIO_MAX_IO ? len - done : VIO_MAX_IO;
		r = read_piece(v, w, (unsigned char *)buf + done, n, off + done);
		done += n;
	}
	give_back(v, w);
	return r ? r : (ssize_t)len;
}

ssize_t vio_write(struct vio *v, const void *buf, size_t len, uint64_t off)
{
	if (off > (uint64_t)INT64_MAX)
		return -EFBIG;
	if (len == 0)
		return 0;
	if (off >= v->g.size)
		return -ENOSPC;
	if (len > v->g.size - off)
		len = (size_t)(v->g.size - off);
	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	struct worker *w = borrow(v);
	if (!w)
		return -ENOMEM;
	int r = 0;
	for (size_t done = 0; !r && done < len;) {
		size_t n = len - done < VIO_MAX_IO ? len - done : VIO_MAX_IO;
		r = write_piece(v, w, (const unsigned char *)buf + done, n, off + done);
		done += n;
	}
	give_back(v, w);
	return r ? r : (ssize_t)len;
}

int vio_sync(struct vio *v)
{
	return fdatasync(v->fd) < 0 ? -errno : 0;
}

void vio_close(struct vio *v)
{
	if (!v)
		return;
	while (v->idle) {
		struct worker *w = v->idle;
		v->idle = w->next;
		worker_free(w);
	}
	EVP_CIPHER_CTX_free(v->enc);
	EVP_CIPHER_CTX_free(v->dec);
	for (unsigned i = 0; i < STRIPES; i++)
		pthread_rwlock_destroy(&v->stripe[i]);
	pthread_mutex_destroy(&v->pool_lock);
	free(v);
}

int vio_open(struct vio **out, int fd, const struct vio_geometry *g, const unsigned char key[VIO_KEY_SIZE])
{
	*out = NULL;
	if (g->sector_size < 512 || g->sector_size > 4096 || (g->sector_size & (g->sector_size - 1)) || g->size == 0 ||
	    g->size % g->sector_size ||
	    g->data_offset > (uint64_t)INT64_MAX || g->size > (uint64_t)INT64_MAX - g->data_offset)
		return -EINVAL;
	struct vio *v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	v->fd = fd;
	v->g = *g;
	pthread_mutex_init(&v->pool_lock, NULL);
	/* Writer-preferring: a stream of reads of one unit must not starve a writer. */
	pthread_rwlockattr_t ra;
	pthread_rwlockattr_init(&ra);
	pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	for (unsigned i = 0; i < STRIPES; i++)
		pthread_rwlock_init(&v->stripe[i], &ra);
	pthread_rwlockattr_destroy(&ra);
	v->enc = EVP_CIPHER_CTX_new();
	v->dec = EVP_CIPHER_CTX_new();
	if (!v->enc || !v->dec) {
		vio_close(v);
		return -ENOMEM;
	}
	/* OpenSSL refuses to encrypt under a key whose halves are equal (XTS's weak key):
	 * that is the one way a 64-byte key fails here, and it is reported as -EIO. */
	static const unsigned char zero_iv[16];
	if (!EVP_EncryptInit_ex(v->enc, EVP_aes_256_xts(), NULL, key, zero_iv) ||
	    !EVP_DecryptInit_ex(v->dec, EVP_aes_256_xts(), NULL, key, zero_iv)) {
		vio_close(v);
		return -EIO;
	}
	*out = v;
	return 0;
}
