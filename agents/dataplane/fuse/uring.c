/* FUSE over io_uring (protocol 7.42): the kernel hands requests to ring entries the
 * daemon registered, one queue per possible CPU, and takes each reply back in the same
 * io_uring command that fetches the next request. transport.c still serves /dev/fuse
 * beside it: INIT, FORGET and INTERRUPT always travel there, and everything else does
 * until every queue has an entry (the kernel holds requests back until then).
 *
 * One thread per queue, pinned to its CPU, owns that queue's io_uring: it alone submits
 * (SINGLE_ISSUER, DEFER_TASKRUN), so no lock guards the submission queue, and the kernel
 * copies a request into its buffers in that thread's context, on that CPU.
 * This file is that thread (its ring, REGISTER, the loop, replies into the entries);
 * uring_setup.c sizes the queues, maps their buffers, starts and stops the threads.
 * Notes and the decision record: /work/notes/uring-notes.md. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "uring_internal.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SR_STOP_TAG ((uint64_t)1) /* user_data of the stop poll; entries are pointers */

static int uring_send(struct sr_req *req, struct iovec *iov, int count);
static void *uring_data_buf(struct sr_req *req, size_t size);
static const struct sr_chan uring_chan = { .send = uring_send, .data_buf = uring_data_buf };

void sr_uring_log(const char *fmt, ...)
{
	char line[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "strongroom-fuse: io_uring: %s\n", line);
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
		sr_uring_log("queue %u: no submission slot for a reply (%d)", ent->q->qid, r);
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
			sr_uring_log("reply of opcode %u larger than the payload buffer", req->opcode);
			return commit_error(ent, req->unique, -EIO);
		}
		if (src != dst) {
			if (src < ent->payload + u->payload_sz && src + n > ent->payload) {
				sr_uring_log("reply piece overlaps the payload buffer out of place");
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
		sr_uring_log("opcode %u returned without a reply: answered EIO", in.opcode);
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
			sr_uring_log("queue %u: stop poll not re-armed", q->qid);
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
	sr_uring_log("queue %u: %s failed: %s", q->qid,
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

void *sr_uring_queue_main(void *arg)
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
			sr_uring_log("queue %u: io_uring_enter: %s", q->qid, strerror(-r));
			break;
		}
		if (!drain(q))
			break;
		if (q->armed == 0) {
			/* The kernel still routes this CPU's requests here: they wait for the
			 * unmount. Say so loudly; there is no way to hand them elsewhere. */
			sr_uring_log("queue %u: no entries left", q->qid);
			break;
		}
	}
	return NULL;
}
