/* libFuzzer harness for the FUSE request parser (transport.c): what the kernel writes
 * into /dev/fuse or an io_uring entry is parsed here before any operation runs, so a
 * length that lies must never make the parser read outside the request, hand an
 * operation a name without its NUL, or send a reply whose header disagrees with its
 * body.
 *
 *   clang -std=c11 -g -O1 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -I../include \
 *       fuzz_transport.c transport.c -o fuzz-transport -lpthread
 *   ./fuzz-transport -max_total_time=60 fuzz-transport-corpus/
 *
 * The first input byte picks the mode:
 *   bit 0  0: the rest is one /dev/fuse read (sr_dispatch_contiguous);
 *          1: the io_uring path (sr_dispatch): a fuse_in_header, one byte giving the
 *             fixed argument's length (bit 7 clear: the opcode's own size; set: bits
 *             0-6, which may lie), that argument, then the payload. Each part is copied
 *             to a buffer of its exact size, so an overread of any part is caught.
 *   bit 1  operations answer for real (entries, attributes, READ data through
 *          sr_reply_data_buf, directory entries) instead of ENOSYS.
 *   bit 2  no INIT first: the session is as the kernel finds it at mount.
 *   bits 4-6  capacity of the channel's own data buffer (as an io_uring entry's
 *          payload): 0 none, else 512 << n bytes.
 * Every input gets a fresh detached session (no state carried between inputs; a leak
 * in the session's life shows at exit).
 *
 * Protocol findings (two replies, a reply plus a ring hand-back, a reply to FORGET)
 * abort like memory errors; SR_FUZZ_LENIENT=1 in the environment reports each kind
 * once on stderr and goes on, to look past one known finding. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* as transport.c: st_atim, and the build line may pass it too */
#endif
#include "transport.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile unsigned char sink;
static struct sr_session *cur_se;
static unsigned replies, handbacks;
static int lenient = -1;
static unsigned char fill; /* what a READ answered for real carries: the send checks it */
static size_t data_cap;    /* the channel's own data buffer, 0: none */
static char *data_mem;
static size_t data_mem_len;

#define FAIL(...) do { fprintf(stderr, "fuzz-transport: " __VA_ARGS__); fputc('\n', stderr); abort(); } while (0)

static void finding(unsigned kind, const char *what)
{
	static unsigned seen;
	if (lenient < 0)
		lenient = getenv("SR_FUZZ_LENIENT") && strcmp(getenv("SR_FUZZ_LENIENT"), "0") != 0;
	if (!lenient)
		FAIL("%s", what);
	if (!(seen & (1u << kind)))
		fprintf(stderr, "fuzz-transport: (lenient) %s\n", what);
	seen |= 1u << kind;
}

/* Read every byte, so ASan sees a span that is not all inside one live object. */
static void touch(const void *p, size_t n)
{
	const volatile unsigned char *b = p;
	unsigned char x = 0;
	for (size_t i = 0; i < n; i++)
		x ^= b[i];
	sink ^= x;
}

/* strlen reads up to the NUL: a name that is not terminated inside the request is an
 * overread of the request's buffer. */
static void touch_str(const char *s)
{
	if (!s)
		FAIL("an operation got a NULL name");
	touch(s, strlen(s) + 1);
}

static int no_reply_op(uint32_t op)
{
	return op == FUSE_FORGET || op == FUSE_BATCH_FORGET || op == FUSE_INTERRUPT || op == FUSE_NOTIFY_REPLY;
}

