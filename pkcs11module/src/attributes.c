/* What an object shows: its PKCS#11 attributes, the public-key details read on demand
 * (a Get of the public key), template matching for searches. */
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

#include "module.h"

#define CHECK_INIT() do { if (!g.initialized) return CKR_CRYPTOKI_NOT_INITIALIZED; } while (0)

/* ---------------------------------------------------------------- public key details */

static unsigned char *bn_bytes(EVP_PKEY *pk, const char *name, CK_ULONG *len)
{
    BIGNUM *bn = NULL;
    if (EVP_PKEY_get_bn_param(pk, name, &bn) != 1)
        return NULL;
    int n = BN_num_bytes(bn);
    unsigned char *p = malloc(n > 0 ? (size_t)n : 1);
    if (p != NULL) {
        BN_bn2bin(bn, p);
        *len = (CK_ULONG)n;
    }
    BN_free(bn);
    return p;
}

static const unsigned char OID_P256[] = { 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07 };
static const unsigned char OID_P384[] = { 0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22 };

CK_RV object_load_public(sr_slot *s, sr_object *o)
{
    pthread_mutex_lock(&g.lock);
    int loaded = o->pub_loaded;
    char uid[KMIP_UID_MAX + 1];
    snprintf(uid, sizeof(uid), "%s", o->cls == CKO_PUBLIC_KEY ? o->a.uid : o->a.linked);
    pthread_mutex_unlock(&g.lock);
    if (loaded)
        return CKR_OK;
    if (uid[0] == '\0')
        return CKR_ATTRIBUTE_TYPE_INVALID;
    tbuf p;
    tb_init(&p);
    tb_begin(&p, T_REQUEST_PAYLOAD);
    tb_text(&p, T_UNIQUE_IDENTIFIER, uid, strlen(uid));
    tb_enum(&p, T_KEY_FORMAT_TYPE, KFT_X509);
    tb_end(&p);
    kresponse r;
    CK_RV rv = kmip_one(s, OP_GET, &p, &r, 0);
    tb_free(&p);
    if (rv != CKR_OK)
        return rv;
    const uint8_t *der;
    size_t n;
    uint32_t fmt;
    int wrapped;
    if (r.items[0].payload < 0
        || kmip_parse_key_material(&r, r.items[0].payload, &der, &n, &fmt, &wrapped) || wrapped) {
        kresponse_free(&r);
        return CKR_DEVICE_ERROR;
    }
    const unsigned char *q = der;
    EVP_PKEY *pk = d2i_PUBKEY(NULL, &q, (long)n);
    kresponse_free(&r);
    if (pk == NULL) {
        ERR_clear_error();
        return CKR_DEVICE_ERROR;
    }
    unsigned char *mod = NULL, *exp = NULL, *par = NULL, *pt = NULL;
    CK_ULONG ml = 0, el = 0, pl = 0, ptl = 0;
    if (EVP_PKEY_is_a(pk, "RSA")) {
        mod = bn_bytes(pk, OSSL_PKEY_PARAM_RSA_N, &ml);
        exp = bn_bytes(pk, OSSL_PKEY_PARAM_RSA_E, &el);
    } else if (EVP_PKEY_is_a(pk, "EC")) {
        char grp[64] = "";
        size_t gl = 0;
        EVP_PKEY_get_utf8_string_param(pk, OSSL_PKEY_PARAM_GROUP_NAME, grp, sizeof(grp), &gl);
        const unsigned char *oid = NULL;
        size_t oidl = 0;
        if (strcmp(grp, "prime256v1") == 0) {
            oid = OID_P256;
            oidl = sizeof(OID_P256);
        } else if (strcmp(grp, "secp384r1") == 0) {
            oid = OID_P384;
            oidl = sizeof(OID_P384);
        }
        unsigned char pub[256];
        size_t publ = 0;
        if (oid != NULL && EVP_PKEY_get_octet_string_param(pk, OSSL_PKEY_PARAM_ENCODED_PUBLIC_KEY,
                                                           pub, sizeof(pub), &publ) == 1
            && publ < 128) {
            par = malloc(oidl);
            pt = malloc(publ + 2);
            if (par && pt) {
                memcpy(par, oid, oidl);
                pl = oidl;
                pt[0] = 0x04;   /* DER OCTET STRING around the X9.62 point */
                pt[1] = (unsigned char)publ;
                memcpy(pt + 2, pub, publ);
                ptl = publ + 2;
            }
        }
    }
    EVP_PKEY_free(pk);
    ERR_clear_error();
    pthread_mutex_lock(&g.lock);
    if (!o->pub_loaded) {
        o->modulus = mod; o->modulus_len = ml;
        o->exponent = exp; o->exponent_len = el;
        o->ec_params = par; o->ec_params_len = pl;
        o->ec_point = pt; o->ec_point_len = ptl;
        o->pub_loaded = 1;
        mod = exp = par = pt = NULL;
    }
    pthread_mutex_unlock(&g.lock);
    free(mod); free(exp); free(par); free(pt);
    return CKR_OK;
}

