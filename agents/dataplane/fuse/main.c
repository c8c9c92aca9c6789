/* strongroom-fuse: serve one guard point (PROTECTED path, BACKING directory) until it
 * is unmounted, SIGTERM/SIGINT arrives, or the control plane says SHUTDOWN or goes away.
 * Exit codes: README.md. */
#define _GNU_SOURCE
#include "args.h"
#include "control.h"
#include "fs.h"
#include "srcf.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/statfs.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
	EXIT_OK = 0,
	EXIT_USAGE = 1,
	EXIT_BACKING = 2, /* backing or protected directory unusable */
	EXIT_MOUNT = 3,   /* the session could not be created or mounted */
	EXIT_CONTROL = 4, /* control channel or key memory could not be set up */
	EXIT_LOOP = 5,    /* the request loop failed */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: strongroom-fuse [options] BACKING PROTECTED\n"
		"  --control-fd N   inherited UNIX socket to the control plane (README.md)\n"
		"  --root-fd N      inherited descriptor of PROTECTED, opened before anything covers it\n"
		"  --threads N      most request threads (default 16)\n"
		"  --allow-other    let users other than the daemon's use the mount\n"
		"  --attr-timeout S attribute and entry cache in seconds (default 1.0)\n"
		"  --content NAME   srcf (default: format v1 encryption, needs --control-fd for keys)\n"
		"                   or plain (no encryption: tests of the file-system core)\n"
		"  --chunk-size N   plaintext bytes per chunk of new files (default 4096)\n"
		"  --journal DIR    write journal for crash repair (FORMAT.md; default: none)\n"
		"  --writeback-cache on|off  the kernel's writeback cache (default on)\n"
		"  --io-uring       ask for FUSE over io_uring (granted when the host's\n"
		"                   /sys/module/fuse/parameters/enable_uring is Y)\n"
		"  --debug          request trace on stderr\n");
}

static void bdi_set(const char *dev, const char *name, const char *value)
{
	char path[96];
	snprintf(path, sizeof(path), "/sys/class/bdi/%s/%s", dev, name);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)!write(fd, value, strlen(value));
		close(fd);
	}
}

/* The mount's backing-device settings, between the mount and INIT (the loop has not
 * started: a stat() of the mount would wait for our own loop, so the device number comes
 * from /proc/self/mountinfo).
 * - Read-ahead in 1 MiB requests: the kernel sets a FUSE mount's read-ahead to min(the
 *   device's current value, the max_readahead our INIT reply gives), and the current
 *   value is the 128 KiB default unless root raises it now.
 * - Dirty pages like a local file system's: the kernel gives a FUSE mount a strict 1 %
 *   share of the dirty limit (45 MB here), a guard against FUSE servers that cannot be
 *   trusted to write back. This one is root's, and under the writeback cache the share
 *   throttled writers to the daemon's pace: 4 KiB random writes (fio, no cipher) went
 *   from 118 k to 276 k IOPS with the limit lifted. */
static void tune_bdi(const char *mountpoint, int writeback)
{
	unsigned maj, mnr;
	if (sr_mount_device(mountpoint, &maj, &mnr) < 0)
		return;
	char dev[32];
	snprintf(dev, sizeof(dev), "%u:%u", maj, mnr);
	bdi_set(dev, "read_ahead_kb", "4096\n");
	if (writeback) {
		bdi_set(dev, "max_ratio", "100\n");
		bdi_set(dev, "strict_limit", "0\n");
	}
}

/* The FUSE control file system: its abort file is how a daemon ends its own connection
 * when its mount can no longer be reached by path (detached while files stay open through
 * it). systemd mounts it at boot; where nothing did (a container, this test machine),
 * root mounts it here. Host-wide and harmless: the same mount every distribution makes. */
