/* Objects: the KMIP objects the identity may use (Locate + GetAttributes, cached),
 * search, and destruction. Their attributes: attributes.c. */
#include <stdlib.h>
#include <string.h>
#include <time.h>


#include "module.h"

#define CHECK_INIT() do { if (!g.initialized) return CKR_CRYPTOKI_NOT_INITIALIZED; } while (0)
#define LOCATE_MAX 4096

static int classify(const kattrs *a, CK_OBJECT_CLASS *cls, CK_KEY_TYPE *kt)
{
    switch (a->object_type) {
    case OT_SYMMETRIC:
        *cls = CKO_SECRET_KEY;
        if (a->algorithm == ALG_AES)
            *kt = CKK_AES;
        else if (a->algorithm == ALG_HMAC_SHA256 || a->algorithm == ALG_HMAC_SHA384
                 || a->algorithm == ALG_HMAC_SHA512)
            *kt = CKK_GENERIC_SECRET;
        else
            return -1;
        return 0;
    case OT_PUBLIC:
    case OT_PRIVATE:
        *cls = a->object_type == OT_PUBLIC ? CKO_PUBLIC_KEY : CKO_PRIVATE_KEY;
        if (a->algorithm == ALG_RSA)
            *kt = CKK_RSA;
        else if (a->algorithm == ALG_EC || a->algorithm == ALG_ECDSA)
            *kt = CKK_EC;
        else
            return -1;
        return 0;
    default:
        return -1;
    }
}

sr_object *object_get(CK_SLOT_ID slot, CK_OBJECT_HANDLE h)
{
    for (sr_object *o = g.objects; o != NULL; o = o->next)
        if (o->handle == h && o->slot == slot && o->present)
            return o;
    return NULL;
}

sr_object *object_add(CK_SLOT_ID slot, const kattrs *a)
{
    CK_OBJECT_CLASS cls;
    CK_KEY_TYPE kt;
    if (classify(a, &cls, &kt))
        return NULL;
    sr_object *o = NULL;
    for (sr_object *x = g.objects; x != NULL; x = x->next)
        if (x->slot == slot && strcmp(x->a.uid, a->uid) == 0) {
            o = x;
            break;
        }
    if (o == NULL) {
        o = calloc(1, sizeof(*o));
        if (o == NULL)
            return NULL;
        o->handle = g.next_object++;
        o->slot = slot;
        o->next = g.objects;
        g.objects = o;
    }
    o->cls = cls;
    o->key_type = kt;
    o->a = *a;
    o->present = !o->destroyed;
    o->fetched = time(NULL);
    o->gen = ++g.obj_gen;
    /* a replaced version, or one no longer Active, is kept for decryption and
     * verification only */
    o->current = a->replacement[0] == '\0' && a->state != STATE_DEACTIVATED
                 && a->state != STATE_COMPROMISED;
    return o;
}

/* One Locate payload: objects of `type`, Active ones only when `active`. */
static void locate_payload(tbuf *p, uint32_t type, int active)
{
    tb_init(p);
    tb_begin(p, T_REQUEST_PAYLOAD);
    tb_int(p, T_MAXIMUM_ITEMS, LOCATE_MAX);
    tb_begin(p, T_ATTRIBUTE);
    tb_text(p, T_ATTRIBUTE_NAME, "Object Type", 11);
    tb_enum(p, T_ATTRIBUTE_VALUE, type);
    tb_end(p);
    if (active) {
        tb_begin(p, T_ATTRIBUTE);
        tb_text(p, T_ATTRIBUTE_NAME, "State", 5);
        tb_enum(p, T_ATTRIBUTE_VALUE, STATE_ACTIVE);
        tb_end(p);
    }
    tb_end(p);
}

typedef char uid_t_[KMIP_UID_MAX + 1];

typedef struct {
    uid_t_ *v;
    int n, cap;
} uid_list;

