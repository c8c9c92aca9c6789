/* FUSE over io_uring, the starting side: how many queues and how deep, their buffers,
 * the threads started and waited for (each reports its ring, then its REGISTER), the
 * io_uring withdrawn from the connection when they fail, and the teardown. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "uring_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#define SR_FUSE_MIN_READ_BUFFER 8192 /* the kernel's floor for the payload size */

/* Entries per queue. The queue's thread serves one request at a time, so depth buys
 * no parallelism; it lets a burst from one CPU come back in one io_uring_enter and keeps
 * an entry armed while the others' replies are on their way. Each entry costs a full
 * payload buffer (max_write: up to 1 MiB), on every possible CPU, so large hosts get
 * fewer: at most SR_URING_MEM_BUDGET of payload buffers in all, never below one. */
#define SR_URING_DEPTH 4
#define SR_URING_MEM_BUDGET ((size_t)256 << 20)

/* sr_uring_stop gets only the session; a process serves one session. */
static struct sr_uring *g_uring;

/* The kernel makes num_possible_cpus() queues and routes a request by the caller's CPU. */
static unsigned possible_cpus(void)
{
	char buf[256];
	unsigned n = 0;
	FILE *f = fopen("/sys/devices/system/cpu/possible", "re");

	if (f) {
		if (fgets(buf, sizeof(buf), f)) {
			char *p = buf;
			while (*p >= '0' && *p <= '9') {
				unsigned long a = strtoul(p, &p, 10), b = a;
				if (*p == '-')
					b = strtoul(p + 1, &p, 10);
				if (b >= a && b - a < 65536)
					n += (unsigned)(b - a + 1);
				if (*p == ',')
					p++;
			}
		}
		fclose(f);
	}
	if (n == 0) {
		long c = sysconf(_SC_NPROCESSORS_CONF);
		n = c > 0 ? (unsigned)c : 1;
	}
	return n;
}

/* A REGISTER for a queue that cannot exist fails in the kernel's register path, which
 * then withdraws io_uring from the connection (fc->io_uring = 0): requests the kernel
 * holds back for a ring that will never be ready flow through /dev/fuse again. */
static void withdraw_uring(int dev_fd)
{
	struct io_uring ring;
	struct io_uring_sqe *sqe;
	struct io_uring_cqe *cqe;
	struct sr_uring_cmd_req *cmd;

	if (io_uring_queue_init(2, &ring, IORING_SETUP_SQE128) < 0) {
		sr_uring_log("cannot withdraw io_uring: requests wait until the mount is aborted");
		return;
	}
	sqe = io_uring_get_sqe(&ring);
	io_uring_prep_rw(IORING_OP_URING_CMD, sqe, dev_fd, NULL, 0, 0);
	sqe->cmd_op = SR_URING_CMD_REGISTER;
	sqe->__pad1 = 0;
	cmd = (struct sr_uring_cmd_req *)((char *)sqe + SR_SQE_CMD_OFF);
	memset(cmd, 0, sizeof(*cmd));
	cmd->qid = UINT16_MAX;
	if (io_uring_submit_and_wait(&ring, 1) >= 0 && io_uring_peek_cqe(&ring, &cqe) == 0)
		io_uring_cqe_seen(&ring, cqe);
	io_uring_queue_exit(&ring);
}

static void teardown(struct sr_uring *u)
{
	uint64_t one = 1;

	atomic_store(&u->stopping, 1);
	pthread_mutex_lock(&u->lock);
	if (u->go == 0)
		u->go = -1;
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->lock);
	if (u->stop_fd >= 0 && write(u->stop_fd, &one, sizeof(one)) < 0)
		sr_uring_log("stop eventfd: %s", strerror(errno));
	/* A thread's exit cancels its commands in the kernel (io_uring ties them to the
	 * submitting task), so after the join nothing writes into the buffers freed below. */
	for (unsigned i = 0; i < u->nq; i++) {
		struct sr_uring_queue *q = &u->q[i];

		if (q->thread_ok)
			pthread_join(q->tid, NULL);
		if (q->ring_ok)
			io_uring_queue_exit(&q->ring);
		if (q->hdrs)
			munmap(q->hdrs, q->hdrs_len);
		if (q->payloads)
			munmap(q->payloads, q->payloads_len);
		free(q->ents);
	}
	if (u->stop_fd >= 0)
		close(u->stop_fd);
	pthread_cond_destroy(&u->cond);
	pthread_mutex_destroy(&u->lock);
	free(u->q);
	free(u);
}

