#!/usr/bin/env bash
# Regenerates the gRPC stubs under dissem/v1 from the repository's proto/ (grpcio-tools).
# The stubs are committed, so `pip install ./clients/python` needs no code generator; the
# test `the_python_stubs_match_the_protos` fails when they fall behind the .proto files.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here}"
python3 -m grpc_tools.protoc -I "$here/../../proto" \
    --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
    "$here"/../../proto/dissem/v1/{common,ingest,objects,stream,subscriber,subscriptions,admin,federation}.proto
