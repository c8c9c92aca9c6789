/* Key generation (KMIP Create / CreateKeyPair), wrapping (KMIP Get with a Key Wrapping
 * Specification: the server wraps inside its HSM), random numbers (RNGRetrieve), and
 * the function list. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "module.h"

#define CHECK_INIT() do { if (!g.initialized) return CKR_CRYPTOKI_NOT_INITIALIZED; } while (0)

static const CK_ATTRIBUTE *find_attr(const CK_ATTRIBUTE *t, CK_ULONG n, CK_ATTRIBUTE_TYPE type)
{
    for (CK_ULONG i = 0; t && i < n; i++)
        if (t[i].type == type)
            return &t[i];
    return NULL;
}

/* -1 absent, 0 false, 1 true, -2 malformed */
static int attr_bool(const CK_ATTRIBUTE *t, CK_ULONG n, CK_ATTRIBUTE_TYPE type)
{
    const CK_ATTRIBUTE *a = find_attr(t, n, type);
    if (a == NULL)
        return -1;
    if (a->pValue == NULL || a->ulValueLen != sizeof(CK_BBOOL))
        return -2;
    return *(CK_BBOOL *)a->pValue ? 1 : 0;
}

static int attr_ulong(const CK_ATTRIBUTE *t, CK_ULONG n, CK_ATTRIBUTE_TYPE type, CK_ULONG *out)
{
    const CK_ATTRIBUTE *a = find_attr(t, n, type);
    if (a == NULL)
        return -1;
    if (a->pValue == NULL || a->ulValueLen != sizeof(CK_ULONG))
        return -2;
    *out = *(CK_ULONG *)a->pValue;
    return 0;
}

/* A label: 1-128 printable ASCII characters (Strongroom's name rule), or none. */
static CK_RV attr_label(const CK_ATTRIBUTE *t, CK_ULONG n, char *out, size_t cap)
{
    const CK_ATTRIBUTE *a = find_attr(t, n, CKA_LABEL);
    out[0] = '\0';
    if (a == NULL || a->ulValueLen == 0)
        return CKR_OK;   /* no label: the server names it kmip-<random> */
    if (a->ulValueLen >= cap || a->pValue == NULL)
        return CKR_ATTRIBUTE_VALUE_INVALID;
    const unsigned char *p = a->pValue;
    for (CK_ULONG i = 0; i < a->ulValueLen; i++)
        if (p[i] < 0x20 || p[i] > 0x7e)
            return CKR_ATTRIBUTE_VALUE_INVALID;
    memcpy(out, p, a->ulValueLen);
    out[a->ulValueLen] = '\0';
    return CKR_OK;
}

/* Attributes every key the module creates must accept as they are: sensitive, not
 * modifiable. CKA_TOKEN false (a session object, as Java's key generators ask) is a
 * key created at the server like any other and destroyed there when its session ends.
 * CKA_ID is the server's identifier: a requested one is ignored (see README). */
static CK_RV common_checks(const CK_ATTRIBUTE *t, CK_ULONG n, int secret_or_private)
{
    (void)secret_or_private;
    static const CK_ATTRIBUTE_TYPE bools[] = { CKA_TOKEN, CKA_SENSITIVE, CKA_MODIFIABLE,
        CKA_PRIVATE, CKA_EXTRACTABLE, CKA_ENCRYPT, CKA_DECRYPT, CKA_SIGN, CKA_VERIFY,
        CKA_WRAP, CKA_UNWRAP, CKA_DERIVE };
    for (size_t i = 0; i < sizeof(bools) / sizeof(bools[0]); i++)
        if (attr_bool(t, n, bools[i]) == -2)
            return CKR_ATTRIBUTE_VALUE_INVALID;
    /* CKA_SENSITIVE false (pkcs11-tool's default) is accepted and the key reported
     * sensitive: no key value ever leaves the server through this module. */
    if (find_attr(t, n, CKA_VALUE) != NULL)
        return CKR_ATTRIBUTE_READ_ONLY;
    return CKR_OK;
}

static void attr_enum(tbuf *p, const char *name, uint32_t v)
{
    tb_begin(p, T_ATTRIBUTE);
    tb_text(p, T_ATTRIBUTE_NAME, name, strlen(name));
    tb_enum(p, T_ATTRIBUTE_VALUE, v);
    tb_end(p);
}

static void attr_int(tbuf *p, const char *name, int32_t v)
{
    tb_begin(p, T_ATTRIBUTE);
    tb_text(p, T_ATTRIBUTE_NAME, name, strlen(name));
    tb_int(p, T_ATTRIBUTE_VALUE, v);
    tb_end(p);
}

static void attr_name(tbuf *p, const char *label)
{
    if (label[0] == '\0')
        return;
    tb_begin(p, T_ATTRIBUTE);
    tb_text(p, T_ATTRIBUTE_NAME, "Name", 4);
    tb_begin(p, T_ATTRIBUTE_VALUE);
    tb_text(p, T_NAME_VALUE, label, strlen(label));
    tb_enum(p, T_NAME_TYPE, 1);
    tb_end(p);
    tb_end(p);
}

