/* The plain content layer: bytes in the mount are bytes in the backing file. It is what
 * the tests exercise today and the shape every other layer follows (content.h). */
#define _GNU_SOURCE
#include "content.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

struct sr_content {
	int fd;
};

static int plain_init_new(void *layer, int fd)
{
	(void)layer;
	(void)fd;
	return 0; /* an empty file is an empty file */
}

static int plain_open(void *layer, int fd, int writable, struct sr_content **out)
{
	(void)layer;
	(void)writable;
	struct sr_content *c = malloc(sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = fd;
	*out = c;
	return 0;
}

static ssize_t plain_read(struct sr_content *c, void *buf, size_t size, off_t off)
{
	size_t done = 0;
	while (done < size) {
		ssize_t n = pread(c->fd, (char *)buf + done, size - done, off + (off_t)done);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return done ? (ssize_t)done : -errno;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return (ssize_t)done;
}

static ssize_t plain_write(struct sr_content *c, const void *buf, size_t size, off_t off)
{
	size_t done = 0;
	while (done < size) {
		ssize_t n = pwrite(c->fd, (const char *)buf + done, size - done, off + (off_t)done);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return done ? (ssize_t)done : -errno;
		}
		done += (size_t)n;
	}
	return (ssize_t)done;
}

static int plain_truncate(struct sr_content *c, off_t size)
{
	return ftruncate(c->fd, size) < 0 ? -errno : 0;
}

static int plain_size(struct sr_content *c, off_t *size)
{
	struct stat st;
	if (fstat(c->fd, &st) < 0)
		return -errno;
	*size = st.st_size;
	return 0;
}

static void plain_translate_stat(void *layer, int fd, struct stat *st)
{
	(void)layer;
	(void)fd;
	(void)st;
}

static int plain_fallocate(struct sr_content *c, int mode, off_t off, off_t len)
{
	return fallocate(c->fd, mode, off, len) < 0 ? -errno : 0;
}

static int plain_flush(struct sr_content *c)
{
	(void)c;
	return 0;
}

static int plain_fsync(struct sr_content *c, int datasync)
{
	int r = datasync ? fdatasync(c->fd) : fsync(c->fd);
	return r < 0 ? -errno : 0;
}

static void plain_release(struct sr_content *c)
{
	close(c->fd);
	free(c);
}

const struct sr_content_ops sr_content_plain = {
	.name = "plain",
	.init_new = plain_init_new,
	.open = plain_open,
	.read = plain_read,
	.write = plain_write,
	.truncate = plain_truncate,
	.size = plain_size,
	.translate_stat = plain_translate_stat,
	.fallocate = plain_fallocate,
	.flush = plain_flush,
	.fsync = plain_fsync,
	.release = plain_release,
};
