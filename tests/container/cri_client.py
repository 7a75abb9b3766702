#!/usr/bin/env python3
"""A minimal CRI client: the calls the kubelet makes, made from CRI's own api.proto (Debian's
golang-k8s-cri-api-dev) with gRPC (Debian's python3-grpcio). Used by tests/container/cri-flow.sh.

    cri_client.py SOCKET METHOD [JSON]

METHOD is a CRI method (RunPodSandbox, CreateContainer, StartContainer, ContainerStatus, CheckpointContainer, ...);
JSON is its request message in protobuf's JSON mapping (camelCase or the .proto's field names). The response is
printed as JSON (field names as in the .proto). A gRPC error exits 1 with its status code and details on stderr.

The Python modules are generated once per run with protoc into $CCM_CRI_GEN (default /tmp/ccm-cri-gen).
"""

import json
import os
import re
import subprocess
import sys

API_PROTO = os.environ.get(
    "CCM_CRI_API_PROTO", "/usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto"
)
GEN = os.environ.get("CCM_CRI_GEN", "/tmp/ccm-cri-gen")
IMAGE_METHODS = {"ListImages", "ImageStatus", "PullImage", "RemoveImage", "ImageFsInfo"}


def api_module():
    """api_pb2, generated from API_PROTO with protoc on first use."""
    if not os.path.exists(os.path.join(GEN, "api_pb2.py")):
        os.makedirs(GEN, exist_ok=True)
        # CRI 0.36 marks credentials `[debug_redact = true]`, a field option protoc 3.21 (Debian's) does not know;
        # it changes nothing on the wire, so a copy without it is compiled.
        with open(API_PROTO) as f:
            text = re.sub(r"\s*\[\s*debug_redact\s*=\s*true\s*\]", "", f.read())
        with open(os.path.join(GEN, "api.proto"), "w") as f:
            f.write(text)
        subprocess.run(["protoc", "-I", GEN, "--python_out", GEN, "api.proto"], check=True)
    sys.path.insert(0, GEN)
    import api_pb2  # noqa: E402  (generated above)

    return api_pb2


def main(argv):
    if len(argv) not in (3, 4):
        sys.stderr.write("usage: cri_client.py SOCKET METHOD [JSON]\n")
        return 2
    socket, method = argv[1], argv[2]
    body = argv[3] if len(argv) == 4 else "{}"

    import grpc
    from google.protobuf import json_format

    api = api_module()
    try:
        request_type = getattr(api, method + "Request")
        response_type = getattr(api, method + "Response")
    except AttributeError:
        sys.stderr.write(f"cri_client.py: {method} is not a CRI method of {API_PROTO}\n")
        return 2
    request = json_format.Parse(body, request_type())
    service = "ImageService" if method in IMAGE_METHODS else "RuntimeService"
    with grpc.insecure_channel("unix://" + socket) as channel:
        call = channel.unary_unary(
            f"/runtime.v1.{service}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        try:
            response = call(request, timeout=float(os.environ.get("CCM_CRI_TIMEOUT", "120")))
        except grpc.RpcError as e:
            sys.stderr.write(f"{method}: {e.code().name}: {e.details()}\n")
            return 1
    print(json.dumps(json_format.MessageToDict(response, preserving_proto_field_name=True), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
