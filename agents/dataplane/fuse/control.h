/* The control channel (a UNIX socket inherited from the Python control plane as
 * --control-fd) as the rest of the daemon sees it: start and stop, the mount's life,
 * the access decision and its events. Inside: control.c (the reader), channel.c (the
 * socket), keystore.c (keys: keystore.h), policy.c, shutdown.c. Wire format: README.md. */
#ifndef SR_CONTROL_H
#define SR_CONTROL_H

#include <stdint.h>
#include <sys/types.h>

#define SR_PROTO_VERSION 2
#define SR_MAX_FRAME (1u << 20)

enum sr_msg_type {
	SR_MSG_READY = 0x01,      /* daemon -> plane, once mounted */
	SR_MSG_STATUS_REQ = 0x02, /* plane -> daemon, answered by SR_MSG_STATUS */
	SR_MSG_SET_POLICY = 0x03,
	SR_MSG_SET_KEY = 0x04,
	SR_MSG_DROP_KEY = 0x05,
	SR_MSG_SHUTDOWN = 0x06,
	SR_MSG_SET_ACTIVE = 0x07, /* the key version new files are written under (held already) */
	SR_MSG_REKEY = 0x08,      /* re-encrypt one file (path relative to BACKING) under the active key */
	SR_MSG_MOUNT = 0x09,      /* configured: mount now (the daemon waits for it before mounting) */
	SR_MSG_RESULT = 0x80, /* daemon -> plane: answer to every request but STATUS_REQ */
	SR_MSG_EVENT = 0x81,
	SR_MSG_STATUS = 0x82,
};

enum sr_mode { SR_MODE_OFF = 0, SR_MODE_ENFORCE = 1, SR_MODE_LEARN = 2 };
enum sr_access { SR_ACCESS_READ = 1, SR_ACCESS_WRITE = 2, SR_ACCESS_ALL = 3 };

/* Operation named in an event. */
enum sr_op {
	SR_OP_OPEN = 1, SR_OP_CREATE, SR_OP_TRUNCATE, SR_OP_SETATTR, SR_OP_UNLINK, SR_OP_RMDIR,
	SR_OP_RENAME, SR_OP_LINK, SR_OP_MKDIR, SR_OP_SYMLINK, SR_OP_MKNOD, SR_OP_SETXATTR,
	SR_OP_REMOVEXATTR,
};

enum sr_event_kind {
	SR_EV_DENIED = 1,      /* enforce: the caller got EACCES */
	SR_EV_WOULD_DENY = 2,  /* learn: enforce would have refused */
	SR_EV_PERMITTED = 3,   /* a permit rule with audit set */
	SR_EV_INTEGRITY = 4,   /* content failed authentication (encrypted layer) */
	SR_EV_NO_KEY = 5,      /* content needs a key the daemon does not hold */
};

struct sr_caller {
	uid_t uid;
	gid_t gid;
	pid_t pid;
	int ngroups;
	gid_t groups[64];
};

struct sr_session;

/* Start with `fd` (or -1: no control plane, policy off). Reads messages on a thread of
 * its own; SHUTDOWN or end of file wipes the keys and unmounts `mountpoint`. */
int sr_control_start(int fd, struct sr_session *se, const char *mountpoint);
/* With a control plane: block until it sends MOUNT (keys, active version and policy
 * are in place by then, as the channel is read in order), 0; or -1 when the channel
 * ended first. Without one: 0 at once. */
int sr_control_await_mount(void);
/* Mounted: say READY; from now on a shutdown unmounts. */
void sr_control_ready(void);
void sr_control_stop(void);
/* Wipe the keys, seal the file system (no more plaintext, page cache dropped), unmount:
 * what SHUTDOWN, end of the control channel and SIGTERM/SIGINT/SIGHUP do. */
void sr_shutdown(void);
/* After the request loop ended: wait until a shutdown under way has unmounted. */
void sr_control_wait(void);

/* The access decision for one operation: 0 or -EACCES (after the event is queued).
 * `want` is SR_ACCESS_READ, SR_ACCESS_WRITE or both. `path` names the object inside
 * the mount, for the event. */
int sr_policy_check(const struct sr_caller *c, int want, enum sr_op op, const char *path);
int sr_policy_active(void);
void sr_event_send(enum sr_event_kind kind, int access, enum sr_op op, const struct sr_caller *c,
		   int rule, const char *path);

/* The device number of the mount on top at `mountpoint`, from /proc/self/mountinfo
 * (no request to our own file system). 0 or -ENOENT. */
int sr_mount_device(const char *mountpoint, unsigned *maj, unsigned *mnr);
/* Whether the mount on top of `mountpoint` is still the one this daemon made (1), or
 * something else now shows there (0): the only mount it may unmount by path. */
int sr_mount_is_own(const char *mountpoint);
/* End this daemon's FUSE connection (fusectl abort): files still open through a
 * detached mount lose the plaintext, and libfuse then sees the connection gone. */
void sr_abort_own_connection(void);

/* From fs.c: online re-key of one file (REKEY), 0 or a negative errno. */
int sr_fs_rekey(const char *rel);
/* From fs.c, for STATUS: inodes the kernel holds lookups on. */
uint64_t sr_fs_inodes(void);

#endif
