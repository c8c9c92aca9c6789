/* Online re-key (control message REKEY) of one backing file, open or not. */
#define _GNU_SOURCE
#include "fs_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <linux/openat2.h>
#include <unistd.h>

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
	int r = fs_do_lookup(&parent, name, &e);
	if (r < 0) {
		close(dirfd);
		return r;
	}
	struct sr_inode *inode = fs_inode_of(e.ino);
	if (inode->type != S_IFREG)
		r = -EINVAL;
	else if (e.attr.st_nlink > 1)
		r = -EMLINK; /* the other names would keep the old file: not re-keyed, reported */
	if (r == 0)
		r = fs_content_get(inode, -1);
	if (r == 0) {
		pthread_rwlock_wrlock(&inode->io_lock);
		r = fs.cfg.content->rekey(inode->content, dirfd, name);
		if (r == 0) {
			char p[32];
			fs_procpath(fs.cfg.content->fd(inode->content), p);
			int nfd = open(p, O_PATH | O_CLOEXEC);
			struct stat st;
			if (nfd >= 0 && fstat(nfd, &st) == 0) {
				pthread_mutex_lock(&fs.table_lock);
				struct sr_inode **pp = &fs.table[fs_bucket(inode->dev, inode->ino)];
				while (*pp && *pp != inode)
					pp = &(*pp)->next;
				if (*pp)
					*pp = inode->next;
				inode->dev = st.st_dev;
				inode->ino = st.st_ino;
				unsigned b = fs_bucket(st.st_dev, st.st_ino);
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
		fs_content_put(inode);
	}
	fs_forget_one(e.ino, 1);
	close(dirfd);
	return r;
}
