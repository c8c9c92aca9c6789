/*
 * srcf.h: the Strongroom encrypted file format, version 1 (docs/FORMAT.md), in C.
 *
 * The format layer of the compiled data plane. It knows nothing of FUSE, files or
 * the key server: it parses and builds 128-byte headers, unwraps and re-wraps file
 * keys, seals and opens runs of consecutive chunks in caller-owned buffers, and does
 * the size arithmetic. The cipher is OpenSSL 3's EVP AES-256-GCM, nothing hand-made.
 *
 * Objects
 *   srcf_key   a managed key version (key id, version, 32 bytes of material), as the
 *              agent received it from the key server. Immutable: share it freely
 *              between threads.
 *   srcf_file  one encrypted file's crypto state: its file key, file id and chunk
 *              size, plus a pool of keyed cipher contexts. Every function taking a
 *              srcf_file is safe to call from many threads at once on the same object
 *              (a thread borrows a context for the length of one call: one mutex
 *              round trip per call, none per chunk). Freeing it while another thread
 *              uses it is the caller's error.
 *
 * Key material (key versions and file keys) lives only in memory that is mlock()ed,
 * excluded from core dumps (MADV_DONTDUMP) and from forked children (MADV_WIPEONFORK
 * where the kernel has it: there every call on an inherited key or file fails with
 * SRCF_E_FORKED rather than use a zeroed key), and is wiped with OPENSSL_cleanse() when
 * freed. OpenSSL's
 * cipher contexts hold the expanded AES key schedule in OpenSSL's own heap (wiped when
 * the context is freed); a process holding keys should call srcf_harden_process().
 *
 * Errors: every function returning int returns SRCF_OK (0) or one srcf_status code;
 * srcf_strerror() gives a fixed message, which never contains key bytes, plaintext or
 * any value read from the input. Codes fall into classes by range (see srcf_status).
 *
 * All integers in the format are big-endian; the API takes host integers.
 */
#ifndef SRCF_H
#define SRCF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SRCF_API __attribute__((visibility("default")))

/* Bumped on any incompatible change of this header; bindings check it at load. */
#define SRCF_ABI_VERSION 1

#define SRCF_HEADER_SIZE 128u
#define SRCF_HEADER_AAD_SIZE 68u   /* header bytes 0..67: the wrap's associated data */
#define SRCF_NONCE_SIZE 12u
#define SRCF_TAG_SIZE 16u
#define SRCF_CHUNK_OVERHEAD 28u    /* nonce + tag, per stored chunk */
#define SRCF_KEY_SIZE 32u
#define SRCF_ID_SIZE 16u           /* file id and key id */
#define SRCF_MIN_CHUNK 512u
#define SRCF_MAX_CHUNK 1048576u
#define SRCF_DEFAULT_CHUNK 4096u
/* final_index value meaning "none of these chunks is the file's final chunk". */
#define SRCF_NO_FINAL UINT64_MAX

typedef enum srcf_status {
    SRCF_OK = 0,

    /* 1..9 caller mistakes and the environment */
    SRCF_E_ARGUMENT = 1,        /* NULL pointer, buffer too small, overlapping buffers, a run
                                   that breaks the layout (short chunk not final, ...) */
    SRCF_E_CHUNK_SIZE = 2,      /* chunk size is not a power of two in 512 .. 1 MiB */
    SRCF_E_OVERFLOW = 3,        /* a size or offset would not fit in an off_t */
    SRCF_E_NOMEM = 4,           /* out of memory */
    SRCF_E_MLOCK = 5,           /* cannot lock memory for key material (RLIMIT_MEMLOCK) */
    SRCF_E_CRYPTO = 6,          /* OpenSSL failed (not an authentication failure) */
    SRCF_E_RANDOM = 7,          /* OpenSSL's random generator failed */
    SRCF_E_FORKED = 8,          /* key material is gone: this is a forked child (MADV_WIPEONFORK);
                                   open the file again from its header in this process */

    /* 10..19 format: the bytes are not a v1 file (FORMAT.md, "Header"); one code each */
    SRCF_E_HEADER_TRUNCATED = 10, /* fewer than 128 bytes (after a good magic and version) */
    SRCF_E_BAD_MAGIC = 11,        /* not "SRCF" */
    SRCF_E_BAD_VERSION = 12,      /* format version is not 1 */
    SRCF_E_BAD_HEADER_LENGTH = 13,/* header length field is not 128 */
    SRCF_E_BAD_CHUNK_SIZE = 14,   /* chunk size field invalid */
    SRCF_E_BAD_WRAPPING = 15,     /* file-key wrapping is not 1 (AES-256-GCM) */
    SRCF_E_BAD_FLAGS = 16,        /* flags byte is not 0 */
    SRCF_E_BAD_RESERVED = 17,     /* reserved bytes 50..67 are not zero */
    SRCF_E_BAD_KEY_VERSION = 18,  /* key version 0 */

    /* 20..29 key: the key given is not the version the header names */
    SRCF_E_WRONG_KEY = 20,

    /* 30..39 integrity: authentication failed; never says why */
    SRCF_E_INTEGRITY = 30,      /* the header's wrap or a chunk does not authenticate */
    SRCF_E_FILE_LENGTH = 31     /* the stored length is no v1 file's length (cut or extended) */
} srcf_status;

