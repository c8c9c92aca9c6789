/* Size arithmetic of FORMAT.md, "Sizes". With S = chunk_size + 28 and
 * B = file length - 128 (a valid file has B >= 28):
 *
 *   n        = (B - 28) div S + 1          number of chunks
 *   last_len = B - (n - 1) * S - 28        plaintext bytes in the final chunk
 *   size     = (n - 1) * chunk_size + last_len
 *
 * A valid file's final chunk holds 1 .. chunk_size bytes, or 0 when it is the only
 * chunk (the empty file); any other length is rejected. Every result must fit in an
 * off_t (INT64_MAX), the largest file a POSIX system can address. */
#include "internal.h"

int srcf_check_chunk_size(uint32_t chunk_size) {
    if (chunk_size < SRCF_MIN_CHUNK || chunk_size > SRCF_MAX_CHUNK || (chunk_size & (chunk_size - 1)) != 0)
        return SRCF_E_CHUNK_SIZE;
    return SRCF_OK;
}

int srcf_plaintext_size(uint64_t file_len, uint32_t chunk_size, uint64_t *size) {
    if (size == NULL) return SRCF_E_ARGUMENT;
    int rc = srcf_check_chunk_size(chunk_size);
    if (rc != SRCF_OK) return rc;
    if (file_len > INT64_MAX) return SRCF_E_OVERFLOW;
    if (file_len < SRCF_HEADER_SIZE + SRCF_CHUNK_OVERHEAD) return SRCF_E_FILE_LENGTH;
    uint64_t body = file_len - SRCF_HEADER_SIZE;
    uint64_t stored = (uint64_t)chunk_size + SRCF_CHUNK_OVERHEAD;
    uint64_t n = (body - SRCF_CHUNK_OVERHEAD) / stored + 1;
    uint64_t last_len = body - (n - 1) * stored - SRCF_CHUNK_OVERHEAD;
    if (last_len > chunk_size || (last_len == 0 && n > 1)) return SRCF_E_FILE_LENGTH;
    *size = (n - 1) * chunk_size + last_len;
    return SRCF_OK;
}

int srcf_chunk_count(uint64_t size, uint32_t chunk_size, uint64_t *count) {
    if (count == NULL) return SRCF_E_ARGUMENT;
    int rc = srcf_check_chunk_size(chunk_size);
    if (rc != SRCF_OK) return rc;
    if (size > INT64_MAX) return SRCF_E_OVERFLOW;
    uint64_t n = size / chunk_size + (size % chunk_size != 0);
    *count = n ? n : 1;
    return SRCF_OK;
}

int srcf_stored_size(uint64_t size, uint32_t chunk_size, uint64_t *file_len) {
    uint64_t n, overhead, total;
    if (file_len == NULL) return SRCF_E_ARGUMENT;
    int rc = srcf_chunk_count(size, chunk_size, &n);
    if (rc != SRCF_OK) return rc;
    /* 128 + (n-1)*S + (size - (n-1)*chunk_size) + 28 = 128 + size + 28n */
    if (__builtin_mul_overflow(n, (uint64_t)SRCF_CHUNK_OVERHEAD, &overhead) ||
        __builtin_add_overflow(size, overhead, &total) ||
        __builtin_add_overflow(total, (uint64_t)SRCF_HEADER_SIZE, &total) || total > INT64_MAX)
        return SRCF_E_OVERFLOW;
    *file_len = total;
    return SRCF_OK;
}

int srcf_chunk_offset(uint64_t index, uint32_t chunk_size, uint64_t *offset) {
    uint64_t off;
    if (offset == NULL) return SRCF_E_ARGUMENT;
    int rc = srcf_check_chunk_size(chunk_size);
    if (rc != SRCF_OK) return rc;
    if (__builtin_mul_overflow(index, (uint64_t)chunk_size + SRCF_CHUNK_OVERHEAD, &off) ||
        __builtin_add_overflow(off, (uint64_t)SRCF_HEADER_SIZE, &off) || off > INT64_MAX)
        return SRCF_E_OVERFLOW;
    *offset = off;
    return SRCF_OK;
}

int srcf_run_stored_len(size_t plain_len, uint32_t chunk_size, size_t *stored_len) {
    size_t n, overhead, total;
    if (stored_len == NULL) return SRCF_E_ARGUMENT;
    int rc = srcf_check_chunk_size(chunk_size);
    if (rc != SRCF_OK) return rc;
    n = plain_len / chunk_size + (plain_len % chunk_size != 0);
    if (n == 0) n = 1;
    if (__builtin_mul_overflow(n, (size_t)SRCF_CHUNK_OVERHEAD, &overhead) ||
        __builtin_add_overflow(plain_len, overhead, &total))
        return SRCF_E_OVERFLOW;
    *stored_len = total;
    return SRCF_OK;
}

int srcf_run_plain_len(size_t stored_len, uint32_t chunk_size, size_t *plain_len) {
    if (plain_len == NULL) return SRCF_E_ARGUMENT;
    int rc = srcf_check_chunk_size(chunk_size);
    if (rc != SRCF_OK) return rc;
    size_t stored = (size_t)chunk_size + SRCF_CHUNK_OVERHEAD;
    size_t full = stored_len / stored, rest = stored_len % stored;
    if (rest != 0 && rest < SRCF_CHUNK_OVERHEAD) return SRCF_E_FILE_LENGTH;
    if (stored_len == 0) return SRCF_E_FILE_LENGTH;
    *plain_len = full * chunk_size + (rest ? rest - SRCF_CHUNK_OVERHEAD : 0);
    return SRCF_OK;
}