static void *map_anon(size_t len)
{
	/* Not populated: pages appear on first touch, by the pinned thread or the kernel
	 * copying a request in on its behalf, so on that CPU's node. */
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

static int queue_alloc(struct sr_uring *u, struct sr_uring_queue *q)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	q->hdrs_len = (u->depth * sizeof(struct sr_uring_req_header) + page - 1) / page * page;
	q->payloads_len = u->depth * u->payload_sz;
	q->ents = calloc(u->depth, sizeof(*q->ents));
	q->hdrs = map_anon(q->hdrs_len);
	q->payloads = map_anon(q->payloads_len);
	if (!q->ents || !q->hdrs || !q->payloads)
		return -ENOMEM;
	for (unsigned i = 0; i < u->depth; i++) {
		struct sr_uring_ent *ent = &q->ents[i];

		ent->q = q;
		ent->hdr = &q->hdrs[i];
		ent->payload = q->payloads + i * u->payload_sz;
		ent->iov[0].iov_base = ent->hdr;
		ent->iov[0].iov_len = sizeof(*ent->hdr);
		ent->iov[1].iov_base = ent->payload;
		ent->iov[1].iov_len = u->payload_sz;
	}
	return 0;
}

int sr_uring_available(void)
{
	struct io_uring ring;
	if (io_uring_queue_init(2, &ring, IORING_SETUP_SQE128) < 0)
		return 0; /* kernel.io_uring_disabled, a seccomp filter, no SQE128 */
	io_uring_queue_exit(&ring);
	return 1;
}

int sr_uring_start(struct sr_session *se, int dev_fd, uint32_t max_payload)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct sr_uring *u;
	sigset_t all, old;
	int err = 0;

	if (g_uring)
		return -EBUSY;
	u = calloc(1, sizeof(*u));
	if (!u)
		return -ENOMEM;
	u->se = se;
	u->dev_fd = dev_fd;
	u->stop_fd = -1;
	u->nq = possible_cpus();
	u->payload_sz = max_payload < SR_FUSE_MIN_READ_BUFFER ? SR_FUSE_MIN_READ_BUFFER : max_payload;
	u->payload_sz = (u->payload_sz + page - 1) / page * page;
	u->depth = SR_URING_DEPTH;
	if ((size_t)u->nq * u->depth * u->payload_sz > SR_URING_MEM_BUDGET) {
		size_t d = SR_URING_MEM_BUDGET / ((size_t)u->nq * u->payload_sz);
		u->depth = d ? (unsigned)d : 1;
	}
	pthread_mutex_init(&u->lock, NULL);
	pthread_cond_init(&u->cond, NULL);
	u->q = calloc(u->nq, sizeof(*u->q));
	u->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!u->q || u->stop_fd < 0) {
		err = u->q ? -errno : -ENOMEM;
		if (!u->q)
			u->nq = 0;
		goto fail;
	}
	for (unsigned i = 0; i < u->nq && !err; i++) {
		u->q[i].u = u;
		u->q[i].qid = i;
		err = queue_alloc(u, &u->q[i]);
	}
	if (err)
		goto fail;

	/* Signals belong to the loop's threads; ours only ever wait in io_uring_enter. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (unsigned i = 0; i < u->nq && !err; i++) {
		err = -pthread_create(&u->q[i].tid, NULL, sr_uring_queue_main, &u->q[i]);
		u->q[i].thread_ok = err == 0;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);

	pthread_mutex_lock(&u->lock);
	for (unsigned i = 0; i < u->nq; i++)
		if (!u->q[i].thread_ok)
			u->setup_reports++; /* never started: counted as reported */
	while (u->setup_reports < u->nq)
		pthread_cond_wait(&u->cond, &u->lock);
	for (unsigned i = 0; i < u->nq && !err; i++)
		err = u->q[i].setup_err;
	u->go = err ? -1 : 1;
	pthread_cond_broadcast(&u->cond);
	while (!err && u->reg_reports < u->nq)
		pthread_cond_wait(&u->cond, &u->lock);
	for (unsigned i = 0; i < u->nq && !err; i++)
		err = u->q[i].reg_state < 0 ? u->q[i].reg_state : 0;
	pthread_mutex_unlock(&u->lock);
	if (err)
		goto fail;

	g_uring = u;
	sr_uring_log("%u queues of %u entries, %zu-byte payloads", u->nq, u->depth, u->payload_sz);
	return 0;

fail:
	sr_uring_log("not started: %s; serving /dev/fuse alone", strerror(-err));
	teardown(u);
	/* After the threads are gone: no queue of ours can complete the ring any more. */
	withdraw_uring(dev_fd);
	return err;
}

void sr_uring_stop(struct sr_session *se)
{
	struct sr_uring *u = g_uring;

	if (!u || u->se != se)
		return;
	g_uring = NULL;
	teardown(u);
}
