/* FUSE over io_uring (protocol 7.42): the kernel hands requests to ring entries the
 * daemon registered, one queue per possible CPU, and takes each reply back in the same
 * io_uring command that fetches the next request. transport.c still serves /dev/fuse
 * beside it: INIT, FORGET and INTERRUPT always travel there, and everything else does
 * until every queue has an entry (the kernel holds requests back until then).
 *
 * One thread per queue, pinned to its CPU, owns that queue's io_uring: it alone submits
 * (SINGLE_ISSUER, DEFER_TASKRUN), so no lock guards the submission queue, and the kernel
 * copies a request into its buffers in that thread's context, on that CPU.
 * Notes and the decision record: /work/notes/uring-notes.md. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "transport.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the 7.42 UAPI (include/uapi/linux/fuse.h): Debian 12's headers stop at 7.38 ---- */
#define SR_URING_IN_OUT_SZ 128
#define SR_URING_OP_IN_SZ 128

struct sr_uring_ent_in_out {
	uint64_t flags;
	uint64_t commit_id;   /* the kernel's key for this request's reply */
	uint32_t payload_sz;  /* request: bytes in the payload; reply: bytes we put there */
	uint32_t padding;
	uint64_t reserved;
};

struct sr_uring_req_header {
	char in_out[SR_URING_IN_OUT_SZ]; /* fuse_in_header in, fuse_out_header back */
	char op_in[SR_URING_OP_IN_SZ];   /* the opcode's fixed argument struct */
	struct sr_uring_ent_in_out ent_in_out;
};

enum { SR_URING_CMD_REGISTER = 1, SR_URING_CMD_COMMIT_AND_FETCH = 2 };

/* Lives in the 80 bytes an SQE128 entry has after its first 48. */
struct sr_uring_cmd_req {
	uint64_t flags;
	uint64_t commit_id;
	uint16_t qid;
	uint8_t padding[6];
};

#define SR_SQE_CMD_OFF 48
_Static_assert(sizeof(struct sr_uring_req_header) == 288, "fuse_uring_req_header is 288 bytes");
_Static_assert(sizeof(struct sr_uring_cmd_req) <= 128 - SR_SQE_CMD_OFF, "fits the SQE128 cmd area");
_Static_assert(offsetof(struct io_uring_sqe, addr3) == SR_SQE_CMD_OFF, "cmd area offset");
_Static_assert(sizeof(struct fuse_in_header) <= SR_URING_IN_OUT_SZ, "in header fits");

#define SR_FUSE_MIN_READ_BUFFER 8192 /* the kernel's floor for the payload size */

/* Entries per queue. The queue's thread serves one request at a time, so depth buys
 * no parallelism; it lets a burst from one CPU come back in one io_uring_enter and keeps
 * an entry armed while the others' replies are on their way. Each entry costs a full
 * payload buffer (max_write: up to 1 MiB), on every possible CPU, so large hosts get
 * fewer: at most SR_URING_MEM_BUDGET of payload buffers in all, never below one. */
#define SR_URING_DEPTH 4
#define SR_URING_MEM_BUDGET ((size_t)256 << 20)

#define SR_STOP_TAG ((uint64_t)1) /* user_data of the stop poll; entries are pointers */

struct sr_uring_queue;

struct sr_uring_ent {
	struct sr_uring_queue *q;
	struct sr_uring_req_header *hdr;
	char *payload;
	struct iovec iov[2]; /* read by the kernel at REGISTER time: must stay put */
	uint64_t commit_id;
	uint32_t last_cmd;
	int in_user;        /* dispatched and not yet committed */
	int armed;          /* the kernel holds a command for it */
};

struct sr_uring_queue {
	struct sr_uring *u;
	unsigned qid;
	pthread_t tid;
	int thread_ok;
	struct io_uring ring;
	int ring_ok;
	int armed;
	int last_err;       /* the kernel's last refusal of an entry */
	int setup_err;      /* reported by the thread: ring set-up */
	int reg_state;      /* 0: pending, 1: registered, < 0: -errno */
	struct sr_uring_ent *ents;
	struct sr_uring_req_header *hdrs;
	size_t hdrs_len;
	char *payloads;
	size_t payloads_len;
};

