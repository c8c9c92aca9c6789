/* The FUSE kernel protocol over /dev/fuse, spoken directly (transport.h says why).
 *
 * One request at a time per thread: read() one request into the thread's buffer,
 * dispatch it (every length checked against its opcode before anything is read), the
 * operation replies with one writev(). The kernel hands each request to one reader, so
 * threads share the descriptor; the request buffer doubles as the reply buffer of a READ
 * (sr_reply_data_buf), so a read is decrypted once, straight into what the kernel copies
 * out. INIT is negotiated here: the operations' init decides what it wants of what the
 * kernel offers, and that is all the kernel gets. */
#define _GNU_SOURCE
#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

struct sr_session {
	struct sr_ops ops;
	void *userdata;
	struct sr_session_opts opts;
	char *mountpoint;
	char *fsname;
	int fd;
	int exited;
	int initialized;
	int uring_running;
	struct sr_conn conn;
	uint64_t want;
	char features[192];
	size_t bufsize;
	pthread_mutex_t lock;
	pthread_cond_t ended_cond;
	int ended;
	int loop_error;
	/* sr_notify_inval_inode_later: a ring of pending invalidations and its thread */
	pthread_mutex_t inval_lock;
	pthread_cond_t inval_cond;
	pthread_t inval_thread;
	int inval_started, inval_stop;
	unsigned inval_head, inval_count;
	uint64_t inval_dropped;
	struct { sr_ino_t ino; off_t off, len; } inval[1024];
};

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

static int reply_args(sr_req_t req, const void *arg, size_t len)
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
	return reply_args(req, &o, sizeof(o));
}

int sr_reply_create(sr_req_t req, const struct sr_entry_param *e, const struct sr_file_info *fi)
{
	struct {
		struct fuse_entry_out e;
		struct fuse_open_out o;
	} out;
	fill_entry(&out.e, e);
	fill_open(&out.o, fi);
	return reply_args(req, &out, sizeof(out));
}

int sr_reply_attr(sr_req_t req, const struct stat *attr, double timeout)
{
	struct fuse_attr_out o;
	memset(&o, 0, sizeof(o));
	timeout_split(timeout, &o.attr_valid, &o.attr_valid_nsec);
	fill_attr(&o.attr, attr);
	return reply_args(req, &o, sizeof(o));
}

int sr_reply_readlink(sr_req_t req, const char *link)
{
	return reply_args(req, link, strlen(link));
}

int sr_reply_open(sr_req_t req, const struct sr_file_info *fi)
{
	struct fuse_open_out o;
	fill_open(&o, fi);
	return reply_args(req, &o, sizeof(o));
}

int sr_reply_write(sr_req_t req, size_t count)
{
	struct fuse_write_out o = { .size = (uint32_t)count };
	return reply_args(req, &o, sizeof(o));
}

int sr_reply_buf(sr_req_t req, const void *buf, size_t size)
{
	return reply_args(req, buf, size);
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
	return reply_args(req, &o, sizeof(o));
}

int sr_reply_xattr(sr_req_t req, size_t count)
{
	struct fuse_getxattr_out o = { .size = (uint32_t)count };
	return reply_args(req, &o, sizeof(o));
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
	return reply_args(req, req->data, count);
}

