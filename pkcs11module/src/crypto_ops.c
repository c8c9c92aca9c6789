/* One cryptographic operation as a KMIP request: mechanism and parameter checks at
 * Init, the output length a mechanism gives, the request built and its answer read
 * (GCM tags, ECDSA r||s <-> DER, pre-hashed inputs as Digested Data). */
#include <stdlib.h>
#include <string.h>

#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>

#include "module.h"

#define CHECK_INIT() do { if (!g.initialized) return CKR_CRYPTOKI_NOT_INITIALIZED; } while (0)

static uint32_t hmac_alg(CK_MECHANISM_TYPE m)
{
    return m == CKM_SHA256_HMAC ? ALG_HMAC_SHA256 : m == CKM_SHA384_HMAC ? ALG_HMAC_SHA384
           : m == CKM_SHA512_HMAC ? ALG_HMAC_SHA512 : 0;
}

/* the MAC's length, 0 for a mechanism that is not an HMAC */
static size_t hmac_len(CK_MECHANISM_TYPE m)
{
    return m == CKM_SHA256_HMAC ? 32 : m == CKM_SHA384_HMAC ? 48 : m == CKM_SHA512_HMAC ? 64 : 0;
}

CK_RV crypto_op_init(CK_SESSION_HANDLE h, CK_MECHANISM_PTR m, CK_OBJECT_HANDLE key, op_kind kind)
{
    CHECK_INIT();
    if (m == NULL)
        return CKR_ARGUMENTS_BAD;
    sr_session *s = session_get(h);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    CK_RV rv = CKR_OK;
    if (s->op.kind != OP_NONE || s->finding) {
        rv = CKR_OPERATION_ACTIVE;
        goto out;
    }
    if (g.slots[s->slot].ctx == NULL) {
        rv = CKR_USER_NOT_LOGGED_IN;
        goto out;
    }
    pthread_mutex_lock(&g.lock);
    sr_object *o = object_get(s->slot, key);
    CK_OBJECT_CLASS cls = o ? o->cls : 0;
    CK_KEY_TYPE kt = o ? o->key_type : 0;
    uint32_t mask = o ? o->a.usage_mask : 0, alg = o ? o->a.algorithm : 0;
    int cur = o ? (o->current && o->a.state == STATE_ACTIVE) : 0;
    pthread_mutex_unlock(&g.lock);
    if (o == NULL) {
        rv = CKR_KEY_HANDLE_INVALID;
        goto out;
    }
    if (!mech_supported(m->mechanism)) {
        rv = CKR_MECHANISM_INVALID;
        goto out;
    }
    sr_op *op = &s->op;
    memset(op, 0, sizeof(*op));
    op->mech = m->mechanism;
    op->key = key;
    CK_OBJECT_CLASS want_cls;
    CK_KEY_TYPE want_kt;
    uint32_t need = 0;
    int protect = 0;     /* a use that needs the current, Active version */
    switch (m->mechanism) {
    case CKM_AES_GCM: {
        if (kind != OPK_ENCRYPT && kind != OPK_DECRYPT)
            goto badmech;
        want_cls = CKO_SECRET_KEY;
        want_kt = CKK_AES;
        CK_GCM_PARAMS *p = m->pParameter;
        if (p == NULL || m->ulParameterLen != sizeof(*p) || p->ulIvLen == 0
            || p->ulIvLen > sizeof(op->iv) || p->pIv == NULL
            || p->ulTagBits < 96 || p->ulTagBits > 128 || p->ulTagBits % 8
            || (p->ulAADLen && p->pAAD == NULL) || p->ulAADLen > SR_MAX_INPUT / 2) {
            rv = CKR_MECHANISM_PARAM_INVALID;
            goto out;
        }
        memcpy(op->iv, p->pIv, p->ulIvLen);
        op->iv_len = p->ulIvLen;
        op->tag_bytes = p->ulTagBits / 8;
        if (p->ulAADLen) {
            op->aad = malloc(p->ulAADLen);
            if (op->aad == NULL) {
                rv = CKR_HOST_MEMORY;
                goto out;
            }
            memcpy(op->aad, p->pAAD, p->ulAADLen);
            op->aad_len = p->ulAADLen;
        }
        break;
    }
    case CKM_AES_CBC_PAD:
        if (kind != OPK_ENCRYPT && kind != OPK_DECRYPT)
            goto badmech;
        want_cls = CKO_SECRET_KEY;
        want_kt = CKK_AES;
        if (m->pParameter == NULL || m->ulParameterLen != 16) {
            rv = CKR_MECHANISM_PARAM_INVALID;
            goto out;
        }
        memcpy(op->iv, m->pParameter, 16);
        op->iv_len = 16;
        break;
    case CKM_RSA_PKCS_OAEP: {
        if (kind != OPK_ENCRYPT && kind != OPK_DECRYPT)
            goto badmech;
        want_cls = kind == OPK_ENCRYPT ? CKO_PUBLIC_KEY : CKO_PRIVATE_KEY;
        want_kt = CKK_RSA;
        CK_RSA_PKCS_OAEP_PARAMS *p = m->pParameter;
        if (p == NULL || m->ulParameterLen != sizeof(*p)
            || !((p->hashAlg == CKM_SHA_1 && p->mgf == CKG_MGF1_SHA1)
                 || (p->hashAlg == CKM_SHA256 && p->mgf == CKG_MGF1_SHA256))
            || (p->source != 0 && p->source != CKZ_DATA_SPECIFIED) || p->ulSourceDataLen != 0) {
            rv = CKR_MECHANISM_PARAM_INVALID;
            goto out;
        }
        op->oaep_hash = p->hashAlg;
        break;
    }
    case CKM_SHA256_RSA_PKCS:
    case CKM_SHA256_RSA_PKCS_PSS:
        if (kind != OPK_SIGN && kind != OPK_VERIFY)
            goto badmech;
        want_cls = kind == OPK_SIGN ? CKO_PRIVATE_KEY : CKO_PUBLIC_KEY;
        want_kt = CKK_RSA;
        if (m->mechanism == CKM_SHA256_RSA_PKCS_PSS) {
            CK_RSA_PKCS_PSS_PARAMS *p = m->pParameter;
            if (p == NULL || m->ulParameterLen != sizeof(*p) || p->hashAlg != CKM_SHA256
                || p->mgf != CKG_MGF1_SHA256 || p->sLen != 32) {
                rv = CKR_MECHANISM_PARAM_INVALID;
                goto out;
            }
        }
        break;
    case CKM_ECDSA_SHA256:
    case CKM_ECDSA:
        if (kind != OPK_SIGN && kind != OPK_VERIFY)
            goto badmech;
        want_cls = kind == OPK_SIGN ? CKO_PRIVATE_KEY : CKO_PUBLIC_KEY;
        want_kt = CKK_EC;
        break;
    case CKM_RSA_PKCS:   /* signatures only: the server refuses PKCS#1 v1.5 encryption */
        if (kind != OPK_SIGN && kind != OPK_VERIFY)
            goto badmech;
        want_cls = kind == OPK_SIGN ? CKO_PRIVATE_KEY : CKO_PUBLIC_KEY;
        want_kt = CKK_RSA;
        break;
    case CKM_RSA_PKCS_PSS: {
        if (kind != OPK_SIGN && kind != OPK_VERIFY)
            goto badmech;
        want_cls = kind == OPK_SIGN ? CKO_PRIVATE_KEY : CKO_PUBLIC_KEY;
        want_kt = CKK_RSA;
        CK_RSA_PKCS_PSS_PARAMS *p = m->pParameter;
        /* the server signs with salt = hash length and MGF1 over the same hash */
        if (p == NULL || m->ulParameterLen != sizeof(*p)
            || !((p->hashAlg == CKM_SHA256 && p->mgf == CKG_MGF1_SHA256 && p->sLen == 32)
                 || (p->hashAlg == CKM_SHA384 && p->mgf == CKG_MGF1_SHA384 && p->sLen == 48)
                 || (p->hashAlg == CKM_SHA512 && p->mgf == CKG_MGF1_SHA512 && p->sLen == 64))) {
            rv = CKR_MECHANISM_PARAM_INVALID;
            goto out;
        }
        op->hash = p->hashAlg == CKM_SHA256 ? HASH_SHA256 : p->hashAlg == CKM_SHA384 ? HASH_SHA384
                   : HASH_SHA512;
        break;
    }
    case CKM_SHA256_HMAC:
    case CKM_SHA384_HMAC:
    case CKM_SHA512_HMAC:
        if (kind != OPK_SIGN && kind != OPK_VERIFY)
            goto badmech;
        want_cls = CKO_SECRET_KEY;
        want_kt = CKK_GENERIC_SECRET;
        /* the server MACs with the key's own hash: the mechanism must name it */
        if (alg != hmac_alg(m->mechanism) && cls == CKO_SECRET_KEY && kt == CKK_GENERIC_SECRET) {
            rv = CKR_KEY_TYPE_INCONSISTENT;
            goto out;
        }
        break;
    default:
        goto badmech;
    }
    if (cls != want_cls || kt != want_kt) {
        rv = CKR_KEY_TYPE_INCONSISTENT;
        goto out;
    }
    switch (kind) {
    case OPK_ENCRYPT: need = MASK_ENCRYPT; protect = 1; break;
    case OPK_DECRYPT: need = MASK_DECRYPT; break;
    case OPK_SIGN: need = kt == CKK_GENERIC_SECRET ? MASK_MAC_GEN : MASK_SIGN; protect = 1; break;
    case OPK_VERIFY: need = kt == CKK_GENERIC_SECRET ? MASK_MAC_VERIFY : MASK_VERIFY; break;
    default: break;
    }
    if (!(mask & need) || (protect && !cur)) {
        rv = CKR_KEY_FUNCTION_NOT_PERMITTED;
        goto out;
    }
    op->kind = kind;
out:
    if (rv != CKR_OK)
        op_reset(&s->op);
    session_put(s);
    return rv;
badmech:
    op_reset(&s->op);
    session_put(s);
    return CKR_MECHANISM_INVALID;
}

