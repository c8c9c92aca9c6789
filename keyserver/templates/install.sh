#!/bin/sh
# Strongroom agent installer, served by the key server.
#
#   curl -fsS --cacert ca.pem @SERVER_URL@/install.sh | sh -s -- --token TOKEN [options]
#
# Options:
#   --token TOKEN       enrollment token from the console (Hosts > Enroll a host), or in
#                       STRONGROOM_ENROLL_TOKEN
#   --hostname NAME     the name this host enrolls under (default: `hostname -f`, else `uname -n`;
#                       never localhost)
#   --prefix DIR        where the agent's Python environment goes (default /opt/strongroom-agent);
#                       with --prefix, the configuration, state and run directories default to
#                       DIR/etc, DIR/state and DIR/run
#   --config-dir DIR    default /etc/strongroom-agent
#   --state-dir DIR     the host key and certificates, mode 0700 (default /var/lib/strongroom-agent)
#   --run-dir DIR       open volumes' mounts and state (default /run/strongroom-agent)
#   --python PATH       Python 3.11+ to build the environment with (default python3)
#   --index-url URL     the Python package index (or mirror) for the agent's dependencies
#   --wheels DIR        offline: take the dependencies from wheels in DIR, no index at all
#   --no-systemd        do not install a systemd unit; run `kms-agent run` in the foreground
#
# Run it as root, or as a user with sudo: then it runs itself again through sudo when a
# step needs root (system directories, the systemd unit), and never otherwise. The
# agent's dependencies (cryptography, httpx, typer, rich) come from a Python package
# index: PyPI, or --index-url / --wheels, or pip's own configuration (/etc/pip.conf).
#
# The server's CA certificate is embedded below (this script came over a connection
# verified with it) and pinned for every later call. The agent's private key is made
# on this host and never leaves it.
set -eu

SERVER_URL='@SERVER_URL@'
WHEEL='@WHEEL@'
WHEEL_SHA256='@WHEEL_SHA256@'
CA_PEM='@CA_PEM@'

say() { printf '==> %s\n' "$*"; }
die() { printf 'strongroom agent installer: %s\n' "$*" >&2; exit 1; }

TOKEN="${STRONGROOM_ENROLL_TOKEN:-}"
NAME=""
PREFIX=""
CONFIG_DIR=""
STATE_DIR=""
RUN_DIR=""
PYTHON=python3
INDEX_URL=""
WHEELS=""
SYSTEMD=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --token) [ $# -ge 2 ] || die "--token needs a value"; TOKEN=$2; shift 2 ;;
    --token=*) TOKEN=${1#*=}; shift ;;
    --hostname) [ $# -ge 2 ] || die "--hostname needs a value"; NAME=$2; shift 2 ;;
    --prefix) [ $# -ge 2 ] || die "--prefix needs a value"; PREFIX=$2; shift 2 ;;
    --config-dir) [ $# -ge 2 ] || die "--config-dir needs a value"; CONFIG_DIR=$2; shift 2 ;;
    --state-dir) [ $# -ge 2 ] || die "--state-dir needs a value"; STATE_DIR=$2; shift 2 ;;
    --run-dir) [ $# -ge 2 ] || die "--run-dir needs a value"; RUN_DIR=$2; shift 2 ;;
    --python) [ $# -ge 2 ] || die "--python needs a value"; PYTHON=$2; shift 2 ;;
    --index-url) [ $# -ge 2 ] || die "--index-url needs a value"; INDEX_URL=$2; shift 2 ;;
    --wheels) [ $# -ge 2 ] || die "--wheels needs a value"; WHEELS=$2; shift 2 ;;
    --no-systemd) SYSTEMD=no; shift ;;
    -h|--help) sed -n '2,29p' "$0" 2>/dev/null || true; exit 0 ;;
    *) die "unknown option '$1' (see the comment at the top of $SERVER_URL/install.sh)" ;;
  esac
