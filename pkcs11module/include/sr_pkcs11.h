/* The OASIS PKCS#11 v2.40 interface, from the system's copy: p11-kit's pkcs11.h
 * (Debian libp11-kit-dev, found through `pkg-config --cflags p11-kit-1`), in its
 * default "compatibility" spelling (CK_ULONG, CK_GCM_PARAMS, pIv, ...). Nothing of
 * p11-kit itself is linked: only the header is used. */
#ifndef SR_PKCS11_H
#define SR_PKCS11_H

/* the C_* entry points it declares are the module's only exported symbols (the rest
 * is built with -fvisibility=hidden; src/exports.map says the same to the linker) */
#pragma GCC visibility push(default)
#include <p11-kit/pkcs11.h>
#pragma GCC visibility pop

#ifndef CKM_AES_KEY_WRAP_PAD
#define CKM_AES_KEY_WRAP_PAD 0x210aUL
#endif

#endif
