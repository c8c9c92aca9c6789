/* Wrapping and unwrapping, inside the server's HSM: C_WrapKey is a KMIP Get with a Key
 * Wrapping Specification, C_UnwrapKey a Register of the wrapped key. */
#include <stdlib.h>
#include <string.h>

#include "template.h"

#define CHECK_INIT() do { if (!g.initialized) return CKR_CRYPTOKI_NOT_INITIALIZED; } while (0)

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
    int khmac = k != NULL && k->key_type == CKK_GENERIC_SECRET;
    int ksensitive = k != NULL && k->a.sensitive;
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
    } else if (khmac) {
        /* HMAC keys leave in plaintext only (CKA_VALUE, when exportable), never wrapped */
        rv = ksensitive ? CKR_KEY_UNEXTRACTABLE : CKR_KEY_NOT_WRAPPABLE;
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
    kattr_int(&p, "Cryptographic Usage Mask", (int32_t)mask);
    kattr_name(&p, label);
    kattr_activation(&p);
    kattr_sensitive(&p, t, n);
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
        static const uint32_t tags[1] = { T_UNIQUE_IDENTIFIER };
        const int session_only[1] = { attr_bool(t, n, CKA_TOKEN) == 0 };
        rv = adopt_created(s, &r, 1, tags, session_only, phKey);
    }
    session_put(s);
    return rv;
}