done
[ -n "$TOKEN" ] || die "an enrollment token is required: --token TOKEN (create one in the console: Hosts > Enroll a host)"
if [ -n "$PREFIX" ]; then
  CONFIG_DIR=${CONFIG_DIR:-$PREFIX/etc}
  STATE_DIR=${STATE_DIR:-$PREFIX/state}
  RUN_DIR=${RUN_DIR:-$PREFIX/run}
else
  PREFIX=/opt/strongroom-agent
  CONFIG_DIR=${CONFIG_DIR:-/etc/strongroom-agent}
  STATE_DIR=${STATE_DIR:-/var/lib/strongroom-agent}
  RUN_DIR=${RUN_DIR:-/run/strongroom-agent}
fi
[ -z "$WHEELS" ] || [ -d "$WHEELS" ] || die "--wheels $WHEELS: no such directory"

# The server knows a host by this name (audit records say host:NAME): localhost would
# name every host alike.
if [ -z "$NAME" ]; then
  NAME=$(hostname -f 2>/dev/null || true)
  case "$NAME" in ""|localhost|localhost.*) NAME=$(uname -n 2>/dev/null || true) ;; esac
fi
case "$NAME" in
  ""|localhost|localhost.*|ip6-localhost|ip6-loopback)
    die "this host's name is '${NAME}', which does not tell hosts apart: pass --hostname NAME (its fully qualified name, e.g. db1.example.com)" ;;
esac