/* A KMIP Get of a secret key's value in plaintext: the server checks the identity's
 * export right and audits it (key.export). The value goes to locked memory (*out,
 * sr_secure_free); the response buffer is wiped when freed. */
static CK_RV object_read_value(sr_slot *s, const char *uid, unsigned char **out, size_t *outlen)
{
    tbuf p;
    tb_init(&p);
    tb_begin(&p, T_REQUEST_PAYLOAD);
    tb_text(&p, T_UNIQUE_IDENTIFIER, uid, strlen(uid));
    tb_enum(&p, T_KEY_FORMAT_TYPE, KFT_RAW);
    tb_end(&p);
    kresponse r;
    CK_RV rv = kmip_one(s, OP_GET, &p, &r, 0);
    tb_free(&p);
    if (rv == CKR_ACTION_PROHIBITED)
        return CKR_ATTRIBUTE_SENSITIVE;   /* refused (and audited) by the server */
    if (rv != CKR_OK)
        return rv;
    const uint8_t *key;
    size_t n;
    uint32_t fmt;
    int wrapped;
    if (r.items[0].payload < 0
        || kmip_parse_key_material(&r, r.items[0].payload, &key, &n, &fmt, &wrapped) || wrapped
        || fmt != KFT_RAW || n == 0 || n > 128) {
        kresponse_free(&r);
        return CKR_DEVICE_ERROR;
    }
    unsigned char *buf = sr_secure_alloc(n);
    if (buf == NULL) {
        kresponse_free(&r);
        return CKR_HOST_MEMORY;
    }
    memcpy(buf, key, n);
    kresponse_free(&r);
    *out = buf;
    *outlen = n;
    return CKR_OK;
}

int attr_needs_public(CK_ATTRIBUTE_TYPE t)
{
    return t == CKA_MODULUS || t == CKA_PUBLIC_EXPONENT || t == CKA_EC_PARAMS || t == CKA_EC_POINT;
}

/* ---------------------------------------------------------------- attributes */

typedef struct {
    const void *p;
    CK_ULONG len;
    union { CK_ULONG ul; CK_BBOOL b; } v;
} aval;

#define BOOL(x) do { out->v.b = (x) ? CK_TRUE : CK_FALSE; out->p = &out->v.b; out->len = sizeof(CK_BBOOL); return CKR_OK; } while (0)
#define ULONG(x) do { out->v.ul = (x); out->p = &out->v.ul; out->len = sizeof(CK_ULONG); return CKR_OK; } while (0)
#define BYTES(q, n) do { out->p = (q); out->len = (n); return CKR_OK; } while (0)

