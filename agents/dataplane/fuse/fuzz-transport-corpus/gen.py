#!/usr/bin/env python3
"""Writes the seed corpus of fuzz-transport (../fuzz_transport.c) into this directory:
  python3 gen.py
Each file is one mode byte (see fuzz_transport.c: bit 0 the io_uring split, bit 1 real
replies, bit 2 no INIT first, bits 4-6 the channel's data buffer) and one request as the
kernel writes it (struct layouts of <linux/fuse.h>, host byte order: little endian)."""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
LOOKUP, FORGET, GETATTR, SETATTR, READ, WRITE, SETXATTR, GETXATTR, INIT, READDIR = 1, 2, 3, 4, 15, 16, 21, 22, 26, 28
INTERRUPT, BATCH_FORGET, READDIRPLUS, RENAME2, CREATE = 36, 42, 44, 45, 35
FATTR_MODE, FATTR_SIZE, FATTR_FH = 1, 8, 64
HDR = struct.Struct("<IIQQIIIHH")  # fuse_in_header: 40 bytes


def req(opcode: int, body: bytes, *, nodeid: int = 1, unique: int = 10, length: int | None = None) -> bytes:
    n = HDR.size + len(body) if length is None else length
    return HDR.pack(n, opcode, unique, nodeid, 1000, 1000, 4242, 0, 0) + body


def split(opcode: int, op: bytes, payload: bytes, *, sel: int = 0, nodeid: int = 1) -> bytes:
    """The io_uring form: header, the argument-length selector, argument, payload."""
    return HDR.pack(HDR.size + len(op) + len(payload), opcode, 11, nodeid, 0, 0, 1, 0, 0) + bytes([sel]) + op + payload


init_in = struct.pack("<IIIII44x", 7, 45, 1 << 22, 0xFFFFFFFF, 0x3FF)
write_in = struct.pack("<QQIIQII", 7, 4096, 11, 0, 0, 0o2, 0)
setattr_in = struct.pack("<IIQQQQQQIIIIIIII", FATTR_MODE | FATTR_SIZE | FATTR_FH, 0, 7, 100, 0, 0, 0, 0,
                         0, 0, 0, 0o100644, 0, 0, 0, 0)
rename2_in = struct.pack("<QII", 1, 1, 0)  # RENAME_NOREPLACE
setxattr_in = struct.pack("<II", 5, 0)  # FUSE_COMPAT_SETXATTR_IN_SIZE: no FUSE_SETXATTR_EXT
read_in = struct.pack("<QQIIQII", 7, 0, 4096, 0, 0, 0, 0)
batch = struct.pack("<II", 3, 0) + b"".join(struct.pack("<QQ", ino, n) for ino, n in ((2, 1), (3, 5), (4, 1 << 40)))
create_in = struct.pack("<IIII", 0o1 | 0o100, 0o100644, 0o022, 0)

SEEDS = {
    # valid requests, /dev/fuse form
    "lookup": b"\0" + req(LOOKUP, b"file.txt\0"),
    "write": b"\0" + req(WRITE, write_in + b"hello world", nodeid=2),
    "setattr": b"\0" + req(SETATTR, setattr_in, nodeid=2),
    "rename2": b"\0" + req(RENAME2, rename2_in + b"old\0new\0"),
    "setxattr": b"\0" + req(SETXATTR, setxattr_in + b"user.tag\0" + b"value", nodeid=2),
    "readdirplus": b"\0" + req(READDIRPLUS, read_in),
    "batch-forget": b"\0" + req(BATCH_FORGET, batch),
    "init": b"\4" + req(INIT, init_in, unique=2),
    "init-old-kernel": b"\4" + req(INIT, struct.pack("<IIII", 7, 22, 1 << 17, 0xFFFF), unique=2),
    "create": b"\2" + req(CREATE, create_in + b"new.txt\0"),
    # real replies, a channel buffer of 1 KiB (a ring entry smaller than the request)
    "read-real": b"\x12" + req(READ, read_in, nodeid=2),
    # a READ larger than the channel's buffer whose answer would fit it: the data must be
    # sent from where the operation wrote it
    "read-real-spills": b"\x12" + req(READ, struct.pack("<QQIIQII", 7, 0, 1200, 0, 0, 0, 0), nodeid=2),
    "readdir-real": b"\x12" + req(READDIR, read_in),
    "readdirplus-real": b"\x22" + req(READDIRPLUS, read_in),
    "getxattr-size0": b"\2" + req(GETXATTR, struct.pack("<II", 0, 0) + b"user.tag\0"),
    # the io_uring form
    "uring-write": b"\1" + split(WRITE, write_in, b"hello world", nodeid=2),
    "uring-lookup": b"\1" + split(LOOKUP, b"", b"file.txt\0"),
    "uring-read-real": b"\x33" + split(READ, read_in, b"", nodeid=2),
    "uring-batch-forget": b"\1" + split(BATCH_FORGET, batch[:8], batch[8:]),
    "uring-forget": b"\1" + split(FORGET, struct.pack("<Q", 1), b"", nodeid=2),
    "uring-interrupt": b"\1" + split(INTERRUPT, struct.pack("<Q", 10), b""),
    # malformed
    "len-too-long": b"\0" + req(LOOKUP, b"x\0", length=4096),
    "len-too-short": b"\0" + req(WRITE, write_in + b"hello world", length=48),
    "name-without-nul": b"\0" + req(LOOKUP, b"file.txt"),
    "rename2-one-name": b"\0" + req(RENAME2, rename2_in + b"old\0new"),
    "write-size-lies": b"\0" + req(WRITE, struct.pack("<QQIIQII", 7, 0, 0xFFFFFFFF, 0, 0, 0, 0) + b"abc"),
    "write-offset-negative": b"\0" + req(WRITE, struct.pack("<QQIIQII", 7, 1 << 63, 3, 0, 0, 0, 0) + b"abc"),
    "setxattr-size-lies": b"\0" + req(SETXATTR, struct.pack("<II", 1 << 20, 0) + b"user.tag\0v"),
    "batch-forget-count-lies": b"\0" + req(BATCH_FORGET, struct.pack("<II", 0x40000000, 0) + batch[8:24]),
    "header-cut": b"\0" + req(GETATTR, b"")[:20],
    "unknown-opcode": b"\0" + req(9999, b"\0" * 16),
    "setattr-short": b"\0" + req(SETATTR, setattr_in[:40], nodeid=2),
    "uring-op-lies": b"\1" + split(WRITE, write_in[:5], b"hello world", sel=0x85),
    "uring-forget-short": b"\1" + split(FORGET, b"\1\2\3", b"", sel=0x83),
    "uring-lookup-with-arg": b"\1" + split(LOOKUP, b"\0" * 8, b"file.txt\0", sel=0x88),
    "no-init-getattr": b"\4" + req(GETATTR, struct.pack("<IIQ", 0, 0, 0), nodeid=1),
    "read-huge-real": b"\x72" + req(READ, struct.pack("<QQIIQII", 7, 0, 0xFFFFFFFF, 0, 0, 0, 0), nodeid=2),
}

if __name__ == "__main__":
    for name, data in SEEDS.items():
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)
    print(f"{len(SEEDS)} seeds in {HERE}")
