/* What transport.c, reply.c and request.c share about a session (private to them). */
#ifndef SR_SESSION_H
#define SR_SESSION_H

#include "transport.h"

#include <pthread.h>

struct sr_session {
	struct sr_ops ops;
	void *userdata;
	struct sr_session_opts opts;
	char *mountpoint;
	char *fsname;
	int fd;
	int initialized;
	int uring_running;
	struct sr_conn conn;
	uint64_t want;
	char features[192];
	size_t bufsize;
	pthread_mutex_t lock;
	pthread_cond_t ended_cond;
	int ended;
	int loop_error;
	/* sr_notify_inval_inode_later: a ring of pending invalidations and its thread */
	pthread_mutex_t inval_lock;
	pthread_cond_t inval_cond;
	pthread_t inval_thread;
	int inval_started, inval_stop;
	unsigned inval_head, inval_count;
	struct { sr_ino_t ino; off_t off, len; } inval[1024];
};

/* One reply with one argument block (none when len is 0). */
int sr_reply_args(sr_req_t req, const void *arg, size_t len);

#endif