size_t sr_add_direntry(sr_req_t req, char *buf, size_t bufsize, const char *name,
		       const struct stat *st, off_t off)
{
	(void)req;
	size_t namelen = strlen(name);
	size_t len = FUSE_DIRENT_ALIGN(FUSE_NAME_OFFSET + namelen);
	if (!buf || len > bufsize)
		return len;
	struct fuse_dirent *d = (struct fuse_dirent *)buf;
	d->ino = st->st_ino;
	d->off = (uint64_t)off;
	d->namelen = (uint32_t)namelen;
	d->type = (st->st_mode & S_IFMT) >> 12;
	memcpy(d->name, name, namelen);
	memset(d->name + namelen, 0, len - FUSE_NAME_OFFSET - namelen);
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
	dp->dirent.ino = e->attr.st_ino;
	dp->dirent.off = (uint64_t)off;
	dp->dirent.namelen = (uint32_t)namelen;
	dp->dirent.type = (e->attr.st_mode & S_IFMT) >> 12;
	memcpy(dp->dirent.name, name, namelen);
	memset(dp->dirent.name + namelen, 0, len - FUSE_NAME_OFFSET_DIRENTPLUS - namelen);
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
#define SR_INIT_ALWAYS (FUSE_INIT_EXT | FUSE_MAX_PAGES)

static void feature_add(char *buf, size_t len, const char *what)
{
	size_t used = strlen(buf);
	snprintf(buf + used, len - used, "%s%s", used ? " " : "", what);
}

static void do_init(struct sr_session *se, sr_req_t req, const struct fuse_init_in *in)
{
	struct fuse_init_out out;
	memset(&out, 0, sizeof(out));
	out.major = FUSE_KERNEL_VERSION;
	out.minor = SR_FUSE_MINOR;
	if (in->major < 7) {
		sr_reply_err(req, EPROTO);
		return;
	}
	if (in->major > 7) {
		/* the kernel asks again with ours */
		reply_args(req, &out, sizeof(out));
		return;
	}
	uint64_t capable = in->flags;
	if (in->flags & FUSE_INIT_EXT)
		capable |= (uint64_t)in->flags2 << 32;
	struct sr_conn *c = &se->conn;
	memset(c, 0, sizeof(*c));
	c->major = in->major;
	c->minor = in->minor;
	c->capable = capable;
	c->max_write = SR_REPLY_SCRATCH;
	c->max_read = SR_REPLY_SCRATCH;
	c->max_readahead = in->max_readahead;
	if (se->ops.init)
		se->ops.init(se->userdata, c);
	if (in->minor < SR_FUSE_MINOR)
		c->want &= ~FUSE_OVER_IO_URING;
	if (c->max_write > SR_REPLY_SCRATCH)
		c->max_write = SR_REPLY_SCRATCH;
	/* max_readahead is not capped at the kernel's offer: the kernel keeps the smaller of
	 * ours and its device's current value, which main() raises before INIT is answered. */
	uint64_t want = (c->want & capable) | (SR_INIT_ALWAYS & capable);
	se->want = want;
	out.minor = in->minor < SR_FUSE_MINOR ? in->minor : SR_FUSE_MINOR;
	out.flags = (uint32_t)want;
	out.flags2 = (uint32_t)(want >> 32);
	out.max_readahead = c->max_readahead;
	out.max_write = c->max_write;
	out.max_pages = (uint16_t)(c->max_write / 4096 ? c->max_write / 4096 : 1);
	out.max_background = c->max_background;
	out.congestion_threshold = c->congestion_threshold;
	out.time_gran = c->time_gran ? c->time_gran : 1;

	char *f = se->features;
	f[0] = 0;
	char ver[32];
	snprintf(ver, sizeof(ver), "7.%u", in->minor);
	feature_add(f, sizeof(se->features), ver);
	feature_add(f, sizeof(se->features), (want & FUSE_OVER_IO_URING) ? "uring" : "dev");
	static const struct { uint64_t flag; const char *name; } named[] = {
		{ FUSE_WRITEBACK_CACHE, "writeback_cache" },
		{ FUSE_HANDLE_KILLPRIV_V2, "killpriv_v2" },
		{ FUSE_PARALLEL_DIROPS, "parallel_dirops" },
		{ FUSE_ASYNC_DIO, "async_dio" },
		{ FUSE_DO_READDIRPLUS, "readdirplus" },
	};
	for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++)
		if (want & named[i].flag)
			feature_add(f, sizeof(se->features), named[i].name);
	char lim[96];
	snprintf(lim, sizeof(lim), "max_write=%u max_pages=%u threads=%d", out.max_write,
		 out.max_pages, se->opts.threads);
	feature_add(f, sizeof(se->features), lim);

	size_t outlen = sizeof(out);
	if (in->minor < 5)
		outlen = FUSE_COMPAT_INIT_OUT_SIZE;
	else if (in->minor < 23)
		outlen = FUSE_COMPAT_22_INIT_OUT_SIZE;
	/* Before the reply: the kernel hands the next request to another thread as soon as
	 * it has it, and that request must not meet "not initialized". */
	__atomic_store_n(&se->initialized, 1, __ATOMIC_RELEASE);
	if (reply_args(req, &out, outlen) == 0 && se->fd >= 0)
		fprintf(stderr, "strongroom-fuse: transport %s\n", se->features);
}

