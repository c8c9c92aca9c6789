/* Replies to the kernel: each operation's answer laid out as the protocol wants it, then
 * handed to the request's channel (/dev/fuse or an io_uring entry). */
#define _GNU_SOURCE
#include "session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- replies ---------------------------------------------------------------------- */
static int send_reply(sr_req_t req, int err, struct iovec *iov, int count)
{
	struct fuse_out_header out;
	size_t len = sizeof(out);
	for (int i = 1; i < count; i++)
		len += iov[i].iov_len;
	out.unique = req->unique;
	out.error = err ? -err : 0;
	out.len = (uint32_t)len;
	iov[0].iov_base = &out;
	iov[0].iov_len = sizeof(out);
	req->replied = 1;
	if (req->se->opts.debug)
		fprintf(stderr, "   unique: %llu, error: %d, outsize: %zu\n",
			(unsigned long long)req->unique, out.error, len);
	return req->chan->send(req, iov, count);
}

int sr_reply_args(sr_req_t req, const void *arg, size_t len)
{
	struct iovec iov[2] = { { NULL, 0 }, { (void *)arg, len } };
	return send_reply(req, 0, iov, len ? 2 : 1);
}

int sr_reply_err(sr_req_t req, int err)
{
	struct iovec iov[1];
	if (err < 0 || err >= 4096)
		err = EIO; /* never a positive "error" the kernel would take as a length */
	return send_reply(req, err, iov, 1);
}

void sr_reply_none(sr_req_t req)
{
	/* No reply; sr_dispatch tells the channel once the operation returns. */
	req->replied = 1;
}

static void timeout_split(double t, uint64_t *sec, uint32_t *nsec)
{
	if (t < 0)
		t = 0;
	*sec = (uint64_t)t;
	*nsec = (uint32_t)((t - (double)*sec) * 1e9);
	if (*nsec >= 1000000000u)
		*nsec = 999999999u;
}

static void fill_attr(struct fuse_attr *a, const struct stat *st)
{
	memset(a, 0, sizeof(*a));
	a->ino = st->st_ino;
	a->mode = st->st_mode;
	a->nlink = (uint32_t)st->st_nlink;
	a->uid = st->st_uid;
	a->gid = st->st_gid;
	a->rdev = (uint32_t)st->st_rdev;
	a->size = (uint64_t)st->st_size;
	a->blksize = (uint32_t)st->st_blksize;
	a->blocks = (uint64_t)st->st_blocks;
	a->atime = (uint64_t)st->st_atim.tv_sec;
	a->mtime = (uint64_t)st->st_mtim.tv_sec;
	a->ctime = (uint64_t)st->st_ctim.tv_sec;
	a->atimensec = (uint32_t)st->st_atim.tv_nsec;
	a->mtimensec = (uint32_t)st->st_mtim.tv_nsec;
	a->ctimensec = (uint32_t)st->st_ctim.tv_nsec;
}

static void fill_entry(struct fuse_entry_out *o, const struct sr_entry_param *e)
{
	memset(o, 0, sizeof(*o));
	o->nodeid = e->ino;
	o->generation = e->generation;
	timeout_split(e->entry_timeout, &o->entry_valid, &o->entry_valid_nsec);
	timeout_split(e->attr_timeout, &o->attr_valid, &o->attr_valid_nsec);
	fill_attr(&o->attr, &e->attr);
}

static void fill_open(struct fuse_open_out *o, const struct sr_file_info *fi)
{
	memset(o, 0, sizeof(*o));
	o->fh = fi->fh;
	if (fi->keep_cache)
		o->open_flags |= FOPEN_KEEP_CACHE;
	if (fi->direct_io)
		o->open_flags |= FOPEN_DIRECT_IO;
	if (fi->parallel_direct_writes)
		o->open_flags |= FOPEN_PARALLEL_DIRECT_WRITES;
}

int sr_reply_entry(sr_req_t req, const struct sr_entry_param *e)
{
	struct fuse_entry_out o;
	fill_entry(&o, e);
	return sr_reply_args(req, &o, sizeof(o));
}

int sr_reply_create(sr_req_t req, const struct sr_entry_param *e, const struct sr_file_info *fi)
{
	struct {
		struct fuse_entry_out e;
		struct fuse_open_out o;
	} out;
	fill_entry(&out.e, e);
	fill_open(&out.o, fi);
	return sr_reply_args(req, &out, sizeof(out));
}

int sr_reply_attr(sr_req_t req, const struct stat *attr, double timeout)
{
	struct fuse_attr_out o;
	memset(&o, 0, sizeof(o));
	timeout_split(timeout, &o.attr_valid, &o.attr_valid_nsec);
	fill_attr(&o.attr, attr);
	return sr_reply_args(req, &o, sizeof(o));
}

