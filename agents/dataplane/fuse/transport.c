/* The FUSE kernel protocol over /dev/fuse, spoken directly (transport.h says why):
 * mounting, the threads that read requests, notifications, the session's life.
 *
 * One request at a time per thread: read() one request into the thread's buffer,
 * dispatch it (request.c), the operation replies with one writev() (reply.c). The kernel
 * hands each request to one reader, so threads share the descriptor; the request buffer
 * doubles as the reply buffer of a READ (sr_reply_data_buf), so a read is decrypted
 * once, straight into what the kernel copies out. */
#define _GNU_SOURCE
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <time.h>
#include <unistd.h>

struct dev_thread {
	struct sr_session *se;
	pthread_t tid;
	char *buf;
};

static int dev_send(struct sr_req *req, struct iovec *iov, int count)
{
	if (!iov || count == 0)
		return 0;
	ssize_t n = writev(req->se->fd, iov, count);
	if (n < 0)
		return -errno;
	return 0;
}

static const struct sr_chan dev_chan = { .send = dev_send, .data_buf = NULL };

static void session_end(struct sr_session *se, int err)
{
	pthread_mutex_lock(&se->lock);
	if (!se->ended) {
		se->ended = 1;
		se->loop_error = err;
	}
	pthread_cond_broadcast(&se->ended_cond);
	pthread_mutex_unlock(&se->lock);
}

/* The reply of a READ is built in the request buffer past the header (the request's own
 * bytes are read before the reply is written). */
static void *dev_thread_main(void *arg)
{
	struct dev_thread *t = arg;
	struct sr_session *se = t->se;
	struct sr_req req;
	memset(&req, 0, sizeof(req));
	req.se = se;
	req.chan = &dev_chan;
	/* A READ's request is a header and a fuse_read_in, copied out before the operation
	 * runs: the rest of its buffer is free for the reply. */
	req.scratch = t->buf + 4096;
	req.scratch_len = se->bufsize - 4096;
	for (;;) {
		pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
		ssize_t n = read(se->fd, t->buf, se->bufsize);
		int err = errno;
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
		if (n < 0) {
			if (err == EINTR || err == EAGAIN || err == ENOENT)
				continue; /* ENOENT: the request was interrupted before we got it */
			session_end(se, err == ENODEV ? 0 : -err);
			break;
		}
		sr_dispatch_contiguous(&req, t->buf, (size_t)n);
	}
	return NULL;
}

int sr_session_loop(struct sr_session *se)
{
	int nthreads = se->opts.threads > 0 ? se->opts.threads : 1;
	struct dev_thread *threads = calloc((size_t)nthreads, sizeof(*threads));
	if (!threads)
		return -ENOMEM;
	int started = 0, err = 0;
	for (int i = 0; i < nthreads; i++) {
		threads[i].se = se;
		if (posix_memalign((void **)&threads[i].buf, 4096, se->bufsize)) {
			threads[i].buf = NULL;
			err = -ENOMEM;
			break;
		}
		if (pthread_create(&threads[i].tid, NULL, dev_thread_main, &threads[i])) {
			free(threads[i].buf);
			threads[i].buf = NULL;
			err = -EAGAIN;
			break;
		}
		started++;
	}
	if (started == 0) {
		free(threads);
		return err ? err : -EAGAIN;
	}
	int uring_tried = 0;
	pthread_mutex_lock(&se->lock);
	while (!se->ended) {
		if (!uring_tried && __atomic_load_n(&se->initialized, __ATOMIC_ACQUIRE)) {
			uring_tried = 1;
			if (se->want & FUSE_OVER_IO_URING) {
				pthread_mutex_unlock(&se->lock);
				int r = sr_uring_start(se, se->fd, se->conn.max_write);
				if (r < 0)
					fprintf(stderr, "strongroom-fuse: io_uring transport refused (%s): "
						"serving /dev/fuse\n", strerror(-r));
				else
					se->uring_running = 1;
				pthread_mutex_lock(&se->lock);
				continue;
			}
		}
		if (!uring_tried) {
			/* wait for INIT (a few milliseconds) without a separate signal */
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 5 * 1000 * 1000;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&se->ended_cond, &se->lock, &ts);
		} else {
			pthread_cond_wait(&se->ended_cond, &se->lock);
		}
	}
	int loop_error = se->loop_error;
	pthread_mutex_unlock(&se->lock);
	/* The others sit in read() (a cancellation point) or finish the request in hand
	 * (cancellation is off while one is served). */
	for (int i = 0; i < started; i++)
		pthread_cancel(threads[i].tid);
	for (int i = 0; i < started; i++) {
		pthread_join(threads[i].tid, NULL);
		free(threads[i].buf);
	}
	free(threads);
	if (se->uring_running) {
		sr_uring_stop(se);
		se->uring_running = 0;
	}
	return err ? err : loop_error;
}


int sr_notify_inval_inode(struct sr_session *se, sr_ino_t ino, off_t off, off_t len)
{
	if (se->fd < 0)
		return -EBADF;
	struct fuse_notify_inval_inode_out arg = { .ino = ino, .off = off, .len = len };
	struct fuse_out_header out = {
		.len = sizeof(out) + sizeof(arg),
		.error = FUSE_NOTIFY_INVAL_INODE,
		.unique = 0,
	};
	struct iovec iov[2] = { { &out, sizeof(out) }, { &arg, sizeof(arg) } };
	return writev(se->fd, iov, 2) < 0 ? -errno : 0;
}

