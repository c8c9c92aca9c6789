/* The guard point's file system on libfuse3's low-level API.
 *
 * Every backing access is relative to a descriptor: each inode the kernel knows holds an
 * O_PATH descriptor of its backing inode, and operations use openat/fstatat/unlinkat/...
 * relative to it (or /proc/self/fd/N where a call has no *at form), so no absolute path
 * is ever built and paths near PATH_MAX work. Inodes are keyed by (st_dev, st_ino): two
 * names of one file are one FUSE inode, with one attribute cache and one page cache.
 *
 * Permissions: the mount uses -o default_permissions, so the kernel checks mode and
 * owner against the attributes reported here before a request reaches us; the daemon
 * then acts as root on the backing directory and gives new inodes to their caller. The
 * access policy (control.c) is checked in addition, per open/create and per namespace
 * operation. Regular files' bytes go through the content layer only (content.h). */
#define _GNU_SOURCE
#include "fs.h"
#include "control.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <sys/syscall.h>
#include <linux/openat2.h>
#include <unistd.h>

struct sr_inode {
	struct sr_inode *next; /* hash chain */
	int fd;                /* O_PATH | O_NOFOLLOW */
	dev_t dev;
	ino_t ino;
	mode_t type;           /* S_IFMT bits */
	uint64_t nlookup;      /* under table_lock */
	pthread_mutex_t open_lock; /* content lifecycle */
	pthread_mutex_t times_lock; /* writeback: a write's mtime put back vs. SETATTR of times */
	pthread_rwlock_t io_lock;  /* shared: read/write; exclusive: size changes, appends */
	struct sr_content *content;
	unsigned content_refs;
	int content_writable;
};

struct sr_handle {
	struct sr_handle *prev, *next; /* every open handle: freed at exit if never released */
	struct sr_inode *inode;
	int flags;
};

struct sr_dir {
	DIR *dp;
	off_t offset;
	struct dirent *entry;
};

#define TABLE_SIZE 65536u /* buckets: chains stay short at 10^5..10^6 inodes */
static uint64_t inode_count; /* inodes the kernel holds lookups on, the root excluded */

uint64_t sr_fs_inodes(void)
{
	return __atomic_load_n(&inode_count, __ATOMIC_RELAXED);
}

static struct {
	struct sr_fs_config cfg;
	struct sr_inode root;
	pthread_mutex_t table_lock;
	struct sr_inode *table[TABLE_SIZE];
	int as_root;
	pthread_mutex_t handles_lock;
	struct sr_handle handles; /* list head */
	int sealed; /* shutting down: no more plaintext (sr_fs_seal) */
	int writeback; /* the kernel's writeback cache was negotiated */
} fs;

static int sealed(void)
{
	return __atomic_load_n(&fs.sealed, __ATOMIC_ACQUIRE);
}

static void handle_add(struct sr_handle *h)
{
	pthread_mutex_lock(&fs.handles_lock);
	h->next = fs.handles.next;
	h->prev = &fs.handles;
	fs.handles.next->prev = h;
	fs.handles.next = h;
	pthread_mutex_unlock(&fs.handles_lock);
}

static void handle_free(struct sr_handle *h)
{
	pthread_mutex_lock(&fs.handles_lock);
	h->prev->next = h->next;
	h->next->prev = h->prev;
	pthread_mutex_unlock(&fs.handles_lock);
	free(h);
}

/* ---- helpers --------------------------------------------------------------------- */
static struct sr_inode *inode_of(sr_ino_t ino)
{
	return ino == SR_ROOT_ID ? &fs.root : (struct sr_inode *)(uintptr_t)ino;
}

static void procpath(int fd, char buf[32])
{
	snprintf(buf, 32, "/proc/self/fd/%d", fd);
}

static unsigned bucket(dev_t dev, ino_t ino)
{
	uint64_t h = (uint64_t)ino * 0x9E3779B97F4A7C15ull ^ (uint64_t)dev;
	return (unsigned)(h >> 40) % TABLE_SIZE;
}

static int caller_of(sr_req_t req, struct sr_caller *c)
{
	const struct sr_ctx *ctx = sr_req_ctx(req);
	c->uid = ctx->uid;
	c->gid = ctx->gid;
	c->pid = ctx->pid;
	c->ngroups = 0;
	if (!sr_policy_active())
		return 0;
	int n = sr_req_getgroups(req, 64, c->groups);
	c->ngroups = n < 0 ? 0 : n > 64 ? 64 : n;
	return 1;
}

/* The object's path inside the mount, for events: the backing path of `dir` (from
 * /proc) without the backing directory's own prefix, then "/name". */
static void path_in_mount(struct sr_inode *dir, const char *name, char *out, size_t len)
{
	char link[32], real[PATH_MAX];
	procpath(dir->fd, link);
	ssize_t n = readlink(link, real, sizeof(real) - 1);
	if (n < 0) {
		snprintf(out, len, "?/%s", name ? name : "");
		return;
	}
	real[n] = '\0';
	const char *rel = real;
	size_t bl = strlen(fs.cfg.backing_path);
	if (!strncmp(real, fs.cfg.backing_path, bl) && (real[bl] == '/' || real[bl] == '\0'))
		rel = real + bl;
	if (name)
		snprintf(out, len, "%s/%s", rel, name);
	else
		snprintf(out, len, "%s", *rel ? rel : "/");
}

