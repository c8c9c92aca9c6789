/* strongroom-volume: serve the decrypted data segment of a LUKS2 aes-xts-plain64
 * container as one file in a FUSE mount, until it is unmounted or SIGTERM/SIGINT/SIGHUP
 * arrives. The passphrase comes on stdin. Exit codes and everything else: README.md. */
#define _GNU_SOURCE
#include "args.h"
#include "fs.h"
#include "luks.h"
#include "secmem.h"
#include "srcf.h"
#include "volume_io.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <openssl/crypto.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
	EXIT_OK = 0,
	EXIT_USAGE = 1,
	EXIT_PASSPHRASE = 2,  /* refused by every keyslot */
	EXIT_CONTAINER = 3,   /* not LUKS2, cannot be opened */
	EXIT_UNSUPPORTED = 4, /* LUKS2, but not aes-xts-plain64 with a 512-bit key in one plain segment */
	EXIT_MOUNT = 5,
	EXIT_MLOCK = 6,       /* key memory could not be locked */
	EXIT_LOOP = 7,
};

#define PASS_MAX 1024

static void usage(void)
{
	printf(
		"usage: strongroom-volume [options] CONTAINER MOUNTPOINT  (passphrase on stdin)\n"
		"  --name NAME      the file's name in MOUNTPOINT (default \"volume\")\n"
		"  --threads N      most request threads (default 8)\n"
		"  --allow-other    let other users (root) use the mount\n"
		"  --writeback-cache  let the kernel cache writes until a flush or fsync (for a loop\n"
		"                   device, whose size never changes: see README.md)\n"
		"  -f, --foreground do not detach\n"
		"  --ready-fd N     write \"ready SIZE SECTOR-SIZE\\n\" to fd N once mounted, then close it\n");
}

