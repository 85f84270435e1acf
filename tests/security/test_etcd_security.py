"""Every process reaches etcd over TLS with a client certificate, and as an etcd user.

etcd here requires client certificates (``--client-cert-auth``) and has its own authentication
on, with a ``magnetar`` user. Stores open with the right credentials and fail at once, saying
what to fix, with wrong ones; bookie and broker processes run against it, and refuse to start
with wrong credentials.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import magnetar.aio
from magnetar.common.errors import MetadataError, MetadataUnavailableError
from magnetar.testing import BrokerNode, LocalCluster
from magnetar.testing.etcd import EtcdServer, EtcdTls
from magnetar.testing.security import TestPki
from metadata import MetadataStore, MetadataStoreConfig, open_store
from metadata.config import EtcdSecuritySettings

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.etcd, pytest.mark.timeout(150)]

PASSWORD = "correct horse battery staple"


@dataclasses.dataclass
class SecureEtcd:
    server: EtcdServer
    pki: TestPki
    good: EtcdSecuritySettings
    root: Path

    def settings(self, **changes: object) -> MetadataStoreConfig:
        config = self.good.store_config(self.server.url)
        return dataclasses.replace(config, connect_timeout_ms=3000, **changes)  # type: ignore[arg-type]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def etcd(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SecureEtcd]:
    root = tmp_path_factory.mktemp("etcd-secure")
    pki = TestPki(root / "pki")
    server_cert = pki.issue("etcd", hosts=["127.0.0.1", "localhost"])
    client_cert = pki.issue("magnetar-client")
    tls = EtcdTls(
        server_cert.cert_file,
        server_cert.key_file,
        pki.ca_file,
        client_cert_file=client_cert.cert_file,
        client_key_file=client_cert.key_file,
    )
    server = EtcdServer(
        data_dir=root / "data",
        tls=tls,
        extra_args=["--auth-token", "simple", "--auth-token-ttl", "2"],
    )
    async with server:
        await server.enable_auth({"magnetar": PASSWORD})
        password_file = root / "password"
        password_file.write_text(PASSWORD + "\n")
        good = EtcdSecuritySettings(
            etcd_trust_certs_file=pki.ca_file,
            etcd_cert_file=client_cert.cert_file,
            etcd_key_file=client_cert.key_file,
            etcd_user="magnetar",
            etcd_password_file=password_file,
        )
        yield SecureEtcd(server, pki, good, root)


async def refused(config: MetadataStoreConfig) -> MetadataError:
    """The error that opening the store (and using it) with ``config`` gives."""

    async def open_and_use() -> None:
        store = await open_store(config)
        try:
            await store.put("/probe", b"x")
        finally:
            await store.close()

    with pytest.raises(MetadataError) as caught:
        await open_and_use()
    return caught.value


async def test_the_right_credentials_read_write_watch_and_keep_leases(etcd: SecureEtcd) -> None:
    store: MetadataStore = await open_store(etcd.settings())
    try:
        watch = await store.watch("/secure/")
        await store.put("/secure/a", b"1")
        event = await asyncio.wait_for(anext(aiter(watch)), 10)
        assert (event.key, event.value) == ("/secure/a", b"1")
        lease = await store.grant_lease(5)
        assert await store.keepalive(lease.lease_id) > 0
        await store.put("/secure/leased", b"x", lease_id=lease.lease_id)
        # etcd's token lives 2 s without use: the next call authenticates again by itself
        await asyncio.sleep(3)
        record = await store.get("/secure/a")
        assert record is not None
        assert record.value == b"1"
        await store.put("/secure/b", b"2")
        await watch.close()
    finally:
        await store.close()


async def test_wrong_credentials_fail_at_once_saying_what_to_fix(etcd: SecureEtcd) -> None:
    wrong_password = etcd.root / "wrong"
    wrong_password.write_text("not it")
    error = await refused(etcd.settings(etcd_password_file=wrong_password))
    assert "refused user 'magnetar': wrong user or password" in error.message
    assert PASSWORD not in error.message
    assert "not it" not in error.message

    # no user: etcd takes the certificate's common name, which has no role here
    no_user = await refused(etcd.settings(etcd_user=None, etcd_password_file=None))
    assert "permission denied" in no_user.message
    assert "etcd_user" in no_user.message

    no_certificate = await refused(etcd.settings(etcd_cert_file=None, etcd_key_file=None))
    assert isinstance(no_certificate, MetadataUnavailableError)
    assert "etcd_cert_file" in no_certificate.message

    other_ca = TestPki(etcd.root / "other").issue("magnetar-client")
    foreign = await refused(
        etcd.settings(etcd_cert_file=other_ca.cert_file, etcd_key_file=other_ca.key_file)
    )
    assert isinstance(foreign, MetadataUnavailableError)

    plaintext = await refused(
        dataclasses.replace(MetadataStoreConfig(url=etcd.server.url, connect_timeout_ms=2000))
    )
    assert isinstance(plaintext, MetadataUnavailableError)


async def test_servers_run_against_it_and_refuse_wrong_credentials(
    etcd: SecureEtcd, tmp_path: Path
) -> None:
    """A whole cluster on an etcd of its own with TLS and a user; then a broker given the wrong
    password exits at start, naming the setting."""
    pki = etcd.pki
    server_cert = pki.issue("etcd2", hosts=["127.0.0.1"])
    client_cert = pki.issue("cluster-client")
    tls = EtcdTls(
        server_cert.cert_file,
        server_cert.key_file,
        pki.ca_file,
        client_cert_file=client_cert.cert_file,
        client_key_file=client_cert.key_file,
    )
    async with LocalCluster(
        tmp_path / "cluster", bookies=3, brokers=1, etcd_tls=tls, etcd_user=("magnetar", "pw-1")
    ) as cluster:
        async with magnetar.aio.Client(cluster.service_url) as client:
            consumer = await client.subscribe("over-secure-etcd", "s", initial_position="earliest")
            producer = await client.create_producer("over-secure-etcd")
            await producer.send(b"stored with etcd behind TLS and a password")
            message = await consumer.receive(timeout_millis=10_000)
            assert message.data() == b"stored with etcd behind TLS and a password"
        wrong = tmp_path / "wrong-password"
        wrong.write_text("pw-2")
        node = BrokerNode(
            cluster.metadata_url,
            broker_id="intruder",
            log_path=tmp_path / "intruder.log",
            extra_args=[
                *("--etcd-trust-certs-file", str(pki.ca_file)),
                *("--etcd-cert-file", str(client_cert.cert_file)),
                *("--etcd-key-file", str(client_cert.key_file)),
                *("--etcd-user", "magnetar"),
                *("--etcd-password-file", str(wrong)),
            ],
        )
        with pytest.raises(RuntimeError, match="exited with code 1") as failed:
            await node.start(timeout_s=30)
        assert "wrong user or password" in str(failed.value)
        assert "pw-1" not in node.log_path.read_text()
        assert "pw-2" not in node.log_path.read_text()
