"""The Spark connector's ``tls.*`` and ``auth.*`` options, against a real secure broker.

One ``magnetar standalone`` for the module with a TLS listener, token authentication and
authorization on; the Spark session is the shared one (conftest.py). Roles: ``admin`` (a
superuser) sets up, ``etl`` may produce and consume in ``acme/spark``, ``writer`` may only
produce there. Besides what works, the tests check where a token must never show: the plans
Spark prints, the connector's reprs, log lines and error messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import io as text_io
import json
import logging
import pickle
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_asyncio

pytest.importorskip("pyspark", reason="pip install magnetar[spark]")

from pyspark.sql import SparkSession

from magnetar.aio import AdminClient, AuthenticationTLS, AuthenticationToken, Client
from magnetar.aio.message import Message
from magnetar.common.errors import InvalidArgumentError
from magnetar.spark import io
from magnetar.spark.options import (
    Secret,
    parse_read_options,
    parse_write_options,
)
from magnetar.spark.planning import OffsetRange
from magnetar.testing import StandaloneNode
from magnetar.testing.security import TestPki, TestTokens

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

T = TypeVar("T")
NAMESPACE = "acme/spark"


@dataclass(frozen=True)
class Secure:
    node: StandaloneNode
    url: str
    """The broker's ``magnetar+ssl://`` URL."""
    ca_file: Path
    admin_token: str
    etl_token: str
    etl_token_file: Path
    writer_token_file: Path

    def options(self, token_file: Path | None = None, **extra: str) -> dict[str, str]:
        """Options for ``etl`` (or the role of ``token_file``) over TLS."""
        return {
            "serviceUrl": self.url,
            "tls.trustCertsFilePath": str(self.ca_file),
            "auth.tokenFile": str(token_file or self.etl_token_file),
            **extra,
        }

    def admin(self) -> AdminClient:
        return AdminClient(
            self.url,
            authentication=AuthenticationToken(self.admin_token),
            tls_trust_certs_file_path=str(self.ca_file),
        )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secure(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Secure]:
    root = tmp_path_factory.mktemp("spark-secure")
    pki = TestPki(root / "pki")
    broker = pki.issue("broker")
    tokens = TestTokens(root / "tokens")
    args = [
        *("--tls-cert-file", str(broker.cert_file), "--tls-key-file", str(broker.key_file)),
        *("--authentication-enabled", "true", *tokens.broker_args),
        *("--superuser-roles", "admin", "--authorization-enabled", "true"),
    ]
    async with StandaloneNode(root / "data", extra_args=args) as node:
        etl_file = tokens.write("etl")
        secure = Secure(
            node=node,
            url=node.tls_service_url,
            ca_file=pki.ca_file,
            admin_token=tokens.create("admin"),
            etl_token=etl_file.read_text(),
            etl_token_file=etl_file,
            writer_token_file=tokens.write("writer"),
        )
        async with secure.admin() as admin:
            await admin.create_tenant("acme", ["acme-admin"])
            await admin.create_namespace(NAMESPACE)
            await admin.grant_permission(NAMESPACE, "etl", ["produce", "consume"])
            await admin.grant_permission(NAMESPACE, "writer", ["produce"])
        yield secure


async def spark_call(fn: Callable[[], T]) -> T:
    def call() -> T:
        # a write looks its Python data source up in the thread's active session
        session = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
        session._jvm.SparkSession.setActiveSession(session._jsparkSession)  # type: ignore[union-attr]
        return fn()

    return await asyncio.to_thread(call)


def printed(fn: Callable[[], Any]) -> str:
    """What ``fn`` prints (``explain`` prints its plans)."""
    out = text_io.StringIO()
    with contextlib.redirect_stdout(out):
        fn()
    return out.getvalue()


def read(spark: SparkSession, options: dict[str, str]) -> Any:
    reader = spark.read.format("magnetar")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


async def create_topic(secure: Secure, name: str, partitions: int = 2) -> str:
    topic = f"{NAMESPACE}/{name}-{uuid.uuid4().hex[:8]}"
    async with secure.admin() as admin:
        await admin.create_topic(topic, partitions=partitions)
    return topic


# --- what works ---------------------------------------------------------------------------------


