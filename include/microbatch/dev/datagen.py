"""Sample nginx access-log lines for `ip_count`, with out-of-order and malformed lines.

`generate_lines` is seeded and, given a `start`, pure, so a test can recount the input independently.
Without one its lines start at the wall clock, so a second demo's lines follow the first's.
`produce_lines` sends them with kafka-python, keyed by IP, with a progress bar.
"""

from __future__ import annotations

import ipaddress
import json
import random
import re
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
# Client fields that are not addresses, sent as well-formed lines: only the address makes them dead letters.
INVALID_ADDRESSES = ("999.1.1.1", "256.0.0.1", "10.0.0.01", "1.2.3", "2001:db8:::1", "12345::1", "::ffff:999.0.2.1")


def is_ip_address(text: str) -> bool:
    """Whether `text` is an IPv4 or IPv6 address to Python's `ipaddress`, the reference the Spark parse is held
    to; the recount uses it, not the parse, so that it stays independent."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class LogLine:
    value: bytes
    ip: str | None
    event_time: datetime | None

    @property
    def malformed(self) -> bool:
        """Whether the pipeline must make this line a dead letter: it has no client address and time, or its
        client address is not one."""
        return self.ip is None or self.event_time is None or not is_ip_address(self.ip)

_STAMP = re.compile(rb"\[(\d{2}/\w{3}/\d{4}:\d{2}:\d{2}:\d{2} [+-]\d{4})\]")


def format_line(ip: str, when: datetime) -> bytes:
    stamp = when.strftime("%d/%b/%Y:%H:%M:%S +0000")
    return f'{ip} - - [{stamp}] "GET /index.html HTTP/1.1" 200 512 "-" "microbatch-datagen/1.0"'.encode()


def event_time_of(value: bytes | None) -> datetime | None:
    """The event time of a line `format_line` wrote, or None for anything else."""
    match = _STAMP.search(value or b"")
    if not match:
        return None
    try:
        return datetime.strptime(match.group(1).decode(), "%d/%b/%Y:%H:%M:%S %z")
    except ValueError:
        return None


def next_start(bootstrap_servers: str, topic: str, tail: int = 200) -> datetime:
    """Where a new generation into `topic` starts: now, or just after the latest event time among the last
    `tail` records of each partition if that is later, so that lines generated right after others are never
    behind their watermark."""
    from kafka import TopicPartition

    from microbatch.kafka import clients
    from microbatch.settings import KafkaSettings, kafka_security

    now = datetime.now(UTC).replace(microsecond=0)
    consumer = clients.consumer(KafkaSettings(bootstrap_servers, kafka_security()), group_id=None,
                                enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not tps:
            return now
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, max(0, ends[tp] - tail))
        latest = None
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            batches = consumer.poll(timeout_ms=1000)
            if not batches:
                break
            times = [event_time_of(r.value) for records in batches.values() for r in records]
            latest = max([t for t in times if t is not None] + ([latest] if latest else []), default=None)
    finally:
        consumer.close()
    return max(now, latest + timedelta(seconds=1)) if latest else now


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
    """`count` lines whose event time advances over `span_seconds` from `start`, some shuffled back in time
    (never before `start`). `start` defaults to now (UTC, to the second), so a generation started `span_seconds`
    or more after another lies wholly after it, beyond its watermark. The same `seed` and `start` give the same
    lines."""
    rng = random.Random(seed)
    start = datetime.now(UTC).replace(microsecond=0) if start is None else start
    addresses = [f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}" for i in range(1, ips + 1)]
    lines = []
    for i in range(count):
        offset = span_seconds * i / max(count, 1)
        if rng.random() < malformed:
            pick = rng.randrange(len(MALFORMED_SAMPLES) + len(INVALID_ADDRESSES))
            if pick < len(MALFORMED_SAMPLES):
                lines.append(LogLine(MALFORMED_SAMPLES[pick], None, None))
            else:
                when = (start + timedelta(seconds=offset)).replace(microsecond=0)
                ip = INVALID_ADDRESSES[pick - len(MALFORMED_SAMPLES)]
                lines.append(LogLine(format_line(ip, when), ip, when))
            continue
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
    from microbatch.kafka import clients
    from microbatch.settings import KafkaSettings, kafka_security

    producer = clients.producer(KafkaSettings(bootstrap_servers, kafka_security()), acks="all", linger_ms=20,
                                batch_size=256 * 1024, enable_idempotence=True)
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


# JSON click events for `clicks` (spark_jobs/clicks.py): {"user": "u1", "page": "/home", "ts": "...Z"}.
MALFORMED_CLICKS = (
    b"{not json",
    b'{"user": "u1", "page": "/a"}',
    b'{"user": "u1", "page": "/a", "ts": "yesterday"}',
    b"[1, 2, 3]",
    b'{"user": 5, "page": null, "ts": "2026-11-25T10:00:00Z"}',
)


@dataclass(frozen=True)
class Click:
    value: bytes
    user: str | None
    event_time: datetime | None

    @property
    def ip(self) -> str | None:
        """The Kafka key `produce_lines` sends: the user."""
        return self.user

    @property
    def malformed(self) -> bool:
        return self.user is None or self.event_time is None


def format_click(user: str, page: str | None, when: datetime, *, forget: bool = False) -> bytes:
    payload: dict[str, object] = {"user": user, "ts": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if forget:
        payload["forget"] = True
    else:
        payload["page"] = page
    return json.dumps(payload).encode()


def generate_clicks(
    count: int,
    *,
    users: int = 50,
    pages: int = 10,
    span_seconds: int = 180,
    malformed: float = 0.02,
    late: float = 0.02,
    forget: float = 0.01,
    start: datetime | None = None,
    seed: int = 7,
) -> list[Click]:
    """`count` JSON clicks whose event time advances over
    `span_seconds` from `start` (default now). A `malformed` share are dead letters; a `late` share, all at the
    end, carry times of the first seconds, behind the watermark by then; a `forget` share are tombstones of
    their user. The same `seed` and `start` give the same clicks."""
    rng = random.Random(seed)
    start = datetime.now(UTC).replace(microsecond=0) if start is None else start
    names = [f"u{i}" for i in range(users)]
    paths = ["/"] + [f"/page/{i}" for i in range(1, pages)]
    late_count = int(count * late)
    clicks = []
    for i in range(count - late_count):
        if rng.random() < malformed:
            clicks.append(Click(rng.choice(MALFORMED_CLICKS), None, None))
            continue
        when = (start + timedelta(seconds=span_seconds * i / max(count, 1))).replace(microsecond=0)
        user = rng.choice(names)
        gone = rng.random() < forget
        clicks.append(Click(format_click(user, None if gone else rng.choice(paths), when, forget=gone), user, when))
    for _ in range(late_count):
        when = start + timedelta(seconds=rng.randrange(10))
        user = rng.choice(names)
        clicks.append(Click(format_click(user, rng.choice(paths), when), user, when))
    return clicks
