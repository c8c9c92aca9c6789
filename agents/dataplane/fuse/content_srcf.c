/* The format v1 content layer: the mount shows plaintext, the backing file holds
 * docs/FORMAT.md's header and chunks, sealed and opened by libsrcf (OpenSSL's
 * AES-256-GCM). Selected with --content srcf.
 *
 * Locking. The core holds the inode's io_lock shared for reads and positional writes
 * and exclusively for size changes; a chunk is rewritten whole (read-modify-write), and
 * a reader must never see a chunk half rewritten nor a stale "final" flag, so this layer
 * adds its own rwlock per open inode: reads share it, writes and size changes take it
 * alone. Reads of one file therefore run in parallel, and the kernel's page cache
 * (kept across opens) answers most of them without a request at all.
 *
 * Sparse files. An extension past the end writes two chunks at most: the old final
 * chunk re-sealed full and not final, and the new final chunk; whole chunks between
 * them are left as holes in the backing file (all-zero stored chunks, read back as
 * zeros: FORMAT.md, "Sparse regions"). truncate(10^15) costs two chunks, or EFBIG.
 *
 * Journal. Before the first change of a file, an entry naming it is made durable in
 * the journal directory; it is removed when the last user of the file closes it. A
 * crash between the steps of a size change leaves a tail that the control plane
 * repairs at the next start for journalled files only (FORMAT.md, "Interrupted
 * writes").
 *
 * Failure atomicity. A change that fails leaves the file as it was: everything is
 * sealed in memory and the backing file system's limits are checked (EFBIG) and the
 * space the change writes is reserved (fallocate, FALLOC_FL_KEEP_SIZE: ENOSPC) before
 * the first byte moves; the ciphertext a change overwrites is kept, and put back (and
 * the length restored) when a backing write fails after all. For a kill between the
 * steps, that old ciphertext is also written to an undo record beside the journal
 * entry ("<entry>.undo") before the change and disarmed after it; the control plane
 * puts it back before anything else at the next start, so a killed change leaves the
 * old file, never a torn chunk. */
#define _GNU_SOURCE
#include "content.h"
#include "control.h"
#include "srcf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <stdio.h>
#include <unistd.h>

struct srcf_layer {
	uint32_t chunk_size;      /* for new files */
	int journal_fd;           /* directory, or -1: no journal */
	int backing_sync_fd;      /* the backing directory, O_RDONLY: syncfs() before entries go */
	const char *backing_path; /* to name journalled files relative to the backing directory */
};

struct sr_content {
	int fd;
	int writable;
	srcf_file *file;
	uint32_t cs;
	uint64_t size;            /* logical size: under lock */
	pthread_rwlock_t lock;
	int journalled;
	char journal_name[64];
	int undo_fd;              /* the journal entry's undo record, opened on first use, or -1 */
	int broken;               /* a failed change could not be put back: EIO until reopened */
	/* streaming writes: stored offsets [flushed, started) are being written back */
	uint64_t started, flushed, stream_end;
};

/* A file written sequentially would otherwise leave its ciphertext in the page cache
 * twice over (the kernel keeps the plaintext in the mount's cache too) and dirty until the
 * kernel's limits stall the daemon's own pwrite(): every STREAM_WINDOW bytes, writeback
 * of the last window is started, and the window before it, written back by now, is
 * dropped from the cache (the plaintext stays cached above). */
#define STREAM_WINDOW (8u << 20)

static struct srcf_layer layer_cfg;

/* ---- per-thread buffers: a request never allocates ------------------------------- */
struct bufs {
	uint8_t *stored, *plain;
	size_t stored_cap, plain_cap;
	uint8_t *aux, *old;       /* a second sealed piece; the ciphertext a change overwrites */
	size_t aux_cap, old_cap;
};
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

static struct bufs *bufs_get(size_t stored, size_t plain)
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

/* The second-piece and old-ciphertext buffers of this thread (after bufs_get). */
static int bufs_extra(struct bufs *b, size_t aux, size_t old)
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
static int io_full(int fd, void *buf, size_t len, off_t off, int write_it)
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

static uint64_t chunks_of(uint64_t size, uint32_t cs)
{
	uint64_t n = size / cs + (size % cs != 0);
	return n ? n : 1;
}

static off_t chunk_off(uint64_t index, uint32_t cs)
{
	return (off_t)(SRCF_HEADER_SIZE + index * ((uint64_t)cs + SRCF_CHUNK_OVERHEAD));
}

/* The path of an open backing file relative to the backing directory ("d/f"). */
static void rel_path(int fd, char *out, size_t len)
{
	char link[32], real[PATH_MAX];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, real, sizeof(real) - 1);
	if (n < 0) {
		snprintf(out, len, "?");
		return;
	}
	real[n] = '\0';
	size_t bl = strlen(layer_cfg.backing_path);
	const char *rel = real;
	if (!strncmp(real, layer_cfg.backing_path, bl) && real[bl] == '/')
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
static void content_event(enum sr_event_kind kind, int fd)
{
	if (!event_due(kind, fd))
		return;
	char rel[PATH_MAX + 2];
	rel[0] = '/';
	rel_path(fd, rel + 1, sizeof(rel) - 1);
	struct sr_caller nobody = { .uid = (uid_t)-1, .gid = (gid_t)-1, .pid = 0 };
	sr_event_send(kind, SR_ACCESS_READ, SR_OP_OPEN, &nobody, -1, rel);
}

static int srcf_errno(int rc, int fd)
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
		content_event(SR_EV_NO_KEY, fd);
		return -ENOKEY;
	}
	if (SRCF_IS_FORMAT_ERROR(rc) || SRCF_IS_INTEGRITY_ERROR(rc)) {
		content_event(SR_EV_INTEGRITY, fd);
		return -EIO;
	}
	return -EIO;
}