/* ---- dispatch --------------------------------------------------------------------- */
long sr_op_arg_size(uint32_t opcode)
{
	switch (opcode) {
	case FUSE_INIT: return (long)sizeof(struct fuse_init_in);
	case FUSE_DESTROY: case FUSE_LOOKUP: case FUSE_READLINK: case FUSE_SYMLINK:
	case FUSE_UNLINK: case FUSE_RMDIR: case FUSE_REMOVEXATTR: case FUSE_STATFS:
		return 0;
	case FUSE_FORGET: return (long)sizeof(struct fuse_forget_in);
	case FUSE_BATCH_FORGET: return (long)sizeof(struct fuse_batch_forget_in);
	case FUSE_GETATTR: return (long)sizeof(struct fuse_getattr_in);
	case FUSE_SETATTR: return (long)sizeof(struct fuse_setattr_in);
	case FUSE_MKNOD: return (long)sizeof(struct fuse_mknod_in);
	case FUSE_MKDIR: return (long)sizeof(struct fuse_mkdir_in);
	case FUSE_RENAME: return (long)sizeof(struct fuse_rename_in);
	case FUSE_RENAME2: return (long)sizeof(struct fuse_rename2_in);
	case FUSE_LINK: return (long)sizeof(struct fuse_link_in);
	case FUSE_OPEN: case FUSE_OPENDIR: return (long)sizeof(struct fuse_open_in);
	case FUSE_CREATE: return (long)sizeof(struct fuse_create_in);
	case FUSE_READ: case FUSE_READDIR: case FUSE_READDIRPLUS:
		return (long)sizeof(struct fuse_read_in);
	case FUSE_WRITE: return (long)sizeof(struct fuse_write_in);
	case FUSE_RELEASE: case FUSE_RELEASEDIR: return (long)sizeof(struct fuse_release_in);
	case FUSE_FSYNC: case FUSE_FSYNCDIR: return (long)sizeof(struct fuse_fsync_in);
	case FUSE_FLUSH: return (long)sizeof(struct fuse_flush_in);
	case FUSE_SETXATTR: return FUSE_COMPAT_SETXATTR_IN_SIZE; /* no FUSE_SETXATTR_EXT */
	case FUSE_GETXATTR: case FUSE_LISTXATTR: return (long)sizeof(struct fuse_getxattr_in);
	case FUSE_FALLOCATE: return (long)sizeof(struct fuse_fallocate_in);
	case FUSE_INTERRUPT: return (long)sizeof(struct fuse_interrupt_in);
	case FUSE_ACCESS: return (long)sizeof(struct fuse_access_in);
	case FUSE_LSEEK: return (long)sizeof(struct fuse_lseek_in);
	case FUSE_COPY_FILE_RANGE: return (long)sizeof(struct fuse_copy_file_range_in);
	default: return -1;
	}
}

/* The next NUL-terminated string in [*p, end): NULL when there is none. */
static const char *take_name(const char **p, const char *end)
{
	const char *s = *p;
	if (s >= end)
		return NULL;
	const char *nul = memchr(s, 0, (size_t)(end - s));
	if (!nul)
		return NULL;
	*p = nul + 1;
	return s;
}

static void file_info(struct sr_file_info *fi, uint64_t fh)
{
	memset(fi, 0, sizeof(*fi));
	fi->fh = fh;
}

static const char *opname(uint32_t op)
{
	static const char *const names[] = {
		[1] = "LOOKUP",
		[2] = "FORGET",
		[3] = "GETATTR",
		[4] = "SETATTR",
		[5] = "READLINK",
		[6] = "SYMLINK",
		[8] = "MKNOD",
		[9] = "MKDIR",
		[10] = "UNLINK",
		[11] = "RMDIR",
		[12] = "RENAME",
		[13] = "LINK",
		[14] = "OPEN",
		[15] = "READ",
		[16] = "WRITE",
		[17] = "STATFS",
		[18] = "RELEASE",
		[20] = "FSYNC",
		[21] = "SETXATTR",
		[22] = "GETXATTR",
		[23] = "LISTXATTR",
		[24] = "REMOVEXATTR",
		[25] = "FLUSH",
		[26] = "INIT",
		[27] = "OPENDIR",
		[28] = "READDIR",
		[29] = "RELEASEDIR",
		[30] = "FSYNCDIR",
		[31] = "GETLK",
		[32] = "SETLK",
		[33] = "SETLKW",
		[34] = "ACCESS",
		[35] = "CREATE",
		[36] = "INTERRUPT",
		[37] = "BMAP",
		[38] = "DESTROY",
		[39] = "IOCTL",
		[40] = "POLL",
		[41] = "NOTIFY_REPLY",
		[42] = "BATCH_FORGET",
		[43] = "FALLOCATE",
		[44] = "READDIRPLUS",
		[45] = "RENAME2",
		[46] = "LSEEK",
		[47] = "COPY_FILE_RANGE",
		[48] = "SETUPMAPPING",
		[49] = "REMOVEMAPPING",
		[50] = "SYNCFS",
		[51] = "TMPFILE",
		[52] = "STATX",
	};
	return op < sizeof(names) / sizeof(names[0]) && names[op] ? names[op] : "UNKNOWN";
}

static int takes_no_reply(uint32_t opcode)
{
	return opcode == FUSE_FORGET || opcode == FUSE_BATCH_FORGET || opcode == FUSE_INTERRUPT ||
	       opcode == FUSE_NOTIFY_REPLY;
}

/* A request that cannot be served: an error reply, or nothing for one that takes none
 * (the kernel waits for no answer to FORGET; a reply to it would be taken for another's). */
static void refuse(struct sr_req *req, int err)
{
	if (takes_no_reply(req->opcode))
		req->replied = 1;
	else
		sr_reply_err(req, err);
}

