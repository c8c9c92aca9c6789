/* Requests from the kernel: INIT's negotiation, then every other opcode parsed and
 * handed to its operation. Every length is checked against its opcode before anything is
 * read: this is the code the fuzz harness (fuzz_transport.c) drives. */
#define _GNU_SOURCE
#include "session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
		sr_reply_args(req, &out, sizeof(out));
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
	if (in->minor < SR_FUSE_MINOR || ((c->want & capable & FUSE_OVER_IO_URING) && !sr_uring_available()))
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
	if (sr_reply_args(req, &out, outlen) == 0 && se->fd >= 0)
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
