/* Regular files' data path: open and create (the handle, the policy decided once),
 * read, write, flush, release, fsync, fallocate, all through the content layer. */
#define _GNU_SOURCE
#include "fs_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int open_want(int flags)
{
	int acc = flags & O_ACCMODE, want = 0;
	if (acc != O_WRONLY)
		want |= SR_ACCESS_READ;
	if (acc != O_RDONLY || (flags & O_TRUNC))
		want |= SR_ACCESS_WRITE;
	return want;
}

static int finish_open(struct sr_inode *inode, struct sr_file_info *fi, int fd_if_new)
{
	int r = fs_content_get(inode, fd_if_new);
	if (r < 0)
		return r;
	int writes = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
	if (writes && !inode->content_writable) {
		fs_content_put(inode);
		return -EROFS;
	}
	if ((fi->flags & O_TRUNC) && fd_if_new < 0) {
		pthread_rwlock_wrlock(&inode->io_lock);
		r = fs.cfg.content->truncate(inode->content, 0);
		pthread_rwlock_unlock(&inode->io_lock);
		if (r == 0 && (fi->open_flags & FUSE_OPEN_KILL_SUIDGID))
			r = fs_kill_suidgid(inode);
		if (r < 0) {
			fs_content_put(inode);
			return r;
		}
	}
	struct sr_handle *h = malloc(sizeof(*h));
	if (!h) {
		fs_content_put(inode);
		return -ENOMEM;
	}
	h->inode = inode;
	h->flags = fi->flags;
	fs_handle_add(h);
	fi->fh = (uint64_t)(uintptr_t)h;
	/* Keep the page cache across opens: every change passes through this mount. */
	fi->keep_cache = 1;
	return 0;
}

void fs_op_open(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	struct sr_inode *inode = fs_inode_of(ino);
	if (fs_sealed()) {
		sr_reply_err(req, EIO);
		return;
	}
	int r = fs_check(req, inode, NULL, open_want(fi->flags), SR_OP_OPEN);
	if (r == 0)
		r = finish_open(inode, fi, -1);
	if (r < 0) {
		sr_reply_err(req, -r);
	} else if (sr_reply_open(req, fi) == -ENOENT) {
		/* the caller was interrupted: no release will come for this handle */
		fs_content_put(inode);
		fs_handle_free((struct sr_handle *)(uintptr_t)fi->fh);
	}
}

void fs_op_create(sr_req_t req, sr_ino_t parent_ino, const char *name, mode_t mode,
		  struct sr_file_info *fi)
{
	struct sr_inode *parent = fs_inode_of(parent_ino);
	struct sr_entry_param e;
	if (fs_sealed()) {
		sr_reply_err(req, EIO);
		return;
	}
	int r = fs_check(req, parent, name, SR_ACCESS_WRITE, SR_OP_CREATE);
	if (r < 0) {
		sr_reply_err(req, -r);
		return;
	}
	int fd = openat(parent->fd, name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW, mode & 07777);
	if (fd < 0 && errno == EEXIST && !(fi->flags & O_EXCL)) {
		/* created behind the kernel's back since its lookup: open what is there */
		r = fs_do_lookup(parent, name, &e);
		if (r == 0 && !S_ISREG(e.attr.st_mode))
			r = S_ISDIR(e.attr.st_mode) ? -EISDIR : -EEXIST;
		if (r == 0) {
			r = fs_check(req, parent, name, open_want(fi->flags), SR_OP_OPEN);
			if (r == 0)
				r = finish_open(fs_inode_of(e.ino), fi, -1);
			if (r < 0)
				fs_forget_one(e.ino, 1);
		}
		if (r < 0)
			sr_reply_err(req, -r);
		else
			sr_reply_create(req, &e, fi);
		return;
	}
	if (fd < 0) {
		sr_reply_err(req, errno);
		return;
	}
	r = fs.cfg.content->init_new(fs.cfg.content_layer, fd);
	if (r == 0)
		r = fs_give_to_caller(req, parent, name, S_IFREG | mode);
	if (r == 0)
		r = fs_do_lookup(parent, name, &e);
	if (r == 0) {
		r = finish_open(fs_inode_of(e.ino), fi, fd);
		fd = -1; /* finish_open took it, or closed it */
		if (r < 0)
			fs_forget_one(e.ino, 1);
	}
	if (r < 0) {
		/* a failed create leaves nothing behind */
		if (fd >= 0)
			close(fd);
		unlinkat(parent->fd, name, 0);
		sr_reply_err(req, -r);
		return;
	}
	if (sr_reply_create(req, &e, fi) == -ENOENT) {
		fs_content_put(fs_inode_of(e.ino));
		fs_handle_free((struct sr_handle *)(uintptr_t)fi->fh);
	}
}

void fs_op_read(sr_req_t req, sr_ino_t ino, size_t size, off_t off, struct sr_file_info *fi)
{
	(void)ino;
	struct sr_handle *h = (struct sr_handle *)(uintptr_t)fi->fh;
	if (fs_sealed()) {
		sr_reply_err(req, EIO);
		return;
	}
	if (size > SR_MAX_IO)
		size = SR_MAX_IO;
	/* decrypted straight into the buffer the reply leaves from */
	char *buf = sr_reply_data_buf(req, size);
	if (!buf) {
		sr_reply_err(req, EINVAL);
		return;
	}
	pthread_rwlock_rdlock(&h->inode->io_lock);
	ssize_t n = fs.cfg.content->read(h->inode->content, buf, size, off);
	pthread_rwlock_unlock(&h->inode->io_lock);
	if (n < 0)
		sr_reply_err(req, (int)-n);
	else
		sr_reply_data(req, (size_t)n);
}