static int uids_push(uid_list *l, const tnode *x)
{
    if (x->type != TTLV_TEXT || x->len == 0 || x->len > KMIP_UID_MAX)
        return 0;   /* not an identifier this module can name: skipped */
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        uid_t_ *v = realloc(l->v, (size_t)cap * sizeof(*v));
        if (v == NULL)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    memcpy(l->v[l->n], x->val, x->len);
    l->v[l->n][x->len] = '\0';
    l->n++;
    return 0;
}

static int uids_has(const uid_list *l, const char *u)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->v[i], u) == 0)
            return 1;
    return 0;
}

/* Every object of the three key types, in the server's order (symmetric keys by name,
 * newest version first), and which of them are Active: one message of six Locates. */
static CK_RV locate_all(sr_slot *s, uid_list *all, uid_list *active)
{
    static const uint32_t types[] = { OT_SYMMETRIC, OT_PUBLIC, OT_PRIVATE };
    tbuf pl[6];
    uint32_t ops[6];
    for (int i = 0; i < 6; i++) {
        locate_payload(&pl[i], types[i / 2], i % 2);
        ops[i] = OP_LOCATE;
    }
    kresponse r;
    CK_RV rv = kmip_call(s, 6, ops, pl, &r);
    for (int i = 0; i < 6; i++)
        tb_free(&pl[i]);
    if (rv != CKR_OK)
        return rv;
    for (int i = 0; i < r.nitems && rv == CKR_OK; i++) {
        kitem *it = &r.items[i];
        if (it->status != 0) {
            rv = kmip_reason_to_ckr(it->reason, 0);
            break;
        }
        int x = -1;
        while (it->payload >= 0 && (x = ttlv_find(&r.tree, it->payload, T_UNIQUE_IDENTIFIER, x)) >= 0)
            if (uids_push(i % 2 ? active : all, &r.tree.n[x])) {
                rv = CKR_HOST_MEMORY;
                break;
            }
    }
    if (rv == CKR_OK && r.nitems != 6)
        rv = CKR_DEVICE_ERROR;
    kresponse_free(&r);
    return rv;
}

#define ATTR_BATCH 32
#define ATTR_TTL 60     /* seconds an object's attributes are trusted without a change seen */

static sr_object *find_uid(CK_SLOT_ID slot, const char *uid)
{
    for (sr_object *o = g.objects; o; o = o->next)
        if (o->slot == slot && strcmp(o->a.uid, uid) == 0)
            return o;
    return NULL;
}

/* A managed key's versions share x-strongroom-key-id: only the newest one present
 * protects (encrypts, wraps); the others decrypt. Also applied when a version's own
 * attributes predate its replacement. */
static void mark_current(CK_SLOT_ID slot)
{
    for (sr_object *o = g.objects; o; o = o->next) {
        if (o->slot != slot || !o->present)
            continue;
        o->current = o->a.replacement[0] == '\0' && o->a.state != STATE_DEACTIVATED
                     && o->a.state != STATE_COMPROMISED;
        if (!o->current || o->cls != CKO_SECRET_KEY || o->a.key_id[0] == '\0')
            continue;
        for (sr_object *x = g.objects; x; x = x->next)
            if (x != o && x->slot == slot && x->present && x->cls == CKO_SECRET_KEY
                && strcmp(x->a.key_id, o->a.key_id) == 0 && x->a.key_version > o->a.key_version) {
                o->current = 0;
                break;
            }
    }
}

/* Refreshes the slot's objects: Locate (one round trip), then GetAttributes (batched)
 * of the objects not seen before, whose Active state changed, or last read more than
 * ATTR_TTL seconds ago. */
