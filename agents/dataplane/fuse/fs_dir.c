/* Directories: open, readdir and readdirplus (which counts a lookup per entry), fsync. */
#define _GNU_SOURCE
#include "fs_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct sr_dir {
	DIR *dp;
	off_t offset;
	struct dirent *entry;
};
void fs_op_opendir(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	struct sr_dir *d = calloc(1, sizeof(*d));
	if (!d) {
		sr_reply_err(req, ENOMEM);
		return;
	}
	int fd = openat(fs_inode_of(ino)->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || !(d->dp = fdopendir(fd))) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		free(d);
		sr_reply_err(req, e);
		return;
	}
	fi->fh = (uint64_t)(uintptr_t)d;
	sr_reply_open(req, fi);
}

static void do_readdir(sr_req_t req, sr_ino_t ino, size_t size, off_t offset,
		       struct sr_file_info *fi, int plus)
{
	struct sr_dir *d = (struct sr_dir *)(uintptr_t)fi->fh;
	struct sr_inode *dir = fs_inode_of(ino);
	if (size > SR_MAX_IO)
		size = SR_MAX_IO;
	char *buf = calloc(1, size ? size : 1);
	if (!buf) {
		sr_reply_err(req, ENOMEM);
		return;
	}
	if (offset != d->offset) {
		seekdir(d->dp, offset);
		d->entry = NULL;
		d->offset = offset;
	}
	size_t used = 0;
	int err = 0;
	for (;;) {
		if (!d->entry) {
			errno = 0;
			d->entry = readdir(d->dp);
			if (!d->entry) {
				err = errno;
				break;
			}
		}
		const char *name = d->entry->d_name;
		off_t next = d->entry->d_off;
		size_t n;
		if (plus) {
			struct sr_entry_param e;
			int is_dot = !strcmp(name, ".") || !strcmp(name, "..");
			if (is_dot) {
				memset(&e, 0, sizeof(e));
				e.attr.st_ino = d->entry->d_ino;
				e.attr.st_mode = (mode_t)d->entry->d_type << 12;
			} else {
				int r = fs_do_lookup(dir, name, &e);
				if (r < 0) {
					if (r == -ENOENT) { /* gone since readdir saw it */
						d->entry = NULL;
						d->offset = next;
						continue;
					}
					err = -r;
					break;
				}
			}
			n = sr_add_direntry_plus(req, buf + used, size - used, name, &e, next);
			if (n > size - used) {
				if (!is_dot)
					fs_forget_one(e.ino, 1);
				break;
			}
		} else {
			struct stat st;
			memset(&st, 0, sizeof(st));
			st.st_ino = d->entry->d_ino;
			st.st_mode = (mode_t)d->entry->d_type << 12;
			n = sr_add_direntry(req, buf + used, size - used, name, &st, next);
			if (n > size - used)
				break;
		}
		used += n;
		d->entry = NULL;
		d->offset = next;
	}
	if (err && used == 0)
		sr_reply_err(req, err);
	else
		sr_reply_buf(req, buf, used);
	free(buf);
}

void fs_op_readdir(sr_req_t req, sr_ino_t ino, size_t size, off_t off, struct sr_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 0);
}

void fs_op_readdirplus(sr_req_t req, sr_ino_t ino, size_t size, off_t off,
		       struct sr_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 1);
}

void fs_op_releasedir(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	(void)ino;
	struct sr_dir *d = (struct sr_dir *)(uintptr_t)fi->fh;
	closedir(d->dp);
	free(d);
	sr_reply_err(req, 0);
}

void fs_op_fsyncdir(sr_req_t req, sr_ino_t ino, int datasync, struct sr_file_info *fi)
{
	(void)ino;
	struct sr_dir *d = (struct sr_dir *)(uintptr_t)fi->fh;
	int fd = dirfd(d->dp);
	int r = datasync ? fdatasync(fd) : fsync(fd);
	sr_reply_err(req, r < 0 ? errno : 0);
}