/* ---- helpers */

static size_t key_bytes(CK_SLOT_ID slot, CK_OBJECT_HANDLE h)
{
    pthread_mutex_lock(&g.lock);
    sr_object *o = object_get(slot, h);
    size_t n = o ? (o->a.length + 7) / 8 : 0;
    pthread_mutex_unlock(&g.lock);
    return n;
}

CK_RV crypto_estimate(sr_session *s, size_t in, size_t *out)
{
    sr_op *op = &s->op;
    size_t kb = key_bytes(s->slot, op->key);
    switch (op->mech) {
    case CKM_AES_GCM:
        if (op->kind == OPK_ENCRYPT) {
            *out = in + op->tag_bytes;
        } else {
            if (in < op->tag_bytes)
                return CKR_ENCRYPTED_DATA_LEN_RANGE;
            *out = in - op->tag_bytes;
        }
        return CKR_OK;
    case CKM_AES_CBC_PAD:
        if (op->kind == OPK_ENCRYPT) {
            *out = (in / 16 + 1) * 16;
        } else {
            if (in == 0 || in % 16)
                return CKR_ENCRYPTED_DATA_LEN_RANGE;
            *out = in;
        }
        return CKR_OK;
    case CKM_RSA_PKCS_OAEP:
        *out = kb;
        return CKR_OK;
    case CKM_SHA256_RSA_PKCS:
    case CKM_SHA256_RSA_PKCS_PSS:
    case CKM_RSA_PKCS:
    case CKM_RSA_PKCS_PSS:
        *out = kb;
        return CKR_OK;
    case CKM_ECDSA_SHA256:
    case CKM_ECDSA:
        *out = 2 * kb;
        return CKR_OK;
    case CKM_SHA256_HMAC:
    case CKM_SHA384_HMAC:
    case CKM_SHA512_HMAC:
        *out = hmac_len(op->mech);
        return CKR_OK;
    default:
        return CKR_GENERAL_ERROR;
    }
}