void fs_op_write(sr_req_t req, sr_ino_t ino, const char *buf, size_t size, off_t off,
		 struct sr_file_info *fi)
{
	struct sr_handle *h = (struct sr_handle *)(uintptr_t)fi->fh;
	struct sr_inode *inode = h->inode;
	ssize_t n;
	if (fs_sealed()) {
		sr_reply_err(req, EIO);
		return;
	}
	/* Writeback: the kernel placed O_APPEND writes at its own size, which is the size
	 * while it caches (and a writeback request may come through any writable handle). */
	int cached = (fi->write_flags & FUSE_WRITE_CACHE) || __atomic_load_n(&fs.writeback, __ATOMIC_ACQUIRE);
	/* Under the writeback cache the kernel owns mtime: it stamped the write() when it
	 * happened and sends SETATTR when its value changes (not when a write falls in the
	 * tick of the create). Our pwrite, later, must not restamp the backing file: its
	 * mtime is put back as it was, under times_lock so a SETATTR in between is kept. */
	int keep_mtime = (fi->write_flags & FUSE_WRITE_CACHE) != 0;
	struct stat before;
	if (keep_mtime) {
		pthread_mutex_lock(&inode->times_lock);
		if (fstatat(inode->fd, "", &before, AT_EMPTY_PATH) < 0)
			keep_mtime = -1; /* unknown: leave it to the kernel's next SETATTR */
	}
	if ((h->flags & O_APPEND) && !cached) {
		/* at the end as it is now, not where the kernel's cached size says */
		pthread_rwlock_wrlock(&inode->io_lock);
		off_t end;
		n = fs.cfg.content->size(inode->content, &end);
		if (n == 0)
			n = fs.cfg.content->write(inode->content, buf, size, end);
	} else {
		pthread_rwlock_rdlock(&inode->io_lock);
		n = fs.cfg.content->write(inode->content, buf, size, off);
	}
	pthread_rwlock_unlock(&inode->io_lock);
	if (keep_mtime) {
		if (keep_mtime > 0 && n > 0) {
			char p[32];
			struct timespec tv[2] = { { .tv_nsec = UTIME_OMIT }, before.st_mtim };
			fs_procpath(inode->fd, p);
			(void)utimensat(AT_FDCWD, p, tv, 0);
		}
		pthread_mutex_unlock(&inode->times_lock);
	}
	if (n > 0 && (fi->write_flags & FUSE_WRITE_KILL_SUIDGID)) {
		int r = fs_kill_suidgid(inode);
		if (r < 0)
			n = r;
	}
	/* O_DSYNC through the writeback cache: the kernel follows the write with FSYNC */
	if (n > 0 && (h->flags & O_DSYNC) && !(fi->write_flags & FUSE_WRITE_CACHE)) {
		int r = fs.cfg.content->fsync(inode->content, (h->flags & O_SYNC) != O_SYNC);
		if (r < 0)
			n = r;
	}
	if (n < 0) {
		sr_reply_err(req, (int)-n);
		/* A writeback request failed: the kernel keeps the pages, clean, holding what is
		 * not stored, and reports the error at the next fsync. Drop them once this reply
		 * has released them, so that reads show what the backing file holds. */
		if (fi->write_flags & FUSE_WRITE_CACHE)
			(void)sr_notify_inval_inode_later(req->se, ino, off, (off_t)size);
	} else {
		sr_reply_write(req, (size_t)n);
	}
}

void fs_op_flush(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	(void)ino;
	struct sr_handle *h = (struct sr_handle *)(uintptr_t)fi->fh;
	sr_reply_err(req, -fs.cfg.content->flush(h->inode->content));
}

void fs_op_release(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	(void)ino;
	struct sr_handle *h = (struct sr_handle *)(uintptr_t)fi->fh;
	fs_content_put(h->inode);
	fs_handle_free(h);
	sr_reply_err(req, 0);
}

void fs_op_fsync(sr_req_t req, sr_ino_t ino, int datasync, struct sr_file_info *fi)
{
	(void)ino;
	struct sr_handle *h = (struct sr_handle *)(uintptr_t)fi->fh;
	sr_reply_err(req, -fs.cfg.content->fsync(h->inode->content, datasync));
}

void fs_op_fallocate(sr_req_t req, sr_ino_t ino, int mode, off_t off, off_t len,
		     struct sr_file_info *fi)
{
	(void)ino;
	struct sr_handle *h = (struct sr_handle *)(uintptr_t)fi->fh;
	if (!fs.cfg.content->fallocate || fs_sealed()) {
		sr_reply_err(req, fs_sealed() ? EIO : EOPNOTSUPP);
		return;
	}
	pthread_rwlock_wrlock(&h->inode->io_lock);
	int r = fs.cfg.content->fallocate(h->inode->content, mode, off, len);
	pthread_rwlock_unlock(&h->inode->io_lock);
	sr_reply_err(req, -r);
}