int sr_reply_readlink(sr_req_t req, const char *link)
{
	return sr_reply_args(req, link, strlen(link));
}

int sr_reply_open(sr_req_t req, const struct sr_file_info *fi)
{
	struct fuse_open_out o;
	fill_open(&o, fi);
	return sr_reply_args(req, &o, sizeof(o));
}

int sr_reply_write(sr_req_t req, size_t count)
{
	struct fuse_write_out o = { .size = (uint32_t)count };
	return sr_reply_args(req, &o, sizeof(o));
}

int sr_reply_buf(sr_req_t req, const void *buf, size_t size)
{
	return sr_reply_args(req, buf, size);
}

int sr_reply_statfs(sr_req_t req, const struct statvfs *st)
{
	struct fuse_statfs_out o;
	memset(&o, 0, sizeof(o));
	o.st.blocks = st->f_blocks;
	o.st.bfree = st->f_bfree;
	o.st.bavail = st->f_bavail;
	o.st.files = st->f_files;
	o.st.ffree = st->f_ffree;
	o.st.bsize = (uint32_t)st->f_bsize;
	o.st.namelen = (uint32_t)st->f_namemax;
	o.st.frsize = (uint32_t)st->f_frsize;
	return sr_reply_args(req, &o, sizeof(o));
}

int sr_reply_xattr(sr_req_t req, size_t count)
{
	struct fuse_getxattr_out o = { .size = (uint32_t)count };
	return sr_reply_args(req, &o, sizeof(o));
}

void *sr_reply_data_buf(sr_req_t req, size_t size)
{
	void *b = req->chan->data_buf ? req->chan->data_buf(req, size) : NULL;
	if (!b && size <= req->scratch_len)
		b = req->scratch;
	req->data = b;
	return b;
}

/* Sends what sr_reply_data_buf handed out (asking again with the shorter count could
 * name another buffer). */
int sr_reply_data(sr_req_t req, size_t count)
{
	if (!req->data)
		return sr_reply_err(req, EIO);
	return sr_reply_args(req, req->data, count);
}

/* The dirent and its name, zero-padded to `end` (the entry's aligned length). */
static void fill_dirent(struct fuse_dirent *d, char *end, const char *name, size_t namelen,
			const struct stat *st, off_t off)
{
	d->ino = st->st_ino;
	d->off = (uint64_t)off;
	d->namelen = (uint32_t)namelen;
	d->type = (st->st_mode & S_IFMT) >> 12;
	memcpy(d->name, name, namelen);
	memset(d->name + namelen, 0, (size_t)(end - (d->name + namelen)));
}

size_t sr_add_direntry(sr_req_t req, char *buf, size_t bufsize, const char *name,
		       const struct stat *st, off_t off)
{
	(void)req;
	size_t namelen = strlen(name);
	size_t len = FUSE_DIRENT_ALIGN(FUSE_NAME_OFFSET + namelen);
	if (!buf || len > bufsize)
		return len;
	fill_dirent((struct fuse_dirent *)buf, buf + len, name, namelen, st, off);
	return len;
}

size_t sr_add_direntry_plus(sr_req_t req, char *buf, size_t bufsize, const char *name,
			    const struct sr_entry_param *e, off_t off)
{
	(void)req;
	size_t namelen = strlen(name);
	size_t len = FUSE_DIRENT_ALIGN(FUSE_NAME_OFFSET_DIRENTPLUS + namelen);
	if (!buf || len > bufsize)
		return len;
	struct fuse_direntplus *dp = (struct fuse_direntplus *)buf;
	fill_entry(&dp->entry_out, e);
	fill_dirent(&dp->dirent, buf + len, name, namelen, &e->attr, off);
	return len;
}

const struct sr_ctx *sr_req_ctx(sr_req_t req)
{
	return &req->ctx;
}

int sr_req_getgroups(sr_req_t req, int size, gid_t list[])
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)req->ctx.pid, (int)req->ctx.pid);
	FILE *f = fopen(path, "re");
	if (!f) {
		snprintf(path, sizeof(path), "/proc/%d/status", (int)req->ctx.pid);
		f = fopen(path, "re");
	}
	if (!f)
		return -errno;
	char line[4096];
	int n = -EIO;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "Groups:", 7))
			continue;
		n = 0;
		char *p = line + 7, *end;
		for (;;) {
			unsigned long g = strtoul(p, &end, 10);
			if (end == p)
				break;
			if (n < size)
				list[n] = (gid_t)g;
			n++;
			p = end;
		}
		break;
	}
	fclose(f);
	return n;
}

/* ---- INIT ------------------------------------------------------------------------- */
