/* Online re-key of one open format v1 file (control message REKEY). */
#define _GNU_SOURCE
#include "content_srcf.h"
#include "keystore.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

/* Copy extended attributes (ACLs, labels, user.*) from one open file to another; what
 * the backing file system refuses to set is skipped. */
static void copy_xattrs(int from, int to)
{
	char names[8192], value[8192];
	ssize_t len = flistxattr(from, names, sizeof(names));
	for (ssize_t i = 0; i < len; i += (ssize_t)strlen(names + i) + 1) {
		ssize_t v = fgetxattr(from, names + i, value, sizeof(value));
		if (v >= 0)
			(void)fsetxattr(to, names + i, value, (size_t)v, 0);
	}
}

/* Online re-key (control message REKEY): the file is written anew beside itself under
 * a fresh file key wrapped by the active key version, chunk by chunk (holes stay holes),
 * made durable, and exchanged with the old one in one renameat2(RENAME_EXCHANGE); this
 * open state then continues on the new file. The caller holds the inode's io_lock
 * exclusively, so no request reads or writes the file meanwhile; an interruption leaves
 * the old file whole (and a .srtmp- file the control plane removes). */
int cs_rekey(struct sr_content *c, int dirfd, const char *name)
{
	if (!c->writable)
		return -EROFS;
	if (c->broken)
		return -EIO; /* left to its journal: a copy now would outlive the undo record */
	const srcf_key *key;
	int r = sr_key_borrow_active(&key); /* -ENOKEY before anything is written */
	if (r < 0)
		return r;
	sr_key_return(key);
	pthread_rwlock_wrlock(&c->lock);
	uint32_t cs = c->cs;
	uint64_t n = cs_chunks_of(c->size, cs), final = n - 1, per_run = cs >= (1u << 20) ? 1 : (1u << 20) / cs;
	struct stat st;
	srcf_file *nf = NULL;
	uint8_t header[SRCF_HEADER_SIZE];
	char tmp[64] = "";
	uint64_t rnd;
	int tfd = -1;
	struct bufs *b = cs_bufs_get(per_run * ((size_t)cs + SRCF_CHUNK_OVERHEAD), per_run * (size_t)cs);
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	if (fstat(c->fd, &st) < 0) {
		r = -errno;
		goto out;
	}
	/* A re-key needs room for one more copy of this file (as allocated: holes stay
	 * holes), checked before anything is written: ENOSPC says why it cannot run. */
	struct statvfs vfs;
	if (fstatvfs(c->fd, &vfs) == 0 &&
	    (uint64_t)vfs.f_bavail * vfs.f_frsize < (uint64_t)st.st_blocks * 512 + 2 * ((uint64_t)cs + SRCF_CHUNK_OVERHEAD)) {
		r = -ENOSPC;
		goto out;
	}
	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd)) {
		r = -EIO;
		goto out;
	}
	snprintf(tmp, sizeof(tmp), ".srtmp-%016llx", (unsigned long long)rnd);
	tfd = openat(dirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (tfd < 0) {
		r = -errno;
		goto out;
	}
	/* the active key version, borrowed again for the wrap of the new file key only */
	if ((r = sr_key_borrow_active(&key)) < 0)
		goto out;
	int rc = srcf_file_create(&nf, header, key, cs);
	sr_key_return(key);
	if (rc != SRCF_OK) {
		r = cs_errno(rc, c->fd);
		goto out;
	}
	if ((r = cs_io_full(tfd, header, sizeof(header), 0, 1)) < 0)
		goto out;
	for (uint64_t first = 0; first < n; first += per_run) {
		uint64_t last = first + per_run - 1 < final ? first + per_run - 1 : final;
		uint64_t end = (last + 1) * (uint64_t)cs < c->size ? (last + 1) * (uint64_t)cs : c->size;
		size_t plain_len = (size_t)(end - first * cs);
		size_t stored_len = plain_len + (size_t)(last - first + 1) * SRCF_CHUNK_OVERHEAD;
		if ((r = cs_io_full(c->fd, b->stored, stored_len, cs_chunk_off(first, cs), 0)) < 0)
			goto out;
		/* runs of chunks that are not holes: decrypted and sealed anew in place */
		uint64_t i = first;
		while (i <= last) {
			const size_t sc = (size_t)cs + SRCF_CHUNK_OVERHEAD;
			uint8_t *at = b->stored + (i - first) * sc;
			if (i != final && cs_all_zero(at, sc)) {
				i++;
				continue; /* a hole stays a hole */
			}
			uint64_t j = i;
			while (j + 1 <= last && (j + 1 == final || !cs_all_zero(b->stored + (j + 1 - first) * sc, sc)))
				j++;
			uint64_t seg_end = (j + 1) * (uint64_t)cs < c->size ? (j + 1) * (uint64_t)cs : c->size;
			size_t seg_plain = (size_t)(seg_end - i * cs), got, written;
			size_t seg_stored = seg_plain + (size_t)(j - i + 1) * SRCF_CHUNK_OVERHEAD;
			uint64_t bad;
			rc = srcf_open_run(c->file, i, final, at, seg_stored, b->plain, b->plain_cap, &got, &bad);
			if (rc == SRCF_OK)
				rc = srcf_seal_run(nf, i, final, b->plain, seg_plain, at, seg_stored, &written, NULL);
			if (rc != SRCF_OK) {
				r = cs_errno(rc, c->fd);
				goto out;
			}
			if ((r = cs_io_full(tfd, at, written, cs_chunk_off(i, cs), 1)) < 0)
				goto out;
			i = j + 1;
		}
	}
	uint64_t stored_end;
	(void)srcf_stored_size(c->size, cs, &stored_end);
	if (ftruncate(tfd, (off_t)stored_end) < 0 || fchown(tfd, st.st_uid, st.st_gid) < 0 ||
	    fchmod(tfd, st.st_mode & 07777) < 0) {
		r = -errno;
		goto out;
	}
	copy_xattrs(c->fd, tfd);
	struct timespec times[2] = { st.st_atim, st.st_mtim }; /* the content did not change */
	(void)futimens(tfd, times);
	if (fsync(tfd) < 0) {
		r = -errno;
		goto out;
	}
	if (renameat2(dirfd, tmp, dirfd, name, RENAME_EXCHANGE) < 0) {
		r = -errno;
		goto out;
	}
	struct stat moved;
	if (fstatat(dirfd, tmp, &moved, AT_SYMLINK_NOFOLLOW) < 0 || moved.st_dev != st.st_dev ||
	    moved.st_ino != st.st_ino) {
		/* the name was renamed or replaced meanwhile: put things back, try again later */
		(void)renameat2(dirfd, tmp, dirfd, name, RENAME_EXCHANGE);
		r = -EAGAIN;
		goto out;
	}
	(void)unlinkat(dirfd, tmp, 0);
	(void)fsync(dirfd);
	tmp[0] = '\0';
	close(c->fd);
	c->fd = tfd;
	tfd = -1;
	srcf_file_free(c->file);
	c->file = nf;
	nf = NULL;
	r = 0;
out:
	if (tfd >= 0) {
		close(tfd);
		if (tmp[0])
			(void)unlinkat(dirfd, tmp, 0);
	}
	srcf_file_free(nf);
	pthread_rwlock_unlock(&c->lock);
	return r;
}

