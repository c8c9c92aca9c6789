/* The guard point's file system on the transport's low-level operations (transport.h).
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
 * operation. Regular files' bytes go through the content layer only (content.h).
 *
 * This file holds the state, the inode table, the helpers and the operation table;
 * the operations themselves are in fs_names.c, fs_attr.c, fs_data.c, fs_dir.c and
 * fs_xattr.c, the online re-key in fs_rekey.c (shared declarations: fs_internal.h). */
#define _GNU_SOURCE
#include "fs_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t inode_count; /* inodes the kernel holds lookups on, the root excluded */

uint64_t sr_fs_inodes(void)
{
	return __atomic_load_n(&inode_count, __ATOMIC_RELAXED);
}

struct fs_state fs;

int fs_sealed(void)
{
	return __atomic_load_n(&fs.sealed, __ATOMIC_ACQUIRE);
}

void fs_handle_add(struct sr_handle *h)
{
	pthread_mutex_lock(&fs.handles_lock);
	h->next = fs.handles.next;
	h->prev = &fs.handles;
	fs.handles.next->prev = h;
	fs.handles.next = h;
	pthread_mutex_unlock(&fs.handles_lock);
}

void fs_handle_free(struct sr_handle *h)
{
	pthread_mutex_lock(&fs.handles_lock);
	h->prev->next = h->next;
	h->next->prev = h->prev;
	pthread_mutex_unlock(&fs.handles_lock);
	free(h);
}

/* ---- helpers --------------------------------------------------------------------- */
struct sr_inode *fs_inode_of(sr_ino_t ino)
{
	return ino == SR_ROOT_ID ? &fs.root : (struct sr_inode *)(uintptr_t)ino;
}

void fs_procpath(int fd, char buf[32])
{
	snprintf(buf, 32, "/proc/self/fd/%d", fd);
}

unsigned fs_bucket(dev_t dev, ino_t ino)
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
	fs_procpath(dir->fd, link);
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
int fs_check(sr_req_t req, struct sr_inode *dir, const char *name, int want, enum sr_op op)
{
	struct sr_caller c;
	if (!caller_of(req, &c))
		return 0;
	char path[2 * PATH_MAX];
	path_in_mount(dir, name, path, sizeof(path));
	return sr_policy_check(&c, want, op, path);
}

int fs_stat_inode(struct sr_inode *inode, struct stat *st)
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
	for (struct sr_inode *p = fs.table[fs_bucket(dev, ino)]; p; p = p->next)
		if (p->dev == dev && p->ino == ino)
			return p;
	return NULL;
}

/* Look `name` up in `parent` and count one lookup on its inode. */
int fs_do_lookup(struct sr_inode *parent, const char *name, struct sr_entry_param *e)
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
		unsigned b = fs_bucket(st.st_dev, st.st_ino);
		inode->next = fs.table[b];
		fs.table[b] = inode;
		__atomic_add_fetch(&inode_count, 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&fs.table_lock);
	e->ino = (sr_ino_t)(uintptr_t)inode;
	int r = fs_stat_inode(inode, &e->attr);
	if (r < 0)
		e->attr = st;
	return 0;
}

void fs_forget_one(sr_ino_t ino, uint64_t n)
{
	struct sr_inode *inode = fs_inode_of(ino);
	if (inode == &fs.root)
		return;
	pthread_mutex_lock(&fs.table_lock);
	if (n > inode->nlookup)
		n = inode->nlookup;
	inode->nlookup -= n;
	if (inode->nlookup == 0) {
		struct sr_inode **pp = &fs.table[fs_bucket(inode->dev, inode->ino)];
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
int fs_give_to_caller(sr_req_t req, struct sr_inode *parent, const char *name, mode_t mode)
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
int fs_content_get(struct sr_inode *inode, int fd_if_new)
{
	int r = 0;
	pthread_mutex_lock(&inode->open_lock);
	if (!inode->content) {
		int fd = fd_if_new, writable = 1;
		if (fd < 0) {
			char p[32];
			fs_procpath(inode->fd, p);
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

void fs_content_put(struct sr_inode *inode)
{
	pthread_mutex_lock(&inode->open_lock);
	if (--inode->content_refs == 0) {
		fs.cfg.content->release(inode->content);
		inode->content = NULL;
	}
	pthread_mutex_unlock(&inode->open_lock);
}

/* ---- INIT, and the operations table ------------------------------------------- */
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
const struct sr_ops sr_fs_ops = {
	.init = op_init,
	.lookup = fs_op_lookup,
	.forget = fs_op_forget,
	.getattr = fs_op_getattr,
	.setattr = fs_op_setattr,
	.readlink = fs_op_readlink,
	.mknod = fs_op_mknod,
	.mkdir = fs_op_mkdir,
	.symlink = fs_op_symlink,
	.link = fs_op_link,
	.unlink = fs_op_unlink,
	.rmdir = fs_op_rmdir,
	.rename = fs_op_rename,
	.open = fs_op_open,
	.create = fs_op_create,
	.read = fs_op_read,
	.write = fs_op_write,
	.flush = fs_op_flush,
	.release = fs_op_release,
	.fsync = fs_op_fsync,
	.fallocate = fs_op_fallocate,
	.opendir = fs_op_opendir,
	.readdir = fs_op_readdir,
	.readdirplus = fs_op_readdirplus,
	.releasedir = fs_op_releasedir,
	.fsyncdir = fs_op_fsyncdir,
	.statfs = fs_op_statfs,
	.getxattr = fs_op_getxattr,
	.listxattr = fs_op_listxattr,
	.setxattr = fs_op_setxattr,
	.removexattr = fs_op_removexattr,
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
	fs.table[fs_bucket(st.st_dev, st.st_ino)] = &fs.root;
	fs.as_root = geteuid() == 0;
	return 0;
}

/* After the session ended: inodes the kernel never forgot (an unmount forgets nothing). */
void sr_fs_destroy(void)
{
	while (fs.handles.next != &fs.handles)
		fs_handle_free(fs.handles.next);
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
