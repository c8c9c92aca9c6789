/* Extended attributes: through /proc/self/fd (no f*xattr on O_PATH). User xattrs on
 * symlinks answer like Linux: none to read, EPERM on set. */
#define _GNU_SOURCE
#include "fs_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/xattr.h>

void fs_op_getxattr(sr_req_t req, sr_ino_t ino, const char *name, size_t size)
{
	struct sr_inode *inode = fs_inode_of(ino);
	char p[32];
	if (inode->type == S_IFLNK) {
		sr_reply_err(req, ENODATA);
		return;
	}
	fs_procpath(inode->fd, p);
	if (size == 0) {
		ssize_t n = getxattr(p, name, NULL, 0);
		if (n < 0)
			sr_reply_err(req, errno);
		else
			sr_reply_xattr(req, (size_t)n);
		return;
	}
	char *buf = malloc(size);
	if (!buf) {
		sr_reply_err(req, ENOMEM);
		return;
	}
	ssize_t n = getxattr(p, name, buf, size);
	if (n < 0)
		sr_reply_err(req, errno);
	else
		sr_reply_buf(req, buf, (size_t)n);
	free(buf);
}

void fs_op_listxattr(sr_req_t req, sr_ino_t ino, size_t size)
{
	struct sr_inode *inode = fs_inode_of(ino);
	char p[32];
	if (inode->type == S_IFLNK) {
		if (size == 0)
			sr_reply_xattr(req, 0);
		else
			sr_reply_buf(req, NULL, 0);
		return;
	}
	fs_procpath(inode->fd, p);
	if (size == 0) {
		ssize_t n = listxattr(p, NULL, 0);
		if (n < 0)
			sr_reply_err(req, errno);
		else
			sr_reply_xattr(req, (size_t)n);
		return;
	}
	char *buf = malloc(size);
	if (!buf) {
		sr_reply_err(req, ENOMEM);
		return;
	}
	ssize_t n = listxattr(p, buf, size);
	if (n < 0)
		sr_reply_err(req, errno);
	else
		sr_reply_buf(req, buf, (size_t)n);
	free(buf);
}

void fs_op_setxattr(sr_req_t req, sr_ino_t ino, const char *name, const char *value,
		    size_t size, int flags)
{
	struct sr_inode *inode = fs_inode_of(ino);
	char p[32];
	int r = fs_check(req, inode, NULL, SR_ACCESS_WRITE, SR_OP_SETXATTR);
	if (r == 0 && inode->type == S_IFLNK)
		r = -EPERM; /* as Linux answers for user.* on a symlink */
	if (r == 0) {
		fs_procpath(inode->fd, p);
		if (setxattr(p, name, value, size, flags) < 0)
			r = -errno;
	}
	sr_reply_err(req, -r);
}

void fs_op_removexattr(sr_req_t req, sr_ino_t ino, const char *name)
{
	struct sr_inode *inode = fs_inode_of(ino);
	char p[32];
	int r = fs_check(req, inode, NULL, SR_ACCESS_WRITE, SR_OP_REMOVEXATTR);
	if (r == 0 && inode->type == S_IFLNK)
		r = -ENODATA;
	if (r == 0) {
		fs_procpath(inode->fd, p);
		if (removexattr(p, name) < 0)
			r = -errno;
	}
	sr_reply_err(req, -r);
}