static void crypto_params(tbuf *p, const sr_op *op)
{
    tb_begin(p, T_CRYPTO_PARAMETERS);
    switch (op->mech) {
    case CKM_AES_GCM:
        tb_enum(p, T_BLOCK_CIPHER_MODE, MODE_GCM);
        tb_int(p, T_TAG_LENGTH, (int32_t)op->tag_bytes);
        break;
    case CKM_AES_CBC_PAD:
        tb_enum(p, T_BLOCK_CIPHER_MODE, MODE_CBC);
        tb_enum(p, T_PADDING_METHOD, PAD_PKCS5);
        break;
    case CKM_RSA_PKCS_OAEP:
        tb_enum(p, T_PADDING_METHOD, PAD_OAEP);
        tb_enum(p, T_HASHING_ALGORITHM, op->oaep_hash == CKM_SHA256 ? HASH_SHA256 : HASH_SHA1);
        break;
    case CKM_SHA256_RSA_PKCS:
        tb_enum(p, T_PADDING_METHOD, PAD_PKCS1V15);
        tb_enum(p, T_HASHING_ALGORITHM, HASH_SHA256);
        break;
    case CKM_SHA256_RSA_PKCS_PSS:
        tb_enum(p, T_PADDING_METHOD, PAD_PSS);
        tb_enum(p, T_HASHING_ALGORITHM, HASH_SHA256);
        break;
    case CKM_ECDSA_SHA256:
        tb_enum(p, T_DIGITAL_SIG_ALG, DSA_ECDSA_SHA256);
        break;
    case CKM_ECDSA:   /* ECDSA with SHA-256/384/512 = 0x0E/0x0F/0x10, by the digest's length */
        tb_enum(p, T_DIGITAL_SIG_ALG, DSA_ECDSA_SHA256 + (op->hash - HASH_SHA256));
        break;
    case CKM_RSA_PKCS:
        tb_enum(p, T_PADDING_METHOD, PAD_PKCS1V15);
        tb_enum(p, T_HASHING_ALGORITHM, op->hash);
        break;
    case CKM_RSA_PKCS_PSS:
        tb_enum(p, T_PADDING_METHOD, PAD_PSS);
        tb_enum(p, T_HASHING_ALGORITHM, op->hash);
        break;
    case CKM_SHA256_HMAC:
    case CKM_SHA384_HMAC:
    case CKM_SHA512_HMAC:
        tb_enum(p, T_CRYPTO_ALGORITHM, hmac_alg(op->mech));
        break;
    default:
        break;
    }
    tb_end(p);
}