#define CALL(op, ...) do { if (se->ops.op) se->ops.op(__VA_ARGS__); else sr_reply_err(req, ENOSYS); } while (0)

static void dispatch(struct sr_req *req, const struct fuse_in_header *in, const void *op, size_t oplen,
		     const char *pay, size_t paylen)
{
	struct sr_session *se = req->se;
	const char *p = pay, *end = pay + paylen;
	const char *name, *name2;
	struct sr_file_info fi;
	sr_ino_t ino = in->nodeid;
	long need = sr_op_arg_size(in->opcode);

	req->unique = in->unique;
	req->opcode = in->opcode;
	req->ctx.uid = in->uid;
	req->ctx.gid = in->gid;
	req->ctx.pid = (pid_t)in->pid;
	if (se->opts.debug)
		fprintf(stderr, "unique: %llu, opcode: %s (%u), nodeid: %llu, insize: %zu, pid: %u\n",
			(unsigned long long)in->unique, opname(in->opcode), in->opcode,
			(unsigned long long)in->nodeid, sizeof(*in) + oplen + paylen, in->pid);
	if (in->opcode == FUSE_INTERRUPT || in->opcode == FUSE_NOTIFY_REPLY) {
		/* Operations finish promptly and are not cancelled; a NOTIFY_REPLY answers a
		 * retrieve we never send. Neither takes a reply. */
		req->replied = 1;
		return;
	}
	if (need < 0) {
		refuse(req, ENOSYS);
		return;
	}
	if (oplen < (size_t)need || (oplen > (size_t)need && need == 0)) {
		refuse(req, EINVAL);
		return;
	}
	if (!__atomic_load_n(&se->initialized, __ATOMIC_ACQUIRE) && in->opcode != FUSE_INIT) {
		refuse(req, EIO);
		return;
	}

	switch (in->opcode) {
	case FUSE_INIT:
		do_init(se, req, op);
		return;
	case FUSE_DESTROY:
		sr_reply_err(req, 0);
		return;
	case FUSE_LOOKUP:
		if (!(name = take_name(&p, end)))
			break;
		CALL(lookup, req, ino, name);
		return;
	case FUSE_FORGET: {
		const struct fuse_forget_in *a = op;
		if (se->ops.forget)
			se->ops.forget(req, ino, a->nlookup);
		req->replied = 1;
		return;
	}
	case FUSE_BATCH_FORGET: {
		const struct fuse_batch_forget_in *a = op;
		if (a->count > paylen / sizeof(struct fuse_forget_one)) {
			req->replied = 1; /* cannot be answered: drop it */
			return;
		}
		const struct fuse_forget_one *one = (const void *)pay;
		for (uint32_t i = 0; i < a->count; i++) {
			struct fuse_forget_one f;
			memcpy(&f, one + i, sizeof(f));
			if (se->ops.forget)
				se->ops.forget(req, f.nodeid, f.nlookup);
		}
		req->replied = 1;
		return;
	}
	case FUSE_GETATTR: {
		const struct fuse_getattr_in *a = op;
		if (a->getattr_flags & FUSE_GETATTR_FH) {
			file_info(&fi, a->fh);
			CALL(getattr, req, ino, &fi);
		} else {
			CALL(getattr, req, ino, NULL);
		}
		return;
	}
	case FUSE_SETATTR: {
		const struct fuse_setattr_in *a = op;
		struct stat st;
		memset(&st, 0, sizeof(st));
		st.st_mode = a->mode;
		st.st_uid = a->uid;
		st.st_gid = a->gid;
		st.st_size = (off_t)a->size;
		st.st_atim.tv_sec = (time_t)a->atime;
		st.st_atim.tv_nsec = a->atimensec;
		st.st_mtim.tv_sec = (time_t)a->mtime;
		st.st_mtim.tv_nsec = a->mtimensec;
		st.st_ctim.tv_sec = (time_t)a->ctime;
		st.st_ctim.tv_nsec = a->ctimensec;
		if (a->valid & FATTR_FH) {
			file_info(&fi, a->fh);
			CALL(setattr, req, ino, &st, a->valid, &fi);
		} else {
			CALL(setattr, req, ino, &st, a->valid, NULL);
		}
		return;
	}
	case FUSE_READLINK:
		CALL(readlink, req, ino);
		return;
	case FUSE_SYMLINK:
		if (!(name = take_name(&p, end)) || !(name2 = take_name(&p, end)))
			break;
		CALL(symlink, req, name2, ino, name);
		return;
	case FUSE_MKNOD: {
		const struct fuse_mknod_in *a = op;
		if (!(name = take_name(&p, end)))
			break;
		CALL(mknod, req, ino, name, a->mode, a->rdev);
		return;
	}
	case FUSE_MKDIR: {
		const struct fuse_mkdir_in *a = op;
		if (!(name = take_name(&p, end)))
			break;
		CALL(mkdir, req, ino, name, a->mode);
		return;
	}
	case FUSE_UNLINK:
		if (!(name = take_name(&p, end)))
			break;
		CALL(unlink, req, ino, name);
		return;
	case FUSE_RMDIR:
		if (!(name = take_name(&p, end)))
			break;
		CALL(rmdir, req, ino, name);
		return;
	case FUSE_RENAME: case FUSE_RENAME2: {
		uint64_t newdir;
		unsigned flags = 0;
		if (in->opcode == FUSE_RENAME) {
			newdir = ((const struct fuse_rename_in *)op)->newdir;
		} else {
			const struct fuse_rename2_in *a = op;
			newdir = a->newdir;
			flags = a->flags;
		}
		if (!(name = take_name(&p, end)) || !(name2 = take_name(&p, end)))
			break;
		CALL(rename, req, ino, name, newdir, name2, flags);
		return;
	}
	case FUSE_LINK: {
		const struct fuse_link_in *a = op;
		if (!(name = take_name(&p, end)))
			break;
		CALL(link, req, a->oldnodeid, ino, name);
		return;
	}
	case FUSE_OPEN: case FUSE_OPENDIR: {
		const struct fuse_open_in *a = op;
		file_info(&fi, 0);
		fi.flags = (int)a->flags;
		fi.open_flags = a->open_flags;
		if (in->opcode == FUSE_OPEN)
			CALL(open, req, ino, &fi);
		else if (se->ops.opendir)
			se->ops.opendir(req, ino, &fi);
		else
			sr_reply_open(req, &fi);
		return;
	}
	case FUSE_CREATE: {
		const struct fuse_create_in *a = op;
		if (!(name = take_name(&p, end)))
			break;
		file_info(&fi, 0);
		fi.flags = (int)a->flags;
		fi.open_flags = a->open_flags;
		CALL(create, req, ino, name, a->mode, &fi);
		return;
	}
	case FUSE_READ: case FUSE_READDIR: case FUSE_READDIRPLUS: {
		const struct fuse_read_in *a = op;
		file_info(&fi, a->fh);
		fi.flags = (int)a->flags;
		fi.lock_owner = a->lock_owner;
		if (a->offset > (uint64_t)INT64_MAX)
			break;
		if (in->opcode == FUSE_READ)
			CALL(read, req, ino, a->size, (off_t)a->offset, &fi);
		else if (in->opcode == FUSE_READDIR)
			CALL(readdir, req, ino, a->size, (off_t)a->offset, &fi);
		else
			CALL(readdirplus, req, ino, a->size, (off_t)a->offset, &fi);
		return;
	}
	case FUSE_WRITE: {
		const struct fuse_write_in *a = op;
		if (a->size > paylen || a->offset > (uint64_t)INT64_MAX)
			break;
		file_info(&fi, a->fh);
		fi.flags = (int)a->flags;
		fi.write_flags = a->write_flags;
		fi.lock_owner = a->lock_owner;
		CALL(write, req, ino, pay, a->size, (off_t)a->offset, &fi);
		return;
	}
	case FUSE_FLUSH: {
		const struct fuse_flush_in *a = op;
		file_info(&fi, a->fh);
		fi.lock_owner = a->lock_owner;
		CALL(flush, req, ino, &fi);
		return;
	}
	case FUSE_RELEASE: case FUSE_RELEASEDIR: {
		const struct fuse_release_in *a = op;
		file_info(&fi, a->fh);
		fi.flags = (int)a->flags;
		fi.lock_owner = a->lock_owner;
		if (in->opcode == FUSE_RELEASE)
			CALL(release, req, ino, &fi);
		else if (se->ops.releasedir)
			se->ops.releasedir(req, ino, &fi);
		else
			sr_reply_err(req, 0);
		return;
	}
	case FUSE_FSYNC: case FUSE_FSYNCDIR: {
		const struct fuse_fsync_in *a = op;
		file_info(&fi, a->fh);
		int datasync = a->fsync_flags & 1;
		if (in->opcode == FUSE_FSYNC)
			CALL(fsync, req, ino, datasync, &fi);
		else
			CALL(fsyncdir, req, ino, datasync, &fi);
		return;
	}
	case FUSE_STATFS:
		CALL(statfs, req, ino);
		return;
	case FUSE_SETXATTR: {
		const struct fuse_setxattr_in *a = op;
		if (!(name = take_name(&p, end)) || a->size > (size_t)(end - p))
			break;
		CALL(setxattr, req, ino, name, p, a->size, (int)a->flags);
		return;
	}
	case FUSE_GETXATTR: {
		const struct fuse_getxattr_in *a = op;
		if (!(name = take_name(&p, end)))
			break;
		CALL(getxattr, req, ino, name, a->size);
		return;
	}
	case FUSE_LISTXATTR: {
		const struct fuse_getxattr_in *a = op;
		CALL(listxattr, req, ino, a->size);
		return;
	}
	case FUSE_REMOVEXATTR:
		if (!(name = take_name(&p, end)))
			break;
		CALL(removexattr, req, ino, name);
		return;
	case FUSE_FALLOCATE: {
		const struct fuse_fallocate_in *a = op;
		if (a->offset > (uint64_t)INT64_MAX || a->length > (uint64_t)INT64_MAX)
			break;
		file_info(&fi, a->fh);
		CALL(fallocate, req, ino, (int)a->mode, (off_t)a->offset, (off_t)a->length, &fi);
		return;
	}
	default:
		/* ACCESS (default_permissions decides), LSEEK, COPY_FILE_RANGE: the kernel
		 * remembers ENOSYS and does the generic thing itself from then on. */
		sr_reply_err(req, ENOSYS);
		return;
	}
	sr_reply_err(req, EINVAL); /* a name or a length the opcode does not allow */
}