static int chan_send(struct sr_req *req, struct iovec *iov, int count)
{
	if (!iov || count == 0) { /* a request that takes no reply: its ring entry back */
		if (++handbacks > 1)
			finding(0, "a request handed back twice");
		if (replies)
			finding(1, "a request replied to and then handed back (a ring entry completed twice)");
		return 0;
	}
	if (count < 1 || iov[0].iov_len != sizeof(struct fuse_out_header) || !iov[0].iov_base)
		FAIL("iov[0] is not a fuse_out_header");
	const struct fuse_out_header *out = iov[0].iov_base;
	size_t total = 0;
	for (int i = 0; i < count; i++) {
		if (iov[i].iov_len && !iov[i].iov_base)
			FAIL("iov[%d]: %zu bytes at NULL", i, iov[i].iov_len);
		touch(iov[i].iov_base, iov[i].iov_len);
		total += iov[i].iov_len;
	}
	if (out->len != total)
		FAIL("out header says %u bytes, the iovecs hold %zu", out->len, total);
	if (out->error > 0 || out->error <= -4096)
		FAIL("reply error %d is no -errno", out->error);
	if (out->error != 0 && total != sizeof(*out))
		FAIL("an error reply with %zu bytes of body", total - sizeof(*out));
	if (out->unique != req->unique)
		FAIL("reply to %llu, request was %llu", (unsigned long long)out->unique,
		     (unsigned long long)req->unique);
	if (++replies > 1)
		finding(2, "two replies to one request");
	if (handbacks)
		finding(1, "a request handed back and then replied to");
	if (no_reply_op(req->opcode))
		finding(3, "a reply to a request that takes none (FORGET, BATCH_FORGET, INTERRUPT)");
	if (req->opcode == FUSE_READ && out->error == 0 && fill)
		for (int i = 1; i < count; i++)
			for (size_t j = 0; j < iov[i].iov_len; j++)
				if (((const unsigned char *)iov[i].iov_base)[j] != fill) {
					finding(5, "a READ reply sent another buffer than the one the operation wrote");
					return 0;
				}
	return 0;
}

/* A buffer of at most data_cap bytes, exactly as large as first asked: a write past
 * `size` by the operation or the transport is an overflow ASan sees. */
static void *chan_data_buf(struct sr_req *req, size_t size)
{
	(void)req;
	if (!data_cap || size > data_cap)
		return NULL;
	if (!data_mem) {
		data_mem = malloc(size ? size : 1);
		data_mem_len = size;
		return data_mem;
	}
	return size <= data_mem_len ? data_mem : NULL;
}

static const struct sr_chan chan = { .send = chan_send, .data_buf = chan_data_buf };
static int real; /* bit 1: operations answer for real */

static void attr_of(struct stat *st, mode_t mode)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = 2;
	st->st_mode = mode;
	st->st_nlink = 1;
	st->st_size = 12345;
}

static void entry_of(struct sr_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = 2;
	attr_of(&e->attr, S_IFREG | 0644);
	e->attr_timeout = e->entry_timeout = 1.0;
}

static void answer_entry(sr_req_t req)
{
	struct sr_entry_param e;
	if (!real) {
		sr_reply_err(req, ENOSYS);
		return;
	}
	entry_of(&e);
	sr_reply_entry(req, &e);
}

static void op_init(void *ud, struct sr_conn *conn)
{
	(void)ud;
	conn->want |= conn->capable & (FUSE_WRITEBACK_CACHE | FUSE_HANDLE_KILLPRIV_V2 | FUSE_OVER_IO_URING |
				      FUSE_DO_READDIRPLUS | FUSE_PARALLEL_DIROPS);
}

static void op_lookup(sr_req_t req, sr_ino_t parent, const char *name)
{
	(void)parent;
	touch_str(name);
	answer_entry(req);
}

static void op_forget(sr_req_t req, sr_ino_t ino, uint64_t nlookup)
{
	(void)ino, (void)nlookup;
	sr_reply_none(req);
}

static void op_getattr(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	struct stat st;
	(void)ino;
	if (fi)
		touch(fi, sizeof(*fi));
	if (!real) {
		sr_reply_err(req, ENOSYS);
		return;
	}
	attr_of(&st, S_IFREG | 0644);
	sr_reply_attr(req, &st, 1.0);
}

