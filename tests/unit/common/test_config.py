"""The config loader as an operator meets it: layered sources, names per source, clear errors."""

from __future__ import annotations

import argparse
import enum
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from magnetar.common.config import (
    add_config_arguments,
    config_error,
    config_overrides_from_args,
    config_reference,
    field_docs,
    load_config,
    missing_field_docs,
    settings,
    to_dict,
)
from magnetar.common.errors import ErrorCode, InvalidConfigError


class SyncMode(enum.Enum):
    FSYNC = "fsync"
    FDATASYNC = "fdatasync"
    NONE = "none"


@dataclass(frozen=True, kw_only=True)
class JournalConfig:
    """Settings of the bookie's write-ahead journal."""

    dir: Path = Path("data/journal")
    """Directory that holds the journal files."""

    max_group_wait_ms: int = 2
    """How long the journal waits to gather more adds into one fsync."""

    max_group_bytes: int = 512 * 1024
    """A group commit is written as soon as it holds this many bytes."""

    sync_mode: SyncMode = SyncMode.FSYNC
    """How a group commit reaches the disk."""

    flush_when_idle: bool = True
    """Write a partial group at once when no more adds are waiting."""

    def __post_init__(self) -> None:
        if self.max_group_wait_ms < 0:
            raise config_error("max_group_wait_ms", self.max_group_wait_ms, "must be >= 0")
        if self.max_group_bytes < 1:
            raise config_error("max_group_bytes", self.max_group_bytes, "must be >= 1")


@dataclass(frozen=True, kw_only=True)
class TlsConfig:
    """TLS for the bookie's gRPC port."""

    cert_file: Path
    """PEM certificate chain presented to clients."""

    key_file: Path
    """PEM private key of the certificate."""


@dataclass(frozen=True, kw_only=True)
class BookieConfig:
    """A bookie's settings."""

    bookie_id: str | None = None
    """Stable identity of this bookie; the advertised address when unset."""

    data_dir: Path = Path("data")
    """Root directory of the bookie's ledger storage."""

    listen_port: int = 3181
    """TCP port of the gRPC service (0 picks a free port)."""

    disk_usage_threshold: float = 0.95
    """Fraction of the disk in use (e.g. 0.95 = 95%) at which the bookie turns read-only."""

    metadata_urls: tuple[str, ...] = ("memory://",)
    """Metadata store endpoints, tried in order."""

    extra_ports: tuple[int, ...] = ()
    """Additional ports to listen on."""

    placement: Literal["random", "rack_aware"] = "random"
    """How this bookie is chosen for new ensembles."""

    labels: dict[str, str] = field(default_factory=dict)
    """Free-form labels published with the bookie's registration."""

    tls: TlsConfig | None = None
    """TLS settings; plaintext when unset."""

    journal: JournalConfig = field(default_factory=JournalConfig)
    """Journal settings."""

    def __post_init__(self) -> None:
        if not 0 <= self.listen_port <= 65535:
            raise config_error("listen_port", self.listen_port, "must be between 0 and 65535")
        if not 0 < self.disk_usage_threshold <= 1:
            raise config_error(
                "disk_usage_threshold", self.disk_usage_threshold, "must be in (0, 1]"
            )


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    cluster_name: str
    """Name of the cluster this node joins."""

    replicas: int = 3


@dataclass(frozen=True, kw_only=True)
class ListConfig:
    names: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class CollidingConfig:
    journal_dir: str = ""
    journal: JournalConfig = field(default_factory=JournalConfig)


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bookie.toml"
    path.write_text(text)
    return path


def parse_flags(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, BookieConfig)
    return config_overrides_from_args(parser.parse_args(list(argv)), BookieConfig)


def test_defaults_when_no_source_says_otherwise() -> None:
    assert load_config(BookieConfig, env={}) == BookieConfig()


