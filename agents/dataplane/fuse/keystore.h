/* The daemon's key store (keystore.c): the key versions the control plane sent, each
 * held once, as a libsrcf key in libsrcf's locked, non-dumpable slots (src/secmem.c).
 * Opens, creates and re-keys borrow a version by reference for the length of one call;
 * nothing copies key bytes out. */
#ifndef SR_KEYSTORE_H
#define SR_KEYSTORE_H

#include <stdint.h>

#include "srcf.h"

/* Most versions held at once (SET_KEY beyond it: -ENOSPC). */
#define SR_KEYS_MAX 64

/* Before the first SET_KEY: 0, or -errno when locked memory cannot be had
 * (RLIMIT_MEMLOCK): the daemon then refuses to start rather than hold keys unlocked. */
int sr_keystore_init(void);
/* SET_KEY: hold `material` (a second SET_KEY of one version replaces it). 0, -ENOMEM,
 * -ENOSPC. The caller wipes its own buffer. */
int sr_key_set(const uint8_t id[16], uint32_t version, const uint8_t material[32]);
/* DROP_KEY (version 0: every version of `id`). The versions are wiped before this
 * returns (once calls borrowing them have returned them): 0 or -ENOKEY. */
int sr_key_drop(const uint8_t id[16], uint32_t version);
/* SET_ACTIVE: the version new files are written under; it must be held. 0 or -ENOKEY. */
int sr_key_activate(const uint8_t id[16], uint32_t version);
/* Versions held, for STATUS. */
uint32_t sr_keys_count(void);
/* Wipe every version and forget the active one (shutdown, end of the channel, exit). */
void sr_keys_wipe(void);

/* Borrow a held version: *key points at the store's only copy until sr_key_return,
 * which must follow within the same call (a drop or wipe waits for it). 0 or -ENOKEY. */
int sr_key_borrow(const uint8_t id[16], uint32_t version, const srcf_key **key);
/* The active version (SET_ACTIVE), borrowed the same way: 0, or -ENOKEY before one. */
int sr_key_borrow_active(const srcf_key **key);
void sr_key_return(const srcf_key *key);

#endif
