/* The function list (PKCS#11 v2.40). */
#include "module.h"

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