def test_each_layer_overrides_the_one_below(tmp_path: Path) -> None:
    config_file = write_toml(
        tmp_path,
        """
        listen_port = 4000
        data_dir = "/from/file"

        [journal]
        max_group_wait_ms = 5
        sync_mode = "fdatasync"
        """,
    )
    env = {"MAGNETAR_DATA_DIR": "/from/env", "MAGNETAR_JOURNAL_MAX_GROUP_WAIT_MS": "7"}
    flags = parse_flags("--journal-max-group-wait-ms", "9")

    from_file = load_config(BookieConfig, file=config_file, env={})
    from_env = load_config(BookieConfig, file=config_file, env=env)
    from_flags = load_config(BookieConfig, file=config_file, env=env, overrides=flags)

    assert from_file.journal.max_group_wait_ms == 5
    assert from_env.journal.max_group_wait_ms == 7
    assert from_flags.journal.max_group_wait_ms == 9
    # Every setting comes from the highest layer that names it, the rest keep their defaults.
    assert from_flags.data_dir == Path("/from/env")
    assert from_flags.listen_port == 4000
    assert from_flags.journal.sync_mode is SyncMode.FDATASYNC
    assert from_flags.journal.max_group_bytes == 512 * 1024
    assert from_flags.journal.dir == Path("data/journal")


def test_environment_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAGNETAR_LISTEN_PORT", "4181")
    assert load_config(BookieConfig).listen_port == 4181


def test_magnetar_variables_of_other_components_are_ignored() -> None:
    env = {
        "MAGNETAR_BROKER_SERVICE_PORT": "not a number",
        "MAGNETAR_JOURNAL_NO_SUCH_SETTING": "x",
        "LISTEN_PORT": "1",
    }
    assert load_config(BookieConfig, env=env) == BookieConfig()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("On", True),
        ("false", False),
        ("0", False),
        ("No", False),
        ("off", False),
    ],
)
def test_boolean_words_from_the_environment(text: str, expected: bool) -> None:
    config = load_config(BookieConfig, env={"MAGNETAR_JOURNAL_FLUSH_WHEN_IDLE": text})
    assert config.journal.flush_when_idle is expected


def test_text_forms_of_every_supported_type() -> None:
    env = {
        "MAGNETAR_BOOKIE_ID": "bookie-1",
        "MAGNETAR_DISK_USAGE_THRESHOLD": "0.8",
        "MAGNETAR_METADATA_URLS": "etcd://a:2379, etcd://b:2379",
        "MAGNETAR_EXTRA_PORTS": "3182,3183",
        "MAGNETAR_PLACEMENT": "rack_aware",
        "MAGNETAR_LABELS": "rack=r1, zone=z2",
        "MAGNETAR_JOURNAL_DIR": "/ssd/journal",
        "MAGNETAR_JOURNAL_SYNC_MODE": "NONE",
    }
    config = load_config(BookieConfig, env=env)
    assert config.bookie_id == "bookie-1"
    assert config.disk_usage_threshold == 0.8
    assert config.metadata_urls == ("etcd://a:2379", "etcd://b:2379")
    assert config.extra_ports == (3182, 3183)
    assert config.placement == "rack_aware"
    assert config.labels == {"rack": "r1", "zone": "z2"}
    assert config.journal.dir == Path("/ssd/journal")
    assert config.journal.sync_mode is SyncMode.NONE


@pytest.mark.parametrize("text", ["fdatasync", "FDATASYNC", "FDataSync"])
def test_enums_are_given_by_name_or_value_in_any_case(text: str) -> None:
    config = load_config(BookieConfig, env={"MAGNETAR_JOURNAL_SYNC_MODE": text})
    assert config.journal.sync_mode is SyncMode.FDATASYNC


def test_empty_text_unsets_an_optional_setting_and_empties_a_list() -> None:
    env = {"MAGNETAR_BOOKIE_ID": "", "MAGNETAR_METADATA_URLS": ""}
    config = load_config(BookieConfig, env=env, overrides={"bookie_id": "from-flag"})
    assert config.bookie_id == "from-flag"
    config = load_config(BookieConfig, env=env)
    assert config.bookie_id is None
    assert config.metadata_urls == ()


