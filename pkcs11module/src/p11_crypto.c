/* Encrypt, decrypt, sign, verify: each one KMIP request the server runs in its HSM
 * (crypto_ops.c builds it).
 *
 * Multi-part operations buffer the input (in locked memory) and send it at Final:
 * Strongroom serves no streaming, and a message is bounded (1 MiB). A length query
 * (NULL output) is answered from the mechanism and the key, without the server; a
 * result computed for a too-small buffer is kept for the retry, so no data is sent
 * twice. */
#include <stdlib.h>
#include <string.h>

#include "module.h"

#define CHECK_INIT() do { if (!g.initialized) return CKR_CRYPTOKI_NOT_INITIALIZED; } while (0)

static CK_RV append(sr_op *op, const uint8_t *p, size_t n)
{
    if (n == 0)
        return CKR_OK;
    if (p == NULL)
        return CKR_ARGUMENTS_BAD;
    if (op->in_len + n > SR_MAX_INPUT)
        return CKR_DATA_LEN_RANGE;
    if (op->in_len + n > op->in_cap) {
        size_t cap = op->in_cap ? op->in_cap : 4096;
        while (cap < op->in_len + n)
            cap *= 2;
        unsigned char *q = sr_secure_alloc(cap);
        if (q == NULL)
            return CKR_HOST_MEMORY;
        if (op->in_len)
            memcpy(q, op->in, op->in_len);
        sr_secure_free(op->in, op->in_cap);
        op->in = q;
        op->in_cap = cap;
    }
    memcpy(op->in + op->in_len, p, n);
    op->in_len += n;
    return CKR_OK;
}

/* The single-part/final pattern shared by encrypt, decrypt and sign. */
static CK_RV finish(CK_SESSION_HANDLE h, op_kind kind, int final, const uint8_t *in, size_t inlen,
                    CK_BYTE_PTR out, CK_ULONG_PTR outlen)
{
    CHECK_INIT();
    sr_session *s = session_get(h);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    sr_op *op = &s->op;
    CK_RV rv;
    if (op->kind != kind) {
        session_put(s);
        return CKR_OPERATION_NOT_INITIALIZED;
    }
    if (outlen == NULL || (!final && in == NULL && inlen)) {
        rv = CKR_ARGUMENTS_BAD;
        goto done;
    }
    if (!final && op->multipart) {
        rv = CKR_OPERATION_ACTIVE;
        goto done;
    }
    if (final) {
        in = op->in;
        inlen = op->in_len;
    }
    if (!op->have_out) {
        size_t est;
        rv = crypto_estimate(s, inlen, &est);
        if (rv != CKR_OK)
            goto done;
        if (out == NULL) {
            *outlen = est;
            session_put(s);
            return CKR_OK;
        }
        rv = crypto_run(s, in, inlen, NULL, 0);
        if (rv != CKR_OK)
            goto done;
    }
    if (out == NULL) {
        *outlen = op->out_len;
        session_put(s);
        return CKR_OK;
    }
    if (*outlen < op->out_len) {
        *outlen = op->out_len;
        session_put(s);
        return CKR_BUFFER_TOO_SMALL;
    }
    memcpy(out, op->out, op->out_len);
    *outlen = op->out_len;
    rv = CKR_OK;
done:
    op_reset(op);
    session_put(s);
    return rv;
}

static CK_RV update(CK_SESSION_HANDLE h, op_kind kind, const uint8_t *in, size_t inlen)
{
    CHECK_INIT();
    sr_session *s = session_get(h);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    if (s->op.kind != kind) {
        session_put(s);
        return CKR_OPERATION_NOT_INITIALIZED;
    }
    CK_RV rv = append(&s->op, in, inlen);
    if (rv == CKR_OK)
        s->op.multipart = 1;
    else
        op_reset(&s->op);
    session_put(s);
    return rv;
}

/* ---- encrypt */

CK_RV C_EncryptInit(CK_SESSION_HANDLE h, CK_MECHANISM_PTR m, CK_OBJECT_HANDLE k)
{
    return crypto_op_init(h, m, k, OPK_ENCRYPT);
}

