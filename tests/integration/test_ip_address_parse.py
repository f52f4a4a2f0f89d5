"""The ip_count address check, run as the real Spark expression on a local Spark, against Python's
`ipaddress`, the reference: over a corpus of valid and invalid addresses, and seeded random strings,
Spark accepts exactly what `ipaddress.ip_address` accepts. Then through the whole parse: a line whose
client field is not an address is a dead letter whose reason names it; any other is counted under it."""

from __future__ import annotations

import ipaddress
import random
from datetime import UTC, datetime

import pytest

from microbatch.dev.datagen import format_line
from spark_jobs.ip_count import IpCount, is_ip_address

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)

CORPUS = [
    # IPv4
    "0.0.0.0", "255.255.255.255", "1.2.3.4", "10.0.0.1", "192.168.1.254", "199.99.9.0", "249.250.251.252",
    "256.1.1.1", "1.256.1.1", "1.1.1.256", "999.1.1.1", "300.1.1.1", "260.0.0.1", "1000.1.1.1",
    "1.2.3", "1.2.3.4.5", "1.2.3.", ".1.2.3", "1..2.3", "1.2.3.4.", "...", "1.2.3.-4", "+1.2.3.4", "0x1.2.3.4",
    "01.2.3.4", "1.02.3.4", "1.2.3.00", "00.0.0.0", "0.0.0.01",
    " 1.2.3.4", "1.2.3.4 ", "1.2.3.4\n", "\n1.2.3.4", "1.2.3.4%eth0", "1.2.3.4/24", "\uff11.2.3.4", "1.2.3.\u0664",
    "", " ", "-", "localhost", "a.b.c.d",
    # IPv6
    "::", "::1", "1::", "::0", "0::0", "fe80::1", "2001:db8::1", "2001:DB8::ABCD", "2001:0db8:0000:0000::0001",
    "1:2:3:4:5:6:7:8", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8",
    "1::8", "1:2::7:8", "1:2:3:4:5::8", "1::3:4:5:6:7:8",
    "1:2:3:4:5:6:7:8:9", "1:2:3:4:5:6:7", "1:2:3:4:5:6:7:8::", "::1:2:3:4:5:6:7:8", "1::2:3:4:5:6:7:8",
    "1:2:3:4:5:6:7::8", ":1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8:", "1:2:3:4:5:6:7:", ":1::", "1::2:",
    "2001:db8:::1", ":::", "1:::", ":::1", "2001:db8::1::1", "::1::", ":", "1:2", "1::2::3",
    "gggg::1", "12345::", "2001:db8::00001", "2001:db8::fffff", "2001:db8::g", "2001:db8::-1", "2001:db8:: 1",
    "fe80::1%eth0", "fe80::1%1", "fe80::1%", "fe80::1%%", "fe80::1%a%b", "::1%lo", "fe80::1 %eth0",
    # IPv6 with an IPv4 suffix
    "::ffff:192.0.2.1", "::192.0.2.1", "::ffff:0.0.0.0", "64:ff9b::192.0.2.33", "1:2:3:4:5:6:1.2.3.4",
    "1:2:3:4:5::1.2.3.4", "1::1.2.3.4", "::1:2:3:4:5:1.2.3.4", "fe80::1:1.2.3.4%eth0",
    "::ffff:999.0.2.1", "::ffff:01.2.3.4", "::ffff:1.2.3", "::ffff:1.2.3.4.5", "1:2:3:4:5:6:7:1.2.3.4",
    "1:2:3:4:5:6::1.2.3.4", "::1:2:3:4:5:6:1.2.3.4", "1.2.3.4::", "::1.2.3.4:1", "::ffff:1.2.3.4%",
    "1.2.3.4:1:2:3:4:5:6", ":1.2.3.4", ":::1.2.3.4",
]