/* A managed key version held by the daemon, as a libsrcf key (its own locked copy). */
static int key_load(const uint8_t id[16], uint32_t version, srcf_key **out)
{
	uint8_t material[32];
	int r = sr_key_get(id, version, material);
	if (r < 0)
		return r;
	int rc = srcf_key_new(out, id, version, material);
	explicit_bzero(material, sizeof(material));
	return rc == SRCF_OK ? 0 : rc == SRCF_E_MLOCK || rc == SRCF_E_NOMEM ? -ENOMEM : -EIO;
}

/* Journal entries of files no open state writes any more. An entry is removed only once
 * what it guards is durable: a flusher thread removes released entries after a
 * syncfs() of the backing file system (every JOURNAL_FLUSH_SECONDS), so closing a file
 * costs no fsync, and a file opened and written again before then takes its entry back
 * with no I/O at all (databases open and close their files all the time). */
#define JOURNAL_FLUSH_SECONDS 2
struct journal_entry {
	struct journal_entry *next;
	dev_t dev;
	ino_t ino;
	char name[64];
};
static pthread_mutex_t journal_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t journal_cond = PTHREAD_COND_INITIALIZER;
static struct journal_entry *journal_released;
static int journal_stopping, journal_thread_started;
static pthread_t journal_thread;

/* The key version new file keys are wrapped under (SET_ACTIVE): -ENOKEY before one. */
static int active_key_load(srcf_key **out)
{
	uint8_t id[16];
	uint32_t version;
	if (sr_key_active(id, &version) < 0)
		return -ENOKEY;
	return key_load(id, version, out);
}

static int journal_mark(struct sr_content *c)
{
	if (c->journalled || layer_cfg.journal_fd < 0)
		return 0;
	struct stat st;
	if (fstat(c->fd, &st) < 0)
		return -errno;
	pthread_mutex_lock(&journal_lock);
	for (struct journal_entry **pp = &journal_released; *pp; pp = &(*pp)->next) {
		struct journal_entry *e = *pp;
		if (e->dev == st.st_dev && e->ino == st.st_ino) {
			*pp = e->next;
			pthread_mutex_unlock(&journal_lock);
			memcpy(c->journal_name, e->name, sizeof(c->journal_name));
			free(e);
			c->journalled = 1;
			return 0; /* still on disk: nothing to write */
		}
	}
	pthread_mutex_unlock(&journal_lock);
	char rel[PATH_MAX];
	rel_path(c->fd, rel, sizeof(rel));
	uint32_t nonce;
	if (getrandom(&nonce, sizeof(nonce), 0) != sizeof(nonce))
		nonce = (uint32_t)getpid();
	snprintf(c->journal_name, sizeof(c->journal_name), "%lx-%lx-%08x", (unsigned long)st.st_dev,
		 (unsigned long)st.st_ino, nonce);
	int jfd = openat(layer_cfg.journal_fd, c->journal_name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (jfd < 0)
		return -errno;
	int r = io_full(jfd, rel, strlen(rel), 0, 1);
	if (r == 0 && fsync(jfd) < 0)
		r = -errno;
	close(jfd);
	if (r == 0 && fsync(layer_cfg.journal_fd) < 0)
		r = -errno;
	if (r < 0) {
		unlinkat(layer_cfg.journal_fd, c->journal_name, 0);
		return r;
	}
	c->journalled = 1;
	return 0;
}

static void journal_release(struct sr_content *c, const struct stat *st)
{
	struct journal_entry *e = calloc(1, sizeof(*e));
	if (!e)
		return; /* the entry stays on disk: a later start checks a good file, no harm */
	e->dev = st->st_dev;
	e->ino = st->st_ino;
	memcpy(e->name, c->journal_name, sizeof(e->name));
	pthread_mutex_lock(&journal_lock);
	e->next = journal_released;
	journal_released = e;
	pthread_mutex_unlock(&journal_lock);
}

/* Make every released file durable, then forget their entries. */
static void journal_flush(void)
{
	pthread_mutex_lock(&journal_lock);
	struct journal_entry *batch = journal_released;
	journal_released = NULL;
	pthread_mutex_unlock(&journal_lock);
	if (!batch)
		return;
	if (syncfs(layer_cfg.backing_sync_fd) < 0) {
		/* not durable: keep them for the next round */
		pthread_mutex_lock(&journal_lock);
		struct journal_entry *last = batch;
		while (last->next)
			last = last->next;
		last->next = journal_released;
		journal_released = batch;
		pthread_mutex_unlock(&journal_lock);
		return;
	}
	while (batch) {
		struct journal_entry *next = batch->next;
		char undo[80];
		snprintf(undo, sizeof(undo), "%s.undo", batch->name);
		unlinkat(layer_cfg.journal_fd, undo, 0); /* disarmed: the file is whole */
		unlinkat(layer_cfg.journal_fd, batch->name, 0);
		free(batch);
		batch = next;
	}
	(void)fsync(layer_cfg.journal_fd);
}

static void *journal_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&journal_lock);
	while (!journal_stopping) {
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += JOURNAL_FLUSH_SECONDS;
		pthread_cond_timedwait(&journal_cond, &journal_lock, &until);
		pthread_mutex_unlock(&journal_lock);
		journal_flush();
		pthread_mutex_lock(&journal_lock);
	}
	pthread_mutex_unlock(&journal_lock);
	return NULL;
}