CK_RV C_Encrypt(CK_SESSION_HANDLE h, CK_BYTE_PTR pData, CK_ULONG ulDataLen,
                CK_BYTE_PTR pEncryptedData, CK_ULONG_PTR pulEncryptedDataLen)
{
    return finish(h, OPK_ENCRYPT, 0, pData, ulDataLen, pEncryptedData, pulEncryptedDataLen);
}

CK_RV C_EncryptUpdate(CK_SESSION_HANDLE h, CK_BYTE_PTR pPart, CK_ULONG ulPartLen,
                      CK_BYTE_PTR pEncryptedPart, CK_ULONG_PTR pulEncryptedPartLen)
{
    if (pulEncryptedPartLen == NULL)
        return g.initialized ? CKR_ARGUMENTS_BAD : CKR_CRYPTOKI_NOT_INITIALIZED;
    /* a NULL output is a length query (PKCS#11 §5.2): the part is not taken yet */
    CK_RV rv = update(h, OPK_ENCRYPT, pEncryptedPart ? pPart : NULL, pEncryptedPart ? ulPartLen : 0);
    if (rv == CKR_OK)
        *pulEncryptedPartLen = 0;   /* everything comes out at Final */
    return rv;
}

CK_RV C_EncryptFinal(CK_SESSION_HANDLE h, CK_BYTE_PTR pLastEncryptedPart,
                     CK_ULONG_PTR pulLastEncryptedPartLen)
{
    return finish(h, OPK_ENCRYPT, 1, NULL, 0, pLastEncryptedPart, pulLastEncryptedPartLen);
}

/* ---- decrypt */

CK_RV C_DecryptInit(CK_SESSION_HANDLE h, CK_MECHANISM_PTR m, CK_OBJECT_HANDLE k)
{
    return crypto_op_init(h, m, k, OPK_DECRYPT);
}

CK_RV C_Decrypt(CK_SESSION_HANDLE h, CK_BYTE_PTR pEncryptedData, CK_ULONG ulEncryptedDataLen,
                CK_BYTE_PTR pData, CK_ULONG_PTR pulDataLen)
{
    return finish(h, OPK_DECRYPT, 0, pEncryptedData, ulEncryptedDataLen, pData, pulDataLen);
}

CK_RV C_DecryptUpdate(CK_SESSION_HANDLE h, CK_BYTE_PTR pEncryptedPart, CK_ULONG ulEncryptedPartLen,
                      CK_BYTE_PTR pPart, CK_ULONG_PTR pulPartLen)
{
    if (pulPartLen == NULL)
        return g.initialized ? CKR_ARGUMENTS_BAD : CKR_CRYPTOKI_NOT_INITIALIZED;
    CK_RV rv = update(h, OPK_DECRYPT, pPart ? pEncryptedPart : NULL, pPart ? ulEncryptedPartLen : 0);
    if (rv == CKR_OK)
        *pulPartLen = 0;
    return rv;
}

CK_RV C_DecryptFinal(CK_SESSION_HANDLE h, CK_BYTE_PTR pLastPart, CK_ULONG_PTR pulLastPartLen)
{
    return finish(h, OPK_DECRYPT, 1, NULL, 0, pLastPart, pulLastPartLen);
}

/* ---- sign */

CK_RV C_SignInit(CK_SESSION_HANDLE h, CK_MECHANISM_PTR m, CK_OBJECT_HANDLE k)
{
    return crypto_op_init(h, m, k, OPK_SIGN);
}

CK_RV C_Sign(CK_SESSION_HANDLE h, CK_BYTE_PTR pData, CK_ULONG ulDataLen, CK_BYTE_PTR pSignature,
             CK_ULONG_PTR pulSignatureLen)
{
    return finish(h, OPK_SIGN, 0, pData, ulDataLen, pSignature, pulSignatureLen);
}

CK_RV C_SignUpdate(CK_SESSION_HANDLE h, CK_BYTE_PTR pPart, CK_ULONG ulPartLen)
{
    return update(h, OPK_SIGN, pPart, ulPartLen);
}

CK_RV C_SignFinal(CK_SESSION_HANDLE h, CK_BYTE_PTR pSignature, CK_ULONG_PTR pulSignatureLen)
{
    return finish(h, OPK_SIGN, 1, NULL, 0, pSignature, pulSignatureLen);
}

/* ---- verify */

