"""The clients of bench/load_hardening.py's attack phases, each run as a process of its own.

A client that shares a process (and its GIL and event loop) with the prober delays the prober's
own reading: the `/livez` figures would be the client's as much as the guard's. So the prober and
each attacker run here, in separate processes, and report JSON on stdout:

- `prober PORT`: asks `/livez` every 10 ms, each time on a new connection (as a kubelet does),
  until its standard input closes; prints `[[unix time sent, milliseconds or null], ...]`
  (null: no answer within 5 s or a status other than 200).
- `inflating PORT COUNT SIZE`: COUNT gzip uploads at once, each a chat body of SIZE bytes of
  words that gzip about 40 times smaller, each from a key of its own; prints their statuses.
- `hung_up PORT COUNT SIZE`: COUNT clients each send a SIZE-byte chat body and close without
  reading an answer; prints how many sent it whole.

Each attacker prints `{"started": t0, "ended": t1, ...}` (unix times) so that the bench can take
the prober's samples of the attack's own span. Only 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import random
import socket
import string
import sys
import threading
import time

import aiohttp

CHAT = "/v1/chat/completions"
PROBE_EVERY = 0.01
PROBE_TIMEOUT = 5.0


def compressible_chat(size: int) -> bytes:
    """A chat body of about `size` bytes of words that gzip about 40 times smaller (16 KiB
    stretches of random words, each said 16 times): tests/adversarial's attacker body."""
    rng = random.Random(3)
    vocabulary = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(300)]
    stretches: list[str] = []
    while len(stretches) * 16384 < size:
        stretches += [" ".join(rng.choices(vocabulary, k=2800))[:16384]] * 16
    text = "".join(stretches)[:size]
    return json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}).encode()


def probe_once(port: int) -> float | None:
    """Milliseconds to a whole 200 answer of `/livez` on a new connection, or None."""
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT) as sock:
            sock.settimeout(PROBE_TIMEOUT)
            sock.sendall(b"GET /livez HTTP/1.1\r\nHost: guard\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
    except OSError:
        return None
    return (time.perf_counter() - started) * 1000 if answer.startswith(b"HTTP/1.1 200") else None


def prober(port: int) -> None:
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    samples: list[tuple[float, float | None]] = []
    while not closed.is_set():
        sent = time.time()
        samples.append((sent, probe_once(port)))
        closed.wait(PROBE_EVERY)
    print(json.dumps(samples))


async def inflating(port: int, count: int, size: int) -> None:
    upload = gzip.compress(compressible_chat(size), 6)
    url = f"http://127.0.0.1:{port}{CHAT}"

    async def send(key: int) -> int:
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip", "Authorization": f"Bearer k{key}"}
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
                session.post(url, data=upload, headers=headers) as answer,
            ):
                await answer.read()
                return answer.status
        except (aiohttp.ClientError, TimeoutError):
            return 0

    started = time.time()
    statuses = await asyncio.gather(*(send(key) for key in range(count)))
    print(json.dumps({"started": started, "ended": time.time(), "upload_bytes": len(upload), "statuses": statuses}))


async def hung_up(port: int, count: int, size: int) -> None:
    body = compressible_chat(size)
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer attacker\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()

    async def hang_up() -> bool:
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(60):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(head + body)
                await writer.drain()
                writer.close()
                await writer.wait_closed()
                return True
        return False

    started = time.time()
    sent = await asyncio.gather(*(hang_up() for _ in range(count)))
    print(json.dumps({"started": started, "ended": time.time(), "sent_whole": sum(sent)}))


def main() -> None:
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "prober":
        prober(port)
    elif kind == "inflating":
        asyncio.run(inflating(port, int(sys.argv[3]), int(sys.argv[4])))
    elif kind == "hung_up":
        asyncio.run(hung_up(port, int(sys.argv[3]), int(sys.argv[4])))
    else:
        raise SystemExit(f"unknown client {kind!r}")


if __name__ == "__main__":
    main()
