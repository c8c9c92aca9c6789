/* Key versions: a managed key's id, version and material, in one locked slot. */
#include "internal.h"

int srcf_key_new(srcf_key **key, const uint8_t key_id[SRCF_ID_SIZE], uint32_t version,
                 const uint8_t material[SRCF_KEY_SIZE]) {
    if (key == NULL || key_id == NULL || material == NULL || version == 0) return SRCF_E_ARGUMENT;
    _Static_assert(sizeof(struct srcf_key) <= SECMEM_USABLE, "a key version fits one secure slot");
    struct srcf_key *k = srcf_secure_alloc();
    if (k == NULL) return SRCF_E_MLOCK;
    memcpy(k->material, material, SRCF_KEY_SIZE);
    memcpy(k->key_id, key_id, SRCF_ID_SIZE);
    k->version = version;
    *key = k;
    return SRCF_OK;
}

void srcf_key_free(srcf_key *key) { srcf_secure_free(key); }