static void *inval_main(void *arg)
{
	struct sr_session *se = arg;
	pthread_mutex_lock(&se->inval_lock);
	for (;;) {
		while (!se->inval_count && !se->inval_stop)
			pthread_cond_wait(&se->inval_cond, &se->inval_lock);
		if (se->inval_stop)
			break;
		unsigned i = se->inval_head;
		sr_ino_t ino = se->inval[i].ino;
		off_t off = se->inval[i].off, len = se->inval[i].len;
		se->inval_head = (i + 1) % 1024;
		se->inval_count--;
		pthread_mutex_unlock(&se->inval_lock);
		(void)sr_notify_inval_inode(se, ino, off, len); /* -ENOENT: forgotten meanwhile */
		pthread_mutex_lock(&se->inval_lock);
	}
	pthread_mutex_unlock(&se->inval_lock);
	return NULL;
}

int sr_notify_inval_inode_later(struct sr_session *se, sr_ino_t ino, off_t off, off_t len)
{
	int r = 0;
	pthread_mutex_lock(&se->inval_lock);
	if (!se->inval_started) {
		if (pthread_create(&se->inval_thread, NULL, inval_main, se) == 0)
			se->inval_started = 1;
		else
			r = -ENOMEM;
	}
	if (r == 0 && se->inval_count == 1024) {
		r = -ENOMEM;
	} else if (r == 0) {
		unsigned i = (se->inval_head + se->inval_count) % 1024;
		se->inval[i].ino = ino;
		se->inval[i].off = off;
		se->inval[i].len = len;
		se->inval_count++;
		pthread_cond_signal(&se->inval_cond);
	}
	pthread_mutex_unlock(&se->inval_lock);
	return r;
}

const char *sr_session_features(const struct sr_session *se)
{
	return se->features;
}

uint64_t sr_session_want(const struct sr_session *se)
{
	return se->want;
}

/* ---- session life ----------------------------------------------------------------- */
static struct sr_session *session_alloc(const struct sr_ops *ops, void *userdata)
{
	struct sr_session *se = calloc(1, sizeof(*se));
	if (!se)
		return NULL;
	se->ops = *ops;
	se->userdata = userdata;
	se->fd = -1;
	/* the largest request: a WRITE of max_write bytes after its headers */
	se->bufsize = SR_REPLY_SCRATCH + 4096;
	pthread_mutex_init(&se->lock, NULL);
	pthread_cond_init(&se->ended_cond, NULL);
	pthread_mutex_init(&se->inval_lock, NULL);
	pthread_cond_init(&se->inval_cond, NULL);
	return se;
}

struct sr_session *sr_session_new_detached(const struct sr_ops *ops, void *userdata)
{
	struct sr_session *se = session_alloc(ops, userdata);
	if (se)
		se->opts.threads = 1;
	return se;
}

struct sr_session *sr_session_new(const struct sr_ops *ops, void *userdata,
				  const struct sr_session_opts *opts)
{
	struct sr_session *se = session_alloc(ops, userdata);
	if (!se)
		return NULL;
	se->opts = *opts;
	se->mountpoint = strdup(opts->mountpoint);
	se->fsname = strdup(opts->fsname ? opts->fsname : "strongroom");
	if (!se->mountpoint || !se->fsname) {
		sr_session_destroy(se);
		return NULL;
	}
	se->opts.mountpoint = se->mountpoint;
	se->opts.fsname = se->fsname;
	return se;
}

int sr_session_mount(struct sr_session *se)
{
	int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	char opts[256];
	snprintf(opts, sizeof(opts),
		 "fd=%d,rootmode=40000,user_id=%u,group_id=%u,default_permissions,max_read=%u%s",
		 fd, (unsigned)getuid(), (unsigned)getgid(), (unsigned)SR_REPLY_SCRATCH,
		 se->opts.allow_other ? ",allow_other" : "");
	if (mount(se->fsname, se->mountpoint, "fuse.strongroom", MS_NOSUID | MS_NODEV, opts) < 0) {
		int err = errno;
		close(fd);
		return -err;
	}
	se->fd = fd;
	return 0;
}

void sr_session_unmount(struct sr_session *se)
{
	if (se->fd < 0)
		return;
	(void)umount2(se->mountpoint, MNT_DETACH);
}

void sr_session_destroy(struct sr_session *se)
{
	if (!se)
		return;
	if (se->inval_started) {
		pthread_mutex_lock(&se->inval_lock);
		se->inval_stop = 1;
		pthread_cond_signal(&se->inval_cond);
		pthread_mutex_unlock(&se->inval_lock);
		pthread_join(se->inval_thread, NULL);
	}
	pthread_mutex_destroy(&se->inval_lock);
	pthread_cond_destroy(&se->inval_cond);
	if (se->fd >= 0)
		close(se->fd);
	free(se->mountpoint);
	free(se->fsname);
	pthread_mutex_destroy(&se->lock);
	pthread_cond_destroy(&se->ended_cond);
	free(se);
}