static void attr_activation(tbuf *p)
{
    tb_begin(p, T_ATTRIBUTE);
    tb_text(p, T_ATTRIBUTE_NAME, "Activation Date", 15);
    tb_datetime(p, T_ATTRIBUTE_VALUE, (int64_t)time(NULL) - 1);
    tb_end(p);
}

/* GetAttributes of the new objects, added to the cache; their handles out. */
static CK_RV adopt(CK_SLOT_ID slot, int n, char uids[][KMIP_UID_MAX + 1], CK_OBJECT_HANDLE *out)
{
    tbuf pl[2];
    uint32_t ops[2] = { OP_GET_ATTRIBUTES, OP_GET_ATTRIBUTES };
    if (n < 1 || n > 2)
        return CKR_GENERAL_ERROR;
    memset(pl, 0, sizeof(pl));
    for (int i = 0; i < n; i++) {
        tb_init(&pl[i]);
        tb_begin(&pl[i], T_REQUEST_PAYLOAD);
        tb_text(&pl[i], T_UNIQUE_IDENTIFIER, uids[i], strlen(uids[i]));
        tb_end(&pl[i]);
    }
    kresponse r;
    CK_RV rv = kmip_call(&g.slots[slot], n, ops, pl, &r);
    for (int i = 0; i < n; i++)
        tb_free(&pl[i]);
    if (rv != CKR_OK)
        return rv;
    for (int i = 0; i < n && rv == CKR_OK; i++) {
        kattrs a;
        if (i >= r.nitems || r.items[i].status != 0 || r.items[i].payload < 0
            || kmip_parse_attributes(&r, r.items[i].payload, &a)) {
            rv = CKR_DEVICE_ERROR;
            break;
        }
        pthread_mutex_lock(&g.lock);
        sr_object *o = object_add(slot, &a);
        if (o)
            out[i] = o->handle;
        pthread_mutex_unlock(&g.lock);
        if (o == NULL)
            rv = CKR_DEVICE_ERROR;
    }
    kresponse_free(&r);
    return rv;
}

static void set_owner(CK_SLOT_ID slot, CK_OBJECT_HANDLE h, CK_SESSION_HANDLE owner)
{
    pthread_mutex_lock(&g.lock);
    sr_object *o = object_get(slot, h);
    if (o != NULL)
        o->owner = owner;
    pthread_mutex_unlock(&g.lock);
}

/* The session to create objects in: a token object needs a read/write session. */
static sr_session *rw_session(CK_SESSION_HANDLE h, CK_RV *rv, int token)
{
    sr_session *s = session_get(h);
    if (s == NULL) {
        *rv = CKR_SESSION_HANDLE_INVALID;
        return NULL;
    }
    if (token && !(s->flags & CKF_RW_SESSION)) {
        session_put(s);
        *rv = CKR_SESSION_READ_ONLY;
        return NULL;
    }
    if (g.slots[s->slot].ctx == NULL) {
        session_put(s);
        *rv = CKR_USER_NOT_LOGGED_IN;
        return NULL;
    }
    if (s->op.kind != OP_NONE) {
        session_put(s);
        *rv = CKR_OPERATION_ACTIVE;
        return NULL;
    }
    return s;
}

