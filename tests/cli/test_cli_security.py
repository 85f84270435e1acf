"""``magnetar tokens``, ``tenants``, ``namespaces`` and the credential options of every client
command, as a user runs them: the CLI as subprocesses against one real cluster for the module
(etcd, 3 bookies, a broker with authentication, authorization and a TLS listener), whose token
key and superuser token were made by the CLI itself.

The broker's certificate names ``localhost`` only, so a ``magnetar+ssl://127.0.0.1`` URL needs
``--tls-allow-hostname-mismatch``: that is how the hostname check is shown to be real. A second
broker, started for one test, verifies RS256 tokens with a CLI-made public key and requires
client certificates (mutual TLS).

What needs no broker (key files, ``tokens create`` and ``show``, usage errors, ``--help``) runs
through the same :func:`magnetar.cli.main` in this process, which is much quicker than a CLI
process; ``tokens validate`` sets up logging, so it runs as a process too."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import stat
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from magnetar.aio import AdminClient, AuthenticationToken
from magnetar.cli import main
from magnetar.cli import tokens as cli_tokens
from magnetar.cli.support import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from magnetar.common.security import tokens
from magnetar.testing import LocalCluster
from magnetar.testing.security import TestPki, TestTokens

on_cluster = pytest.mark.asyncio(loop_scope="module")

ENV = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith("MAGNETAR_")  # no service URL, token or TLS setting of the caller's
} | {"GRPC_VERBOSITY": "ERROR"}

AUTHENTICATION_REQUIRED = "authentication is required: no credentials were presented"


@pytest.fixture(autouse=True)
def _no_magnetar_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process runs see none of the caller's MAGNETAR_* settings either."""
    for name in [name for name in os.environ if name.startswith("MAGNETAR_")]:
        monkeypatch.delenv(name)


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