#define SRCF_IS_FORMAT_ERROR(c) ((c) >= 10 && (c) <= 19)
#define SRCF_IS_KEY_ERROR(c) ((c) >= 20 && (c) <= 29)
#define SRCF_IS_INTEGRITY_ERROR(c) ((c) >= 30 && (c) <= 39)

/* A fixed, human-readable message for a status code ("unknown error" for others). */
SRCF_API const char *srcf_strerror(int code);
/* SRCF_ABI_VERSION of the library actually loaded. */
SRCF_API int srcf_abi_version(void);

/* ---- key versions ---------------------------------------------------------------- */
typedef struct srcf_key srcf_key;

/* Copy a key version into locked memory. version must be >= 1. */
SRCF_API int srcf_key_new(srcf_key **key, const uint8_t key_id[SRCF_ID_SIZE], uint32_t version,
                          const uint8_t material[SRCF_KEY_SIZE]);
/* Wipe and free (NULL is a no-op). */
SRCF_API void srcf_key_free(srcf_key *key);

/* ---- header ---------------------------------------------------------------------- */
typedef struct srcf_header {
    uint32_t chunk_size;
    uint8_t file_id[SRCF_ID_SIZE];
    uint8_t key_id[SRCF_ID_SIZE];   /* RFC 4122 byte order, as stored */
    uint32_t key_version;
} srcf_header;

/* Parse and validate without any key: every rejection FORMAT.md lists, each with its
 * own code, checked in this order: magic, version, length >= 128, header length,
 * chunk size, wrapping, flags, reserved, key version. Bytes past 128 are ignored. */
SRCF_API int srcf_header_parse(const uint8_t *data, size_t len, srcf_header *out);

/* ---- files ----------------------------------------------------------------------- */
typedef struct srcf_file srcf_file;

/* A new file: fresh random file id and file key (OpenSSL RAND), the file key wrapped
 * under `key`; writes the 128-byte header into `header`. */
SRCF_API int srcf_file_create(srcf_file **file, uint8_t header[SRCF_HEADER_SIZE], const srcf_key *key,
                              uint32_t chunk_size);
/* The same with fixed inputs, for test vectors only: any of file_key, file_id,
 * wrap_nonce may be NULL (then random). */
SRCF_API int srcf_file_create_fixed(srcf_file **file, uint8_t header[SRCF_HEADER_SIZE], const srcf_key *key,
                                    uint32_t chunk_size, const uint8_t *file_key, const uint8_t *file_id,
                                    const uint8_t *wrap_nonce);
/* Parse `header` (len >= 128), check that `key` is the version it names
 * (SRCF_E_WRONG_KEY otherwise) and unwrap the file key (SRCF_E_INTEGRITY when the
 * header was altered or the material is not the one that wrapped it). */
SRCF_API int srcf_file_open(srcf_file **file, const uint8_t *header, size_t len, const srcf_key *key);
/* Rotation: a new header carrying the same file key and file id wrapped under
 * `new_key` (the data chunks stay valid as they are). wrap_nonce NULL: random. */
SRCF_API int srcf_file_rewrap(const srcf_file *file, const srcf_key *new_key, uint8_t header[SRCF_HEADER_SIZE],
                              const uint8_t *wrap_nonce);
/* Wipe the file key, free every cipher context (NULL is a no-op). */
SRCF_API void srcf_file_free(srcf_file *file);

SRCF_API uint32_t srcf_file_chunk_size(const srcf_file *file);
SRCF_API void srcf_file_id(const srcf_file *file, uint8_t out[SRCF_ID_SIZE]);
/* Chunks sealed through this object so far (random nonces: NIST SP 800-38D bounds a
 * key to 2^32 of them; the caller decides when to re-key). */
SRCF_API uint64_t srcf_file_chunks_sealed(const srcf_file *file);