CK_RV objects_refresh(CK_SLOT_ID slot)
{
    sr_slot *s = &g.slots[slot];
    uid_list all = { 0 }, active = { 0 }, need = { 0 };
    kattrs *got = NULL;
    int ngot = 0;
    pthread_mutex_lock(&g.lock);
    unsigned long start = g.obj_gen;   /* objects added after this stay as they are */
    pthread_mutex_unlock(&g.lock);
    CK_RV rv = locate_all(s, &all, &active);
    time_t now = time(NULL);
    if (rv == CKR_OK) {
        pthread_mutex_lock(&g.lock);
        for (int i = 0; i < all.n && rv == CKR_OK; i++) {
            sr_object *o = find_uid(slot, all.v[i]);
            int is_active = uids_has(&active, all.v[i]);
            if (o != NULL && now - o->fetched < ATTR_TTL && (o->a.state == STATE_ACTIVE) == is_active)
                continue;
            tnode fake = { .type = TTLV_TEXT, .len = (uint32_t)strlen(all.v[i]),
                           .val = (const uint8_t *)all.v[i] };
            if (uids_push(&need, &fake))
                rv = CKR_HOST_MEMORY;
        }
        pthread_mutex_unlock(&g.lock);
    }
    if (rv == CKR_OK && need.n > 0) {
        got = calloc((size_t)need.n, sizeof(*got));
        if (got == NULL)
            rv = CKR_HOST_MEMORY;
    }
    for (int base = 0; rv == CKR_OK && base < need.n; base += ATTR_BATCH) {
        int m = need.n - base < ATTR_BATCH ? need.n - base : ATTR_BATCH;
        tbuf pl[ATTR_BATCH];
        uint32_t ops[ATTR_BATCH];
        for (int j = 0; j < m; j++) {
            tb_init(&pl[j]);
            tb_begin(&pl[j], T_REQUEST_PAYLOAD);
            tb_text(&pl[j], T_UNIQUE_IDENTIFIER, need.v[base + j], strlen(need.v[base + j]));
            tb_end(&pl[j]);
            ops[j] = OP_GET_ATTRIBUTES;
        }
        kresponse r;
        rv = kmip_call(s, m, ops, pl, &r);
        for (int j = 0; j < m; j++)
            tb_free(&pl[j]);
        if (rv != CKR_OK)
            break;
        for (int j = 0; j < r.nitems && ngot < need.n; j++) {
            /* an object destroyed between Locate and GetAttributes is skipped */
            if (r.items[j].status != 0 || r.items[j].payload < 0)
                continue;
            if (kmip_parse_attributes(&r, r.items[j].payload, &got[ngot]) == 0)
                ngot++;
        }
        kresponse_free(&r);
    }
    if (rv == CKR_OK) {
        pthread_mutex_lock(&g.lock);
        for (sr_object *o = g.objects; o; o = o->next)
            if (o->slot == slot && o->gen <= start)
                o->present = 0;
        for (int i = 0; i < ngot; i++)
            (void)object_add(slot, &got[i]);
        /* present = what Locate found (and we could read), in Locate's order: the
         * objects are re-linked to the head of the list in that order */
        sr_object **seen = calloc(all.n ? (size_t)all.n : 1, sizeof(*seen));
        int nseen = 0;
        for (int i = all.n - 1; seen != NULL && i >= 0; i--) {
            sr_object *o = find_uid(slot, all.v[i]);
            if (o == NULL || o->fetched == 0 || o->destroyed)
                continue;
            o->present = 1;
            seen[nseen++] = o;
        }
        for (int i = 0; i < nseen; i++) {   /* back to front: the first ends at the head */
            sr_object **pp = &g.objects;
            while (*pp != seen[i])
                pp = &(*pp)->next;
            *pp = seen[i]->next;
            seen[i]->next = g.objects;
            g.objects = seen[i];
        }
        free(seen);
        mark_current(slot);
        pthread_mutex_unlock(&g.lock);
    }
    free(got);
    free(all.v);
    free(active.v);
    free(need.v);
    return rv;
}

/* ---------------------------------------------------------------- search */