/* Every failure is one line on stderr that says what to do next. */
static int die(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("strongroom-volume: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return code;
}

/* The passphrase and the volume key get locked, non-dumpable memory of their own from
 * libsrcf's allocator (secmem.h: a slot holds 60 bytes, these are 1 KiB and 64 bytes).
 * It is wiped and unmapped once the cipher contexts are keyed. */
struct secrets {
	unsigned char key[VIO_KEY_SIZE];
	unsigned char pass[PASS_MAX + 1]; /* one more: a longer passphrase is refused, not cut */
};

static struct secrets *secrets_new(void)
{
	/* MADV_WIPEONFORK too: fuse_daemonize() forks, and the child gets no secrets. */
	return srcf_secure_map(sizeof(struct secrets));
}

static void secrets_free(struct secrets *s)
{
	srcf_secure_unmap(s, sizeof(struct secrets));
}

/* Until EOF, byte for byte: a newline is part of the passphrase, as with cryptsetup
 * --key-file. -1 on a read error, PASS_MAX + 1 when there is more than PASS_MAX. */
static ssize_t read_passphrase(unsigned char *p)
{
	size_t have = 0;
	while (have <= PASS_MAX) {
		ssize_t r = read(STDIN_FILENO, p + have, PASS_MAX + 1 - have);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		have += (size_t)r;
	}
	return (ssize_t)have;
}

/* libfuse reports a failed mount on its own stderr line; we keep its words for ours. */
static char fuse_said[256];

static void keep_fuse_log(enum fuse_log_level level, const char *fmt, va_list ap)
{
	if (level > FUSE_LOG_ERR)
		return;
	vsnprintf(fuse_said, sizeof(fuse_said), fmt, ap);
	fuse_said[strcspn(fuse_said, "\n")] = 0;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "name", required_argument, NULL, 'n' },
		{ "threads", required_argument, NULL, 't' },
		{ "allow-other", no_argument, NULL, 'a' },
		{ "writeback-cache", no_argument, NULL, 'w' },
		{ "foreground", no_argument, NULL, 'f' },
		{ "ready-fd", required_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *name = "volume";
	int threads = 8, allow_other = 0, writeback = 0, foreground = 0, ready_fd = -1, opt;
	opterr = 0; /* our own one line instead of getopt's */
	while ((opt = getopt_long(argc, argv, "fh", longopts, NULL)) != -1) {
		switch (opt) {
		case 'n': name = optarg; break;
		case 't':
			if (sr_parse_int(optarg, &threads) || threads < 1 || threads > 256)
				return die(EXIT_USAGE, "--threads takes a number from 1 to 256");
			break;
		case 'a': allow_other = 1; break;
		case 'w': writeback = 1; break;
		case 'f': foreground = 1; break;
		case 'r':
			if (sr_parse_int(optarg, &ready_fd) || fcntl(ready_fd, F_GETFD) < 0)
				return die(EXIT_USAGE, "--ready-fd takes the number of an open descriptor");
			break;
		case 'h': usage(); return EXIT_OK;
		default: return die(EXIT_USAGE, "unknown option: see strongroom-volume --help");
		}
	}
	if (argc - optind != 2)
		return die(EXIT_USAGE, "usage: strongroom-volume [options] CONTAINER MOUNTPOINT (see --help)");
	if (!*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..") || strlen(name) > NAME_MAX)
		return die(EXIT_USAGE, "--name takes a file name: no '/', not . or .., at most 255 bytes");
	if (ready_fd >= 0)
		(void)fcntl(ready_fd, F_SETFD, FD_CLOEXEC);

	/* A reader that went away must not kill us with SIGPIPE on the ready line. */
	signal(SIGPIPE, SIG_IGN);
	/* No core dump, no ptrace by our own user: this process holds the volume key, and
	 * OpenSSL's key schedules live in its ordinary heap. */
	(void)srcf_harden_process();
	/* Keep 1 MiB request buffers in the heap instead of a fresh mmap() per request. */
	mallopt(M_MMAP_THRESHOLD, 32 << 20);
	mallopt(M_TRIM_THRESHOLD, 128 << 20);

	struct secrets *sec = secrets_new();
	if (!sec)
		return die(EXIT_MLOCK, "cannot lock memory for the key: raise RLIMIT_MEMLOCK (ulimit -l) or run as root");
	ssize_t pass_len = read_passphrase(sec->pass);
	if (pass_len < 0 || pass_len > PASS_MAX) {
		secrets_free(sec);
		return die(EXIT_USAGE, pass_len < 0 ? "cannot read the passphrase from stdin: give it on stdin, then close it"
						     : "the passphrase on stdin is longer than 1024 bytes: give the keyslot's passphrase");
	}

	const char *container = argv[optind];
	char mountpoint[PATH_MAX];
	if (!realpath(argv[optind + 1], mountpoint)) {
		secrets_free(sec);
		return die(EXIT_MOUNT, "mount point %s: %s: create the directory first", argv[optind + 1], strerror(errno));
	}
	/* Linux ignores O_EXCL without O_CREAT except on a block device, which it claims:
	 * not while mounted or mapped by device-mapper, and nobody mounts it while we serve. */
	int fd = open(container, O_RDWR | O_EXCL | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		secrets_free(sec);
		return die(EXIT_CONTAINER, "cannot open %s read-write (%s): %s", container, strerror(e),
			   e == EBUSY ? "unmount it or close its device-mapper mapping first"
				      : "check the path and that you may write it");
	}

	struct vio_geometry g;
	char why[512];
	int r = sv_luks_unlock(fd, sec->pass, (size_t)pass_len, sec->key, &g, why, sizeof(why));
	OPENSSL_cleanse(sec->pass, sizeof(sec->pass));
	struct vio *vio = NULL;
	int vr = r ? 0 : vio_open(&vio, fd, &g, sec->key);
	secrets_free(sec); /* the key now lives in the cipher contexts only */
	if (r) {
		close(fd);
		return die(r, "%s: %s", container, why);
	}
	if (vr) {
		close(fd);
		if (vr == -EIO)
			return die(EXIT_UNSUPPORTED, "%s: OpenSSL refuses the volume key for AES-XTS (equal halves): re-key the "
				   "volume with cryptsetup reencrypt", container);
		return die(EXIT_MOUNT, "out of memory setting up the volume: free some memory and try again");
	}
	/* Two servers of one container would overwrite each other's sectors. An OFD lock:
	 * private to this open file, and unrelated to the flock()s cryptsetup takes, so the
	 * cryptsetup tools keep working on the header while we serve. */
	struct flock lk = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0 };
	if (fcntl(fd, F_OFD_SETLK, &lk) < 0) {
		vio_close(vio);
		close(fd);
		return die(EXIT_CONTAINER, "%s is being served already (another strongroom-volume holds its lock): stop that "
			   "one first", container);
	}

	struct stat st;
	struct sv_fs fs = {
		.vio = vio,
		.name = name,
		.size = g.size,
		.uid = getuid(),
		.gid = getgid(),
		.writeback = writeback,
	};
	if (fstat(fd, &st) == 0)
		fs.start = st.st_mtim;
	fs.mtime = fs.start;
	pthread_mutex_init(&fs.lock, NULL);

	char opts[PATH_MAX + 160];
	snprintf(opts, sizeof(opts), "default_permissions,fsname=strongroom-volume:%s,subtype=strongroom-volume,max_read=%u%s",
		 container, VIO_MAX_IO, allow_other ? ",allow_other" : "");
	/* fsname may not contain a comma unescaped: replace, it only labels /proc/mounts */
	for (char *p = opts + strlen("default_permissions,fsname="); *p && strncmp(p, ",subtype=", 9); p++)
		if (*p == ',')
			*p = '_';
	char *fargv[] = { argv[0], "-o", opts, NULL };
	struct fuse_args args = FUSE_ARGS_INIT(3, fargv);
	fuse_set_log_func(keep_fuse_log);
	struct fuse_session *se = fuse_session_new(&args, &sv_fs_ops, sizeof(sv_fs_ops), &fs);
	fuse_opt_free_args(&args);
	int status = EXIT_OK;
	if (!se) {
		status = die(EXIT_MOUNT, "cannot create the FUSE session (%s): check libfuse3", fuse_said);
		goto out;
	}
	if (fuse_set_signal_handlers(se) < 0) {
		status = die(EXIT_MOUNT, "cannot install signal handlers");
		goto out_session;
	}
	if (fuse_session_mount(se, mountpoint) < 0) {
		status = die(EXIT_MOUNT, "cannot mount on %s (%s): it must be an empty directory, /dev/fuse must exist%s",
			     mountpoint, fuse_said, allow_other ? ", and --allow-other needs user_allow_other in /etc/fuse.conf" : "");
		goto out_signals;
	}
	fuse_set_log_func(NULL);
	/* Detach after the mount (its failure is still our exit code), before any thread. */
	if (fuse_daemonize(foreground) < 0) {
		status = die(EXIT_MOUNT, "cannot detach: run with --foreground");
		goto out_unmount;
	}
	if (ready_fd >= 0) {
		dprintf(ready_fd, "ready %" PRIu64 " %" PRIu32 "\n", g.size, g.sector_size);
		close(ready_fd);
	}
	struct fuse_loop_config *lc = fuse_loop_cfg_create();
	if (!lc) {
		status = die(EXIT_LOOP, "out of memory starting the request loop");
		goto out_unmount;
	}
	fuse_loop_cfg_set_max_threads(lc, (unsigned)threads);
	fuse_loop_cfg_set_idle_threads(lc, (unsigned)(threads / 2 ? threads / 2 : 1));
	fuse_loop_cfg_set_clone_fd(lc, 0);
	/* A signal ends the loop with 0 or the signal's number; only a negative value is a
	 * failure of the loop itself. */
	if (fuse_session_loop_mt(se, lc) < 0)
		status = die(EXIT_LOOP, "the FUSE request loop failed: unmount %s (fusermount3 -u) and start again", mountpoint);
	fuse_loop_cfg_destroy(lc);
out_unmount:
	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
out_session:
	fuse_session_destroy(se);
out:
	vio_close(vio);
	pthread_mutex_destroy(&fs.lock);
	close(fd);
	return status;
}
