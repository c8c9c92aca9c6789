/* Key generation (KMIP Create / CreateKeyPair) and random numbers (RNGRetrieve). */
#include <stdlib.h>
#include <string.h>

#include "template.h"

#define CHECK_INIT() do { if (!g.initialized) return CKR_CRYPTOKI_NOT_INITIALIZED; } while (0)

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
    kattr_enum(&p, "Cryptographic Algorithm", alg);
    kattr_int(&p, "Cryptographic Length", (int32_t)(len * 8));
    kattr_int(&p, "Cryptographic Usage Mask", (int32_t)mask);
    kattr_name(&p, label);
    kattr_activation(&p);
    kattr_sensitive(&p, pTemplate, ulCount);
    tb_end(&p);
    tb_end(&p);
    kresponse r;
    rv = kmip_one(&g.slots[s->slot], OP_CREATE, &p, &r, 0);
    tb_free(&p);
    if (rv == CKR_OK) {
        static const uint32_t tags[1] = { T_UNIQUE_IDENTIFIER };
        const int session_only[1] = { attr_bool(pTemplate, ulCount, CKA_TOKEN) == 0 };
        rv = adopt_created(s, &r, 1, tags, session_only, phKey);
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
    kattr_enum(&p, "Cryptographic Algorithm", alg);
    kattr_int(&p, "Cryptographic Length", (int32_t)bits);
    kattr_activation(&p);
    tb_end(&p);
    tb_begin(&p, T_PRIVATE_TEMPLATE);
    kattr_name(&p, lprv);
    tb_end(&p);
    tb_begin(&p, T_PUBLIC_TEMPLATE);
    kattr_name(&p, lpub);
    tb_end(&p);
    tb_end(&p);
    kresponse r;
    rv = kmip_one(&g.slots[s->slot], OP_CREATE_KEY_PAIR, &p, &r, 0);
    tb_free(&p);
    if (rv == CKR_OK) {
        static const uint32_t tags[2] = { T_PUBLIC_KEY_UID, T_PRIVATE_KEY_UID };
        const int session_only[2] = { attr_bool(pub, npub, CKA_TOKEN) == 0, attr_bool(prv, nprv, CKA_TOKEN) == 0 };
        CK_OBJECT_HANDLE hs[2];
        rv = adopt_created(s, &r, 2, tags, session_only, hs);
        if (rv == CKR_OK) {
            *phPublicKey = hs[0];
            *phPrivateKey = hs[1];
        }
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