command -v curl >/dev/null 2>&1 || die "curl is missing: install it (apt-get install curl)"
if [ "$SYSTEMD" = auto ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  SYSTEMD=yes
fi

# Root, or sudo for the whole run when a step needs it (this script came on stdin, so
# it is fetched again over the same pinned connection).
if [ "$(id -u)" != 0 ]; then
  need_root=""
  [ "$SYSTEMD" = yes ] && need_root="the systemd unit goes to /etc/systemd/system"
  for d in "$PREFIX" "$CONFIG_DIR" "$STATE_DIR"; do
    if ! { mkdir -p "$d" 2>/dev/null && [ -w "$d" ]; }; then need_root="$d is not writable by $(id -un)"; fi
  done
  if [ -n "$need_root" ]; then
    command -v sudo >/dev/null 2>&1 \
      || die "root is needed ($need_root): run the installer as root, or install sudo; or install into directories you own with --prefix DIR --no-systemd"
    say "running again through sudo: $need_root"
    ca=$(mktemp)
    printf '%s\n' "$CA_PEM" > "$ca"
    set -- --token "$TOKEN" --hostname "$NAME" --prefix "$PREFIX" --config-dir "$CONFIG_DIR" \
      --state-dir "$STATE_DIR" --run-dir "$RUN_DIR" --python "$PYTHON"
    [ -z "$INDEX_URL" ] || set -- "$@" --index-url "$INDEX_URL"
    [ -z "$WHEELS" ] || set -- "$@" --wheels "$WHEELS"
    [ "$SYSTEMD" = no ] && set -- "$@" --no-systemd
    rc=0
    curl -fsS --cacert "$ca" "$SERVER_URL/install.sh" | sudo sh -s -- "$@" || rc=$?
    rm -f "$ca"
    exit "$rc"
  fi
fi

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
  || die "Python 3.11 or newer is needed as '$PYTHON': install python3, or pass --python PATH"
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null \
  || die "Python's venv module is missing: apt-get install python3-venv (or pass --python PATH)"
for d in "$PREFIX" "$CONFIG_DIR" "$STATE_DIR"; do
  mkdir -p "$d" 2>/dev/null && [ -w "$d" ] || die "cannot write to $d: run the installer as root, or choose directories you own (--prefix)"
done

umask 022
chmod 700 "$STATE_DIR"
CA_FILE="$CONFIG_DIR/server-ca.pem"
printf '%s\n' "$CA_PEM" > "$CA_FILE"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

say "downloading the agent ($WHEEL) from $SERVER_URL"
curl -fsS --cacert "$CA_FILE" -o "$tmp/$WHEEL" "$SERVER_URL/downloads/$WHEEL" \
  || die "could not download the agent from $SERVER_URL/downloads/$WHEEL"
got=$("$PYTHON" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$tmp/$WHEEL")
[ "$got" = "$WHEEL_SHA256" ] || die "the downloaded agent does not match its checksum: try again, and report it if it persists"

say "installing the agent into $PREFIX"
"$PYTHON" -m venv "$PREFIX"
if [ -n "$WHEELS" ]; then
  set -- --no-index --find-links "$WHEELS"; source="the wheels in $WHEELS"
elif [ -n "$INDEX_URL" ]; then
  set -- --index-url "$INDEX_URL"; source="the package index $INDEX_URL"
else
  set --; source="the Python package index (PyPI, or pip's configuration)"
fi
"$PREFIX/bin/python" -m pip install --quiet --disable-pip-version-check "$@" "$tmp/$WHEEL" \
  || die "pip could not install the agent's dependencies (cryptography, httpx, typer, rich) from $source (see above): give this host access to it, or pass --index-url URL (a mirror) or --wheels DIR (offline)"

# pip installs the data plane 0644: available() makes it executable and says what else is missing.
why=$("$PREFIX/bin/python" -c 'from agents.guardpoint.dataplane import available; print(available() or "")' 2>&1)
if [ -n "$why" ]; then
  say "note: guard points cannot be served on this host yet: $why (files, keys and the CLI work)"
fi

CONFIG="$CONFIG_DIR/agent.toml"
cat > "$CONFIG" <<CONF
# Strongroom agent configuration (written by the installer).
server_url = "$SERVER_URL"
ca_file = "$CA_FILE"
state_dir = "$STATE_DIR"
run_dir = "$RUN_DIR"  # open volumes' mounts and state
volumes_file = "$CONFIG_DIR/volumes.tab"  # volumes opened at boot: NAME MOUNTPOINT|- [OPTIONS]
CONF

say "enrolling this host"
STRONGROOM_ENROLL_TOKEN="$TOKEN" "$PREFIX/bin/kms-agent" --config "$CONFIG" enroll --hostname "$NAME"

if [ "$SYSTEMD" = yes ]; then
  cat > /etc/systemd/system/strongroom-agent.service <<UNIT
[Unit]
Description=Strongroom host agent
After=network-online.target
Wants=network-online.target

[Service]
ExecStart=$PREFIX/bin/kms-agent --config $CONFIG run
Restart=on-failure
RestartSec=5
# 6: this host was revoked or is not enrolled; restarting cannot help.
RestartPreventExitStatus=6

[Install]
WantedBy=multi-user.target
UNIT
  # Block volumes of $CONFIG_DIR/volumes.tab, opened once the key server answers
  # (fail closed) and closed before shutdown (docs/volumes.md).
  cat > /etc/systemd/system/strongroom-volumes.service <<UNIT
[Unit]
Description=Strongroom volumes (opened through the key server)
After=network-online.target strongroom-agent.service
Wants=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=$PREFIX/bin/kms-agent --config $CONFIG volume open-all --wait 300
ExecStop=$PREFIX/bin/kms-agent --config $CONFIG volume close-all
TimeoutStartSec=360

[Install]
WantedBy=multi-user.target
UNIT
  systemctl daemon-reload
  systemctl enable --now strongroom-agent.service
  systemctl enable strongroom-volumes.service
  say "the agent runs as the systemd service strongroom-agent; strongroom-volumes opens $CONFIG_DIR/volumes.tab at boot"
else
  say "start the agent in the foreground with: $PREFIX/bin/kms-agent --config $CONFIG run"
fi
say "done: $PREFIX/bin/kms-agent --config $CONFIG status"
