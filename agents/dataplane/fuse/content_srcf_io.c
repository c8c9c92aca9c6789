/* The format v1 content layer's plumbing: per-thread buffers, positional I/O, chunk
 * arithmetic, and the audit events of damaged files and missing keys. */
#define _GNU_SOURCE
#include "content_srcf.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- per-thread buffers: a request never allocates ------------------------------- */
static pthread_key_t bufs_key;
static pthread_once_t bufs_once = PTHREAD_ONCE_INIT;

static void bufs_free(void *p)
{
	struct bufs *b = p;
	if (!b)
		return;
	/* plaintext passed through here: wipe before the heap reuses it */
	if (b->plain)
		explicit_bzero(b->plain, b->plain_cap);
	/* the old ciphertext of a file is not secret, but its undo copy need not linger */
	free(b->stored);
	free(b->plain);
	free(b->aux);
	free(b->old);
	free(b);
}

static void bufs_make_key(void)
{
	(void)pthread_key_create(&bufs_key, bufs_free);
}

struct bufs *cs_bufs_get(size_t stored, size_t plain)
{
	pthread_once(&bufs_once, bufs_make_key);
	struct bufs *b = pthread_getspecific(bufs_key);
	if (!b) {
		b = calloc(1, sizeof(*b));
		if (!b || pthread_setspecific(bufs_key, b)) {
			free(b);
			return NULL;
		}
	}
	if (b->stored_cap < stored) {
		uint8_t *p = realloc(b->stored, stored);
		if (!p)
			return NULL;
		b->stored = p;
		b->stored_cap = stored;
	}
	if (b->plain_cap < plain) {
		if (b->plain)
			explicit_bzero(b->plain, b->plain_cap);
		free(b->plain);
		b->plain = malloc(plain);
		b->plain_cap = b->plain ? plain : 0;
		if (!b->plain)
			return NULL;
	}
	return b;
}

/* The second-piece and old-ciphertext buffers of this thread (after cs_bufs_get). */
int cs_bufs_extra(struct bufs *b, size_t aux, size_t old)
{
	if (b->aux_cap < aux) {
		uint8_t *p = realloc(b->aux, aux);
		if (!p)
			return -ENOMEM;
		b->aux = p;
		b->aux_cap = aux;
	}
	if (b->old_cap < old) {
		uint8_t *p = realloc(b->old, old);
		if (!p)
			return -ENOMEM;
		b->old = p;
		b->old_cap = old;
	}
	return 0;
}

/* ---- helpers ----------------------------------------------------------------------- */
int cs_io_full(int fd, void *buf, size_t len, off_t off, int write_it)
{
	size_t done = 0;
	while (done < len) {
		ssize_t n = write_it ? pwrite(fd, (const char *)buf + done, len - done, off + (off_t)done)
				     : pread(fd, (char *)buf + done, len - done, off + (off_t)done);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return write_it ? -EIO : -EIO; /* a read short of what the size promises: damaged */
		done += (size_t)n;
	}
	return 0;
}

uint64_t cs_chunks_of(uint64_t size, uint32_t cs)
{
	uint64_t n = size / cs + (size % cs != 0);
	return n ? n : 1;
}

off_t cs_chunk_off(uint64_t index, uint32_t cs)
{
	return (off_t)(SRCF_HEADER_SIZE + index * ((uint64_t)cs + SRCF_CHUNK_OVERHEAD));
}

/* The path of an open backing file relative to the backing directory ("d/f"). */
void cs_rel_path(int fd, char *out, size_t len)
{
	char link[32], real[PATH_MAX];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, real, sizeof(real) - 1);
	if (n < 0) {
		snprintf(out, len, "?");
		return;
	}
	real[n] = '\0';
	size_t bl = strlen(cs_cfg.backing_path);
	const char *rel = real;
	if (!strncmp(real, cs_cfg.backing_path, bl) && real[bl] == '/')
		rel = real + bl + 1;
	snprintf(out, len, "%s", rel);
}