void sr_dispatch(struct sr_req *req, const struct fuse_in_header *in, const void *op, size_t oplen,
		 const void *payload, size_t paylen)
{
	/* The fixed argument is copied to an aligned, zero-padded place: the kernel's
	 * buffers are aligned, a fuzzer's are not, and a shorter (older) struct reads as
	 * zeros past its end. */
	union {
		struct fuse_init_in init;
		struct fuse_setattr_in setattr;
		struct fuse_copy_file_range_in cfr;
		uint64_t align;
		char bytes[128];
	} arg;
	memset(&arg, 0, sizeof(arg));
	memcpy(&arg, op, oplen < sizeof(arg) ? oplen : sizeof(arg));
	long need = sr_op_arg_size(in->opcode);
	if (need > 0 && oplen > (size_t)need)
		oplen = (size_t)need; /* a newer kernel's longer struct: we read what we know */
	else if (oplen > sizeof(arg))
		oplen = sizeof(arg); /* refused below: this opcode has no (or no known) struct */
	req->replied = 0;
	req->data = NULL;
	dispatch(req, in, &arg, oplen, payload, paylen);
	if (!req->replied) /* every operation replies; this keeps the kernel from waiting */
		refuse(req, EIO);
	if (takes_no_reply(req->opcode))
		req->chan->send(req, NULL, 0); /* no reply: a ring entry is handed back */
}

