/* The mount's life as the control channel sees it: main() mounts only once the plane
 * said MOUNT; the mount made is remembered by its device, so that only it is ever
 * unmounted by path; and a shutdown (SHUTDOWN, end of the channel, SIGTERM/SIGINT/SIGHUP)
 * pushes the writeback cache through while the keys are here, wipes the keys, seals the
 * file system and unmounts it from inside. README.md, "Shutdown". */
#define _GNU_SOURCE
#include "shutdown.h"

#include "channel.h"
#include "control.h"
#include "keystore.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#define FUSE_USE_VERSION 312

#include "fs.h"

static struct sr_session *session;
static char *mount_path;
static int stopping;

/* Before MOUNT the daemon has not mounted: nothing to unmount (the mount point may
 * hold someone else's mount, e.g. a stale one the plane is about to clear). */
static pthread_mutex_t mount_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t mount_cond = PTHREAD_COND_INITIALIZER;
static enum { MOUNT_WAITING, MOUNT_GO, MOUNT_GONE } mount_state;
static int mounted;

/* The device of the mount this daemon made (FUSE: 0:N, one per connection), learnt
 * when it mounted. Only that mount is ever unmounted by path: if someone took it away
 * first (an administrator's umount -l, a restarted agent taking over), the path now
 * shows what lies under it — the guard point's shield, or a newer data plane — and
 * unmounting "whatever is at the path" would remove that. */
static unsigned own_maj, own_mnr;
static int own_known;

/* A shutdown under way, which main() waits for (sr_control_wait). */
static pthread_mutex_t shutdown_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t shutdown_cond = PTHREAD_COND_INITIALIZER;
static int shutdown_running;

int sr_shutdown_init(struct sr_session *se, const char *mountpoint)
{
	session = se;
	mount_path = strdup(mountpoint);
	return mount_path ? 0 : -ENOMEM;
}

void sr_shutdown_free(void)
{
	free(mount_path);
	mount_path = NULL;
}

static void mount_signal(int state)
{
	pthread_mutex_lock(&mount_lock);
	if (mount_state == MOUNT_WAITING)
		mount_state = state;
	pthread_cond_broadcast(&mount_cond);
	pthread_mutex_unlock(&mount_lock);
}

int sr_mount_waiting(void)
{
	pthread_mutex_lock(&mount_lock);
	int waiting = mount_state == MOUNT_WAITING;
	pthread_mutex_unlock(&mount_lock);
	return waiting;
}

void sr_mount_release(void)
{
	mount_signal(MOUNT_GO);
}

int sr_control_await_mount(void)
{
	if (!sr_channel_connected())
		return 0;
	pthread_mutex_lock(&mount_lock);
	while (mount_state == MOUNT_WAITING)
		pthread_cond_wait(&mount_cond, &mount_lock);
	int go = mount_state == MOUNT_GO;
	pthread_mutex_unlock(&mount_lock);
	return go ? 0 : -1;
}

void sr_mount_learn_own(void)
{
	if (mount_path && sr_mount_device(mount_path, &own_maj, &own_mnr) == 0)
		own_known = 1; /* just mounted: the mount on top of the path is ours */
	__atomic_store_n(&mounted, 1, __ATOMIC_RELEASE);
}

void sr_shutdown_loop_ended(void)
{
	__atomic_store_n(&stopping, 1, __ATOMIC_SEQ_CST);
}

int sr_mount_device(const char *mountpoint, unsigned *maj, unsigned *mnr)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return -errno;
	char line[2 * PATH_MAX];
	int found = 0;
	while (fgets(line, sizeof(line), f)) {
		char where[PATH_MAX];
		unsigned a, b;
		/* id parent maj:min root mountpoint ... (the last match is the one on top) */
		if (sscanf(line, "%*d %*d %u:%u %*s %4095s", &a, &b, where) == 3 && !strcmp(where, mountpoint)) {
			*maj = a;
			*mnr = b;
			found = 1;
		}
	}
	fclose(f);
	return found ? 0 : -ENOENT;
}

int sr_mount_is_own(const char *mountpoint)
{
	unsigned maj, mnr;
	if (!own_known)
		return 1; /* never learnt (not mounted through main): as before */
	return sr_mount_device(mountpoint, &maj, &mnr) == 0 && maj == own_maj && mnr == own_mnr;
}

/* Whether a mount this process can see has device maj:mnr. */
static int device_mounted(unsigned maj, unsigned mnr)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return 1; /* cannot tell: as if taken, so nothing of anyone else's is aborted */
	char line[2 * PATH_MAX];
	int found = 0;
	while (!found && fgets(line, sizeof(line), f)) {
		unsigned a, b;
		found = sscanf(line, "%*d %*d %u:%u", &a, &b) == 2 && a == maj && b == mnr;
	}
	fclose(f);
	return found;
}