async def test_a_batch_write_then_read_over_tls_with_a_token_file(
    spark: SparkSession, secure: Secure
) -> None:
    topic = await create_topic(secure, "batch")
    rows = [(f"v{i}", f"k{i % 7}") for i in range(300)]
    df = spark.createDataFrame(rows, "value STRING, key STRING")

    def write() -> None:
        writer = df.write.format("magnetar").mode("append").option("topic", topic)
        for name, value in secure.options().items():
            writer = writer.option(name, value)
        writer.save()

    await spark_call(write)
    back = read(spark, secure.options(topic=topic)).selectExpr("CAST(value AS STRING) v", "key")
    got = await spark_call(back.collect)
    assert sorted((r["v"], r["key"]) for r in got) == sorted(rows)

    # the token given as a value: the batch plan shows no option at all
    given = {**secure.options(topic=topic), "auth.token": secure.etl_token}
    del given["auth.tokenFile"]
    inline = read(spark, given)
    assert await spark_call(inline.count) == 300
    plan = await spark_call(lambda: printed(lambda: inline.explain(True)))
    assert "BatchScan magnetar" in plan
    assert secure.etl_token not in plan


async def test_a_streaming_query_reads_and_writes_over_tls_with_the_token_out_of_its_plans(
    spark: SparkSession, secure: Secure, tmp_path: Path
) -> None:
    source, target = await create_topic(secure, "src"), await create_topic(secure, "dst", 3)
    async with Client(
        secure.url,
        authentication=AuthenticationToken(secure.admin_token),
        tls_trust_certs_file_path=str(secure.ca_file),
    ) as client:
        producer = await client.create_producer(source)
        await asyncio.gather(*(producer.send_async(f"s{i}".encode()) for i in range(200)))
        await producer.close()
    # the token as a value on the read, a file on the write
    options = {**secure.options(), "auth.token": secure.etl_token}
    del options["auth.tokenFile"]
    reader = spark.readStream.format("magnetar").option("topic", source)
    for name, value in options.items():
        reader = reader.option(name, value)
    stream = reader.option("startingOffsets", "earliest").load().select("value", "key")
    plan = await spark_call(lambda: printed(lambda: stream.explain(True)))
    # Spark prints a streaming source's options in its logical plan, and redacts the values
    # of those whose names match spark.redaction.regex ("token" among them)
    assert "auth.token=*********(redacted)" in plan
    assert secure.etl_token not in plan

    writer = stream.writeStream.format("magnetar").option("topic", target)
    for name, value in secure.options().items():
        writer = writer.option(name, value)
    query = (
        writer.option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    await spark_call(query.awaitTermination)
    assert query.exception() is None
    plans = await spark_call(lambda: printed(lambda: query.explain(True)))
    progress = json.dumps(query.recentProgress, default=str)
    assert secure.etl_token not in plans + progress

    back = read(spark, secure.options(topic=target)).selectExpr("CAST(value AS STRING) v")
    got = await spark_call(back.collect)
    assert sorted(r["v"] for r in got) == sorted(f"s{i}" for i in range(200))


async def test_a_read_with_a_client_certificate(spark: SparkSession, tmp_path: Path) -> None:
    # a broker that trusts a CA for client certificates requires one of every client, so this
    # is a broker of its own
    pki = TestPki(tmp_path / "pki")
    broker, etl = pki.issue("broker"), pki.issue("etl")
    args = [
        *("--tls-cert-file", str(broker.cert_file), "--tls-key-file", str(broker.key_file)),
        *("--tls-trust-certs-file", str(pki.ca_file)),
        *("--authentication-enabled", "true", "--authentication-providers", "tls"),
        *("--superuser-roles", "etl", "--authorization-enabled", "true"),
    ]
    async with StandaloneNode(tmp_path / "data", bookies=1, extra_args=args) as node:
        async with Client(
            node.tls_service_url,
            authentication=AuthenticationTLS(etl.cert_file, etl.key_file),
            tls_trust_certs_file_path=str(pki.ca_file),
        ) as client:
            producer = await client.create_producer("by-certificate")
            await asyncio.gather(*(producer.send_async(b"c") for _ in range(20)))
            await producer.close()
        options = {
            "serviceUrl": node.tls_service_url,
            "topic": "by-certificate",
            "tls.trustCertsFilePath": str(pki.ca_file),
            "tls.certFilePath": str(etl.cert_file),
            "tls.keyFilePath": str(etl.key_file),
        }
        assert await spark_call(read(spark, options).count) == 20


# --- refusals -----------------------------------------------------------------------------------


async def test_a_read_without_a_valid_token_is_refused_without_quoting_it(
    spark: SparkSession, secure: Secure, tmp_path: Path
) -> None:
    topic = await create_topic(secure, "refused")
    anonymous = secure.options(topic=topic)
    del anonymous["auth.tokenFile"]
    with pytest.raises(Exception, match=r"AuthenticationError: .*no credentials"):
        await spark_call(read(spark, anonymous).count)

    # a token signed with another key
    forged = TestTokens(tmp_path / "other").create("etl")
    with pytest.raises(Exception, match="AuthenticationError") as refused:
        await spark_call(read(spark, {**anonymous, "auth.token": forged}).count)
    assert forged not in str(refused.value)


async def test_a_role_without_consume_permission_is_refused(
    spark: SparkSession, secure: Secure
) -> None:
    topic = await create_topic(secure, "produce-only")
    async with Client(
        secure.url,
        authentication=AuthenticationToken(secure.admin_token),
        tls_trust_certs_file_path=str(secure.ca_file),
    ) as client:
        producer = await client.create_producer(topic)
        await producer.send(b"one")
        await producer.close()
    df = read(spark, secure.options(secure.writer_token_file, topic=topic))
    with pytest.raises(Exception, match=f"AuthorizationError.*may not consume from {NAMESPACE}"):
        await spark_call(df.count)


async def test_bad_security_options_fail_naming_the_option(
    spark: SparkSession, secure: Secure, tmp_path: Path
) -> None:
    topic = f"{NAMESPACE}/anything"
    missing = tmp_path / "no-such.token"
    cases = [
        (secure.options(missing, topic=topic), "option auth.tokenFile: cannot read"),
        (
            {**secure.options(topic=topic), "serviceUrl": secure.node.service_url},
            "option tls.trustCertsFilePath is for TLS connections",
        ),
        (
            {**secure.options(topic=topic), "auth.token": secure.etl_token},
            "give one of the options auth.token and auth.tokenFile",
        ),
        ({**secure.options(topic=topic), "auth.token_file": "x"}, "did you mean auth.tokenFile"),
    ]
    for options, expected in cases:
        with pytest.raises(Exception, match=expected) as failed:
            await spark_call(read(spark, options).count)
        assert secure.etl_token not in str(failed.value)


# --- where a token must not show ----------------------------------------------------------------


async def test_option_objects_print_no_token() -> None:
    token = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.not-to-be-printed"
    options = {"serviceUrl": "magnetar+ssl://h:6651", "topic": "t", "auth.token": token}
    parsed: list[Any] = [
        parse_read_options(options, streaming=False),
        parse_read_options(options, streaming=True),
        parse_write_options(options),
    ]
    for each in parsed:
        security = each.security
        for shown in (repr(each), str(each), f"{each}", repr(security), f"{security.token}"):
            assert token not in shown
            assert "***" in shown
        assert pickle.loads(pickle.dumps(each)) == each  # it travels to the executors
        assert security.token.reveal() == token
    assert token not in repr(io.client_arguments(parsed[0]))
    assert Secret(token) == Secret(token)
    with pytest.raises(InvalidArgumentError) as failed:
        parse_read_options({**options, "auth.tokenFile": "/t"}, streaming=False)
    assert token not in str(failed.value)


async def test_the_connector_logs_no_token(
    secure: Secure, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """The connector's own code, run in this process (as it runs in Spark's workers), with
    every log record captured."""
    topic = await create_topic(secure, "logs")
    given = {**secure.options(topic=topic), "auth.token": secure.etl_token}
    del given["auth.tokenFile"]
    caplog.set_level(logging.DEBUG)
    write = parse_write_options(given)
    result = await asyncio.to_thread(
        io.write_rows,
        iter([{"value": f"m{i}".encode()} for i in range(50)]),
        write,
        producer_name="log-test",
        sequence_base=0,
        spark_partition=0,
    )
    assert result.written == 50
    options = parse_read_options(given, streaming=False)
    found = await asyncio.to_thread(io.discover, options)

    def read_all() -> list[bytes]:
        values: list[bytes] = []
        for p in found:
            r = OffsetRange(p.topic, p.partition, p.earliest, p.next)
            values += io.read_range(r, options, Message.data)
        return values

    assert len(await asyncio.to_thread(read_all)) == 50
    captured = capsys.readouterr()
    assert caplog.records, "nothing was logged: the check below would prove nothing"
    logged = caplog.text + captured.out + captured.err
    assert secure.etl_token not in logged
