/* Attributes: getattr, setattr (mode, owner, size, times), the set-ID bits a write
 * clears, statfs. */
#define _GNU_SOURCE
#include "fs_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static int content_truncate(struct sr_inode *inode, off_t size)
{
	int r = fs_content_get(inode, -1);
	if (r < 0)
		return r;
	if (!inode->content_writable) {
		fs_content_put(inode);
		return -EROFS;
	}
	pthread_rwlock_wrlock(&inode->io_lock);
	r = fs.cfg.content->truncate(inode->content, size);
	pthread_rwlock_unlock(&inode->io_lock);
	fs_content_put(inode);
	return r;
}
void fs_op_getattr(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	(void)fi;
	struct stat st;
	int r = fs_stat_inode(fs_inode_of(ino), &st);
	if (r < 0)
		sr_reply_err(req, -r);
	else
		sr_reply_attr(req, &st, fs.cfg.timeout);
}

/* FUSE_HANDLE_KILLPRIV_V2: a write or truncate by a caller without CAP_FSETID clears
 * set-user-ID, and set-group-ID when group-executable (as the VFS does). The daemon
 * writes as root, whom the backing file system would let keep them. chown needs nothing:
 * Linux clears them on chown even for root. */
int fs_kill_suidgid(struct sr_inode *inode)
{
	struct stat st;
	if (inode->type != S_IFREG || fstatat(inode->fd, "", &st, AT_EMPTY_PATH) < 0)
		return 0;
	mode_t kill = S_ISUID | ((st.st_mode & S_IXGRP) ? S_ISGID : 0);
	if (!(st.st_mode & kill))
		return 0;
	char p[32];
	fs_procpath(inode->fd, p);
	return chmod(p, st.st_mode & 07777 & ~kill) < 0 ? -errno : 0;
}

void fs_op_setattr(sr_req_t req, sr_ino_t ino, struct stat *attr, uint32_t valid,
		   struct sr_file_info *fi)
{
	struct sr_inode *inode = fs_inode_of(ino);
	char p[32];
	int r = fs_check(req, inode, NULL, SR_ACCESS_WRITE,
		      (valid & FATTR_SIZE) ? SR_OP_TRUNCATE : SR_OP_SETATTR);
	if (r < 0)
		goto out;
	fs_procpath(inode->fd, p);
	if (valid & FATTR_MODE) {
		if (inode == &fs.root)
			r = fchmod(fs.cfg.protected_fd, attr->st_mode & 07777);
		else if (inode->type == S_IFLNK)
			r = (errno = EOPNOTSUPP, -1); /* Linux symlinks have no mode of their own */
		else
			r = chmod(p, attr->st_mode & 07777);
		if (r < 0) {
			r = -errno;
			goto out;
		}
	}
	if (valid & (FATTR_UID | FATTR_GID)) {
		uid_t uid = (valid & FATTR_UID) ? attr->st_uid : (uid_t)-1;
		gid_t gid = (valid & FATTR_GID) ? attr->st_gid : (gid_t)-1;
		if (inode == &fs.root)
			r = fchown(fs.cfg.protected_fd, uid, gid);
		else
			r = fchownat(inode->fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
		if (r < 0) {
			r = -errno;
			goto out;
		}
	}
	if (valid & FATTR_SIZE) {
		if (fs_sealed()) {
			r = -EIO;
			goto out;
		}
		if (inode->type != S_IFREG) {
			r = inode->type == S_IFDIR ? -EISDIR : -EINVAL;
			goto out;
		}
		if (fi) {
			struct sr_handle *h = (struct sr_handle *)(uintptr_t)fi->fh;
			pthread_rwlock_wrlock(&inode->io_lock);
			r = fs.cfg.content->truncate(h->inode->content, attr->st_size);
			pthread_rwlock_unlock(&inode->io_lock);
		} else {
			r = content_truncate(inode, attr->st_size);
		}
		if (r < 0)
			goto out;
		if ((valid & FATTR_KILL_SUIDGID) && (r = fs_kill_suidgid(inode)) < 0)
			goto out;
	}
	/* FATTR_CTIME (the writeback cache's flush of times) has no backing call: the backing
	 * file's ctime moves with every change anyway. */
	if (valid & (FATTR_ATIME | FATTR_MTIME)) {
		/* Each time on its own: UTIME_OMIT keeps the one not asked for (touch -a/-m). */
		struct timespec tv[2];
		tv[0].tv_sec = 0;
		tv[1].tv_sec = 0;
		tv[0].tv_nsec = UTIME_OMIT;
		tv[1].tv_nsec = UTIME_OMIT;
		if (valid & FATTR_ATIME_NOW)
			tv[0].tv_nsec = UTIME_NOW;
		else if (valid & FATTR_ATIME)
			tv[0] = attr->st_atim;
		if (valid & FATTR_MTIME_NOW)
			tv[1].tv_nsec = UTIME_NOW;
		else if (valid & FATTR_MTIME)
			tv[1] = attr->st_mtim;
		pthread_mutex_lock(&inode->times_lock);
		if (inode->type == S_IFLNK)
			r = utimensat(inode->fd, "", tv, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
		else
			r = utimensat(AT_FDCWD, p, tv, 0);
		pthread_mutex_unlock(&inode->times_lock);
		if (r < 0) {
			r = -errno;
			goto out;
		}
	}
	r = 0;
out:
	if (r < 0) {
		sr_reply_err(req, -r);
		return;
	}
	fs_op_getattr(req, ino, NULL);
}
void fs_op_statfs(sr_req_t req, sr_ino_t ino)
{
	(void)ino;
	struct statvfs sv;
	if (fstatvfs(fs.cfg.backing_fd, &sv) < 0)
		sr_reply_err(req, errno);
	else
		sr_reply_statfs(req, &sv);
}
