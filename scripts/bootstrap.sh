# Shared set-up for scripts/start and scripts/test: sourced, not run.
# Installs what is missing (Debian packages, the Python venv) and nothing twice.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"

log() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31merror:\033[0m %s\n' "$*" >&2; exit 1; }

# apt_need PKG:PROBE ... — install each package whose probe path/command is missing.
apt_need() {
  local missing=() spec pkg probe
  for spec in "$@"; do
    pkg="${spec%%:*}"; probe="${spec#*:}"
    if [[ "$probe" == /* ]]; then [[ -e "$probe" ]] && continue
    else command -v "$probe" >/dev/null 2>&1 && continue; fi
    missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  local sudo=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "need root to install: ${missing[*]} (apt-get install ${missing[*]})"
    sudo="sudo"
  fi
  log "installing Debian packages: ${missing[*]}"
  local stamp=/var/lib/apt/periodic/strongroom-update
  if [[ ! -e $stamp ]] || [[ -n $(find "$stamp" -mmin +720 2>/dev/null) ]]; then
    $sudo apt-get update -qq && $sudo mkdir -p "$(dirname $stamp)" && $sudo touch $stamp
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# venv_need EXTRAS — create .venv and install the project when pyproject changed.
venv_need() {
  local extras="$1" stamp="$VENV/.strongroom-installed"
  local want; want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)-$extras"
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating the Python environment in .venv"
    "$PY" -m venv "$VENV"
  fi
  local have=""; [[ -f "$stamp" ]] && have="$(cat "$stamp")"
  # The runtime set is part of the dev set: starting after testing installs nothing.
  [[ -z "$extras" && "$have" == "${want}dev" ]] && return 0
  if [[ "$have" != "$want" ]]; then
    log "installing Python packages (${extras:-runtime})"
    "$VENV/bin/pip" install -q --upgrade pip >/dev/null
    "$VENV/bin/pip" install -q -e "$ROOT${extras:+[$extras]}"
    echo "$want" >"$stamp"
  fi
}

# webui_need — Node.js and the web console's npm packages (npm ci only when
# webui/package-lock.json changed).
webui_need() {
  apt_need nodejs:node npm:npm
  local major; major="$(node -p 'process.versions.node.split(".")[0]')"
  ((major >= 20)) || die "the web console needs Node.js 20 or newer (found $(node --version))"
  local stamp="$ROOT/webui/node_modules/.strongroom-installed"
  local want; want="$(sha256sum "$ROOT/webui/package-lock.json" | cut -c1-16)"
  if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    log "installing the web console's npm packages"
    (cd "$ROOT/webui" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$want" >"$stamp"
  fi
}

# webui_build — build webui/dist when it is missing or older than its sources.
webui_build() {
  local w="$ROOT/webui"
  if [[ -f "$w/dist/index.html" ]] && [[ -z "$(find "$w/src" "$w/index.html" "$w/package-lock.json" "$w/package.json" "$w/scripts" \
       "$w/vite.config.ts" "$w/tsconfig.json" -newer "$w/dist/index.html" -print -quit 2>/dev/null)" ]]; then
    return 0
  fi
  log "building the web console"
  (cd "$w" && npm run --silent build)
}

# native_need — the compiled data plane (agents/dataplane: the format engine libsrcf.so
# and .a, the FUSE daemon strongroom-fuse and the LUKS2 volume server strongroom-volume),
# built with the distribution's gcc against OpenSSL 3, liburing, libfuse3 (the volume's) and libcryptsetup when
# their sources changed since the last build (or a product is missing). The agent wheel
# the key server serves carries the library.
native_need() {
  apt_need libssl-dev:/usr/include/openssl/evp.h make:make gcc:gcc pkg-config:pkg-config \
           libfuse3-dev:/usr/include/fuse3/fuse_lowlevel.h fuse3:fusermount3 liburing-dev:/usr/include/liburing.h \
           libcryptsetup-dev:/usr/include/libcryptsetup.h
  local dir="$ROOT/agents/dataplane" stamp="$ROOT/agents/dataplane/build/.strongroom-built"
  local want; want="$(cd "$dir" && cat Makefile common.mk include/*.h src/*.[ch] common/*.[ch] fuse/Makefile fuse/*.[ch] \
                      volume/Makefile volume/*.[ch] | sha256sum | cut -c1-16)"
  if [[ -f "$dir/build/libsrcf.so" && -f "$dir/build/libsrcf.a" && -x "$dir/fuse/strongroom-fuse" \
        && -x "$dir/volume/strongroom-volume" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  log "building the compiled data plane (agents/dataplane: libsrcf, strongroom-fuse, strongroom-volume)"
  make -s -C "$dir" lib >&2
  make -s -C "$dir/fuse" all >&2
  make -s -C "$dir/volume" all >&2
  echo "$want" >"$stamp"
}

# pkcs11_need — the PKCS#11 module (pkcs11module: libstrongroom-pkcs11.so, a client
# library for application hosts that forwards to the KMIP port), built with gcc against
# OpenSSL 3 and the PKCS#11 header of p11-kit (libp11-kit-dev: only the header is used),
# when its sources changed since the last build (or the library is missing).
pkcs11_need() {
  apt_need libssl-dev:/usr/include/openssl/evp.h make:make gcc:gcc pkg-config:pkg-config \
           libp11-kit-dev:/usr/include/p11-kit-1/p11-kit/pkcs11.h
  local dir="$ROOT/pkcs11module" stamp="$ROOT/pkcs11module/build/.strongroom-built"
  local want; want="$(cd "$dir" && cat Makefile include/*.h src/*.[ch] src/exports.map | sha256sum | cut -c1-16)"
  if [[ -f "$dir/build/libstrongroom-pkcs11.so" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  log "building the PKCS#11 module (pkcs11module: libstrongroom-pkcs11.so)"
  make -s -C "$dir" all >&2
  echo "$want" >"$stamp"
}
