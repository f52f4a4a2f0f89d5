"""Sample nginx access-log lines for `ip_count`, with out-of-order and malformed lines.

`generate_lines` is pure and seeded, so a test can recount the input independently.
`produce_lines` sends them with kafka-python, keyed by IP, with a progress bar.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

MALFORMED_SAMPLES = (
    b"this is not an access log line",
    b'10.0.0.1 - - [31/Foo/2026:99:99:99 +0000] "GET / HTTP/1.1" 200 1 "-" "-"',
    b"",
    b"\xff\xfe\x00 binary garbage",
    b'999.1.2 - - "GET / HTTP/1.1" 200',
)


@dataclass(frozen=True)
class LogLine:
    value: bytes
    ip: str | None
    event_time: datetime | None

    @property
    def malformed(self) -> bool:
        return self.ip is None


def format_line(ip: str, when: datetime) -> bytes:
    stamp = when.strftime("%d/%b/%Y:%H:%M:%S +0000")
    return f'{ip} - - [{stamp}] "GET /index.html HTTP/1.1" 200 512 "-" "microbatch-datagen/1.0"'.encode()


def generate_lines(
    count: int,
    *,
    ips: int = 50,
    span_seconds: int = 60,
    out_of_order: float = 0.1,
    malformed: float = 0.02,
    start: datetime | None = None,
    seed: int = 7,
) -> list[LogLine]:
    """`count` lines whose event time advances over `span_seconds`, some shuffled back in time."""
    rng = random.Random(seed)
    start = start or datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
    addresses = [f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}" for i in range(1, ips + 1)]
    lines = []
    for i in range(count):
        if rng.random() < malformed:
            lines.append(LogLine(rng.choice(MALFORMED_SAMPLES), None, None))
            continue
        offset = span_seconds * i / max(count, 1)
        if rng.random() < out_of_order:
            offset = max(0.0, offset - rng.uniform(1, 8))
        when = (start + timedelta(seconds=offset)).replace(microsecond=0)
        ip = rng.choice(addresses)
        lines.append(LogLine(format_line(ip, when), ip, when))
    return lines


def expected_counts(lines: Iterable[LogLine], window_seconds: int = 5) -> Counter[tuple[datetime, str]]:
    """The independent recount: requests per (window start, ip) of the well-formed lines."""
    counts: Counter[tuple[datetime, str]] = Counter()
    for line in lines:
        if line.malformed or line.event_time is None:
            continue
        epoch = int(line.event_time.timestamp())
        start = datetime.fromtimestamp(epoch - epoch % window_seconds, tz=UTC)
        counts[(start, line.ip)] += 1
    return counts


def produce_lines(
    bootstrap_servers: str,
    topic: str,
    lines: Iterable[LogLine],
    on_progress: Callable[[int], None] | None = None,
) -> list[tuple[int, int]]:
    """Send the lines, keyed by IP (malformed ones spread by the producer); return each line's
    acknowledged (partition, offset), in input order."""
    from kafka import KafkaProducer

    from microbatch.kafka_security import client_kwargs

    producer = KafkaProducer(bootstrap_servers=bootstrap_servers.split(","), acks="all", linger_ms=20,
                             batch_size=256 * 1024, enable_idempotence=True, **client_kwargs())
    coordinates: list[tuple[int, int]] = []
    pending = []

    def settle() -> None:
        producer.flush()
        for future in pending:
            metadata = future.get(timeout=30)
            coordinates.append((metadata.partition, metadata.offset))
        if on_progress and pending:
            on_progress(len(pending))
        pending.clear()

    try:
        for line in lines:
            pending.append(producer.send(topic, key=line.ip.encode() if line.ip else None, value=line.value))
            if len(pending) >= 5000:
                settle()
        settle()
    finally:
        producer.close()
    return coordinates
