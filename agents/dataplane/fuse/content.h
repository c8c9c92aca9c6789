/* The content layer: how a regular file's bytes in the mount map to its bytes in the
 * backing directory. The FUSE core (fs.c) never touches a regular file's data except
 * through these calls, so format v1 encryption (libsrcf) plugs in here and nowhere else.
 *
 * One `struct sr_content` exists per open backing inode and is shared by every handle
 * on it (hard links and concurrent opens see one state). The core serialises calls
 * that change the size (truncate, appends) with the inode's write lock; read and write
 * at explicit offsets may run concurrently from several threads, so a layer whose
 * writes cover whole chunks (read-modify-write) must lock per chunk or per inode
 * itself. Every call returns 0 / a byte count, or a negative errno. */
#ifndef SR_CONTENT_H
#define SR_CONTENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

struct sr_content; /* layer-private, per open inode */

struct sr_content_ops {
	const char *name;
	/* A new, empty regular file was just created as `fd` (opened O_RDWR): write whatever
	 * an empty file holds on disk (the header and its empty final chunk for format v1).
	 * On failure the core unlinks the file: a failed create leaves nothing behind. */
	int (*init_new)(void *layer, int fd);
	/* Take over `fd` (the backing file, O_RDWR when possible, else O_RDONLY; the layer
	 * closes it in release). Parses and authenticates the header for an encrypted layer
	 * (-ENOKEY when the key is not held, -EIO when the header does not authenticate). */
	int (*open)(void *layer, int fd, int writable, struct sr_content **out);
	ssize_t (*read)(struct sr_content *c, void *buf, size_t size, off_t off);
	ssize_t (*write)(struct sr_content *c, const void *buf, size_t size, off_t off);
	int (*truncate)(struct sr_content *c, off_t size);
	/* Logical (plaintext) size of an open file. */
	int (*size)(struct sr_content *c, off_t *size);
	/* Logical size and block count of a file that is not open, from the backing file's
	 * lstat: rewrites st->st_size (and st_blocks) in place. Must not do I/O for the
	 * plain layer; an encrypted layer computes the size from the stored size alone
	 * (FORMAT.md: size = f(stored - header) is exact for format v1). `fd` is the
	 * inode's O_PATH descriptor (the chunk size is in each file's header). */
	void (*translate_stat)(void *layer, int fd, struct stat *st);
	int (*fallocate)(struct sr_content *c, int mode, off_t off, off_t len);
	int (*flush)(struct sr_content *c);
	int (*fsync)(struct sr_content *c, int datasync);
	void (*release)(struct sr_content *c);
	/* Optional. Re-encrypt the open file under a new file key (the active key version)
	 * and exchange it with the backing file `name` in directory `dirfd` (an O_RDONLY
	 * directory descriptor); the caller holds the inode's io_lock exclusively. After
	 * success the layer's descriptor is the new file. */
	int (*rekey)(struct sr_content *c, int dirfd, const char *name);
	/* The backing file's descriptor (for the core to follow a rekey's new inode). */
	int (*fd)(struct sr_content *c);
};

/* The backing file is the file (pread/pwrite): tests of the core, and a mount without
 * encryption. */
extern const struct sr_content_ops sr_content_plain;
/* Format v1 (docs/FORMAT.md) through libsrcf: what a guard point serves. */
extern const struct sr_content_ops sr_content_srcf;
/* Before the mount: chunk size of new files, journal directory (or -1), the backing
 * directory's resolved path. -1 when the loaded libsrcf has another ABI. */
int sr_content_srcf_configure(uint32_t chunk_size, int journal_fd, const char *backing_path);
/* After the last request: make released files durable and remove their journal entries. */
void sr_content_srcf_shutdown(void);

#endif
