/* KMIP request framing, bounded response decoding, result-reason mapping. */
#include "kmip.h"

#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "sr_pkcs11.h"

void kmip_request(tbuf *out, int n, const uint32_t *ops, const tbuf *payloads)
{
    tb_begin(out, T_REQUEST_MESSAGE);
    tb_begin(out, T_REQUEST_HEADER);
    tb_begin(out, T_PROTOCOL_VERSION);
    tb_int(out, T_PROTOCOL_MAJOR, 1);
    tb_int(out, T_PROTOCOL_MINOR, 4);
    tb_end(out);
    tb_int(out, T_MAX_RESPONSE_SIZE, (int32_t)KMIP_MAX_MESSAGE);
    tb_int(out, T_BATCH_COUNT, n);
    tb_end(out);
    for (int i = 0; i < n; i++) {
        tb_begin(out, T_BATCH_ITEM);
        tb_enum(out, T_OPERATION, ops[i]);
        if (payloads[i].err)
            out->err = 1;
        tb_raw(out, payloads[i].p, payloads[i].len);
        tb_end(out);
    }
    tb_end(out);
}

int kmip_parse_response(kresponse *r, const uint8_t *buf, size_t len)
{
    memset(r, 0, sizeof(*r));
    if (ttlv_parse(&r->tree, buf, len))
        return -1;
    const ttree *t = &r->tree;
    if (t->n[0].tag != T_RESPONSE_MESSAGE || t->n[0].type != TTLV_STRUCT)
        goto bad;
    int header = ttlv_find(t, 0, T_RESPONSE_HEADER, -1);
    uint32_t count;
    if (header < 0 || ttlv_child_u32(t, header, T_BATCH_COUNT, &count))
        goto bad;
    int item = -1;
    while ((item = ttlv_find(t, 0, T_BATCH_ITEM, item)) >= 0) {
        if (r->nitems >= KMIP_MAX_BATCH)
            goto bad;
        kitem *k = &r->items[r->nitems];
        memset(k, 0, sizeof(*k));
        k->payload = -1;
        if (ttlv_child_u32(t, item, T_RESULT_STATUS, &k->status))
            goto bad;
        /* Operation is required in responses but servers omit it on some failures */
        (void)ttlv_child_u32(t, item, T_OPERATION, &k->operation);
        (void)ttlv_child_u32(t, item, T_RESULT_REASON, &k->reason);
        int msg = ttlv_find(t, item, T_RESULT_MESSAGE, -1);
        if (msg >= 0 && t->n[msg].type == TTLV_TEXT) {
            k->message = t->n[msg].val;
            k->message_len = t->n[msg].len;
        }
        int pl = ttlv_find(t, item, T_RESPONSE_PAYLOAD, -1);
        if (pl >= 0 && t->n[pl].type == TTLV_STRUCT)
            k->payload = pl;
        if (k->status == 0 && k->payload < 0) {
            /* Activate/Destroy/Revoke answer with a payload; tolerate none */
        }
        r->nitems++;
    }
    if (r->nitems == 0 || (uint32_t)r->nitems != count)
        goto bad;
    return 0;
bad:
    kresponse_free(r);
    return -1;
}

void kresponse_free(kresponse *r)
{
    ttree_free(&r->tree);
    if (r->owned != NULL) {
        OPENSSL_cleanse(r->owned, r->owned_len);
        free(r->owned);
        r->owned = NULL;
    }
    r->nitems = 0;
}

int kmip_payload_bytes(const kresponse *r, int node, uint32_t tag, const uint8_t **p, size_t *n)
{
    int i = ttlv_find(&r->tree, node, tag, -1);
    if (i < 0)
        return -1;
    const tnode *x = &r->tree.n[i];
    if (x->type != TTLV_BYTES && x->type != TTLV_TEXT)
        return -1;
    *p = x->val;
    *n = x->len;
    return 0;
}

int kmip_payload_u32(const kresponse *r, int node, uint32_t tag, uint32_t *out)
{
    return ttlv_child_u32(&r->tree, node, tag, out);
}

