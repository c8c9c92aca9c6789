/* Locked, non-dumpable memory for key material.
 *
 * Key versions and file keys are small (32 bytes plus a little), and a FUSE daemon may
 * hold thousands of open files: one page per key would exhaust RLIMIT_MEMLOCK of an
 * unprivileged process quickly. So arenas of locked pages are cut into 64-byte slots
 * (64 per 4 KiB page). Every arena is mmap()ed privately, mlock()ed (never swapped),
 * madvise()d MADV_DONTDUMP (never in a core dump) and MADV_WIPEONFORK (a forked child
 * sees zeros; best effort: Linux >= 4.14). Each slot ends in a 4-byte marker, so code
 * in a forked child can tell a wiped key from a key and refuse (SRCF_E_FORKED) instead
 * of encrypting under zeros. A freed slot is wiped with OPENSSL_cleanse;
 * an arena whose slots are all free is unmapped, except the first (so a process that
 * opens and closes one file repeatedly does not mmap/munmap each time).
 *
 * Allocation happens per open file, never per I/O: one process-wide mutex is enough.
 *
 * Secrets larger than a slot (strongroom-volume's passphrase and volume key) get
 * mappings of their own with the same protections (srcf_secure_map).
 *
 * mlock by its system call: AddressSanitizer's interceptor makes mlock() a no-op, and
 * the sanitizer builds of the daemons must hold their keys as the release builds do.
 */
#include "internal.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARENA_BYTES 4096u
#define ARENA_SLOTS (ARENA_BYTES / SECMEM_SLOT)   /* 64: one bitmap word */

struct arena {
    uint8_t *base;        /* ARENA_BYTES, page aligned (a page is >= 4 KiB) */
    size_t mapped;        /* bytes mapped (one page, possibly larger than ARENA_BYTES) */
    uint64_t used;        /* bit i: slot i in use */
    struct arena *next;
};

static const uint8_t LIVE[4] = {'l', 'i', 'v', 'e'};

static pthread_mutex_t arenas_lock = PTHREAD_MUTEX_INITIALIZER;
static struct arena *arenas;
static int atfork_registered;

/* fork(): a child inherits the arenas wiped (MADV_WIPEONFORK) and unlocked (mlock is not
 * inherited), so it forgets them and maps fresh locked arenas for whatever keys it makes
 * itself; the lock is held across fork so the child never inherits it taken. */
static void before_fork(void) { pthread_mutex_lock(&arenas_lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&arenas_lock); }
static void after_fork_child(void) {
    pthread_mutex_init(&arenas_lock, NULL);
    arenas = NULL;   /* the inherited mappings stay (wiped): a page or two per fork */
}

/* `len` bytes (whole pages), private, zeroed, never dumped, wiped in a forked child,
 * locked; NULL with errno set. */
static void *map_locked(size_t len) {
    void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        errno = ENOMEM;
        return NULL;
    }
    int err = 0;
    if (madvise(base, len, MADV_DONTDUMP) != 0) err = errno;
#ifdef MADV_WIPEONFORK
    if (err == 0 && madvise(base, len, MADV_WIPEONFORK) != 0 && errno != EINVAL) err = errno;
#endif
    if (err == 0 && syscall(SYS_mlock, base, len) != 0) err = errno;
    if (err != 0) {
        munmap(base, len);
        errno = err;
        return NULL;
    }
    return base;
}

static void unmap_locked(void *base, size_t len) {
    (void)syscall(SYS_munlock, base, len);
    munmap(base, len);
}

static size_t page_round(size_t len) {
    long page = sysconf(_SC_PAGESIZE);
    size_t p = page > 0 ? (size_t)page : ARENA_BYTES;
    return len == 0 ? p : (len + p - 1) / p * p;
}

static struct arena *arena_new(void) {
    size_t mapped = page_round(ARENA_BYTES);
    struct arena *a = calloc(1, sizeof *a);
    if (a == NULL) return NULL;
    void *base = map_locked(mapped);
    if (base == NULL) {
        int err = errno;
        free(a);
        errno = err;
        return NULL;
    }
    a->base = base;
    a->mapped = mapped;
    return a;
}

void *srcf_secure_map(size_t len) {
    if (len > SIZE_MAX / 2) {
        errno = ENOMEM;
        return NULL;
    }
    return map_locked(page_round(len));
}

void srcf_secure_unmap(void *p, size_t len) {
    if (p == NULL) return;
    OPENSSL_cleanse(p, page_round(len));
    unmap_locked(p, page_round(len));
}

void *srcf_secure_alloc(void) {
    void *slot = NULL;
    pthread_mutex_lock(&arenas_lock);
    if (!atfork_registered && pthread_atfork(before_fork, after_fork_parent, after_fork_child) == 0)
        atfork_registered = 1;
    struct arena *a = arenas;
    while (a != NULL && a->used == UINT64_MAX) a = a->next;
    if (a == NULL) {
        a = arena_new();
        if (a != NULL) {
            a->next = arenas;
            arenas = a;
        }
    }
    if (a != NULL) {
        int i = __builtin_ctzll(~a->used);
        a->used |= UINT64_C(1) << i;
        slot = a->base + (size_t)i * SECMEM_SLOT;
        memset(slot, 0, SECMEM_USABLE);
        memcpy((uint8_t *)slot + SECMEM_USABLE, LIVE, sizeof LIVE);
    }
    pthread_mutex_unlock(&arenas_lock);
    return slot;
}

void srcf_secure_free(void *slot) {
    if (slot == NULL) return;
    OPENSSL_cleanse(slot, SECMEM_SLOT);
    pthread_mutex_lock(&arenas_lock);
    struct arena **link = &arenas;
    for (struct arena *a = arenas; a != NULL; link = &a->next, a = a->next) {
        uint8_t *p = slot;
        if (p < a->base || p >= a->base + ARENA_BYTES) continue;
        a->used &= ~(UINT64_C(1) << ((size_t)(p - a->base) / SECMEM_SLOT));
        if (a->used == 0 && !(a == arenas && a->next == NULL)) {
            *link = a->next;
            unmap_locked(a->base, a->mapped);
            free(a);
        }
        break;
    }
    pthread_mutex_unlock(&arenas_lock);
}

int srcf_secure_live(const void *slot) {
    return slot != NULL && memcmp((const uint8_t *)slot + SECMEM_USABLE, LIVE, sizeof LIVE) == 0;
}
