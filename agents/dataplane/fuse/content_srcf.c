/* The format v1 content layer: the mount shows plaintext, the backing file holds
 * docs/FORMAT.md's header and chunks, sealed and opened by libsrcf (OpenSSL's
 * AES-256-GCM). Selected with --content srcf.
 *
 * Locking. The core holds the inode's io_lock shared for reads and positional writes
 * and exclusively for size changes; a chunk is rewritten whole (read-modify-write), and
 * a reader must never see a chunk half rewritten nor a stale "final" flag, so this layer
 * adds its own rwlock per open inode: reads share it, writes and size changes take it
 * alone. Reads of one file therefore run in parallel, and the kernel's page cache
 * (kept across opens) answers most of them without a request at all.
 *
 * Sparse files. An extension past the end writes two chunks at most: the old final
 * chunk re-sealed full and not final, and the new final chunk; whole chunks between
 * them are left as holes in the backing file (all-zero stored chunks, read back as
 * zeros: FORMAT.md, "Sparse regions"). truncate(10^15) costs two chunks, or EFBIG.
 *
 * Journal. Before the first change of a file, an entry naming it is made durable in
 * the journal directory; it is removed when the last user of the file closes it. A
 * crash between the steps of a size change leaves a tail that the control plane
 * repairs at the next start for journalled files only (FORMAT.md, "Interrupted
 * writes").
 *
 * Failure atomicity. A change that fails leaves the file as it was: everything is
 * sealed in memory and the backing file system's limits are checked (EFBIG) and the
 * space the change writes is reserved (fallocate, FALLOC_FL_KEEP_SIZE: ENOSPC) before
 * the first byte moves; the ciphertext a change overwrites is kept, and put back (and
 * the length restored) when a backing write fails after all. For a kill between the
 * steps, that old ciphertext is also written to an undo record beside the journal
 * entry ("<entry>.undo") before the change and disarmed after it; the control plane
 * puts it back before anything else at the next start, so a killed change leaves the
 * old file, never a torn chunk. */
#define _GNU_SOURCE
#include "content_srcf.h"
#include "keystore.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct srcf_layer cs_cfg;

/* ---- operations --------------------------------------------------------------------- */
static int srcf_init_new(void *layer, int fd)
{
	(void)layer;
	const srcf_key *key;
	int r = sr_key_borrow_active(&key);
	if (r < 0)
		return r;
	srcf_file *f;
	uint8_t out[SRCF_HEADER_SIZE + SRCF_CHUNK_OVERHEAD];
	int rc = srcf_file_create(&f, out, key, cs_cfg.chunk_size);
	sr_key_return(key);
	if (rc != SRCF_OK)
		return cs_errno(rc, fd);
	size_t len;
	rc = srcf_seal_run(f, 0, 0, NULL, 0, out + SRCF_HEADER_SIZE, SRCF_CHUNK_OVERHEAD, &len, NULL);
	srcf_file_free(f);
	if (rc != SRCF_OK)
		return cs_errno(rc, fd);
	return cs_io_full(fd, out, sizeof(out), 0, 1);
}

static int srcf_open(void *layer, int fd, int writable, struct sr_content **out)
{
	(void)layer;
	uint8_t header[SRCF_HEADER_SIZE];
	ssize_t n = pread(fd, header, sizeof(header), 0);
	if (n < 0)
		return -errno;
	srcf_header h;
	int rc = srcf_header_parse(header, (size_t)n, &h);
	if (rc != SRCF_OK)
		return cs_errno(rc == SRCF_E_ARGUMENT ? SRCF_E_HEADER_TRUNCATED : rc, fd);
	struct stat st;
	if (fstat(fd, &st) < 0)
		return -errno;
	uint64_t size;
	rc = srcf_plaintext_size((uint64_t)st.st_size, h.chunk_size, &size);
	if (rc != SRCF_OK)
		return cs_errno(rc == SRCF_E_FILE_LENGTH ? SRCF_E_INTEGRITY : rc, fd);
	const srcf_key *key;
	if (sr_key_borrow(h.key_id, h.key_version, &key) < 0) {
		cs_event(SR_EV_NO_KEY, fd);
		return -ENOKEY;
	}
	srcf_file *f;
	rc = srcf_file_open(&f, header, sizeof(header), key);
	sr_key_return(key);
	if (rc != SRCF_OK)
		return cs_errno(rc, fd);
	struct sr_content *c = calloc(1, sizeof(*c));
	if (!c) {
		srcf_file_free(f);
		return -ENOMEM;
	}
	c->fd = fd;
	c->writable = writable;
	c->file = f;
	c->cs = h.chunk_size;
	c->size = size;
	c->undo_fd = -1;
	c->broken = cs_broken_known(&st);
	pthread_rwlock_init(&c->lock, NULL);
	*out = c;
	return 0;
}