def is_reference_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def random_candidates(count: int, seed: int) -> list[str]:
    """Seeded strings near the valid forms (an octet over 255, a hextet too many, a second `::`, a stray
    character) and strings of address-like pieces, so that near misses of both families are frequent."""
    rng = random.Random(seed)
    pieces = ["0", "1", "9", "00", "01", "10", "99", "199", "249", "250", "255", "256", "299", "ff", "FFFF",
              "0db8", "fffff", "g", ":", "::", ":", ".", ".", ":", "%eth0", "%"]
    candidates = []
    for _ in range(count):
        family = rng.choice(["v4", "v6", "v6v4", "pieces"])
        if family == "v4":
            text = ".".join(str(rng.randrange(0, 270)) for _ in range(4))
        elif family == "pieces":
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        else:
            size = (8 if family == "v6" else 6) + rng.choice([0, 0, 0, 0, -1, 1])
            hextets = [f"{rng.randrange(0, 0x10000):x}" for _ in range(size)]
            if rng.random() < 0.6:  # `::` for a run of hextets, or for none
                cut = rng.randrange(len(hextets) + 1)
                hextets[cut:cut + rng.randint(0, 3)] = [""]
                if hextets[0] == "":
                    hextets.insert(0, "")
                if hextets[-1] == "" and family == "v6":
                    hextets.append("")
            text = ":".join(hextets)
            if family == "v6v4":
                text += ":" + ".".join(str(rng.randrange(0, 270)) for _ in range(4))
            if rng.random() < 0.1:
                text += rng.choice(["%eth0", "%1", "%"])
        if rng.random() < 0.2:
            position = rng.randrange(len(text) + 1)
            text = text[:position] + rng.choice(["0", ":", ".", "1", "::", "g"]) + text[position:]
        candidates.append(text)
    return candidates


def spark_accepts(spark, texts: list[str]) -> dict[str, bool]:
    from pyspark.sql import functions as F

    frame = spark.createDataFrame([(t,) for t in texts], "text string")
    return {row.text: row.ok for row in frame.select("text", is_ip_address(F.col("text")).alias("ok")).collect()}


def test_corpus_is_a_mix_of_valid_and_invalid():
    valid = [t for t in CORPUS if is_reference_address(t)]
    assert len(CORPUS) >= 60 and len(valid) >= 25 and len(CORPUS) - len(valid) >= 25
    # The cases the parse must get right, as Python 3.11's ipaddress decides them.
    assert is_reference_address("fe80::1%eth0")  # a scope id is part of an IPv6 address (RFC 4007)
    assert not is_reference_address("01.2.3.4")   # leading zeros are refused, as glibc's inet_pton does


@pytest.mark.parametrize("corpus", ["fixed", "random"])
def test_spark_accepts_exactly_what_ipaddress_accepts(spark, corpus):
    texts = CORPUS if corpus == "fixed" else random_candidates(3_000, seed=16)
    got = spark_accepts(spark, texts)
    wrong = {t: got[t] for t in texts if got[t] != is_reference_address(t)}
    assert not wrong, f"Spark disagrees with ipaddress on (text: Spark's answer): {wrong}"
    if corpus == "random":  # both answers are frequent, or the comparison proves little
        assert len(got) / 10 < sum(got.values()) < len(got) * 9 / 10


def test_parse_counts_valid_client_addresses_and_dead_letters_the_rest(spark):
    from pyspark.sql import functions as F

    # A log line's client field ends at the first space, so only strings without whitespace can be one.
    addresses = [t for t in CORPUS if t and not any(c.isspace() for c in t)]
    records = spark.createDataFrame(
        [("t", 0, i, format_line(a, T0), T0) for i, a in enumerate(addresses)],
        "topic string, partition int, offset long, value binary, timestamp timestamp")
    parsed = IpCount().parse(records, {}, {}).select("offset", "ip", "error", F.col("late")).collect()
    assert len(parsed) == len(addresses)
    for row in sorted(parsed, key=lambda r: r.offset):
        address = addresses[row.offset]
        if is_reference_address(address):
            assert (row.error, row.ip, row.late) == (None, address, False), address
        else:
            assert row.error == f"client address '{address}' is not a valid IPv4 or IPv6 address", address


def test_reason_of_a_long_client_field_is_bounded(spark):
    field = "1." * 400
    records = spark.createDataFrame([("t", 0, 0, format_line(field, T0), T0)],
                                    "topic string, partition int, offset long, value binary, timestamp timestamp")
    (row,) = IpCount().parse(records, {}, {}).collect()
    assert row.error.startswith(f"client address '{field[:100]}...' is not")
    assert len(row.error) < 200
