/* PKCS#11 general, slot, token, session and login functions; the function list. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "module.h"

sr_module g = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Mechanisms: what the server does for us (docs/kmip.md), min/max key size, flags. */
typedef struct {
    CK_MECHANISM_TYPE type;
    CK_ULONG min, max;
    CK_FLAGS flags;
} mech_info;

#define ECF (CKF_EC_F_P | CKF_EC_NAMEDCURVE | CKF_EC_UNCOMPRESS)
static const mech_info MECHS[] = {
    { CKM_AES_KEY_GEN, 16, 32, CKF_GENERATE },
    { CKM_GENERIC_SECRET_KEY_GEN, 32, 64, CKF_GENERATE },
    { CKM_RSA_PKCS_KEY_PAIR_GEN, 2048, 4096, CKF_GENERATE_KEY_PAIR },
    { CKM_EC_KEY_PAIR_GEN, 256, 384, CKF_GENERATE_KEY_PAIR | ECF },
    { CKM_AES_GCM, 16, 32, CKF_ENCRYPT | CKF_DECRYPT },
    { CKM_AES_CBC_PAD, 16, 32, CKF_ENCRYPT | CKF_DECRYPT },
    { CKM_AES_KEY_WRAP_PAD, 16, 32, CKF_WRAP | CKF_UNWRAP },
    { CKM_RSA_PKCS_OAEP, 2048, 4096, CKF_ENCRYPT | CKF_DECRYPT | CKF_WRAP | CKF_UNWRAP },
    { CKM_SHA256_RSA_PKCS, 2048, 4096, CKF_SIGN | CKF_VERIFY },
    { CKM_SHA256_RSA_PKCS_PSS, 2048, 4096, CKF_SIGN | CKF_VERIFY },
    { CKM_ECDSA_SHA256, 256, 384, CKF_SIGN | CKF_VERIFY | ECF },
    /* pre-hashed: KMIP 1.4 Digested Data (SHA-256/384/512 digests) */
    { CKM_ECDSA, 256, 384, CKF_SIGN | CKF_VERIFY | ECF },
    { CKM_RSA_PKCS_PSS, 2048, 4096, CKF_SIGN | CKF_VERIFY },
    { CKM_RSA_PKCS, 2048, 4096, CKF_SIGN | CKF_VERIFY },
    { CKM_SHA256_HMAC, 32, 128, CKF_SIGN | CKF_VERIFY },
    { CKM_SHA384_HMAC, 48, 128, CKF_SIGN | CKF_VERIFY },
    { CKM_SHA512_HMAC, 64, 128, CKF_SIGN | CKF_VERIFY },
    /* digests: computed in the module with OpenSSL, no key and no server involved
     * (SunPKCS11 accepts RSASSA-PSS parameters only for digests the token lists) */
    { CKM_SHA_1, 0, 0, CKF_DIGEST },
    { CKM_SHA256, 0, 0, CKF_DIGEST },
    { CKM_SHA384, 0, 0, CKF_DIGEST },
    { CKM_SHA512, 0, 0, CKF_DIGEST },
};
#define NMECHS (sizeof(MECHS) / sizeof(MECHS[0]))

int mech_supported(CK_MECHANISM_TYPE t)
{
    for (size_t i = 0; i < NMECHS; i++)
        if (MECHS[i].type == t)
            return 1;
    return 0;
}

/* ---------------------------------------------------------------- general */

