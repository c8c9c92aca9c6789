/* The FUSE kernel protocol, spoken directly (transport.c: /dev/fuse; uring.c: FUSE over
 * io_uring). Decision 0016 says why not libfuse: Debian 12's libfuse 3.14 can negotiate
 * neither FUSE_HANDLE_KILLPRIV_V2 nor the io_uring transport this kernel offers.
 *
 * The operation table and reply calls keep libfuse's low-level shape (one call per
 * request, exactly one reply), so fs.c reads as it did; what differs is that the
 * daemon owns the INIT negotiation, the buffers (a read is decrypted straight into the
 * buffer the reply leaves from: sr_reply_data_buf) and the threads. */
#ifndef SR_TRANSPORT_H
#define SR_TRANSPORT_H

#include <linux/fuse.h> /* the kernel's UAPI header: protocol 7.38 in Debian 12's linux-libc-dev */
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/uio.h>

/* ---- protocol additions after 7.38 (the running kernel speaks 7.4x) ---------------- */
#ifndef FUSE_OVER_IO_URING
#define FUSE_OVER_IO_URING (1ULL << 41)
#endif
#define SR_FUSE_MINOR 42 /* what we speak: 7.42 adds FUSE over io_uring */

typedef uint64_t sr_ino_t;
#define SR_ROOT_ID FUSE_ROOT_ID

struct sr_session;
struct sr_req;
typedef struct sr_req *sr_req_t;

/* One open file or directory handle, as FUSE_OPEN/CREATE/READ/WRITE... carry it. */
struct sr_file_info {
	int flags;            /* the caller's open(2) flags, as the kernel sent them */
	uint32_t open_flags;  /* FUSE_OPEN_KILL_SUIDGID (OPEN/CREATE) */
	uint32_t write_flags; /* FUSE_WRITE_CACHE, FUSE_WRITE_KILL_SUIDGID (WRITE) */
	uint64_t fh;
	uint64_t lock_owner;
	unsigned keep_cache : 1;
	unsigned direct_io : 1;
	unsigned parallel_direct_writes : 1;
};

struct sr_entry_param {
	sr_ino_t ino;
	uint64_t generation;
	struct stat attr;
	double attr_timeout;
	double entry_timeout;
};

struct sr_ctx {
	uid_t uid;
	gid_t gid;
	pid_t pid;
};

/* What the kernel offered in INIT and what the daemon takes: FUSE_* init flags (flags |
 * flags2 << 32). The init operation edits `want` and the limits. */
struct sr_conn {
	uint32_t major, minor;      /* the kernel's protocol version */
	uint64_t capable;           /* offered */
	uint64_t want;              /* taken (a subset of capable, enforced after init) */
	uint32_t max_write;
	uint32_t max_read;
	uint32_t max_readahead;
	uint16_t max_background;
	uint16_t congestion_threshold;
	uint32_t time_gran;
};

/* SETATTR `valid` bits are the kernel's FATTR_* (FATTR_MODE, FATTR_SIZE, FATTR_ATIME_NOW,
 * FATTR_CTIME, FATTR_KILL_SUIDGID, ...). */
