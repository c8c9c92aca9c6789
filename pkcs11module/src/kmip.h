/* KMIP 1.4 messages: the tags, enumerations and operations the module uses, request
 * framing, response decoding (bounded: this is what fuzz/fuzz_ttlv.c exercises) and
 * the mapping from result reasons to PKCS#11 return codes. */
#ifndef SR_KMIP_H
#define SR_KMIP_H

#include <stddef.h>
#include <stdint.h>

#include "ttlv.h"

/* tags */
#define T_ACTIVATION_DATE      0x420001
#define T_ATTRIBUTE            0x420008
#define T_ATTRIBUTE_INDEX      0x420009
#define T_ATTRIBUTE_NAME       0x42000A
#define T_ATTRIBUTE_VALUE      0x42000B
#define T_BATCH_COUNT          0x42000D
#define T_BATCH_ITEM           0x42000F
#define T_BLOCK_CIPHER_MODE    0x420011
#define T_COMMON_TEMPLATE      0x42001F
#define T_CRYPTO_ALGORITHM     0x420028
#define T_CRYPTO_LENGTH        0x42002A
#define T_CRYPTO_PARAMETERS    0x42002B
#define T_CRYPTO_USAGE_MASK    0x42002C
#define T_ENCRYPTION_KEY_INFO  0x420036
#define T_HASHING_ALGORITHM    0x420038
#define T_IV                   0x42003D
#define T_KEY_BLOCK            0x420040
#define T_KEY_FORMAT_TYPE      0x420042
#define T_KEY_MATERIAL         0x420043
#define T_KEY_VALUE            0x420045
#define T_KEY_WRAPPING_DATA    0x420046
#define T_KEY_WRAPPING_SPEC    0x420047
#define T_MAXIMUM_ITEMS        0x42004F
#define T_MAX_RESPONSE_SIZE    0x420050
#define T_NAME                 0x420053
#define T_NAME_TYPE            0x420054
#define T_NAME_VALUE           0x420055
#define T_OBJECT_TYPE          0x420057
#define T_OPERATION            0x42005C
#define T_PADDING_METHOD       0x42005F
#define T_PRIVATE_KEY          0x420064
#define T_PRIVATE_TEMPLATE     0x420065
#define T_PRIVATE_KEY_UID      0x420066
#define T_PROTOCOL_VERSION     0x420069
#define T_PROTOCOL_MAJOR       0x42006A
#define T_PROTOCOL_MINOR       0x42006B
#define T_PUBLIC_KEY           0x42006D
#define T_PUBLIC_TEMPLATE      0x42006E
#define T_PUBLIC_KEY_UID       0x42006F
#define T_REQUEST_HEADER       0x420077
#define T_REQUEST_MESSAGE      0x420078
#define T_REQUEST_PAYLOAD      0x420079
#define T_RESPONSE_HEADER      0x42007A
#define T_RESPONSE_MESSAGE     0x42007B
#define T_RESPONSE_PAYLOAD     0x42007C
#define T_RESULT_MESSAGE       0x42007D
#define T_RESULT_REASON        0x42007E
#define T_RESULT_STATUS        0x42007F
#define T_REVOCATION_REASON    0x420081
#define T_REVOCATION_CODE      0x420082
#define T_SYMMETRIC_KEY        0x42008F
#define T_TEMPLATE_ATTRIBUTE   0x420091
#define T_UNIQUE_IDENTIFIER    0x420094
#define T_VALIDITY_INDICATOR   0x42009B
#define T_WRAPPING_METHOD      0x42009E
#define T_ENCODING_OPTION      0x4200A3
#define T_DIGITAL_SIG_ALG      0x4200AE
#define T_DATA                 0x4200C2
#define T_SIGNATURE_DATA       0x4200C3
#define T_DATA_LENGTH          0x4200C4
#define T_MAC_DATA             0x4200C6
#define T_TAG_LENGTH           0x4200CE
#define T_AE_AAD               0x4200FE
#define T_AE_TAG               0x4200FF
#define T_SALT_LENGTH          0x420100
#define T_DIGESTED_DATA        0x420107

/* operations */
enum {
    OP_CREATE = 0x01, OP_CREATE_KEY_PAIR = 0x02, OP_REGISTER = 0x03, OP_LOCATE = 0x08,
    OP_GET = 0x0A, OP_GET_ATTRIBUTES = 0x0B, OP_ACTIVATE = 0x12, OP_REVOKE = 0x13,
    OP_DESTROY = 0x14, OP_ENCRYPT = 0x1F, OP_DECRYPT = 0x20, OP_SIGN = 0x21,
    OP_SIGNATURE_VERIFY = 0x22, OP_MAC = 0x23, OP_MAC_VERIFY = 0x24, OP_RNG_RETRIEVE = 0x25,
};

/* enumerations */
enum { OT_CERTIFICATE = 1, OT_SYMMETRIC = 2, OT_PUBLIC = 3, OT_PRIVATE = 4, OT_SECRET_DATA = 7 };
enum { ALG_AES = 3, ALG_RSA = 4, ALG_ECDSA = 6, ALG_HMAC_SHA256 = 9, ALG_HMAC_SHA384 = 10,
       ALG_HMAC_SHA512 = 11, ALG_EC = 0x1A };
