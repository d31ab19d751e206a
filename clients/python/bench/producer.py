"""A Python producer streaming tokens as fast as it makes them, with the package (`client.stream()`, batched)
against a hand-written `httpx` loop (one POST per token), while CUI readers watch: tokens per second (all
tokens kept, from the first emitted) and the readers' p99 publish-to-receive latency (per token: when a
reader got the delta holding it, less when the producer emitted it). Medians of `--runs` runs per mode.

    python bench/producer.py [--base-url http://127.0.0.1:8080 | --bin target/release/agentmux]
        [--tokens 2000] [--readers 10] [--runs 3]

Without `--base-url` it starts `--bin` (or `AGENTMUX_BIN`) with `serve --addr 127.0.0.1:0 --ephemeral`. The
readers run in a process of their own (asyncio, one connection each), so they take no time from the
producer's interpreter; both processes stamp with the system's monotonic clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "src"))

import agentmux  # noqa: E402


def read(base_url: str, stream_id: str, readers: int, ready: Any, out: Any) -> None:
    """In the readers' process: every reader's (receive time, tokens so far) per text delta, to the end."""

    async def one(client: httpx.AsyncClient) -> list[tuple[float, int]]:
        marks: list[tuple[float, int]] = []
        tokens = 0
        async with client.stream("GET", f"{base_url}/v1/streams/{stream_id}/events") as response:
            ready.release()
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                message = json.loads(line[6:])
                if message.get("type") == "text":
                    tokens += message["props"]["content"].count(" ")
                    marks.append((time.monotonic(), tokens))
                elif message.get("props", {}).get("event") == "stream_end":
                    return marks
        return marks

    async def all_readers() -> list[list[tuple[float, int]]]:
        async with httpx.AsyncClient(
            timeout=None, trust_env=False, limits=httpx.Limits(max_connections=readers + 5)
        ) as c:
            return await asyncio.gather(*(one(c) for _ in range(readers)))

    out.put(asyncio.run(all_readers()))


def run_once(base_url: str, mode: str, count: int, readers: int) -> dict[str, float]:
    tokens = [f"t{i} " for i in range(count)]
    client = agentmux.Client(base_url)
    emitted: list[float] = []
    ctx = mp.get_context("spawn")
    ready = ctx.Semaphore(0)
    out = ctx.Queue()
    if mode == "package":
        producer = client.stream()
        producer.open()
        stream_id = producer.stream_id
    else:
        created = client.create_stream()
        stream_id = created.id
    reader = ctx.Process(target=read, args=(base_url, stream_id, readers, ready, out))
    reader.start()
    for _ in range(readers):
        ready.acquire()
    time.sleep(0.2)
    started = time.monotonic()
    if mode == "package":
        with producer:
            with producer.text_stream() as text:
                for token in tokens:
                    emitted.append(time.monotonic())
                    text.append(token)
            producer.flush()
            kept = time.monotonic()
        requests = producer.requests
    else:
        http = httpx.Client(trust_env=False)
        url = f"{base_url}/v1/streams/{stream_id}/messages"
        for token in tokens:
            emitted.append(time.monotonic())
            body = {"type": "text", "props": {"content": token}, "message_id": "m", "delta": True}
            http.post(url, json=body).raise_for_status()
        kept = time.monotonic()
        requests = count
        client.end(stream_id)
    marks = out.get(timeout=120)
    reader.join()
    latencies: list[float] = []
    for reader_marks in marks:
        seen = 0
        for at, total in reader_marks:
            latencies.extend(at - emitted[i] for i in range(seen, total))
            seen = total
        assert seen == count, (seen, count)
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    return {
        "tokens_per_s": count / (kept - started),
        "p99_ms": p99 * 1000,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "posts": requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url")
    parser.add_argument("--bin", default=os.environ.get("AGENTMUX_BIN"))
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--readers", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    server = None
    base_url = args.base_url
    if base_url is None:
        from server import Server

        if args.bin:
            os.environ["AGENTMUX_BIN"] = args.bin
        server = Server()
        base_url = server.base_url
    try:
        for mode in ("package", "httpx loop"):
            runs = [run_once(base_url, mode, args.tokens, args.readers) for _ in range(args.runs)]
            median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            print(
                f"{mode:>10}: {median['tokens_per_s']:8.0f} tokens/s, readers' p99 {median['p99_ms']:7.1f} ms "
                f"(p50 {median['p50_ms']:6.1f} ms), {median['posts']:.0f} POSTs  "
                "[runs: " + ", ".join(f"{r['tokens_per_s']:.0f}/s {r['p99_ms']:.1f} ms" for r in runs) + "]",
                flush=True,
            )
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