void sr_abort_own_connection(void)
{
	if (!own_known)
		return;
	/* The connection's number is its superblock's device. Once our superblock is gone
	 * (unmounted, no file open through it) the kernel hands that number to the next
	 * FUSE mount, whoever makes it: /sys/fs/fuse/connections/N is then someone else's
	 * connection, and aborting it cut a stranger's mount (seen with many mounts made at
	 * once: a daemon that had just mounted exited 0, another's files said ENOTCONN).
	 * Our own detached superblock is in no mount table; a mount that shows our number is
	 * ours still reachable (then nothing to abort) or a stranger's: either way, leave it.
	 * What remains is a new mount taking the number between this look and the write. */
	if (device_mounted(own_maj, own_mnr))
		return;
	char abort_path[96];
	snprintf(abort_path, sizeof(abort_path), "/sys/fs/fuse/connections/%u/abort", own_mnr);
	int fd = open(abort_path, O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)!write(fd, "1", 1);
		close(fd);
	}
}

/* The writeback cache holds what applications wrote and the daemon has not seen yet:
 * push it through while the keys are still here, so a stop loses nothing written. Only
 * while the request loop runs (sr_control_stop sets `stopping` after it ended) and only
 * our own mount (never what lies under the path once ours is gone). syncfs(2) alone is
 * not enough: it returns once FUSE has queued the writeback (measured: 23 of 200 one-byte
 * files not yet written when it returned), so we then wait for the connection's count of
 * requests in flight to reach zero (fusectl's `waiting`), 30 s at most. */
static void flush_mount(void)
{
	if (__atomic_load_n(&stopping, __ATOMIC_SEQ_CST) || !session || !mount_path ||
	    !__atomic_load_n(&mounted, __ATOMIC_ACQUIRE) || !own_known || !sr_mount_is_own(mount_path))
		return;
	if (!(sr_session_want(session) & FUSE_WRITEBACK_CACHE))
		return;
	int fd = open(mount_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return;
	(void)syncfs(fd);
	close(fd);
	char path[96];
	snprintf(path, sizeof(path), "/sys/fs/fuse/connections/%u/waiting", own_mnr);
	for (int i = 0; i < 30000; i++) {
		char buf[32];
		int w = open(path, O_RDONLY | O_CLOEXEC);
		if (w < 0)
			return;
		ssize_t n = read(w, buf, sizeof(buf) - 1);
		close(w);
		if (n <= 0)
			return;
		buf[n] = 0;
		if (atoi(buf) == 0)
			return;
		usleep(1000);
	}
	fprintf(stderr, "strongroom-fuse: writeback still in flight after 30 s; stopping anyway\n");
}

/* Unmount from inside: the kernel ends the connection, the request loop sees ENODEV. A
 * busy mount is detached, and its connection aborted so open files lose plaintext now.
 * Never a stat() of the mount: the loop may already have stopped answering. */
static void unmount_from_inside(void)
{
	int have_dev = own_known;
	if (have_dev)
		sr_fs_seal(session);
	if (!sr_mount_is_own(mount_path)) {
		/* Our mount is gone from the path already; files opened through it may still
		 * hold the connection: end it, so they lose the plaintext now, and touch
		 * nothing at the path. */
		sr_abort_own_connection();
		return;
	}
	int r = umount2(mount_path, 0) < 0 ? errno : 0;
	if (r == EBUSY) {
		/* MNT_FORCE aborts the FUSE connection (umount_begin) even when the umount
		 * itself still fails; the detach then takes the mount away. The fusectl abort
		 * is the same thing where MNT_FORCE is not allowed. */
		if (umount2(mount_path, MNT_FORCE) < 0)
			(void)umount2(mount_path, MNT_DETACH);
		if (have_dev)
			sr_abort_own_connection();
	} else if (r == EPERM) {
		/* not root: fusermount3 does it */
		pid_t pid = fork();
		if (pid == 0) {
			execlp("fusermount3", "fusermount3", "-u", "-z", mount_path, (char *)NULL);
			_exit(127);
		}
		if (pid > 0)
			(void)waitpid(pid, NULL, 0);
	}
}

void sr_shutdown(void)
{
	flush_mount();
	sr_keys_wipe();
	mount_signal(MOUNT_GONE);
	if (__atomic_exchange_n(&stopping, 1, __ATOMIC_SEQ_CST))
		return;
	if (!session || !__atomic_load_n(&mounted, __ATOMIC_ACQUIRE))
		return;
	/* The request loop ends as soon as the connection does, and main() must not exit
	 * the process under our feet before the unmount is complete (sr_control_wait). */
	pthread_mutex_lock(&shutdown_lock);
	shutdown_running = 1;
	pthread_mutex_unlock(&shutdown_lock);
	unmount_from_inside();
	pthread_mutex_lock(&shutdown_lock);
	shutdown_running = 0;
	pthread_cond_broadcast(&shutdown_cond);
	pthread_mutex_unlock(&shutdown_lock);
}

void sr_control_wait(void)
{
	pthread_mutex_lock(&shutdown_lock);
	while (shutdown_running)
		pthread_cond_wait(&shutdown_cond, &shutdown_lock);
	pthread_mutex_unlock(&shutdown_lock);
}