/* A request refused before it could be parsed: answered, or handed back if it takes no
 * answer, as sr_dispatch does. */
static void refuse_request(struct sr_req *req, const struct fuse_in_header *in, int err)
{
	req->unique = in->unique;
	req->opcode = in->opcode;
	req->replied = 0;
	refuse(req, err);
	if (takes_no_reply(req->opcode))
		req->chan->send(req, NULL, 0);
}

void sr_dispatch_contiguous(struct sr_req *req, const void *buf, size_t len)
{
	struct fuse_in_header in;
	if (len < sizeof(in))
		return; /* not even a header: nothing to answer */
	memcpy(&in, buf, sizeof(in));
	size_t body = len - sizeof(in);
	if (in.len != len) {
		/* The kernel's read always returns one whole request; a mismatch means the
		 * buffer is not a request. */
		refuse_request(req, &in, EIO);
		return;
	}
	long need = sr_op_arg_size(in.opcode);
	size_t oplen = need < 0 ? 0 : (size_t)need;
	if (in.opcode == FUSE_INIT && body < oplen)
		oplen = body; /* an old kernel's shorter fuse_init_in, zero-padded */
	if (oplen > body) {
		refuse_request(req, &in, EINVAL);
		return;
	}
	const char *b = (const char *)buf + sizeof(in);
	if (in.opcode == FUSE_INIT && need > 0 && (size_t)need > oplen) {
		char padded[sizeof(struct fuse_init_in)];
		memset(padded, 0, sizeof(padded));
		memcpy(padded, b, oplen);
		sr_dispatch(req, &in, padded, sizeof(padded), b + oplen, body - oplen);
		return;
	}
	sr_dispatch(req, &in, b, oplen, b + oplen, body - oplen);
}

/* ---- the /dev/fuse channel -------------------------------------------------------- */
struct dev_thread {
	struct sr_session *se;
	pthread_t tid;
	char *buf;
};

static int dev_send(struct sr_req *req, struct iovec *iov, int count)
{
	if (!iov || count == 0)
		return 0;
	ssize_t n = writev(req->se->fd, iov, count);
	if (n < 0)
		return -errno;
	return 0;
}

static const struct sr_chan dev_chan = { .send = dev_send, .data_buf = NULL };

static void session_end(struct sr_session *se, int err)
{
	pthread_mutex_lock(&se->lock);
	if (!se->ended) {
		se->ended = 1;
		se->loop_error = err;
	}
	pthread_cond_broadcast(&se->ended_cond);
	pthread_mutex_unlock(&se->lock);
}