CK_RV C_Initialize(CK_VOID_PTR pInitArgs)
{
    if (pInitArgs != NULL) {
        CK_C_INITIALIZE_ARGS *a = pInitArgs;
        if (a->pReserved != NULL)
            return CKR_ARGUMENTS_BAD;
        int some = a->CreateMutex || a->DestroyMutex || a->LockMutex || a->UnlockMutex;
        int all = a->CreateMutex && a->DestroyMutex && a->LockMutex && a->UnlockMutex;
        if (some && !all)
            return CKR_ARGUMENTS_BAD;
        /* we lock with the OS's primitives; an application that offers only its own
         * and forbids the OS's cannot be served */
        if (all && !(a->flags & CKF_OS_LOCKING_OK))
            return CKR_CANT_LOCK;
    }
    pthread_mutex_lock(&g.lock);
    if (g.initialized) {
        pthread_mutex_unlock(&g.lock);
        return CKR_CRYPTOKI_ALREADY_INITIALIZED;
    }
    const char *path = getenv("STRONGROOM_PKCS11_CONF");
    if (path == NULL || *path == '\0')
        path = "/etc/strongroom/pkcs11.conf";
    char err[1200];
    if (conf_load(path, &g.conf, err, sizeof(err)) != 0) {
        pthread_mutex_unlock(&g.lock);
        sr_log("%s", err);
        return CKR_FUNCTION_FAILED;
    }
    if (sr_secure_heap_setup() != 0) {   /* before any key is loaded */
        pthread_mutex_unlock(&g.lock);
        return CKR_FUNCTION_FAILED;
    }
    g.nslots = 0;
    for (int i = 0; i < g.conf.nslots; i++) {
        sr_slot *s = &g.slots[i];
        memset(s, 0, sizeof(*s));
        s->conf = g.conf.slots[i];
        CK_RV rv = slot_setup(s);
        g.nslots = i + 1;
        if (rv != CKR_OK) {
            sr_log("%s: [slot] #%d cannot be used (above); fix the file and restart the "
                   "application", path, i + 1);
            for (int j = 0; j <= i; j++)
                slot_teardown(&g.slots[j]);
            g.nslots = 0;
            pthread_mutex_unlock(&g.lock);
            return CKR_FUNCTION_FAILED;
        }
    }
    g.next_session = 1;
    g.next_object = 1;
    g.initialized = 1;
    pthread_mutex_unlock(&g.lock);
    return CKR_OK;
}

static void free_object(sr_object *o)
{
    free(o->modulus);
    free(o->exponent);
    free(o->ec_params);
    free(o->ec_point);
    free(o);
}

void op_reset(sr_op *op)
{
    if (op->in != NULL)
        sr_secure_free(op->in, op->in_cap);
    if (op->out != NULL)
        sr_secure_free(op->out, op->out_cap);
    free(op->aad);
    memset(op, 0, sizeof(*op));
}