static void op_setattr(sr_req_t req, sr_ino_t ino, struct stat *attr, uint32_t valid, struct sr_file_info *fi)
{
	(void)ino, (void)valid;
	touch(attr, sizeof(*attr));
	if (fi)
		touch(fi, sizeof(*fi));
	op_getattr(req, ino, NULL);
}

static void op_readlink(sr_req_t req, sr_ino_t ino)
{
	(void)ino;
	if (real)
		sr_reply_readlink(req, "target");
	else
		sr_reply_err(req, ENOSYS);
}

static void op_mknod(sr_req_t req, sr_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	(void)parent, (void)mode, (void)rdev;
	touch_str(name);
	answer_entry(req);
}

static void op_mkdir(sr_req_t req, sr_ino_t parent, const char *name, mode_t mode)
{
	(void)parent, (void)mode;
	touch_str(name);
	answer_entry(req);
}

static void op_symlink(sr_req_t req, const char *link, sr_ino_t parent, const char *name)
{
	(void)parent;
	touch_str(link);
	touch_str(name);
	answer_entry(req);
}

static void op_link(sr_req_t req, sr_ino_t ino, sr_ino_t newparent, const char *newname)
{
	(void)ino, (void)newparent;
	touch_str(newname);
	answer_entry(req);
}

static void op_name_only(sr_req_t req, sr_ino_t parent, const char *name)
{
	(void)parent;
	touch_str(name);
	sr_reply_err(req, real ? 0 : ENOSYS);
}

static void op_rename(sr_req_t req, sr_ino_t parent, const char *name, sr_ino_t newparent,
		      const char *newname, unsigned flags)
{
	(void)parent, (void)newparent, (void)flags;
	touch_str(name);
	touch_str(newname);
	sr_reply_err(req, real ? 0 : ENOSYS);
}

static void op_open(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	(void)ino;
	touch(fi, sizeof(*fi));
	if (!real) {
		sr_reply_err(req, ENOSYS);
		return;
	}
	fi->fh = 7;
	fi->keep_cache = 1;
	sr_reply_open(req, fi);
}

static void op_create(sr_req_t req, sr_ino_t parent, const char *name, mode_t mode, struct sr_file_info *fi)
{
	struct sr_entry_param e;
	(void)parent, (void)mode;
	touch_str(name);
	touch(fi, sizeof(*fi));
	if (!real) {
		sr_reply_err(req, ENOSYS);
		return;
	}
	entry_of(&e);
	fi->fh = 8;
	sr_reply_create(req, &e, fi);
}

/* A short read (as at the end of a file) straight into the reply buffer. */
static void op_read(sr_req_t req, sr_ino_t ino, size_t size, off_t off, struct sr_file_info *fi)
{
	(void)ino, (void)off;
	touch(fi, sizeof(*fi));
	if (!real) {
		sr_reply_err(req, ENOSYS);
		return;
	}
	char *buf = sr_reply_data_buf(req, size);
	if (!buf) {
		sr_reply_err(req, EINVAL);
		return;
	}
	size_t n = size - size / 3;
	fill = (unsigned char)(0x5a ^ (req->unique & 0xff)) | 1;
	memset(buf, fill, size); /* all of it: the buffer must hold `size` */
	sr_reply_data(req, n);
}

static void op_write(sr_req_t req, sr_ino_t ino, const char *buf, size_t size, off_t off,
		     struct sr_file_info *fi)
{
	(void)ino, (void)off;
	touch(buf, size);
	touch(fi, sizeof(*fi));
	if (real)
		sr_reply_write(req, size);
	else
		sr_reply_err(req, ENOSYS);
}

static void op_fi_only(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	(void)ino;
	touch(fi, sizeof(*fi));
	sr_reply_err(req, real ? 0 : ENOSYS);
}

static void op_fsync(sr_req_t req, sr_ino_t ino, int datasync, struct sr_file_info *fi)
{
	(void)datasync;
	op_fi_only(req, ino, fi);
}

