#!/usr/bin/env python3
"""Closed-loop Redis load driver and hit.lua checker (standard library only).

scripts/compare-redis.sh uses it only for `--check` (hit.lua's answers, once, on a fresh
Redis); its load now comes from `ankusa-fleet bench --redis` (the redis-bench feature),
the same load generator as the fleet's. The driver stays as a second opinion that needs no
Rust build: C callers, each on its own connection, send one EVALSHA of hit.lua at a time
(one charge + one unique claim per hit, tenants spread), for a fixed duration, over a few
worker processes, each an asyncio loop driven from the protocol callbacks. Prints a JSON
summary shaped like the fleet bench's (hits_per_s, p50_us, p99_us, ...). A benchmark: it
asserts nothing."""

import argparse
import array
import asyncio
import json
import multiprocessing
import os
import socket
import sys
import time


class Incomplete(Exception):
    pass


def parse(buf, pos):
    """One RESP2 reply from buf at pos: (value, next_pos); raises Incomplete."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    kind = buf[pos:pos + 1]
    line = bytes(buf[pos + 1:end])
    pos = end + 2
    if kind == b"+":
        return line, pos
    if kind == b"-":
        return RedisError(line.decode(errors="replace")), pos
    if kind == b":":
        return int(line), pos
    if kind == b"$":
        n = int(line)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            raise Incomplete
        return bytes(buf[pos:pos + n]), pos + n + 2
    if kind == b"*":
        n = int(line)
        if n < 0:
            return None, pos
        items = []
        for _ in range(n):
            item, pos = parse(buf, pos)
            items.append(item)
        return items, pos
    raise ValueError(f"bad RESP type {kind!r}")


class RedisError(Exception):
    pass


def command(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if not isinstance(a, bytes):
            a = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def call(sock, *args):
    """One blocking request/reply on a plain socket (set-up only)."""
    sock.sendall(command(*args))
    buf = bytearray()
    while True:
        try:
            value, _ = parse(buf, 0)
            if isinstance(value, RedisError):
                raise value
            return value
        except Incomplete:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            buf += chunk


class Caller(asyncio.Protocol):
    """One connection, one hit in flight; the next hit is sent from the reply callback."""

    def __init__(self, shared, index):
        self.s = shared
        self.index = index
        self.seq = 0
        self.buf = bytearray()
        self.transport = None
        self.sent_ns = 0
        self.connected = asyncio.get_running_loop().create_future()
        self.finished = asyncio.get_running_loop().create_future()

    def connection_made(self, transport):
        self.transport = transport
        self.connected.set_result(None)

    def connection_lost(self, exc):
        if not self.connected.done():
            self.connected.set_exception(exc or ConnectionError("closed"))
        if not self.finished.done():
            self.s.errors += 1
            self.finished.set_result(None)

    def send_next(self):
        s = self.s
        self.seq += 1
        seq = self.seq
        i = self.index
        tenant = "tenant-%d" % ((i * 7919 + seq) % s.tenants)
        bucket = "b:hooks:" + tenant
        claim = "c:%s:bench:%d-%d-%d" % (tenant, i, seq, s.pid)
        hook = "hook-%d-%d" % (i, seq)
        msg = (
            "*9\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
            "%s$%d\r\n%s\r\n%s"
            % (s.sha, len(bucket), bucket, len(claim), claim, s.inc_cap, len(hook), hook, s.ttl)
        ).encode()
        self.sent_ns = time.perf_counter_ns()
        self.transport.write(msg)

    def data_received(self, data):
        self.buf += data
        try:
            value, pos = parse(self.buf, 0)
        except Incomplete:
            return
        done_ns = time.perf_counter_ns()
        del self.buf[:pos]
        s = self.s
        s.latencies.append(max(1, (done_ns - self.sent_ns) // 1000))
        s.hits += 1
        if isinstance(value, RedisError):
            s.errors += 1
            if s.first_error is None:
                s.first_error = str(value)
        elif isinstance(value, list) and value and value[0] == b"allowed":
            s.allowed += 1
        else:
            s.not_allowed += 1
        if time.monotonic() < s.until:
            self.send_next()
        elif not self.finished.done():
            self.finished.set_result(None)


class Shared:
    pass


def arg(value):
    b = str(value).encode()
    return b"$%d\r\n%s\r\n" % (len(b), b)


async def worker_main(opts, sha, indices, barrier, results):
    s = Shared()
    s.sha = sha
    s.tenants = max(1, opts.tenants)
    s.pid = os.getpid()
    s.inc_cap = (arg(opts.increment_us) + arg(opts.capacity_us)).decode()
    s.ttl = arg(opts.pending_ttl_ms).decode()
    s.latencies = array.array("Q")
    s.hits = s.allowed = s.not_allowed = s.errors = 0
    s.first_error = None
    loop = asyncio.get_running_loop()
    callers = []
    for i in indices:
        _, proto = await loop.create_connection(
            lambda i=i: Caller(s, i), opts.host, opts.port
        )
        await proto.connected
        callers.append(proto)
    # Wait (off the loop) until every worker is connected, then all start together.
    await loop.run_in_executor(None, barrier.wait)
    started = time.monotonic()
    s.until = started + opts.duration_s
    for c in callers:
        c.send_next()
    await asyncio.gather(*(c.finished for c in callers))
    elapsed = time.monotonic() - started
    for c in callers:
        c.transport.close()
    results.put(
        {
            "elapsed": elapsed,
            "hits": s.hits,
            "allowed": s.allowed,
            "not_allowed": s.not_allowed,
            "errors": s.errors,
            "first_error": s.first_error,
            "latencies": s.latencies.tobytes(),
        }
    )


def worker(opts, sha, indices, barrier, results):
    try:
        asyncio.run(worker_main(opts, sha, indices, barrier, results))
    except BaseException as e:  # report, never hang the parent
        barrier.abort()
        results.put({"fatal": repr(e)})


def quantile(sorted_values, q):
    if not sorted_values:
        return 0
    k = min(len(sorted_values) - 1, max(0, int(q * len(sorted_values) + 0.5) - 1))
    return int(sorted_values[k])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--script", required=True, help="path of hit.lua (loaded with SCRIPT LOAD)")
    p.add_argument("--callers", type=int, default=64)
    p.add_argument("--duration-s", type=float, default=10)
    p.add_argument("--tenants", type=int, default=1000)
    p.add_argument("--procs", type=int, default=0,
                   help="worker processes (default: min(callers, CPUs))")
    p.add_argument("--increment-us", type=int, default=1)
    p.add_argument("--capacity-us", type=int, default=1_000_000_000)
    p.add_argument("--pending-ttl-ms", type=int, default=60_000)
    p.add_argument("--check", action="store_true",
                   help="only load the script and check its answers, then exit")
    opts = p.parse_args()

    with open(opts.script, "rb") as f:
        body = f.read()
    with socket.create_connection((opts.host, opts.port), timeout=10) as sock:
        sha = call(sock, "SCRIPT", "LOAD", body).decode()
        if opts.check:
            check(sock, sha)
            print(json.dumps({"sha": sha, "check": "ok"}))
            return

    procs = opts.procs or min(opts.callers, os.cpu_count() or 1)
    procs = max(1, min(procs, opts.callers))
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(procs)
    results = ctx.Queue()
    workers = []
    for w in range(procs):
        indices = list(range(w, opts.callers, procs))
        pr = ctx.Process(target=worker, args=(opts, sha, indices, barrier, results), daemon=True)
        pr.start()
        workers.append(pr)
    outs = []
    deadline = time.monotonic() + opts.duration_s + 60
    while len(outs) < procs:
        left = deadline - time.monotonic()
        if left <= 0:
            sys.exit("bench_redis: workers did not finish in time")
        try:
            outs.append(results.get(timeout=left))
        except Exception:
            sys.exit("bench_redis: workers did not finish in time")
    for pr in workers:
        pr.join(timeout=10)
    fatal = [o["fatal"] for o in outs if "fatal" in o]
    if fatal:
        sys.exit("bench_redis: worker failed: " + "; ".join(fatal))

    lat = array.array("Q")
    for o in outs:
        lat.frombytes(o["latencies"])
    values = sorted(lat)
    hits = sum(o["hits"] for o in outs)
    elapsed = max(o["elapsed"] for o in outs)
    errors = [o["first_error"] for o in outs if o["first_error"]]
    summary = {
        "callers": opts.callers,
        "procs": procs,
        "duration_s": elapsed,
        "hits": hits,
        "hits_per_s": hits / elapsed if elapsed > 0 else 0.0,
        "allowed": sum(o["allowed"] for o in outs),
        "not_allowed": sum(o["not_allowed"] for o in outs),
        "errors": sum(o["errors"] for o in outs),
        "first_error": errors[0] if errors else None,
        "p50_us": quantile(values, 0.50),
        "p90_us": quantile(values, 0.90),
        "p99_us": quantile(values, 0.99),
        "p999_us": quantile(values, 0.999),
        "max_us": int(values[-1]) if values else 0,
    }
    print(json.dumps(summary, indent=2))


def check(sock, sha):
    """Exercises hit.lua's answers once (contract §4–5, docs/contract.md), on keys of its own."""
    tag = "check:%d:%d" % (os.getpid(), time.time_ns())
    b, c1, c2 = "b:" + tag, "c1:" + tag, "c2:" + tag

    def hit(bucket, claim, inc, cap, hook, ttl=60000):
        v = call(sock, "EVALSHA", sha, 2, bucket, claim, inc, cap, hook, ttl)
        return [x.decode() if isinstance(x, bytes) else x for x in v]

    # Ten at 100 ms increments and a 1 s burst pass; the eleventh is denied (~100 ms).
    for n in range(10):
        got = hit(b, "%s:%d" % (c1, n), 100_000, 1_000_000, "h%d" % n)
        assert got == ["allowed"], got
    got = hit(b, c2, 100_000, 1_000_000, "h10")
    assert got[0] == "rate_limited" and 1 <= got[1] <= 100, got
    assert call(sock, "EXISTS", c2) == 0, "denial wrote the claim"
    b2 = b + ":2"
    assert hit(b2, c2, 1, 10**9, "hA") == ["allowed"]
    assert hit(b2, c2, 1, 10**9, "hA") == ["allowed"]          # same hook retried
    got = hit(b2, c2, 1, 10**9, "hB")                         # another hook: pending
    assert got[0] == "pending" and 59_000 <= got[1] <= 60_000, got
    call(sock, "HSET", c2, "s", "c")                          # as if committed
    assert hit(b2, c2, 1, 10**9, "hB") == ["duplicate", "hA"]
    assert 0 < call(sock, "PTTL", c2) <= 60_000
    assert 900 <= call(sock, "PTTL", b) <= 1000               # bucket expires at its TAT
    call(sock, "DEL", b, b2, c2, *["%s:%d" % (c1, n) for n in range(10)])


if __name__ == "__main__":
    main()