void sr_content_srcf_shutdown(void)
{
	if (journal_thread_started) {
		pthread_mutex_lock(&journal_lock);
		journal_stopping = 1;
		pthread_cond_signal(&journal_cond);
		pthread_mutex_unlock(&journal_lock);
		pthread_join(journal_thread, NULL);
		journal_thread_started = 0;
	}
	if (layer_cfg.journal_fd >= 0)
		journal_flush();
}

/* Files left broken (a change neither done nor put back; the armed undo record puts it
 * back at the next start): a later open must not write on, or the record would be
 * replayed over newer data. Kept until the daemon exits; the journal entry stays. */
#define BROKEN_MAX 256
static struct {
	dev_t dev;
	ino_t ino;
} broken_files[BROKEN_MAX];
static int broken_count;
static pthread_mutex_t broken_lock = PTHREAD_MUTEX_INITIALIZER;

static int broken_known(const struct stat *st)
{
	int found = 0;
	pthread_mutex_lock(&broken_lock);
	for (int i = 0; i < broken_count && !found; i++)
		found = broken_files[i].dev == st->st_dev && broken_files[i].ino == st->st_ino;
	pthread_mutex_unlock(&broken_lock);
	return found;
}

static void broken_remember(const struct stat *st)
{
	if (broken_known(st))
		return;
	pthread_mutex_lock(&broken_lock);
	if (broken_count < BROKEN_MAX) {
		broken_files[broken_count].dev = st->st_dev;
		broken_files[broken_count].ino = st->st_ino;
		broken_count++;
	}
	pthread_mutex_unlock(&broken_lock);
}

/* ---- chunk I/O ---------------------------------------------------------------------- */
/* Decrypt chunks first..last (all within the current size) into out, which holds
 * exactly their plaintext. */
static int read_chunks(struct sr_content *c, uint64_t first, uint64_t last, uint8_t *out, size_t out_len,
		       uint8_t *stored_buf)
{
	uint64_t final = chunks_of(c->size, c->cs) - 1;
	size_t stored_len = out_len + (size_t)(last - first + 1) * SRCF_CHUNK_OVERHEAD;
	int r = io_full(c->fd, stored_buf, stored_len, chunk_off(first, c->cs), 0);
	if (r < 0)
		return r == -EIO ? (content_event(SR_EV_INTEGRITY, c->fd), -EIO) : r;
	size_t got;
	uint64_t bad;
	int rc = srcf_open_run(c->file, first, final, stored_buf, stored_len, out, out_len, &got, &bad);
	return srcf_errno(rc, c->fd);
}

/* ---- operations --------------------------------------------------------------------- */
static int srcf_init_new(void *layer, int fd)
{
	(void)layer;
	srcf_key *key;
	int r = active_key_load(&key);
	if (r < 0)
		return r;
	srcf_file *f;
	uint8_t out[SRCF_HEADER_SIZE + SRCF_CHUNK_OVERHEAD];
	int rc = srcf_file_create(&f, out, key, layer_cfg.chunk_size);
	srcf_key_free(key);
	if (rc != SRCF_OK)
		return srcf_errno(rc, fd);
	size_t len;
	rc = srcf_seal_run(f, 0, 0, NULL, 0, out + SRCF_HEADER_SIZE, SRCF_CHUNK_OVERHEAD, &len, NULL);
	srcf_file_free(f);
	if (rc != SRCF_OK)
		return srcf_errno(rc, fd);
	return io_full(fd, out, sizeof(out), 0, 1);
}

static int srcf_open(void *layer, int fd, int writable, struct sr_content **out)
{
	(void)layer;
	uint8_t header[SRCF_HEADER_SIZE];
	ssize_t n = pread(fd, header, sizeof(header), 0);
	if (n < 0)
		return -errno;
	srcf_header h;
	int rc = srcf_header_parse(header, (size_t)n, &h);
	if (rc != SRCF_OK)
		return srcf_errno(rc == SRCF_E_ARGUMENT ? SRCF_E_HEADER_TRUNCATED : rc, fd);
	struct stat st;
	if (fstat(fd, &st) < 0)
		return -errno;
	uint64_t size;
	rc = srcf_plaintext_size((uint64_t)st.st_size, h.chunk_size, &size);
	if (rc != SRCF_OK)
		return srcf_errno(rc == SRCF_E_FILE_LENGTH ? SRCF_E_INTEGRITY : rc, fd);
	srcf_key *key;
	int r = key_load(h.key_id, h.key_version, &key);
	if (r == -ENOKEY) {
		content_event(SR_EV_NO_KEY, fd);
		return r;
	}
	if (r < 0)
		return r;
	srcf_file *f;
	rc = srcf_file_open(&f, header, sizeof(header), key);
	srcf_key_free(key);
	if (rc != SRCF_OK)
		return srcf_errno(rc, fd);
	struct sr_content *c = calloc(1, sizeof(*c));
	if (!c) {
		srcf_file_free(f);
		return -ENOMEM;
	}
	c->fd = fd;
	c->writable = writable;
	c->file = f;
	c->cs = h.chunk_size;
	c->size = size;
	c->undo_fd = -1;
	c->broken = broken_known(&st);
	pthread_rwlock_init(&c->lock, NULL);
	*out = c;
	return 0;
}