static void free_session(sr_session *s)
{
    op_reset(&s->op);
    digest_reset(s);
    free(s->found);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

CK_RV C_Finalize(CK_VOID_PTR pReserved)
{
    if (pReserved != NULL)
        return CKR_ARGUMENTS_BAD;
    if (!g.initialized)
        return CKR_CRYPTOKI_NOT_INITIALIZED;
    for (int i = 0; i < g.nslots; i++)
        objects_drop_session((CK_SLOT_ID)i, 0);
    pthread_mutex_lock(&g.lock);
    if (!g.initialized) {
        pthread_mutex_unlock(&g.lock);
        return CKR_CRYPTOKI_NOT_INITIALIZED;
    }
    while (g.sessions) {
        sr_session *s = g.sessions;
        g.sessions = s->next;
        s->closed = 1;
        if (s->refs == 0)
            free_session(s);
    }
    while (g.objects) {
        sr_object *o = g.objects;
        g.objects = o->next;
        free_object(o);
    }
    for (int i = 0; i < g.nslots; i++)
        slot_teardown(&g.slots[i]);
    g.nslots = 0;
    g.initialized = 0;
    pthread_mutex_unlock(&g.lock);
    return CKR_OK;
}

CK_RV C_GetInfo(CK_INFO_PTR pInfo)
{
    if (!g.initialized)
        return CKR_CRYPTOKI_NOT_INITIALIZED;
    if (pInfo == NULL)
        return CKR_ARGUMENTS_BAD;
    memset(pInfo, 0, sizeof(*pInfo));
    pInfo->cryptokiVersion.major = 2;
    pInfo->cryptokiVersion.minor = 40;
    sr_pad(pInfo->manufacturerID, sizeof(pInfo->manufacturerID), "Strongroom");
    sr_pad(pInfo->libraryDescription, sizeof(pInfo->libraryDescription),
           "Strongroom KMIP PKCS#11 module");
    pInfo->libraryVersion.major = 0;
    pInfo->libraryVersion.minor = 1;
    return CKR_OK;
}

/* ---------------------------------------------------------------- slots, tokens */

#define CHECK_INIT() do { if (!g.initialized) return CKR_CRYPTOKI_NOT_INITIALIZED; } while (0)
#define CHECK_SLOT(id) do { if ((id) >= (CK_ULONG)g.nslots) return CKR_SLOT_ID_INVALID; } while (0)

CK_RV C_GetSlotList(CK_BBOOL tokenPresent, CK_SLOT_ID_PTR pSlotList, CK_ULONG_PTR pulCount)
{
    (void)tokenPresent;   /* every slot has its token */
    CHECK_INIT();
    if (pulCount == NULL)
        return CKR_ARGUMENTS_BAD;
    CK_ULONG n = (CK_ULONG)g.nslots;
    if (pSlotList == NULL) {
        *pulCount = n;
        return CKR_OK;
    }
    if (*pulCount < n) {
        *pulCount = n;
        return CKR_BUFFER_TOO_SMALL;
    }
    for (CK_ULONG i = 0; i < n; i++)
        pSlotList[i] = i;
    *pulCount = n;
    return CKR_OK;
}

CK_RV C_GetSlotInfo(CK_SLOT_ID slotID, CK_SLOT_INFO_PTR pInfo)
{
    CHECK_INIT();
    CHECK_SLOT(slotID);
    if (pInfo == NULL)
        return CKR_ARGUMENTS_BAD;
    sr_slot *s = &g.slots[slotID];
    memset(pInfo, 0, sizeof(*pInfo));
    char desc[300];
    snprintf(desc, sizeof(desc), "Strongroom KMIP %s:%s", s->conf.host, s->conf.port);
    sr_pad(pInfo->slotDescription, sizeof(pInfo->slotDescription), desc);
    sr_pad(pInfo->manufacturerID, sizeof(pInfo->manufacturerID), "Strongroom");
    pInfo->flags = CKF_TOKEN_PRESENT | CKF_REMOVABLE_DEVICE | CKF_HW_SLOT;
    pInfo->flags &= ~(CK_FLAGS)CKF_REMOVABLE_DEVICE;
    pInfo->hardwareVersion.major = 1;
    pInfo->firmwareVersion.major = 1;
    return CKR_OK;
}

CK_RV C_GetTokenInfo(CK_SLOT_ID slotID, CK_TOKEN_INFO_PTR pInfo)
{
    CHECK_INIT();
    CHECK_SLOT(slotID);
    if (pInfo == NULL)
        return CKR_ARGUMENTS_BAD;
    sr_slot *s = &g.slots[slotID];
    memset(pInfo, 0, sizeof(*pInfo));
    sr_pad(pInfo->label, sizeof(pInfo->label), s->label);
    sr_pad(pInfo->manufacturerID, sizeof(pInfo->manufacturerID), "Strongroom");
    sr_pad(pInfo->model, sizeof(pInfo->model), "KMIP");
    sr_pad(pInfo->serialNumber, sizeof(pInfo->serialNumber), s->serial);
    /* the user PIN is the key file's passphrase; without one, any PIN logs in */
    pInfo->flags = CKF_RNG | CKF_TOKEN_INITIALIZED | CKF_USER_PIN_INITIALIZED;
    if (s->login_required)
        pInfo->flags |= CKF_LOGIN_REQUIRED;
    pInfo->ulMaxSessionCount = CK_EFFECTIVELY_INFINITE;
    pInfo->ulMaxRwSessionCount = CK_EFFECTIVELY_INFINITE;
    pthread_mutex_lock(&g.lock);
    CK_ULONG n = 0, rw = 0;
    for (sr_session *x = g.sessions; x; x = x->next)
        if (x->slot == slotID) {
            n++;
            rw += (x->flags & CKF_RW_SESSION) != 0;
        }
    pthread_mutex_unlock(&g.lock);
    pInfo->ulSessionCount = n;
    pInfo->ulRwSessionCount = rw;
    pInfo->ulMaxPinLen = 1024;
    pInfo->ulMinPinLen = s->login_required ? 1 : 0;
    pInfo->ulTotalPublicMemory = CK_UNAVAILABLE_INFORMATION;
    pInfo->ulFreePublicMemory = CK_UNAVAILABLE_INFORMATION;
    pInfo->ulTotalPrivateMemory = CK_UNAVAILABLE_INFORMATION;
    pInfo->ulFreePrivateMemory = CK_UNAVAILABLE_INFORMATION;
    pInfo->hardwareVersion.major = 1;
    pInfo->firmwareVersion.major = 1;
    return CKR_OK;
}

CK_RV C_WaitForSlotEvent(CK_FLAGS flags, CK_SLOT_ID_PTR pSlot, CK_VOID_PTR pRserved)
{
    (void)flags; (void)pSlot; (void)pRserved;
    CHECK_INIT();
    return CKR_FUNCTION_NOT_SUPPORTED;
}

CK_RV C_GetMechanismList(CK_SLOT_ID slotID, CK_MECHANISM_TYPE_PTR pMechanismList,
                         CK_ULONG_PTR pulCount)
{
    CHECK_INIT();
    CHECK_SLOT(slotID);
    if (pulCount == NULL)
        return CKR_ARGUMENTS_BAD;
    if (pMechanismList == NULL) {
        *pulCount = NMECHS;
        return CKR_OK;
    }
    if (*pulCount < NMECHS) {
        *pulCount = NMECHS;
        return CKR_BUFFER_TOO_SMALL;
    }
    for (size_t i = 0; i < NMECHS; i++)
        pMechanismList[i] = MECHS[i].type;
    *pulCount = NMECHS;
    return CKR_OK;
}

CK_RV C_GetMechanismInfo(CK_SLOT_ID slotID, CK_MECHANISM_TYPE type, CK_MECHANISM_INFO_PTR pInfo)
{
    CHECK_INIT();
    CHECK_SLOT(slotID);
    if (pInfo == NULL)
        return CKR_ARGUMENTS_BAD;
    for (size_t i = 0; i < NMECHS; i++) {
        if (MECHS[i].type == type) {
            pInfo->ulMinKeySize = MECHS[i].min;
            pInfo->ulMaxKeySize = MECHS[i].max;
            /* CKF_HW: done in the server's HSM; not the digests, done here in software */
            pInfo->flags = MECHS[i].flags | (MECHS[i].flags == CKF_DIGEST ? 0 : CKF_HW);
            return CKR_OK;
        }
    }
    return CKR_MECHANISM_INVALID;
}

/* The token's identity and PIN are managed by Strongroom (certificate issue, key file
 * encryption), not through PKCS#11. */
CK_RV C_InitToken(CK_SLOT_ID slotID, CK_UTF8CHAR_PTR pPin, CK_ULONG ulPinLen, CK_UTF8CHAR_PTR pLabel)
{
    (void)slotID; (void)pPin; (void)ulPinLen; (void)pLabel;
    CHECK_INIT();
    return CKR_FUNCTION_NOT_SUPPORTED;
}

CK_RV C_InitPIN(CK_SESSION_HANDLE hSession, CK_UTF8CHAR_PTR pPin, CK_ULONG ulPinLen)
{
    (void)hSession; (void)pPin; (void)ulPinLen;
    CHECK_INIT();
    return CKR_FUNCTION_NOT_SUPPORTED;
}

CK_RV C_SetPIN(CK_SESSION_HANDLE hSession, CK_UTF8CHAR_PTR pOldPin, CK_ULONG ulOldLen,
               CK_UTF8CHAR_PTR pNewPin, CK_ULONG ulNewLen)
{
    (void)hSession; (void)pOldPin; (void)ulOldLen; (void)pNewPin; (void)ulNewLen;
    CHECK_INIT();
    return CKR_FUNCTION_NOT_SUPPORTED;
}

/* ---------------------------------------------------------------- sessions */

/* Sessions are reference-counted so that no thread ever waits for a session's lock
 * while holding g.lock (an operation holding its session's lock takes g.lock to read
 * objects): session_get takes a reference under g.lock, then the session's lock
 * alone. A session closed meanwhile is freed by its last user. */
sr_session *session_get(CK_SESSION_HANDLE h)
{
    pthread_mutex_lock(&g.lock);
    sr_session *s = NULL;
    if (g.initialized)
        for (s = g.sessions; s != NULL && s->handle != h; s = s->next)
            ;
    if (s != NULL)
        s->refs++;
    pthread_mutex_unlock(&g.lock);
    if (s == NULL)
        return NULL;
    pthread_mutex_lock(&s->lock);
    if (s->closed) {
        session_put(s);
        return NULL;
    }
    return s;
}

static void session_release(sr_session *s)
{
    pthread_mutex_lock(&g.lock);
    int last = --s->refs == 0 && s->closed;
    pthread_mutex_unlock(&g.lock);
    if (last)
        free_session(s);
}

void session_put(sr_session *s)
{
    pthread_mutex_unlock(&s->lock);
    session_release(s);
}

CK_RV C_OpenSession(CK_SLOT_ID slotID, CK_FLAGS flags, CK_VOID_PTR pApplication,
                    CK_NOTIFY Notify, CK_SESSION_HANDLE_PTR phSession)
{
    (void)pApplication; (void)Notify;
    CHECK_INIT();
    CHECK_SLOT(slotID);
    if (phSession == NULL)
        return CKR_ARGUMENTS_BAD;
    if (!(flags & CKF_SERIAL_SESSION))
        return CKR_SESSION_PARALLEL_NOT_SUPPORTED;
    sr_session *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return CKR_HOST_MEMORY;
    pthread_mutex_init(&s->lock, NULL);
    s->slot = slotID;
    s->flags = flags;
    pthread_mutex_lock(&g.lock);
    s->handle = g.next_session++;
    s->next = g.sessions;
    g.sessions = s;
    pthread_mutex_unlock(&g.lock);
    *phSession = s->handle;
    return CKR_OK;
}

static int slot_has_sessions(CK_SLOT_ID slot)
{
    for (sr_session *x = g.sessions; x; x = x->next)
        if (x->slot == slot)
            return 1;
    return 0;
}

CK_RV C_CloseSession(CK_SESSION_HANDLE hSession)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    sr_session **pp = &g.sessions;
    while (*pp != NULL && (*pp)->handle != hSession)
        pp = &(*pp)->next;
    sr_session *s = *pp;
    if (s == NULL) {
        pthread_mutex_unlock(&g.lock);
        return CKR_SESSION_HANDLE_INVALID;
    }
    *pp = s->next;
    CK_SLOT_ID slot = s->slot;
    int last = !slot_has_sessions(slot);
    s->closed = 1;
    int unused = s->refs == 0;   /* else an operation in flight frees it when done */
    pthread_mutex_unlock(&g.lock);
    if (unused)
        free_session(s);
    /* session objects (keys generated with CKA_TOKEN false) end with their session */
    objects_drop_session(slot, hSession);
    if (last)   /* closing the last session logs the user out (PKCS#11 §5.6) */
        slot_logout(&g.slots[slot]);
    return CKR_OK;
}

