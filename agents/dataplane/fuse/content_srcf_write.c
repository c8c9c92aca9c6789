/* Writes, truncation and fallocate on a format v1 file: every change sealed in memory,
 * checked and reserved before the first backing write, and put back when one fails. */
#define _GNU_SOURCE
#include "content_srcf.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Space for [off, off + len) allocated before it is written, so the write cannot meet
 * ENOSPC half way; a file system without fallocate gets the put-back path instead. */
static int reserve(int fd, uint64_t off, uint64_t len)
{
	if (!len)
		return 0;
	for (;;) {
		if (fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) == 0)
			return 0;
		if (errno == EINTR)
			continue;
		return errno == EOPNOTSUPP || errno == ENOSYS ? 0 : -errno;
	}
}

/* EFBIG before anything changes: a length the backing file system cannot hold (ext4:
 * 16 TiB) would otherwise fail half way through an extension. lseek checks the file
 * system's own maximum (s_maxbytes) and moves nothing: every I/O here is positional. */
static int fits(int fd, uint64_t stored_end)
{
	if (stored_end > INT64_MAX)
		return -EFBIG;
	if (lseek(fd, (off_t)stored_end, SEEK_SET) < 0)
		return errno == EINVAL ? -EFBIG : -errno;
	return 0;
}

/* Seal the current final chunk as a full, non-final chunk (zeros after its data) into
 * `out` (cs + overhead bytes): part of every extension past it. */
static int seal_old_final_full(struct sr_content *c, struct bufs *b, uint8_t *out, size_t *len)
{
	uint32_t cs = c->cs;
	uint64_t index = cs_chunks_of(c->size, cs) - 1;
	size_t have = (size_t)(c->size - index * cs);
	memset(b->plain, 0, cs);
	if (have) {
		int r = cs_read_chunks(c, index, index, b->plain, have, b->stored);
		if (r < 0)
			return r;
	}
	int rc = srcf_seal_run(c->file, index, SRCF_NO_FINAL, b->plain, cs, out, (size_t)cs + SRCF_CHUNK_OVERHEAD, len,
			       NULL);
	return rc == SRCF_OK ? 0 : cs_errno(rc, c->fd);
}

/* Under the write lock. Writes `size` bytes at `off` (size may be 0 with new_size >
 * c->size: an extension by zeros, as truncate and fallocate do). All or nothing. */
