/* The C tests of strongroom-fuse's key store (fuse/keystore.c): each key version is
 * held once, in libsrcf's locked slots, and lent by reference; a drop waits for the
 * calls that borrowed the version, then wipes the only copy. Run by `make check` and,
 * under ASan + UBSan, `make check-asan` (after libsrcf's tests). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "keystore.h"

static int passed, failed;

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        if (cond) passed++;                                                                 \
        else { failed++; fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); } \
    } while (0)

static const uint8_t ID[16] = "key-id-16-bytes";
static const uint8_t OTHER[16] = "another-key-id!";

static void material(uint8_t out[32], uint8_t seed) {
    for (int i = 0; i < 32; i++) out[i] = (uint8_t)(seed + i * 7 + 1);
}

static int all_zero(const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

/* The store's key is the material itself, in a live locked slot: the one copy. */
static void test_held_once_and_lent(void) {
    uint8_t m[32];
    material(m, 1);
    CHECK(sr_key_set(ID, 1, m) == 0);
    CHECK(sr_keys_count() == 1);
    const srcf_key *a = NULL, *b = NULL;
    CHECK(sr_key_borrow(ID, 1, &a) == 0);
    CHECK(sr_key_borrow(ID, 1, &b) == 0);
    CHECK(a != NULL && a == b); /* by reference: both borrowers see one object */
    CHECK(a != NULL && memcmp(a->material, m, 32) == 0 && a->version == 1 && srcf_secure_live(a));
    const srcf_key *none = NULL;
    CHECK(sr_key_borrow(ID, 2, &none) == -ENOKEY && none == NULL);
    CHECK(sr_key_borrow(OTHER, 1, &none) == -ENOKEY);
    CHECK(sr_key_borrow_active(&none) == -ENOKEY); /* no SET_ACTIVE yet */
    CHECK(sr_key_activate(ID, 2) == -ENOKEY);
    CHECK(sr_key_activate(ID, 1) == 0);
    const srcf_key *act = NULL;
    CHECK(sr_key_borrow_active(&act) == 0 && act == a);
    sr_key_return(act);
    sr_key_return(b);
    sr_key_return(a);
    CHECK(sr_key_set(ID, 0, m) == -EINVAL);
    /* a second SET_KEY of one version replaces the material and stays active */
    uint8_t m2[32];
    material(m2, 9);
    CHECK(sr_key_set(ID, 1, m2) == 0);
    CHECK(sr_keys_count() == 1);
    CHECK(sr_key_borrow_active(&act) == 0 && act != NULL && memcmp(act->material, m2, 32) == 0);
    sr_key_return(act);
    CHECK(sr_key_drop(ID, 1) == 0);
    CHECK(sr_key_drop(ID, 1) == -ENOKEY);
    CHECK(sr_key_borrow_active(&act) == -ENOKEY); /* the active version went with it */
    CHECK(sr_keys_count() == 0);
}

struct dropper { int returned; int rc; };

static void *drop_main(void *arg) {
    struct dropper *d = arg;
    d->rc = sr_key_drop(ID, 0);
    __atomic_store_n(&d->returned, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* DROP_KEY answers only once the only copy is wiped: it waits for a borrower, which
 * meanwhile keeps a whole key; nobody borrows the dropped version again. */
static void test_drop_waits_then_wipes(void) {
    uint8_t m[32];
    material(m, 3);
    CHECK(sr_key_set(ID, 5, m) == 0);
    CHECK(sr_key_set(ID, 6, m) == 0);
    const srcf_key *k = NULL;
    CHECK(sr_key_borrow(ID, 5, &k) == 0 && k != NULL);
    if (k == NULL) return;
    struct dropper d = { 0, 1 };
    pthread_t t;
    CHECK(pthread_create(&t, NULL, drop_main, &d) == 0);
    usleep(100 * 1000);
    CHECK(!__atomic_load_n(&d.returned, __ATOMIC_SEQ_CST));
    const srcf_key *again = NULL;
    CHECK(sr_key_borrow(ID, 5, &again) == -ENOKEY); /* out of the table already */
    CHECK(sr_keys_count() == 0);
    CHECK(memcmp(k->material, m, 32) == 0); /* the borrower's key is whole meanwhile */
    const void *slot = k;
    sr_key_return(k);
    pthread_join(t, NULL);
    CHECK(d.returned && d.rc == 0);
    /* The slot is libsrcf's (its first arena stays mapped): wiped, marker and all. */
    CHECK(all_zero(slot, SECMEM_SLOT));
}

static void test_capacity_and_wipe(void) {
    uint8_t m[32];
    material(m, 5);
    for (uint32_t v = 1; v <= SR_KEYS_MAX; v++) CHECK(sr_key_set(OTHER, v, m) == 0);
    CHECK(sr_key_set(OTHER, SR_KEYS_MAX + 1, m) == -ENOSPC);
    CHECK(sr_keys_count() == SR_KEYS_MAX);
    CHECK(sr_key_activate(OTHER, 7) == 0);
    const srcf_key *k = NULL;
    CHECK(sr_key_borrow(OTHER, 3, &k) == 0);
    const void *slot = k;
    sr_key_return(k);
    sr_keys_wipe();
    CHECK(sr_keys_count() == 0);
    CHECK(sr_key_borrow(OTHER, 3, &k) == -ENOKEY);
    CHECK(sr_key_borrow_active(&k) == -ENOKEY);
    CHECK(all_zero(slot, SECMEM_SLOT));
    CHECK(sr_key_set(OTHER, 1, m) == 0); /* the store works after a wipe */
    sr_keys_wipe();
}

int main(void) {
    CHECK(sr_keystore_init() == 0);
    test_held_once_and_lent();
    test_drop_waits_then_wipes();
    test_capacity_and_wipe();
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