/* The reply of a READ is built in the request buffer past the header (the request's own
 * bytes are read before the reply is written). */
static void *dev_thread_main(void *arg)
{
	struct dev_thread *t = arg;
	struct sr_session *se = t->se;
	struct sr_req req;
	memset(&req, 0, sizeof(req));
	req.se = se;
	req.chan = &dev_chan;
	/* A READ's request is a header and a fuse_read_in, copied out before the operation
	 * runs: the rest of its buffer is free for the reply. */
	req.scratch = t->buf + 4096;
	req.scratch_len = se->bufsize - 4096;
	for (;;) {
		pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
		ssize_t n = read(se->fd, t->buf, se->bufsize);
		int err = errno;
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
		if (n < 0) {
			if (err == EINTR || err == EAGAIN || err == ENOENT)
				continue; /* ENOENT: the request was interrupted before we got it */
			session_end(se, err == ENODEV ? 0 : -err);
			break;
		}
		sr_dispatch_contiguous(&req, t->buf, (size_t)n);
	}
	return NULL;
}

int sr_session_loop(struct sr_session *se)
{
	int nthreads = se->opts.threads > 0 ? se->opts.threads : 1;
	struct dev_thread *threads = calloc((size_t)nthreads, sizeof(*threads));
	if (!threads)
		return -ENOMEM;
	int started = 0, err = 0;
	for (int i = 0; i < nthreads; i++) {
		threads[i].se = se;
		if (posix_memalign((void **)&threads[i].buf, 4096, se->bufsize)) {
			threads[i].buf = NULL;
			err = -ENOMEM;
			break;
		}
		if (pthread_create(&threads[i].tid, NULL, dev_thread_main, &threads[i])) {
			free(threads[i].buf);
			threads[i].buf = NULL;
			err = -EAGAIN;
			break;
		}
		started++;
	}
	if (started == 0) {
		free(threads);
		return err ? err : -EAGAIN;
	}
	int uring_tried = 0;
	pthread_mutex_lock(&se->lock);
	while (!se->ended) {
		if (!uring_tried && __atomic_load_n(&se->initialized, __ATOMIC_ACQUIRE)) {
			uring_tried = 1;
			if (se->want & FUSE_OVER_IO_URING) {
				pthread_mutex_unlock(&se->lock);
				int r = sr_uring_start(se, se->fd, se->conn.max_write);
				if (r < 0)
					fprintf(stderr, "strongroom-fuse: io_uring transport refused (%s): "
						"serving /dev/fuse\n", strerror(-r));
				else
					se->uring_running = 1;
				pthread_mutex_lock(&se->lock);
				continue;
			}
		}
		if (!uring_tried) {
			/* wait for INIT (a few milliseconds) without a separate signal */
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 5 * 1000 * 1000;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&se->ended_cond, &se->lock, &ts);
		} else {
			pthread_cond_wait(&se->ended_cond, &se->lock);
		}
	}
	int loop_error = se->loop_error;
	pthread_mutex_unlock(&se->lock);
	/* The others sit in read() (a cancellation point) or finish the request in hand
	 * (cancellation is off while one is served). */
	for (int i = 0; i < started; i++)
		pthread_cancel(threads[i].tid);
	for (int i = 0; i < started; i++) {
		pthread_join(threads[i].tid, NULL);
		free(threads[i].buf);
	}
	free(threads);
	if (se->uring_running) {
		sr_uring_stop(se);
		se->uring_running = 0;
	}
	return err ? err : loop_error;
}

/* The threads keep serving until the connection ends (ENODEV): an unmount writes the
 * writeback cache's dirty pages back through us before the kernel lets go, so a loop that
 * stopped first would hang the unmount. */
void sr_session_exit(struct sr_session *se)
{
	__atomic_store_n(&se->exited, 1, __ATOMIC_RELEASE);
}

int sr_notify_inval_inode(struct sr_session *se, sr_ino_t ino, off_t off, off_t len)
{
	if (se->fd < 0)
		return -EBADF;
	struct fuse_notify_inval_inode_out arg = { .ino = ino, .off = off, .len = len };
	struct fuse_out_header out = {
		.len = sizeof(out) + sizeof(arg),
		.error = FUSE_NOTIFY_INVAL_INODE,
		.unique = 0,
	};
	struct iovec iov[2] = { { &out, sizeof(out) }, { &arg, sizeof(arg) } };
	return writev(se->fd, iov, 2) < 0 ? -errno : 0;
}