static int write_locked(struct sr_content *c, const uint8_t *data, size_t size, uint64_t off, uint64_t new_size)
{
	if (c->broken)
		return -EIO;
	uint32_t cs = c->cs;
	uint64_t stored_end, old_end;
	if (srcf_stored_size(new_size, cs, &stored_end) != SRCF_OK)
		return -EFBIG;
	(void)srcf_stored_size(c->size, cs, &old_end);
	int r = fits(c->fd, stored_end);
	if (r < 0)
		return r;
	r = cs_journal_mark(c);
	if (r < 0)
		return r;
	uint64_t old_size = c->size, old_n = cs_chunks_of(old_size, cs), new_n = cs_chunks_of(new_size, cs);
	uint64_t final = new_n - 1;
	/* The run to seal: the chunks the write covers; for a pure extension, the new final. */
	uint64_t first = size ? off / cs : final, last = size ? (off + size - 1) / cs : final;
	if (new_size > old_size)
		last = final; /* a write reaching past the end: its last chunk is the new final */
	uint64_t run_end = (last + 1) * (uint64_t)cs < new_size ? (last + 1) * (uint64_t)cs : new_size;
	size_t plain_len = (size_t)(run_end - first * cs);
	size_t run_stored = plain_len + (size_t)(last - first + 1) * SRCF_CHUNK_OVERHEAD;
	struct bufs *b = cs_bufs_get(run_stored + 2 * SRCF_CHUNK_OVERHEAD + cs, plain_len > cs ? plain_len : cs);
	if (!b || cs_bufs_extra(b, (size_t)cs + SRCF_CHUNK_OVERHEAD, run_stored + (size_t)cs + SRCF_CHUNK_OVERHEAD) < 0)
		return -ENOMEM;
	/* Growing past the old final chunk, which lies before this run: it becomes a full,
	 * non-final chunk too (sealed now, written after the run). */
	size_t alen = 0;
	int grow = new_n > old_n && old_n - 1 < first;
	if (grow && (r = seal_old_final_full(c, b, b->aux, &alen)) < 0)
		return r;
	const uint8_t *plain;
	if (size && off == first * cs && size == plain_len) {
		plain = data; /* whole chunks, or up to the end: no copy */
	} else {
		uint8_t *p = b->plain;
		memset(p, 0, plain_len);
		/* Old bytes of the edge chunks that the write does not cover. */
		uint64_t edges[2] = { first, last };
		for (int k = 0; k < 2; k++) {
			uint64_t i = edges[k];
			if (k == 1 && i == first)
				break;
			if (i >= old_n || i * cs >= old_size)
				continue; /* past the old end: zeros */
			uint64_t old_chunk_end = (i + 1) * (uint64_t)cs < old_size ? (i + 1) * (uint64_t)cs : old_size;
			if (size && off <= i * cs && off + size >= old_chunk_end)
				continue; /* wholly overwritten */
			r = cs_read_chunks(c, i, i, p + (i - first) * cs, (size_t)(old_chunk_end - i * cs), b->stored);
			if (r < 0)
				return r;
		}
		if (size)
			memcpy(p + (off - first * cs), data, size);
		plain = p;
	}
	size_t len;
	uint8_t *stored = b->stored;
	int rc = srcf_seal_run(c->file, first, final, plain, plain_len, stored, b->stored_cap, &len, NULL);
	if (rc != SRCF_OK)
		return cs_errno(rc, c->fd);
	uint64_t from = (uint64_t)cs_chunk_off(first, cs), to = from + len;
	/* The stored bytes this change overwrites, kept to be put back: the old final chunk
	 * when it is re-sealed, else what the run covers of the old file. */
	struct undo u = { .old_end = old_end, .new_end = stored_end, .bytes = b->old };
	u.off = grow ? (uint64_t)cs_chunk_off(old_n - 1, cs) : from;
	uint64_t until = grow ? old_end : (to < old_end ? to : old_end);
	u.len = until > u.off ? (size_t)(until - u.off) : 0;
	if (u.len && (r = cs_io_full(c->fd, b->old, u.len, (off_t)u.off, 0)) < 0)
		return r;
	/* An overwrite of stored chunks in place needs no new blocks; a run reaching past
	 * the old end, or over a hole, does. */
	int in_place = !grow && to <= old_end;
	for (size_t k = 0; in_place && k + (size_t)cs + SRCF_CHUNK_OVERHEAD <= u.len; k += (size_t)cs + SRCF_CHUNK_OVERHEAD)
		in_place = !cs_all_zero(b->old + k, (size_t)cs + SRCF_CHUNK_OVERHEAD);
	if ((!in_place && (r = reserve(c->fd, from, len)) < 0) || (grow && (r = reserve(c->fd, u.off, alen)) < 0))
		return r;
	if ((r = cs_undo_arm(c, &u)) < 0)
		return r;
	/* The run first, then the old final chunk: a kill between them leaves the old final
	 * chunk in place, which repair finds even without the undo record. */
	r = cs_io_full(c->fd, stored, len, (off_t)from, 1);
	if (r == 0 && grow)
		r = cs_io_full(c->fd, b->aux, alen, (off_t)u.off, 1);
	if (r < 0) {
		cs_undo_apply(c, &u);
		return r;
	}
	if (new_size > c->size)
		c->size = new_size;
	/* The write is whole, but a record left armed would undo it at the next start, so
	 * it cannot be acknowledged. Putting the old bytes back now could tear the chunks
	 * if that write failed too, with the record maybe gone: the file stays new, the
	 * next start finds it new or (record armed) old, never torn. */
	if (cs_undo_disarm(c) < 0) {
		c->broken = 1;
		return -EIO;
	}
	if (from > c->stream_end || to < c->started) {
		c->started = c->flushed = from; /* not sequential: a new stream starts here */
	}
	c->stream_end = to;
	if (to - c->started >= STREAM_WINDOW) {
		if (c->started > c->flushed) {
			(void)sync_file_range(c->fd, (off_t)c->flushed, (off_t)(c->started - c->flushed),
					      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
						      SYNC_FILE_RANGE_WAIT_AFTER);
			(void)posix_fadvise(c->fd, (off_t)c->flushed, (off_t)(c->started - c->flushed),
					    POSIX_FADV_DONTNEED);
		}
		(void)sync_file_range(c->fd, (off_t)c->started, (off_t)(to - c->started), SYNC_FILE_RANGE_WRITE);
		c->flushed = c->started;
		c->started = to;
	}
	return 0;
}

ssize_t cs_write(struct sr_content *c, const void *buf, size_t size, off_t off)
{
	if (!c->writable)
		return -EBADF;
	if (off < 0)
		return -EINVAL;
	if (size == 0)
		return 0;
	uint64_t end;
	if (__builtin_add_overflow((uint64_t)off, (uint64_t)size, &end) || end > INT64_MAX)
		return -EFBIG;
	pthread_rwlock_wrlock(&c->lock);
	uint64_t new_size = end > c->size ? end : c->size;
	int r = write_locked(c, buf, size, (uint64_t)off, new_size);
	pthread_rwlock_unlock(&c->lock);
	return r < 0 ? r : (ssize_t)size;
}

/* Under the write lock. The new final chunk is written over its old self first, then
 * the file cut at its exact end in one ftruncate: a failure of either puts the old
 * chunk back (nothing was cut yet, or the cut did not happen). */