static int text_eq(const tnode *n, const char *s)
{
    size_t l = strlen(s);
    return n->type == TTLV_TEXT && n->len == l && memcmp(n->val, s, l) == 0;
}

/* Copies a Text String into dst (cap bytes incl. NUL); values longer than cap-1, or
 * with NUL or control bytes, are refused. */
static int copy_text(const tnode *n, char *dst, size_t cap)
{
    if (n->type != TTLV_TEXT || n->len >= cap)
        return -1;
    for (uint32_t i = 0; i < n->len; i++)
        if (n->val[i] < 0x20 || n->val[i] > 0x7e)
            return -1;
    memcpy(dst, n->val, n->len);
    dst[n->len] = '\0';
    return 0;
}

int kmip_parse_attributes(const kresponse *r, int payload, kattrs *a)
{
    const ttree *t = &r->tree;
    memset(a, 0, sizeof(*a));
    a->sensitive = 1;   /* absent (a server without the attribute): never read a value */
    int uid = ttlv_find(t, payload, T_UNIQUE_IDENTIFIER, -1);
    if (uid < 0 || copy_text(&t->n[uid], a->uid, sizeof(a->uid)) || a->uid[0] == '\0')
        return -1;
    int at = -1;
    while ((at = ttlv_find(t, payload, T_ATTRIBUTE, at)) >= 0) {
        int nm = ttlv_find(t, at, T_ATTRIBUTE_NAME, -1);
        int v = ttlv_find(t, at, T_ATTRIBUTE_VALUE, -1);
        if (nm < 0 || v < 0 || t->n[nm].type != TTLV_TEXT)
            return -1;
        const tnode *name = &t->n[nm];
        const tnode *val = &t->n[v];
        if (text_eq(name, "Object Type")) {
            if (ttlv_u32(t, v, &a->object_type)) return -1;
        } else if (text_eq(name, "Cryptographic Algorithm")) {
            if (ttlv_u32(t, v, &a->algorithm)) return -1;
        } else if (text_eq(name, "Cryptographic Length")) {
            if (ttlv_u32(t, v, &a->length)) return -1;
        } else if (text_eq(name, "Cryptographic Usage Mask")) {
            if (ttlv_u32(t, v, &a->usage_mask)) return -1;
        } else if (text_eq(name, "State")) {
            if (ttlv_u32(t, v, &a->state)) return -1;
        } else if (text_eq(name, "Sensitive")) {
            if (ttlv_bool(t, v, &a->sensitive)) return -1;
        } else if (text_eq(name, "Name")) {
            int nv = ttlv_find(t, v, T_NAME_VALUE, -1);
            if (nv < 0)
                return -1;
            if (a->name[0] == '\0' && copy_text(&t->n[nv], a->name, sizeof(a->name)))
                return -1;
        } else if (text_eq(name, "x-strongroom-linked-private-key")
                   || text_eq(name, "x-strongroom-linked-public-key")) {
            if (copy_text(val, a->linked, sizeof(a->linked))) return -1;
        } else if (text_eq(name, "x-strongroom-replacement-object")) {
            if (copy_text(val, a->replacement, sizeof(a->replacement))) return -1;
        } else if (text_eq(name, "x-strongroom-key-id")) {
            if (copy_text(val, a->key_id, sizeof(a->key_id))) return -1;
        } else if (text_eq(name, "x-strongroom-key-version")) {
            char tmp[24];
            int64_t ver = 0;
            if (copy_text(val, tmp, sizeof(tmp))) return -1;
            for (const char *c = tmp; *c; c++) {
                if (*c < '0' || *c > '9' || ver > 100000000)
                    return -1;
                ver = ver * 10 + (*c - '0');
            }
            a->key_version = ver;
        }
    }
    return 0;
}

