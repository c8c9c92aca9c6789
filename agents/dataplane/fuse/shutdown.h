/* The mount's life as the control channel sees it (shutdown.c): waiting for MOUNT,
 * knowing which mount is ours, and the shutdown that flushes, wipes the keys, seals
 * and unmounts. The calls main.c and fs.c make are in control.h. */
#ifndef SR_SHUTDOWN_H
#define SR_SHUTDOWN_H

struct sr_session;

/* Before the reader starts: the session and the mount point a shutdown acts on. */
int sr_shutdown_init(struct sr_session *se, const char *mountpoint);
/* MOUNT: whether the daemon still waits for it (else -EALREADY is the answer) ... */
int sr_mount_waiting(void);
/* ... and let main() mount (after the RESULT is queued). */
void sr_mount_release(void);
/* Mounted: learn the mount's device (only that mount is ever unmounted by path). */
void sr_mount_learn_own(void);
/* The request loop ended: a later shutdown flushes nothing and unmounts nothing. */
void sr_shutdown_loop_ended(void);
void sr_shutdown_free(void);

#endif