static ssize_t srcf_read(struct sr_content *c, void *buf, size_t size, off_t off)
{
	pthread_rwlock_rdlock(&c->lock);
	ssize_t result = 0;
	if (off < 0) {
		result = -EINVAL;
		goto out;
	}
	if ((uint64_t)off >= c->size || size == 0)
		goto out;
	if ((uint64_t)off + size > c->size)
		size = (size_t)(c->size - (uint64_t)off);
	uint32_t cs = c->cs;
	uint64_t first = (uint64_t)off / cs, last = ((uint64_t)off + size - 1) / cs;
	uint64_t run_end = (last + 1) * (uint64_t)cs < c->size ? (last + 1) * (uint64_t)cs : c->size;
	size_t plain_len = (size_t)(run_end - first * cs);
	int direct = (uint64_t)off == first * cs && size == plain_len;
	struct bufs *b = bufs_get(plain_len + (size_t)(last - first + 1) * SRCF_CHUNK_OVERHEAD,
				  direct ? 0 : plain_len);
	if (!b) {
		result = -ENOMEM;
		goto out;
	}
	uint8_t *plain = direct ? buf : b->plain;
	int r = read_chunks(c, first, last, plain, plain_len, b->stored);
	if (r < 0) {
		result = r;
		goto out;
	}
	if (!direct)
		memcpy(buf, plain + ((uint64_t)off - first * cs), size);
	result = (ssize_t)size;
out:
	pthread_rwlock_unlock(&c->lock);
	return result;
}

static int all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

/* ---- failure atomicity ------------------------------------------------------------ */
/* What a change overwrites: the stored bytes [off, off + len) as they were, and the
 * stored lengths before and after it. */
struct undo {
	uint64_t old_end, new_end, off;
	size_t len;
	const uint8_t *bytes;
};

/* Undo record on disk: "SRUNDO01" once complete, then u64 old_end, new_end, off, len
 * (big-endian), the file id (so a record is never put onto another file that took the
 * name since), then the bytes. The magic is written last, in its own 8-byte write at
 * offset 0, so a record cut by a kill is never taken for a complete one. */
#define UNDO_MAGIC "SRUNDO01"
#define UNDO_HEAD (40 + SRCF_ID_SIZE)

static void put_be64(uint8_t *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--, v >>= 8)
		p[i] = (uint8_t)v;
}

static int undo_arm(struct sr_content *c, const struct undo *u)
{
	if (!c->journalled)
		return 0; /* no journal: a failed change is still put back from memory */
	if (c->undo_fd < 0) {
		char name[80];
		snprintf(name, sizeof(name), "%s.undo", c->journal_name);
		c->undo_fd = openat(layer_cfg.journal_fd, name, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (c->undo_fd < 0)
			return -errno;
	}
	uint8_t head[UNDO_HEAD - 8];
	put_be64(head, u->old_end);
	put_be64(head + 8, u->new_end);
	put_be64(head + 16, u->off);
	put_be64(head + 24, u->len);
	srcf_file_id(c->file, head + 32);
	int r = io_full(c->undo_fd, head, sizeof(head), 8, 1);
	if (r == 0 && u->len)
		r = io_full(c->undo_fd, (void *)u->bytes, u->len, UNDO_HEAD, 1);
	if (r == 0)
		r = io_full(c->undo_fd, UNDO_MAGIC, 8, 0, 1);
	return r;
}

/* The change is complete (or put back): the record must never be replayed. */
static int undo_disarm(struct sr_content *c)
{
	if (c->undo_fd < 0)
		return 0;
	static const uint8_t zero[8];
	int r = io_full(c->undo_fd, (void *)zero, sizeof(zero), 0, 1);
	if (r < 0 && ftruncate(c->undo_fd, 0) < 0)
		return r;
	return 0;
}

/* A backing write failed half way: the overwritten bytes back, the old length back. */
static void undo_apply(struct sr_content *c, const struct undo *u)
{
	int r = u->len ? io_full(c->fd, (void *)u->bytes, u->len, (off_t)u->off, 1) : 0;
	struct stat st;
	if (r == 0 && fstat(c->fd, &st) < 0)
		r = -errno;
	if (r == 0 && (uint64_t)st.st_size != u->old_end && ftruncate(c->fd, (off_t)u->old_end) < 0)
		r = -errno;
	if (r < 0) {
		/* the record stays armed and the journal entry stays: the next start puts it back */
		c->broken = 1;
		return;
	}
	if (undo_disarm(c) < 0)
		c->broken = 1; /* armed still, with these same old bytes: a replay changes nothing */
}

/* Space for [off, off + len) allocated before it is written, so the write cannot meet
 * ENOSPC half way; a file system without fallocate gets the put-back path instead. */
static int reserve(int fd, uint64_t off, uint64_t len)
{
	if (!len)
		return 0;
	for (;;) {
		if (fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) == 0)
			return 0;
		if (errno == EINTR)
			continue;
		return errno == EOPNOTSUPP || errno == ENOSYS ? 0 : -errno;
	}
}

/* EFBIG before anything changes: a length the backing file system cannot hold (ext4:
 * 16 TiB) would otherwise fail half way through an extension. lseek checks the file
 * system's own maximum (s_maxbytes) and moves nothing: every I/O here is positional. */
static int fits(int fd, uint64_t stored_end)
{
	if (stored_end > INT64_MAX)
		return -EFBIG;
	if (lseek(fd, (off_t)stored_end, SEEK_SET) < 0)
		return errno == EINVAL ? -EFBIG : -errno;
	return 0;
}

/* Seal the current final chunk as a full, non-final chunk (zeros after its data) into
 * `out` (cs + overhead bytes): part of every extension past it. */
static int seal_old_final_full(struct sr_content *c, struct bufs *b, uint8_t *out, size_t *len)
{
	uint32_t cs = c->cs;
	uint64_t index = chunks_of(c->size, cs) - 1;
	size_t have = (size_t)(c->size - index * cs);
	memset(b->plain, 0, cs);
	if (have) {
		int r = read_chunks(c, index, index, b->plain, have, b->stored);
		if (r < 0)
			return r;
	}
	int rc = srcf_seal_run(c->file, index, SRCF_NO_FINAL, b->plain, cs, out, (size_t)cs + SRCF_CHUNK_OVERHEAD, len,
			       NULL);
	return rc == SRCF_OK ? 0 : srcf_errno(rc, c->fd);
}