struct sr_uring {
	struct sr_session *se;
	int dev_fd;
	unsigned nq;
	unsigned depth;
	size_t payload_sz;
	int stop_fd;
	atomic_int stopping;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned setup_reports, reg_reports;
	int go;             /* 0: wait, 1: register, -1: leave */
	struct sr_uring_queue *q;
};

/* sr_uring_stop gets only the session; a process serves one session. */
static struct sr_uring *g_uring;

static int uring_send(struct sr_req *req, struct iovec *iov, int count);
static void *uring_data_buf(struct sr_req *req, size_t size);
static const struct sr_chan uring_chan = { .send = uring_send, .data_buf = uring_data_buf };

static void ulog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void ulog(const char *fmt, ...)
{
	char line[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "strongroom-fuse: io_uring: %s\n", line);
}

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

static int conn_gone(int err)
{
	return err == -ENOTCONN || err == -ECANCELED || err == -ENODEV || err == -ECONNABORTED;
}

static void prep_cmd(struct io_uring_sqe *sqe, struct sr_uring_ent *ent, uint32_t op)
{
	struct sr_uring_queue *q = ent->q;
	struct sr_uring_cmd_req *cmd = (struct sr_uring_cmd_req *)((char *)sqe + SR_SQE_CMD_OFF);

	if (op == SR_URING_CMD_REGISTER)
		io_uring_prep_rw(IORING_OP_URING_CMD, sqe, q->u->dev_fd, ent->iov, 2, 0);
	else
		io_uring_prep_rw(IORING_OP_URING_CMD, sqe, q->u->dev_fd, NULL, 0, 0);
	sqe->cmd_op = op; /* shares the word prep_rw zeroed as the offset */
	sqe->__pad1 = 0;
	cmd->flags = 0;
	cmd->commit_id = op == SR_URING_CMD_COMMIT_AND_FETCH ? ent->commit_id : 0;
	cmd->qid = (uint16_t)q->qid;
	memset(cmd->padding, 0, sizeof(cmd->padding));
	io_uring_sqe_set_data(sqe, ent);
	ent->last_cmd = op;
}

/* Queue a command for `ent`: sent with the next io_uring_enter of its thread. */
static int queue_cmd(struct sr_uring_ent *ent, uint32_t op)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&ent->q->ring);

	/* Each entry has at most one command in flight and the SQ has a slot per entry
	 * plus the stop poll, so this only fails on a bookkeeping bug. */
	if (!sqe) {
		io_uring_submit(&ent->q->ring);
		sqe = io_uring_get_sqe(&ent->q->ring);
		if (!sqe)
			return -EBUSY;
	}
	prep_cmd(sqe, ent, op);
	ent->armed = 1;
	ent->q->armed++;
	return 0;
}

static int arm_stop_poll(struct sr_uring_queue *q)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_add(sqe, q->u->stop_fd, POLLIN);
	io_uring_sqe_set_data64(sqe, SR_STOP_TAG);
	return 0;
}

/* Commit a reply the transport built in the entry's header and payload. */
static int commit(struct sr_uring_ent *ent)
{
	int r;

	ent->in_user = 0;
	r = queue_cmd(ent, SR_URING_CMD_COMMIT_AND_FETCH);
	if (r < 0)
		ulog("queue %u: no submission slot for a reply (%d)", ent->q->qid, r);
	return r;
}

static int commit_error(struct sr_uring_ent *ent, uint64_t unique, int err)
{
	struct fuse_out_header oh = { .len = sizeof(oh), .error = err, .unique = unique };

	memcpy(ent->hdr->in_out, &oh, sizeof(oh));
	ent->hdr->ent_in_out.payload_sz = 0;
	return commit(ent);
}

/* iov[0] is the out header, the rest the reply's arguments, laid end to end in the
 * payload. A piece already sitting where it belongs (sr_reply_data_buf) is not copied;
 * one elsewhere inside the payload would be overwritten while it is being moved, so
 * that is refused as a transport bug. iov == NULL, count == 0: no reply (FORGET, or a
 * request dispatch dropped), but the entry must go back to the kernel all the same, and
 * the only way back is a commit: an error reply, which no caller waits for. */
