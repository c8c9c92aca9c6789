#!/bin/sh
# Regenerates the committed Python bindings of the vendored KMS v2 interface (api.proto)
# with grpcio-tools (the dev extra). Run from anywhere; tests/agents/test_k8s_kms.py
# checks that the committed files are what this produces.
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
py=${PYTHON:-"$root/.venv/bin/python"}
cd "$root"
"$py" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. agents/k8skms/v2/api.proto