static void *inval_main(void *arg)
{
	struct sr_session *se = arg;
	pthread_mutex_lock(&se->inval_lock);
	for (;;) {
		while (!se->inval_count && !se->inval_stop)
			pthread_cond_wait(&se->inval_cond, &se->inval_lock);
		if (se->inval_stop)
			break;
		unsigned i = se->inval_head;
		sr_ino_t ino = se->inval[i].ino;
		off_t off = se->inval[i].off, len = se->inval[i].len;
		se->inval_head = (i + 1) % 1024;
		se->inval_count--;
		pthread_mutex_unlock(&se->inval_lock);
		(void)sr_notify_inval_inode(se, ino, off, len); /* -ENOENT: forgotten meanwhile */
		pthread_mutex_lock(&se->inval_lock);
	}
	pthread_mutex_unlock(&se->inval_lock);
	return NULL;
}

int sr_notify_inval_inode_later(struct sr_session *se, sr_ino_t ino, off_t off, off_t len)
{
	int r = 0;
	pthread_mutex_lock(&se->inval_lock);
	if (!se->inval_started) {
		if (pthread_create(&se->inval_thread, NULL, inval_main, se) == 0)
			se->inval_started = 1;
		else
			r = -ENOMEM;
	}
	if (r == 0 && se->inval_count == 1024) {
		se->inval_dropped++;
		r = -ENOMEM;
	} else if (r == 0) {
		unsigned i = (se->inval_head + se->inval_count) % 1024;
		se->inval[i].ino = ino;
		se->inval[i].off = off;
		se->inval[i].len = len;
		se->inval_count++;
		pthread_cond_signal(&se->inval_cond);
	}
	pthread_mutex_unlock(&se->inval_lock);
	return r;
}

const char *sr_session_features(const struct sr_session *se)
{
	return se->features;
}

uint64_t sr_session_want(const struct sr_session *se)
{
	return se->want;
}

/* ---- session life ----------------------------------------------------------------- */
static struct sr_session *session_alloc(const struct sr_ops *ops, void *userdata)
{
	struct sr_session *se = calloc(1, sizeof(*se));
	if (!se)
		return NULL;
	se->ops = *ops;
	se->userdata = userdata;
	se->fd = -1;
	/* the largest request: a WRITE of max_write bytes after its headers */
	se->bufsize = SR_REPLY_SCRATCH + 4096;
	pthread_mutex_init(&se->lock, NULL);
	pthread_cond_init(&se->ended_cond, NULL);
	pthread_mutex_init(&se->inval_lock, NULL);
	pthread_cond_init(&se->inval_cond, NULL);
	return se;
}

struct sr_session *sr_session_new_detached(const struct sr_ops *ops, void *userdata)
{
	struct sr_session *se = session_alloc(ops, userdata);
	if (se)
		se->opts.threads = 1;
	return se;
}

struct sr_session *sr_session_new(const struct sr_ops *ops, void *userdata,
				  const struct sr_session_opts *opts)
{
	struct sr_session *se = session_alloc(ops, userdata);
	if (!se)
		return NULL;
	se->opts = *opts;
	se->mountpoint = strdup(opts->mountpoint);
	se->fsname = strdup(opts->fsname ? opts->fsname : "strongroom");
	if (!se->mountpoint || !se->fsname) {
		sr_session_destroy(se);
		return NULL;
	}
	se->opts.mountpoint = se->mountpoint;
	se->opts.fsname = se->fsname;
	return se;
}

int sr_session_mount(struct sr_session *se)
{
	int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	char opts[256];
	snprintf(opts, sizeof(opts),
		 "fd=%d,rootmode=40000,user_id=%u,group_id=%u,default_permissions,max_read=%u%s",
		 fd, (unsigned)getuid(), (unsigned)getgid(), (unsigned)SR_REPLY_SCRATCH,
		 se->opts.allow_other ? ",allow_other" : "");
	if (mount(se->fsname, se->mountpoint, "fuse.strongroom", MS_NOSUID | MS_NODEV, opts) < 0) {
		int err = errno;
		close(fd);
		return -err;
	}
	se->fd = fd;
	return 0;
}

void sr_session_unmount(struct sr_session *se)
{
	if (se->fd < 0)
		return;
	(void)umount2(se->mountpoint, MNT_DETACH);
}

void sr_session_destroy(struct sr_session *se)
{
	if (!se)
		return;
	if (se->inval_started) {
		pthread_mutex_lock(&se->inval_lock);
		se->inval_stop = 1;
		pthread_cond_signal(&se->inval_cond);
		pthread_mutex_unlock(&se->inval_lock);
		pthread_join(se->inval_thread, NULL);
	}
	pthread_mutex_destroy(&se->inval_lock);
	pthread_cond_destroy(&se->inval_cond);
	if (se->fd >= 0)
		close(se->fd);
	free(se->mountpoint);
	free(se->fsname);
	pthread_mutex_destroy(&se->lock);
	pthread_cond_destroy(&se->ended_cond);
	free(se);
}
