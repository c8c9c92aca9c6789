/* The low-level FUSE operations over a backing directory (fs.c). */
#ifndef SR_FS_H
#define SR_FS_H

#include "transport.h"

#include "content.h"

struct sr_fs_config {
	int backing_fd;        /* O_PATH | O_DIRECTORY of the backing directory */
	int protected_fd;      /* the protected directory itself, opened before the mount */
	const char *backing_path; /* resolved, for naming objects in events */
	const struct sr_content_ops *content;
	void *content_layer;
	double timeout;        /* attribute and entry cache, seconds */
	int writeback_cache;   /* take the kernel's writeback cache when offered */
	int io_uring;          /* ask for FUSE over io_uring */
};

extern const struct sr_ops sr_fs_ops;
int sr_fs_init(const struct sr_fs_config *cfg);
void sr_fs_destroy(void);
void sr_fs_seal(struct sr_session *se);

#define SR_MAX_IO (1u << 20)
/* The kernel reads ahead this much in SR_MAX_IO requests, several in flight at once: they
 * are decrypted in parallel by the request threads. */
#define SR_READ_AHEAD (4u << 20)

#endif
