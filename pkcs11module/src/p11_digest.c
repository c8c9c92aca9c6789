/* Digests (CKM_SHA_1, CKM_SHA256, CKM_SHA384, CKM_SHA512): computed here with OpenSSL,
 * no key and no server involved. Listed because applications look for them before
 * using the server's signatures (SunPKCS11 accepts RSASSA-PSS parameters only for a
 * digest the token lists) and hash locally what they sign with CKM_RSA_PKCS_PSS or
 * CKM_ECDSA. A digest runs beside any other operation of the session. */
#include <openssl/err.h>
#include <openssl/evp.h>

#include "module.h"

#define CHECK_INIT() do { if (!g.initialized) return CKR_CRYPTOKI_NOT_INITIALIZED; } while (0)

static const EVP_MD *md_of(CK_MECHANISM_TYPE t)
{
    switch (t) {
    case CKM_SHA_1: return EVP_sha1();
    case CKM_SHA256: return EVP_sha256();
    case CKM_SHA384: return EVP_sha384();
    case CKM_SHA512: return EVP_sha512();
    default: return NULL;
    }
}

void digest_reset(sr_session *s)
{
    EVP_MD_CTX_free(s->digest);   /* clears the state */
    s->digest = NULL;
    s->digest_multipart = 0;
}

CK_RV C_DigestInit(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism)
{
    CHECK_INIT();
    if (pMechanism == NULL)
        return CKR_ARGUMENTS_BAD;
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    CK_RV rv = CKR_OK;
    const EVP_MD *md = md_of(pMechanism->mechanism);
    if (s->digest != NULL) {
        rv = CKR_OPERATION_ACTIVE;
    } else if (md == NULL) {
        rv = CKR_MECHANISM_INVALID;
    } else if (pMechanism->pParameter != NULL || pMechanism->ulParameterLen != 0) {
        rv = CKR_MECHANISM_PARAM_INVALID;
    } else if ((s->digest = EVP_MD_CTX_new()) == NULL) {
        rv = CKR_HOST_MEMORY;
    } else if (EVP_DigestInit_ex(s->digest, md, NULL) != 1) {
        ERR_clear_error();
        digest_reset(s);
        rv = CKR_FUNCTION_FAILED;   /* e.g. SHA-1 refused by the process's OpenSSL policy */
    }
    session_put(s);
    return rv;
}

/* The length check of C_Digest/C_DigestFinal: CKR_OK when the digest fits `out`. A
 * length query or a short buffer leaves the operation active (PKCS#11 5.2). */
static CK_RV digest_room(sr_session *s, CK_BYTE_PTR out, CK_ULONG_PTR outlen)
{
    CK_ULONG need = (CK_ULONG)EVP_MD_CTX_get_size(s->digest);
    CK_ULONG have = *outlen;
    *outlen = need;
    if (out == NULL)
        return CKR_OK;
    return have < need ? CKR_BUFFER_TOO_SMALL : CKR_OK;
}

static CK_RV digest_finish(sr_session *s, CK_BYTE_PTR out, CK_ULONG_PTR outlen)
{
    unsigned int n = 0;
    CK_RV rv = CKR_OK;
    if (EVP_DigestFinal_ex(s->digest, out, &n) != 1) {
        ERR_clear_error();
        rv = CKR_FUNCTION_FAILED;
    } else {
        *outlen = n;
    }
    digest_reset(s);
    return rv;
}

CK_RV C_Digest(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pData, CK_ULONG ulDataLen,
               CK_BYTE_PTR pDigest, CK_ULONG_PTR pulDigestLen)
{
    CHECK_INIT();
    if ((pData == NULL && ulDataLen > 0) || pulDigestLen == NULL)
        return CKR_ARGUMENTS_BAD;
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    CK_RV rv;
    if (s->digest == NULL) {
        rv = CKR_OPERATION_NOT_INITIALIZED;
    } else if (s->digest_multipart) {
        rv = CKR_OPERATION_ACTIVE;   /* C_Digest does not end a multi-part digest */
    } else if ((rv = digest_room(s, pDigest, pulDigestLen)) != CKR_OK || pDigest == NULL) {
        ;
    } else if (ulDataLen > 0 && EVP_DigestUpdate(s->digest, pData, ulDataLen) != 1) {
        ERR_clear_error();
        digest_reset(s);
        rv = CKR_FUNCTION_FAILED;
    } else {
        rv = digest_finish(s, pDigest, pulDigestLen);
    }
    session_put(s);
    return rv;
}

CK_RV C_DigestUpdate(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pPart, CK_ULONG ulPartLen)
{
    CHECK_INIT();
    if (pPart == NULL && ulPartLen > 0)
        return CKR_ARGUMENTS_BAD;
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    CK_RV rv = CKR_OK;
    if (s->digest == NULL) {
        rv = CKR_OPERATION_NOT_INITIALIZED;
    } else if (ulPartLen > 0 && EVP_DigestUpdate(s->digest, pPart, ulPartLen) != 1) {
        ERR_clear_error();
        digest_reset(s);
        rv = CKR_FUNCTION_FAILED;
    } else {
        s->digest_multipart = 1;
    }
    session_put(s);
    return rv;
}

CK_RV C_DigestKey(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE hKey)
{
    (void)hKey;
    CHECK_INIT();
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    /* a key's value stays in the server: the module cannot digest it */
    CK_RV rv = s->digest == NULL ? CKR_OPERATION_NOT_INITIALIZED : CKR_KEY_INDIGESTIBLE;
    session_put(s);
    return rv;
}

CK_RV C_DigestFinal(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pDigest, CK_ULONG_PTR pulDigestLen)
{
    CHECK_INIT();
    if (pulDigestLen == NULL)
        return CKR_ARGUMENTS_BAD;
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    CK_RV rv;
    if (s->digest == NULL)
        rv = CKR_OPERATION_NOT_INITIALIZED;
    else if ((rv = digest_room(s, pDigest, pulDigestLen)) == CKR_OK && pDigest != NULL)
        rv = digest_finish(s, pDigest, pulDigestLen);
    session_put(s);
    return rv;
}
