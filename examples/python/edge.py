#!/usr/bin/env python3
"""A webhook edge in a few lines: claim a hook, commit it, see its retry answered duplicate.

    python3 -m pip install -r examples/python/requirements.txt
    python3 examples/python/edge.py --addr 127.0.0.1:7101

The stubs are made from proto/fleet.proto at run time (grpcio-tools) in a temp dir, so
nothing generated is kept. Every run uses a fresh tenant, key and hook ids, so it can be run
again against the same fleet. Exits 0 when every answer is the expected one, 1 on a wrong
answer or a failed call, 2 when it cannot start (missing packages, no node at --addr).
"""

import argparse
import importlib
import pathlib
import sys
import tempfile
import uuid

PROTO = pathlib.Path(__file__).resolve().parents[2] / "proto" / "fleet.proto"
INSTALL = "python3 -m pip install -r examples/python/requirements.txt"


def fail(message, status=1):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(status)


def make_stubs(proto, out_dir):
    """Runs protoc from grpcio-tools on `proto` into `out_dir`; returns (messages, services)."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as e:
        fail(f"{e}: install the packages with `{INSTALL}`", 2)
    # The well-known types that grpcio-tools ships, for any import of google/protobuf/*.
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    status = protoc.main([
        "grpc_tools.protoc",
        f"-I{proto.parent}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(proto),
    ])
    if status != 0:
        fail(f"protoc failed on {proto} (status {status})", 2)
    sys.path.insert(0, str(out_dir))
    name = proto.stem
    return importlib.import_module(f"{name}_pb2"), importlib.import_module(f"{name}_pb2_grpc")


def decided(pb, answer):
    return pb.DecidedBy.Name(answer.decided_by).removeprefix("DECIDED_BY_").lower()


def one_line(answer):
    from google.protobuf import text_format
    return "{" + text_format.MessageToString(answer, as_one_line=True) + "}"


def run(args, pb, stub):
    run_id = uuid.uuid4().hex[:12]
    tenant, source, key = f"edge-example-{run_id}", "example", f"evt-{run_id}"
    first, second = f"hook-{run_id}-a", f"hook-{run_id}-b"
    # The gRPC deadline leaves the node its own timeout_ms to answer, plus transport time.
    deadline_s = args.timeout_ms / 1000 + 5

    def hit(hook_id):
        claim = pb.Claim(tenant=tenant, source_id=source, key=key, hook_id=hook_id,
                         ttl_ms=3_600_000, pending_ttl_ms=60_000)
        # 10 hooks a second for this tenant, bursts of 10: one hit is always within it.
        charge = pb.Charge(kind=pb.KIND_HOOKS, tenant=tenant,
                           increment_us=100_000, capacity_us=1_000_000)
        request = pb.HitRequest(charges=[charge], claim=claim, timeout_ms=args.timeout_ms,
                                rate_limit_scope=pb.SCOPE_FLEET, dedupe_scope=pb.SCOPE_FLEET)
        return stub.Hit(request, timeout=deadline_s)

    print(f"1. hit    tenant={tenant} key={key} hook={first}")
    answer = hit(first)
    outcome = answer.WhichOneof("outcome")
    if outcome != "allowed":
        fail(f"step 1: expected allowed, got {outcome}: {one_line(answer)}")
    print(f"   allowed (decided by {decided(pb, answer)})")

    print(f"2. settle commit key={key} hook={first}")
    request = pb.SettleRequest(tenant=tenant, source_id=source, key=key, hook_id=first,
                               outcome=pb.SETTLE_OUTCOME_COMMIT, timeout_ms=args.timeout_ms,
                               dedupe_scope=pb.SCOPE_FLEET)
    answer = stub.Settle(request, timeout=deadline_s)
    status = pb.SettleStatus.Name(answer.status)
    if answer.status != pb.SETTLE_STATUS_SETTLED:
        fail(f"step 2: expected SETTLE_STATUS_SETTLED, got {status}: {one_line(answer)}")
    print(f"   settled (decided by {decided(pb, answer)})")

    print(f"3. hit    key={key} hook={second} (the provider's retry under another id)")
    answer = hit(second)
    outcome = answer.WhichOneof("outcome")
    if outcome != "duplicate" or answer.duplicate.hook_id != first:
        fail(f"step 3: expected duplicate of {first}, got {outcome}: {one_line(answer)}")
    print(f"   duplicate of {answer.duplicate.hook_id} (decided by {decided(pb, answer)})")
    print("ok: allowed, settled, duplicate")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", required=True, help="a node's api_addr, HOST:PORT")
    parser.add_argument("--proto", type=pathlib.Path, default=PROTO,
                        help="the fleet.proto to make the stubs from (default: the repository's)")
    parser.add_argument("--timeout-ms", type=int, default=5_000,
                        help="timeout_ms of every call (the node's own deadline)")
    args = parser.parse_args()
    try:
        import grpc
    except ImportError as e:
        fail(f"{e}: install the packages with `{INSTALL}`", 2)

    with tempfile.TemporaryDirectory(prefix="ankusa-stubs-") as out_dir:
        pb, services = make_stubs(args.proto, out_dir)
        with grpc.insecure_channel(args.addr) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=10)
            except grpc.FutureTimeoutError:
                fail(f"no node answers at {args.addr}", 2)
            try:
                run(args, pb, services.FleetStub(channel))
            except grpc.RpcError as e:
                fail(f"call failed: {e.code().name}: {e.details()}")


if __name__ == "__main__":
    main()