static void op_fallocate(sr_req_t req, sr_ino_t ino, int mode, off_t off, off_t len, struct sr_file_info *fi)
{
	(void)mode, (void)off, (void)len;
	op_fi_only(req, ino, fi);
}

static void op_readdir_any(sr_req_t req, size_t size, off_t off, int plus)
{
	if (!real) {
		sr_reply_err(req, ENOSYS);
		return;
	}
	char *buf = sr_reply_data_buf(req, size);
	if (!buf) {
		sr_reply_err(req, EINVAL);
		return;
	}
	static const char *const names[] = { ".", "..", "a-rather-long-file-name-for-a-dirent" };
	size_t used = 0;
	for (size_t i = (size_t)(off >= 0 && off < 3 ? off : 3); i < 3; i++) {
		struct sr_entry_param e;
		size_t n;
		entry_of(&e);
		if (plus)
			n = sr_add_direntry_plus(req, buf + used, size - used, names[i], &e, (off_t)i + 1);
		else
			n = sr_add_direntry(req, buf + used, size - used, names[i], &e.attr, (off_t)i + 1);
		if (n > size - used)
			break;
		used += n;
	}
	fill = 0; /* not a fill pattern */
	sr_reply_data(req, used);
}

static void op_readdir(sr_req_t req, sr_ino_t ino, size_t size, off_t off, struct sr_file_info *fi)
{
	(void)ino;
	touch(fi, sizeof(*fi));
	op_readdir_any(req, size, off, 0);
}

static void op_readdirplus(sr_req_t req, sr_ino_t ino, size_t size, off_t off, struct sr_file_info *fi)
{
	(void)ino;
	touch(fi, sizeof(*fi));
	op_readdir_any(req, size, off, 1);
}

static void op_statfs(sr_req_t req, sr_ino_t ino)
{
	struct statvfs st;
	(void)ino;
	if (!real) {
		sr_reply_err(req, ENOSYS);
		return;
	}
	memset(&st, 0, sizeof(st));
	st.f_bsize = 4096;
	st.f_namemax = 255;
	sr_reply_statfs(req, &st);
}

static void op_getxattr(sr_req_t req, sr_ino_t ino, const char *name, size_t size)
{
	(void)ino;
	touch_str(name);
	if (!real)
		sr_reply_err(req, ENOSYS);
	else if (size == 0)
		sr_reply_xattr(req, 7);
	else if (size < 7)
		sr_reply_err(req, ERANGE);
	else
		sr_reply_buf(req, "payroll", 7);
}

static void op_listxattr(sr_req_t req, sr_ino_t ino, size_t size)
{
	op_getxattr(req, ino, "user.x", size);
}

static void op_setxattr(sr_req_t req, sr_ino_t ino, const char *name, const char *value, size_t size, int flags)
{
	(void)ino, (void)flags;
	touch_str(name);
	touch(value, size);
	sr_reply_err(req, real ? 0 : ENOSYS);
}

static const struct sr_ops ops = {
	.init = op_init, .lookup = op_lookup, .forget = op_forget, .getattr = op_getattr,
	.setattr = op_setattr, .readlink = op_readlink, .mknod = op_mknod, .mkdir = op_mkdir,
	.symlink = op_symlink, .link = op_link, .unlink = op_name_only, .rmdir = op_name_only,
	.rename = op_rename, .open = op_open, .create = op_create, .read = op_read,
	.write = op_write, .flush = op_fi_only, .release = op_fi_only, .fsync = op_fsync,
	.fallocate = op_fallocate, .opendir = op_open, .readdir = op_readdir,
	.readdirplus = op_readdirplus, .releasedir = op_fi_only, .fsyncdir = op_fsync,
	.statfs = op_statfs, .getxattr = op_getxattr, .listxattr = op_listxattr,
	.setxattr = op_setxattr, .removexattr = op_name_only,
};

