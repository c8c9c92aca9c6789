/* The key store: every key version the control plane sent, held once as a libsrcf key
 * (srcf_key_new: a slot of libsrcf's locked, MADV_DONTDUMP, MADV_WIPEONFORK arenas,
 * src/secmem.c) and lent by reference to the calls that need it: an open unwraps its
 * file key, a create or re-key wraps a new one. No copy of the material exists outside
 * that slot (the SET_KEY frame that carried it is wiped by the reader).
 *
 * A drop or wipe takes the version out of the table at once, so nothing borrows it
 * again, then waits until the calls that borrowed it have returned it (one unwrap or
 * wrap: microseconds) and frees the slot, which wipes it: when DROP_KEY is answered or
 * a shutdown has wiped, the key is gone from the process. */
#ifndef _GNU_SOURCE /* libsrcf's C tests build this file with -D_GNU_SOURCE */
#define _GNU_SOURCE
#endif
#include "keystore.h"

#include "secmem.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

struct held {
	srcf_key *key;      /* NULL: a free entry */
	uint8_t id[16];
	uint32_t version;
	uint32_t borrowers; /* calls holding `key` now */
	int gone;           /* dropped: wiped as soon as borrowers reaches 0 */
};

static struct held table[SR_KEYS_MAX];
static uint8_t active_id[16];
static uint32_t active_version; /* 0: none */
static pthread_mutex_t keys_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t keys_returned = PTHREAD_COND_INITIALIZER;

int sr_keystore_init(void)
{
	/* One slot taken and given back maps, locks and keeps libsrcf's first arena: the
	 * memory every key version will live in is proven lockable before the mount. */
	void *probe = srcf_secure_alloc();
	if (!probe)
		return -(errno ? errno : ENOMEM);
	srcf_secure_free(probe);
	return 0;
}

/* Under keys_lock, `h` marked gone: wait for its borrowers, then wipe and free it. */
static void erase_locked(struct held *h)
{
	while (h->gone && h->borrowers)
		pthread_cond_wait(&keys_returned, &keys_lock);
	if (!h->gone)
		return; /* another eraser finished it (and the entry may hold a new key) */
	if (active_version == h->version && !memcmp(active_id, h->id, 16))
		active_version = 0; /* no new file under a dropped key */
	srcf_key_free(h->key);
	memset(h, 0, sizeof(*h));
}

static struct held *find_locked(const uint8_t id[16], uint32_t version)
{
	for (int i = 0; i < SR_KEYS_MAX; i++) {
		struct held *h = &table[i];
		if (h->key && !h->gone && h->version == version && !memcmp(h->id, id, 16))
			return h;
	}
	return NULL;
}

int sr_key_set(const uint8_t id[16], uint32_t version, const uint8_t material[32])
{
	srcf_key *key;
	int rc = srcf_key_new(&key, id, version, material);
	if (rc != SRCF_OK)
		return rc == SRCF_E_ARGUMENT ? -EINVAL : -ENOMEM;
	pthread_mutex_lock(&keys_lock);
	struct held *h = find_locked(id, version);
	int was_active = h && active_version == version && !memcmp(active_id, id, 16);
	if (h) {
		h->gone = 1; /* replaced: the old material is wiped, the entry reused */
		erase_locked(h);
	}
	for (int i = 0; i < SR_KEYS_MAX && !h; i++)
		if (!table[i].key)
			h = &table[i];
	if (!h) {
		pthread_mutex_unlock(&keys_lock);
		srcf_key_free(key);
		return -ENOSPC;
	}
	h->key = key;
	memcpy(h->id, id, 16);
	h->version = version;
	if (was_active)
		active_version = version; /* replacing the active version keeps it active */
	pthread_mutex_unlock(&keys_lock);
	return 0;
}

int sr_key_drop(const uint8_t id[16], uint32_t version)
{
	int found = 0;
	pthread_mutex_lock(&keys_lock);
	for (int i = 0; i < SR_KEYS_MAX; i++) {
		struct held *h = &table[i];
		if (h->key && !h->gone && !memcmp(h->id, id, 16) && (version == 0 || h->version == version)) {
			h->gone = 1;
			found = 1;
		}
	}
	for (int i = 0; i < SR_KEYS_MAX; i++)
		if (table[i].gone)
			erase_locked(&table[i]);
	pthread_mutex_unlock(&keys_lock);
	return found ? 0 : -ENOKEY;
}

int sr_key_activate(const uint8_t id[16], uint32_t version)
{
	pthread_mutex_lock(&keys_lock);
	int held = find_locked(id, version) != NULL;
	if (held) {
		memcpy(active_id, id, 16);
		active_version = version;
	}
	pthread_mutex_unlock(&keys_lock);
	return held ? 0 : -ENOKEY;
}

uint32_t sr_keys_count(void)
{
	uint32_t n = 0;
	pthread_mutex_lock(&keys_lock);
	for (int i = 0; i < SR_KEYS_MAX; i++)
		n += table[i].key && !table[i].gone;
	pthread_mutex_unlock(&keys_lock);
	return n;
}

void sr_keys_wipe(void)
{
	pthread_mutex_lock(&keys_lock);
	active_version = 0;
	for (int i = 0; i < SR_KEYS_MAX; i++)
		if (table[i].key)
			table[i].gone = 1;
	for (int i = 0; i < SR_KEYS_MAX; i++)
		if (table[i].gone)
			erase_locked(&table[i]);
	explicit_bzero(active_id, sizeof(active_id));
	pthread_mutex_unlock(&keys_lock);
}

int sr_key_borrow(const uint8_t id[16], uint32_t version, const srcf_key **key)
{
	pthread_mutex_lock(&keys_lock);
	struct held *h = find_locked(id, version);
	if (h) {
		h->borrowers++;
		*key = h->key;
	}
	pthread_mutex_unlock(&keys_lock);
	return h ? 0 : -ENOKEY;
}

int sr_key_borrow_active(const srcf_key **key)
{
	pthread_mutex_lock(&keys_lock);
	struct held *h = active_version ? find_locked(active_id, active_version) : NULL;
	if (h) {
		h->borrowers++;
		*key = h->key;
	}
	pthread_mutex_unlock(&keys_lock);
	return h ? 0 : -ENOKEY;
}

void sr_key_return(const srcf_key *key)
{
	if (!key)
		return;
	pthread_mutex_lock(&keys_lock);
	for (int i = 0; i < SR_KEYS_MAX; i++) {
		struct held *h = &table[i];
		if (h->key == key && h->borrowers) {
			if (--h->borrowers == 0 && h->gone)
				pthread_cond_broadcast(&keys_returned);
			break;
		}
	}
	pthread_mutex_unlock(&keys_lock);
}