/* ECDSA: PKCS#11 carries r||s (each the field size), KMIP/OpenSSL DER. */
static CK_RV der_to_raw(const uint8_t *der, size_t n, size_t half, uint8_t *out)
{
    const unsigned char *q = der;
    ECDSA_SIG *sig = d2i_ECDSA_SIG(NULL, &q, (long)n);
    if (sig == NULL)
        return CKR_DEVICE_ERROR;
    const BIGNUM *r, *s;
    ECDSA_SIG_get0(sig, &r, &s);
    int ok = BN_bn2binpad(r, out, (int)half) == (int)half
             && BN_bn2binpad(s, out + half, (int)half) == (int)half;
    ECDSA_SIG_free(sig);
    return ok ? CKR_OK : CKR_DEVICE_ERROR;
}

static unsigned char *raw_to_der(const uint8_t *raw, size_t n, int *derlen)
{
    ECDSA_SIG *sig = ECDSA_SIG_new();
    BIGNUM *r = BN_bin2bn(raw, (int)(n / 2), NULL), *s = BN_bin2bn(raw + n / 2, (int)(n / 2), NULL);
    unsigned char *der = NULL;
    if (sig && r && s && ECDSA_SIG_set0(sig, r, s) == 1) {
        r = s = NULL;
        *derlen = i2d_ECDSA_SIG(sig, &der);
        if (*derlen <= 0)
            der = NULL;
    }
    BN_free(r);
    BN_free(s);
    ECDSA_SIG_free(sig);
    return der;
}

static uint32_t hash_by_length(size_t n)
{
    return n == 32 ? HASH_SHA256 : n == 48 ? HASH_SHA384 : n == 64 ? HASH_SHA512 : 0;
}

