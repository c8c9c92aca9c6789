#!/usr/bin/env python3
"""Writes seed inputs for fuzz_ttlv into fuzz/corpus/: well-formed KMIP 1.4 responses
of the shapes the module decodes (Locate, GetAttributes batches, Get of a plain and a
wrapped key, Encrypt with a GCM tag, SignatureVerify, a failed item). Run it again
after changing what the module reads; libFuzzer mutates from these."""
import pathlib
import struct

S, I, L, E, B, T, O, D = 1, 2, 3, 5, 6, 7, 8, 9


def item(tag, typ, value):
    if typ == S:
        body = b"".join(value)
    elif typ in (I, E):
        body = struct.pack(">I", value)
    elif typ in (L, B, D):
        body = struct.pack(">q", value)
    elif typ == T:
        body = value.encode()
    else:
        body = value
    pad = (-len(body)) % 8 if typ not in (I, E) else 4
    return struct.pack(">I", tag)[1:] + bytes([typ]) + struct.pack(">I", len(body)) + body + b"\0" * pad


def attr(name, typ, value):
    return item(0x420008, S, [item(0x42000A, T, name), item(0x42000B, typ, value)])


def response(*items):
    header = item(0x42007A, S, [item(0x420069, S, [item(0x42006A, I, 1), item(0x42006B, I, 4)]),
                                item(0x420092, D, 1700000000), item(0x42000D, I, len(items))])
    return item(0x42007B, S, [header, *items])


def ok(op, *payload):
    return item(0x42000F, S, [item(0x42005C, E, op), item(0x42007F, E, 0), item(0x42007C, S, list(payload))])


def failed(op, reason, msg):
    return item(0x42000F, S, [item(0x42005C, E, op), item(0x42007F, E, 1), item(0x42007E, E, reason),
                              item(0x42007D, T, msg)])


UID = "0f8b5a52-2c57-4b7e-9a39-5b0d1f3c2a11"
attrs = [item(0x420094, T, UID), attr("Object Type", E, 2), attr("Cryptographic Algorithm", E, 3),
         attr("Cryptographic Length", I, 256), attr("Cryptographic Usage Mask", I, 0x3C), attr("State", E, 2),
         attr("Name", S, [item(0x420055, T, "payments master"), item(0x420054, E, 1)]),
         attr("x-strongroom-key-version", T, "2"), attr("x-strongroom-replacement-object", T, UID),
         attr("x-strongroom-linked-public-key", T, UID), attr("x-strongroom-key-id", T, UID),
         attr("Sensitive", B, 0)]
seeds = {
    "locate": response(ok(8, item(0x420094, T, UID), item(0x420094, T, UID[::-1]))),
    "get_attributes": response(ok(0x0B, *attrs), ok(0x0B, *attrs[:4]), failed(0x0B, 1, "not found")),
    "get_plain": response(ok(0x0A, item(0x420057, E, 2), item(0x420094, T, UID), item(0x42008F, S, [
        item(0x420040, S, [item(0x420042, E, 1), item(0x420045, S, [item(0x420043, O, b"\x11" * 32)]),
                           item(0x420028, E, 3), item(0x42002A, I, 256)])]))),
    "get_wrapped": response(ok(0x0A, item(0x420057, E, 2), item(0x420094, T, UID), item(0x42008F, S, [
        item(0x420040, S, [item(0x420042, E, 1), item(0x420045, O, b"\x22" * 40),
                           item(0x420046, S, [item(0x42009E, E, 1)])])]))),
    "encrypt_gcm": response(ok(0x1F, item(0x420094, T, UID), item(0x4200C2, O, b"\x33" * 11),
                               item(0x42003D, O, b"\x44" * 12), item(0x4200FF, O, b"\x55" * 16))),
    "verify": response(ok(0x22, item(0x420094, T, UID), item(0x42009B, E, 1))),
    "failure": response(failed(0x20, 0x0A, "the ciphertext blob is invalid")),
}
out = pathlib.Path(__file__).resolve().parent / "corpus"
out.mkdir(exist_ok=True)
for name, data in seeds.items():
    (out / name).write_bytes(data)
print(f"{len(seeds)} seeds in {out}")
