/* PKCS#11 templates in, KMIP template attributes out, new objects adopted. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "template.h"

const CK_ATTRIBUTE *find_attr(const CK_ATTRIBUTE *t, CK_ULONG n, CK_ATTRIBUTE_TYPE type)
{
    for (CK_ULONG i = 0; t && i < n; i++)
        if (t[i].type == type)
            return &t[i];
    return NULL;
}

/* -1 absent, 0 false, 1 true, -2 malformed */
int attr_bool(const CK_ATTRIBUTE *t, CK_ULONG n, CK_ATTRIBUTE_TYPE type)
{
    const CK_ATTRIBUTE *a = find_attr(t, n, type);
    if (a == NULL)
        return -1;
    if (a->pValue == NULL || a->ulValueLen != sizeof(CK_BBOOL))
        return -2;
    return *(CK_BBOOL *)a->pValue ? 1 : 0;
}

int attr_ulong(const CK_ATTRIBUTE *t, CK_ULONG n, CK_ATTRIBUTE_TYPE type, CK_ULONG *out)
{
    const CK_ATTRIBUTE *a = find_attr(t, n, type);
    if (a == NULL)
        return -1;
    if (a->pValue == NULL || a->ulValueLen != sizeof(CK_ULONG))
        return -2;
    *out = *(CK_ULONG *)a->pValue;
    return 0;
}

/* A label: 1-128 printable ASCII characters (Strongroom's name rule), or none. */
CK_RV attr_label(const CK_ATTRIBUTE *t, CK_ULONG n, char *out, size_t cap)
{
    const CK_ATTRIBUTE *a = find_attr(t, n, CKA_LABEL);
    out[0] = '\0';
    if (a == NULL || a->ulValueLen == 0)
        return CKR_OK;   /* no label: the server names it kmip-<random> */
    if (a->ulValueLen >= cap || a->pValue == NULL)
        return CKR_ATTRIBUTE_VALUE_INVALID;
    const unsigned char *p = a->pValue;
    for (CK_ULONG i = 0; i < a->ulValueLen; i++)
        if (p[i] < 0x20 || p[i] > 0x7e)
            return CKR_ATTRIBUTE_VALUE_INVALID;
    memcpy(out, p, a->ulValueLen);
    out[a->ulValueLen] = '\0';
    return CKR_OK;
}

/* Attributes every key the module creates must accept as they are: not modifiable. CKA_TOKEN false (a session object, as Java's key generators ask) is a
 * key created at the server like any other and destroyed there when its session ends.
 * CKA_ID is the server's identifier: a requested one is ignored (see README). */
CK_RV common_checks(const CK_ATTRIBUTE *t, CK_ULONG n, int secret_or_private)
{
    (void)secret_or_private;
    static const CK_ATTRIBUTE_TYPE bools[] = { CKA_TOKEN, CKA_SENSITIVE, CKA_MODIFIABLE,
        CKA_PRIVATE, CKA_EXTRACTABLE, CKA_ENCRYPT, CKA_DECRYPT, CKA_SIGN, CKA_VERIFY,
        CKA_WRAP, CKA_UNWRAP, CKA_DERIVE };
    for (size_t i = 0; i < sizeof(bools) / sizeof(bools[0]); i++)
        if (attr_bool(t, n, bools[i]) == -2)
            return CKR_ATTRIBUTE_VALUE_INVALID;
    /* CKA_SENSITIVE (secret keys): the key's export policy (kattr_sensitive); absent
     * means sensitive. CKA_EXTRACTABLE is not a policy of the server's: AES keys are
     * wrapped in its HSM for an identity with the right, HMAC keys never. */
    if (find_attr(t, n, CKA_VALUE) != NULL)
        return CKR_ATTRIBUTE_READ_ONLY;
    return CKR_OK;
}

void kattr_enum(tbuf *p, const char *name, uint32_t v)
{
    tb_begin(p, T_ATTRIBUTE);
    tb_text(p, T_ATTRIBUTE_NAME, name, strlen(name));
    tb_enum(p, T_ATTRIBUTE_VALUE, v);
    tb_end(p);
}

void kattr_int(tbuf *p, const char *name, int32_t v)
{
    tb_begin(p, T_ATTRIBUTE);
    tb_text(p, T_ATTRIBUTE_NAME, name, strlen(name));
    tb_int(p, T_ATTRIBUTE_VALUE, v);
    tb_end(p);
}

void kattr_bool(tbuf *p, const char *name, int v)
{
    tb_begin(p, T_ATTRIBUTE);
    tb_text(p, T_ATTRIBUTE_NAME, name, strlen(name));
    tb_bool(p, T_ATTRIBUTE_VALUE, v);
    tb_end(p);
}

void kattr_sensitive(tbuf *p, const CK_ATTRIBUTE *t, CK_ULONG n)
{
    /* the export policy of the new key: not exportable in plaintext unless the
     * template says CKA_SENSITIVE false */
    kattr_bool(p, "Sensitive", attr_bool(t, n, CKA_SENSITIVE) != 0);
}