async def magnetar(*args: str, env: Mapping[str, str] | None = None, stdin: bytes = b"") -> Run:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "magnetar.cli",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=ENV | dict(env or {}),
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(stdin), 60)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return Run(process.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


def ok(run: Run) -> Run:
    assert run.code == EXIT_OK, str(run)
    assert "Traceback" not in run.err, str(run)
    return run


def failed(
    run: Run, message: str, *, code: int = EXIT_FAILED, secrets: tuple[str, ...] = ()
) -> Run:
    """``run`` failed with ``code`` and ``message`` on stderr, no traceback, nothing on stdout
    and none of ``secrets`` anywhere."""
    assert run.code == code, str(run)
    assert message in run.err, str(run)
    assert "Traceback" not in run.err, str(run)
    assert run.out == "", str(run)
    for secret in secrets:
        assert secret not in run.out + run.err, str(run)
    return run


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- the cluster ---------------------------------------------------------------------------------


@dataclass
class Secure:
    cluster: LocalCluster
    root: Path
    keys: Path
    """What the CLI made: secret.key (the broker's), private.pem and public.pem (RS256)."""
    pki: TestPki
    admin_token: str
    """A superuser's token, made by the CLI with the broker's key."""
    admin_token_file: Path
    alice_token: str
    """An ordinary role's."""
    alice_token_file: Path

    @property
    def url(self) -> tuple[str, str]:
        return ("--service-url", self.cluster.service_url)

    @property
    def admin(self) -> tuple[str, ...]:
        return (*self.url, "--auth-token-file", str(self.admin_token_file))

    @property
    def alice(self) -> tuple[str, ...]:
        return (*self.url, "--auth-token-file", str(self.alice_token_file))

    def admin_client(self) -> AdminClient:
        """The test's own superuser client, to set things up."""
        return AdminClient(
            self.cluster.service_url,
            authentication=AuthenticationToken(self.admin_token),
            operation_timeout_s=10,
        )

    @property
    def tls_port(self) -> str:
        return self.cluster.tls_service_url.rsplit(":", 1)[1]


async def make_token(secret_key: Path, role: str, *extra: str) -> str:
    token = ok(
        await magnetar(
            "tokens", "create", "--secret-key", f"file://{secret_key}", "-s", role, *extra
        )
    ).out
    assert token.endswith("\n")
    assert "\n" not in token.strip()
    return token.strip()


def write_private(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secure(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Secure]:
    root = tmp_path_factory.mktemp("cli-security")
    keys = root / "keys"
    keys.mkdir()
    made = await asyncio.gather(
        magnetar("tokens", "create-secret-key", "--output", str(keys / "secret.key")),
        magnetar(
            "tokens", "create-key-pair",
            "--output-private-key", str(keys / "private.pem"),
            "--output-public-key", str(keys / "public.pem"),
        ),
    )  # fmt: skip
    for run in made:
        ok(run)
    pki = TestPki(root / "pki")
    server = pki.issue("broker", hosts=["localhost"])
    pki.issue("admin")  # a client certificate for the mutual-TLS broker
    broker_args = [
        "--tls-port", "0",
        "--tls-cert-file", str(server.cert_file),
        "--tls-key-file", str(server.key_file),
        "--authentication-enabled", "true",
        "--token-secret-key-file", str(keys / "secret.key"),
        "--superuser-roles", "admin",
        "--authorization-enabled", "true",
    ]  # fmt: skip
    async with LocalCluster(
        root / "cluster", bookies=3, brokers=1, broker_args=broker_args
    ) as cluster:
        admin_token, alice_token = await asyncio.gather(
            make_token(keys / "secret.key", "admin"), make_token(keys / "secret.key", "alice")
        )
        yield Secure(
            cluster=cluster,
            root=root,
            keys=keys,
            pki=pki,
            admin_token=admin_token,
            admin_token_file=write_private(root / "admin.token", admin_token),
            alice_token=alice_token,
            alice_token_file=write_private(root / "alice.token", alice_token),
        )


# --- tenants and namespaces ----------------------------------------------------------------------


@on_cluster
async def test_tenants_and_namespaces_as_a_superuser(secure: Secure) -> None:
    admin = secure.admin
    tenant = unique("acme")
    namespace = f"{tenant}/orders"
    topic = f"{namespace}/events"

    created = ok(await magnetar("tenants", "create", tenant, "-r", "acme-ops, team-a", *admin))
    assert created.out.strip() == f"created tenant {tenant} (admin roles: acme-ops, team-a)"
    listing, listing_json, got, got_json, made_ns = await asyncio.gather(
        magnetar("tenants", "list", *admin),
        magnetar("tenants", "list", "--json", *admin),
        magnetar("tenants", "get", tenant, *admin),
        magnetar("tenants", "get", tenant, "--json", *admin),
        magnetar("namespaces", "create", namespace, *admin),
    )
    assert ok(listing).out.splitlines()[0] == "TENANT"
    assert tenant in listing.out.split()
    assert tenant in ok(listing_json).json()
    assert ok(got).out.splitlines() == [f"tenant       {tenant}", "admin roles  acme-ops, team-a"]
    assert ok(got_json).json() == {"tenant": tenant, "admin_roles": ["acme-ops", "team-a"]}
    assert ok(made_ns).out.strip() == f"created namespace {namespace}"

    updated, granted, granted_json, made_topic = await asyncio.gather(
        magnetar("tenants", "update", tenant, "--admin-roles", "acme-ops", *admin),
        magnetar(
            "namespaces", "grant-permission", namespace,
            "--role", "alice", "--actions", "produce,consume", *admin,
        ),
        magnetar(
            "namespaces", "grant-permission", namespace, "--role", "bob", "--actions", "consume",
            "--json", *admin,
        ),
        magnetar("topics", "create", topic, *admin),
    )  # fmt: skip
    ok(made_topic)
    assert ok(updated).out.strip() == f"updated tenant {tenant} (admin roles: acme-ops)"
    assert ok(granted).out.strip() == f"granted produce, consume on {namespace} to role alice"
    assert ok(granted_json).json() == {
        "namespace": namespace,
        "role": "bob",
        "actions": ["consume"],
    }

    # alice, granted on the namespace, produces and consumes with her own token
    namespaces, permissions, permissions_json, got_json, produced, consumed = await asyncio.gather(
        magnetar("namespaces", "list", tenant, "--json", *admin),
        magnetar("namespaces", "permissions", namespace, *admin),
        magnetar("namespaces", "permissions", namespace, "--json", *admin),
        magnetar("tenants", "get", tenant, "--json", *admin),
        magnetar("produce", topic, "-m", "hello", *secure.alice),
        magnetar(
            "consume", topic, "-s", "audit", "--position", "earliest", "--json", *secure.alice
        ),
    )
    assert ok(namespaces).json() == [namespace]
    assert ok(permissions).out.splitlines() == [
        "ROLE   ACTIONS",
        "alice  consume,produce",
        "bob    consume",
    ]
    assert ok(permissions_json).json() == {"alice": ["consume", "produce"], "bob": ["consume"]}
    assert ok(got_json).json()["admin_roles"] == ["acme-ops"]
    assert "published 1 message(s)" in ok(produced).out
    assert json.loads(ok(consumed).out)["value"] == "hello"

    # deleting goes from the leaves up: a tenant with namespaces stays
    revoked, not_empty, deleted_topic = await asyncio.gather(
        magnetar("namespaces", "revoke-permission", namespace, "--role", "bob", *admin),
        magnetar("tenants", "delete", tenant, *admin),
        magnetar("topics", "delete", topic, *admin),
    )
    assert ok(revoked).out.strip() == f"revoked the permissions of role bob on {namespace}"
    failed(not_empty, f"magnetar tenants: tenant '{tenant}' still has 1 namespace(s): {namespace}")
    ok(deleted_topic)
    remaining = ok(await magnetar("namespaces", "permissions", namespace, "--json", *admin))
    assert remaining.json() == {"alice": ["consume", "produce"]}
    deleted_ns = ok(await magnetar("namespaces", "delete", namespace, "--json", *admin))
    assert deleted_ns.json() == {"namespace": namespace, "deleted": True}
    deleted = ok(await magnetar("tenants", "delete", tenant, *admin))
    assert deleted.out.strip() == f"deleted tenant {tenant}"
    assert tenant not in ok(await magnetar("tenants", "list", "--json", *admin)).json()


@on_cluster
async def test_refusals_say_why_and_never_show_the_token(secure: Secure) -> None:
    tenant = unique("refusals")
    namespace = f"{tenant}/ns"
    async with secure.admin_client() as admin:
        await admin.create_tenant(tenant)
        await admin.create_namespace(namespace)
        await admin.grant_permission(namespace, "alice", ["produce"])
    forged = TestTokens(secure.root / "strangers").create("admin")  # signed with another key
    expired = tokens.create_token(
        tokens.load_signing_key(secure.keys / "secret.key", secret=True), "admin", expiry_s=-1
    )
    secrets = (secure.admin_token, secure.alice_token, forged, expired)

    runs = await asyncio.gather(
        magnetar("tenants", "list", *secure.url),
        magnetar("produce", f"{namespace}/t", "-m", "x", *secure.url),
        magnetar("tenants", "create", unique("mine"), *secure.alice),
        magnetar("cluster", "brokers", *secure.alice),
        magnetar("consume", f"{namespace}/t", "-s", "s", *secure.alice),
        magnetar("tenants", "list", *secure.url, "--auth-token", forged),
        magnetar("tenants", "list", *secure.url, "--auth-token", expired),
        magnetar("perf", "consume", f"{namespace}/t", "-n", "5", *secure.alice),
    )  # fmt: skip
    (anonymous, anonymous_produce, not_superuser, not_superuser_cluster) = runs[:4]
    (cannot_consume, forged_run, expired_run, perf_cannot_consume) = runs[4:]

    failed(anonymous, f"magnetar tenants: {AUTHENTICATION_REQUIRED}")
    failed(anonymous_produce, f"magnetar produce: {AUTHENTICATION_REQUIRED}")
    failed(not_superuser, "magnetar tenants: role 'alice' may not", secrets=secrets)
    assert "superuser" in not_superuser.err
    failed(not_superuser_cluster, "magnetar cluster: role 'alice' may not", secrets=secrets)
    failed(
        cannot_consume,
        f"magnetar consume: role 'alice' may not consume from {namespace}",
        secrets=secrets,
    )
    failed(forged_run, "magnetar tenants: the token's signature does not match", secrets=secrets)
    failed(expired_run, "magnetar tenants: the token expired at", secrets=secrets)
    failed(
        perf_cannot_consume,
        f"magnetar perf consume: role 'alice' may not consume from {namespace}",
        secrets=secrets,
    )


@on_cluster
async def test_tokens_from_files_and_the_environment(secure: Secure, tmp_path: Path) -> None:
    token_file, admin_token = secure.admin_token_file, secure.admin_token
    url = secure.url
    runs = await asyncio.gather(
        magnetar("tenants", "list", *url, "--auth-token-file", f"file://{token_file}"),
        magnetar("tenants", "list", *url, env={"MAGNETAR_AUTH_TOKEN": admin_token}),
        magnetar("tenants", "list", *url, env={"MAGNETAR_AUTH_TOKEN_FILE": str(token_file)}),
        # a flag wins over the environment
        magnetar(
            "tenants", "list", *url, "--auth-token", admin_token,
            env={"MAGNETAR_AUTH_TOKEN_FILE": str(tmp_path / "missing.token")},
        ),
        magnetar(
            "perf", "produce", unique("perf"), "-n", "20", "-q", "--json", *url,
            env={"MAGNETAR_AUTH_TOKEN_FILE": str(token_file)},
        ),
        magnetar("cluster", "brokers", "--json", *url, env={"MAGNETAR_AUTH_TOKEN": admin_token}),
    )  # fmt: skip
    for run in runs[:4]:
        assert "public" in ok(run).out.split()
    assert ok(runs[4]).json()["messages"] == 20
    assert secure.cluster.brokers[0].broker_id in [b["broker_id"] for b in ok(runs[5]).json()]


@on_cluster
async def test_tls_needs_the_trusted_ca_and_a_matching_name(secure: Secure) -> None:
    ca = str(secure.pki.ca_file)
    by_address = ("--service-url", secure.cluster.tls_service_url)  # 127.0.0.1: not in the cert
    by_name = ("--service-url", f"magnetar+ssl://localhost:{secure.tls_port}")
    token = ("--auth-token-file", str(secure.admin_token_file))
    trusted_by_address = (*by_address, *token, "--tls-trust-certs-file", ca)
    mismatch = "--tls-allow-hostname-mismatch"
    topic = unique("over-tls")
    async with secure.admin_client() as admin:
        await admin.create_topic(topic)
    runs = await asyncio.gather(
        magnetar("tenants", "list", *by_name, *token, "--tls-trust-certs-file", ca),
        magnetar("tenants", "list", *by_name, *token, env={"MAGNETAR_TLS_TRUST_CERTS_FILE": ca}),
        magnetar("tenants", "list", *trusted_by_address, mismatch),
        magnetar("tenants", "list", *trusted_by_address),
        magnetar("tenants", "list", *by_name, *token),
        magnetar("tenants", "list", *by_address, *token, mismatch),
        magnetar("tenants", "list", *by_name, "--tls-trust-certs-file", ca),
        magnetar("produce", topic, "-m", "sealed", *trusted_by_address, mismatch),
        magnetar(
            "consume", topic, "-s", "s", "--position", "earliest", "--json",
            *trusted_by_address, mismatch,
        ),
    )  # fmt: skip
    (trusted, trusted_by_env, mismatch_allowed, wrong_name, untrusted, untrusted_anyway) = runs[:6]
    (no_token, produced, consumed) = runs[6:]
    for run in (trusted, trusted_by_env, mismatch_allowed):
        assert "public" in ok(run).out.split()
    for run in (wrong_name, untrusted, untrusted_anyway):
        failed(
            run, "magnetar tenants: the TLS certificate of broker", secrets=(secure.admin_token,)
        )
        assert "--tls-allow-hostname-mismatch" in run.err  # the flag, not the library's name
    # a trusted certificate for another name: the name is what is wrong
    assert "does not name the host connected to" in wrong_name.err, str(wrong_name)
    assert "not valid for '127.0.0.1'" in wrong_name.err
    # no trusted CA: untrusted whatever the name
    for run in (untrusted, untrusted_anyway):
        assert "is not trusted" in run.err, str(run)
    failed(no_token, f"magnetar tenants: {AUTHENTICATION_REQUIRED}")
    assert "published 1 message(s)" in ok(produced).out
    assert json.loads(ok(consumed).out)["value"] == "sealed"


@on_cluster
async def test_a_cli_made_key_pair_and_client_certificates(secure: Secure) -> None:
    """A second broker verifies RS256 tokens with the CLI-made public key and takes client
    certificates (mutual TLS): the admin role by either way."""
    ca = str(secure.pki.ca_file)
    made, broker = await asyncio.gather(
        magnetar("tokens", "create", "-pk", str(secure.keys / "private.pem"), "-s", "admin"),
        secure.cluster.add_broker(
            extra_args=[
                "--token-secret-key-file", "",
                "--token-public-key-file", str(secure.keys / "public.pem"),
                "--authentication-providers", "token,tls",
                "--tls-trust-certs-file", ca,
            ]
        ),
    )  # fmt: skip
    rs256 = ok(made).out.strip()
    try:
        url = ("--service-url", broker.service_url)
        tls = ("--service-url", broker.tls_service_url, "--tls-trust-certs-file", ca)
        client_cert = (
            "--tls-cert-file", str(secure.pki.directory / "admin.pem"),
            "--tls-key-file", str(secure.pki.directory / "admin.key"),
        )  # fmt: skip
        mismatch = "--tls-allow-hostname-mismatch"
        by_rs256, by_hs256, by_certificate, no_certificate = await asyncio.gather(
            magnetar("tenants", "list", *url, "--auth-token", rs256),
            magnetar("tenants", "list", *url, "--auth-token", secure.admin_token),
            magnetar("tenants", "list", *tls, *client_cert, mismatch),
            magnetar("tenants", "list", *tls, mismatch, "--auth-token", rs256),
        )
        assert "public" in ok(by_rs256).out.split()
        failed(
            by_hs256,
            "magnetar tenants: the token is signed with 'HS256'",
            secrets=(secure.admin_token,),
        )
        assert "public" in ok(by_certificate).out.split()
        failed(no_certificate, "it requires a client certificate (mutual TLS)", secrets=(rs256,))
    finally:
        await broker.stop()


# --- tokens and options, in-process (the same main(); no broker, no logging set up) ---------------


def here(capsys: pytest.CaptureFixture[str], *args: str) -> Run:
    """``magnetar ARGS`` run by this process's :func:`magnetar.cli.main`."""
    try:
        code = main(list(args))
    except SystemExit as e:  # usage errors and --help
        code = e.code if isinstance(e.code, int) else EXIT_USAGE
    captured = capsys.readouterr()
    return Run(code, captured.out, captured.err)


def test_key_files_are_private_and_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret, encoded = tmp_path / "secret.key", tmp_path / "encoded.key"
    private, public = tmp_path / "ec-private.pem", tmp_path / "ec-public.pem"

    made = ok(here(capsys, "tokens", "create-secret-key", "--output", str(secret)))
    assert mode(secret) == 0o600
    assert len(secret.read_bytes()) == 32
    assert str(secret) in made.out
    printed = ok(here(capsys, "tokens", "create-secret-key"))  # for a secret store: base64
    assert len(base64.b64decode(printed.out.strip(), validate=True)) == 32
    ok(here(capsys, "tokens", "create-secret-key", "-o", f"file://{encoded}", "--base64"))
    assert mode(encoded) == 0o600
    assert len(base64.b64decode(encoded.read_bytes(), validate=True)) == 32
    ok(
        here(
            capsys, "tokens", "create-key-pair", "-a", "ES256",
            "--output-private-key", str(private), "--output-public-key", str(public),
        )
    )  # fmt: skip
    assert mode(private) == 0o600
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")

    before = {path: path.read_bytes() for path in (secret, private, public)}
    failed(
        here(capsys, "tokens", "create-secret-key", "--output", str(secret)),
        f"magnetar tokens: the secret key file {secret} exists already; give --force",
    )
    failed(
        here(
            capsys, "tokens", "create-key-pair",
            "--output-private-key", str(private), "--output-public-key", str(public),
        ),
        f"the private key file {private} exists already; give --force",
    )  # fmt: skip
    failed(
        here(
            capsys, "tokens", "create-key-pair",
            "--output-private-key", str(tmp_path / "new.pem"), "--output-public-key", str(public),
        ),
        f"the public key file {public} exists already; give --force",
    )  # fmt: skip
    assert not (tmp_path / "new.pem").exists()  # no half pair
    assert {path: path.read_bytes() for path in before} == before

    # --force replaces a file in one step, owner-only whatever the old file's mode was
    secret.chmod(0o644)
    ok(here(capsys, "tokens", "create-secret-key", "-o", str(secret), "--force"))
    assert mode(secret) == 0o600
    assert secret.read_bytes() != before[secret]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["secret.key", "encoded.key", "ec-private.pem", "ec-public.pem"]
    )


def test_create_and_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = TestTokens(tmp_path / "keys")  # the key as the broker side's own code writes it
    assert keys.secret_key_file is not None
    secret = str(keys.secret_key_file)
    made = ok(
        here(
            capsys, "tokens", "create", "-sk", secret, "-s", "alice", "-e", "1h",
            "--audience", "prod", "--headers", "kid=k1", "team=a",
        )
    )  # fmt: skip
    token = made.out.strip()
    assert made.out == token + "\n"
    assert made.err == ""
    token_file = tmp_path / "alice.token"
    token_file.write_text(token + "\n")

    document = ok(here(capsys, "tokens", "show", token)).json()
    assert document["header"] == {"alg": "HS256", "typ": "JWT", "kid": "k1", "team": "a"}
    assert document["claims"]["sub"] == "alice"
    assert document["claims"]["aud"] == "prod"
    assert 3000 < document["claims"]["exp"] - time.time() <= 3600
    assert document["expires"] == (
        datetime.fromtimestamp(document["claims"]["exp"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    )
    assert document["expired"] is False
    assert ok(here(capsys, "tokens", "show", "-f", f"file://{token_file}")).json() == document
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"\n{token}\n"))
    assert ok(here(capsys, "tokens", "show", "-i")).json() == document
    no_expiry = ok(here(capsys, "tokens", "create", "-sk", secret, "-s", "bob")).out.strip()
    assert "expires" not in ok(here(capsys, "tokens", "show", no_expiry)).json()

    failed(
        here(capsys, "tokens", "show", "not-a-token"),
        "magnetar tokens: not a JWT token",
        secrets=("not-a-token",),
    )
    failed(
        here(capsys, "tokens", "show", "-i", "-f", str(token_file)),
        "give the token in one way",
        code=EXIT_USAGE,
    )
    failed(
        here(capsys, "tokens", "create", "-sk", secret, "-s", "x", "--headers", "alg=none"),
        "the 'alg' header is set by -a/--signature-algorithm",
        code=EXIT_USAGE,
    )
    failed(
        here(capsys, "tokens", "create", "-sk", secret, "-s", "x", "-a", "RS256"),
        "magnetar tokens: a secret key signs with HS256, HS384, HS512, not 'RS256'",
    )
    failed(
        here(capsys, "tokens", "create", "-sk", str(tmp_path / "nope.key"), "-s", "x"),
        f"secret key file {tmp_path / 'nope.key'} does not exist",
    )
    failed(
        here(capsys, "tokens", "create", "-sk", secret, "-s", "x", "-e", "soon"),
        "a duration is a positive number",
        code=EXIT_USAGE,
    )
    rsa = TestTokens(tmp_path / "rsa", algorithm="RS256")
    assert rsa.private_key_file is not None
    failed(
        here(capsys, "tokens", "create", "-sk", str(rsa.private_key_file), "-s", "x"),
        "holds a PEM key; sign with a private key through --private-key",
        secrets=(rsa.private_key_file.read_text().splitlines()[1],),
    )


async def test_validate_as_a_broker_would(tmp_path: Path) -> None:
    """``validate`` is a subprocess: it sets up logging, which a test process must keep."""
    keys, other = TestTokens(tmp_path / "keys"), TestTokens(tmp_path / "other")
    rsa = TestTokens(tmp_path / "rsa", algorithm="RS256")
    assert keys.secret_key_file is not None
    assert other.secret_key_file is not None
    assert rsa.public_key_file is not None
    secret = str(keys.secret_key_file)
    token = keys.create("alice", expiry_s=3600, audience="prod")
    token_file = tmp_path / "alice.token"
    token_file.write_text(token + "\n")
    expired = keys.create("old", expiry_s=-1)

    runs = await asyncio.gather(
        magnetar("tokens", "validate", "-f", str(token_file), "-sk", secret, "--audience", "prod"),
        magnetar(
            "tokens", "validate", "-i", "-pk", str(rsa.public_key_file),
            stdin=rsa.create("carol").encode() + b"\n",
        ),
        magnetar("tokens", "validate", token, "-sk", str(other.secret_key_file)),
        magnetar("tokens", "validate", token, "-sk", secret, "--audience", "staging"),
        magnetar("tokens", "validate", expired, "--secret-key", secret),
        magnetar("tokens", "validate", token, "--public-key", str(rsa.public_key_file)),
    )  # fmt: skip
    valid, valid_rsa, wrong_key, wrong_audience, too_old, wrong_kind = runs
    assert ok(valid).out == "alice\n"
    assert ok(valid_rsa).out == "carol\n"
    secrets = (token, expired, keys.secret_key_file.read_bytes().hex())
    failed(wrong_key, "the token's signature does not match", secrets=secrets)
    assert str(other.secret_key_file) in wrong_key.err  # it names the key file
    failed(wrong_audience, "the token is not for audience 'staging'", secrets=secrets)
    failed(too_old, "magnetar tokens: the token is not valid with the key in", secrets=secrets)
    assert "the token expired at" in too_old.err
    failed(wrong_kind, "the token is signed with 'HS256'", secrets=secrets)


def test_credential_mistakes_are_caught_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.c2lnbmF0dXJl"
    token_file = tmp_path / "admin.token"
    token_file.write_text(token)
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    missing = tmp_path / "missing.token"
    certificate = TestPki(tmp_path / "pki").issue("admin")

    def tenants_list(*args: str) -> Run:
        return here(capsys, "tenants", "list", "--service-url", "magnetar://127.0.0.1:1", *args)

    failed(
        tenants_list("--auth-token-file", str(missing)),
        f"magnetar tenants: the token file {missing} (--auth-token-file) does not exist",
    )
    failed(
        tenants_list("--auth-token-file", str(empty)),
        f"the token file {empty} (--auth-token-file) is empty",
    )
    failed(
        tenants_list("--auth-token", token, "--auth-token-file", str(token_file)),
        "argument --auth-token-file: not allowed with argument --auth-token",
        code=EXIT_USAGE,
        secrets=(token,),
    )
    failed(tenants_list("--auth-token", " "), "--auth-token is empty", code=EXIT_USAGE)
    failed(
        tenants_list("--tls-cert-file", str(certificate.cert_file)),
        "--tls-cert-file needs --tls-key-file too",
        code=EXIT_USAGE,
    )
    cert_and_key = (
        "--tls-cert-file", str(certificate.cert_file),
        "--tls-key-file", str(certificate.key_file),
    )  # fmt: skip
    # a certificate with a token is the transport's, so the URL must be TLS
    failed(
        tenants_list(*cert_and_key, "--auth-token", token),
        "a client certificate is presented on TLS connections: use a magnetar+ssl:// service URL",
        secrets=(token,),
    )
    monkeypatch.setenv("MAGNETAR_AUTH_TOKEN", token)
    monkeypatch.setenv("MAGNETAR_AUTH_TOKEN_FILE", str(token_file))
    failed(
        tenants_list(),
        "MAGNETAR_AUTH_TOKEN and MAGNETAR_AUTH_TOKEN_FILE are both set",
        code=EXIT_USAGE,
        secrets=(token,),
    )
    monkeypatch.setenv("MAGNETAR_AUTH_TOKEN_FILE", str(missing))
    failed(
        tenants_list("--auth-token-file", str(empty)),  # the flag, not the variable
        f"the token file {empty} (--auth-token-file) is empty",
    )
    monkeypatch.delenv("MAGNETAR_AUTH_TOKEN")
    failed(
        tenants_list(),
        f"the token file {missing} (MAGNETAR_AUTH_TOKEN_FILE) does not exist",
    )
    monkeypatch.delenv("MAGNETAR_AUTH_TOKEN_FILE")
    monkeypatch.setenv("MAGNETAR_TLS_KEY_FILE", str(certificate.key_file))
    failed(
        tenants_list(),  # the variables must make a whole certificate
        "MAGNETAR_TLS_KEY_FILE needs MAGNETAR_TLS_CERT_FILE too",
        code=EXIT_USAGE,
    )
    failed(
        tenants_list("--auth-token", token),  # ... with a token too
        "MAGNETAR_TLS_KEY_FILE needs MAGNETAR_TLS_CERT_FILE too",
        code=EXIT_USAGE,
        secrets=(token,),
    )


def test_help_never_shows_a_secret(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "eyJzZWNyZXQiOiJ0b2tlbiJ9.c2VjcmV0.c2lnbmF0dXJl"
    monkeypatch.setenv("MAGNETAR_AUTH_TOKEN", secret)
    monkeypatch.setenv("MAGNETAR_AUTH_TOKEN_FILE", "/secret/path/token")
    commands = [
        ("topics", "list"),
        ("produce",),
        ("consume",),
        ("subscriptions", "reset"),
        ("tenants", "create"),
        ("namespaces", "grant-permission"),
        ("cluster", "brokers"),
        ("perf", "produce"),
        ("tokens", "create"),
        ("tokens", "validate"),
    ]
    for command in commands:
        run = here(capsys, *command, "--help")
        assert run.code == EXIT_OK, str(run)
        assert secret not in run.out + run.err
        assert "/secret/path/token" not in run.out + run.err
        if command[0] != "tokens":
            assert "--auth-token-file FILE" in run.out, command
            assert "--tls-allow-hostname-mismatch" in run.out, command
    topics_help = " ".join(here(capsys, "topics", "list", "--help").out.split())
    assert "prefer --auth-token-file" in topics_help


def test_credentials_are_for_brokers_not_the_metadata_store(
    capsys: pytest.CaptureFixture[str],
) -> None:
    failed(
        here(capsys, "cluster", "ledgers", "--metadata", "memory://", "--auth-token", "sesame"),
        "--auth-token: credentials and TLS settings are for the brokers",
        code=EXIT_USAGE,
        secrets=("sesame",),
    )


def test_the_cli_knows_the_algorithms_the_library_signs_with() -> None:
    assert cli_tokens.SECRET_ALGORITHMS == tokens.SECRET_ALGORITHMS
    assert cli_tokens.ASYMMETRIC_ALGORITHMS == tokens.ASYMMETRIC_ALGORITHMS
