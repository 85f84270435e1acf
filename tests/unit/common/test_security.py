"""Tokens and authentication: every way a credential is accepted or refused, with no broker."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

import jwt
import pytest

from magnetar.common.config import load_config
from magnetar.common.errors import AuthenticationError, InvalidArgumentError, InvalidConfigError
from magnetar.common.security.authentication import AuthenticationService, Credentials
from magnetar.common.security.config import AuthenticationSettings, is_loopback
from magnetar.common.security.tokens import (
    create_key_pair,
    create_token,
    load_signing_key,
    load_verifying_keys,
    parse_duration_s,
    read_token_unverified,
)
from magnetar.testing.security import TestTokens

PEER = "ipv4:10.0.0.7:51234"


def base64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def service(tokens: TestTokens, **settings: object) -> AuthenticationService:
    keys: dict[str, object] = (
        {"token_secret_key_file": tokens.secret_key_file}
        if tokens.secret_key_file
        else {"token_public_key_file": tokens.public_key_file}
    )
    return AuthenticationService(
        AuthenticationSettings(authentication_enabled=True, **keys, **settings)  # type: ignore[arg-type]
    )


def refused(auth: AuthenticationService, credentials: Credentials) -> AuthenticationError:
    with pytest.raises(AuthenticationError) as caught:
        auth.authenticate(credentials)
    return caught.value


@pytest.mark.parametrize("algorithm", ["HS256", "HS512", "RS256", "ES256", "ES384"])
def test_a_token_signed_with_the_key_gives_its_subject_as_the_role(
    tmp_path: Path, algorithm: str
) -> None:
    tokens = TestTokens(tmp_path, algorithm=algorithm)
    auth = service(tokens)
    principal = auth.authenticate(Credentials(PEER, tokens.create("alice", expiry_s=60)))
    assert principal.role == "alice"
    assert principal.method == "token"
    assert principal.expires_at_ms is not None
    assert principal.expires_at_ms > time.time() * 1000
    assert auth.authenticate(Credentials(PEER, tokens.create("bob"))).expires_at_ms is None


def test_each_refusal_names_its_reason_never_the_token(tmp_path: Path) -> None:
    tokens = TestTokens(tmp_path / "ours")
    other = TestTokens(tmp_path / "theirs")
    auth = service(tokens)
    cases = {
        "no_credentials": Credentials(PEER),
        "bad_signature": Credentials(PEER, other.create("alice")),
        "expired": Credentials(PEER, tokens.create("alice", expiry_s=1)),
        "malformed": Credentials(PEER, "not-a-jwt"),
    }
    time.sleep(1.1)  # the 1 s token expires
    messages = {}
    for reason, credentials in cases.items():
        error = refused(auth, credentials)
        assert error.context["reason"] == reason
        if credentials.token:
            assert credentials.token not in error.message
            assert credentials.token not in repr(error)
        messages[reason] = error.message
    assert "no credentials" in messages["no_credentials"]
    assert "signature" in messages["bad_signature"]
    assert "expired at" in messages["expired"]
    assert dict(auth.failures) == dict.fromkeys(cases, 1)


def test_a_token_without_a_role_claim_is_refused(tmp_path: Path) -> None:
    tokens = TestTokens(tmp_path)
    assert tokens.secret_key_file is not None
    key = tokens.secret_key_file.read_bytes()
    no_sub = jwt.encode({"exp": int(time.time()) + 60}, key, algorithm="HS256")
    empty_sub = jwt.encode({"sub": ""}, key, algorithm="HS256")
    auth = service(tokens)
    assert refused(auth, Credentials(PEER, no_sub)).context["reason"] == "no_role"
    assert refused(auth, Credentials(PEER, empty_sub)).context["reason"] == "no_role"


def test_the_role_claim_and_the_audience_are_settings(tmp_path: Path) -> None:
    tokens = TestTokens(tmp_path)
    assert tokens.secret_key_file is not None
    key = load_signing_key(tokens.secret_key_file, secret=True)
    auth = service(tokens, token_auth_claim="role", token_audience="magnetar")
    good = create_token(key, "carol", claim="role", audience="magnetar")
    assert auth.authenticate(Credentials(PEER, good)).role == "carol"
    wrong_audience = create_token(key, "carol", claim="role", audience="elsewhere")
    assert refused(auth, Credentials(PEER, wrong_audience)).context["reason"] == "wrong_audience"
    wrong_claim = create_token(key, "carol", audience="magnetar")  # role in "sub"
    assert refused(auth, Credentials(PEER, wrong_claim)).context["reason"] == "no_role"


def test_an_hmac_token_is_refused_by_a_public_key_broker(tmp_path: Path) -> None:
    """The algorithm-confusion hole: a token signed with HS256 using the public key's bytes as
    the secret must not pass a broker that verifies RS256."""
    rsa = TestTokens(tmp_path / "rsa", algorithm="RS256")
    assert rsa.public_key_file is not None
    header = base64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = base64url(json.dumps({"sub": "admin"}).encode())
    signature = hmac.new(
        rsa.public_key_file.read_bytes(), f"{header}.{claims}".encode(), hashlib.sha256
    ).digest()
    forged = f"{header}.{claims}.{base64url(signature)}"
    error = refused(service(rsa), Credentials(PEER, forged))
    assert error.context["reason"] == "bad_signature"
    assert "RS256" in error.message


def test_a_public_key_bundle_verifies_tokens_of_either_key(tmp_path: Path) -> None:
    """Key rotation: the broker holds the old and the new public key for a while."""
    old = TestTokens(tmp_path / "old", algorithm="RS256")
    new = TestTokens(tmp_path / "new", algorithm="ES256")
    assert old.public_key_file is not None
    assert new.public_key_file is not None
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(old.public_key_file.read_bytes() + new.public_key_file.read_bytes())
    assert len(load_verifying_keys(bundle, secret=False)) == 2
    auth = AuthenticationService(
        AuthenticationSettings(authentication_enabled=True, token_public_key_file=bundle)
    )
    assert auth.authenticate(Credentials(PEER, old.create("a"))).role == "a"
    assert auth.authenticate(Credentials(PEER, new.create("b"))).role == "b"


def test_a_rewritten_key_file_is_used_without_a_restart(tmp_path: Path) -> None:
    tokens = TestTokens(tmp_path)
    auth = service(tokens)
    old_token = tokens.create("alice")
    assert auth.authenticate(Credentials(PEER, old_token)).role == "alice"
    rotated = TestTokens(tmp_path)  # writes a new secret.key in the same place
    time.sleep(1.1)  # the key file is looked at once a second at most
    assert auth.authenticate(Credentials(PEER, rotated.create("alice"))).role == "alice"
    # the cache of verified tokens is dropped with the old key
    assert refused(auth, Credentials(PEER, old_token)).context["reason"] == "bad_signature"


def test_certificates_and_tokens_by_provider(tmp_path: Path) -> None:
    tokens = TestTokens(tmp_path)
    both = service(tokens, authentication_providers=("token", "tls"))
    token_only = service(tokens)
    by_certificate = Credentials(PEER, certificate_common_name="billing")
    assert both.authenticate(by_certificate).role == "billing"
    assert both.authenticate(by_certificate).method == "tls"
    assert refused(token_only, by_certificate).context["reason"] == "no_credentials"
    # a token wins over the certificate of the same connection
    both_sent = Credentials(PEER, tokens.create("alice"), certificate_common_name="billing")
    assert both.authenticate(both_sent).role == "alice"
    tls_only = AuthenticationService(
        AuthenticationSettings(authentication_enabled=True, authentication_providers=("tls",))
    )
    assert (
        refused(tls_only, Credentials(PEER, tokens.create("x"))).context["reason"]
        == "method_not_enabled"
    )


def test_authentication_off_lets_everyone_in_anonymously(tmp_path: Path) -> None:
    auth = AuthenticationService(AuthenticationSettings())
    principal = auth.authenticate(Credentials(PEER))
    assert principal.anonymous
    assert auth.is_superuser(principal)


def test_a_flood_of_refusals_is_logged_at_a_bounded_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    auth = service(TestTokens(tmp_path))
    for _ in range(200):
        with pytest.raises(AuthenticationError):
            auth.authenticate(Credentials(PEER, "garbage"))
    assert auth.failures["malformed"] == 200
    logged = capsys.readouterr()
    lines = [
        line for line in (logged.out + logged.err).splitlines() if "authentication_failed" in line
    ]
    assert 1 <= len(lines) <= 20


def test_settings_are_checked_when_loaded(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match="token_secret_key_file"):
        AuthenticationSettings(authentication_enabled=True)
    with pytest.raises(InvalidConfigError, match="authentication_providers"):
        AuthenticationSettings(authentication_providers=("oauth2",))
    secret = tmp_path / "k"
    secret.write_bytes(b"x" * 32)
    loaded = load_config(
        AuthenticationSettings,
        env={
            "MAGNETAR_AUTHENTICATION_ENABLED": "true",
            "MAGNETAR_TOKEN_SECRET_KEY_FILE": str(secret),
            "MAGNETAR_SUPERUSER_ROLES": "admin,ops",
        },
    )
    assert loaded.superuser_roles == ("admin", "ops")
    with pytest.raises(InvalidConfigError, match="cannot load the token key"):
        AuthenticationService(
            AuthenticationSettings(
                authentication_enabled=True, token_public_key_file=tmp_path / "missing.pem"
            )
        )


def test_token_helpers(tmp_path: Path) -> None:
    assert parse_duration_s("90") == 90
    assert parse_duration_s("15m") == 900
    assert parse_duration_s("2d") == 172_800
    for bad in ("", "0h", "-1h", "1x", "h"):
        with pytest.raises(InvalidArgumentError):
            parse_duration_s(bad)
    private, public = create_key_pair("ES256")
    (tmp_path / "p.pem").write_bytes(private)
    key = load_signing_key(tmp_path / "p.pem", secret=False)
    header, claims = read_token_unverified(create_token(key, "dave", expiry_s=60))
    assert header["alg"] == "ES256"
    assert claims["sub"] == "dave"
    with pytest.raises(InvalidArgumentError, match="signs with"):
        create_token(key, "dave", algorithm="RS256")
    with pytest.raises(InvalidArgumentError, match="not a JWT"):
        read_token_unverified("nope")
    assert public.startswith(b"-----BEGIN PUBLIC KEY-----")


def test_loopback_hosts() -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("10.1.2.3")
    assert not is_loopback("broker.example")


def test_static_tokens_are_known_by_their_hash_only(tmp_path: Path) -> None:
    """The Helm chart's superuser token: random, made without a signing tool, listed by hash."""
    static = tmp_path / "static-tokens"
    token = "x" * 40
    static.write_text("# role sha256\n" + f"admin {hashlib.sha256(token.encode()).hexdigest()}\n")
    auth = AuthenticationService(
        AuthenticationSettings(authentication_enabled=True, token_static_file=static)
    )
    principal = auth.authenticate(Credentials(PEER, token))
    assert (principal.role, principal.expires_at_ms) == ("admin", None)
    assert refused(auth, Credentials(PEER, "y" * 40)).context["reason"] == "bad_signature"
    # with a key too, JWTs still work next to the static tokens
    tokens = TestTokens(tmp_path / "jwt")
    both = service(tokens, token_static_file=static)
    assert both.authenticate(Credentials(PEER, token)).role == "admin"
    assert both.authenticate(Credentials(PEER, tokens.create("bob"))).role == "bob"
    static.write_text("admin not-a-hash\n")
    with pytest.raises(InvalidConfigError, match="expected 'ROLE SHA256-HEX'"):
        AuthenticationService(
            AuthenticationSettings(authentication_enabled=True, token_static_file=static)
        )