struct sr_ops {
	void (*init)(void *userdata, struct sr_conn *conn);
	void (*lookup)(sr_req_t req, sr_ino_t parent, const char *name);
	void (*forget)(sr_req_t req, sr_ino_t ino, uint64_t nlookup);   /* no reply */
	void (*getattr)(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi);
	void (*setattr)(sr_req_t req, sr_ino_t ino, struct stat *attr, uint32_t valid,
			struct sr_file_info *fi);
	void (*readlink)(sr_req_t req, sr_ino_t ino);
	void (*mknod)(sr_req_t req, sr_ino_t parent, const char *name, mode_t mode, dev_t rdev);
	void (*mkdir)(sr_req_t req, sr_ino_t parent, const char *name, mode_t mode);
	void (*symlink)(sr_req_t req, const char *link, sr_ino_t parent, const char *name);
	void (*link)(sr_req_t req, sr_ino_t ino, sr_ino_t newparent, const char *newname);
	void (*unlink)(sr_req_t req, sr_ino_t parent, const char *name);
	void (*rmdir)(sr_req_t req, sr_ino_t parent, const char *name);
	void (*rename)(sr_req_t req, sr_ino_t parent, const char *name, sr_ino_t newparent,
		       const char *newname, unsigned flags);
	void (*open)(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi);
	void (*create)(sr_req_t req, sr_ino_t parent, const char *name, mode_t mode,
		       struct sr_file_info *fi);
	void (*read)(sr_req_t req, sr_ino_t ino, size_t size, off_t off, struct sr_file_info *fi);
	void (*write)(sr_req_t req, sr_ino_t ino, const char *buf, size_t size, off_t off,
		      struct sr_file_info *fi);
	void (*flush)(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi);
	void (*release)(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi);
	void (*fsync)(sr_req_t req, sr_ino_t ino, int datasync, struct sr_file_info *fi);
	void (*fallocate)(sr_req_t req, sr_ino_t ino, int mode, off_t off, off_t len,
			  struct sr_file_info *fi);
	void (*opendir)(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi);
	void (*readdir)(sr_req_t req, sr_ino_t ino, size_t size, off_t off, struct sr_file_info *fi);
	void (*readdirplus)(sr_req_t req, sr_ino_t ino, size_t size, off_t off,
			    struct sr_file_info *fi);
	void (*releasedir)(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi);
	void (*fsyncdir)(sr_req_t req, sr_ino_t ino, int datasync, struct sr_file_info *fi);
	void (*statfs)(sr_req_t req, sr_ino_t ino);
	void (*getxattr)(sr_req_t req, sr_ino_t ino, const char *name, size_t size);
	void (*listxattr)(sr_req_t req, sr_ino_t ino, size_t size);
	void (*setxattr)(sr_req_t req, sr_ino_t ino, const char *name, const char *value,
			 size_t size, int flags);
	void (*removexattr)(sr_req_t req, sr_ino_t ino, const char *name);
};

/* ---- replies: exactly one per request (none for forget); each returns 0 or -errno
 * (-ENOENT: the request was interrupted and the kernel no longer waits for it) ------- */
int sr_reply_err(sr_req_t req, int err);
void sr_reply_none(sr_req_t req);
int sr_reply_entry(sr_req_t req, const struct sr_entry_param *e);
int sr_reply_create(sr_req_t req, const struct sr_entry_param *e, const struct sr_file_info *fi);
int sr_reply_attr(sr_req_t req, const struct stat *attr, double timeout);
int sr_reply_readlink(sr_req_t req, const char *link);
int sr_reply_open(sr_req_t req, const struct sr_file_info *fi);
int sr_reply_write(sr_req_t req, size_t count);
int sr_reply_buf(sr_req_t req, const void *buf, size_t size);
int sr_reply_statfs(sr_req_t req, const struct statvfs *st);
int sr_reply_xattr(sr_req_t req, size_t count);
/* A buffer of at least `size` bytes (size <= the negotiated max_read) that a READ reply
 * can be built in, then sent with sr_reply_data: no copy between the cipher and the
 * kernel (for io_uring it is the ring entry's own payload buffer). Valid until the reply;
 * NULL only when size is too large. */
void *sr_reply_data_buf(sr_req_t req, size_t size);
int sr_reply_data(sr_req_t req, size_t count);

/* Directory entries into a READDIR(PLUS) reply buffer: bytes used, or the size the entry
 * would need when it does not fit (then nothing is written), as libfuse's. */
size_t sr_add_direntry(sr_req_t req, char *buf, size_t bufsize, const char *name,
		       const struct stat *st, off_t off);
size_t sr_add_direntry_plus(sr_req_t req, char *buf, size_t bufsize, const char *name,
			    const struct sr_entry_param *e, off_t off);

const struct sr_ctx *sr_req_ctx(sr_req_t req);
/* The caller's supplementary groups (from /proc/<pid>/status): how many it has (may be
 * more than `size`, of which `size` are stored), or -errno. */
int sr_req_getgroups(sr_req_t req, int size, gid_t list[]);

/* ---- the session ---------------------------------------------------------------- */
struct sr_session_opts {
	const char *mountpoint;
	const char *fsname;       /* the source shown in /proc/mounts */
	int allow_other;
	int threads;              /* request threads reading /dev/fuse */
	int writeback_cache;      /* take FUSE_WRITEBACK_CACHE when offered */
	int io_uring;             /* ask for FUSE over io_uring (the host's enable_uring decides) */
	int debug;                /* one line per request on stderr */
};