def test_toml_values_keep_their_natural_types(tmp_path: Path) -> None:
    config_file = write_toml(
        tmp_path,
        """
        metadata_urls = ["etcd://a:2379", "etcd://b:2379"]
        extra_ports = [3182]
        disk_usage_threshold = 1
        labels = { rack = "r1" }

        [journal]
        flush_when_idle = false
        """,
    )
    config = load_config(BookieConfig, file=config_file, env={})
    assert config.metadata_urls == ("etcd://a:2379", "etcd://b:2379")
    assert config.extra_ports == (3182,)
    assert config.disk_usage_threshold == 1.0
    assert config.labels == {"rack": "r1"}
    assert config.journal.flush_when_idle is False


def test_optional_section_is_none_until_one_of_its_settings_is_given(tmp_path: Path) -> None:
    assert load_config(BookieConfig, env={}).tls is None
    config_file = write_toml(tmp_path, '[tls]\ncert_file = "/etc/tls/cert.pem"\n')
    config = load_config(
        BookieConfig, file=config_file, env={"MAGNETAR_TLS_KEY_FILE": "/etc/tls/key.pem"}
    )
    assert config.tls == TlsConfig(
        cert_file=Path("/etc/tls/cert.pem"), key_file=Path("/etc/tls/key.pem")
    )


def test_missing_required_setting_names_every_way_to_set_it(tmp_path: Path) -> None:
    config_file = write_toml(tmp_path, '[tls]\ncert_file = "/etc/tls/cert.pem"\n')
    with pytest.raises(InvalidConfigError) as caught:
        load_config(BookieConfig, file=config_file, env={})
    message = str(caught.value)
    assert "missing required setting tls.key_file" in message
    assert "MAGNETAR_TLS_KEY_FILE" in message
    assert "--tls-key-file" in message

    with pytest.raises(InvalidConfigError, match="cluster_name"):
        load_config(ClusterConfig, env={})
    assert load_config(ClusterConfig, env={"MAGNETAR_CLUSTER_NAME": "c1"}).cluster_name == "c1"


def test_unknown_key_in_the_file_is_named_with_a_suggestion(tmp_path: Path) -> None:
    config_file = write_toml(tmp_path, "[journal]\nmax_group_wait = 5\n")
    with pytest.raises(InvalidConfigError) as caught:
        load_config(BookieConfig, file=config_file, env={})
    message = str(caught.value)
    assert "unknown key 'journal.max_group_wait'" in message
    assert str(config_file) in message
    assert "did you mean 'journal.max_group_wait_ms'?" in message
    assert caught.value.code is ErrorCode.INVALID_CONFIG


def test_setting_outside_its_table_is_pointed_to_its_table(tmp_path: Path) -> None:
    config_file = write_toml(tmp_path, "sync_mode = 'none'\n")
    with pytest.raises(InvalidConfigError, match=r"did you mean 'journal\.sync_mode'\?"):
        load_config(BookieConfig, file=config_file, env={})


def test_unknown_key_far_from_any_name_lists_the_known_keys(tmp_path: Path) -> None:
    config_file = write_toml(tmp_path, "[journal]\nzzz = 1\n")
    with pytest.raises(InvalidConfigError, match="known keys: dir, flush_when_idle"):
        load_config(BookieConfig, file=config_file, env={})


def test_section_given_a_plain_value_is_refused(tmp_path: Path) -> None:
    config_file = write_toml(tmp_path, "journal = 5\n")
    with pytest.raises(InvalidConfigError, match="expected a table of JournalConfig settings"):
        load_config(BookieConfig, file=config_file, env={})