CK_RV C_GenerateKey(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism,
                    CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulCount, CK_OBJECT_HANDLE_PTR phKey)
{
    CHECK_INIT();
    if (pMechanism == NULL || phKey == NULL || (pTemplate == NULL && ulCount))
        return CKR_ARGUMENTS_BAD;
    int aes = pMechanism->mechanism == CKM_AES_KEY_GEN;
    if (!aes && pMechanism->mechanism != CKM_GENERIC_SECRET_KEY_GEN)
        return CKR_MECHANISM_INVALID;
    CK_RV rv = common_checks(pTemplate, ulCount, 1);
    if (rv != CKR_OK)
        return rv;
    CK_ULONG cls, kt, len;
    if (attr_ulong(pTemplate, ulCount, CKA_CLASS, &cls) == 0 && cls != CKO_SECRET_KEY)
        return CKR_TEMPLATE_INCONSISTENT;
    if (attr_ulong(pTemplate, ulCount, CKA_KEY_TYPE, &kt) == 0
        && kt != (aes ? CKK_AES : CKK_GENERIC_SECRET))
        return CKR_TEMPLATE_INCONSISTENT;
    int lr = attr_ulong(pTemplate, ulCount, CKA_VALUE_LEN, &len);
    if (lr == -1) {
        if (aes)
            return CKR_TEMPLATE_INCOMPLETE;
        len = 32;
    } else if (lr == -2) {
        return CKR_ATTRIBUTE_VALUE_INVALID;
    }
    uint32_t alg;
    if (aes) {
        if (len != 16 && len != 24 && len != 32)
            return CKR_ATTRIBUTE_VALUE_INVALID;
        alg = ALG_AES;
    } else {
        if (len != 32 && len != 48 && len != 64)
            return CKR_ATTRIBUTE_VALUE_INVALID;
        alg = len == 32 ? ALG_HMAC_SHA256 : len == 48 ? ALG_HMAC_SHA384 : ALG_HMAC_SHA512;
    }
    uint32_t mask;
    if (aes) {
        mask = MASK_ENCRYPT | MASK_DECRYPT | MASK_WRAP | MASK_UNWRAP;
        static const struct { CK_ATTRIBUTE_TYPE t; uint32_t m; } U[] = {
            { CKA_ENCRYPT, MASK_ENCRYPT }, { CKA_DECRYPT, MASK_DECRYPT },
            { CKA_WRAP, MASK_WRAP }, { CKA_UNWRAP, MASK_UNWRAP } };
        for (size_t i = 0; i < 4; i++)
            if (attr_bool(pTemplate, ulCount, U[i].t) == 0)
                mask &= ~U[i].m;
        /* a template that leaves nothing of the kind's uses means the kind's uses, as
         * the server reads a Cryptographic Usage Mask (docs/kmip.md) */
        if (mask == 0)
            mask = MASK_ENCRYPT | MASK_DECRYPT | MASK_WRAP | MASK_UNWRAP;
    } else {
        mask = MASK_MAC_GEN | MASK_MAC_VERIFY;
        if (attr_bool(pTemplate, ulCount, CKA_SIGN) == 0)
            mask &= ~(uint32_t)MASK_MAC_GEN;
        if (attr_bool(pTemplate, ulCount, CKA_VERIFY) == 0)
            mask &= ~(uint32_t)MASK_MAC_VERIFY;
        if (mask == 0)
            mask = MASK_MAC_GEN | MASK_MAC_VERIFY;
    }
    char label[KMIP_NAME_MAX + 1];
    if ((rv = attr_label(pTemplate, ulCount, label, sizeof(label))) != CKR_OK)
        return rv;
    sr_session *s = rw_session(hSession, &rv, attr_bool(pTemplate, ulCount, CKA_TOKEN) != 0);
    if (s == NULL)
        return rv;
    tbuf p;
    tb_init(&p);
    tb_begin(&p, T_REQUEST_PAYLOAD);
    tb_enum(&p, T_OBJECT_TYPE, OT_SYMMETRIC);
    tb_begin(&p, T_TEMPLATE_ATTRIBUTE);
    attr_enum(&p, "Cryptographic Algorithm", alg);
    attr_int(&p, "Cryptographic Length", (int32_t)(len * 8));
    attr_int(&p, "Cryptographic Usage Mask", (int32_t)mask);
    attr_name(&p, label);
    attr_activation(&p);
    tb_end(&p);
    tb_end(&p);
    kresponse r;
    rv = kmip_one(&g.slots[s->slot], OP_CREATE, &p, &r, 0);
    tb_free(&p);
    if (rv == CKR_OK) {
        const uint8_t *u;
        size_t un;
        char uid[1][KMIP_UID_MAX + 1];
        if (r.items[0].payload < 0 || kmip_payload_bytes(&r, r.items[0].payload, T_UNIQUE_IDENTIFIER, &u, &un)
            || un == 0 || un > KMIP_UID_MAX) {
            rv = CKR_DEVICE_ERROR;
        } else {
            memcpy(uid[0], u, un);
            uid[0][un] = '\0';
        }
        kresponse_free(&r);
        if (rv == CKR_OK)
            rv = adopt(s->slot, 1, uid, phKey);
        if (rv == CKR_OK && attr_bool(pTemplate, ulCount, CKA_TOKEN) == 0)
            set_owner(s->slot, *phKey, s->handle);
    }
    session_put(s);
    return rv;
}

static const unsigned char OID_P256[] = { 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07 };
static const unsigned char OID_P384[] = { 0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22 };