/* The value of one attribute (under g.lock). */
static CK_RV attr_value(const sr_object *o, CK_ATTRIBUTE_TYPE t, aval *out)
{
    uint32_t m = o->a.usage_mask;
    int sec = o->cls == CKO_SECRET_KEY, priv = o->cls == CKO_PRIVATE_KEY, pub = o->cls == CKO_PUBLIC_KEY;
    int hmac = sec && o->key_type == CKK_GENERIC_SECRET;
    int cur = o->current && o->a.state == STATE_ACTIVE;
    switch (t) {
    case CKA_CLASS: ULONG(o->cls);
    case CKA_TOKEN: BOOL(o->owner == 0);
    case CKA_PRIVATE: BOOL(!pub);
    case CKA_MODIFIABLE: BOOL(0);
    case CKA_COPYABLE: BOOL(0);
    case CKA_DESTROYABLE: BOOL(1);
    case CKA_LABEL: BYTES(o->a.name, strlen(o->a.name));
    case CKA_KEY_TYPE: ULONG(o->key_type);
    case CKA_ID:
        /* both halves of a pair carry the private key's uid */
        if (pub && o->a.linked[0])
            BYTES(o->a.linked, strlen(o->a.linked));
        BYTES(o->a.uid, strlen(o->a.uid));
    case CKA_START_DATE: case CKA_END_DATE: BYTES(NULL, 0);
    case CKA_DERIVE: BOOL(0);
    case CKA_LOCAL: BOOL(0);
    case CKA_KEY_GEN_MECHANISM: ULONG(CK_UNAVAILABLE_INFORMATION);
    case CKA_SUBJECT:
        if (sec) break;
        BYTES(NULL, 0);
    case CKA_ENCRYPT:
        if (priv || hmac) BOOL(0);
        BOOL((m & MASK_ENCRYPT) && cur);
    case CKA_DECRYPT:
        if (pub || hmac) BOOL(0);
        BOOL(m & MASK_DECRYPT);
    case CKA_WRAP:
        if (priv || hmac) BOOL(0);
        BOOL((m & MASK_WRAP) && cur);
    case CKA_UNWRAP:
        if (pub || hmac) BOOL(0);
        BOOL(m & MASK_UNWRAP);
    case CKA_SIGN:
        if (pub) BOOL(0);
        BOOL(((hmac ? (m & MASK_MAC_GEN) : (m & MASK_SIGN)) != 0) && cur);
    case CKA_VERIFY:
        if (priv) BOOL(0);
        BOOL(hmac ? (m & MASK_MAC_VERIFY) : (m & MASK_VERIFY));
    case CKA_SIGN_RECOVER: case CKA_VERIFY_RECOVER:
        BOOL(0);
    case CKA_SENSITIVE:
        if (pub) break;
        /* a secret key: its export policy (KMIP Sensitive); private keys never leave */
        BOOL(!sec || o->a.sensitive);
    case CKA_ALWAYS_SENSITIVE:
        if (pub) break;
        /* a key officer may change a key's policy: its history is not known here */
        BOOL(priv);
    case CKA_EXTRACTABLE:
        if (pub) break;
        /* AES keys are wrapped by the server inside its HSM (C_WrapKey), whatever the
         * plaintext policy; HMAC keys are delivered in plaintext only; private keys never */
        BOOL(sec && (!hmac || !o->a.sensitive));
    case CKA_NEVER_EXTRACTABLE:
        if (pub) break;
        BOOL(priv);
    case CKA_ALWAYS_AUTHENTICATE:
        if (!priv) break;
        BOOL(0);
    case CKA_TRUSTED:
        if (priv) break;
        BOOL(0);
    case CKA_WRAP_WITH_TRUSTED:
        if (pub) break;
        BOOL(0);
    case CKA_VALUE:
        if (pub) break;
        if (priv || o->a.sensitive)
            return CKR_ATTRIBUTE_SENSITIVE;
        /* the length; the bytes come from a Get (C_GetAttributeValue) */
        BYTES(NULL, o->a.length / 8);
    case CKA_VALUE_LEN:
        if (!sec) break;
        ULONG(o->a.length / 8);
    case CKA_MODULUS_BITS:
        if (o->key_type != CKK_RSA) break;
        ULONG(o->a.length);
    case CKA_MODULUS: case CKA_PUBLIC_EXPONENT:
        if (o->key_type != CKK_RSA || !o->pub_loaded) break;
        if (t == CKA_MODULUS) BYTES(o->modulus, o->modulus_len);
        BYTES(o->exponent, o->exponent_len);
    case CKA_EC_PARAMS:
        if (o->key_type != CKK_EC || !o->pub_loaded || !o->ec_params) break;
        BYTES(o->ec_params, o->ec_params_len);
    case CKA_EC_POINT:
        if (!pub || o->key_type != CKK_EC || !o->pub_loaded || !o->ec_point) break;
        BYTES(o->ec_point, o->ec_point_len);
    default:
        break;
    }
    return CKR_ATTRIBUTE_TYPE_INVALID;
}

