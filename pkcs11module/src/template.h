/* Shared by key creation (p11_keys.c) and wrapping (p11_wrap.c): reading PKCS#11
 * templates, writing KMIP template attributes, adopting new server objects. */
#ifndef SR_TEMPLATE_H
#define SR_TEMPLATE_H

#include "module.h"

const CK_ATTRIBUTE *find_attr(const CK_ATTRIBUTE *t, CK_ULONG n, CK_ATTRIBUTE_TYPE type);
/* -1 absent, 0 false, 1 true, -2 malformed */
int attr_bool(const CK_ATTRIBUTE *t, CK_ULONG n, CK_ATTRIBUTE_TYPE type);
/* 0 found, -1 absent, -2 malformed */
int attr_ulong(const CK_ATTRIBUTE *t, CK_ULONG n, CK_ATTRIBUTE_TYPE type, CK_ULONG *out);
CK_RV attr_label(const CK_ATTRIBUTE *t, CK_ULONG n, char *out, size_t cap);
CK_RV common_checks(const CK_ATTRIBUTE *t, CK_ULONG n, int secret_or_private);

/* KMIP template attributes */
void kattr_enum(tbuf *p, const char *name, uint32_t v);
void kattr_int(tbuf *p, const char *name, int32_t v);
void kattr_name(tbuf *p, const char *label);
void kattr_bool(tbuf *p, const char *name, int v);
void kattr_sensitive(tbuf *p, const CK_ATTRIBUTE *t, CK_ULONG n);   /* KMIP Sensitive */
void kattr_activation(tbuf *p);

/* The objects a Create, CreateKeyPair or Register response names (`tags[i]` in its
 * payload, n <= 2) adopted into the session's slot, their handles out; those with
 * session_only[i] set belong to the session and go with it. Frees *r. */
CK_RV adopt_created(const sr_session *s, kresponse *r, int n, const uint32_t tags[],
                    const int session_only[], CK_OBJECT_HANDLE *out);
/* The session to create objects in, locked (session_put it); NULL with *rv set. */
sr_session *rw_session(CK_SESSION_HANDLE h, CK_RV *rv, int token);

#endif