CK_RV C_GenerateKeyPair(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism,
                        CK_ATTRIBUTE_PTR pPublicKeyTemplate, CK_ULONG ulPublicKeyAttributeCount,
                        CK_ATTRIBUTE_PTR pPrivateKeyTemplate, CK_ULONG ulPrivateKeyAttributeCount,
                        CK_OBJECT_HANDLE_PTR phPublicKey, CK_OBJECT_HANDLE_PTR phPrivateKey)
{
    CHECK_INIT();
    const CK_ATTRIBUTE *pub = pPublicKeyTemplate, *prv = pPrivateKeyTemplate;
    CK_ULONG npub = ulPublicKeyAttributeCount, nprv = ulPrivateKeyAttributeCount;
    if (pMechanism == NULL || phPublicKey == NULL || phPrivateKey == NULL
        || (pub == NULL && npub) || (prv == NULL && nprv))
        return CKR_ARGUMENTS_BAD;
    CK_RV rv;
    uint32_t alg;
    CK_ULONG bits = 0;
    if (pMechanism->mechanism == CKM_RSA_PKCS_KEY_PAIR_GEN) {
        alg = ALG_RSA;
        int r = attr_ulong(pub, npub, CKA_MODULUS_BITS, &bits);
        if (r == -1)
            return CKR_TEMPLATE_INCOMPLETE;
        if (r == -2 || (bits != 2048 && bits != 3072 && bits != 4096))
            return CKR_ATTRIBUTE_VALUE_INVALID;
        const CK_ATTRIBUTE *e = find_attr(pub, npub, CKA_PUBLIC_EXPONENT);
        if (e != NULL) {
            /* the HSM generates with 65537 */
            const unsigned char *v = e->pValue;
            CK_ULONG k = 0;
            while (v && k < e->ulValueLen && v[k] == 0)
                k++;
            if (v == NULL || e->ulValueLen - k != 3 || v[k] != 1 || v[k + 1] != 0 || v[k + 2] != 1)
                return CKR_TEMPLATE_INCONSISTENT;
        }
    } else if (pMechanism->mechanism == CKM_EC_KEY_PAIR_GEN) {
        alg = ALG_EC;
        const CK_ATTRIBUTE *ep = find_attr(pub, npub, CKA_EC_PARAMS);
        if (ep == NULL)
            return CKR_TEMPLATE_INCOMPLETE;
        if (ep->pValue && ep->ulValueLen == sizeof(OID_P256) && !memcmp(ep->pValue, OID_P256, sizeof(OID_P256)))
            bits = 256;
        else if (ep->pValue && ep->ulValueLen == sizeof(OID_P384) && !memcmp(ep->pValue, OID_P384, sizeof(OID_P384)))
            bits = 384;
        else
            return CKR_CURVE_NOT_SUPPORTED;
    } else {
        return CKR_MECHANISM_INVALID;
    }
    if ((rv = common_checks(pub, npub, 0)) != CKR_OK || (rv = common_checks(prv, nprv, 1)) != CKR_OK)
        return rv;
    char lpub[KMIP_NAME_MAX + 1], lprv[KMIP_NAME_MAX + 1];
    if ((rv = attr_label(pub, npub, lpub, sizeof(lpub))) != CKR_OK
        || (rv = attr_label(prv, nprv, lprv, sizeof(lprv))) != CKR_OK)
        return rv;
    if (lpub[0] == '\0')
        memcpy(lpub, lprv, sizeof(lpub));
    if (lprv[0] == '\0')
        memcpy(lprv, lpub, sizeof(lprv));
    sr_session *s = rw_session(hSession, &rv, attr_bool(pub, npub, CKA_TOKEN) != 0
                                              || attr_bool(prv, nprv, CKA_TOKEN) != 0);
    if (s == NULL)
        return rv;
    tbuf p;
    tb_init(&p);
    tb_begin(&p, T_REQUEST_PAYLOAD);
    tb_begin(&p, T_COMMON_TEMPLATE);
    attr_enum(&p, "Cryptographic Algorithm", alg);
    attr_int(&p, "Cryptographic Length", (int32_t)bits);
    attr_activation(&p);
    tb_end(&p);
    tb_begin(&p, T_PRIVATE_TEMPLATE);
    attr_name(&p, lprv);
    tb_end(&p);
    tb_begin(&p, T_PUBLIC_TEMPLATE);
    attr_name(&p, lpub);
    tb_end(&p);
    tb_end(&p);
    kresponse r;
    rv = kmip_one(&g.slots[s->slot], OP_CREATE_KEY_PAIR, &p, &r, 0);
    tb_free(&p);
    if (rv == CKR_OK) {
        char uids[2][KMIP_UID_MAX + 1];
        const uint8_t *u;
        size_t un;
        static const uint32_t tags[2] = { T_PUBLIC_KEY_UID, T_PRIVATE_KEY_UID };
        for (int i = 0; i < 2 && rv == CKR_OK; i++) {
            if (r.items[0].payload < 0 || kmip_payload_bytes(&r, r.items[0].payload, tags[i], &u, &un)
                || un == 0 || un > KMIP_UID_MAX) {
                rv = CKR_DEVICE_ERROR;
            } else {
                memcpy(uids[i], u, un);
                uids[i][un] = '\0';
            }
        }
        kresponse_free(&r);
        CK_OBJECT_HANDLE hs[2];
        if (rv == CKR_OK)
            rv = adopt(s->slot, 2, uids, hs);
        if (rv == CKR_OK) {
            *phPublicKey = hs[0];
            *phPrivateKey = hs[1];
            if (attr_bool(pub, npub, CKA_TOKEN) == 0)
                set_owner(s->slot, hs[0], s->handle);
            if (attr_bool(prv, nprv, CKA_TOKEN) == 0)
                set_owner(s->slot, hs[1], s->handle);
        }
    }
    session_put(s);
    return rv;
}

/* ---------------------------------------------------------------- wrapping */