static int uring_send(struct sr_req *req, struct iovec *iov, int count)
{
	struct sr_uring_ent *ent = req->chan_data;
	struct sr_uring *u = ent->q->u;
	struct fuse_out_header oh;
	size_t len = 0;
	int i;

	if (!ent->in_user)
		return -EINVAL; /* a second reply */
	if (count <= 0 || !iov)
		return commit_error(ent, req->unique, -EIO);
	if (iov[0].iov_len != sizeof(oh))
		return commit_error(ent, req->unique, -EIO);
	memcpy(&oh, iov[0].iov_base, sizeof(oh));
	for (i = 1; i < count; i++) {
		const char *src = iov[i].iov_base;
		size_t n = iov[i].iov_len;
		char *dst = ent->payload + len;

		if (n == 0)
			continue;
		if (n > u->payload_sz - len) {
			ulog("reply of opcode %u larger than the payload buffer", req->opcode);
			return commit_error(ent, req->unique, -EIO);
		}
		if (src != dst) {
			if (src < ent->payload + u->payload_sz && src + n > ent->payload) {
				ulog("reply piece overlaps the payload buffer out of place");
				return commit_error(ent, req->unique, -EIO);
			}
			memcpy(dst, src, n);
		}
		len += n;
	}
	memcpy(ent->hdr->in_out, &oh, sizeof(oh));
	ent->hdr->ent_in_out.payload_sz = (uint32_t)len;
	return commit(ent);
}

/* The payload buffer is also where the request's own payload (names, write data) lies:
 * only a request with none (READ) may build its reply here. */
static void *uring_data_buf(struct sr_req *req, size_t size)
{
	struct sr_uring_ent *ent = req->chan_data;

	return size <= ent->q->u->payload_sz ? ent->payload : NULL;
}

static void handle_request(struct sr_uring_ent *ent)
{
	struct sr_uring_queue *q = ent->q;
	struct fuse_in_header in;
	struct sr_req req;
	uint32_t paylen = ent->hdr->ent_in_out.payload_sz;
	long argsz;
	size_t oplen;

	/* A copy: the reply overwrites in_out while the operation may still look at `in`. */
	memcpy(&in, ent->hdr->in_out, sizeof(in));
	ent->commit_id = ent->hdr->ent_in_out.commit_id;
	ent->in_user = 1;

	if (paylen > q->u->payload_sz) {
		commit_error(ent, in.unique, -EIO);
		return;
	}
	argsz = sr_op_arg_size(in.opcode);
	oplen = argsz < 0 ? 0 : (size_t)argsz;
	if (oplen > SR_URING_OP_IN_SZ)
		oplen = SR_URING_OP_IN_SZ;

	memset(&req, 0, sizeof(req));
	req.se = q->u->se;
	req.chan = &uring_chan;
	req.chan_data = ent;
	req.unique = in.unique;
	req.opcode = in.opcode;
	req.ctx.uid = in.uid;
	req.ctx.gid = in.gid;
	req.ctx.pid = (pid_t)in.pid;
	sr_dispatch(&req, &in, ent->hdr->op_in, oplen, ent->payload, paylen);

	/* Operations reply before they return; one that did not would strand the entry
	 * and, with it, every later request from this CPU. */
	if (ent->in_user) {
		ulog("opcode %u returned without a reply: answered EIO", in.opcode);
		commit_error(ent, in.unique, -EIO);
	}
}

/* 1: keep going, 0: leave (stop asked, or the connection is gone). */
static int handle_cqe(struct sr_uring_queue *q, uint64_t data, int res)
{
	struct sr_uring_ent *ent = (struct sr_uring_ent *)(uintptr_t)data;

	if (data == SR_STOP_TAG) {
		if (atomic_load(&q->u->stopping))
			return 0;
		if (arm_stop_poll(q) < 0)
			ulog("queue %u: stop poll not re-armed", q->qid);
		return 1;
	}
	ent->armed = 0;
	q->armed--;
	if (res >= 0) {
		handle_request(ent);
		return 1;
	}
	if (conn_gone(res))
		return 0;
	if (res == -EAGAIN || res == -EINTR) {
		if (queue_cmd(ent, ent->last_cmd) == 0)
			return 1;
	}
	/* The kernel has dropped this entry (-ENOENT: unknown commit id; -EINVAL: refused
	 * buffers). Its siblings carry on; a queue left with none ends below. */
	q->last_err = res;
	ulog("queue %u: %s failed: %s", q->qid,
	     ent->last_cmd == SR_URING_CMD_REGISTER ? "REGISTER" : "COMMIT_AND_FETCH", strerror(-res));
	return 1;
}

