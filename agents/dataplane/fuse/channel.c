/* The control channel's socket: one writer thread drains a queue, so FUSE threads
 * never block on the socket; the reader (control.c) reads whole frames. Wire format:
 * README.md, "The control channel". */
#define _GNU_SOURCE
#include "channel.h"

#include "control.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct out_msg { struct out_msg *next; size_t len; uint8_t data[]; };
#define EVENT_QUEUE_MAX 4096

static int ctl_fd = -1;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t out_cond = PTHREAD_COND_INITIALIZER;
static struct out_msg *out_head, *out_tail;
static size_t out_events;
static int out_closing;
static uint64_t events_sent, events_dropped;
static pthread_t writer_thread;
static int writer_started;

int sr_channel_connected(void)
{
	return ctl_fd >= 0;
}

void sr_channel_send(uint16_t type, uint32_t seq, const uint8_t *payload, size_t len, int is_event)
{
	if (ctl_fd < 0)
		return;
	struct out_msg *m = malloc(sizeof(*m) + 12 + len);
	pthread_mutex_lock(&out_lock);
	if (!m || out_closing || (is_event && out_events >= EVENT_QUEUE_MAX)) {
		if (is_event)
			events_dropped++;
		pthread_mutex_unlock(&out_lock);
		free(m);
		return;
	}
	m->next = NULL;
	m->len = 12 + len;
	sr_put32(m->data, (uint32_t)(8 + len));
	sr_put16(m->data + 4, SR_PROTO_VERSION);
	sr_put16(m->data + 6, type);
	sr_put32(m->data + 8, seq);
	if (len)
		memcpy(m->data + 12, payload, len);
	if (out_tail)
		out_tail->next = m;
	else
		out_head = m;
	out_tail = m;
	if (is_event) {
		out_events++;
		events_sent++;
	}
	pthread_cond_signal(&out_cond);
	pthread_mutex_unlock(&out_lock);
}

void sr_channel_counts(uint64_t *sent, uint64_t *dropped)
{
	pthread_mutex_lock(&out_lock);
	*sent = events_sent;
	*dropped = events_dropped;
	pthread_mutex_unlock(&out_lock);
}

static void *writer_main(void *arg)
{
	(void)arg;
	for (;;) {
		pthread_mutex_lock(&out_lock);
		while (!out_head && !out_closing)
			pthread_cond_wait(&out_cond, &out_lock);
		struct out_msg *m = out_head;
		if (!m) { /* closing and drained */
			pthread_mutex_unlock(&out_lock);
			return NULL;
		}
		out_head = m->next;
		if (!out_head)
			out_tail = NULL;
		if (sr_get16(m->data + 6) == SR_MSG_EVENT)
			out_events--;
		pthread_mutex_unlock(&out_lock);
		size_t done = 0;
		while (done < m->len) {
			ssize_t n = send(ctl_fd, m->data + done, m->len - done, MSG_NOSIGNAL);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				break; /* the plane is gone: the reader sees EOF and shuts down */
			done += (size_t)n;
		}
		free(m);
	}
}

int sr_channel_open(int fd)
{
	ctl_fd = fd;
	(void)fcntl(fd, F_SETFD, FD_CLOEXEC);
	if (pthread_create(&writer_thread, NULL, writer_main, NULL))
		return -EAGAIN;
	writer_started = 1;
	return 0;
}

int sr_channel_read(uint8_t *b, size_t n)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = read(ctl_fd, b + done, n - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		done += (size_t)r;
	}
	return 0;
}

void sr_channel_close_writer(void)
{
	if (!writer_started)
		return;
	pthread_mutex_lock(&out_lock);
	out_closing = 1;
	pthread_cond_broadcast(&out_cond);
	pthread_mutex_unlock(&out_lock);
	/* Flush what is queued, for 2 s at most: a plane that stopped reading must not
	 * keep the daemon from exiting (shutdown wakes a blocked send). */
	struct timespec deadline;
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += 2;
	if (pthread_timedjoin_np(writer_thread, NULL, &deadline) != 0) {
		shutdown(ctl_fd, SHUT_RDWR);
		pthread_join(writer_thread, NULL);
	}
	writer_started = 0;
}

void sr_channel_wake_reader(void)
{
	if (ctl_fd >= 0)
		shutdown(ctl_fd, SHUT_RDWR); /* wakes the reader if the plane is still there */
}

void sr_channel_close(void)
{
	if (ctl_fd >= 0)
		close(ctl_fd); /* ctl_fd keeps its number: events after this are dropped (closing) */
}