CK_RV C_WrapKey(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_OBJECT_HANDLE hWrappingKey,
                CK_OBJECT_HANDLE hKey, CK_BYTE_PTR pWrappedKey, CK_ULONG_PTR pulWrappedKeyLen)
{
    CHECK_INIT();
    if (pMechanism == NULL || pulWrappedKeyLen == NULL)
        return CKR_ARGUMENTS_BAD;
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    CK_RV rv = CKR_OK;
    if (g.slots[s->slot].ctx == NULL) {
        session_put(s);
        return CKR_USER_NOT_LOGGED_IN;
    }
    pthread_mutex_lock(&g.lock);
    sr_object *w = object_get(s->slot, hWrappingKey), *k = object_get(s->slot, hKey);
    char wuid[KMIP_UID_MAX + 1] = "", kuid[KMIP_UID_MAX + 1] = "";
    CK_OBJECT_CLASS wcls = 0;
    CK_KEY_TYPE wkt = 0;
    int wok = 0;
    size_t wbytes = 0, kbytes = 0;
    if (w) {
        memcpy(wuid, w->a.uid, sizeof(wuid));
        wcls = w->cls;
        wkt = w->key_type;
        wok = (w->a.usage_mask & MASK_WRAP) && w->current && w->a.state == STATE_ACTIVE;
        wbytes = (w->a.length + 7) / 8;
    }
    CK_OBJECT_CLASS kcls = k ? k->cls : 0;
    if (k) {
        memcpy(kuid, k->a.uid, sizeof(kuid));
        kbytes = (k->a.length + 7) / 8;
    }
    pthread_mutex_unlock(&g.lock);
    size_t need = 0;
    uint32_t hash = 0;
    if (w == NULL) {
        rv = CKR_WRAPPING_KEY_HANDLE_INVALID;
    } else if (k == NULL) {
        rv = CKR_KEY_HANDLE_INVALID;
    } else if (kcls != CKO_SECRET_KEY) {
        rv = CKR_KEY_NOT_WRAPPABLE;   /* the server wraps symmetric keys only */
    } else if (pMechanism->mechanism == CKM_AES_KEY_WRAP_PAD) {
        if (wcls != CKO_SECRET_KEY || wkt != CKK_AES)
            rv = CKR_WRAPPING_KEY_TYPE_INCONSISTENT;
        else if (pMechanism->pParameter != NULL && pMechanism->ulParameterLen != 0)
            rv = CKR_MECHANISM_PARAM_INVALID;   /* RFC 5649's default IV only */
        need = (kbytes + 7) / 8 * 8 + 8;
    } else if (pMechanism->mechanism == CKM_RSA_PKCS_OAEP) {
        CK_RSA_PKCS_OAEP_PARAMS *pp = pMechanism->pParameter;
        if (wcls != CKO_PUBLIC_KEY || wkt != CKK_RSA)
            rv = CKR_WRAPPING_KEY_TYPE_INCONSISTENT;
        else if (pp == NULL || pMechanism->ulParameterLen != sizeof(*pp)
                 || !((pp->hashAlg == CKM_SHA_1 && pp->mgf == CKG_MGF1_SHA1)
                      || (pp->hashAlg == CKM_SHA256 && pp->mgf == CKG_MGF1_SHA256))
                 || pp->ulSourceDataLen != 0)
            rv = CKR_MECHANISM_PARAM_INVALID;
        else
            hash = pp->hashAlg == CKM_SHA256 ? HASH_SHA256 : HASH_SHA1;
        need = wbytes;
    } else {
        rv = CKR_MECHANISM_INVALID;
    }
    if (rv == CKR_OK && !wok)
        rv = CKR_KEY_FUNCTION_NOT_PERMITTED;   /* the wrapping key may not wrap (now) */
    if (rv != CKR_OK) {
        session_put(s);
        return rv;
    }
    if (pWrappedKey == NULL) {
        *pulWrappedKeyLen = need;
        session_put(s);
        return CKR_OK;
    }
    if (*pulWrappedKeyLen < need) {
        *pulWrappedKeyLen = need;
        session_put(s);
        return CKR_BUFFER_TOO_SMALL;
    }
    tbuf p;
    tb_init(&p);
    tb_begin(&p, T_REQUEST_PAYLOAD);
    tb_text(&p, T_UNIQUE_IDENTIFIER, kuid, strlen(kuid));
    tb_begin(&p, T_KEY_WRAPPING_SPEC);
    tb_enum(&p, T_WRAPPING_METHOD, 1);   /* Encrypt */
    tb_begin(&p, T_ENCRYPTION_KEY_INFO);
    tb_text(&p, T_UNIQUE_IDENTIFIER, wuid, strlen(wuid));
    tb_begin(&p, T_CRYPTO_PARAMETERS);
    if (pMechanism->mechanism == CKM_AES_KEY_WRAP_PAD) {
        tb_enum(&p, T_BLOCK_CIPHER_MODE, MODE_AES_KWP);
    } else {
        tb_enum(&p, T_PADDING_METHOD, PAD_OAEP);
        tb_enum(&p, T_HASHING_ALGORITHM, hash);
    }
    tb_end(&p);
    tb_end(&p);
    tb_enum(&p, T_ENCODING_OPTION, 1);   /* No Encoding */
    tb_end(&p);
    tb_end(&p);
    kresponse r;
    rv = kmip_one(&g.slots[s->slot], OP_GET, &p, &r, 1);
    tb_free(&p);
    if (rv == CKR_OK) {
        const uint8_t *m;
        size_t mn;
        uint32_t fmt;
        int wrapped;
        if (r.items[0].payload < 0
            || kmip_parse_key_material(&r, r.items[0].payload, &m, &mn, &fmt, &wrapped) || !wrapped) {
            rv = CKR_DEVICE_ERROR;   /* never hand out an unwrapped key as "wrapped" */
        } else if (mn > *pulWrappedKeyLen) {
            *pulWrappedKeyLen = mn;
            rv = CKR_BUFFER_TOO_SMALL;
        } else {
            memcpy(pWrappedKey, m, mn);
            *pulWrappedKeyLen = mn;
        }
        kresponse_free(&r);
    }
    session_put(s);
    return rv;
}

