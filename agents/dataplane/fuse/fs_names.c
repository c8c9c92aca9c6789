/* The namespace: lookup and forget, readlink, mknod/mkdir/symlink, link, unlink, rmdir,
 * rename. Each change is checked against the policy first (write, on the names touched). */
#define _GNU_SOURCE
#include "fs_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

void fs_op_lookup(sr_req_t req, sr_ino_t parent, const char *name)
{
	struct sr_entry_param e;
	int r = fs_do_lookup(fs_inode_of(parent), name, &e);
	if (r == -ENOENT) {
		e.ino = 0; /* negative entry, not cached (entry_timeout 0) */
		e.entry_timeout = 0;
		sr_reply_entry(req, &e);
	} else if (r < 0) {
		sr_reply_err(req, -r);
	} else {
		sr_reply_entry(req, &e);
	}
}

void fs_op_forget(sr_req_t req, sr_ino_t ino, uint64_t nlookup)
{
	fs_forget_one(ino, nlookup);
	sr_reply_none(req);
}
void fs_op_readlink(sr_req_t req, sr_ino_t ino)
{
	char buf[PATH_MAX + 1];
	ssize_t n = readlinkat(fs_inode_of(ino)->fd, "", buf, sizeof(buf));
	if (n < 0)
		sr_reply_err(req, errno);
	else if (n == sizeof(buf))
		sr_reply_err(req, ENAMETOOLONG);
	else {
		buf[n] = '\0';
		sr_reply_readlink(req, buf);
	}
}

/* mkdir, mknod, symlink: create, give to the caller, look up; undo on any failure. */
static void make_node(sr_req_t req, sr_ino_t parent_ino, const char *name, mode_t mode,
		      const char *target, enum sr_op op)
{
	struct sr_inode *parent = fs_inode_of(parent_ino);
	int r = fs_check(req, parent, name, SR_ACCESS_WRITE, op);
	if (r < 0) {
		sr_reply_err(req, -r);
		return;
	}
	if (target) {
		r = symlinkat(target, parent->fd, name);
		mode = S_IFLNK | 0777;
	} else if (S_ISDIR(mode)) {
		r = mkdirat(parent->fd, name, mode & 07777);
	} else if (S_ISFIFO(mode) || S_ISSOCK(mode)) {
		r = mknodat(parent->fd, name, mode, 0);
	} else if (S_ISREG(mode)) {
		r = openat(parent->fd, name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, mode & 07777);
		if (r >= 0) {
			int fd = r;
			r = fs.cfg.content->init_new(fs.cfg.content_layer, fd);
			close(fd);
			if (r < 0) {
				unlinkat(parent->fd, name, 0);
				sr_reply_err(req, -r);
				return;
			}
		}
	} else {
		/* Device nodes stay refused: a guard point holds data, not devices. */
		sr_reply_err(req, EPERM);
		return;
	}
	if (r < 0) {
		sr_reply_err(req, errno);
		return;
	}
	struct sr_entry_param e;
	r = fs_give_to_caller(req, parent, name, mode);
	if (r == 0)
		r = fs_do_lookup(parent, name, &e);
	if (r < 0) {
		unlinkat(parent->fd, name, S_ISDIR(mode) ? AT_REMOVEDIR : 0);
		sr_reply_err(req, -r);
		return;
	}
	sr_reply_entry(req, &e);
}

void fs_op_mknod(sr_req_t req, sr_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	(void)rdev;
	make_node(req, parent, name, mode, NULL, SR_OP_MKNOD);
}

void fs_op_mkdir(sr_req_t req, sr_ino_t parent, const char *name, mode_t mode)
{
	make_node(req, parent, name, S_IFDIR | (mode & 07777), NULL, SR_OP_MKDIR);
}

void fs_op_symlink(sr_req_t req, const char *link, sr_ino_t parent, const char *name)
{
	make_node(req, parent, name, S_IFLNK | 0777, link, SR_OP_SYMLINK);
}

void fs_op_link(sr_req_t req, sr_ino_t ino, sr_ino_t newparent, const char *newname)
{
	struct sr_inode *inode = fs_inode_of(ino), *parent = fs_inode_of(newparent);
	int r = fs_check(req, parent, newname, SR_ACCESS_WRITE, SR_OP_LINK);
	if (r < 0) {
		sr_reply_err(req, -r);
		return;
	}
	char p[32];
	fs_procpath(inode->fd, p);
	if (linkat(AT_FDCWD, p, parent->fd, newname, AT_SYMLINK_FOLLOW) < 0) {
		sr_reply_err(req, errno);
		return;
	}
	struct sr_entry_param e;
	r = fs_do_lookup(parent, newname, &e);
	if (r < 0)
		sr_reply_err(req, -r);
	else
		sr_reply_entry(req, &e);
}

void fs_op_unlink(sr_req_t req, sr_ino_t parent, const char *name)
{
	struct sr_inode *dir = fs_inode_of(parent);
	int r = fs_check(req, dir, name, SR_ACCESS_WRITE, SR_OP_UNLINK);
	if (r == 0 && unlinkat(dir->fd, name, 0) < 0)
		r = -errno;
	sr_reply_err(req, -r);
}

void fs_op_rmdir(sr_req_t req, sr_ino_t parent, const char *name)
{
	struct sr_inode *dir = fs_inode_of(parent);
	int r = fs_check(req, dir, name, SR_ACCESS_WRITE, SR_OP_RMDIR);
	if (r == 0 && unlinkat(dir->fd, name, AT_REMOVEDIR) < 0)
		r = -errno;
	sr_reply_err(req, -r);
}

void fs_op_rename(sr_req_t req, sr_ino_t parent, const char *name, sr_ino_t newparent,
		  const char *newname, unsigned int flags)
{
	struct sr_inode *from = fs_inode_of(parent), *to = fs_inode_of(newparent);
	if (flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE)) {
		sr_reply_err(req, EINVAL); /* RENAME_WHITEOUT: overlay upper layers only */
		return;
	}
	int r = fs_check(req, from, name, SR_ACCESS_WRITE, SR_OP_RENAME);
	if (r == 0)
		r = fs_check(req, to, newname, SR_ACCESS_WRITE, SR_OP_RENAME);
	if (r == 0 && renameat2(from->fd, name, to->fd, newname, flags) < 0)
		r = -errno;
	sr_reply_err(req, -r);
}
