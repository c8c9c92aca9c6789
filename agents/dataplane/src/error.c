/* Status messages and process hardening. Messages are fixed strings: they never carry
 * key bytes, plaintext or anything read from the input. */
#include "internal.h"

#include <sys/prctl.h>
#include <sys/resource.h>

const char *srcf_strerror(int code) {
    switch (code) {
    case SRCF_OK: return "success";
    case SRCF_E_ARGUMENT: return "invalid argument";
    case SRCF_E_CHUNK_SIZE: return "chunk size must be a power of two from 512 to 1048576";
    case SRCF_E_OVERFLOW: return "size or offset too large";
    case SRCF_E_NOMEM: return "out of memory";
    case SRCF_E_MLOCK: return "cannot lock memory for key material (RLIMIT_MEMLOCK)";
    case SRCF_E_CRYPTO: return "OpenSSL failure";
    case SRCF_E_RANDOM: return "OpenSSL random generator failure";
    case SRCF_E_FORKED: return "key material is not inherited by a forked process";
    case SRCF_E_HEADER_TRUNCATED: return "truncated header";
    case SRCF_E_BAD_MAGIC: return "not a Strongroom encrypted file (bad magic)";
    case SRCF_E_BAD_VERSION: return "unsupported format version (this library reads version 1)";
    case SRCF_E_BAD_HEADER_LENGTH: return "header length is not 128 for version 1";
    case SRCF_E_BAD_CHUNK_SIZE: return "invalid chunk size";
    case SRCF_E_BAD_WRAPPING: return "unknown file-key wrapping";
    case SRCF_E_BAD_FLAGS: return "header flags are set (written by a newer agent?)";
    case SRCF_E_BAD_RESERVED: return "reserved header bytes are set (written by a newer agent?)";
    case SRCF_E_BAD_KEY_VERSION: return "key version 0 is invalid";
    case SRCF_E_WRONG_KEY: return "the key is not the version the header names";
    case SRCF_E_INTEGRITY: return "integrity check failed";
    case SRCF_E_FILE_LENGTH: return "integrity check failed (file length)";
    default: return "unknown error";
    }
}

int srcf_abi_version(void) { return SRCF_ABI_VERSION; }

int srcf_harden_process(void) {
    struct rlimit none = {0, 0};
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return SRCF_E_ARGUMENT;
    if (setrlimit(RLIMIT_CORE, &none) != 0) return SRCF_E_ARGUMENT;
    return SRCF_OK;
}