struct sr_session *sr_session_new(const struct sr_ops *ops, void *userdata,
				  const struct sr_session_opts *opts);
/* Open /dev/fuse and mount (root: mount(2) directly). 0 or -errno. */
int sr_session_mount(struct sr_session *se);
/* Serve until the connection ends (an unmount, an abort): 0, or -errno when the transport
 * failed. There is no "stop serving" call: an unmount writes the writeback cache's dirty
 * pages back through us before the kernel lets go, so a loop that stopped first would
 * hang it. */
int sr_session_loop(struct sr_session *se);
/* Lazily unmount the mount point (the caller has checked it is still ours). */
void sr_session_unmount(struct sr_session *se);
void sr_session_destroy(struct sr_session *se);
/* Drop the kernel's cached pages (off 0, len 0: all) and attributes of an inode. */
int sr_notify_inval_inode(struct sr_session *se, sr_ino_t ino, off_t off, off_t len);
/* The same, later, from the session's own thread: for a request handler, which must not
 * wait in the kernel for pages its own reply has yet to release. Queued (at most 1,024;
 * beyond, dropped), done in order; 0 or -ENOMEM. */
int sr_notify_inval_inode_later(struct sr_session *se, sr_ino_t ino, off_t off, off_t len);
/* What INIT settled, for logs and STATUS: "7.45 uring writeback_cache killpriv_v2 ...". */
const char *sr_session_features(const struct sr_session *se);
uint64_t sr_session_want(const struct sr_session *se);

/* ---- for the transports (transport.c, uring.c) and the fuzz harness ------------- */
/* Where a request's reply goes. `send` gets the out header as iov[0] (its len is set,
 * its error field filled) and the reply's arguments after it. */
struct sr_chan {
	int (*send)(struct sr_req *req, struct iovec *iov, int count);
	/* A reply buffer of `size` bytes for sr_reply_data_buf, or NULL (the transport's
	 * per-thread buffer is then used). */
	void *(*data_buf)(struct sr_req *req, size_t size);
};

struct sr_req {
	struct sr_session *se;
	const struct sr_chan *chan;
	void *chan_data;          /* the transport's (its thread, its ring entry) */
	uint64_t unique;
	uint32_t opcode;
	struct sr_ctx ctx;
	int replied;
	char *scratch;            /* the transport's buffer for data replies (READ) */
	size_t scratch_len;
	void *data;               /* what sr_reply_data_buf handed out: sr_reply_data sends it */
};

/* Parse one request and call its operation. `op` holds the opcode's fixed argument
 * (struct fuse_*_in), `payload` what follows it (names, data). With /dev/fuse the two
 * are contiguous: sr_dispatch_contiguous splits them. Every length is checked against
 * the opcode before anything is read; a malformed request is answered EINVAL (or
 * dropped when it cannot be answered). */
void sr_dispatch(struct sr_req *req, const struct fuse_in_header *in, const void *op, size_t oplen,
		 const void *payload, size_t paylen);
void sr_dispatch_contiguous(struct sr_req *req, const void *buf, size_t len);
/* Size of the fixed argument struct of `opcode` (0 for none), -1 when unknown. */
long sr_op_arg_size(uint32_t opcode);

/* For a session made without a mount (the fuzz harness): requests parsed and dispatched,
 * replies given to `sink`. */
struct sr_session *sr_session_new_detached(const struct sr_ops *ops, void *userdata);

/* io_uring transport (uring_setup.c; uring.c serves the rings), started by the loop after
 * INIT when FUSE_OVER_IO_URING was granted: 0, or -errno (the loop then keeps serving
 * /dev/fuse alone). */
int sr_uring_start(struct sr_session *se, int dev_fd, uint32_t max_payload);
/* Whether this process can make the rings at all (INIT grants FUSE_OVER_IO_URING only
 * then: once granted, the kernel holds every request until the rings are registered). */
int sr_uring_available(void);
void sr_uring_stop(struct sr_session *se);

#define SR_REPLY_SCRATCH ((size_t)(1u << 20))

#endif
