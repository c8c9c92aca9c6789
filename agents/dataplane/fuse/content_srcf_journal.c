/* The write journal (an entry per file being changed, removed once the file is
 * durable), the undo record of each change, and the files left broken. README.md,
 * "Journal" and "Undo record". */
#define _GNU_SOURCE
#include "content_srcf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

int cs_journal_mark(struct sr_content *c)
{
	if (c->journalled || cs_cfg.journal_fd < 0)
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
	cs_rel_path(c->fd, rel, sizeof(rel));
	uint32_t nonce;
	if (getrandom(&nonce, sizeof(nonce), 0) != sizeof(nonce))
		nonce = (uint32_t)getpid();
	snprintf(c->journal_name, sizeof(c->journal_name), "%lx-%lx-%08x", (unsigned long)st.st_dev,
		 (unsigned long)st.st_ino, nonce);
	int jfd = openat(cs_cfg.journal_fd, c->journal_name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (jfd < 0)
		return -errno;
	int r = cs_io_full(jfd, rel, strlen(rel), 0, 1);
	if (r == 0 && fsync(jfd) < 0)
		r = -errno;
	close(jfd);
	if (r == 0 && fsync(cs_cfg.journal_fd) < 0)
		r = -errno;
	if (r < 0) {
		unlinkat(cs_cfg.journal_fd, c->journal_name, 0);
		return r;
	}
	c->journalled = 1;
	return 0;
}

void cs_journal_release(struct sr_content *c, const struct stat *st)
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
	if (syncfs(cs_cfg.backing_sync_fd) < 0) {
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
		unlinkat(cs_cfg.journal_fd, undo, 0); /* disarmed: the file is whole */
		unlinkat(cs_cfg.journal_fd, batch->name, 0);
		free(batch);
		batch = next;
	}
	(void)fsync(cs_cfg.journal_fd);
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

int cs_journal_start(void)
{
	if (pthread_create(&journal_thread, NULL, journal_main, NULL) != 0)
		return -1;
	journal_thread_started = 1;
	return 0;
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
	if (cs_cfg.journal_fd >= 0)
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

int cs_broken_known(const struct stat *st)
{
	int found = 0;
	pthread_mutex_lock(&broken_lock);
	for (int i = 0; i < broken_count && !found; i++)
		found = broken_files[i].dev == st->st_dev && broken_files[i].ino == st->st_ino;
	pthread_mutex_unlock(&broken_lock);
	return found;
}

void cs_broken_remember(const struct stat *st)
{
	if (cs_broken_known(st))
		return;
	pthread_mutex_lock(&broken_lock);
	if (broken_count < BROKEN_MAX) {
		broken_files[broken_count].dev = st->st_dev;
		broken_files[broken_count].ino = st->st_ino;
		broken_count++;
	}
	pthread_mutex_unlock(&broken_lock);
}

/* ---- failure atomicity ------------------------------------------------------------ */

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

int cs_undo_arm(struct sr_content *c, const struct undo *u)
{
	if (!c->journalled)
		return 0; /* no journal: a failed change is still put back from memory */
	if (c->undo_fd < 0) {
		char name[80];
		snprintf(name, sizeof(name), "%s.undo", c->journal_name);
		c->undo_fd = openat(cs_cfg.journal_fd, name, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (c->undo_fd < 0)
			return -errno;
	}
	uint8_t head[UNDO_HEAD - 8];
	put_be64(head, u->old_end);
	put_be64(head + 8, u->new_end);
	put_be64(head + 16, u->off);
	put_be64(head + 24, u->len);
	srcf_file_id(c->file, head + 32);
	int r = cs_io_full(c->undo_fd, head, sizeof(head), 8, 1);
	if (r == 0 && u->len)
		r = cs_io_full(c->undo_fd, (void *)u->bytes, u->len, UNDO_HEAD, 1);
	if (r == 0)
		r = cs_io_full(c->undo_fd, UNDO_MAGIC, 8, 0, 1);
	return r;
}

/* The change is complete (or put back): the record must never be replayed. */
int cs_undo_disarm(struct sr_content *c)
{
	if (c->undo_fd < 0)
		return 0;
	static const uint8_t zero[8];
	int r = cs_io_full(c->undo_fd, (void *)zero, sizeof(zero), 0, 1);
	if (r < 0 && ftruncate(c->undo_fd, 0) < 0)
		return r;
	return 0;
}

/* A backing write failed half way: the overwritten bytes back, the old length back. */
void cs_undo_apply(struct sr_content *c, const struct undo *u)
{
	int r = u->len ? cs_io_full(c->fd, (void *)u->bytes, u->len, (off_t)u->off, 1) : 0;
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
	if (cs_undo_disarm(c) < 0)
		c->broken = 1; /* armed still, with these same old bytes: a replay changes nothing */
}