CK_RV C_CloseAllSessions(CK_SLOT_ID slotID)
{
    CHECK_INIT();
    CHECK_SLOT(slotID);
    for (;;) {
        CK_SESSION_HANDLE h = 0;
        pthread_mutex_lock(&g.lock);
        for (sr_session *x = g.sessions; x; x = x->next)
            if (x->slot == slotID) {
                h = x->handle;
                break;
            }
        pthread_mutex_unlock(&g.lock);
        if (h == 0)
            break;
        C_CloseSession(h);
    }
    slot_logout(&g.slots[slotID]);
    return CKR_OK;
}

CK_RV C_GetSessionInfo(CK_SESSION_HANDLE hSession, CK_SESSION_INFO_PTR pInfo)
{
    CHECK_INIT();
    if (pInfo == NULL)
        return CKR_ARGUMENTS_BAD;
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    sr_slot *sl = &g.slots[s->slot];
    int rw = (s->flags & CKF_RW_SESSION) != 0;
    pInfo->slotID = s->slot;
    pInfo->flags = s->flags;
    pInfo->ulDeviceError = 0;
    if (sl->logged_in)
        pInfo->state = rw ? CKS_RW_USER_FUNCTIONS : CKS_RO_USER_FUNCTIONS;
    else
        pInfo->state = rw ? CKS_RW_PUBLIC_SESSION : CKS_RO_PUBLIC_SESSION;
    session_put(s);
    return CKR_OK;
}