/* KMIP Register of the wrapped key: the server unwraps it inside its HSM under a key it
 * holds (AES Key Wrap with Padding under an AES key; RSA-OAEP under an RSA private key)
 * and keeps it wrapped under its KEK. The plaintext never reaches this process. */
CK_RV C_UnwrapKey(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_OBJECT_HANDLE hUnwrappingKey,
                  CK_BYTE_PTR pWrappedKey, CK_ULONG ulWrappedKeyLen, CK_ATTRIBUTE_PTR pTemplate,
                  CK_ULONG ulAttributeCount, CK_OBJECT_HANDLE_PTR phKey)
{
    CHECK_INIT();
    const CK_ATTRIBUTE *t = pTemplate;
    CK_ULONG n = ulAttributeCount;
    if (pMechanism == NULL || pWrappedKey == NULL || phKey == NULL || (t == NULL && n))
        return CKR_ARGUMENTS_BAD;
    if (ulWrappedKeyLen == 0 || ulWrappedKeyLen > 4096)
        return CKR_WRAPPED_KEY_LEN_RANGE;
    CK_RV rv = common_checks(t, n, 1);
    if (rv != CKR_OK)
        return rv;
    CK_ULONG cls = CKO_SECRET_KEY, kt = CKK_AES, len = 0;
    if (attr_ulong(t, n, CKA_CLASS, &cls) == -2 || attr_ulong(t, n, CKA_KEY_TYPE, &kt) == -2)
        return CKR_ATTRIBUTE_VALUE_INVALID;
    if (cls != CKO_SECRET_KEY)
        return CKR_TEMPLATE_INCONSISTENT;   /* the server unwraps symmetric keys only */
    if (kt != CKK_AES && kt != CKK_GENERIC_SECRET)
        return CKR_TEMPLATE_INCONSISTENT;
    int lr = attr_ulong(t, n, CKA_VALUE_LEN, &len);
    if (lr == -2 || (lr == 0 && (len == 0 || len > 128)))
        return CKR_ATTRIBUTE_VALUE_INVALID;
    int aes = kt == CKK_AES;
    uint32_t mask = aes ? (MASK_ENCRYPT | MASK_DECRYPT | MASK_WRAP | MASK_UNWRAP)
                        : (MASK_MAC_GEN | MASK_MAC_VERIFY);
    if (aes) {
        static const struct { CK_ATTRIBUTE_TYPE t; uint32_t m; } U[] = {
            { CKA_ENCRYPT, MASK_ENCRYPT }, { CKA_DECRYPT, MASK_DECRYPT },
            { CKA_WRAP, MASK_WRAP }, { CKA_UNWRAP, MASK_UNWRAP } };
        uint32_t m = mask;
        for (size_t i = 0; i < 4; i++)
            if (attr_bool(t, n, U[i].t) == 0)
                m &= ~U[i].m;
        if (m != 0)
            mask = m;
    }
    char label[KMIP_NAME_MAX + 1];
    if ((rv = attr_label(t, n, label, sizeof(label))) != CKR_OK)
        return rv;
    sr_session *s = rw_session(hSession, &rv, attr_bool(t, n, CKA_TOKEN) != 0);
    if (s == NULL)
        return rv;
    pthread_mutex_lock(&g.lock);
    sr_object *w = object_get(s->slot, hUnwrappingKey);
    char wuid[KMIP_UID_MAX + 1] = "";
    CK_OBJECT_CLASS wcls = 0;
    CK_KEY_TYPE wkt = 0;
    uint32_t wmask = 0;
    if (w) {
        memcpy(wuid, w->a.uid, sizeof(wuid));
        wcls = w->cls;
        wkt = w->key_type;
        wmask = w->a.usage_mask;
    }
    pthread_mutex_unlock(&g.lock);
    uint32_t hash = 0;
    if (w == NULL) {
        rv = CKR_UNWRAPPING_KEY_HANDLE_INVALID;
    } else if (pMechanism->mechanism == CKM_AES_KEY_WRAP_PAD) {
        if (wcls != CKO_SECRET_KEY || wkt != CKK_AES)
            rv = CKR_UNWRAPPING_KEY_TYPE_INCONSISTENT;
        else if (pMechanism->pParameter != NULL && pMechanism->ulParameterLen != 0)
            rv = CKR_MECHANISM_PARAM_INVALID;
    } else if (pMechanism->mechanism == CKM_RSA_PKCS_OAEP) {
        CK_RSA_PKCS_OAEP_PARAMS *pp = pMechanism->pParameter;
        if (wcls != CKO_PRIVATE_KEY || wkt != CKK_RSA)
            rv = CKR_UNWRAPPING_KEY_TYPE_INCONSISTENT;
        else if (pp == NULL || pMechanism->ulParameterLen != sizeof(*pp)
                 || !((pp->hashAlg == CKM_SHA_1 && pp->mgf == CKG_MGF1_SHA1)
                      || (pp->hashAlg == CKM_SHA256 && pp->mgf == CKG_MGF1_SHA256))
                 || pp->ulSourceDataLen != 0)
            rv = CKR_MECHANISM_PARAM_INVALID;
        else
            hash = pp->hashAlg == CKM_SHA256 ? HASH_SHA256 : HASH_SHA1;
    } else {
        rv = CKR_MECHANISM_INVALID;
    }
    if (rv == CKR_OK && !(wmask & MASK_UNWRAP))
        rv = CKR_KEY_FUNCTION_NOT_PERMITTED;
    if (rv != CKR_OK) {
        session_put(s);
        return rv;
    }
    uint32_t alg = aes ? ALG_AES : ALG_HMAC_SHA256;
    tbuf p;
    tb_init(&p);
    tb_begin(&p, T_REQUEST_PAYLOAD);
    tb_enum(&p, T_OBJECT_TYPE, OT_SYMMETRIC);
    tb_begin(&p, T_TEMPLATE_ATTRIBUTE);
    attr_int(&p, "Cryptographic Usage Mask", (int32_t)mask);
    attr_name(&p, label);
    attr_activation(&p);
    tb_end(&p);
    tb_begin(&p, T_SYMMETRIC_KEY);
    tb_begin(&p, T_KEY_BLOCK);
    tb_enum(&p, T_KEY_FORMAT_TYPE, KFT_RAW);
    tb_begin(&p, T_KEY_VALUE);
    tb_bytes(&p, T_KEY_MATERIAL, pWrappedKey, ulWrappedKeyLen);
    tb_end(&p);
    tb_enum(&p, T_CRYPTO_ALGORITHM, alg);
    if (lr == 0)
        tb_int(&p, T_CRYPTO_LENGTH, (int32_t)(len * 8));
    tb_begin(&p, T_KEY_WRAPPING_DATA);
    tb_enum(&p, T_WRAPPING_METHOD, 1);   /* Encrypt */
    tb_begin(&p, T_ENCRYPTION_KEY_INFO);
    tb_text(&p, T_UNIQUE_IDENTIFIER, wuid, strlen(wuid));
    tb_begin(&p, T_CRYPTO_PARAMETERS);
    if (pMechanism->mechanism == CKM_AES_KEY_WRAP_PAD) {
        tb_enum(&p, T_BLOCK_CIPHER_MODE, MODE_AES_KWP);
    } else {
        tb_enum(&p, T_PADDING_METHOD, PAD_OAEP);
        tb_enum(&p, T_HASHING_ALGORITHM, hash);
    }
    tb_end(&p);
    tb_end(&p);
    tb_enum(&p, T_ENCODING_OPTION, 1);   /* No Encoding */
    tb_end(&p);
    tb_end(&p);
    tb_end(&p);
    tb_end(&p);
    kresponse r;
    rv = kmip_one(&g.slots[s->slot], OP_REGISTER, &p, &r, 1);
    tb_free(&p);
    if (rv == CKR_ENCRYPTED_DATA_INVALID)
        rv = CKR_WRAPPED_KEY_INVALID;   /* Cryptographic Failure: it does not unwrap */
    else if (rv == CKR_MECHANISM_PARAM_INVALID)
        rv = CKR_TEMPLATE_INCONSISTENT;  /* Invalid Field: a length or algorithm refused */
    if (rv == CKR_OK) {
        const uint8_t *u;
        size_t un;
        char uid[1][KMIP_UID_MAX + 1];
        if (r.items[0].payload < 0 || kmip_payload_bytes(&r, r.items[0].payload, T_UNIQUE_IDENTIFIER, &u, &un)
            || un == 0 || un > KMIP_UID_MAX) {
            rv = CKR_DEVICE_ERROR;
        } else {
            memcpy(uid[0], u, un);
            uid[0][un] = '\0';
        }
        kresponse_free(&r);
        if (rv == CKR_OK)
            rv = adopt(s->slot, 1, uid, phKey);
        if (rv == CKR_OK && attr_bool(t, n, CKA_TOKEN) == 0)
            set_owner(s->slot, *phKey, s->handle);
    }
    session_put(s);
    return rv;
}