/* The DER DigestInfo prefixes of SHA-256/384/512 (RFC 8017 §9.2, note 1): CKM_RSA_PKCS
 * signs a DigestInfo; the server takes the bare digest and builds it again. */
static const uint8_t DI_PREFIX[3][19] = {
    { 0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20 },
    { 0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02, 0x05, 0x00, 0x04, 0x30 },
    { 0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03, 0x05, 0x00, 0x04, 0x40 },
};

/* For the pre-hashed mechanisms: which bytes go as Digested Data, with which hash. */
static CK_RV digested(sr_op *op, const uint8_t **in, size_t *inlen)
{
    switch (op->mech) {
    case CKM_ECDSA:
        op->hash = hash_by_length(*inlen);
        return op->hash ? CKR_OK : CKR_DATA_LEN_RANGE;
    case CKM_RSA_PKCS_PSS:
        return hash_by_length(*inlen) == op->hash ? CKR_OK : CKR_DATA_LEN_RANGE;
    case CKM_RSA_PKCS:
        for (int i = 0; i < 3; i++) {
            size_t dl = 32 + 16 * (size_t)i;
            if (*inlen == 19 + dl && memcmp(*in, DI_PREFIX[i], 19) == 0) {
                op->hash = HASH_SHA256 + (uint32_t)i;
                *in += 19;
                *inlen = dl;
                return CKR_OK;
            }
        }
        /* raw RSA over anything else (a bare digest, TLS 1.1's MD5+SHA-1) is not served */
        return CKR_DATA_INVALID;
    default:
        return CKR_OK;
    }
}

static int is_prehashed(CK_MECHANISM_TYPE m)
{
    return m == CKM_ECDSA || m == CKM_RSA_PKCS || m == CKM_RSA_PKCS_PSS;
}

static int set_out(sr_op *op, size_t n)
{
    op->out = sr_secure_alloc(n);
    if (op->out == NULL)
        return -1;
    op->out_cap = n;
    op->out_len = 0;
    return 0;
}

/* Runs the operation on `in` (and `sig` for verify) at the server; for encrypt,
 * decrypt and sign the result lands in op->out. */