CK_RV C_FindObjectsInit(CK_SESSION_HANDLE hSession, CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulCount)
{
    CHECK_INIT();
    if (pTemplate == NULL && ulCount > 0)
        return CKR_ARGUMENTS_BAD;
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    if (s->finding || s->op.kind != OP_NONE) {
        session_put(s);
        return CKR_OPERATION_ACTIVE;
    }
    sr_slot *sl = &g.slots[s->slot];
    CK_RV rv = CKR_OK;
    int can = sl->ctx != NULL;   /* an encrypted key not yet unlocked: no objects visible */
    if (can)
        rv = objects_refresh(s->slot);
    if (rv != CKR_OK) {
        session_put(s);
        return rv;
    }
    int want_pub = 0;
    for (CK_ULONG i = 0; i < ulCount; i++)
        want_pub |= attr_needs_public(pTemplate[i].type);
    if (want_pub && can) {
        /* load the details of candidate asymmetric keys (network, outside g.lock:
         * objects are never freed before C_Finalize) */
        for (;;) {
            sr_object *todo = NULL;
            pthread_mutex_lock(&g.lock);
            for (sr_object *o = g.objects; o; o = o->next)
                if (o->slot == s->slot && o->present && !o->pub_loaded && o->cls != CKO_SECRET_KEY
                    && (o->cls == CKO_PUBLIC_KEY || o->a.linked[0])) {
                    todo = o;
                    break;
                }
            pthread_mutex_unlock(&g.lock);
            if (todo == NULL)
                break;
            if (object_load_public(sl, todo) != CKR_OK) {
                pthread_mutex_lock(&g.lock);
                todo->pub_loaded = 1;   /* nothing to show; don't retry in this loop */
                pthread_mutex_unlock(&g.lock);
            }
        }
    }
    pthread_mutex_lock(&g.lock);
    CK_ULONG n = 0;
    for (sr_object *o = g.objects; o; o = o->next)
        n++;
    free(s->found);
    s->found = calloc(n ? n : 1, sizeof(CK_OBJECT_HANDLE));
    s->nfound = s->found_pos = 0;
    if (s->found == NULL) {
        pthread_mutex_unlock(&g.lock);
        session_put(s);
        return CKR_HOST_MEMORY;
    }
    if (can)
        for (sr_object *o = g.objects; o; o = o->next)
            if (o->slot == s->slot && o->present && object_matches(o, pTemplate, ulCount))
                s->found[s->nfound++] = o->handle;
    pthread_mutex_unlock(&g.lock);
    s->finding = 1;
    session_put(s);
    return CKR_OK;
}

CK_RV C_FindObjects(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE_PTR phObject,
                    CK_ULONG ulMaxObjectCount, CK_ULONG_PTR pulObjectCount)
{
    CHECK_INIT();
    if (phObject == NULL || pulObjectCount == NULL)
        return CKR_ARGUMENTS_BAD;
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    if (!s->finding) {
        session_put(s);
        return CKR_OPERATION_NOT_INITIALIZED;
    }
    CK_ULONG k = 0;
    while (k < ulMaxObjectCount && s->found_pos < s->nfound)
        phObject[k++] = s->found[s->found_pos++];
    *pulObjectCount = k;
    session_put(s);
    return CKR_OK;
}

CK_RV C_FindObjectsFinal(CK_SESSION_HANDLE hSession)
{
    CHECK_INIT();
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    if (!s->finding) {
        session_put(s);
        return CKR_OPERATION_NOT_INITIALIZED;
    }
    free(s->found);
    s->found = NULL;
    s->nfound = s->found_pos = 0;
    s->finding = 0;
    session_put(s);
    return CKR_OK;
}

/* ---------------------------------------------------------------- create, copy, destroy */

CK_RV C_CreateObject(CK_SESSION_HANDLE hSession, CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulCount,
                     CK_OBJECT_HANDLE_PTR phObject)
{
    (void)hSession; (void)pTemplate; (void)ulCount; (void)phObject;
    CHECK_INIT();
    return CKR_FUNCTION_NOT_SUPPORTED;
}