def test_unconvertible_value_names_the_file_key_and_expected_type(tmp_path: Path) -> None:
    config_file = write_toml(tmp_path, "[journal]\nmax_group_wait_ms = 2.5\n")
    with pytest.raises(InvalidConfigError) as caught:
        load_config(BookieConfig, file=config_file, env={})
    assert str(caught.value) == (
        f"config file {config_file}, key journal.max_group_wait_ms: expected an integer, got 2.5"
    )


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("MAGNETAR_LISTEN_PORT", "31x81", "expected an integer, got '31x81'"),
        ("MAGNETAR_JOURNAL_FLUSH_WHEN_IDLE", "maybe", "expected a boolean"),
        ("MAGNETAR_DISK_USAGE_THRESHOLD", "most", "expected a number"),
        ("MAGNETAR_PLACEMENT", "nearest", "expected one of random, rack_aware"),
        ("MAGNETAR_JOURNAL_SYNC_MODE", "sometimes", "expected one of fsync, fdatasync, none"),
        ("MAGNETAR_EXTRA_PORTS", "1,two", "each an integer"),
        ("MAGNETAR_LABELS", "rack", "k=v,k2=v2"),
        ("MAGNETAR_DATA_DIR", " ", "expected a path"),
    ],
)
def test_unconvertible_value_names_the_environment_variable(
    name: str, text: str, expected: str
) -> None:
    with pytest.raises(InvalidConfigError) as caught:
        load_config(BookieConfig, env={name: text})
    message = str(caught.value)
    assert message.startswith(f"environment variable {name}: ")
    assert expected in message


def test_unconvertible_flag_names_the_flag() -> None:
    flags = parse_flags("--journal-max-group-wait-ms", "soon")
    with pytest.raises(InvalidConfigError) as caught:
        load_config(BookieConfig, env={}, overrides=flags)
    assert str(caught.value) == (
        "flag --journal-max-group-wait-ms: expected an integer, got 'soon'"
    )


def test_broken_rule_names_the_setting_value_rule_and_source() -> None:
    with pytest.raises(InvalidConfigError) as caught:
        load_config(BookieConfig, env={"MAGNETAR_JOURNAL_MAX_GROUP_WAIT_MS": "-1"})
    assert str(caught.value) == (
        "journal.max_group_wait_ms: must be >= 0, got -1 "
        "(from environment variable MAGNETAR_JOURNAL_MAX_GROUP_WAIT_MS)"
    )
    assert caught.value.context["field"] == "journal.max_group_wait_ms"

    with pytest.raises(InvalidConfigError) as caught:
        load_config(BookieConfig, env={}, overrides={"listen_port": 70000})
    assert str(caught.value) == (
        "listen_port: must be between 0 and 65535, got 70000 (from flag --listen-port)"
    )


def test_unknown_override_is_refused() -> None:
    with pytest.raises(
        InvalidConfigError, match=r"unknown key 'journal\.max_wait' in the overrides"
    ):
        load_config(BookieConfig, env={}, overrides={"journal": {"max_wait": 1}})


def test_unreadable_config_files_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    with pytest.raises(
        InvalidConfigError, match=re.escape(f"config file {missing} does not exist")
    ):
        load_config(BookieConfig, file=missing, env={})
    broken = write_toml(tmp_path, "[journal\n")
    with pytest.raises(InvalidConfigError, match="is not valid TOML"):
        load_config(BookieConfig, file=broken, env={})


def test_field_docs_are_the_docstrings_under_the_fields() -> None:
    docs = field_docs(JournalConfig)
    assert docs["max_group_wait_ms"] == (
        "How long the journal waits to gather more adds into one fsync."
    )
    assert set(docs) == {
        "dir",
        "max_group_wait_ms",
        "max_group_bytes",
        "sync_mode",
        "flush_when_idle",
    }
    assert missing_field_docs(BookieConfig) == []
    assert missing_field_docs(ClusterConfig) == ["replicas"]


def test_flags_carry_docs_defaults_and_env_names_and_only_given_flags_count() -> None:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, BookieConfig)
    help_text = " ".join(parser.format_help().split())
    assert "--journal-max-group-wait-ms INT" in help_text
    assert (
        "How long the journal waits to gather more adds into one fsync. "
        "[default: 2; env: MAGNETAR_JOURNAL_MAX_GROUP_WAIT_MS]"
    ) in help_text
    assert "95%" in help_text
    assert "journal settings" in help_text

    args = parser.parse_args(["--data-dir", "/d", "--journal-flush-when-idle", "--labels", "a=b"])
    assert config_overrides_from_args(args, BookieConfig) == {
        "data_dir": "/d",
        "labels": "a=b",
        "journal": {"flush_when_idle": "true"},
    }
    config = load_config(
        BookieConfig, env={}, overrides=config_overrides_from_args(args, BookieConfig)
    )
    assert config.data_dir == Path("/d")
    assert config.labels == {"a": "b"}
    assert config.journal.flush_when_idle is True


