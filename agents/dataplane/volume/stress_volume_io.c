/* Threads on the I/O core (volume_io.c) at once, where the kernel would serialise them:
 * through a FUSE mount, writes to one file hold its inode lock, so only this program
 * makes the stripe locks matter.
 *
 * The segment is cut into 29-byte slots, so a sector holds slots of every writer. Each
 * of WRITERS threads owns the slots i with i % (WRITERS + 1) == its number and rewrites
 * random runs of its own slots with a fresh value again and again, remembering the last
 * value per slot; the remaining slots ("frozen") are never written. READERS threads read
 * random ranges meanwhile: a frozen byte must always read as it began (a torn sector
 * decrypts to noise, frozen bytes included). At the end every slot must hold its last
 * value: a read-modify-write that lost another writer's update shows here.
 *
 *   stress-volume-io [SECONDS]   exit 0, or a message and exit 1 */
#define _GNU_SOURCE
#include "volume_io.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define WRITERS 6
#define READERS 2
#define SLOT 29
#define SEGMENT (256u << 10)
#define SLOTS (SEGMENT / SLOT)
/* slot i is never written (the bytes after the last whole slot neither) */
#define FROZEN(i) ((i) >= SLOTS || (i) % (WRITERS + 1) == WRITERS)

static struct vio *v;
static uint32_t sector_size;
static unsigned char last[SLOTS];     /* each slot's last value, written by its owner only */
static atomic_int stop, failed;
static double seconds = 2.0;

static void fail(const char *what)
{
	if (!atomic_exchange(&failed, 1))
		fprintf(stderr, "stress-volume-io: %s (sector size %u)\n", what, sector_size);
	atomic_store(&stop, 1);
}

static unsigned char frozen_byte(size_t at)
{
	return (unsigned char)(at * 131 + 17);
}

static uint64_t next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void *writer(void *arg)
{
	int me = (int)(intptr_t)arg;
	uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(me + 1);
	unsigned char *buf = malloc(64 * SLOT);
	unsigned char value = 1;
	while (!atomic_load(&stop) && buf) {
		/* 1 to 8 of our own slots, one call each: every call is a partial-sector
		 * read-modify-write next to other writers' slots */
		size_t first = (size_t)(next(&rng) % (SLOTS / (WRITERS + 1))) * (WRITERS + 1) + (size_t)me;
		int run = 1 + (int)(next(&rng) % 8);
		for (int k = 0; k < run && first < SLOTS; k++, first += WRITERS + 1) {
			memset(buf, value, SLOT);
			if (vio_write(v, buf, SLOT, (uint64_t)first * SLOT) != SLOT) {
				fail("a write failed");
				break;
			}
			last[first] = value;
		}
		value = (unsigned char)(value % 250 + 1);
	}
	free(buf);
	return NULL;
}

static void *reader(void *arg)
{
	uint64_t rng = 0xdeadbeefcafef00dull * (uint64_t)((intptr_t)arg + 1);
	unsigned char *buf = malloc(SEGMENT);
	while (!atomic_load(&stop) && buf) {
		size_t off = (size_t)(next(&rng) % SEGMENT), len = 1 + (size_t)(next(&rng) % (3 * 4096));
		if (len > SEGMENT - off)
			len = SEGMENT - off;
		if (vio_read(v, buf, len, off) != (ssize_t)len) {
			fail("a read failed");
			break;
		}
		for (size_t i = 0; i < len; i++)
			if (FROZEN((off + i) / SLOT) && buf[i] != frozen_byte(off + i)) {
				fail("a byte nobody wrote changed: a torn sector was read");
				break;
			}
	}
	free(buf);
	return NULL;
}

static int run_once(uint32_t sector)
{
	static const unsigned char key[VIO_KEY_SIZE] = { 1, 2, 3, 4, 5, 6, 7, 8, [32] = 9, 10, 11, 12 };
	struct vio_geometry g = { .data_offset = 4096, .size = SEGMENT, .sector_size = sector, .iv_offset = 5 };
	sector_size = sector;
	int fd = memfd_create("stress-volume-io", MFD_CLOEXEC);
	unsigned char *plain = malloc(SEGMENT);
	if (fd < 0 || !plain || ftruncate(fd, 4096 + SEGMENT) < 0 || vio_open(&v, fd, &g, key) != 0) {
		fprintf(stderr, "stress-volume-io: set-up failed\n");
		return 1;
	}
	for (size_t i = 0; i < SEGMENT; i++)
		plain[i] = FROZEN(i / SLOT) ? frozen_byte(i) : 0;
	memset(last, 0, sizeof(last));
	if (vio_write(v, plain, SEGMENT, 0) != SEGMENT) {
		fprintf(stderr, "stress-volume-io: initial write failed\n");
		return 1;
	}
	atomic_store(&stop, 0);
	pthread_t t[WRITERS + READERS];
	for (int i = 0; i < WRITERS + READERS; i++)
		pthread_create(&t[i], NULL, i < WRITERS ? writer : reader, (void *)(intptr_t)i);
	struct timespec d = { (time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9) };
	nanosleep(&d, NULL);
	atomic_store(&stop, 1);
	for (int i = 0; i < WRITERS + READERS; i++)
		pthread_join(t[i], NULL);
	if (!atomic_load(&failed)) {
		if (vio_read(v, plain, SEGMENT, 0) != SEGMENT)
			fail("the final read failed");
		for (size_t i = 0; i < SEGMENT && !atomic_load(&failed); i++) {
			size_t slot = i / SLOT;
			unsigned char want = FROZEN(slot) ? frozen_byte(i) : last[slot];
			if (plain[i] != want)
				fail("an update was lost");
		}
	}
	vio_close(v);
	close(fd);
	free(plain);
	return atomic_load(&failed);
}

int main(int argc, char **argv)
{
	if (argc > 1)
		seconds = atof(argv[1]) / 2;
	if (run_once(512) || run_once(4096))
		return 1;
	printf("stress-volume-io: ok\n");
	return 0;
}