CK_RV C_CopyObject(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE hObject, CK_ATTRIBUTE_PTR pTemplate,
                   CK_ULONG ulCount, CK_OBJECT_HANDLE_PTR phNewObject)
{
    (void)hSession; (void)hObject; (void)pTemplate; (void)ulCount; (void)phNewObject;
    CHECK_INIT();
    return CKR_FUNCTION_NOT_SUPPORTED;
}

static CK_RV uid_op(sr_slot *s, uint32_t op, const char *uid, kresponse *r, int revoke)
{
    tbuf p;
    tb_init(&p);
    tb_begin(&p, T_REQUEST_PAYLOAD);
    tb_text(&p, T_UNIQUE_IDENTIFIER, uid, strlen(uid));
    if (revoke) {
        tb_begin(&p, T_REVOCATION_REASON);
        tb_enum(&p, T_REVOCATION_CODE, 6);   /* Cessation of Operation */
        tb_end(&p);
    }
    tb_end(&p);
    CK_RV rv = kmip_one(s, op, &p, r, 0);
    tb_free(&p);
    return rv;
}

/* Revoke (when Active or Pre-Active), then Destroy. Revoking a symmetric key revokes
 * the whole managed key (every version), as Strongroom's Revoke does. */
CK_RV object_destroy_remote(CK_SLOT_ID slot, sr_object *o)
{
    pthread_mutex_lock(&g.lock);
    char uid[KMIP_UID_MAX + 1];
    memcpy(uid, o->a.uid, sizeof(uid));
    uint32_t state = o->a.state;
    pthread_mutex_unlock(&g.lock);
    sr_slot *sl = &g.slots[slot];
    kresponse r;
    CK_RV rv = CKR_OK;
    if (state == STATE_ACTIVE || state == STATE_PRE_ACTIVE) {
        rv = uid_op(sl, OP_REVOKE, uid, &r, 1);
        if (rv == CKR_OK)
            kresponse_free(&r);
    }
    if (rv == CKR_OK) {
        rv = uid_op(sl, OP_DESTROY, uid, &r, 0);
        if (rv == CKR_OK)
            kresponse_free(&r);
    }
    if (rv == CKR_OK) {
        pthread_mutex_lock(&g.lock);
        o->present = 0;
        o->destroyed = 1;
        pthread_mutex_unlock(&g.lock);
    }
    return rv;
}

void objects_drop_session(CK_SLOT_ID slot, CK_SESSION_HANDLE owner)
{
    for (;;) {
        sr_object *todo = NULL;
        pthread_mutex_lock(&g.lock);
        for (sr_object *o = g.objects; o; o = o->next)
            if (o->slot == slot && o->present && (owner == 0 ? o->owner != 0 : o->owner == owner)) {
                todo = o;
                break;
            }
        if (todo != NULL)
            todo->owner = 0;   /* tried once, whatever the outcome */
        pthread_mutex_unlock(&g.lock);
        if (todo == NULL)
            return;
        if (object_destroy_remote(slot, todo) != CKR_OK)
            sr_log("slot '%s': a session object (%s) could not be destroyed at the server",
                   g.slots[slot].label, todo->a.uid);
    }
}

CK_RV C_DestroyObject(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE hObject)
{
    CHECK_INIT();
    sr_session *s = session_get(hSession);
    if (s == NULL)
        return CKR_SESSION_HANDLE_INVALID;
    CK_SLOT_ID slot = s->slot;
    pthread_mutex_lock(&g.lock);
    sr_object *o = object_get(slot, hObject);
    int token = o ? o->owner == 0 : 0;
    pthread_mutex_unlock(&g.lock);
    CK_RV rv;
    if (o == NULL)
        rv = CKR_OBJECT_HANDLE_INVALID;
    else if (token && !(s->flags & CKF_RW_SESSION))
        rv = CKR_SESSION_READ_ONLY;
    else
        rv = object_destroy_remote(slot, o);
    session_put(s);
    return rv;
}