/* Handle what has completed; submit finished replies before the next request when more
 * are waiting, so one slow operation does not hold back the replies before it. */
static int drain(struct sr_uring_queue *q)
{
	struct io_uring_cqe *cqe;

	while (io_uring_peek_cqe(&q->ring, &cqe) == 0 && cqe) {
		uint64_t data = cqe->user_data;
		int res = cqe->res;

		io_uring_cqe_seen(&q->ring, cqe);
		if (!handle_cqe(q, data, res))
			return 0;
		if (io_uring_sq_ready(&q->ring) && io_uring_cq_ready(&q->ring))
			io_uring_submit(&q->ring);
	}
	return 1;
}

static int ring_init(struct sr_uring_queue *q)
{
	static const unsigned tries[] = {
		IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
		IORING_SETUP_COOP_TASKRUN,
		0,
	};
	unsigned entries = q->u->depth + 1; /* + the stop poll */
	int r = -EINVAL;

	for (size_t i = 0; i < sizeof(tries) / sizeof(tries[0]); i++) {
		struct io_uring_params p;

		memset(&p, 0, sizeof(p));
		p.flags = IORING_SETUP_SQE128 | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_CQSIZE | tries[i];
		p.cq_entries = 2 * entries;
		r = io_uring_queue_init_params(entries, &q->ring, &p);
		if (r == 0) {
			q->ring_ok = 1;
			return 0;
		}
		if (r != -EINVAL)
			break;
	}
	return r;
}

static void report(struct sr_uring *u, int *field, int value, unsigned *counter)
{
	pthread_mutex_lock(&u->lock);
	*field = value;
	(*counter)++;
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->lock);
}

static void *queue_main(void *arg)
{
	struct sr_uring_queue *q = arg;
	struct sr_uring *u = q->u;
	cpu_set_t set;
	char name[16];
	int go, r;

	snprintf(name, sizeof(name), "sr-uring-%u", q->qid);
	pthread_setname_np(pthread_self(), name);
	/* Where the kernel runs a request for this queue: tolerate an offline CPU. */
	CPU_ZERO(&set);
	if (q->qid < CPU_SETSIZE) {
		CPU_SET(q->qid, &set);
		(void)sched_setaffinity(0, sizeof(set), &set);
	}

	report(u, &q->setup_err, ring_init(q), &u->setup_reports);
	pthread_mutex_lock(&u->lock);
	while (u->go == 0)
		pthread_cond_wait(&u->cond, &u->lock);
	go = u->go;
	pthread_mutex_unlock(&u->lock);
	if (go < 0 || q->setup_err)
		return NULL;

	r = arm_stop_poll(q);
	for (unsigned i = 0; r == 0 && i < u->depth; i++)
		r = queue_cmd(&q->ents[i], SR_URING_CMD_REGISTER);
	if (r == 0) {
		r = io_uring_submit(&q->ring);
		r = r < 0 ? r : 0;
	}
	/* A refused REGISTER completes at once; an accepted one only with a request. */
	if (r == 0 && !drain(q))
		r = -ENOTCONN;
	if (r == 0 && q->armed == 0)
		r = q->last_err ? q->last_err : -EIO;
	report(u, &q->reg_state, r < 0 ? r : 1, &u->reg_reports);
	if (r < 0)
		return NULL;

	for (;;) {
		r = io_uring_submit_and_wait(&q->ring, 1);
		if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
			ulog("queue %u: io_uring_enter: %s", q->qid, strerror(-r));
			break;
		}
		if (!drain(q))
			break;
		if (q->armed == 0) {
			/* The kernel still routes this CPU's requests here: they wait for the
			 * unmount. Say so loudly; there is no way to hand them elsewhere. */
			ulog("queue %u: no entries left", q->qid);
			break;
		}
	}
	return NULL;
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
		ulog("cannot withdraw io_uring: requests wait until the mount is aborted");
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
		ulog("stop eventfd: %s", strerror(errno));
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
		err = -pthread_create(&u->q[i].tid, NULL, queue_main, &u->q[i]);
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
	ulog("%u queues of %u entries, %zu-byte payloads", u->nq, u->depth, u->payload_sz);
	return 0;

fail:
	ulog("not started: %s; serving /dev/fuse alone", strerror(-err));
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