/* One event per file, kind and period: a damaged file that a program opens in a loop
 * would otherwise flood the audit log (about 1,000 records a minute were seen). The
 * table is small and the oldest slot is reused: a file forgotten early just reports
 * again. */
#define EVENT_PERIOD_SECONDS 600
#define EVENT_SLOTS 128
static struct event_slot {
	dev_t dev;
	ino_t ino;
	int kind;
	time_t at;
	int used;
} event_seen[EVENT_SLOTS];
static pthread_mutex_t event_lock = PTHREAD_MUTEX_INITIALIZER;

static int event_due(enum sr_event_kind kind, int fd)
{
	struct stat st;
	struct timespec now;
	if (fstat(fd, &st) < 0 || clock_gettime(CLOCK_MONOTONIC, &now) < 0)
		return 1;
	pthread_mutex_lock(&event_lock);
	struct event_slot *oldest = &event_seen[0];
	for (int i = 0; i < EVENT_SLOTS; i++) {
		struct event_slot *e = &event_seen[i];
		if (e->used && e->dev == st.st_dev && e->ino == st.st_ino && e->kind == (int)kind) {
			int due = now.tv_sec - e->at >= EVENT_PERIOD_SECONDS;
			if (due)
				e->at = now.tv_sec;
			pthread_mutex_unlock(&event_lock);
			return due;
		}
		if (!e->used || (oldest->used && e->at < oldest->at))
			oldest = e;
	}
	*oldest = (struct event_slot){ .dev = st.st_dev, .ino = st.st_ino, .kind = (int)kind, .at = now.tv_sec, .used = 1 };
	pthread_mutex_unlock(&event_lock);
	return 1;
}

/* An integrity failure or a missing key, for the audit log (no caller: the file's path). */
void cs_event(enum sr_event_kind kind, int fd)
{
	if (!event_due(kind, fd))
		return;
	char rel[PATH_MAX + 2];
	rel[0] = '/';
	cs_rel_path(fd, rel + 1, sizeof(rel) - 1);
	struct sr_caller nobody = { .uid = (uid_t)-1, .gid = (gid_t)-1, .pid = 0 };
	sr_event_send(kind, SR_ACCESS_READ, SR_OP_OPEN, &nobody, -1, rel);
}

int cs_errno(int rc, int fd)
{
	if (rc == SRCF_OK)
		return 0;
	if (rc == SRCF_E_NOMEM)
		return -ENOMEM;
	if (rc == SRCF_E_OVERFLOW)
		return -EFBIG;
	if (rc == SRCF_E_MLOCK)
		return -ENOMEM;
	if (SRCF_IS_KEY_ERROR(rc)) {
		cs_event(SR_EV_NO_KEY, fd);
		return -ENOKEY;
	}
	if (SRCF_IS_FORMAT_ERROR(rc) || SRCF_IS_INTEGRITY_ERROR(rc)) {
		cs_event(SR_EV_INTEGRITY, fd);
		return -EIO;
	}
	return -EIO;
}
/* ---- chunk I/O ---------------------------------------------------------------------- */
/* Decrypt chunks first..last (all within the current size) into out, which holds
 * exactly their plaintext. */
int cs_read_chunks(struct sr_content *c, uint64_t first, uint64_t last, uint8_t *out, size_t out_len,
		       uint8_t *stored_buf)
{
	uint64_t final = cs_chunks_of(c->size, c->cs) - 1;
	size_t stored_len = out_len + (size_t)(last - first + 1) * SRCF_CHUNK_OVERHEAD;
	int r = cs_io_full(c->fd, stored_buf, stored_len, cs_chunk_off(first, c->cs), 0);
	if (r < 0)
		return r == -EIO ? (cs_event(SR_EV_INTEGRITY, c->fd), -EIO) : r;
	size_t got;
	uint64_t bad;
	int rc = srcf_open_run(c->file, first, final, stored_buf, stored_len, out, out_len, &got, &bad);
	return cs_errno(rc, c->fd);
}
int cs_all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}
