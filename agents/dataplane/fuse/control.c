/* The control channel's reader: one request at a time, in order, each answered (RESULT
 * or STATUS) before the next is read; and the channel's start and stop. What each
 * request does lives with its concern: keystore.c (SET_KEY, DROP_KEY, SET_ACTIVE),
 * policy.c (SET_POLICY), shutdown.c (MOUNT, SHUTDOWN), fs.c (REKEY); the socket and the
 * outgoing queue are channel.c's. Wire format: README.md, "The control channel". */
#define _GNU_SOURCE
#include "control.h"

#include "channel.h"
#include "keystore.h"
#include "policy.h"
#include "shutdown.h"
#include "wire.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_t reader_thread;
static int reader_started;

static void result(uint32_t seq, int err)
{
	uint8_t b[4];
	sr_put32(b, (uint32_t)(-err));
	sr_channel_send(SR_MSG_RESULT, seq, b, 4, 0);
}

static void send_status(uint32_t seq)
{
	uint8_t b[48];
	memset(b, 0, sizeof(b));
	uint16_t nrules;
	uint64_t generation, sent, dropped;
	sr_policy_status(&b[0], &b[1], &nrules, &generation);
	sr_put16(b + 2, nrules);
	sr_put32(b + 4, sr_keys_count());
	sr_put64(b + 8, generation);
	sr_channel_counts(&sent, &dropped);
	sr_put64(b + 16, sent);
	sr_put64(b + 24, dropped);
	sr_put32(b + 32, (uint32_t)getpid());
	sr_put32(b + 36, SR_PROTO_VERSION);
	sr_put64(b + 40, sr_fs_inodes());
	sr_channel_send(SR_MSG_STATUS, seq, b, sizeof(b), 0);
}

/* One request (but SHUTDOWN, which ends the reader): its answer is queued. */
static void handle(uint16_t type, uint32_t seq, const uint8_t *payload, uint32_t plen)
{
	switch (type) {
	case SR_MSG_STATUS_REQ:
		send_status(seq);
		return;
	case SR_MSG_SET_POLICY: {
		struct sr_policy *p = sr_policy_parse(payload, plen);
		if (p)
			sr_policy_install(p);
		result(seq, p ? 0 : -EINVAL);
		return;
	}
	case SR_MSG_SET_KEY:
		result(seq, plen == 52 ? sr_key_set(payload, sr_get32(payload + 16), payload + 20) : -EINVAL);
		return;
	case SR_MSG_SET_ACTIVE:
		result(seq, plen == 20 ? sr_key_activate(payload, sr_get32(payload + 16)) : -EINVAL);
		return;
	case SR_MSG_DROP_KEY:
		result(seq, plen == 20 ? sr_key_drop(payload, sr_get32(payload + 16)) : -EINVAL);
		return;
	case SR_MSG_REKEY: {
		if (plen == 0 || plen >= PATH_MAX || memchr(payload, 0, plen)) {
			result(seq, -EINVAL);
			return;
		}
		char rel[PATH_MAX];
		memcpy(rel, payload, plen);
		rel[plen] = '\0';
		result(seq, sr_fs_rekey(rel));
		return;
	}
	case SR_MSG_MOUNT: {
		int first = sr_mount_waiting();
		result(seq, plen ? -EINVAL : first ? 0 : -EALREADY);
		if (!plen && first)
			sr_mount_release();
		return;
	}
	default:
		result(seq, -EOPNOTSUPP);
	}
}

static void *reader_main(void *arg)
{
	(void)arg;
	uint8_t hdr[12];
	while (sr_channel_read(hdr, 4) == 0) {
		uint32_t len = sr_get32(hdr);
		if (len < 8 || len > SR_MAX_FRAME)
			break; /* a broken peer: stop listening (and shut down below) */
		if (sr_channel_read(hdr + 4, 8) < 0)
			break;
		uint16_t version = sr_get16(hdr + 4), type = sr_get16(hdr + 6);
		uint32_t seq = sr_get32(hdr + 8), plen = len - 8;
		uint8_t *payload = malloc(plen ? plen : 1);
		if (!payload || (plen && sr_channel_read(payload, plen) < 0)) {
			if (payload)
				explicit_bzero(payload, plen);
			free(payload);
			break;
		}
		int shutdown = version == SR_PROTO_VERSION && type == SR_MSG_SHUTDOWN;
		if (version != SR_PROTO_VERSION)
			result(seq, -EPROTONOSUPPORT);
		else if (shutdown)
			result(seq, 0);
		else
			handle(type, seq, payload, plen);
		explicit_bzero(payload, plen); /* SET_KEY carried a key */
		free(payload);
		if (shutdown)
			break;
	}
	sr_shutdown();
	return NULL;
}

int sr_control_start(int fd, struct sr_session *se, const char *mountpoint)
{
	int r = sr_keystore_init();
	if (r < 0)
		return r;
	if ((r = sr_shutdown_init(se, mountpoint)) < 0)
		return r;
	if (fd < 0)
		return 0; /* no control plane: policy off, no keys */
	if ((r = sr_policy_install_closed()) < 0)
		return r;
	if ((r = sr_channel_open(fd)) < 0)
		return r;
	if (pthread_create(&reader_thread, NULL, reader_main, NULL))
		return -EAGAIN;
	reader_started = 1;
	return 0;
}

void sr_control_ready(void)
{
	sr_mount_learn_own();
	uint8_t b[8];
	sr_put32(b, (uint32_t)getpid());
	sr_put32(b + 4, SR_PROTO_VERSION);
	sr_channel_send(SR_MSG_READY, 0, b, sizeof(b), 0);
}

/* After the request loop ended: flush what is queued, wipe keys, release everything. */
void sr_control_stop(void)
{
	sr_shutdown_loop_ended();
	sr_keys_wipe();
	sr_channel_close_writer();
	if (reader_started) {
		sr_channel_wake_reader();
		pthread_join(reader_thread, NULL);
		reader_started = 0;
	}
	sr_channel_close();
	sr_keys_wipe();
	sr_policy_clear();
	sr_shutdown_free();
}
