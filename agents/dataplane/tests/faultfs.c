/* faultfs.so: a test-only LD_PRELOAD shim that makes the Nth write, truncate, fallocate
 * or fsync of a backing file fail, so tests/agents/test_guardpoint_faults.py can walk a
 * workload through every backing write the data plane makes and check that the file
 * is left as it was each time. Never shipped: built by `make faultfs` for the tests.
 *
 *   SR_FAULT_DIR   only descriptors of files under this directory (a resolved path) count
 *   SR_FAULT_CTL   a file of at least 64 bytes, mapped shared: the test arms it and reads
 *                  the counters while the daemon runs (little-endian int64 slots):
 *     [0] countdown   > 0: each counted call takes one; the call that takes the last fails
 *     [1] errno       the error to inject (ENOSPC, EIO, EFBIG, ...)
 *     [2] calls       counted calls so far
 *     [3] ops         which calls count: 1 writes, 2 ftruncate, 4 fallocate, 8 fsync (0: all)
 *     [4] injected    failures injected so far
 *     [5] sticky      1: once tripped, every later counted call fails too (a full disk)
 *     [6] torn        1: a failing write of more than 512 bytes first writes half of them
 * errno 9999 is not an error: the process kills itself with SIGKILL at that call (after
 * the torn half, if asked), which is how a kill -9 at every step is reached. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

enum { C_COUNTDOWN, C_ERRNO, C_CALLS, C_OPS, C_INJECTED, C_STICKY, C_TORN };
enum { OP_WRITE = 1, OP_TRUNCATE = 2, OP_FALLOCATE = 4, OP_FSYNC = 8 };

static int64_t *ctl;
static const char *dir;
static size_t dir_len;

__attribute__((constructor)) static void faultfs_init(void)
{
	const char *path = getenv("SR_FAULT_CTL");
	dir = getenv("SR_FAULT_DIR");
	if (!path || !dir)
		return;
	dir_len = strlen(dir);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return;
	void *p = mmap(NULL, 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p != MAP_FAILED)
		ctl = p;
}

static int under_dir(int fd)
{
	char link[32], real[PATH_MAX];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, real, sizeof(real) - 1);
	if (n < 0)
		return 0;
	real[n] = '\0';
	return (size_t)n > dir_len && !strncmp(real, dir, dir_len) && real[dir_len] == '/';
}

/* 0: let the call through; else the errno it fails with. */
static int trip(int fd, int op)
{
	if (!ctl || !under_dir(fd))
		return 0;
	int64_t ops = __atomic_load_n(&ctl[C_OPS], __ATOMIC_SEQ_CST);
	if (ops && !(ops & op))
		return 0;
	__atomic_add_fetch(&ctl[C_CALLS], 1, __ATOMIC_SEQ_CST);
	int64_t left = __atomic_load_n(&ctl[C_COUNTDOWN], __ATOMIC_SEQ_CST);
	int fail = 0;
	while (left > 0) {
		if (__atomic_compare_exchange_n(&ctl[C_COUNTDOWN], &left, left - 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
			fail = left == 1;
			break;
		}
	}
	if (!fail && __atomic_load_n(&ctl[C_STICKY], __ATOMIC_SEQ_CST) == 2)
		fail = 1;
	if (!fail)
		return 0;
	if (__atomic_load_n(&ctl[C_STICKY], __ATOMIC_SEQ_CST) == 1)
		__atomic_store_n(&ctl[C_STICKY], 2, __ATOMIC_SEQ_CST); /* tripped: from now on, all */
	__atomic_add_fetch(&ctl[C_INJECTED], 1, __ATOMIC_SEQ_CST);
	return (int)__atomic_load_n(&ctl[C_ERRNO], __ATOMIC_SEQ_CST);
}

static int torn(void)
{
	return ctl && __atomic_load_n(&ctl[C_TORN], __ATOMIC_SEQ_CST);
}

#define REAL(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))
#define SR_FAULT_KILL 9999

static int fail(int e)
{
	if (e == SR_FAULT_KILL)
		raise(SIGKILL);
	errno = e;
	return -1;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	int e = trip(fd, OP_WRITE);
	if (e) {
		/* within one 512-byte sector a write is whole or not at all (the assumption
		 * FORMAT.md makes for the header): only longer writes are torn */
		if (torn() && n > 512)
			(void)REAL(pwrite)(fd, buf, n / 2, off);
		return fail(e);
	}
	return REAL(pwrite)(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
	return pwrite(fd, buf, n, off);
}

ssize_t write(int fd, const void *buf, size_t n)
{
	int e = trip(fd, OP_WRITE);
	if (e)
		return fail(e);
	return REAL(write)(fd, buf, n);
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
	int e = trip(fd, OP_WRITE);
	if (e)
		return fail(e);
	return REAL(pwritev)(fd, iov, cnt, off);
}

int ftruncate(int fd, off_t len)
{
	int e = trip(fd, OP_TRUNCATE);
	if (e)
		return fail(e);
	return REAL(ftruncate)(fd, len);
}

int ftruncate64(int fd, off_t len)
{
	return ftruncate(fd, len);
}

int fallocate(int fd, int mode, off_t off, off_t len)
{
	int e = trip(fd, OP_FALLOCATE);
	if (e)
		return fail(e);
	return REAL(fallocate)(fd, mode, off, len);
}

int fallocate64(int fd, int mode, off_t off, off_t len)
{
	return fallocate(fd, mode, off, len);
}

int fsync(int fd)
{
	int e = trip(fd, OP_FSYNC);
	if (e)
		return fail(e);
	return REAL(fsync)(fd);
}

int fdatasync(int fd)
{
	int e = trip(fd, OP_FSYNC);
	if (e)
		return fail(e);
	return REAL(fdatasync)(fd);
}