CK_RV C_DeriveKey(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_OBJECT_HANDLE hBaseKey,
                  CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulAttributeCount, CK_OBJECT_HANDLE_PTR phKey)
{
    (void)hSession; (void)pMechanism; (void)hBaseKey; (void)pTemplate; (void)ulAttributeCount; (void)phKey;
    CHECK_INIT();
    return CKR_FUNCTION_NOT_SUPPORTED;
}

/* ---------------------------------------------------------------- random */

CK_RV C_SeedRandom(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pSeed, CK_ULONG ulSeedLen)
{
    (void)pSeed; (void)ulSeedLen;
    CHECK_INIT();
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    session_put(s);
    return CKR_RANDOM_SEED_NOT_SUPPORTED;
}

CK_RV C_GenerateRandom(CK_SESSION_HANDLE hSession, CK_BYTE_PTR RandomData, CK_ULONG ulRandomLen)
{
    CHECK_INIT();
    if (RandomData == NULL && ulRandomLen)
        return CKR_ARGUMENTS_BAD;
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    CK_RV rv = CKR_OK;
    if (g.slots[s->slot].ctx == NULL)
        rv = CKR_USER_NOT_LOGGED_IN;
    CK_ULONG done = 0;
    while (rv == CKR_OK && done < ulRandomLen) {
        CK_ULONG n = ulRandomLen - done > 65536 ? 65536 : ulRandomLen - done;
        tbuf p;
        tb_init(&p);
        tb_begin(&p, T_REQUEST_PAYLOAD);
        tb_int(&p, T_DATA_LENGTH, (int32_t)n);
        tb_end(&p);
        kresponse r;
        rv = kmip_one(&g.slots[s->slot], OP_RNG_RETRIEVE, &p, &r, 0);
        tb_free(&p);
        if (rv != CKR_OK)
            break;
        const uint8_t *d;
        size_t dn;
        if (r.items[0].payload < 0 || kmip_payload_bytes(&r, r.items[0].payload, T_DATA, &d, &dn) || dn != n)
            rv = CKR_DEVICE_ERROR;
        else
            memcpy(RandomData + done, d, n);
        kresponse_free(&r);
        done += n;
    }
    session_put(s);
    return rv;
}