/* Under the write lock. Writes `size` bytes at `off` (size may be 0 with new_size >
 * c->size: an extension by zeros, as truncate and fallocate do). All or nothing. */
static int write_locked(struct sr_content *c, const uint8_t *data, size_t size, uint64_t off, uint64_t new_size)
{
	if (c->broken)
		return -EIO;
	uint32_t cs = c->cs;
	uint64_t stored_end, old_end;
	if (srcf_stored_size(new_size, cs, &stored_end) != SRCF_OK)
		return -EFBIG;
	(void)srcf_stored_size(c->size, cs, &old_end);
	int r = fits(c->fd, stored_end);
	if (r < 0)
		return r;
	r = journal_mark(c);
	if (r < 0)
		return r;
	uint64_t old_size = c->size, old_n = chunks_of(old_size, cs), new_n = chunks_of(new_size, cs);
	uint64_t final = new_n - 1;
	/* The run to seal: the chunks the write covers; for a pure extension, the new final. */
	uint64_t first = size ? off / cs : final, last = size ? (off + size - 1) / cs : final;
	if (new_size > old_size)
		last = final; /* a write reaching past the end: its last chunk is the new final */
	uint64_t run_end = (last + 1) * (uint64_t)cs < new_size ? (last + 1) * (uint64_t)cs : new_size;
	size_t plain_len = (size_t)(run_end - first * cs);
	size_t run_stored = plain_len + (size_t)(last - first + 1) * SRCF_CHUNK_OVERHEAD;
	struct bufs *b = bufs_get(run_stored + 2 * SRCF_CHUNK_OVERHEAD + cs, plain_len > cs ? plain_len : cs);
	if (!b || bufs_extra(b, (size_t)cs + SRCF_CHUNK_OVERHEAD, run_stored + (size_t)cs + SRCF_CHUNK_OVERHEAD) < 0)
		return -ENOMEM;
	/* Growing past the old final chunk, which lies before this run: it becomes a full,
	 * non-final chunk too (sealed now, written after the run). */
	size_t alen = 0;
	int grow = new_n > old_n && old_n - 1 < first;
	if (grow && (r = seal_old_final_full(c, b, b->aux, &alen)) < 0)
		return r;
	const uint8_t *plain;
	if (size && off == first * cs && size == plain_len) {
		plain = data; /* whole chunks, or up to the end: no copy */
	} else {
		uint8_t *p = b->plain;
		memset(p, 0, plain_len);
		/* Old bytes of the edge chunks that the write does not cover. */
		uint64_t edges[2] = { first, last };
		for (int k = 0; k < 2; k++) {
			uint64_t i = edges[k];
			if (k == 1 && i == first)
				break;
			if (i >= old_n || i * cs >= old_size)
				continue; /* past the old end: zeros */
			uint64_t old_chunk_end = (i + 1) * (uint64_t)cs < old_size ? (i + 1) * (uint64_t)cs : old_size;
			if (size && off <= i * cs && off + size >= old_chunk_end)
				continue; /* wholly overwritten */
			r = read_chunks(c, i, i, p + (i - first) * cs, (size_t)(old_chunk_end - i * cs), b->stored);
			if (r < 0)
				return r;
		}
		if (size)
			memcpy(p + (off - first * cs), data, size);
		plain = p;
	}
	size_t len;
	uint8_t *stored = b->stored;
	int rc = srcf_seal_run(c->file, first, final, plain, plain_len, stored, b->stored_cap, &len, NULL);
	if (rc != SRCF_OK)
		return srcf_errno(rc, c->fd);
	uint64_t from = (uint64_t)chunk_off(first, cs), to = from + len;
	/* The stored bytes this change overwrites, kept to be put back: the old final chunk
	 * when it is re-sealed, else what the run covers of the old file. */
	struct undo u = { .old_end = old_end, .new_end = stored_end, .bytes = b->old };
	u.off = grow ? (uint64_t)chunk_off(old_n - 1, cs) : from;
	uint64_t until = grow ? old_end : (to < old_end ? to : old_end);
	u.len = until > u.off ? (size_t)(until - u.off) : 0;
	if (u.len && (r = io_full(c->fd, b->old, u.len, (off_t)u.off, 0)) < 0)
		return r;
	/* An overwrite of stored chunks in place needs no new blocks; a run reaching past
	 * the old end, or over a hole, does. */
	int in_place = !grow && to <= old_end;
	for (size_t k = 0; in_place && k + (size_t)cs + SRCF_CHUNK_OVERHEAD <= u.len; k += (size_t)cs + SRCF_CHUNK_OVERHEAD)
		in_place = !all_zero(b->old + k, (size_t)cs + SRCF_CHUNK_OVERHEAD);
	if ((!in_place && (r = reserve(c->fd, from, len)) < 0) || (grow && (r = reserve(c->fd, u.off, alen)) < 0))
		return r;
	if ((r = undo_arm(c, &u)) < 0)
		return r;
	/* The run first, then the old final chunk: a kill between them leaves the old final
	 * chunk in place, which repair finds even without the undo record. */
	r = io_full(c->fd, stored, len, (off_t)from, 1);
	if (r == 0 && grow)
		r = io_full(c->fd, b->aux, alen, (off_t)u.off, 1);
	if (r < 0) {
		undo_apply(c, &u);
		return r;
	}
	if (new_size > c->size)
		c->size = new_size;
	/* The write is whole, but a record left armed would undo it at the next start, so
	 * it cannot be acknowledged. Putting the old bytes back now could tear the chunks
	 * if that write failed too, with the record maybe gone: the file stays new, the
	 * next start finds it new or (record armed) old, never torn. */
	if (undo_disarm(c) < 0) {
		c->broken = 1;
		return -EIO;
	}
	if (from > c->stream_end || to < c->started) {
		c->started = c->flushed = from; /* not sequential: a new stream starts here */
	}
	c->stream_end = to;
	if (to - c->started >= STREAM_WINDOW) {
		if (c->started > c->flushed) {
			(void)sync_file_range(c->fd, (off_t)c->flushed, (off_t)(c->started - c->flushed),
					      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
						      SYNC_FILE_RANGE_WAIT_AFTER);
			(void)posix_fadvise(c->fd, (off_t)c->flushed, (off_t)(c->started - c->flushed),
					    POSIX_FADV_DONTNEED);
		}
		(void)sync_file_range(c->fd, (off_t)c->started, (off_t)(to - c->started), SYNC_FILE_RANGE_WRITE);
		c->flushed = c->started;
		c->started = to;
	}
	return 0;
}

