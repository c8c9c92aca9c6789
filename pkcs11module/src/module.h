/* Shared state of the module: slots (one per configured identity), sessions, objects. */
#ifndef SR_MODULE_H
#define SR_MODULE_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <openssl/ssl.h>

#include "config.h"
#include "kmip.h"
#include "sr_pkcs11.h"

#define POOL_MAX 8

typedef struct {
    slot_conf conf;
    char label[33];          /* token label, space-padded when reported */
    char serial[17];         /* 16 hex digits of the certificate's SHA-256 */
    int login_required;      /* the key file is an encrypted PEM */
    int logged_in;
    SSL_CTX *ctx;            /* NULL until the key is loaded (at once, or at C_Login) */
    pthread_mutex_t lock;    /* ctx, pool, logged_in */
    SSL *pool[POOL_MAX];
    int npool;
    pid_t pool_pid;          /* the process the pooled connections belong to */
} sr_slot;

/* One object as the module shows it. Handles are stable for the life of the module:
 * an object keeps its handle across refreshes. */
typedef struct sr_object {
    CK_OBJECT_HANDLE handle;
    CK_SLOT_ID slot;
    CK_OBJECT_CLASS cls;
    CK_KEY_TYPE key_type;
    kattrs a;
    int present;             /* seen by the last refresh, not destroyed */
    int current;             /* newest version of its key (or not a versioned object) */
    CK_SESSION_HANDLE owner; /* a session object (CKA_TOKEN false): its session; else 0 */
    time_t fetched;          /* when its attributes were read (0: never) */
    unsigned long gen;       /* g.obj_gen when last added or read */
    int destroyed;           /* destroyed through this module: never shown again */
    /* public-key details, fetched on demand (Get of the public key) */
    int pub_loaded;
    unsigned char *modulus, *exponent, *ec_params, *ec_point;
    CK_ULONG modulus_len, exponent_len, ec_params_len, ec_point_len;
    struct sr_object *next;
} sr_object;

typedef enum { OP_NONE = 0, OPK_ENCRYPT, OPK_DECRYPT, OPK_SIGN, OPK_VERIFY } op_kind;

typedef struct {
    op_kind kind;
    CK_MECHANISM_TYPE mech;
    CK_OBJECT_HANDLE key;
    unsigned char iv[16];
    unsigned char *aad;
    CK_ULONG aad_len;
    CK_ULONG iv_len;
    CK_ULONG tag_bytes;
    CK_MECHANISM_TYPE oaep_hash;
    uint32_t hash;           /* KMIP Hashing Algorithm of a pre-hashed signature */
    /* buffered input (multi-part), in locked memory */
    unsigned char *in;
    size_t in_len, in_cap;
    int multipart;
    /* a computed result not yet delivered (buffer too small) */
    unsigned char *out;
    size_t out_len, out_cap;
    int have_out;
} sr_op;

typedef struct sr_session {
    CK_SESSION_HANDLE handle;
    CK_SLOT_ID slot;
    CK_FLAGS flags;
    pthread_mutex_t lock;
    int refs, closed;        /* under g.lock: users in flight; unlinked by C_CloseSession */
    sr_op op;
    /* a digest (p11_digest.c): computed here, no key involved */
    EVP_MD_CTX *digest;
    int digest_multipart;
    /* find */
    int finding;
    CK_OBJECT_HANDLE *found;
    CK_ULONG nfound, found_pos;
    struct sr_session *next;
} sr_session;

typedef struct {
    int initialized;
    module_conf conf;
    sr_slot slots[CONF_MAX_SLOTS];
    int nslots;
    pthread_mutex_t lock;    /* sessions and objects lists, handle counters */
    sr_session *sessions;
    sr_object *objects;
    CK_ULONG next_session, next_object;
    unsigned long obj_gen;   /* bumped by every object_add */
} sr_module;

extern sr_module g;

/* ---- util.c */
void sr_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void sr_pad(unsigned char *dst, size_t n, const char *src);
/* locked, non-dumpable memory for key material and plaintext (wiped on free) */
void *sr_secure_alloc(size_t n);
void sr_secure_free(void *p, size_t n);
/* OpenSSL's secure heap when STRONGROOM_PKCS11_SECURE_HEAP asks for it; -1: a bad value */
int sr_secure_heap_setup(void);

/* ---- conn.c */
CK_RV slot_setup(sr_slot *s);                 /* reads the cert, label, serial, ctx if possible */
CK_RV slot_login(sr_slot *s, const unsigned char *pin, size_t pinlen);
void slot_logout(sr_slot *s);
void slot_teardown(sr_slot *s);
/* Sends a request of n batch items; on CKR_OK `out` holds the parsed response (free
 * with kresponse_free). Transport and framing errors are reported on stderr. */
CK_RV kmip_call(sr_slot *s, int n, const uint32_t *ops, const tbuf *payloads, kresponse *out);
/* One operation: payload in, response out; a failed item is mapped to a CK_RV
 * (for_key_use selects the key-flavoured codes) and *item points to the item. */
CK_RV kmip_one(sr_slot *s, uint32_t op, const tbuf *payload, kresponse *out, int for_key_use);

/* ---- objects.c */
CK_RV objects_refresh(CK_SLOT_ID slot);
sr_object *object_get(CK_SLOT_ID slot, CK_OBJECT_HANDLE h);   /* under g.lock */
CK_RV object_load_public(sr_slot *s, sr_object *o);          /* fills modulus etc. */
/* ---- attributes.c */
int attr_needs_public(CK_ATTRIBUTE_TYPE t);      /* an attribute read from the public key */
int object_matches(const sr_object *o, const CK_ATTRIBUTE *tpl, CK_ULONG n);   /* under g.lock */
sr_object *object_add(CK_SLOT_ID slot, const kattrs *a);      /* under g.lock */
CK_RV object_destroy_remote(CK_SLOT_ID slot, sr_object *o);   /* Revoke + Destroy */
/* Destroys the session objects of `owner` (0: of every session) at the server. */
void objects_drop_session(CK_SLOT_ID slot, CK_SESSION_HANDLE owner);

/* ---- crypto_ops.c */
/* room for the rest of a request around its data */
#define SR_MAX_INPUT (KMIP_MAX_MESSAGE - 8192)
int mech_supported(CK_MECHANISM_TYPE t);      /* p11_general.c's mechanism table */
CK_RV crypto_op_init(CK_SESSION_HANDLE h, CK_MECHANISM_PTR m, CK_OBJECT_HANDLE key, op_kind kind);
/* the output length for `in` input bytes (an upper bound for CBC decryption) */
CK_RV crypto_estimate(sr_session *s, size_t in, size_t *out);
/* runs the session's operation at the server; encrypt/decrypt/sign results in op.out */
CK_RV crypto_run(sr_session *s, const uint8_t *in, size_t inlen, const uint8_t *sig, size_t siglen);

/* ---- session helpers (p11_general.c) */
sr_session *session_get(CK_SESSION_HANDLE h);   /* returns it locked, or NULL */
void session_put(sr_session *s);
void op_reset(sr_op *op);
/* ---- p11_digest.c */
void digest_reset(sr_session *s);

#endif