/* ---- chunks ---------------------------------------------------------------------- */
/* Seal the consecutive chunks first_index, first_index + 1, ... cut from `plain`
 * (chunk_size bytes each, the last piece possibly shorter) into `out`, stored back to
 * back: nonce (12) || ciphertext || tag (16) each, associated data
 * file id || index (u64 BE) || last (u8), last = 1 exactly for index == final_index.
 *
 * plain_len 0 seals one empty chunk, which must be chunk 0 and final (the empty file).
 * A short last piece must be the final chunk; no chunk may lie past final_index
 * (SRCF_NO_FINAL: none is final). `out` needs srcf_run_stored_len(plain_len) bytes and
 * must not overlap `plain`. `nonces`: NULL for fresh random nonces (one RAND_bytes per
 * 256 chunks); else 12 bytes per chunk, for test vectors only. *out_len gets the bytes
 * written. */
SRCF_API int srcf_seal_run(srcf_file *file, uint64_t first_index, uint64_t final_index, const uint8_t *plain,
                           size_t plain_len, uint8_t *out, size_t out_cap, size_t *out_len,
                           const uint8_t *nonces);
/* Authenticate and decrypt stored chunks lying back to back in `stored` (each
 * chunk_size + 28 bytes, the last possibly shorter) straight into `out`, which needs
 * srcf_run_plain_len(stored_len) bytes and must not overlap `stored`. A hole (FORMAT.md,
 * "Sparse regions": a chunk that is not final_index, is a whole chunk_size + 28 bytes
 * and is all zero bytes) reads as chunk_size zero bytes; it is only recognised after
 * the chunk failed authentication, so genuine chunks cost nothing more. On
 * SRCF_E_INTEGRITY, *bad_index names the first chunk that does not authenticate in its
 * position (and is no hole) and every byte of out[0 .. plain length) is zeroed: no
 * unauthenticated byte is ever left behind. */
SRCF_API int srcf_open_run(srcf_file *file, uint64_t first_index, uint64_t final_index, const uint8_t *stored,
                           size_t stored_len, uint8_t *out, size_t out_cap, size_t *out_len,
                           uint64_t *bad_index);
/* One chunk: `plain_len` <= chunk_size; out needs plain_len + 28 bytes. */
SRCF_API int srcf_seal_chunk(srcf_file *file, uint64_t index, int last, const uint8_t *plain, size_t plain_len,
                             uint8_t *out, const uint8_t *nonce);
/* One stored chunk (28 .. chunk_size + 28 bytes) into out (stored_len - 28 bytes). A
 * hole (not `last`, chunk_size + 28 bytes, all zero) gives SRCF_OK and zeros; on
 * SRCF_E_INTEGRITY out is zeroed. */
SRCF_API int srcf_open_chunk(srcf_file *file, uint64_t index, int last, const uint8_t *stored, size_t stored_len,
                             uint8_t *out);

/* ---- sizes (FORMAT.md, "Sizes"); every result fits in an off_t or SRCF_E_OVERFLOW -- */
/* Plaintext size of a file `file_len` bytes long. SRCF_E_FILE_LENGTH when no valid v1
 * file has that length (shorter than header + one chunk, a final chunk holding more
 * than chunk_size bytes, or an empty final chunk after others). */
SRCF_API int srcf_plaintext_size(uint64_t file_len, uint32_t chunk_size, uint64_t *size);
/* File length of a file of `size` plaintext bytes. */
SRCF_API int srcf_stored_size(uint64_t size, uint32_t chunk_size, uint64_t *file_len);
/* Number of chunks of a file of `size` plaintext bytes: max(1, ceil(size / chunk_size)). */
SRCF_API int srcf_chunk_count(uint64_t size, uint32_t chunk_size, uint64_t *count);
/* File offset of chunk `index`: 128 + index * (chunk_size + 28). */
SRCF_API int srcf_chunk_offset(uint64_t index, uint32_t chunk_size, uint64_t *offset);
/* Bytes srcf_seal_run writes for plain_len plaintext bytes. */
SRCF_API int srcf_run_stored_len(size_t plain_len, uint32_t chunk_size, size_t *stored_len);
/* Plaintext bytes in a run of stored chunks of stored_len bytes (SRCF_E_FILE_LENGTH if
 * its last piece is shorter than 28 bytes). */
SRCF_API int srcf_run_plain_len(size_t stored_len, uint32_t chunk_size, size_t *plain_len);

/* ---- process --------------------------------------------------------------------- */
/* For a process that holds keys (the FUSE daemon): no core dumps, not ptrace-attachable
 * by other processes of its user (prctl PR_SET_DUMPABLE 0, RLIMIT_CORE 0). */
SRCF_API int srcf_harden_process(void);

#ifdef __cplusplus
}
#endif
#endif /* SRCF_H */