static ssize_t srcf_write(struct sr_content *c, const void *buf, size_t size, off_t off)
{
	if (!c->writable)
		return -EBADF;
	if (off < 0)
		return -EINVAL;
	if (size == 0)
		return 0;
	uint64_t end;
	if (__builtin_add_overflow((uint64_t)off, (uint64_t)size, &end) || end > INT64_MAX)
		return -EFBIG;
	pthread_rwlock_wrlock(&c->lock);
	uint64_t new_size = end > c->size ? end : c->size;
	int r = write_locked(c, buf, size, (uint64_t)off, new_size);
	pthread_rwlock_unlock(&c->lock);
	return r < 0 ? r : (ssize_t)size;
}

/* Under the write lock. The new final chunk is written over its old self first, then
 * the file cut at its exact end in one ftruncate: a failure of either puts the old
 * chunk back (nothing was cut yet, or the cut did not happen). */
static int shrink_locked(struct sr_content *c, uint64_t new_size)
{
	if (c->broken)
		return -EIO;
	uint32_t cs = c->cs;
	int r = journal_mark(c);
	if (r < 0)
		return r;
	uint64_t n = chunks_of(new_size, cs), old_final = chunks_of(c->size, cs) - 1, old_end, new_end;
	(void)srcf_stored_size(c->size, cs, &old_end);
	(void)srcf_stored_size(new_size, cs, &new_end);
	size_t keep = (size_t)(new_size - (n - 1) * cs);
	struct bufs *b = bufs_get(2 * ((size_t)cs + SRCF_CHUNK_OVERHEAD), cs);
	if (!b || bufs_extra(b, 0, (size_t)cs + SRCF_CHUNK_OVERHEAD) < 0)
		return -ENOMEM;
	/* the chunk that becomes final, as stored now (kept to be put back) and opened */
	struct undo u = { .old_end = old_end, .new_end = new_end, .off = (uint64_t)chunk_off(n - 1, cs),
			  .bytes = b->old };
	uint64_t until = (uint64_t)chunk_off(n, cs) < old_end ? (uint64_t)chunk_off(n, cs) : old_end;
	u.len = (size_t)(until - u.off);
	if ((r = io_full(c->fd, b->old, u.len, (off_t)u.off, 0)) < 0)
		return r == -EIO ? (content_event(SR_EV_INTEGRITY, c->fd), -EIO) : r;
	if (keep) {
		size_t have = n - 1 == old_final ? (size_t)(c->size - old_final * cs) : cs, got;
		uint64_t bad;
		int rc = srcf_open_run(c->file, n - 1, old_final, b->old, have + SRCF_CHUNK_OVERHEAD, b->plain, have, &got,
				       &bad);
		if (rc != SRCF_OK)
			return srcf_errno(rc, c->fd);
	}
	size_t len;
	int rc = srcf_seal_run(c->file, n - 1, n - 1, b->plain, keep, b->stored, b->stored_cap, &len, NULL);
	if (rc != SRCF_OK)
		return srcf_errno(rc, c->fd);
	if ((r = reserve(c->fd, u.off, len)) < 0) /* the chunk may be a hole */
		return r;
	if ((r = undo_arm(c, &u)) < 0)
		return r;
	r = io_full(c->fd, b->stored, len, (off_t)u.off, 1);
	if (r == 0 && ftruncate(c->fd, (off_t)new_end) < 0)
		r = -errno;
	if (r < 0) {
		undo_apply(c, &u);
		return r;
	}
	/* An armed record of a finished cut is never replayed (the file has its new end),
	 * and nothing could put the cut chunks back: the cut stands. */
	(void)undo_disarm(c);
	c->size = new_size;
	return 0;
}

static int srcf_truncate(struct sr_content *c, off_t size)
{
	if (!c->writable)
		return -EBADF;
	if (size < 0)
		return -EINVAL;
	pthread_rwlock_wrlock(&c->lock);
	int r = 0;
	if ((uint64_t)size > c->size)
		r = write_locked(c, NULL, 0, c->size, (uint64_t)size);
	else if ((uint64_t)size < c->size)
		r = shrink_locked(c, (uint64_t)size);
	pthread_rwlock_unlock(&c->lock);
	return r;
}

static int srcf_size(struct sr_content *c, off_t *size)
{
	pthread_rwlock_rdlock(&c->lock);
	*size = (off_t)c->size;
	pthread_rwlock_unlock(&c->lock);
	return 0;
}

/* A closed file's logical size from its stored length and its header's chunk size (a
 * 4-byte read: the chunk size is per file). Anything unreadable shows as size 0; its
 * open reports the error. */
