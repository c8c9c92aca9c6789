/* libFuzzer target: arbitrary bytes into the module's KMIP response decoder, and
 * every reader the module applies to a decoded response (attributes, key material,
 * payload fields). Built by `make fuzz`; run `build/fuzz_ttlv -runs=200000`. */
#include <stddef.h>
#include <stdint.h>

#include "kmip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kresponse r;
    if (kmip_parse_response(&r, data, size) != 0)
        return 0;
    for (int i = 0; i < r.nitems; i++) {
        int pl = r.items[i].payload;
        if (pl < 0)
            continue;
        kattrs a;
        (void)kmip_parse_attributes(&r, pl, &a);
        const uint8_t *p;
        size_t n;
        uint32_t fmt, v;
        int wrapped;
        (void)kmip_parse_key_material(&r, pl, &p, &n, &fmt, &wrapped);
        (void)kmip_payload_bytes(&r, pl, T_DATA, &p, &n);
        (void)kmip_payload_u32(&r, pl, T_VALIDITY_INDICATOR, &v);
        int64_t x;
        int b;
        for (int k = 0; k < r.tree.count; k++) {
            (void)ttlv_i64(&r.tree, k, &x);
            (void)ttlv_bool(&r.tree, k, &b);
        }
    }
    kresponse_free(&r);
    return 0;
}
