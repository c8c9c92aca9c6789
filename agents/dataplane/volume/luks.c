/* LUKS2 through libcryptsetup: the header is parsed, checked and the keyslot unlocked by
 * cryptsetup's own code; this file only decides what the I/O core can serve. */
#define _GNU_SOURCE
#include "luks.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <libcryptsetup.h>
#include <linux/fs.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

/* libcryptsetup's own messages would be a second, differently worded report on stderr
 * (and may name keyslots): the caller prints one line instead. */
static void quiet(int level, const char *msg, void *usrptr)
{
	(void)level;
	(void)msg;
	(void)usrptr;
}

static int fail(int code, char *why, size_t why_len, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, why_len, fmt, ap);
	va_end(ap);
	return code;
}

/* Header strings are the container's, not ours: printable ASCII only, and short. */
static const char *shown(const char *s, char *out, size_t len)
{
	size_t i = 0;
	for (; s && s[i] && i + 1 < len; i++)
		out[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
	out[i] = 0;
	return s ? out : "(none)";
}

static const char *json_str(json_object *o, const char *key)
{
	json_object *v;
	return json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_string)
		       ? json_object_get_string(v)
		       : NULL;
}

static int parse_u64(const char *s, uint64_t *out)
{
	if (!s || !*s)
		return -1;
	uint64_t v = 0;
	for (; *s; s++) {
		if (*s < '0' || *s > '9' || v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return -1;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return 0;
}

/* What the library's getters do not say: how many segments there are, whether the one
 * segment has a fixed size, flags, or an integrity section, and whether the header sets
 * requirements this program does not know. Read from the header's JSON as cryptsetup
 * parsed and validated it. *fixed is 0 for a "dynamic" segment. */
static int check_metadata(struct crypt_device *cd, uint64_t offset, uint64_t *fixed, char *why, size_t why_len)
{
	const char *text = NULL;
	if (crypt_dump_json(cd, &text, 0) < 0 || !text)
		return fail(SV_LUKS_CONTAINER, why, why_len,
			    "cannot read the LUKS2 metadata: check the header with cryptsetup luksDump");
	json_object *root = json_tokener_parse(text), *segments, *seg = NULL, *o;
	int r = SV_LUKS_UNSUPPORTED;
	if (!root || !json_object_object_get_ex(root, "segments", &segments) ||
	    !json_object_is_type(segments, json_type_object)) {
		r = fail(SV_LUKS_CONTAINER, why, why_len, "the LUKS2 metadata has no segments: check it with cryptsetup luksDump");
		goto out;
	}
	if (json_object_object_length(segments) != 1 || !json_object_object_get_ex(segments, "0", &seg) ||
	    !json_object_is_type(seg, json_type_object)) {
		r = fail(r, why, why_len,
			 "the volume has %d data segments, not one (an unfinished reencryption?): finish it with "
			 "cryptsetup reencrypt --resume-only",
			 json_object_object_length(segments));
		goto out;
	}
	const char *type = json_str(seg, "type"), *size = json_str(seg, "size"), *off = json_str(seg, "offset");
	char buf[40];
	uint64_t seg_offset;
	if (!type || strcmp(type, "crypt")) {
		r = fail(r, why, why_len, "the data segment is of type %s, not crypt: serve it with cryptsetup instead",
			 shown(type, buf, sizeof(buf)));
		goto out;
	}
	if (json_object_object_get_ex(seg, "integrity", &o)) {
		r = fail(r, why, why_len,
			 "the volume uses dm-integrity (authenticated encryption): serve it with cryptsetup on a "
			 "machine with device-mapper");
		goto out;
	}
	if (json_object_object_get_ex(seg, "flags", &o) &&
	    (!json_object_is_type(o, json_type_array) || json_object_array_length(o) != 0)) {
		r = fail(r, why, why_len, "the data segment carries flags (reencryption?): check it with cryptsetup luksDump");
		goto out;
	}
	if (parse_u64(off, &seg_offset) || seg_offset != offset) {
		r = fail(SV_LUKS_CONTAINER, why, why_len, "the LUKS2 segment offset is inconsistent: check it with cryptsetup luksDump");
		goto out;
	}
	if (size && !strcmp(size, "dynamic"))
		*fixed = 0;
	else if (parse_u64(size, fixed) || *fixed == 0) {
		r = fail(SV_LUKS_CONTAINER, why, why_len, "the LUKS2 segment size is invalid: check it with cryptsetup luksDump");
		goto out;
	}
	json_object *config, *req, *mandatory;
	if (json_object_object_get_ex(root, "config", &config) &&
	    json_object_object_get_ex(config, "requirements", &req) &&
	    json_object_object_get_ex(req, "mandatory", &mandatory) &&
	    (!json_object_is_type(mandatory, json_type_array) || json_object_array_length(mandatory) != 0)) {
		r = fail(r, why, why_len,
			 "the volume sets LUKS2 requirements (an unfinished reencryption?): finish it with "
			 "cryptsetup reencrypt --resume-only, or check cryptsetup luksDump");
		goto out;
	}
	r = SV_LUKS_OK;
out:
	json_object_put(root);
	return r;
}

static int container_size(int fd, uint64_t *size)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		return -1;
	if (S_ISBLK(st.st_mode))
		return ioctl(fd, BLKGETSIZE64, size) < 0 ? -1 : 0;
	if (!S_ISREG(st.st_mode) || st.st_size < 0)
		return -1;
	*size = (uint64_t)st.st_size;
	return 0;
}

static int unlock(struct crypt_device *cd, int fd, const unsigned char *pass, size_t pass_len,
		  unsigned char key[VIO_KEY_SIZE], struct vio_geometry *g, char *why, size_t why_len)
{
	char a[40], b[40];
	/* One reencryption state is enough to refuse: the segments are then in flux, part
	 * under one key and part under another. */
	crypt_reencrypt_info re = crypt_reencrypt_status(cd, NULL);
	if (re == CRYPT_REENCRYPT_CRASH)
		return fail(SV_LUKS_UNSUPPORTED, why, why_len,
			    "a LUKS2 reencryption was interrupted: recover it with cryptsetup reencrypt --resume-only");
	if (re != CRYPT_REENCRYPT_NONE)
		return fail(SV_LUKS_UNSUPPORTED, why, why_len,
			    "a LUKS2 reencryption is in progress: finish it with cryptsetup reencrypt --resume-only");
	const char *cipher = crypt_get_cipher(cd), *mode = crypt_get_cipher_mode(cd);
	if (!cipher || !mode || strcmp(cipher, "aes") || strcmp(mode, "xts-plain64"))
		return fail(SV_LUKS_UNSUPPORTED, why, why_len,
			    "the volume's cipher is %s-%s, not aes-xts-plain64: convert it with cryptsetup reencrypt "
			    "--cipher aes-xts-plain64 --key-size 512",
			    shown(cipher, a, sizeof(a)), shown(mode, b, sizeof(b)));
	if (crypt_get_volume_key_size(cd) != (int)VIO_KEY_SIZE)
		return fail(SV_LUKS_UNSUPPORTED, why, why_len,
			    "the volume key has %d bits, not 512: convert it with cryptsetup reencrypt --key-size 512",
			    crypt_get_volume_key_size(cd) * 8);
	struct crypt_params_integrity ip;
	memset(&ip, 0, sizeof(ip));
	if (crypt_get_integrity_info(cd, &ip) == 0 && ip.integrity)
		return fail(SV_LUKS_UNSUPPORTED, why, why_len,
			    "the volume uses dm-integrity (authenticated encryption): serve it with cryptsetup on a "
			    "machine with device-mapper");
	int sector = crypt_get_sector_size(cd);
	if (sector < 512 || sector > 4096 || (sector & (sector - 1)))
		return fail(SV_LUKS_UNSUPPORTED, why, why_len, "the volume's sector size %d is not 512 to 4096", sector);
	uint64_t offset_sectors = crypt_get_data_offset(cd), fixed = 0, have = 0;
	if (offset_sectors > UINT64_MAX / 512)
		return fail(SV_LUKS_CONTAINER, why, why_len, "the LUKS2 data offset is invalid: check it with cryptsetup luksDump");
	uint64_t offset = offset_sectors * 512;
	int r = check_metadata(cd, offset, &fixed, why, why_len);
	if (r)
		return r;
	if (fixed % (uint64_t)sector)
		return fail(SV_LUKS_UNSUPPORTED, why, why_len, "the data segment's size is not whole sectors");
	if (container_size(fd, &have) < 0)
		return fail(SV_LUKS_CONTAINER, why, why_len, "cannot tell the container's size: use a regular file or a block device");
	if (have <= offset || (fixed && fixed > have - offset))
		return fail(SV_LUKS_CONTAINER, why, why_len,
			    "the container (%" PRIu64 " bytes) is shorter than its LUKS2 data segment: was it truncated?", have);
	/* A dynamic segment is the rest of the device in whole sectors, as dm-crypt maps it. */
	g->data_offset = offset;
	g->size = fixed ? fixed : (have - offset) / (uint64_t)sector * (uint64_t)sector;
	g->sector_size = (uint32_t)sector;
	g->iv_offset = crypt_get_iv_offset(cd);
	if (g->size == 0)
		return fail(SV_LUKS_CONTAINER, why, why_len,
			    "the container holds less than one sector after its LUKS2 header: was it truncated?");

	/* Last, after every check: a refused volume costs no key derivation. */
	size_t key_len = VIO_KEY_SIZE;
	r = crypt_volume_key_get(cd, CRYPT_ANY_SLOT, (char *)key, &key_len, (const char *)pass, pass_len);
	if (r == -EPERM)
		return fail(SV_LUKS_PASSPHRASE, why, why_len,
			    "no keyslot accepts this passphrase: check it (stdin is used byte for byte, a trailing "
			    "newline included)");
	if (r == -ENOENT)
		return fail(SV_LUKS_PASSPHRASE, why, why_len,
			    "the volume has no usable passphrase keyslot: add one with cryptsetup luksAddKey");
	if (r < 0)
		return fail(SV_LUKS_CONTAINER, why, why_len, "cannot unlock the volume key (%s): check the container with cryptsetup luksDump",
			    strerror(-r));
	if (key_len != VIO_KEY_SIZE)
		return fail(SV_LUKS_UNSUPPORTED, why, why_len, "the volume key is not 512 bits");
	return SV_LUKS_OK;
}

int sv_luks_unlock(int fd, const unsigned char *pass, size_t pass_len, unsigned char key[VIO_KEY_SIZE],
		   struct vio_geometry *g, char *why, size_t why_len)
{
	/* Through our own descriptor: the header cryptsetup reads and the data we serve come
	 * from one inode, even if the path is replaced meanwhile. */
	char dev[40];
	snprintf(dev, sizeof(dev), "/proc/self/fd/%d", fd);
	crypt_set_log_callback(NULL, quiet, NULL);
	struct crypt_device *cd = NULL;
	int r = crypt_init(&cd, dev);
	if (r < 0)
		return fail(SV_LUKS_CONTAINER, why, why_len, "libcryptsetup cannot use the container (%s)", strerror(-r));
	crypt_set_log_callback(cd, quiet, NULL);
	if (crypt_load(cd, CRYPT_LUKS2, NULL) < 0) {
		int luks1 = crypt_load(cd, CRYPT_LUKS1, NULL) == 0;
		crypt_free(cd);
		if (luks1)
			return fail(SV_LUKS_CONTAINER, why, why_len,
				    "the container is LUKS1, not LUKS2: convert it (offline) with cryptsetup convert "
				    "--type luks2");
		return fail(SV_LUKS_CONTAINER, why, why_len,
			    "the container is not a LUKS2 volume (or its header is damaged: check it with cryptsetup luksDump)");
	}
	r = unlock(cd, fd, pass, pass_len, key, g, why, why_len);
	crypt_free(cd);
	return r;
}
