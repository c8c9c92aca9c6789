/* Logging (stderr, one line per problem, never key bytes) and locked memory. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
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