/* ---------------------------------------------------------------- function list */

static CK_FUNCTION_LIST function_list = {
    .version = { 2, 40 },
#define F(name) .name = name,
    F(C_Initialize) F(C_Finalize) F(C_GetInfo) F(C_GetFunctionList) F(C_GetSlotList)
    F(C_GetSlotInfo) F(C_GetTokenInfo) F(C_GetMechanismList) F(C_GetMechanismInfo)
    F(C_InitToken) F(C_InitPIN) F(C_SetPIN) F(C_OpenSession) F(C_CloseSession)
    F(C_CloseAllSessions) F(C_GetSessionInfo) F(C_GetOperationState) F(C_SetOperationState)
    F(C_Login) F(C_Logout) F(C_CreateObject) F(C_CopyObject) F(C_DestroyObject)
    F(C_GetObjectSize) F(C_GetAttributeValue) F(C_SetAttributeValue) F(C_FindObjectsInit)
    F(C_FindObjects) F(C_FindObjectsFinal) F(C_EncryptInit) F(C_Encrypt) F(C_EncryptUpdate)
    F(C_EncryptFinal) F(C_DecryptInit) F(C_Decrypt) F(C_DecryptUpdate) F(C_DecryptFinal)
    F(C_DigestInit) F(C_Digest) F(C_DigestUpdate) F(C_DigestKey) F(C_DigestFinal)
    F(C_SignInit) F(C_Sign) F(C_SignUpdate) F(C_SignFinal) F(C_SignRecoverInit)
    F(C_SignRecover) F(C_VerifyInit) F(C_Verify) F(C_VerifyUpdate) F(C_VerifyFinal)
    F(C_VerifyRecoverInit) F(C_VerifyRecover) F(C_DigestEncryptUpdate)
    F(C_DecryptDigestUpdate) F(C_SignEncryptUpdate) F(C_DecryptVerifyUpdate)
    F(C_GenerateKey) F(C_GenerateKeyPair) F(C_WrapKey) F(C_UnwrapKey) F(C_DeriveKey)
    F(C_SeedRandom) F(C_GenerateRandom) F(C_GetFunctionStatus) F(C_CancelFunction)
    F(C_WaitForSlotEvent)
#undef F
};

CK_RV C_GetFunctionList(CK_FUNCTION_LIST_PTR_PTR ppFunctionList)
{
    if (ppFunctionList == NULL)
        return CKR_ARGUMENTS_BAD;
    *ppFunctionList = &function_list;
    return CKR_OK;
}