static void srcf_translate_stat(void *layer, int fd, struct stat *st)
{
	(void)layer;
	uint64_t size = 0;
	uint8_t field[4];
	char p[32];
	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	int rfd = open(p, O_RDONLY | O_CLOEXEC | O_NOATIME);
	if (rfd < 0 && errno == EPERM)
		rfd = open(p, O_RDONLY | O_CLOEXEC);
	if (rfd >= 0) {
		if (pread(rfd, field, 4, 8) == 4) {
			uint32_t cs = (uint32_t)field[0] << 24 | (uint32_t)field[1] << 16 | (uint32_t)field[2] << 8 | field[3];
			if (srcf_plaintext_size((uint64_t)st->st_size, cs, &size) != SRCF_OK)
				size = 0;
		}
		close(rfd);
	}
	st->st_size = (off_t)size;
}

static int srcf_fallocate(struct sr_content *c, int mode, off_t off, off_t len)
{
	if (mode & ~FALLOC_FL_KEEP_SIZE)
		return -EOPNOTSUPP; /* punching or zeroing ranges would need chunk rewrites: not offered */
	if (off < 0 || len <= 0)
		return -EINVAL;
	uint64_t end;
	if (__builtin_add_overflow((uint64_t)off, (uint64_t)len, &end) || end > INT64_MAX)
		return -EFBIG;
	pthread_rwlock_wrlock(&c->lock);
	uint64_t stored_end;
	int r = srcf_stored_size(end, c->cs, &stored_end) != SRCF_OK ? -EFBIG : fits(c->fd, stored_end);
	/* The space the stored bytes of the range take, as the caller asked, reserved before
	 * the size changes: a refusal (ENOSPC) leaves the file as it was. */
	if (r == 0)
		r = reserve(c->fd, (uint64_t)chunk_off((uint64_t)off / c->cs, c->cs),
			    stored_end - (uint64_t)chunk_off((uint64_t)off / c->cs, c->cs));
	if (r == 0 && !(mode & FALLOC_FL_KEEP_SIZE) && end > c->size)
		r = write_locked(c, NULL, 0, c->size, end);
	pthread_rwlock_unlock(&c->lock);
	return r;
}

static int srcf_flush(struct sr_content *c)
{
	(void)c;
	return 0; /* every write is sealed and written before it is acknowledged */
}

static int srcf_fsync(struct sr_content *c, int datasync)
{
	int r = datasync ? fdatasync(c->fd) : fsync(c->fd);
	return r < 0 ? -errno : 0;
}

static void srcf_release(struct sr_content *c)
{
	/* The last user closed it: every size change is complete; its journal entry goes
	 * once the flusher has made the file durable. */
	struct stat st;
	if (fstat(c->fd, &st) == 0) {
		if (c->broken)
			broken_remember(&st); /* entry and undo record stay for the next start */
		else if (c->journalled)
			journal_release(c, &st);
	}
	if (c->undo_fd >= 0)
		close(c->undo_fd);
	srcf_file_free(c->file);
	close(c->fd);
	pthread_rwlock_destroy(&c->lock);
	free(c);
}

/* Copy extended attributes (ACLs, labels, user.*) from one open file to another; what
 * the backing file system refuses to set is skipped. */
static void copy_xattrs(int from, int to)
{
	char names[8192], value[8192];
	ssize_t len = flistxattr(from, names, sizeof(names));
	for (ssize_t i = 0; i < len; i += (ssize_t)strlen(names + i) + 1) {
		ssize_t v = fgetxattr(from, names + i, value, sizeof(value));
		if (v >= 0)
			(void)fsetxattr(to, names + i, value, (size_t)v, 0);
	}
}

/* Online re-key (control message REKEY): the file is written anew beside itself under
 * a fresh file key wrapped by the active key version, chunk by chunk (holes stay holes),
 * made durable, and exchanged with the old one in one renameat2(RENAME_EXCHANGE); this
 * open state then continues on the new file. The caller holds the inode's io_lock
 * exclusively, so no request reads or writes the file meanwhile; an interruption leaves
 * the old file whole (and a .srtmp- file the control plane removes). */