/* The policy's verdict for this request: 0 or -EACCES (and an event). */
static int check(sr_req_t req, struct sr_inode *dir, const char *name, int want, enum sr_op op)
{
	struct sr_caller c;
	if (!caller_of(req, &c))
		return 0;
	char path[2 * PATH_MAX];
	path_in_mount(dir, name, path, sizeof(path));
	return sr_policy_check(&c, want, op, path);
}

static int stat_inode(struct sr_inode *inode, struct stat *st)
{
	if (fstatat(inode->fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (S_ISREG(st->st_mode)) {
		int done = 0;
		pthread_mutex_lock(&inode->open_lock);
		if (inode->content) {
			off_t size;
			if (fs.cfg.content->size(inode->content, &size) == 0) {
				st->st_size = size;
				done = 1;
			}
		}
		pthread_mutex_unlock(&inode->open_lock);
		if (!done)
			fs.cfg.content->translate_stat(fs.cfg.content_layer, inode->fd, st);
	}
	if (inode == &fs.root) {
		/* The mount's root is the protected directory: its owner and mode. */
		struct stat top;
		if (fstat(fs.cfg.protected_fd, &top) == 0) {
			st->st_mode = top.st_mode;
			st->st_uid = top.st_uid;
			st->st_gid = top.st_gid;
		}
	}
	return 0;
}

static struct sr_inode *table_find(dev_t dev, ino_t ino)
{
	for (struct sr_inode *p = fs.table[bucket(dev, ino)]; p; p = p->next)
		if (p->dev == dev && p->ino == ino)
			return p;
	return NULL;
}

/* Look `name` up in `parent` and count one lookup on its inode. */
static int do_lookup(struct sr_inode *parent, const char *name, struct sr_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->attr_timeout = fs.cfg.timeout;
	e->entry_timeout = fs.cfg.timeout;
	int fd = openat(parent->fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct stat st;
	if (fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
		int e2 = errno;
		close(fd);
		return -e2;
	}
	pthread_mutex_lock(&fs.table_lock);
	struct sr_inode *inode = table_find(st.st_dev, st.st_ino);
	if (inode == &fs.root) {
		pthread_mutex_unlock(&fs.table_lock);
		close(fd);
		return -ELOOP; /* the root reached through itself (bind mounts): refuse */
	}
	if (inode) {
		inode->nlookup++;
		close(fd);
	} else {
		inode = calloc(1, sizeof(*inode));
		if (!inode) {
			pthread_mutex_unlock(&fs.table_lock);
			close(fd);
			return -ENOMEM;
		}
		inode->fd = fd;
		inode->dev = st.st_dev;
		inode->ino = st.st_ino;
		inode->type = st.st_mode & S_IFMT;
		inode->nlookup = 1;
		pthread_mutex_init(&inode->open_lock, NULL);
		pthread_mutex_init(&inode->times_lock, NULL);
		pthread_rwlock_init(&inode->io_lock, NULL);
		unsigned b = bucket(st.st_dev, st.st_ino);
		inode->next = fs.table[b];
		fs.table[b] = inode;
		__atomic_add_fetch(&inode_count, 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&fs.table_lock);
	e->ino = (sr_ino_t)(uintptr_t)inode;
	int r = stat_inode(inode, &e->attr);
	if (r < 0)
		e->attr = st;
	return 0;
}

static void forget_one(sr_ino_t ino, uint64_t n)
{
	struct sr_inode *inode = inode_of(ino);
	if (inode == &fs.root)
		return;
	pthread_mutex_lock(&fs.table_lock);
	if (n > inode->nlookup)
		n = inode->nlookup;
	inode->nlookup -= n;
	if (inode->nlookup == 0) {
		struct sr_inode **pp = &fs.table[bucket(inode->dev, inode->ino)];
		while (*pp && *pp != inode)
			pp = &(*pp)->next;
		if (*pp)
			*pp = inode->next;
		__atomic_sub_fetch(&inode_count, 1, __ATOMIC_RELAXED);
		pthread_mutex_unlock(&fs.table_lock);
		close(inode->fd);
		if (inode->content) /* cannot happen: the kernel releases before it forgets */
			fs.cfg.content->release(inode->content);
		pthread_mutex_destroy(&inode->open_lock);
		pthread_mutex_destroy(&inode->times_lock);
		pthread_rwlock_destroy(&inode->io_lock);
		free(inode);
		return;
	}
	pthread_mutex_unlock(&fs.table_lock);
}

/* A new inode belongs to its caller (the daemon runs as root). In a set-group-ID
 * directory the group stays the directory's, as the backing file system set it. */
static int give_to_caller(sr_req_t req, struct sr_inode *parent, const char *name, mode_t mode)
{
	if (!fs.as_root)
		return 0;
	const struct sr_ctx *ctx = sr_req_ctx(req);
	struct stat pst;
	if (fstatat(parent->fd, "", &pst, AT_EMPTY_PATH) < 0)
		return -errno;
	gid_t gid = (pst.st_mode & S_ISGID) ? (gid_t)-1 : ctx->gid;
	if (fchownat(parent->fd, name, ctx->uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	/* chown cleared set-user/group-ID bits the caller asked for: put them back */
	if ((mode & (S_ISUID | S_ISGID)) && !S_ISLNK(mode) &&
	    fchmodat(parent->fd, name, mode & 07777, 0) < 0)
		return -errno;
	return 0;
}

/* ---- content lifecycle ------------------------------------------------------------ */
static int content_get(struct sr_inode *inode, int fd_if_new)
{
	int r = 0;
	pthread_mutex_lock(&inode->open_lock);
	if (!inode->content) {
		int fd = fd_if_new, writable = 1;
		if (fd < 0) {
			char p[32];
			procpath(inode->fd, p);
			fd = open(p, O_RDWR | O_CLOEXEC);
			if (fd < 0 && (errno == EACCES || errno == EROFS || errno == ETXTBSY || errno == EPERM)) {
				fd = open(p, O_RDONLY | O_CLOEXEC);
				writable = 0;
			}
			if (fd < 0) {
				r = -errno;
				goto out;
			}
		}
		r = fs.cfg.content->open(fs.cfg.content_layer, fd, writable, &inode->content);
		if (r < 0) {
			close(fd);
			inode->content = NULL;
			goto out;
		}
		inode->content_writable = writable;
	} else if (fd_if_new >= 0) {
		close(fd_if_new);
	}
	inode->content_refs++;
out:
	pthread_mutex_unlock(&inode->open_lock);
	return r;
}

static void content_put(struct sr_inode *inode)
{
	pthread_mutex_lock(&inode->open_lock);
	if (--inode->content_refs == 0) {
		fs.cfg.content->release(inode->content);
		inode->content = NULL;
	}
	pthread_mutex_unlock(&inode->open_lock);
}

static int content_truncate(struct sr_inode *inode, off_t size)
{
	int r = content_get(inode, -1);
	if (r < 0)
		return r;
	if (!inode->content_writable) {
		content_put(inode);
		return -EROFS;
	}
	pthread_rwlock_wrlock(&inode->io_lock);
	r = fs.cfg.content->truncate(inode->content, size);
	pthread_rwlock_unlock(&inode->io_lock);
	content_put(inode);
	return r;
}

/* ---- online re-key (control message REKEY) ------------------------------------------ */
/* Re-encrypt the backing file at `rel` (relative to the backing directory, no symlink
 * followed) under a new file key, whether applications have it open or not. The inode is
 * pinned in the table first, so that a lookup racing with us finds this inode and
 * waits on its io_lock instead of opening the old file; its content state moves to the
 * new file, and the inode follows it (new O_PATH descriptor, new table key): the kernel's
 * node, attribute and page cache stay valid, since the plaintext does not change. */
int sr_fs_rekey(const char *rel)
{
	if (!fs.cfg.content->rekey || !fs.cfg.content->fd)
		return -EOPNOTSUPP;
	char dir[PATH_MAX];
	if (strlen(rel) >= sizeof(dir) || !*rel || rel[0] == '/')
		return -EINVAL;
	strcpy(dir, rel);
	char *slash = strrchr(dir, '/'), *name = dir;
	const char *parent_path = ".";
	if (slash) {
		*slash = '\0';
		name = slash + 1;
		parent_path = dir;
	}
	if (!*name || !strcmp(name, ".") || !strcmp(name, ".."))
		return -EINVAL;
	struct open_how how = { .flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
				.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS };
	int dirfd = (int)syscall(SYS_openat2, fs.cfg.backing_fd, parent_path, &how, sizeof(how));
	if (dirfd < 0)
		return -errno;
	struct sr_inode parent = { .fd = dirfd };
	struct sr_entry_param e;
	int r = do_lookup(&parent, name, &e);
	if (r < 0) {
		close(dirfd);
		return r;
	}
	struct sr_inode *inode = inode_of(e.ino);
	if (inode->type != S_IFREG)
		r = -EINVAL;
	else if (e.attr.st_nlink > 1)
		r = -EMLINK; /* the other names would keep the old file: not re-keyed, reported */
	if (r == 0)
		r = content_get(inode, -1);
	if (r == 0) {
		pthread_rwlock_wrlock(&inode->io_lock);
		r = fs.cfg.content->rekey(inode->content, dirfd, name);
		if (r == 0) {
			char p[32];
			procpath(fs.cfg.content->fd(inode->content), p);
			int nfd = open(p, O_PATH | O_CLOEXEC);
			struct stat st;
			if (nfd >= 0 && fstat(nfd, &st) == 0) {
				pthread_mutex_lock(&fs.table_lock);
				struct sr_inode **pp = &fs.table[bucket(inode->dev, inode->ino)];
				while (*pp && *pp != inode)
					pp = &(*pp)->next;
				if (*pp)
					*pp = inode->next;
				inode->dev = st.st_dev;
				inode->ino = st.st_ino;
				unsigned b = bucket(st.st_dev, st.st_ino);
				inode->next = fs.table[b];
				fs.table[b] = inode;
				int old = inode->fd;
				inode->fd = nfd;
				pthread_mutex_unlock(&fs.table_lock);
				close(old);
			} else if (nfd >= 0) {
				close(nfd);
			}
		}
		pthread_rwlock_unlock(&inode->io_lock);
		content_put(inode);
	}
	forget_one(e.ino, 1);
	close(dirfd);
	return r;
}

/* ---- operations ------------------------------------------------------------------- */
static void op_init(void *userdata, struct sr_conn *conn)
{
	(void)userdata;
	conn->max_write = SR_MAX_IO;
	conn->max_read = SR_MAX_IO;
	conn->max_readahead = SR_READ_AHEAD;
	/* Background requests (read-ahead, writeback) the kernel keeps in flight: enough to
	 * keep every request thread busy with cipher work while the next ones queue. */
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	/* Not FUSE_AUTO_INVAL_DATA: every change passes through us, so the kernel must not
	 * drop a file's page cache because a stat shows the mtime our own write set. Not
	 * FUSE_DONT_MASK: the kernel applies the caller's umask and, the daemon's own umask
	 * being 0, the mode it sends is the mode the file gets. Not FUSE_POSIX_LOCKS or
	 * FUSE_FLOCK_LOCKS: locks stay local to the kernel. Not FUSE_HANDLE_KILLPRIV (v1):
	 * v2 below is the one that spares the GETXATTR before every write. */
	conn->want = FUSE_ASYNC_READ | FUSE_ATOMIC_O_TRUNC | FUSE_BIG_WRITES | FUSE_ASYNC_DIO |
		     FUSE_DO_READDIRPLUS | FUSE_READDIRPLUS_AUTO | FUSE_PARALLEL_DIROPS;
	/* The daemon clears set-user/group-ID bits itself (kill_suidgid): the kernel then
	 * skips its security.capability GETXATTR before every write, a third of the round
	 * trips under an OLTP load. */
	conn->want |= FUSE_HANDLE_KILLPRIV_V2;
	/* write() completes in the page cache and reaches us in large, parallel writeback
	 * requests; sizes and mtimes are the kernel's while it caches (README.md). */
	if (fs.cfg.writeback_cache && (conn->capable & FUSE_WRITEBACK_CACHE)) {
		conn->want |= FUSE_WRITEBACK_CACHE;
		__atomic_store_n(&fs.writeback, 1, __ATOMIC_RELEASE);
	}
	if (fs.cfg.io_uring)
		conn->want |= FUSE_OVER_IO_URING;
}

static void op_lookup(sr_req_t req, sr_ino_t parent, const char *name)
{
	struct sr_entry_param e;
	int r = do_lookup(inode_of(parent), name, &e);
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

static void op_forget(sr_req_t req, sr_ino_t ino, uint64_t nlookup)
{
	forget_one(ino, nlookup);
	sr_reply_none(req);
}

static void op_getattr(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	(void)fi;
	struct stat st;
	int r = stat_inode(inode_of(ino), &st);
	if (r < 0)
		sr_reply_err(req, -r);
	else
		sr_reply_attr(req, &st, fs.cfg.timeout);
}

/* FUSE_HANDLE_KILLPRIV_V2: a write or truncate by a caller without CAP_FSETID clears
 * set-user-ID, and set-group-ID when group-executable (as the VFS does). The daemon
 * writes as root, whom the backing file system would let keep them. chown needs nothing:
 * Linux clears them on chown even for root. */
static int kill_suidgid(struct sr_inode *inode)
{
	struct stat st;
	if (inode->type != S_IFREG || fstatat(inode->fd, "", &st, AT_EMPTY_PATH) < 0)
		return 0;
	mode_t kill = S_ISUID | ((st.st_mode & S_IXGRP) ? S_ISGID : 0);
	if (!(st.st_mode & kill))
		return 0;
	char p[32];
	procpath(inode->fd, p);
	return chmod(p, st.st_mode & 07777 & ~kill) < 0 ? -errno : 0;
}

static void op_setattr(sr_req_t req, sr_ino_t ino, struct stat *attr, uint32_t valid,
		       struct sr_file_info *fi)
{
	struct sr_inode *inode = inode_of(ino);
	char p[32];
	int r = check(req, inode, NULL, SR_ACCESS_WRITE,
		      (valid & FATTR_SIZE) ? SR_OP_TRUNCATE : SR_OP_SETATTR);
	if (r < 0)
		goto out;
	procpath(inode->fd, p);
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
		if (sealed()) {
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
		if ((valid & FATTR_KILL_SUIDGID) && (r = kill_suidgid(inode)) < 0)
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
	op_getattr(req, ino, NULL);
}

static void op_readlink(sr_req_t req, sr_ino_t ino)
{
	char buf[PATH_MAX + 1];
	ssize_t n = readlinkat(inode_of(ino)->fd, "", buf, sizeof(buf));
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
	struct sr_inode *parent = inode_of(parent_ino);
	int r = check(req, parent, name, SR_ACCESS_WRITE, op);
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
	r = give_to_caller(req, parent, name, mode);
	if (r == 0)
		r = do_lookup(parent, name, &e);
	if (r < 0) {
		unlinkat(parent->fd, name, S_ISDIR(mode) ? AT_REMOVEDIR : 0);
		sr_reply_err(req, -r);
		return;
	}
	sr_reply_entry(req, &e);
}

static void op_mknod(sr_req_t req, sr_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	(void)rdev;
	make_node(req, parent, name, mode, NULL, SR_OP_MKNOD);
}

static void op_mkdir(sr_req_t req, sr_ino_t parent, const char *name, mode_t mode)
{
	make_node(req, parent, name, S_IFDIR | (mode & 07777), NULL, SR_OP_MKDIR);
}

static void op_symlink(sr_req_t req, const char *link, sr_ino_t parent, const char *name)
{
	make_node(req, parent, name, S_IFLNK | 0777, link, SR_OP_SYMLINK);
}

static void op_link(sr_req_t req, sr_ino_t ino, sr_ino_t newparent, const char *newname)
{
	struct sr_inode *inode = inode_of(ino), *parent = inode_of(newparent);
	int r = check(req, parent, newname, SR_ACCESS_WRITE, SR_OP_LINK);
	if (r < 0) {
		sr_reply_err(req, -r);
		return;
	}
	char p[32];
	procpath(inode->fd, p);
	if (linkat(AT_FDCWD, p, parent->fd, newname, AT_SYMLINK_FOLLOW) < 0) {
		sr_reply_err(req, errno);
		return;
	}
	struct sr_entry_param e;
	r = do_lookup(parent, newname, &e);
	if (r < 0)
		sr_reply_err(req, -r);
	else
		sr_reply_entry(req, &e);
}

static void op_unlink(sr_req_t req, sr_ino_t parent, const char *name)
{
	struct sr_inode *dir = inode_of(parent);
	int r = check(req, dir, name, SR_ACCESS_WRITE, SR_OP_UNLINK);
	if (r == 0 && unlinkat(dir->fd, name, 0) < 0)
		r = -errno;
	sr_reply_err(req, -r);
}

static void op_rmdir(sr_req_t req, sr_ino_t parent, const char *name)
{
	struct sr_inode *dir = inode_of(parent);
	int r = check(req, dir, name, SR_ACCESS_WRITE, SR_OP_RMDIR);
	if (r == 0 && unlinkat(dir->fd, name, AT_REMOVEDIR) < 0)
		r = -errno;
	sr_reply_err(req, -r);
}

static void op_rename(sr_req_t req, sr_ino_t parent, const char *name, sr_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	struct sr_inode *from = inode_of(parent), *to = inode_of(newparent);
	if (flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE)) {
		sr_reply_err(req, EINVAL); /* RENAME_WHITEOUT: overlay upper layers only */
		return;
	}
	int r = check(req, from, name, SR_ACCESS_WRITE, SR_OP_RENAME);
	if (r == 0)
		r = check(req, to, newname, SR_ACCESS_WRITE, SR_OP_RENAME);
	if (r == 0 && renameat2(from->fd, name, to->fd, newname, flags) < 0)
		r = -errno;
	sr_reply_err(req, -r);
}

static int open_want(int flags)
{
	int acc = flags & O_ACCMODE, want = 0;
	if (acc != O_WRONLY)
		want |= SR_ACCESS_READ;
	if (acc != O_RDONLY || (flags & O_TRUNC))
		want |= SR_ACCESS_WRITE;
	return want;
}

static int finish_open(struct sr_inode *inode, struct sr_file_info *fi, int fd_if_new)
{
	int r = content_get(inode, fd_if_new);
	if (r < 0)
		return r;
	int writes = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
	if (writes && !inode->content_writable) {
		content_put(inode);
		return -EROFS;
	}
	if ((fi->flags & O_TRUNC) && fd_if_new < 0) {
		pthread_rwlock_wrlock(&inode->io_lock);
		r = fs.cfg.content->truncate(inode->content, 0);
		pthread_rwlock_unlock(&inode->io_lock);
		if (r == 0 && (fi->open_flags & FUSE_OPEN_KILL_SUIDGID))
			r = kill_suidgid(inode);
		if (r < 0) {
			content_put(inode);
			return r;
		}
	}
	struct sr_handle *h = malloc(sizeof(*h));
	if (!h) {
		content_put(inode);
		return -ENOMEM;
	}
	h->inode = inode;
	h->flags = fi->flags;
	handle_add(h);
	fi->fh = (uint64_t)(uintptr_t)h;
	/* Keep the page cache across opens: every change passes through this mount. */
	fi->keep_cache = 1;
	return 0;
}

static void op_open(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	struct sr_inode *inode = inode_of(ino);
	if (sealed()) {
		sr_reply_err(req, EIO);
		return;
	}
	int r = check(req, inode, NULL, open_want(fi->flags), SR_OP_OPEN);
	if (r == 0)
		r = finish_open(inode, fi, -1);
	if (r < 0) {
		sr_reply_err(req, -r);
	} else if (sr_reply_open(req, fi) == -ENOENT) {
		/* the caller was interrupted: no release will come for this handle */
		content_put(inode);
		handle_free((struct sr_handle *)(uintptr_t)fi->fh);
	}
}

static void op_create(sr_req_t req, sr_ino_t parent_ino, const char *name, mode_t mode,
		      struct sr_file_info *fi)
{
	struct sr_inode *parent = inode_of(parent_ino);
	struct sr_entry_param e;
	if (sealed()) {
		sr_reply_err(req, EIO);
		return;
	}
	int r = check(req, parent, name, SR_ACCESS_WRITE, SR_OP_CREATE);
	if (r < 0) {
		sr_reply_err(req, -r);
		return;
	}
	int fd = openat(parent->fd, name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW, mode & 07777);
	if (fd < 0 && errno == EEXIST && !(fi->flags & O_EXCL)) {
		/* created behind the kernel's back since its lookup: open what is there */
		r = do_lookup(parent, name, &e);
		if (r == 0 && !S_ISREG(e.attr.st_mode))
			r = S_ISDIR(e.attr.st_mode) ? -EISDIR : -EEXIST;
		if (r == 0) {
			r = check(req, parent, name, open_want(fi->flags), SR_OP_OPEN);
			if (r == 0)
				r = finish_open(inode_of(e.ino), fi, -1);
			if (r < 0)
				forget_one(e.ino, 1);
		}
		if (r < 0)
			sr_reply_err(req, -r);
		else
			sr_reply_create(req, &e, fi);
		return;
	}
	if (fd < 0) {
		sr_reply_err(req, errno);
		return;
	}
	r = fs.cfg.content->init_new(fs.cfg.content_layer, fd);
	if (r == 0)
		r = give_to_caller(req, parent, name, S_IFREG | mode);
	if (r == 0)
		r = do_lookup(parent, name, &e);
	if (r == 0) {
		r = finish_open(inode_of(e.ino), fi, fd);
		fd = -1; /* finish_open took it, or closed it */
		if (r < 0)
			forget_one(e.ino, 1);
	}
	if (r < 0) {
		/* a failed create leaves nothing behind */
		if (fd >= 0)
			close(fd);
		unlinkat(parent->fd, name, 0);
		sr_reply_err(req, -r);
		return;
	}
	if (sr_reply_create(req, &e, fi) == -ENOENT) {
		content_put(inode_of(e.ino));
		handle_free((struct sr_handle *)(uintptr_t)fi->fh);
	}
}

static void op_read(sr_req_t req, sr_ino_t ino, size_t size, off_t off, struct sr_file_info *fi)
{
	(void)ino;
	struct sr_handle *h = (struct sr_handle *)(uintptr_t)fi->fh;
	if (sealed()) {
		sr_reply_err(req, EIO);
		return;
	}
	if (size > SR_MAX_IO)
		size = SR_MAX_IO;
	/* decrypted straight into the buffer the reply leaves from */
	char *buf = sr_reply_data_buf(req, size);
	if (!buf) {
		sr_reply_err(req, EINVAL);
		return;
	}
	pthread_rwlock_rdlock(&h->inode->io_lock);
	ssize_t n = fs.cfg.content->read(h->inode->content, buf, size, off);
	pthread_rwlock_unlock(&h->inode->io_lock);
	if (n < 0)
		sr_reply_err(req, (int)-n);
	else
		sr_reply_data(req, (size_t)n);
}

static void op_write(sr_req_t req, sr_ino_t ino, const char *buf, size_t size, off_t off,
		     struct sr_file_info *fi)
{
	struct sr_handle *h = (struct sr_handle *)(uintptr_t)fi->fh;
	struct sr_inode *inode = h->inode;
	ssize_t n;
	if (sealed()) {
		sr_reply_err(req, EIO);
		return;
	}
	/* Writeback: the kernel placed O_APPEND writes at its own size, which is the size
	 * while it caches (and a writeback request may come through any writable handle). */
	int cached = (fi->write_flags & FUSE_WRITE_CACHE) || __atomic_load_n(&fs.writeback, __ATOMIC_ACQUIRE);
	/* Under the writeback cache the kernel owns mtime: it stamped the write() when it
	 * happened and sends SETATTR when its value changes (not when a write falls in the
	 * tick of the create). Our pwrite, later, must not restamp the backing file: its
	 * mtime is put back as it was, under times_lock so a SETATTR in between is kept. */
	int keep_mtime = (fi->write_flags & FUSE_WRITE_CACHE) != 0;
	struct stat before;
	if (keep_mtime) {
		pthread_mutex_lock(&inode->times_lock);
		if (fstatat(inode->fd, "", &before, AT_EMPTY_PATH) < 0)
			keep_mtime = -1; /* unknown: leave it to the kernel's next SETATTR */
	}
	if ((h->flags & O_APPEND) && !cached) {
		/* at the end as it is now, not where the kernel's cached size says */
		pthread_rwlock_wrlock(&inode->io_lock);
		off_t end;
		n = fs.cfg.content->size(inode->content, &end);
		if (n == 0)
			n = fs.cfg.content->write(inode->content, buf, size, end);
	} else {
		pthread_rwlock_rdlock(&inode->io_lock);
		n = fs.cfg.content->write(inode->content, buf, size, off);
	}
	pthread_rwlock_unlock(&inode->io_lock);
	if (keep_mtime) {
		if (keep_mtime > 0 && n > 0) {
			char p[32];
			struct timespec tv[2] = { { .tv_nsec = UTIME_OMIT }, before.st_mtim };
			procpath(inode->fd, p);
			(void)utimensat(AT_FDCWD, p, tv, 0);
		}
		pthread_mutex_unlock(&inode->times_lock);
	}
	if (n > 0 && (fi->write_flags & FUSE_WRITE_KILL_SUIDGID)) {
		int r = kill_suidgid(inode);
		if (r < 0)
			n = r;
	}
	/* O_DSYNC through the writeback cache: the kernel follows the write with FSYNC */
	if (n > 0 && (h->flags & O_DSYNC) && !(fi->write_flags & FUSE_WRITE_CACHE)) {
		int r = fs.cfg.content->fsync(inode->content, (h->flags & O_SYNC) != O_SYNC);
		if (r < 0)
			n = r;
	}
	if (n < 0) {
		sr_reply_err(req, (int)-n);
		/* A writeback request failed: the kernel keeps the pages, clean, holding what is
		 * not stored, and reports the error at the next fsync. Drop them once this reply
		 * has released them, so that reads show what the backing file holds. */
		if (fi->write_flags & FUSE_WRITE_CACHE)
			(void)sr_notify_inval_inode_later(req->se, ino, off, (off_t)size);
	} else {
		sr_reply_write(req, (size_t)n);
	}
}

static void op_flush(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	(void)ino;
	struct sr_handle *h = (struct sr_handle *)(uintptr_t)fi->fh;
	sr_reply_err(req, -fs.cfg.content->flush(h->inode->content));
}

static void op_release(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	(void)ino;
	struct sr_handle *h = (struct sr_handle *)(uintptr_t)fi->fh;
	content_put(h->inode);
	handle_free(h);
	sr_reply_err(req, 0);
}

static void op_fsync(sr_req_t req, sr_ino_t ino, int datasync, struct sr_file_info *fi)
{
	(void)ino;
	struct sr_handle *h = (struct sr_handle *)(uintptr_t)fi->fh;
	sr_reply_err(req, -fs.cfg.content->fsync(h->inode->content, datasync));
}

static void op_fallocate(sr_req_t req, sr_ino_t ino, int mode, off_t off, off_t len,
			 struct sr_file_info *fi)
{
	(void)ino;
	struct sr_handle *h = (struct sr_handle *)(uintptr_t)fi->fh;
	if (!fs.cfg.content->fallocate || sealed()) {
		sr_reply_err(req, sealed() ? EIO : EOPNOTSUPP);
		return;
	}
	pthread_rwlock_wrlock(&h->inode->io_lock);
	int r = fs.cfg.content->fallocate(h->inode->content, mode, off, len);
	pthread_rwlock_unlock(&h->inode->io_lock);
	sr_reply_err(req, -r);
}

/* ---- directories ------------------------------------------------------------------ */
static void op_opendir(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	struct sr_dir *d = calloc(1, sizeof(*d));
	if (!d) {
		sr_reply_err(req, ENOMEM);
		return;
	}
	int fd = openat(inode_of(ino)->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
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
	struct sr_inode *dir = inode_of(ino);
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
				int r = do_lookup(dir, name, &e);
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
					forget_one(e.ino, 1);
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

static void op_readdir(sr_req_t req, sr_ino_t ino, size_t size, off_t off, struct sr_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 0);
}

static void op_readdirplus(sr_req_t req, sr_ino_t ino, size_t size, off_t off,
			   struct sr_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 1);
}

static void op_releasedir(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi)
{
	(void)ino;
	struct sr_dir *d = (struct sr_dir *)(uintptr_t)fi->fh;
	closedir(d->dp);
	free(d);
	sr_reply_err(req, 0);
}

static void op_fsyncdir(sr_req_t req, sr_ino_t ino, int datasync, struct sr_file_info *fi)
{
	(void)ino;
	struct sr_dir *d = (struct sr_dir *)(uintptr_t)fi->fh;
	int fd = dirfd(d->dp);
	int r = datasync ? fdatasync(fd) : fsync(fd);
	sr_reply_err(req, r < 0 ? errno : 0);
}

static void op_statfs(sr_req_t req, sr_ino_t ino)
{
	(void)ino;
	struct statvfs sv;
	if (fstatvfs(fs.cfg.backing_fd, &sv) < 0)
		sr_reply_err(req, errno);
	else
		sr_reply_statfs(req, &sv);
}

/* ---- extended attributes: through /proc/self/fd (no f*xattr on O_PATH) ------------ */
static void op_getxattr(sr_req_t req, sr_ino_t ino, const char *name, size_t size)
{
	struct sr_inode *inode = inode_of(ino);
	char p[32];
	if (inode->type == S_IFLNK) {
		sr_reply_err(req, ENODATA);
		return;
	}
	procpath(inode->fd, p);
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

static void op_listxattr(sr_req_t req, sr_ino_t ino, size_t size)
{
	struct sr_inode *inode = inode_of(ino);
	char p[32];
	if (inode->type == S_IFLNK) {
		if (size == 0)
			sr_reply_xattr(req, 0);
		else
			sr_reply_buf(req, NULL, 0);
		return;
	}
	procpath(inode->fd, p);
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

static void op_setxattr(sr_req_t req, sr_ino_t ino, const char *name, const char *value,
			size_t size, int flags)
{
	struct sr_inode *inode = inode_of(ino);
	char p[32];
	int r = check(req, inode, NULL, SR_ACCESS_WRITE, SR_OP_SETXATTR);
	if (r == 0 && inode->type == S_IFLNK)
		r = -EPERM; /* as Linux answers for user.* on a symlink */
	if (r == 0) {
		procpath(inode->fd, p);
		if (setxattr(p, name, value, size, flags) < 0)
			r = -errno;
	}
	sr_reply_err(req, -r);
}

static void op_removexattr(sr_req_t req, sr_ino_t ino, const char *name)
{
	struct sr_inode *inode = inode_of(ino);
	char p[32];
	int r = check(req, inode, NULL, SR_ACCESS_WRITE, SR_OP_REMOVEXATTR);
	if (r == 0 && inode->type == S_IFLNK)
		r = -ENODATA;
	if (r == 0) {
		procpath(inode->fd, p);
		if (removexattr(p, name) < 0)
			r = -errno;
	}
	sr_reply_err(req, -r);
}

const struct sr_ops sr_fs_ops = {
	.init = op_init,
	.lookup = op_lookup,
	.forget = op_forget,
	.getattr = op_getattr,
	.setattr = op_setattr,
	.readlink = op_readlink,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.symlink = op_symlink,
	.link = op_link,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.rename = op_rename,
	.open = op_open,
	.create = op_create,
	.read = op_read,
	.write = op_write,
	.flush = op_flush,
	.release = op_release,
	.fsync = op_fsync,
	.fallocate = op_fallocate,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.readdirplus = op_readdirplus,
	.releasedir = op_releasedir,
	.fsyncdir = op_fsyncdir,
	.statfs = op_statfs,
	.getxattr = op_getxattr,
	.listxattr = op_listxattr,
	.setxattr = op_setxattr,
	.removexattr = op_removexattr,
};

/* Shutdown, before the unmount: refuse every read, write and open from now on, then
 * drop the kernel's cached pages of every open file, so descriptors still open after
 * the mount is gone read no plaintext from the page cache. The request loop must still
 * run (dropping dirty mmap pages writes them back through us). */
void sr_fs_seal(struct sr_session *se)
{
	__atomic_store_n(&fs.sealed, 1, __ATOMIC_RELEASE);
	size_t n = 0, cap = 64;
	sr_ino_t *open_inodes = malloc(cap * sizeof(*open_inodes));
	if (!open_inodes)
		return;
	pthread_mutex_lock(&fs.table_lock);
	for (unsigned b = 0; b < TABLE_SIZE; b++) {
		for (struct sr_inode *p = fs.table[b]; p; p = p->next) {
			if (p == &fs.root || p->type != S_IFREG)
				continue;
			if (n == cap) {
				sr_ino_t *bigger = realloc(open_inodes, 2 * cap * sizeof(*open_inodes));
				if (!bigger)
					break;
				open_inodes = bigger;
				cap *= 2;
			}
			open_inodes[n++] = (sr_ino_t)(uintptr_t)p;
		}
	}
	pthread_mutex_unlock(&fs.table_lock);
	/* every regular inode the kernel knows: a file closed a moment ago has cached pages
	 * too. The kernel may forget some meanwhile: notifying an unknown node is harmless. */
	for (size_t i = 0; i < n; i++)
		(void)sr_notify_inval_inode(se, open_inodes[i], 0, 0);
	free(open_inodes);
}

int sr_fs_init(const struct sr_fs_config *cfg)
{
	fs.cfg = *cfg;
	pthread_mutex_init(&fs.table_lock, NULL);
	pthread_mutex_init(&fs.handles_lock, NULL);
	fs.handles.next = fs.handles.prev = &fs.handles;
	struct stat st;
	if (fstatat(cfg->backing_fd, "", &st, AT_EMPTY_PATH) < 0)
		return -errno;
	fs.root.fd = cfg->backing_fd;
	fs.root.dev = st.st_dev;
	fs.root.ino = st.st_ino;
	fs.root.type = S_IFDIR;
	fs.root.nlookup = 2;
	pthread_mutex_init(&fs.root.open_lock, NULL);
	pthread_mutex_init(&fs.root.times_lock, NULL);
	pthread_rwlock_init(&fs.root.io_lock, NULL);
	fs.table[bucket(st.st_dev, st.st_ino)] = &fs.root;
	fs.as_root = geteuid() == 0;
	return 0;
}

/* After the session ended: inodes the kernel never forgot (an unmount forgets nothing). */
void sr_fs_destroy(void)
{
	while (fs.handles.next != &fs.handles)
		handle_free(fs.handles.next);
	for (unsigned b = 0; b < TABLE_SIZE; b++) {
		struct sr_inode *p = fs.table[b];
		while (p) {
			struct sr_inode *next = p->next;
			if (p != &fs.root) {
				if (p->content)
					fs.cfg.content->release(p->content);
				close(p->fd);
				pthread_mutex_destroy(&p->open_lock);
				pthread_mutex_destroy(&p->times_lock);
				pthread_rwlock_destroy(&p->io_lock);
				free(p);
			}
			p = next;
		}
		fs.table[b] = NULL;
	}
}