void kattr_name(tbuf *p, const char *label)
{
    if (label[0] == '\0')
        return;
    tb_begin(p, T_ATTRIBUTE);
    tb_text(p, T_ATTRIBUTE_NAME, "Name", 4);
    tb_begin(p, T_ATTRIBUTE_VALUE);
    tb_text(p, T_NAME_VALUE, label, strlen(label));
    tb_enum(p, T_NAME_TYPE, 1);
    tb_end(p);
    tb_end(p);
}

void kattr_activation(tbuf *p)
{
    tb_begin(p, T_ATTRIBUTE);
    tb_text(p, T_ATTRIBUTE_NAME, "Activation Date", 15);
    tb_datetime(p, T_ATTRIBUTE_VALUE, (int64_t)time(NULL) - 1);
    tb_end(p);
}

/* GetAttributes of the new objects, added to the cache; their handles out. */
/* GetAttributes of new server objects, added to the cache; their handles out (n <= 2). */
static CK_RV adopt(CK_SLOT_ID slot, int n, char uids[][KMIP_UID_MAX + 1], CK_OBJECT_HANDLE *out)
{
    tbuf pl[2];
    uint32_t ops[2] = { OP_GET_ATTRIBUTES, OP_GET_ATTRIBUTES };
    if (n < 1 || n > 2)
        return CKR_GENERAL_ERROR;
    memset(pl, 0, sizeof(pl));
    for (int i = 0; i < n; i++) {
        tb_init(&pl[i]);
        tb_begin(&pl[i], T_REQUEST_PAYLOAD);
        tb_text(&pl[i], T_UNIQUE_IDENTIFIER, uids[i], strlen(uids[i]));
        tb_end(&pl[i]);
    }
    kresponse r;
    CK_RV rv = kmip_call(&g.slots[slot], n, ops, pl, &r);
    for (int i = 0; i < n; i++)
        tb_free(&pl[i]);
    if (rv != CKR_OK)
        return rv;
    for (int i = 0; i < n && rv == CKR_OK; i++) {
        kattrs a;
        if (i >= r.nitems || r.items[i].status != 0 || r.items[i].payload < 0
            || kmip_parse_attributes(&r, r.items[i].payload, &a)) {
            rv = CKR_DEVICE_ERROR;
            break;
        }
        pthread_mutex_lock(&g.lock);
        sr_object *o = object_add(slot, &a);
        if (o)
            out[i] = o->handle;
        pthread_mutex_unlock(&g.lock);
        if (o == NULL)
            rv = CKR_DEVICE_ERROR;
    }
    kresponse_free(&r);
    return rv;
}

static void set_owner(CK_SLOT_ID slot, CK_OBJECT_HANDLE h, CK_SESSION_HANDLE owner)
{
    pthread_mutex_lock(&g.lock);
    sr_object *o = object_get(slot, h);
    if (o != NULL)
        o->owner = owner;
    pthread_mutex_unlock(&g.lock);
}

CK_RV adopt_created(const sr_session *s, kresponse *r, int n, const uint32_t tags[],
                    const int session_only[], CK_OBJECT_HANDLE *out)
{
    char uids[2][KMIP_UID_MAX + 1];
    CK_RV rv = n < 1 || n > 2 ? CKR_GENERAL_ERROR : CKR_OK;
    for (int i = 0; i < n && rv == CKR_OK; i++) {
        const uint8_t *u;
        size_t un;
        /* a server that answers without a usable identifier made something we cannot name */
        if (r->items[0].payload < 0 || kmip_payload_bytes(r, r->items[0].payload, tags[i], &u, &un)
            || un == 0 || un > KMIP_UID_MAX) {
            rv = CKR_DEVICE_ERROR;
        } else {
            memcpy(uids[i], u, un);
            uids[i][un] = '\0';
        }
    }
    kresponse_free(r);
    if (rv == CKR_OK)
        rv = adopt(s->slot, n, uids, out);
    for (int i = 0; i < n && rv == CKR_OK; i++)
        if (session_only[i])
            set_owner(s->slot, out[i], s->handle);
    return rv;
}

/* The session to create objects in: a token object needs a read/write session. */
sr_session *rw_session(CK_SESSION_HANDLE h, CK_RV *rv, int token)
{
    sr_session *s = session_get(h);
    if (s == NULL) {
        *rv = CKR_SESSION_HANDLE_INVALID;
        return NULL;
    }
    if (token && !(s->flags & CKF_RW_SESSION)) {
        session_put(s);
        *rv = CKR_SESSION_READ_ONLY;
        return NULL;
    }
    if (g.slots[s->slot].ctx == NULL) {
        session_put(s);
        *rv = CKR_USER_NOT_LOGGED_IN;
        return NULL;
    }
    if (s->op.kind != OP_NONE) {
        session_put(s);
        *rv = CKR_OPERATION_ACTIVE;
        return NULL;
    }
    return s;
}
