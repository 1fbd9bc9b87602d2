"""A Python gRPC client of the gateway, from Envoy's own .proto files compiled at test time.

Usage: envoy_client.py PROTO_ROOT OUT_DIR HOST:PORT

PROTO_ROOT is the proto/ directory the envoy-types crate ships (Envoy's data-plane-api and
its dependencies). The script compiles envoy/service/ratelimit/v3/rls.proto and every file
it imports, transitively, with grpcio-tools into OUT_DIR, then asks ShouldRateLimit and
prints one JSON line per answer.
"""

import json
import os
import re
import sys

from grpc_tools import protoc
import grpc_tools

INCLUDES = [
    "data-plane-api",
    "xds",
    "protoc-gen-validate",
    "googleapis",
    "cel-spec/proto",
    "opentelemetry-proto",
    "client_model",
]
IMPORT = re.compile(r'^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;', re.M)


def closure(root, start):
    """The .proto files `start` needs, transitively (google/protobuf ones come with protoc)."""
    dirs = [os.path.join(root, d) for d in INCLUDES]
    seen, todo = [], [start]
    while todo:
        name = todo.pop()
        if name in seen or name.startswith("google/protobuf/"):
            continue
        path = next((os.path.join(d, name) for d in dirs if os.path.exists(os.path.join(d, name))), None)
        if path is None:
            raise SystemExit(f"not found: {name}")
        seen.append(name)
        with open(path, encoding="utf-8") as f:
            todo.extend(IMPORT.findall(f.read()))
    return dirs, seen


def compile_protos(root, out):
    dirs, files = closure(root, "envoy/service/ratelimit/v3/rls.proto")
    os.makedirs(out, exist_ok=True)
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["protoc", f"-I{well_known}"] + [f"-I{d}" for d in dirs]
    args += [f"--python_out={out}", f"--grpc_python_out={out}"] + files
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # Generated packages are plain directories: make each one importable.
    for dirpath, _, _ in os.walk(out):
        init = os.path.join(dirpath, "__init__.py")
        if not os.path.exists(init):
            open(init, "w").close()
    return len(files)


def main():
    root, out, target = sys.argv[1:4]
    n = compile_protos(root, out)
    sys.path.insert(0, out)
    import grpc
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2

    print(json.dumps({"compiled": n}), flush=True)
    with grpc.insecure_channel(target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="remote_address", value="198.51.100.7")
        for _ in range(3):
            req = rls_pb2.RateLimitRequest(
                domain="edge",
                descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])],
                hits_addend=1,
            )
            r = stub.ShouldRateLimit(req, timeout=5)
            s = r.statuses[0]
            print(json.dumps({
                "overall": rls_pb2.RateLimitResponse.Code.Name(r.overall_code),
                "code": rls_pb2.RateLimitResponse.Code.Name(s.code),
                "requests_per_unit": s.current_limit.requests_per_unit,
                "unit": rls_pb2.RateLimitResponse.RateLimit.Unit.Name(s.current_limit.unit),
                "remaining": s.limit_remaining,
                "headers": {h.key: h.value for h in r.response_headers_to_add},
            }), flush=True)
        try:
            stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="", descriptors=[]), timeout=5)
            print(json.dumps({"error": None}), flush=True)
        except grpc.RpcError as e:
            print(json.dumps({"error": e.code().name}), flush=True)
        # Malformed messages, as raw bytes (no serializer): a truncated field, a field with a
        # length past the message's end, a wrong wire type, 64 KiB of 0xff. Each is one error
        # answer, and the service goes on answering.
        raw = channel.unary_unary("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        for name, body in [
            ("truncated", b"\x0a"),
            ("length past the end", b"\x0a\x7fedge"),
            ("wrong wire type", b"\x0d\x00\x00\x00\x00"),
            ("garbage", b"\xff" * 65536),
        ]:
            try:
                raw(body, timeout=5)
                print(json.dumps({"malformed": name, "error": None}), flush=True)
            except grpc.RpcError as e:
                print(json.dumps({"malformed": name, "error": e.code().name}), flush=True)
        other = ratelimit_pb2.RateLimitDescriptor.Entry(key="remote_address", value="198.51.100.8")
        r = stub.ShouldRateLimit(
            rls_pb2.RateLimitRequest(domain="edge", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[other])]),
            timeout=5,
        )
        print(json.dumps({"after": rls_pb2.RateLimitResponse.Code.Name(r.overall_code)}), flush=True)


if __name__ == "__main__":
    main()
