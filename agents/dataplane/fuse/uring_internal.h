/* What the io_uring transport's two files share: uring.c (each queue's thread) and
 * uring_setup.c (sizing, buffers, start and stop). Private to them; transport.h has the
 * public side. */
#ifndef SR_URING_INTERNAL_H
#define SR_URING_INTERNAL_H

#include "transport.h"

#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

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

/* uring.c */
void sr_uring_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *sr_uring_queue_main(void *arg); /* a queue's thread: its ring, REGISTER, the loop */

#endif