CK_RV C_VerifyInit(CK_SESSION_HANDLE h, CK_MECHANISM_PTR m, CK_OBJECT_HANDLE k)
{
    return crypto_op_init(h, m, k, OPK_VERIFY);
}

static CK_RV verify_done(CK_SESSION_HANDLE h, int final, const uint8_t *in, size_t inlen,
                         const uint8_t *sig, size_t siglen)
{
    CHECK_INIT();
    sr_session *s = session_get(h);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    CK_RV rv;
    if (s->op.kind != OPK_VERIFY) {
        session_put(s);
        return CKR_OPERATION_NOT_INITIALIZED;
    }
    if (sig == NULL || (!final && in == NULL && inlen)) {
        rv = CKR_ARGUMENTS_BAD;
    } else if (!final && s->op.multipart) {
        rv = CKR_OPERATION_ACTIVE;
    } else {
        if (final) {
            in = s->op.in;
            inlen = s->op.in_len;
        }
        rv = crypto_run(s, in ? in : (const uint8_t *)"", inlen, sig, siglen);
    }
    op_reset(&s->op);
    session_put(s);
    return rv;
}

CK_RV C_Verify(CK_SESSION_HANDLE h, CK_BYTE_PTR pData, CK_ULONG ulDataLen, CK_BYTE_PTR pSignature,
               CK_ULONG ulSignatureLen)
{
    return verify_done(h, 0, pData, ulDataLen, pSignature, ulSignatureLen);
}

CK_RV C_VerifyUpdate(CK_SESSION_HANDLE h, CK_BYTE_PTR pPart, CK_ULONG ulPartLen)
{
    return update(h, OPK_VERIFY, pPart, ulPartLen);
}

CK_RV C_VerifyFinal(CK_SESSION_HANDLE h, CK_BYTE_PTR pSignature, CK_ULONG ulSignatureLen)
{
    return verify_done(h, 1, NULL, 0, pSignature, ulSignatureLen);
}

/* ---- not served: recovery, dual functions (digests: p11_digest.c) */

#define NS(...) { __VA_ARGS__; return g.initialized ? CKR_FUNCTION_NOT_SUPPORTED : CKR_CRYPTOKI_NOT_INITIALIZED; }

CK_RV C_SignRecoverInit(CK_SESSION_HANDLE h, CK_MECHANISM_PTR m, CK_OBJECT_HANDLE k)
    NS((void)h; (void)m; (void)k)
CK_RV C_SignRecover(CK_SESSION_HANDLE h, CK_BYTE_PTR a, CK_ULONG b, CK_BYTE_PTR c, CK_ULONG_PTR d)
    NS((void)h; (void)a; (void)b; (void)c; (void)d)
CK_RV C_VerifyRecoverInit(CK_SESSION_HANDLE h, CK_MECHANISM_PTR m, CK_OBJECT_HANDLE k)
    NS((void)h; (void)m; (void)k)
CK_RV C_VerifyRecover(CK_SESSION_HANDLE h, CK_BYTE_PTR a, CK_ULONG b, CK_BYTE_PTR c, CK_ULONG_PTR d)
    NS((void)h; (void)a; (void)b; (void)c; (void)d)
CK_RV C_DigestEncryptUpdate(CK_SESSION_HANDLE h, CK_BYTE_PTR a, CK_ULONG b, CK_BYTE_PTR c, CK_ULONG_PTR d)
    NS((void)h; (void)a; (void)b; (void)c; (void)d)
CK_RV C_DecryptDigestUpdate(CK_SESSION_HANDLE h, CK_BYTE_PTR a, CK_ULONG b, CK_BYTE_PTR c, CK_ULONG_PTR d)
    NS((void)h; (void)a; (void)b; (void)c; (void)d)
CK_RV C_SignEncryptUpdate(CK_SESSION_HANDLE h, CK_BYTE_PTR a, CK_ULONG b, CK_BYTE_PTR c, CK_ULONG_PTR d)
    NS((void)h; (void)a; (void)b; (void)c; (void)d)
CK_RV C_DecryptVerifyUpdate(CK_SESSION_HANDLE h, CK_BYTE_PTR a, CK_ULONG b, CK_BYTE_PTR c, CK_ULONG_PTR d)
    NS((void)h; (void)a; (void)b; (void)c; (void)d)