static int shrink_locked(struct sr_content *c, uint64_t new_size)
{
	if (c->broken)
		return -EIO;
	uint32_t cs = c->cs;
	int r = cs_journal_mark(c);
	if (r < 0)
		return r;
	uint64_t n = cs_chunks_of(new_size, cs), old_final = cs_chunks_of(c->size, cs) - 1, old_end, new_end;
	(void)srcf_stored_size(c->size, cs, &old_end);
	(void)srcf_stored_size(new_size, cs, &new_end);
	size_t keep = (size_t)(new_size - (n - 1) * cs);
	struct bufs *b = cs_bufs_get(2 * ((size_t)cs + SRCF_CHUNK_OVERHEAD), cs);
	if (!b || cs_bufs_extra(b, 0, (size_t)cs + SRCF_CHUNK_OVERHEAD) < 0)
		return -ENOMEM;
	/* the chunk that becomes final, as stored now (kept to be put back) and opened */
	struct undo u = { .old_end = old_end, .new_end = new_end, .off = (uint64_t)cs_chunk_off(n - 1, cs),
			  .bytes = b->old };
	uint64_t until = (uint64_t)cs_chunk_off(n, cs) < old_end ? (uint64_t)cs_chunk_off(n, cs) : old_end;
	u.len = (size_t)(until - u.off);
	if ((r = cs_io_full(c->fd, b->old, u.len, (off_t)u.off, 0)) < 0)
		return r == -EIO ? (cs_event(SR_EV_INTEGRITY, c->fd), -EIO) : r;
	if (keep) {
		size_t have = n - 1 == old_final ? (size_t)(c->size - old_final * cs) : cs, got;
		uint64_t bad;
		int rc = srcf_open_run(c->file, n - 1, old_final, b->old, have + SRCF_CHUNK_OVERHEAD, b->plain, have, &got,
				       &bad);
		if (rc != SRCF_OK)
			return cs_errno(rc, c->fd);
	}
	size_t len;
	int rc = srcf_seal_run(c->file, n - 1, n - 1, b->plain, keep, b->stored, b->stored_cap, &len, NULL);
	if (rc != SRCF_OK)
		return cs_errno(rc, c->fd);
	if ((r = reserve(c->fd, u.off, len)) < 0) /* the chunk may be a hole */
		return r;
	if ((r = cs_undo_arm(c, &u)) < 0)
		return r;
	r = cs_io_full(c->fd, b->stored, len, (off_t)u.off, 1);
	if (r == 0 && ftruncate(c->fd, (off_t)new_end) < 0)
		r = -errno;
	if (r < 0) {
		cs_undo_apply(c, &u);
		return r;
	}
	/* An armed record of a finished cut is never replayed (the file has its new end),
	 * and nothing could put the cut chunks back: the cut stands. */
	(void)cs_undo_disarm(c);
	c->size = new_size;
	return 0;
}

int cs_truncate(struct sr_content *c, off_t size)
{
	if (!c->writable)
		return -EBADF;
	if (size < 0)
		return -EINVAL;
	pthread_rwlock_wrlock(&c->lock);
	int r = 0;
	if ((uint64_t)size > c->size)
		r = write_locked(c, NULL, 0, c->size, (uint64_t)size);
	else if ((uint64_t)size < c->size)
		r = shrink_locked(c, (uint64_t)size);
	pthread_rwlock_unlock(&c->lock);
	return r;
}

int cs_fallocate(struct sr_content *c, int mode, off_t off, off_t len)
{
	if (mode & ~FALLOC_FL_KEEP_SIZE)
		return -EOPNOTSUPP; /* punching or zeroing ranges would need chunk rewrites: not offered */
	if (off < 0 || len <= 0)
		return -EINVAL;
	uint64_t end;
	if (__builtin_add_overflow((uint64_t)off, (uint64_t)len, &end) || end > INT64_MAX)
		return -EFBIG;
	pthread_rwlock_wrlock(&c->lock);
	uint64_t stored_end;
	int r = srcf_stored_size(end, c->cs, &stored_end) != SRCF_OK ? -EFBIG : fits(c->fd, stored_end);
	/* The space the stored bytes of the range take, as the caller asked, reserved before
	 * the size changes: a refusal (ENOSPC) leaves the file as it was. */
	if (r == 0)
		r = reserve(c->fd, (uint64_t)cs_chunk_off((uint64_t)off / c->cs, c->cs),
			    stored_end - (uint64_t)cs_chunk_off((uint64_t)off / c->cs, c->cs));
	if (r == 0 && !(mode & FALLOC_FL_KEEP_SIZE) && end > c->size)
		r = write_locked(c, NULL, 0, c->size, end);
	pthread_rwlock_unlock(&c->lock);
	return r;
}
