/* Locked, non-dumpable memory for key material: the one allocator of the C tree.
 *
 * libsrcf keeps key versions and file keys here, and the two daemons that compile
 * libsrcf in use it too (strongroom-fuse's key store holds libsrcf key versions,
 * strongroom-volume its passphrase and volume key). Not part of libsrcf's API: nothing
 * here is exported from libsrcf.so (hidden visibility). */
#ifndef SRCF_SECMEM_H
#define SRCF_SECMEM_H

#include <stddef.h>

#define SECMEM_SLOT 64u
#define SECMEM_USABLE 60u     /* the last 4 bytes of a slot mark it live */

/* A zeroed slot of SECMEM_USABLE bytes in locked, non-dumpable memory, or NULL
 * (errno ENOMEM or the mlock/madvise error). */
void *srcf_secure_alloc(void);
/* Wipe (OPENSSL_cleanse) and release a slot (NULL is a no-op). */
void srcf_secure_free(void *slot);
/* False in a forked child, where MADV_WIPEONFORK zeroed the slot (marker included). */
int srcf_secure_live(const void *slot);

/* For secrets larger than a slot: `len` bytes (rounded up to whole pages) of zeroed,
 * locked, non-dumpable, wiped-on-fork memory of their own, or NULL (errno set). Give
 * the same `len` back to srcf_secure_unmap, which wipes, unlocks and unmaps (NULL is a
 * no-op). */
void *srcf_secure_map(size_t len);
void srcf_secure_unmap(void *p, size_t len);

#endif