def test_flags_can_be_limited_to_some_settings() -> None:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, BookieConfig, only=["journal", "data_dir"])
    args = parser.parse_args(["--journal-sync-mode", "none", "--data-dir", "/d"])
    assert config_overrides_from_args(args, BookieConfig) == {
        "data_dir": "/d",
        "journal": {"sync_mode": "none"},
    }
    with pytest.raises(SystemExit):
        parser.parse_args(["--listen-port", "1"])
    with pytest.raises(ValueError, match="no such settings in BookieConfig: jornal"):
        add_config_arguments(argparse.ArgumentParser(), BookieConfig, only=["jornal"])


def test_reference_table_lists_every_setting() -> None:
    reference = config_reference(BookieConfig)
    lines = reference.splitlines()
    assert lines[0] == "| field | env var | flag | type | default | description |"
    assert (
        "| `journal.max_group_wait_ms` | `MAGNETAR_JOURNAL_MAX_GROUP_WAIT_MS` | "
        "`--journal-max-group-wait-ms` | int | `2` | "
        "How long the journal waits to gather more adds into one fsync. |"
    ) in lines
    # Settings of a section that is unset by default are only required once it is used.
    assert "| `--tls-cert-file` | path | required for tls |" in reference
    assert "| `--extra-ports` | list of int | empty |" in reference
    # A pipe inside a cell is escaped so the table keeps its columns.
    assert "random\\|rack_aware" in reference
    assert len(lines) == 2 + 15


def test_settings_describe_each_flattened_setting_for_generated_docs() -> None:
    by_name = {setting.name: setting for setting in settings(BookieConfig)}
    assert list(by_name)[-5:] == [
        "journal.dir",
        "journal.max_group_wait_ms",
        "journal.max_group_bytes",
        "journal.sync_mode",
        "journal.flush_when_idle",
    ]
    sync_mode = by_name["journal.sync_mode"]
    assert sync_mode.env_var == "MAGNETAR_JOURNAL_SYNC_MODE"
    assert sync_mode.flag == "--journal-sync-mode"
    assert sync_mode.type == "fsync|fdatasync|none"
    assert sync_mode.default is SyncMode.FSYNC
    assert sync_mode.default_text == "fsync"
    assert sync_mode.doc == "How a group commit reaches the disk."
    assert not sync_mode.required
    key_file = by_name["tls.key_file"]
    assert key_file.required
    assert key_file.required_for == "tls"
    assert key_file.default is None
    cluster_name = settings(ClusterConfig)[0]
    assert cluster_name.required
    assert cluster_name.required_for is None
    assert cluster_name.default_text == "required"


def test_to_dict_is_json_friendly_and_nested() -> None:
    config = load_config(
        BookieConfig, env={"MAGNETAR_TLS_CERT_FILE": "/c", "MAGNETAR_TLS_KEY_FILE": "/k"}
    )
    plain = to_dict(config)
    assert json.loads(json.dumps(plain)) == plain
    assert plain["journal"] == {
        "dir": "data/journal",
        "max_group_wait_ms": 2,
        "max_group_bytes": 512 * 1024,
        "sync_mode": "fsync",
        "flush_when_idle": True,
    }
    assert plain["tls"] == {"cert_file": "/c", "key_file": "/k"}
    assert plain["metadata_urls"] == ["memory://"]


def test_config_classes_with_unsupported_shapes_fail_loudly() -> None:
    with pytest.raises(TypeError, match=r"ListConfig\.names: unsupported config field type"):
        load_config(ListConfig, env={})
    with pytest.raises(TypeError, match="both map to MAGNETAR_JOURNAL_DIR"):
        load_config(CollidingConfig, env={})
