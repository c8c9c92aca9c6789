# What the two daemons' Makefiles share (fuse/Makefile: strongroom-fuse, volume/Makefile:
# strongroom-volume): compiler flags, libsrcf's sources compiled in (../src: the format
# library and the one locked-memory allocator, secmem.c), the shared sources in
# ../common, the release and sanitizer builds, and clean.
#
# A daemon's Makefile sets BIN, SRCS and HDRS (its own sources), includes this file,
# then adds its flags (CFLAGS, LDLIBS), CLEAN (more products) and its own targets.
# SRCS and HDRS must be complete before the include: the rules below list them as
# prerequisites, which make expands as it reads them.

CC      = gcc
CFLAGS  ?= -O2
CFLAGS  += -std=c11 -g -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
           -fstack-protector-strong -D_FORTIFY_SOURCE=2 -fPIE -I../include -I../src -I../common
LDFLAGS += -pie -Wl,-z,relro,-z,now
LDLIBS  += -lcrypto -lpthread

# libsrcf (the format library and secmem.c) is compiled in: one binary, nothing to find
# at run time; its symbols stay hidden.
LIBSRCF     := $(sort $(wildcard ../src/*.c))
LIBHDRS     := ../include/srcf.h ../src/internal.h ../src/secmem.h
LIBOBJ      := $(LIBSRCF:../src/%.c=build/lib/%.o)
LIBOBJ_ASAN := $(LIBSRCF:../src/%.c=build/lib-asan/%.o)
COMMON_SRCS := $(sort $(wildcard ../common/*.c))
COMMON_HDRS := $(sort $(wildcard ../common/*.h))
MAKEFILES_  := Makefile ../common.mk

ASAN_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
# _FORTIFY_SOURCE needs optimisation and gets in ASan's way: left out of this build.
ASAN_CFLAGS = $(filter-out -O2 -D_FORTIFY_SOURCE=2,$(CFLAGS)) -U_FORTIFY_SOURCE $(ASAN_FLAGS)

.PHONY: all asan clean
.DELETE_ON_ERROR:

all: $(BIN)

asan: $(BIN)-asan

# libsrcf's sources want _GNU_SOURCE from the command line; ours define it themselves.
build/lib/%.o: ../src/%.c $(LIBHDRS) $(MAKEFILES_) | build/lib
	$(CC) $(CFLAGS) -D_GNU_SOURCE -fvisibility=hidden -c $< -o $@

build/lib-asan/%.o: ../src/%.c $(LIBHDRS) $(MAKEFILES_) | build/lib-asan
	$(CC) $(ASAN_CFLAGS) -D_GNU_SOURCE -c $< -o $@

build/lib build/lib-asan:
	mkdir -p $@

$(BIN): $(SRCS) $(HDRS) $(COMMON_SRCS) $(COMMON_HDRS) $(LIBHDRS) $(LIBOBJ) $(MAKEFILES_)
	$(CC) $(CFLAGS) $(SRCS) $(COMMON_SRCS) $(LIBOBJ) -o $@ $(LDFLAGS) $(LDLIBS)

$(BIN)-asan: $(SRCS) $(HDRS) $(COMMON_SRCS) $(COMMON_HDRS) $(LIBHDRS) $(LIBOBJ_ASAN) $(MAKEFILES_)
	$(CC) $(ASAN_CFLAGS) $(SRCS) $(COMMON_SRCS) $(LIBOBJ_ASAN) -o $@ $(LDFLAGS) $(LDLIBS)

clean:
	rm -rf $(BIN) $(BIN)-asan $(CLEAN) build
