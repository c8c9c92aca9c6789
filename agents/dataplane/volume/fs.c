/* The file system: two inodes that never change but for the file's bytes and mtime.
 * Permissions are the kernel's (the mount has default_permissions): the file is 0600 and
 * the daemon's, so --allow-other opens it to root, not to every user. */
#define _GNU_SOURCE
#include "fs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

/* Nothing but our own writes changes what the kernel caches: attributes and entries may
 * be kept for long (the kernel still re-fetches attributes after every write). */
#define TIMEOUT 3600.0

static struct sv_fs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static int fill(struct sv_fs *fs, fuse_ino_t ino, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = fs->uid;
	st->st_gid = fs->gid;
	st->st_blksize = 4096;
	st->st_atim = st->st_ctim = st->st_mtim = fs->start;
	if (ino == SV_ROOT_INO) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
		return 0;
	}
	if (ino != SV_FILE_INO)
		return -1;
	st->st_mode = S_IFREG | 0600;
	st->st_nlink = 1;
	st->st_size = (off_t)fs->size;
	st->st_blocks = (blkcnt_t)(fs->size / 512);
	pthread_mutex_lock(&fs->lock);
	st->st_mtim = st->st_ctim = fs->mtime;
	pthread_mutex_unlock(&fs->lock);
	return 0;
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	struct sv_fs *fs = userdata;
	conn->max_write = VIO_MAX_IO;
	conn->max_read = VIO_MAX_IO;
	conn->max_readahead = VIO_MAX_IO;
	/* By default write-through: a write is on the container (not in the kernel's dirty
	 * pages) when it returns, and the file behaves exactly as a block device of its size.
	 * With --writeback-cache the kernel keeps written pages and writes them back in large
	 * requests, or at once on fsync (which a loop device's flush and FUA become): what a
	 * loop device over a plain file does, and 4 KiB random writes stop costing one round
	 * trip each (measured: 6x). The kernel then owns the file's size, so a write across
	 * the end would extend it in the cache: a loop device never writes there. */
	if (fs->writeback && (conn->capable & FUSE_CAP_WRITEBACK_CACHE))
		conn->want |= FUSE_CAP_WRITEBACK_CACHE;
	else
		conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	/* The mtime our writes move must not make the kernel drop the page cache. */
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct sv_fs *fs = fs_of(req);
	if (parent != SV_ROOT_INO || strcmp(name, fs->name)) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	struct fuse_entry_param e;
	memset(&e, 0, sizeof(e));
	e.ino = SV_FILE_INO;
	e.generation = 1;
	e.attr_timeout = e.entry_timeout = TIMEOUT;
	fill(fs, SV_FILE_INO, &e.attr);
	fuse_reply_entry(req, &e);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)fi;
	struct stat st;
	if (fill(fs_of(req), ino, &st) < 0)
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_attr(req, &st, TIMEOUT);
}

/* The size is the segment's: truncation (O_TRUNC included) is refused. chmod, chown and
 * utimes succeed and change nothing, so tools that set them after copying do not fail. */
static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set, struct fuse_file_info *fi)
{
	(void)fi;
	struct sv_fs *fs = fs_of(req);
	struct stat st;
	if (fill(fs, ino, &st) < 0) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	if ((to_set & FUSE_SET_ATTR_SIZE) && (ino != SV_FILE_INO || attr->st_size != st.st_size)) {
		fuse_reply_err(req, EPERM);
		return;
	}
	fuse_reply_attr(req, &st, TIMEOUT);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	if (ino == SV_ROOT_INO) {
		fuse_reply_err(req, EISDIR);
		return;
	}
	if (ino != SV_FILE_INO) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	/* Every change comes through us: what the kernel cached stays valid across opens. */
	fi->keep_cache = 1;
	fuse_reply_open(req, fi);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	if (ino != SV_FILE_INO || off < 0) {
		fuse_reply_err(req, ino != SV_FILE_INO ? EISDIR : EINVAL);
		return;
	}
	if (size > VIO_MAX_IO)
		size = VIO_MAX_IO;
	char *buf = malloc(size ? size : 1);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	ssize_t n = vio_read(fs_of(req)->vio, buf, size, (uint64_t)off);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	(void)fi;
	struct sv_fs *fs = fs_of(req);
	if (ino != SV_FILE_INO || off < 0) {
		fuse_reply_err(req, ino != SV_FILE_INO ? EISDIR : EINVAL);
		return;
	}
	ssize_t n = vio_write(fs->vio, buf, size, (uint64_t)off);
	if (n < 0) {
		fuse_reply_err(req, (int)-n);
		return;
	}
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	pthread_mutex_lock(&fs->lock);
	fs->mtime = now;
	pthread_mutex_unlock(&fs->lock);
	fuse_reply_write(req, (size_t)n);
}

/* Writes are on the container when they return: a close has nothing to push. */
static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

/* Data only, also for fsync: the container's own metadata (its mtime) protects nothing
 * in the volume. */
static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)ino;
	(void)datasync;
	(void)fi;
	fuse_reply_err(req, -vio_sync(fs_of(req)->vio));
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	if (ino != SV_ROOT_INO)
		fuse_reply_err(req, ino == SV_FILE_INO ? ENOTDIR : ENOENT);
	else
		fuse_reply_open(req, fi);
}

/* Three entries, their offsets 1 to 3: a listing resumes at any of them. */
static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	struct sv_fs *fs = fs_of(req);
	if (ino != SV_ROOT_INO) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	const struct {
		const char *name;
		fuse_ino_t ino;
		mode_t mode;
	} ents[] = {
		{ ".", SV_ROOT_INO, S_IFDIR },
		{ "..", SV_ROOT_INO, S_IFDIR },
		{ fs->name, SV_FILE_INO, S_IFREG },
	};
	char *buf = malloc(size ? size : 1);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	size_t used = 0;
	for (off_t i = off < 0 ? 0 : off; i < 3; i++) {
		struct stat st;
		memset(&st, 0, sizeof(st));
		st.st_ino = ents[i].ino;
		st.st_mode = ents[i].mode;
		size_t n = fuse_add_direntry(req, buf + used, size - used, ents[i].name, &st, i + 1);
		if (n > size - used)
			break;
		used += n;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

/* A full file system of one file: df shows the volume's size, none of it free. */
static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	(void)ino;
	struct sv_fs *fs = fs_of(req);
	struct statvfs sv;
	memset(&sv, 0, sizeof(sv));
	sv.f_bsize = sv.f_frsize = 4096;
	sv.f_blocks = (fsblkcnt_t)((fs->size + 4095) / 4096);
	sv.f_files = 2;
	sv.f_namemax = 255;
	fuse_reply_statfs(req, &sv);
}

const struct fuse_lowlevel_ops sv_fs_ops = {
	.init = op_init,
	.lookup = op_lookup,
	.getattr = op_getattr,
	.setattr = op_setattr,
	.open = op_open,
	.read = op_read,
	.write = op_write,
	.flush = op_flush,
	.fsync = op_fsync,
	.release = op_release,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.releasedir = op_releasedir,
	.statfs = op_statfs,
};