CK_RV C_GetAttributeValue(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE hObject,
                          CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulCount)
{
    CHECK_INIT();
    if (pTemplate == NULL && ulCount > 0)
        return CKR_ARGUMENTS_BAD;
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    CK_SLOT_ID slot = s->slot;
    session_put(s);
    pthread_mutex_lock(&g.lock);
    sr_object *o = object_get(slot, hObject);
    int want_pub = 0, want_value = 0;
    for (CK_ULONG i = 0; o && i < ulCount; i++) {
        want_pub |= attr_needs_public(pTemplate[i].type);
        want_value |= pTemplate[i].type == CKA_VALUE && pTemplate[i].pValue != NULL;
    }
    char uid[KMIP_UID_MAX + 1] = "";
    if (o != NULL && want_value && o->cls == CKO_SECRET_KEY && !o->a.sensitive)
        snprintf(uid, sizeof(uid), "%s", o->a.uid);
    pthread_mutex_unlock(&g.lock);
    if (o == NULL)
        return CKR_OBJECT_HANDLE_INVALID;
    if (want_pub && o->key_type != CKK_GENERIC_SECRET && o->key_type != CKK_AES) {
        CK_RV lr = object_load_public(&g.slots[slot], o);
        if (lr != CKR_OK && lr != CKR_ATTRIBUTE_TYPE_INVALID)
            return lr;
    }
    /* an explicit read of an exportable key's value: one Get, whatever the template */
    unsigned char *value = NULL;
    size_t value_len = 0;
    CK_RV value_rv = CKR_OK;
    if (uid[0] != '\0')
        value_rv = object_read_value(&g.slots[slot], uid, &value, &value_len);
    CK_RV rv = CKR_OK;
    pthread_mutex_lock(&g.lock);
    for (CK_ULONG i = 0; i < ulCount; i++) {
        aval v;
        CK_RV r = attr_value(o, pTemplate[i].type, &v);
        if (r == CKR_OK && pTemplate[i].type == CKA_VALUE && pTemplate[i].pValue != NULL) {
            if (value == NULL)
                r = value_rv != CKR_OK ? value_rv : CKR_ATTRIBUTE_SENSITIVE;
            else
                v.p = value, v.len = value_len;
        }
        if (r != CKR_OK) {
            pTemplate[i].ulValueLen = CK_UNAVAILABLE_INFORMATION;
            rv = r;   /* the spec lets either code win; keep the last */
            continue;
        }
        if (pTemplate[i].pValue == NULL) {
            pTemplate[i].ulValueLen = v.len;
        } else if (pTemplate[i].ulValueLen < v.len) {
            pTemplate[i].ulValueLen = CK_UNAVAILABLE_INFORMATION;
            rv = CKR_BUFFER_TOO_SMALL;
        } else {
            if (v.len)
                memcpy(pTemplate[i].pValue, v.p, v.len);
            pTemplate[i].ulValueLen = v.len;
        }
    }
    pthread_mutex_unlock(&g.lock);
    sr_secure_free(value, value_len);
    return rv;
}

CK_RV C_SetAttributeValue(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE hObject,
                          CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulCount)
{
    (void)hSession; (void)hObject; (void)pTemplate; (void)ulCount;
    CHECK_INIT();
    return CKR_ACTION_PROHIBITED;   /* CKA_MODIFIABLE is false: names are set in Strongroom */
}

CK_RV C_GetObjectSize(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE hObject, CK_ULONG_PTR pulSize)
{
    CHECK_INIT();
    if (pulSize == NULL)
        return CKR_ARGUMENTS_BAD;
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    CK_SLOT_ID slot = s->slot;
    session_put(s);
    pthread_mutex_lock(&g.lock);
    sr_object *o = object_get(slot, hObject);
    pthread_mutex_unlock(&g.lock);
    if (o == NULL)
        return CKR_OBJECT_HANDLE_INVALID;
    *pulSize = CK_UNAVAILABLE_INFORMATION;
    return CKR_OK;
}

int object_matches(const sr_object *o, const CK_ATTRIBUTE *tpl, CK_ULONG n)
{
    for (CK_ULONG i = 0; i < n; i++) {
        aval v;
        if (tpl[i].type == CKA_VALUE)
            return 0;   /* a key's value is known only to the server: never searched by */
        if (attr_value(o, tpl[i].type, &v) != CKR_OK)
            return 0;
        if (v.len != tpl[i].ulValueLen)
            return 0;
        if (v.len && (tpl[i].pValue == NULL || memcmp(v.p, tpl[i].pValue, v.len) != 0))
            return 0;
    }
    return 1;
}
