/* The LUKS2 side of strongroom-volume (luks.c): header, checks, volume key, geometry. */
#ifndef SV_LUKS_H
#define SV_LUKS_H

#include <stddef.h>

#include "volume_io.h"

/* What went wrong, as main's exit codes (README.md). */
enum {
	SV_LUKS_OK = 0,
	SV_LUKS_PASSPHRASE = 2,  /* no keyslot accepts the passphrase */
	SV_LUKS_CONTAINER = 3,   /* not LUKS2, unreadable, too short */
	SV_LUKS_UNSUPPORTED = 4, /* LUKS2, but not a volume this program serves */
};

/* Load the LUKS2 header of the container open on `fd`, refuse what the I/O core cannot
 * serve exactly as dm-crypt would, then unlock the volume key with the passphrase into
 * `key` (VIO_KEY_SIZE bytes of the caller's locked memory) and describe the data segment
 * in `g`. On failure `why` holds one line (no key, no passphrase) saying what to do. */
int sv_luks_unlock(int fd, const unsigned char *pass, size_t pass_len, unsigned char key[VIO_KEY_SIZE],
		   struct vio_geometry *g, char *why, size_t why_len);

#endif
