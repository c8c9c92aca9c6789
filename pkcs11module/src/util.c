/* Logging (stderr, one line per problem, never key bytes) and locked memory. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "module.h"

void sr_log(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "strongroom-pkcs11: %s\n", buf);
}

void sr_pad(unsigned char *dst, size_t n, const char *src)
{
    size_t l = src ? strlen(src) : 0;
    memset(dst, ' ', n);
    memcpy(dst, src, l < n ? l : n);
}

/* Each secret gets whole pages of its own: mmap'd, mlock'd (best effort: a process
 * without RLIMIT_MEMLOCK room still works, but the pages may be swapped), excluded from
 * core dumps and wiped in a forked child. */
static size_t round_pages(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* STRONGROOM_PKCS11_SECURE_HEAP=<bytes, a power of two>: the operator's opt-in to
 * OpenSSL's secure heap, initialized here unless the host did it already. OpenSSL then
 * keeps the private key of the client key file (its BIGNUMs) in that locked arena.
 * Not by default: the arena is one per process, fixed in size and shared with the
 * host's own OpenSSL use (a full arena makes the host's key loads fail, and the host's
 * own CRYPTO_secure_malloc_init fails once it exists): README "Limits". */
int sr_secure_heap_setup(void)
{
    const char *v = getenv("STRONGROOM_PKCS11_SECURE_HEAP");
    if (v == NULL || *v == '\0')
        return 0;
    char *end = NULL;
    unsigned long long n = strtoull(v, &end, 10);
    if (*end != '\0' || n < 4096 || n > (1ull << 30) || (n & (n - 1)) != 0) {
        sr_log("STRONGROOM_PKCS11_SECURE_HEAP='%.40s': give a power of two from 4096 to 1073741824 "
               "(bytes)", v);
        return -1;
    }
    if (CRYPTO_secure_malloc_initialized())
        return 0;   /* the host's: OpenSSL uses it already */
    int r = CRYPTO_secure_malloc_init((size_t)n, 32);
    if (r == 0)
        sr_log("STRONGROOM_PKCS11_SECURE_HEAP: OpenSSL's secure heap could not be set up; "
               "the client key stays in the ordinary heap");
    else if (r == 2)
        sr_log("STRONGROOM_PKCS11_SECURE_HEAP: the secure heap is not locked in memory "
               "(RLIMIT_MEMLOCK); it may be swapped");
    return 0;
}

void *sr_secure_alloc(size_t n)
{
    if (n == 0)
        n = 1;
    size_t len = round_pages(n);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    (void)mlock(p, len);
    (void)madvise(p, len, MADV_DONTDUMP);
#ifdef MADV_WIPEONFORK
    (void)madvise(p, len, MADV_WIPEONFORK);
#endif
    return p;
}

void sr_secure_free(void *p, size_t n)
{
    if (p == NULL)
        return;
    if (n == 0)
        n = 1;
    size_t len = round_pages(n);
    OPENSSL_cleanse(p, len);
    (void)munlock(p, len);
    munmap(p, len);
}
