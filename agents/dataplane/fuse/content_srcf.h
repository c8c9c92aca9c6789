/* What the format v1 content layer's files share (not an interface: content.h is).
 * content_srcf.c     the layer's operations table: create, open, read, size, release
 * content_srcf_io.c  per-thread buffers, positional I/O, chunk arithmetic, audit events
 * content_srcf_journal.c  the write journal, its undo records, files left broken
 * content_srcf_write.c    writes, truncation, fallocate: all or nothing
 * content_srcf_rekey.c    online re-key of one open file */
#ifndef SR_CONTENT_SRCF_H
#define SR_CONTENT_SRCF_H

#include "content.h"
#include "control.h"
#include "srcf.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>


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


/* The layer's configuration (sr_content_srcf_configure), fixed before the mount. */
extern struct srcf_layer cs_cfg;

/* ---- content_srcf_io.c ---- */
/* A thread's buffers, grown on demand and kept: a request never allocates. */
struct bufs {
	uint8_t *stored, *plain;
	size_t stored_cap, plain_cap;
	uint8_t *aux, *old;       /* a second sealed piece; the ciphertext a change overwrites */
	size_t aux_cap, old_cap;
};
/* This thread's buffers with at least `stored` and `plain` bytes, or NULL. */
struct bufs *cs_bufs_get(size_t stored, size_t plain);
/* And the aux and old buffers at least this large: 0 or -ENOMEM. */
int cs_bufs_extra(struct bufs *b, size_t aux, size_t old);
/* The whole of [off, off + len) read or written: 0 or a negative errno (-EIO when the
 * file ends first). */
int cs_io_full(int fd, void *buf, size_t len, off_t off, int write_it);
uint64_t cs_chunks_of(uint64_t size, uint32_t cs);
off_t cs_chunk_off(uint64_t index, uint32_t cs);
/* The path of an open backing file relative to the backing directory ("d/f"). */
void cs_rel_path(int fd, char *out, size_t len);
/* An integrity failure or a missing key, for the audit log (rate-limited per file). */
void cs_event(enum sr_event_kind kind, int fd);
/* A libsrcf status as a negative errno (0 for SRCF_OK), with the event it deserves. */
int cs_errno(int rc, int fd);
/* Decrypt chunks first..last (within the current size) into out, exactly their plaintext. */
int cs_read_chunks(struct sr_content *c, uint64_t first, uint64_t last, uint8_t *out, size_t out_len,
		   uint8_t *stored_buf);
int cs_all_zero(const uint8_t *p, size_t n);

/* ---- content_srcf_journal.c ---- */
/* What a change overwrites: the stored bytes [off, off + len) as they were, and the
 * stored lengths before and after it. */
struct undo {
	uint64_t old_end, new_end, off;
	size_t len;
	const uint8_t *bytes;
};
/* Before the first change of a file: its journal entry, durable. 0 or a negative errno. */
int cs_journal_mark(struct sr_content *c);
/* The last user closed a journalled file: its entry goes once the file is durable. */
void cs_journal_release(struct sr_content *c, const struct stat *st);
/* The flusher thread (with a journal directory): 0 or -1. */
int cs_journal_start(void);
/* Arm the undo record before a change, disarm it after (0 or a negative errno); put a
 * failed change back (the state is broken when even that fails). */
int cs_undo_arm(struct sr_content *c, const struct undo *u);
int cs_undo_disarm(struct sr_content *c);
void cs_undo_apply(struct sr_content *c, const struct undo *u);
/* Files left broken, remembered until exit so a later open cannot write on them. */
int cs_broken_known(const struct stat *st);
void cs_broken_remember(const struct stat *st);

/* ---- content_srcf_write.c, content_srcf_rekey.c: operations ---- */
ssize_t cs_write(struct sr_content *c, const void *buf, size_t size, off_t off);
int cs_truncate(struct sr_content *c, off_t size);
int cs_fallocate(struct sr_content *c, int mode, off_t off, off_t len);
int cs_rekey(struct sr_content *c, int dirfd, const char *name);

#endif
