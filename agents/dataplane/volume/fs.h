/* The low-level FUSE operations of strongroom-volume (fs.c): a root directory (inode 1)
 * holding one regular file (inode 2), the volume's plaintext. */
#ifndef SV_FS_H
#define SV_FS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <sys/types.h>
#include <time.h>

#include "volume_io.h"

#define SV_ROOT_INO 1
#define SV_FILE_INO 2

/* The session's userdata. */
struct sv_fs {
	struct vio *vio;
	const char *name;      /* the file's name in the root */
	uint64_t size;         /* the data segment's length: never changes */
	uid_t uid;             /* owner of both inodes: the daemon's */
	gid_t gid;
	struct timespec start; /* the container's mtime when served: the root's times */
	pthread_mutex_t lock;  /* guards mtime */
	struct timespec mtime; /* the file's: start, then the last write */
	int writeback;         /* --writeback-cache */
};

extern const struct fuse_lowlevel_ops sv_fs_ops;

#endif
