#!/usr/bin/env bash
# Regenerate the Python gRPC stubs of the kubelet APIs (device_plugin/api/*.proto) with grpcio-tools from
# PyPI (the dev extra). Output is committed; rerun after editing a .proto. Imports are rewritten to be
# package-relative because protoc emits top-level `import x_pb2`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=device_plugin/api
python -m grpc_tools.protoc -I "$out" --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  "$out"/deviceplugin_v1beta1.proto "$out"/podresources_v1.proto
for f in "$out"/*_pb2_grpc.py; do
  sed -i -E 's/^import ([a-z0-9_]+_pb2) as /from device_plugin.api import \1 as /' "$f"
done
echo "generated: $(ls "$out"/*_pb2*.py* | tr '\n' ' ')"