enum { MODE_CBC = 1, MODE_GCM = 9, MODE_AES_KWP = 0x0C };
enum { PAD_OAEP = 2, PAD_PKCS5 = 3, PAD_PKCS1V15 = 8, PAD_PSS = 0x0A };
enum { HASH_SHA1 = 4, HASH_SHA256 = 6, HASH_SHA384 = 7, HASH_SHA512 = 8 };
enum { DSA_SHA256_RSA = 5, DSA_RSASSA_PSS = 8, DSA_ECDSA_SHA256 = 0x0E };
enum { STATE_PRE_ACTIVE = 1, STATE_ACTIVE = 2, STATE_DEACTIVATED = 3, STATE_COMPROMISED = 4,
       STATE_DESTROYED = 5 };
enum { MASK_SIGN = 0x1, MASK_VERIFY = 0x2, MASK_ENCRYPT = 0x4, MASK_DECRYPT = 0x8,
       MASK_WRAP = 0x10, MASK_UNWRAP = 0x20, MASK_MAC_GEN = 0x80, MASK_MAC_VERIFY = 0x100 };
enum { KFT_RAW = 1, KFT_PKCS1 = 3, KFT_PKCS8 = 4, KFT_X509 = 5 };
enum { REASON_ITEM_NOT_FOUND = 1, REASON_RESPONSE_TOO_LARGE = 2, REASON_AUTH = 3,
       REASON_INVALID_MESSAGE = 4, REASON_OP_NOT_SUPPORTED = 5, REASON_MISSING_DATA = 6,
       REASON_INVALID_FIELD = 7, REASON_FEATURE_NOT_SUPPORTED = 8, REASON_CRYPTO_FAILURE = 0x0A,
       REASON_ILLEGAL_OPERATION = 0x0B, REASON_PERMISSION_DENIED = 0x0C,
       REASON_KEY_FORMAT = 0x10, REASON_OBJECT_EXISTS = 0x18, REASON_GENERAL_FAILURE = 0x100 };

#define KMIP_MAX_MESSAGE (1u << 20)     /* the server's default per-message limit */
#define KMIP_MAX_BATCH 64

/* One decoded batch item of a response. */
typedef struct {
    uint32_t operation;
    uint32_t status;      /* 0 success */
    uint32_t reason;
    const uint8_t *message;   /* Result Message (not NUL-terminated), may be NULL */
    uint32_t message_len;
    int payload;          /* node index of the Response Payload, -1 if none */
} kitem;

typedef struct {
    ttree tree;
    uint8_t *owned;       /* the received message, if the response owns it (wiped on free) */
    size_t owned_len;
    int nitems;
    kitem items[KMIP_MAX_BATCH];
} kresponse;

/* Wraps one or more payloads (`ops`/`payloads` arrays of `n`) into a Request Message,
 * KMIP 1.4. The payloads are encoded Request Payload structures. */
void kmip_request(tbuf *out, int n, const uint32_t *ops, const tbuf *payloads);

/* Decodes a response message. 0 on success (the message is well formed: it may still
 * carry failed items), -1 on any malformation. kresponse_free releases it. */
int kmip_parse_response(kresponse *r, const uint8_t *buf, size_t len);
void kresponse_free(kresponse *r);

/* Convenience readers on the payload of an item. The byte/text ones point into the
 * response buffer. */
int kmip_payload_bytes(const kresponse *r, int node, uint32_t tag, const uint8_t **p, size_t *n);
int kmip_payload_u32(const kresponse *r, int node, uint32_t tag, uint32_t *out);

/* What an object's GetAttributes answer says (the attributes the module uses). */
#define KMIP_UID_MAX 128
#define KMIP_NAME_MAX 128
typedef struct {
    char uid[KMIP_UID_MAX + 1];
    char name[KMIP_NAME_MAX + 1];
    char linked[KMIP_UID_MAX + 1];        /* x-strongroom-linked-private/public-key */
    char replacement[KMIP_UID_MAX + 1];   /* x-strongroom-replacement-object */
    char key_id[KMIP_UID_MAX + 1];        /* x-strongroom-key-id */
    uint32_t object_type, algorithm, length, usage_mask, state;
    int64_t key_version;
    int sensitive;        /* KMIP Sensitive: Get returns the value only wrapped (default 1) */
} kattrs;

/* Reads a GetAttributes response payload into `a`; 0 on success. */
int kmip_parse_attributes(const kresponse *r, int payload, kattrs *a);

/* Finds the key material of a Get response payload (Key Block → Key Value → Key
 * Material, or a wrapped Key Value byte string). 0 on success. */
int kmip_parse_key_material(const kresponse *r, int payload, const uint8_t **p, size_t *n,
                            uint32_t *format, int *wrapped);

/* The PKCS#11 return code for a failed item (unsigned long: CK_RV). */
unsigned long kmip_reason_to_ckr(uint32_t reason, int for_key_use);

const char *kmip_reason_name(uint32_t reason);

#endif