static int srcf_rekey(struct sr_content *c, int dirfd, const char *name)
{
	if (!c->writable)
		return -EROFS;
	if (c->broken)
		return -EIO; /* left to its journal: a copy now would outlive the undo record */
	srcf_key *key;
	int r = active_key_load(&key);
	if (r < 0)
		return r;
	pthread_rwlock_wrlock(&c->lock);
	uint32_t cs = c->cs;
	uint64_t n = chunks_of(c->size, cs), final = n - 1, per_run = cs >= (1u << 20) ? 1 : (1u << 20) / cs;
	struct stat st;
	srcf_file *nf = NULL;
	uint8_t header[SRCF_HEADER_SIZE];
	char tmp[64] = "";
	uint64_t rnd;
	int tfd = -1;
	struct bufs *b = bufs_get(per_run * ((size_t)cs + SRCF_CHUNK_OVERHEAD), per_run * (size_t)cs);
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	if (fstat(c->fd, &st) < 0) {
		r = -errno;
		goto out;
	}
	/* A re-key needs room for one more copy of this file (as allocated: holes stay
	 * holes), checked before anything is written: ENOSPC says why it cannot run. */
	struct statvfs vfs;
	if (fstatvfs(c->fd, &vfs) == 0 &&
	    (uint64_t)vfs.f_bavail * vfs.f_frsize < (uint64_t)st.st_blocks * 512 + 2 * ((uint64_t)cs + SRCF_CHUNK_OVERHEAD)) {
		r = -ENOSPC;
		goto out;
	}
	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd)) {
		r = -EIO;
		goto out;
	}
	snprintf(tmp, sizeof(tmp), ".srtmp-%016llx", (unsigned long long)rnd);
	tfd = openat(dirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (tfd < 0) {
		r = -errno;
		goto out;
	}
	int rc = srcf_file_create(&nf, header, key, cs);
	if (rc != SRCF_OK) {
		r = srcf_errno(rc, c->fd);
		goto out;
	}
	if ((r = io_full(tfd, header, sizeof(header), 0, 1)) < 0)
		goto out;
	for (uint64_t first = 0; first < n; first += per_run) {
		uint64_t last = first + per_run - 1 < final ? first + per_run - 1 : final;
		uint64_t end = (last + 1) * (uint64_t)cs < c->size ? (last + 1) * (uint64_t)cs : c->size;
		size_t plain_len = (size_t)(end - first * cs);
		size_t stored_len = plain_len + (size_t)(last - first + 1) * SRCF_CHUNK_OVERHEAD;
		if ((r = io_full(c->fd, b->stored, stored_len, chunk_off(first, cs), 0)) < 0)
			goto out;
		/* runs of chunks that are not holes: decrypted and sealed anew in place */
		uint64_t i = first;
		while (i <= last) {
			const size_t sc = (size_t)cs + SRCF_CHUNK_OVERHEAD;
			uint8_t *at = b->stored + (i - first) * sc;
			if (i != final && all_zero(at, sc)) {
				i++;
				continue; /* a hole stays a hole */
			}
			uint64_t j = i;
			while (j + 1 <= last && (j + 1 == final || !all_zero(b->stored + (j + 1 - first) * sc, sc)))
				j++;
			uint64_t seg_end = (j + 1) * (uint64_t)cs < c->size ? (j + 1) * (uint64_t)cs : c->size;
			size_t seg_plain = (size_t)(seg_end - i * cs), got, written;
			size_t seg_stored = seg_plain + (size_t)(j - i + 1) * SRCF_CHUNK_OVERHEAD;
			uint64_t bad;
			rc = srcf_open_run(c->file, i, final, at, seg_stored, b->plain, b->plain_cap, &got, &bad);
			if (rc == SRCF_OK)
				rc = srcf_seal_run(nf, i, final, b->plain, seg_plain, at, seg_stored, &written, NULL);
			if (rc != SRCF_OK) {
				r = srcf_errno(rc, c->fd);
				goto out;
			}
			if ((r = io_full(tfd, at, written, chunk_off(i, cs), 1)) < 0)
				goto out;
			i = j + 1;
		}
	}
	uint64_t stored_end;
	(void)srcf_stored_size(c->size, cs, &stored_end);
	if (ftruncate(tfd, (off_t)stored_end) < 0 || fchown(tfd, st.st_uid, st.st_gid) < 0 ||
	    fchmod(tfd, st.st_mode & 07777) < 0) {
		r = -errno;
		goto out;
	}
	copy_xattrs(c->fd, tfd);
	struct timespec times[2] = { st.st_atim, st.st_mtim }; /* the content did not change */
	(void)futimens(tfd, times);
	if (fsync(tfd) < 0) {
		r = -errno;
		goto out;
	}
	if (renameat2(dirfd, tmp, dirfd, name, RENAME_EXCHANGE) < 0) {
		r = -errno;
		goto out;
	}
	struct stat moved;
	if (fstatat(dirfd, tmp, &moved, AT_SYMLINK_NOFOLLOW) < 0 || moved.st_dev != st.st_dev ||
	    moved.st_ino != st.st_ino) {
		/* the name was renamed or replaced meanwhile: put things back, try again later */
		(void)renameat2(dirfd, tmp, dirfd, name, RENAME_EXCHANGE);
		r = -EAGAIN;
		goto out;
	}
	(void)unlinkat(dirfd, tmp, 0);
	(void)fsync(dirfd);
	tmp[0] = '\0';
	close(c->fd);
	c->fd = tfd;
	tfd = -1;
	srcf_file_free(c->file);
	c->file = nf;
	nf = NULL;
	r = 0;
out:
	if (tfd >= 0) {
		close(tfd);
		if (tmp[0])
			(void)unlinkat(dirfd, tmp, 0);
	}
	srcf_file_free(nf);
	srcf_key_free(key);
	pthread_rwlock_unlock(&c->lock);
	return r;
}

static int srcf_fd(struct sr_content *c)
{
	return c->fd;
}

int sr_content_srcf_configure(uint32_t chunk_size, int journal_fd, const char *backing_path)
{
	if (srcf_abi_version() != SRCF_ABI_VERSION)
		return -1;
	layer_cfg.chunk_size = chunk_size;
	layer_cfg.journal_fd = journal_fd;
	layer_cfg.backing_path = backing_path;
	layer_cfg.backing_sync_fd = -1;
	if (journal_fd >= 0) {
		layer_cfg.backing_sync_fd = open(backing_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (layer_cfg.backing_sync_fd < 0)
			return -1;
		if (pthread_create(&journal_thread, NULL, journal_main, NULL) != 0)
			return -1;
		journal_thread_started = 1;
	}
	return 0;
}

const struct sr_content_ops sr_content_srcf = {
	.name = "srcf",
	.init_new = srcf_init_new,
	.open = srcf_open,
	.read = srcf_read,
	.write = srcf_write,
	.truncate = srcf_truncate,
	.size = srcf_size,
	.translate_stat = srcf_translate_stat,
	.fallocate = srcf_fallocate,
	.flush = srcf_flush,
	.fsync = srcf_fsync,
	.release = srcf_release,
	.rekey = srcf_rekey,
	.fd = srcf_fd,
};