CK_RV crypto_run(sr_session *s, const uint8_t *in, size_t inlen, const uint8_t *sig, size_t siglen)
{
    sr_op *op = &s->op;
    sr_slot *sl = &g.slots[s->slot];
    if (inlen > SR_MAX_INPUT)
        return CKR_DATA_LEN_RANGE;
    pthread_mutex_lock(&g.lock);
    sr_object *o = object_get(s->slot, op->key);
    char uid[KMIP_UID_MAX + 1] = "";
    if (o)
        memcpy(uid, o->a.uid, sizeof(uid));
    pthread_mutex_unlock(&g.lock);
    if (o == NULL)
        return CKR_KEY_HANDLE_INVALID;
    size_t kb = key_bytes(s->slot, op->key);
    uint32_t kop;
    int gcm = op->mech == CKM_AES_GCM;
    size_t datalen = inlen;
    if (op->kind == OPK_DECRYPT && gcm)
        datalen = inlen - op->tag_bytes;    /* checked by estimate() */
    switch (op->kind) {
    case OPK_ENCRYPT: kop = OP_ENCRYPT; break;
    case OPK_DECRYPT: kop = OP_DECRYPT; break;
    case OPK_SIGN: kop = hmac_len(op->mech) ? OP_MAC : OP_SIGN; break;
    case OPK_VERIFY: kop = hmac_len(op->mech) ? OP_MAC_VERIFY : OP_SIGNATURE_VERIFY; break;
    default: return CKR_OPERATION_NOT_INITIALIZED;
    }
    int pre = is_prehashed(op->mech);
    if (pre) {
        CK_RV dr = digested(op, &in, &datalen);
        if (dr != CKR_OK)
            return dr;
    }
    tbuf p;
    tb_init(&p);
    tb_begin(&p, T_REQUEST_PAYLOAD);
    tb_text(&p, T_UNIQUE_IDENTIFIER, uid, strlen(uid));
    crypto_params(&p, op);
    tb_bytes(&p, pre ? T_DIGESTED_DATA : T_DATA, in, datalen);
    if (op->iv_len)
        tb_bytes(&p, T_IV, op->iv, op->iv_len);
    if (gcm && op->aad_len)
        tb_bytes(&p, T_AE_AAD, op->aad, op->aad_len);
    if (gcm && op->kind == OPK_DECRYPT)
        tb_bytes(&p, T_AE_TAG, in + datalen, op->tag_bytes);
    unsigned char *der = NULL;
    if (op->kind == OPK_VERIFY) {
        if (op->mech == CKM_ECDSA_SHA256 || op->mech == CKM_ECDSA) {
            int dl = 0;
            if (siglen != 2 * kb || (der = raw_to_der(sig, siglen, &dl)) == NULL) {
                tb_free(&p);
                return CKR_SIGNATURE_LEN_RANGE;
            }
            tb_bytes(&p, T_SIGNATURE_DATA, der, (size_t)dl);
            OPENSSL_free(der);
        } else if (hmac_len(op->mech)) {
            if (siglen != hmac_len(op->mech)) {
                tb_free(&p);
                return CKR_SIGNATURE_LEN_RANGE;
            }
            tb_bytes(&p, T_MAC_DATA, sig, siglen);
        } else {
            if (siglen != kb) {
                tb_free(&p);
                return CKR_SIGNATURE_LEN_RANGE;
            }
            tb_bytes(&p, T_SIGNATURE_DATA, sig, siglen);
        }
    }
    tb_end(&p);
    kresponse r;
    CK_RV rv = kmip_one(sl, kop, &p, &r, 1);
    tb_free(&p);
    if (rv != CKR_OK) {
        /* a decryption the server refuses as a cryptographic failure: bad data or tag */
        if (rv == CKR_ENCRYPTED_DATA_INVALID && op->kind != OPK_DECRYPT)
            rv = CKR_DEVICE_ERROR;
        return rv;
    }
    int pl = r.items[0].payload;
    const uint8_t *d = NULL, *t = NULL;
    size_t dn = 0, tn = 0;
    if (pl < 0) {
        rv = CKR_DEVICE_ERROR;
    } else if (op->kind == OPK_VERIFY) {
        uint32_t valid = 0;
        if (kmip_payload_u32(&r, pl, T_VALIDITY_INDICATOR, &valid))
            rv = CKR_DEVICE_ERROR;
        else
            rv = valid == 1 ? CKR_OK : CKR_SIGNATURE_INVALID;
    } else if (op->kind == OPK_SIGN) {
        uint32_t tag = hmac_len(op->mech) ? T_MAC_DATA : T_SIGNATURE_DATA;
        if (kmip_payload_bytes(&r, pl, tag, &d, &dn)) {
            rv = CKR_DEVICE_ERROR;
        } else if (op->mech == CKM_ECDSA_SHA256 || op->mech == CKM_ECDSA) {
            if (set_out(op, 2 * kb))
                rv = CKR_HOST_MEMORY;
            else if ((rv = der_to_raw(d, dn, kb, op->out)) == CKR_OK)
                op->out_len = 2 * kb;
        } else if (set_out(op, dn)) {
            rv = CKR_HOST_MEMORY;
        } else {
            memcpy(op->out, d, dn);
            op->out_len = dn;
        }
    } else {
        if (kmip_payload_bytes(&r, pl, T_DATA, &d, &dn)) {
            rv = CKR_DEVICE_ERROR;
        } else {
            if (gcm && op->kind == OPK_ENCRYPT)
                (void)kmip_payload_bytes(&r, pl, T_AE_TAG, &t, &tn);
            if (set_out(op, dn + tn)) {
                rv = CKR_HOST_MEMORY;
            } else {
                memcpy(op->out, d, dn);
                if (tn)
                    memcpy(op->out + dn, t, tn);
                op->out_len = dn + tn;
            }
        }
    }
    kresponse_free(&r);
    if (rv == CKR_OK && op->kind != OPK_VERIFY)
        op->have_out = 1;
    return rv;
}