static ssize_t srcf_read(struct sr_content *c, void *buf, size_t size, off_t off)
{
	pthread_rwlock_rdlock(&c->lock);
	ssize_t result = 0;
	if (off < 0) {
		result = -EINVAL;
		goto out;
	}
	if ((uint64_t)off >= c->size || size == 0)
		goto out;
	if ((uint64_t)off + size > c->size)
		size = (size_t)(c->size - (uint64_t)off);
	uint32_t cs = c->cs;
	uint64_t first = (uint64_t)off / cs, last = ((uint64_t)off + size - 1) / cs;
	uint64_t run_end = (last + 1) * (uint64_t)cs < c->size ? (last + 1) * (uint64_t)cs : c->size;
	size_t plain_len = (size_t)(run_end - first * cs);
	int direct = (uint64_t)off == first * cs && size == plain_len;
	struct bufs *b = cs_bufs_get(plain_len + (size_t)(last - first + 1) * SRCF_CHUNK_OVERHEAD,
				  direct ? 0 : plain_len);
	if (!b) {
		result = -ENOMEM;
		goto out;
	}
	uint8_t *plain = direct ? buf : b->plain;
	int r = cs_read_chunks(c, first, last, plain, plain_len, b->stored);
	if (r < 0) {
		result = r;
		goto out;
	}
	if (!direct)
		memcpy(buf, plain + ((uint64_t)off - first * cs), size);
	result = (ssize_t)size;
out:
	pthread_rwlock_unlock(&c->lock);
	return result;
}

static int srcf_size(struct sr_content *c, off_t *size)
{
	pthread_rwlock_rdlock(&c->lock);
	*size = (off_t)c->size;
	pthread_rwlock_unlock(&c->lock);
	return 0;
}

/* A closed file's logical size from its stored length and its header's chunk size (a
 * 4-byte read: the chunk size is per file). Anything unreadable shows as size 0; its
 * open reports the error. */
static void srcf_translate_stat(void *layer, int fd, struct stat *st)
{
	(void)layer;
	uint64_t size = 0;
	uint8_t field[4];
	char p[32];
	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	int rfd = open(p, O_RDONLY | O_CLOEXEC | O_NOATIME);
	if (rfd < 0 && errno == EPERM)
		rfd = open(p, O_RDONLY | O_CLOEXEC);
	if (rfd >= 0) {
		if (pread(rfd, field, 4, 8) == 4) {
			uint32_t cs = (uint32_t)field[0] << 24 | (uint32_t)field[1] << 16 | (uint32_t)field[2] << 8 | field[3];
			if (srcf_plaintext_size((uint64_t)st->st_size, cs, &size) != SRCF_OK)
				size = 0;
		}
		close(rfd);
	}
	st->st_size = (off_t)size;
}

static int srcf_flush(struct sr_content *c)
{
	(void)c;
	return 0; /* every write is sealed and written before it is acknowledged */
}

static int srcf_fsync(struct sr_content *c, int datasync)
{
	int r = datasync ? fdatasync(c->fd) : fsync(c->fd);
	return r < 0 ? -errno : 0;
}

static void srcf_release(struct sr_content *c)
{
	/* The last user closed it: every size change is complete; its journal entry goes
	 * once the flusher has made the file durable. */
	struct stat st;
	if (fstat(c->fd, &st) == 0) {
		if (c->broken)
			cs_broken_remember(&st); /* entry and undo record stay for the next start */
		else if (c->journalled)
			cs_journal_release(c, &st);
	}
	if (c->undo_fd >= 0)
		close(c->undo_fd);
	srcf_file_free(c->file);
	close(c->fd);
	pthread_rwlock_destroy(&c->lock);
	free(c);
}

static int srcf_fd(struct sr_content *c)
{
	return c->fd;
}

int sr_content_srcf_configure(uint32_t chunk_size, int journal_fd, const char *backing_path)
{
	if (srcf_abi_version() != SRCF_ABI_VERSION)
		return -1;
	cs_cfg.chunk_size = chunk_size;
	cs_cfg.journal_fd = journal_fd;
	cs_cfg.backing_path = backing_path;
	cs_cfg.backing_sync_fd = -1;
	if (journal_fd >= 0) {
		cs_cfg.backing_sync_fd = open(backing_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (cs_cfg.backing_sync_fd < 0)
			return -1;
		if (cs_journal_start() < 0)
			return -1;
	}
	return 0;
}

const struct sr_content_ops sr_content_srcf = {
	.name = "srcf",
	.init_new = srcf_init_new,
	.open = srcf_open,
	.read = srcf_read,
	.write = cs_write,
	.truncate = cs_truncate,
	.size = srcf_size,
	.translate_stat = srcf_translate_stat,
	.fallocate = cs_fallocate,
	.flush = srcf_flush,
	.fsync = srcf_fsync,
	.release = srcf_release,
	.rekey = cs_rekey,
	.fd = srcf_fd,
};