/* The harness never runs the session loop, the only caller of the io_uring transport:
 * weak stand-ins let it link without uring*.c and liburing (linked in, uring_setup.c's
 * win). */
__attribute__((weak)) int sr_uring_start(struct sr_session *se, int dev_fd, uint32_t max_payload)
{
	(void)se, (void)dev_fd, (void)max_payload;
	return -ENOSYS;
}

__attribute__((weak)) int sr_uring_available(void)
{
	return 0;
}

__attribute__((weak)) void sr_uring_stop(struct sr_session *se)
{
	(void)se;
}

static char *scratch;

static void req_reset(struct sr_req *req)
{
	memset(req, 0, sizeof(*req));
	req->se = cur_se;
	req->chan = &chan;
	req->scratch = scratch;
	req->scratch_len = SR_REPLY_SCRATCH;
	replies = handbacks = 0;
	fill = 0;
	free(data_mem);
	data_mem = NULL;
	data_mem_len = 0;
}

/* Every request must end in exactly one reply or one hand-back. */
static void req_done(const struct sr_req *req)
{
	if (replies + handbacks == 0)
		finding(4, "a request neither answered nor handed back: the kernel (or the ring entry) waits forever");
	if (replies && !req->replied)
		FAIL("replied, but the request does not know it");
}

/* What the kernel's INIT looks like (7.45, everything offered). */
static void send_init(void)
{
	struct {
		struct fuse_in_header h;
		struct fuse_init_in i;
	} m;
	struct sr_req req;
	memset(&m, 0, sizeof(m));
	m.h.len = sizeof(m);
	m.h.opcode = FUSE_INIT;
	m.h.unique = 2;
	m.i.major = 7;
	m.i.minor = 45;
	m.i.max_readahead = 1u << 22;
	m.i.flags = 0xffffffffu;
	m.i.flags2 = 0xffffffffu;
	req_reset(&req);
	sr_dispatch_contiguous(&req, &m, sizeof(m));
	if (replies != 1)
		FAIL("INIT answered %u times", replies);
}

static void *copy(const uint8_t *p, size_t n)
{
	void *b = malloc(n ? n : 1);
	if (!b)
		abort();
	memcpy(b, p, n);
	return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sr_req req;
	if (size < 1)
		return 0;
	if (!scratch && !(scratch = malloc(SR_REPLY_SCRATCH)))
		abort();
	uint8_t mode = data[0];
	data++, size--;
	real = (mode & 2) != 0;
	cur_se = sr_session_new_detached(&ops, NULL);
	if (!cur_se)
		abort();
	if (!(mode & 4))
		send_init();
	req_reset(&req);
	data_cap = (mode >> 4) & 7 ? (size_t)512 << ((mode >> 4) & 7) : 0;
	if (!(mode & 1)) {
		void *buf = copy(data, size); /* malloc'd: aligned like the kernel's buffer, and exact */
		sr_dispatch_contiguous(&req, buf, size);
		if (size >= sizeof(struct fuse_in_header))
			req_done(&req);
		free(buf);
	} else if (size >= sizeof(struct fuse_in_header) + 1) {
		struct fuse_in_header *in = copy(data, sizeof(*in));
		uint8_t sel = data[sizeof(*in)];
		const uint8_t *rest = data + sizeof(*in) + 1;
		size_t left = size - sizeof(*in) - 1;
		long want = sr_op_arg_size(in->opcode);
		size_t oplen = (sel & 0x80) || want < 0 ? (size_t)(sel & 0x7f) : (size_t)want;
		if (oplen > left)
			oplen = left;
		void *op = copy(rest, oplen);
		void *pay = copy(rest + oplen, left - oplen);
		sr_dispatch(&req, in, op, oplen, pay, left - oplen);
		req_done(&req);
		free(pay);
		free(op);
		free(in);
	}
	free(data_mem);
	data_mem = NULL;
	sr_session_destroy(cur_se);
	cur_se = NULL;
	return 0;
}
