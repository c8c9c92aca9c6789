/* What the file system's files (fs.c and fs_*.c) share: the inode table, the handles, the
 * helpers every operation uses, and the operations sr_fs_ops (fs.c) points at. Private to
 * them; the daemon's view is fs.h. */
#ifndef SR_FS_INTERNAL_H
#define SR_FS_INTERNAL_H

#include "fs.h"
#include "control.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

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

#define TABLE_SIZE 65536u /* buckets: chains stay short at 10^5..10^6 inodes */

struct fs_state {
	struct sr_fs_config cfg;
	struct sr_inode root;
	pthread_mutex_t table_lock;
	struct sr_inode *table[TABLE_SIZE];
	int as_root;
	pthread_mutex_t handles_lock;
	struct sr_handle handles; /* list head */
	int sealed; /* shutting down: no more plaintext (sr_fs_seal) */
	int writeback; /* the kernel's writeback cache was negotiated */
};

extern struct fs_state fs; /* fs.c */

/* fs.c: state, inode table, policy, content lifecycle */
int fs_sealed(void);
void fs_handle_add(struct sr_handle *h);
void fs_handle_free(struct sr_handle *h);
struct sr_inode *fs_inode_of(sr_ino_t ino);
void fs_procpath(int fd, char buf[32]);
unsigned fs_bucket(dev_t dev, ino_t ino);
int fs_check(sr_req_t req, struct sr_inode *dir, const char *name, int want, enum sr_op op);
int fs_stat_inode(struct sr_inode *inode, struct stat *st);
int fs_do_lookup(struct sr_inode *parent, const char *name, struct sr_entry_param *e);
void fs_forget_one(sr_ino_t ino, uint64_t n);
int fs_give_to_caller(sr_req_t req, struct sr_inode *parent, const char *name, mode_t mode);
int fs_content_get(struct sr_inode *inode, int fd_if_new);
void fs_content_put(struct sr_inode *inode);

/* fs_names.c: the namespace */
void fs_op_lookup(sr_req_t req, sr_ino_t parent, const char *name);
void fs_op_forget(sr_req_t req, sr_ino_t ino, uint64_t nlookup);
void fs_op_readlink(sr_req_t req, sr_ino_t ino);
void fs_op_mknod(sr_req_t req, sr_ino_t parent, const char *name, mode_t mode, dev_t rdev);
void fs_op_mkdir(sr_req_t req, sr_ino_t parent, const char *name, mode_t mode);
void fs_op_symlink(sr_req_t req, const char *link, sr_ino_t parent, const char *name);
void fs_op_link(sr_req_t req, sr_ino_t ino, sr_ino_t newparent, const char *newname);
void fs_op_unlink(sr_req_t req, sr_ino_t parent, const char *name);
void fs_op_rmdir(sr_req_t req, sr_ino_t parent, const char *name);
void fs_op_rename(sr_req_t req, sr_ino_t parent, const char *name, sr_ino_t newparent,
		  const char *newname, unsigned int flags);

/* fs_attr.c: attributes */
int fs_kill_suidgid(struct sr_inode *inode);
void fs_op_getattr(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi);
void fs_op_setattr(sr_req_t req, sr_ino_t ino, struct stat *attr, uint32_t valid,
		   struct sr_file_info *fi);
void fs_op_statfs(sr_req_t req, sr_ino_t ino);

/* fs_data.c: the data path */
void fs_op_open(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi);
void fs_op_create(sr_req_t req, sr_ino_t parent_ino, const char *name, mode_t mode,
		  struct sr_file_info *fi);
void fs_op_read(sr_req_t req, sr_ino_t ino, size_t size, off_t off, struct sr_file_info *fi);
void fs_op_write(sr_req_t req, sr_ino_t ino, const char *buf, size_t size, off_t off,
		 struct sr_file_info *fi);
void fs_op_flush(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi);
void fs_op_release(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi);
void fs_op_fsync(sr_req_t req, sr_ino_t ino, int datasync, struct sr_file_info *fi);
void fs_op_fallocate(sr_req_t req, sr_ino_t ino, int mode, off_t off, off_t len,
		     struct sr_file_info *fi);

/* fs_dir.c: directories */
void fs_op_opendir(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi);
void fs_op_readdir(sr_req_t req, sr_ino_t ino, size_t size, off_t off, struct sr_file_info *fi);
void fs_op_readdirplus(sr_req_t req, sr_ino_t ino, size_t size, off_t off,
		       struct sr_file_info *fi);
void fs_op_releasedir(sr_req_t req, sr_ino_t ino, struct sr_file_info *fi);
void fs_op_fsyncdir(sr_req_t req, sr_ino_t ino, int datasync, struct sr_file_info *fi);

/* fs_xattr.c: extended attributes */
void fs_op_getxattr(sr_req_t req, sr_ino_t ino, const char *name, size_t size);
void fs_op_listxattr(sr_req_t req, sr_ino_t ino, size_t size);
void fs_op_setxattr(sr_req_t req, sr_ino_t ino, const char *name, const char *value,
		    size_t size, int flags);
void fs_op_removexattr(sr_req_t req, sr_ino_t ino, const char *name);

#endif