CK_RV C_GetOperationState(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pOperationState,
                          CK_ULONG_PTR pulOperationStateLen)
{
    (void)hSession; (void)pOperationState; (void)pulOperationStateLen;
    CHECK_INIT();
    return CKR_FUNCTION_NOT_SUPPORTED;
}

CK_RV C_SetOperationState(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pOperationState,
                          CK_ULONG ulOperationStateLen, CK_OBJECT_HANDLE hEncryptionKey,
                          CK_OBJECT_HANDLE hAuthenticationKey)
{
    (void)hSession; (void)pOperationState; (void)ulOperationStateLen;
    (void)hEncryptionKey; (void)hAuthenticationKey;
    CHECK_INIT();
    return CKR_FUNCTION_NOT_SUPPORTED;
}

CK_RV C_Login(CK_SESSION_HANDLE hSession, CK_USER_TYPE userType, CK_UTF8CHAR_PTR pPin,
              CK_ULONG ulPinLen)
{
    CHECK_INIT();
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    CK_SLOT_ID slot = s->slot;
    session_put(s);
    if (userType == CKU_SO)
        return CKR_FUNCTION_NOT_SUPPORTED;   /* no security officer: see README */
    if (userType != CKU_USER && userType != CKU_CONTEXT_SPECIFIC)
        return CKR_USER_TYPE_INVALID;
    return slot_login(&g.slots[slot], pPin, pPin ? ulPinLen : 0);
}

CK_RV C_Logout(CK_SESSION_HANDLE hSession)
{
    CHECK_INIT();
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    CK_SLOT_ID slot = s->slot;
    session_put(s);
    sr_slot *sl = &g.slots[slot];
    if (!sl->logged_in)
        return CKR_USER_NOT_LOGGED_IN;
    slot_logout(sl);
    return CKR_OK;
}

/* ---------------------------------------------------------------- not supported */


CK_RV C_GetFunctionStatus(CK_SESSION_HANDLE hSession)
{
    (void)hSession;
    CHECK_INIT();
    return CKR_FUNCTION_NOT_PARALLEL;
}

CK_RV C_CancelFunction(CK_SESSION_HANDLE hSession)
{
    (void)hSession;
    CHECK_INIT();
    return CKR_FUNCTION_NOT_PARALLEL;
}