int kmip_parse_key_material(const kresponse *r, int payload, const uint8_t **p, size_t *n,
                            uint32_t *format, int *wrapped)
{
    const ttree *t = &r->tree;
    int obj = -1;
    static const uint32_t kinds[] = { T_SYMMETRIC_KEY, T_PUBLIC_KEY, T_PRIVATE_KEY };
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]) && obj < 0; i++)
        obj = ttlv_find(t, payload, kinds[i], -1);
    if (obj < 0)
        return -1;
    int kb = ttlv_find(t, obj, T_KEY_BLOCK, -1);
    if (kb < 0)
        return -1;
    *format = 0;
    (void)ttlv_child_u32(t, kb, T_KEY_FORMAT_TYPE, format);
    *wrapped = ttlv_find(t, kb, T_KEY_WRAPPING_DATA, -1) >= 0;
    int kv = ttlv_find(t, kb, T_KEY_VALUE, -1);
    if (kv < 0)
        return -1;
    const tnode *x = &t->n[kv];
    if (x->type == TTLV_BYTES) {
        *p = x->val;
        *n = x->len;
        return 0;
    }
    int km = ttlv_find(t, kv, T_KEY_MATERIAL, -1);
    if (km < 0 || t->n[km].type != TTLV_BYTES)
        return -1;
    *p = t->n[km].val;
    *n = t->n[km].len;
    return 0;
}

unsigned long kmip_reason_to_ckr(uint32_t reason, int for_key_use)
{
    switch (reason) {
    case REASON_ITEM_NOT_FOUND:
        return for_key_use ? CKR_KEY_HANDLE_INVALID : CKR_OBJECT_HANDLE_INVALID;
    case REASON_PERMISSION_DENIED:
        return for_key_use ? CKR_KEY_FUNCTION_NOT_PERMITTED : CKR_ACTION_PROHIBITED;
    case REASON_ILLEGAL_OPERATION:
        return for_key_use ? CKR_KEY_FUNCTION_NOT_PERMITTED : CKR_ACTION_PROHIBITED;
    case REASON_AUTH:
        return CKR_USER_NOT_LOGGED_IN;
    case REASON_FEATURE_NOT_SUPPORTED:
    case REASON_OP_NOT_SUPPORTED:
    case REASON_KEY_FORMAT:
        return CKR_MECHANISM_INVALID;
    case REASON_INVALID_FIELD:
    case REASON_MISSING_DATA:
        return for_key_use ? CKR_MECHANISM_PARAM_INVALID : CKR_TEMPLATE_INCONSISTENT;
    case REASON_CRYPTO_FAILURE:
        return CKR_ENCRYPTED_DATA_INVALID;
    case REASON_RESPONSE_TOO_LARGE:
    case REASON_INVALID_MESSAGE:
        return CKR_DATA_LEN_RANGE;
    case REASON_OBJECT_EXISTS:
        return CKR_TEMPLATE_INCONSISTENT;
    default:
        return CKR_DEVICE_ERROR;
    }
}

const char *kmip_reason_name(uint32_t reason)
{
    switch (reason) {
    case REASON_ITEM_NOT_FOUND: return "Item Not Found";
    case REASON_RESPONSE_TOO_LARGE: return "Response Too Large";
    case REASON_AUTH: return "Authentication Not Successful";
    case REASON_INVALID_MESSAGE: return "Invalid Message";
    case REASON_OP_NOT_SUPPORTED: return "Operation Not Supported";
    case REASON_MISSING_DATA: return "Missing Data";
    case REASON_INVALID_FIELD: return "Invalid Field";
    case REASON_FEATURE_NOT_SUPPORTED: return "Feature Not Supported";
    case REASON_CRYPTO_FAILURE: return "Cryptographic Failure";
    case REASON_ILLEGAL_OPERATION: return "Illegal Operation";
    case REASON_PERMISSION_DENIED: return "Permission Denied";
    case REASON_KEY_FORMAT: return "Key Format Type Not Supported";
    case REASON_OBJECT_EXISTS: return "Object Already Exists";
    case REASON_GENERAL_FAILURE: return "General Failure";
    default: return "other";
    }
}