#define FUSECTL_SUPER_MAGIC 0x65735543
static void ensure_fusectl(void)
{
	const char *dir = "/sys/fs/fuse/connections";
	struct statfs sfs;
	if (geteuid() != 0 || statfs(dir, &sfs) < 0 || sfs.f_type == FUSECTL_SUPER_MAGIC)
		return;
	(void)mount("fusectl", dir, "fusectl", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
}

/* SIGTERM, SIGINT and SIGHUP take the same road as SHUTDOWN (sr_shutdown): they are
 * blocked in every thread and taken here, so no handler runs in a request thread. */
static sigset_t stop_signals;

static void *signal_main(void *arg)
{
	(void)arg;
	int sig;
	while (sigwait(&stop_signals, &sig) != 0)
		;
	sr_shutdown();
	return NULL;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "control-fd", required_argument, NULL, 'c' },
		{ "root-fd", required_argument, NULL, 'r' },
		{ "threads", required_argument, NULL, 't' },
		{ "allow-other", no_argument, NULL, 'a' },
		{ "attr-timeout", required_argument, NULL, 'T' },
		{ "content", required_argument, NULL, 'C' },
		{ "chunk-size", required_argument, NULL, 'k' },
		{ "journal", required_argument, NULL, 'j' },
		{ "debug", no_argument, NULL, 'd' },
		{ "writeback-cache", required_argument, NULL, 'W' },
		{ "io-uring", no_argument, NULL, 'U' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int control_fd = -1, root_fd = -1, threads = 16, allow_other = 0, debug = 0, opt, encrypt = 1;
	int chunk_size = SRCF_DEFAULT_CHUNK, writeback = 1, io_uring = 0;
	const char *journal = NULL;
	double timeout = 1.0;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'c': if (sr_parse_int(optarg, &control_fd)) goto bad; break;
		case 'r': if (sr_parse_int(optarg, &root_fd)) goto bad; break;
		case 't': if (sr_parse_int(optarg, &threads) || threads < 1 || threads > 256) goto bad; break;
		case 'a': allow_other = 1; break;
		case 'T': timeout = strtod(optarg, NULL); if (timeout < 0 || timeout > 3600) goto bad; break;
		case 'C':
			if (!strcmp(optarg, "plain"))
				encrypt = 0;
			else if (strcmp(optarg, "srcf"))
				goto bad;
			break;
		case 'k':
			if (sr_parse_int(optarg, &chunk_size) || chunk_size < (int)SRCF_MIN_CHUNK ||
			    chunk_size > (int)SRCF_MAX_CHUNK || (chunk_size & (chunk_size - 1)))
				goto bad;
			break;
		case 'j': journal = optarg; break;
		case 'd': debug = 1; break;
		case 'W':
			if (!strcmp(optarg, "on"))
				writeback = 1;
			else if (!strcmp(optarg, "off"))
				writeback = 0;
			else
				goto bad;
			break;
		case 'U': io_uring = 1; break;
		case 'h': usage(stdout); return EXIT_OK;
		default: goto bad;
		}
	}
	if (argc - optind != 2)
		goto bad;

	/* Before any thread exists, so that every thread inherits the mask. */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&stop_signals);
	sigaddset(&stop_signals, SIGTERM);
	sigaddset(&stop_signals, SIGINT);
	sigaddset(&stop_signals, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);

	/* A daemon that may hold keys leaves no core dump and cannot be ptrace-attached by
	 * processes of its own user (key memory is MADV_DONTDUMP besides: src/secmem.c). */
	if (control_fd >= 0) {
		struct rlimit no_core = { 0, 0 };
		(void)setrlimit(RLIMIT_CORE, &no_core);
		(void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	}

	/* New inodes get exactly the mode the kernel sends (the caller's umask applied). */
	umask(0);
	/* Keep 1 MiB request buffers in the heap instead of a fresh mmap() per request. */
	mallopt(M_MMAP_THRESHOLD, 32 << 20);
	mallopt(M_TRIM_THRESHOLD, 128 << 20);

	char backing[PATH_MAX], mountpoint[PATH_MAX];
	if (!realpath(argv[optind], backing) || !realpath(argv[optind + 1], mountpoint)) {
		perror("strongroom-fuse: realpath");
		return EXIT_BACKING;
	}
	int backing_fd = open(backing, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (backing_fd < 0) {
		perror("strongroom-fuse: backing directory");
		return EXIT_BACKING;
	}
	if (root_fd < 0)
		root_fd = open(mountpoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	else
		(void)fcntl(root_fd, F_SETFD, FD_CLOEXEC);
	struct stat st;
	if (root_fd < 0 || fstat(root_fd, &st) < 0 || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "strongroom-fuse: protected directory %s unusable\n", mountpoint);
		return EXIT_BACKING;
	}

	int journal_fd = -1;
	if (encrypt) {
		if (journal) {
			(void)mkdir(journal, 0700);
			journal_fd = open(journal, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			if (journal_fd < 0) {
				perror("strongroom-fuse: journal directory");
				return EXIT_BACKING;
			}
		}
		if (sr_content_srcf_configure((uint32_t)chunk_size, journal_fd, backing) < 0) {
			fprintf(stderr, "strongroom-fuse: libsrcf has another ABI version\n");
			return EXIT_USAGE;
		}
		/* no core dump, no ptrace by our own user: this process will hold keys */
		(void)srcf_harden_process();
	}
	struct sr_fs_config cfg = {
		.backing_fd = backing_fd,
		.protected_fd = root_fd,
		.backing_path = backing,
		.content = encrypt ? &sr_content_srcf : &sr_content_plain,
		.content_layer = NULL,
		.timeout = timeout,
		.writeback_cache = writeback,
		.io_uring = io_uring,
	};
	if (sr_fs_init(&cfg) < 0) {
		perror("strongroom-fuse: backing directory");
		return EXIT_BACKING;
	}

	if (geteuid() != 0) {
		/* mount(2) of a FUSE file system and the guard point's shield need root */
		fprintf(stderr, "strongroom-fuse: must run as root\n");
		return EXIT_MOUNT;
	}
	char fsname[PATH_MAX + 16];
	snprintf(fsname, sizeof(fsname), "strongroom:%s", backing);
	/* the mount source may not contain a comma unescaped: it only labels /proc/mounts */
	for (char *p = fsname; *p; p++)
		if (*p == ',')
			*p = '_';
	struct sr_session_opts so = {
		.mountpoint = mountpoint,
		.fsname = fsname,
		.allow_other = allow_other,
		.threads = threads,
		.writeback_cache = writeback,
		.io_uring = io_uring,
		.debug = debug,
	};
	struct sr_session *se = sr_session_new(&sr_fs_ops, NULL, &so);
	if (!se)
		return EXIT_MOUNT;
	int status = EXIT_OK;
	if (sr_control_start(control_fd, se, mountpoint) < 0) {
		fprintf(stderr, "strongroom-fuse: control channel or locked key memory unavailable\n");
		sr_session_destroy(se);
		return EXIT_CONTROL;
	}
	if (sr_control_await_mount() < 0) {
		/* the plane went away (or said SHUTDOWN) before it was configured */
		sr_control_stop();
		sr_session_destroy(se);
		return EXIT_CONTROL;
	}
	ensure_fusectl();
	int mr = sr_session_mount(se);
	if (mr < 0) {
		fprintf(stderr, "strongroom-fuse: mount %s: %s\n", mountpoint, strerror(-mr));
		sr_control_stop();
		sr_session_destroy(se);
		return EXIT_MOUNT;
	}
	tune_bdi(mountpoint, writeback);
	pthread_t signal_thread;
	if (pthread_create(&signal_thread, NULL, signal_main, NULL) == 0)
		pthread_detach(signal_thread);
	sr_control_ready();
	if (sr_session_loop(se) < 0)
		status = EXIT_LOOP;
	sr_control_wait();
	/* The loop ended because the connection did (an unmount from outside, or ours): a
	 * mount still at the path is unmounted only if it is ours, never what lies under it. */
	if (sr_mount_is_own(mountpoint))
		sr_session_unmount(se);
	else
		sr_abort_own_connection();
	sr_control_stop();
	sr_session_destroy(se);
	sr_fs_destroy();
	if (encrypt)
		sr_content_srcf_shutdown();
	close(root_fd);
	close(backing_fd);
	if (journal_fd >= 0)
		close(journal_fd);
	return status;
bad:
	usage(stderr);
	return EXIT_USAGE;
}
