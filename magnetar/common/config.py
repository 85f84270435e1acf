"""Configuration: how components declare their settings, and the one loader that fills them in.

A component declares its settings as a frozen, keyword-only dataclass. Units go in field names, a
one-line docstring sits directly under each field (it becomes flag help, the configuration
reference and the Helm values comments), and ``__post_init__`` checks the rules::

    @dataclass(frozen=True, kw_only=True)
    class JournalConfig:
        max_group_wait_ms: int = 2
        \"\"\"How long the journal waits to gather more adds into one fsync.\"\"\"

        def __post_init__(self) -> None:
            if self.max_group_wait_ms < 0:
                raise config_error("max_group_wait_ms", self.max_group_wait_ms, "must be >= 0")

A field whose type is another config dataclass is a nested section. Every setting has one name per
source, derived from its dotted path (``journal.max_group_wait_ms``):

========================  =============================================
config file (TOML)        ``[journal]`` table, key ``max_group_wait_ms``
environment               ``MAGNETAR_JOURNAL_MAX_GROUP_WAIT_MS``
command-line flag         ``--journal-max-group-wait-ms``
========================  =============================================

:func:`load_config` layers them: defaults <- config file <- environment <- overrides (the flags).
In the environment and on the command line every value is text: booleans are
``true/false/1/0/yes/no/on/off``, tuples are comma-separated (``a,b,c``), maps are
``k=v,k2=v2``, enums are given by name or value, and an empty value sets an optional
(``X | None``) setting to ``None``. In the TOML file values have their natural TOML types.

Config classes must be defined at module level: the loader resolves their annotations with
:func:`typing.get_type_hints` and reads their source for the field docs.

The ``--config FILE`` convention belongs to the commands, not to this module: a command adds
``--config`` itself (it is not a setting) and passes it on as ``file=``::

    parser.add_argument("--config", type=Path, help="TOML config file")
    add_config_arguments(parser, BookieConfig)
    args = parser.parse_args()
    config = load_config(
        BookieConfig, file=args.config, overrides=config_overrides_from_args(args, BookieConfig)
    )
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import enum
import functools
import inspect
import itertools
import os
import textwrap
import tomllib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Literal, TypeVar, cast

from magnetar.common.errors import InvalidConfigError

__all__ = [
    "ENV_PREFIX",
    "Setting",
    "add_config_arguments",
    "config_error",
    "config_overrides_from_args",
    "config_reference",
    "field_docs",
    "load_config",
    "missing_field_docs",
    "settings",
    "to_dict",
]

ENV_PREFIX = "MAGNETAR_"

_C = TypeVar("_C")

_TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})


class _Missing(enum.Enum):
    MISSING = "required"


_MISSING = _Missing.MISSING


def config_error(field: str, value: object, rule: str) -> InvalidConfigError:
    """The error a config's ``__post_init__`` raises: names the field, the bad value and the rule.

    ``rule`` reads as a requirement (``"must be >= 1"``). The loader recognises the ``field`` in the
    error's context and adds the setting's full dotted name and where the value came from.
    """
    return InvalidConfigError(
        f"{field}: {rule}, got {value!r}",
        context={"field": field, "value": value, "rule": rule},
    )


# --- field docs -----------------------------------------------------------------------------


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of the dataclass ``cls`` (and its dataclass bases).

    Fields without a docstring are absent. Whitespace is collapsed to one line.
    """
    return dict(_field_docs(cls))


@functools.cache
def _field_docs(cls: type) -> Mapping[str, str]:
    docs: dict[str, str] = {}
    # Bases first, so a subclass that documents a field again wins.
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        docs.update(_own_field_docs(klass))
    return types.MappingProxyType(docs)


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        # Classes built at runtime have no source; they simply have no field docs.
        return {}
    module = ast.parse(source)
    class_def = next(
        (node for node in module.body if isinstance(node, ast.ClassDef)),
        None,
    )
    if class_def is None:
        return {}
    docs: dict[str, str] = {}
    body = class_def.body
    for statement, following in itertools.pairwise(body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def missing_field_docs(cls: type) -> list[str]:
    """Dotted names of settings of ``cls`` (nested sections included) that have no docstring.

    Meant for one test per component config, so an undocumented setting fails the build.
    """
    return [leaf.dotted for leaf in _schema(cls).leaves if not leaf.doc]


# --- value types ----------------------------------------------------------------------------


class _BadValueError(ValueError):
    """A raw value does not fit the setting's type; the loader adds the source."""


@dataclass(frozen=True)
class _ValueType:
    """How one setting's values are read from text (env, flags) and from TOML/Python values."""

    label: str
    """Short type name for the reference table and flag help."""
    expected: str
    """What a valid value looks like, for error messages."""
    metavar: str
    parse_text: Callable[[str], object]
    coerce: Callable[[object], object]
    is_bool: bool = False

    def convert(self, raw: object) -> object:
        if isinstance(raw, str):
            return self.parse_text(raw)
        return self.coerce(raw)


def _parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise _BadValueError(text)


def _coerce_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise _BadValueError(value)


def _coerce_int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _BadValueError(value)


def _coerce_float(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise _BadValueError(value)


def _coerce_str(value: object) -> str:
    if isinstance(value, str):
        return value
    raise _BadValueError(value)


def _scalar_type(tp: Any) -> _ValueType | None:
    # Enum before int/str: IntEnum and StrEnum are subclasses of both.
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_type(tp)
    if typing.get_origin(tp) is Literal:
        return _literal_type(typing.get_args(tp))
    if tp is bool:
        return _ValueType(
            "bool",
            "a boolean (true/false, 1/0, yes/no, on/off)",
            "BOOL",
            _parse_bool,
            _coerce_bool,
            is_bool=True,
        )
    if tp is int:
        return _ValueType("int", "an integer", "INT", lambda text: int(text.strip()), _coerce_int)
    if tp is float:
        return _ValueType(
            "float", "a number", "NUMBER", lambda text: float(text.strip()), _coerce_float
        )
    if tp is str:
        return _ValueType("str", "a string", "TEXT", lambda text: text, _coerce_str)
    if isinstance(tp, type) and issubclass(tp, PurePath):
        path_cls = tp

        def parse_path(text: str) -> object:
            if not text.strip():
                raise _BadValueError(text)
            return path_cls(text)

        def coerce_path(value: object) -> object:
            if isinstance(value, os.PathLike):
                return path_cls(os.fspath(value))
            raise _BadValueError(value)

        return _ValueType("path", "a path", "PATH", parse_path, coerce_path)
    return None


def _enum_type(enum_cls: type[enum.Enum]) -> _ValueType:
    members = list(enum_cls)
    shown = [str(m.value) if isinstance(m.value, str) else m.name for m in members]

    def parse(text: str) -> object:
        wanted = text.strip()
        for member in members:
            if wanted in (member.name, str(member.value)):
                return member
        # Exact spellings first: two members may differ only in case.
        folded = wanted.casefold()
        for member in members:
            if folded in (member.name.casefold(), str(member.value).casefold()):
                return member
        raise _BadValueError(text)

    def coerce(value: object) -> object:
        if isinstance(value, enum_cls):
            return value
        for member in members:
            if member.value == value and type(member.value) is type(value):
                return member
        raise _BadValueError(value)

    return _ValueType(
        "|".join(shown),
        f"one of {', '.join(shown)}",
        "{" + ",".join(shown) + "}",
        parse,
        coerce,
    )


def _literal_type(choices: tuple[Any, ...]) -> _ValueType:
    shown = [str(choice) for choice in choices]

    def parse(text: str) -> object:
        for choice in choices:
            if str(choice) == text.strip():
                return choice
        raise _BadValueError(text)

    def coerce(value: object) -> object:
        for choice in choices:
            if choice == value and type(choice) is type(value):
                return choice
        raise _BadValueError(value)

    return _ValueType(
        "|".join(shown),
        f"one of {', '.join(shown)}",
        "{" + ",".join(shown) + "}",
        parse,
        coerce,
    )


def _tuple_type(item: _ValueType) -> _ValueType:
    def parse(text: str) -> object:
        return tuple(item.parse_text(part.strip()) for part in text.split(",") if part.strip())

    def coerce(value: object) -> object:
        if isinstance(value, list | tuple):
            return tuple(item.convert(element) for element in value)
        raise _BadValueError(value)

    return _ValueType(
        f"list of {item.label}",
        f"a list of values, each {item.expected} (comma-separated in text)",
        f"{item.metavar}[,{item.metavar}...]",
        parse,
        coerce,
    )


def _mapping_type(item: _ValueType) -> _ValueType:
    def parse(text: str) -> object:
        result: dict[str, object] = {}
        for part in text.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise _BadValueError(text)
            result[key.strip()] = item.parse_text(value.strip())
        return result

    def coerce(value: object) -> object:
        if isinstance(value, Mapping):
            return {_coerce_str(key): item.convert(element) for key, element in value.items()}
        raise _BadValueError(value)

    return _ValueType(
        f"map of str to {item.label}",
        f"a table of keys to values, each {item.expected} (k=v,k2=v2 in text)",
        "KEY=VALUE[,KEY=VALUE...]",
        parse,
        coerce,
    )


def _optional_type(inner: _ValueType) -> _ValueType:
    def parse(text: str) -> object:
        return None if not text.strip() else inner.parse_text(text)

    def coerce(value: object) -> object:
        return None if value is None else inner.coerce(value)

    return _ValueType(
        f"{inner.label} (optional)",
        f"{inner.expected}, or empty for none",
        inner.metavar,
        parse,
        coerce,
        is_bool=inner.is_bool,
    )


def _split_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = typing.get_args(tp)
        rest = [member for member in members if member is not type(None)]
        if len(rest) == 1 and len(members) == 2:
            return rest[0], True
    return tp, False


def _value_type(tp: Any, where: str) -> _ValueType:
    inner, optional = _split_optional(tp)
    value_type = _scalar_type(inner)
    origin = typing.get_origin(inner)
    if value_type is None and origin is tuple:
        args = typing.get_args(inner)
        item = _scalar_type(args[0]) if len(args) == 2 and args[1] is Ellipsis else None
        if item is not None:
            value_type = _tuple_type(item)
    if value_type is None and origin is dict:
        key, value = typing.get_args(inner)
        item = _scalar_type(value) if key is str else None
        if item is not None:
            value_type = _mapping_type(item)
    if value_type is None:
        raise TypeError(
            f"{where}: unsupported config field type {tp!r}; use int, float, bool, str, Path, "
            "a Literal, an Enum, tuple[X, ...], dict[str, X], X | None or a config dataclass"
        )
    return _optional_type(value_type) if optional else value_type


# --- schema: a config class flattened into settings -----------------------------------------


@dataclass(frozen=True)
class _Leaf:
    path: tuple[str, ...]
    value_type: _ValueType
    doc: str
    default: object
    """The effective default (from the enclosing section's default instance), or _MISSING."""
    unset_section: str | None
    """The optional section, unset by default, this setting belongs to (its defaults only
    matter once the section is used)."""

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    @property
    def env_name(self) -> str:
        return ENV_PREFIX + "_".join(self.path).upper()

    @property
    def flag(self) -> str:
        return "--" + "-".join(self.path).replace("_", "-")


@dataclass(frozen=True)
class _Section:
    cls: type
    path: tuple[str, ...]
    fields: Mapping[str, dataclasses.Field[Any]]
    children: Mapping[str, _Leaf | _Section]
    optional: bool

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True)
class _Schema:
    root: _Section
    leaves: tuple[_Leaf, ...]


def _field_default(field: dataclasses.Field[Any]) -> object:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return _MISSING


def _config_class(tp: Any) -> tuple[type | None, bool]:
    inner, optional = _split_optional(tp)
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        return inner, optional
    return None, False


@functools.cache
def _schema(cls: type) -> _Schema:
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{cls!r} is not a config dataclass")
    leaves: list[_Leaf] = []
    root = _build_section(cls, (), None, optional=False, unset_section=None, leaves=leaves)
    seen: dict[str, str] = {}
    for leaf in leaves:
        # Flattening joins names with "_", so `journal_dir` and `journal.dir` would share
        # MAGNETAR_JOURNAL_DIR; refuse such a class rather than guess.
        other = seen.setdefault(leaf.env_name, leaf.dotted)
        if other != leaf.dotted:
            raise TypeError(
                f"{cls.__qualname__}: settings {other!r} and {leaf.dotted!r} "
                f"both map to {leaf.env_name}; rename one"
            )
    return _Schema(root, tuple(leaves))


def _build_section(
    cls: type,
    path: tuple[str, ...],
    base: object,
    *,
    optional: bool,
    unset_section: str | None,
    leaves: list[_Leaf],
) -> _Section:
    try:
        hints = typing.get_type_hints(cls)
    except NameError as exc:
        raise TypeError(
            f"cannot resolve the annotations of {cls.__qualname__} ({exc}); "
            "define config classes at module level"
        ) from exc
    docs = _field_docs(cls)
    # A config's own settings first, then those of the shared groups it inherits (the security
    # settings of magnetar.common.security.config), so flags and references read in that order.
    own = set(getattr(cls, "__annotations__", {}))
    ordered = sorted(dataclasses.fields(cls), key=lambda f: f.name not in own)
    fields = {f.name: f for f in ordered if f.init}
    children: dict[str, _Leaf | _Section] = {}
    for name, field in fields.items():
        child_path = (*path, name)
        default = getattr(base, name) if base is not None else _field_default(field)
        nested, nested_optional = _config_class(hints[name])
        if nested is not None:
            nested_base = default if isinstance(default, nested) else None
            children[name] = _build_section(
                nested,
                child_path,
                nested_base,
                optional=nested_optional,
                unset_section=unset_section
                or (".".join(child_path) if nested_base is None and nested_optional else None),
                leaves=leaves,
            )
            continue
        where = f"{cls.__qualname__}.{name}"
        leaf = _Leaf(
            child_path,
            _value_type(hints[name], where),
            docs.get(name, ""),
            default,
            unset_section,
        )
        children[name] = leaf
        leaves.append(leaf)
    return _Section(cls, path, fields, children, optional)


# --- loading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Given:
    value: object
    source: str


def load_config(
    cls: type[_C],
    *,
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> _C:
    """Build ``cls`` from defaults <- TOML ``file`` <- ``MAGNETAR_*`` ``env`` <- ``overrides``.

    ``env`` defaults to ``os.environ``; only names of settings of ``cls`` are read, so variables
    meant for other components are ignored. ``overrides`` is a nested mapping (a nested section
    is a mapping under its field name) of values or their text forms, as made by
    :func:`config_overrides_from_args`; its sources are reported as flags.

    Raises :class:`InvalidConfigError` naming the setting, where its value came from and what
    was expected: for unknown keys in the file, values that cannot be converted, missing
    required settings, and rules broken in ``__post_init__``.
    """
    schema = _schema(cast("type", cls))
    given: dict[tuple[str, ...], _Given] = {}
    if file is not None:
        _collect_table(schema.root, _read_toml(file), given, f"config file {file}")
    environment = os.environ if env is None else env
    for leaf in schema.leaves:
        text = environment.get(leaf.env_name)
        if text is not None:
            source = f"environment variable {leaf.env_name}"
            given[leaf.path] = _Given(_convert(leaf, text, source), source)
    if overrides:
        _collect_table(schema.root, overrides, given, None)
    return cast("_C", _build(schema.root, given, None))


def _read_toml(file: Path) -> Mapping[str, object]:
    try:
        with file.open("rb") as stream:
            return tomllib.load(stream)
    except FileNotFoundError:
        raise InvalidConfigError(
            f"config file {file} does not exist", context={"file": file}
        ) from None
    except OSError as exc:
        raise InvalidConfigError(
            f"config file {file} cannot be read: {exc.strerror or exc}", context={"file": file}
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise InvalidConfigError(
            f"config file {file} is not valid TOML: {exc}", context={"file": file}
        ) from exc


def _collect_table(
    section: _Section,
    table: Mapping[str, object],
    given: dict[tuple[str, ...], _Given],
    file_source: str | None,
) -> None:
    """Convert the values of a TOML table (``file_source`` set) or an overrides mapping."""
    for key, raw in table.items():
        child = section.children.get(key)
        dotted = ".".join((*section.path, key))
        if child is None:
            where = f"in {file_source}" if file_source else "in the overrides"
            raise InvalidConfigError(
                f"unknown key {dotted!r} {where}{_suggestion(section, key)}",
                context={"key": dotted, "source": file_source or "overrides"},
            )
        if isinstance(child, _Section):
            if not isinstance(raw, Mapping):
                source = _source_name(file_source, dotted, None)
                raise InvalidConfigError(
                    f"{source}: expected a table of {child.cls.__name__} settings, got {raw!r}",
                    context={"key": dotted, "source": source},
                )
            _collect_table(child, raw, given, file_source)
            continue
        source = _source_name(file_source, dotted, child)
        given[child.path] = _Given(_convert(child, raw, source), source)


def _source_name(file_source: str | None, dotted: str, leaf: _Leaf | None) -> str:
    if file_source is not None:
        return f"{file_source}, key {dotted}"
    return f"flag {leaf.flag}" if leaf is not None else f"override {dotted}"


def _suggestion(section: _Section, key: str) -> str:
    names = list(section.children)
    close = difflib.get_close_matches(key.replace("-", "_"), names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {'.'.join((*section.path, close[0]))!r}?"
    # A setting written at the wrong level, e.g. a journal setting outside its [journal] table.
    for leaf in _schema(section.cls).leaves:
        if leaf.path[-1] == key.replace("-", "_"):
            return f"; did you mean {'.'.join((*section.path, *leaf.path))!r}?"
    return f"; known keys: {', '.join(sorted(names))}"


def _convert(leaf: _Leaf, raw: object, source: str) -> object:
    try:
        return leaf.value_type.convert(raw)
    except (ValueError, TypeError):
        raise InvalidConfigError(
            f"{source}: expected {leaf.value_type.expected}, got {raw!r}",
            context={"setting": leaf.dotted, "source": source, "value": raw},
        ) from None


def _build(section: _Section, given: Mapping[tuple[str, ...], _Given], base: object) -> object:
    kwargs: dict[str, object] = {}
    missing: list[_Leaf] = []
    for name, child in section.children.items():
        field = section.fields[name]
        has_default = base is not None or _field_default(field) is not _MISSING
        if isinstance(child, _Section):
            if any(path[: len(child.path)] == child.path for path in given):
                current = getattr(base, name) if base is not None else _field_default(field)
                kwargs[name] = _build(child, given, current if current is not _MISSING else None)
            elif not has_default:
                kwargs[name] = None if child.optional else _build(child, given, None)
        elif child.path in given:
            kwargs[name] = given[child.path].value
        elif not has_default:
            missing.append(child)
    if missing:
        raise InvalidConfigError(
            "missing required "
            + "; ".join(
                f"setting {leaf.dotted} (set it in the config file, with {leaf.env_name} "
                f"or with {leaf.flag})"
                for leaf in missing
            ),
            context={"settings": ",".join(leaf.dotted for leaf in missing)},
        )
    if base is not None and not kwargs:
        return base
    try:
        if base is not None:
            return dataclasses.replace(cast("Any", base), **kwargs)
        return section.cls(**kwargs)
    except InvalidConfigError as exc:
        located = _locate(exc, section, given)
        if located is exc:
            raise
        raise located from exc


def _locate(
    exc: InvalidConfigError, section: _Section, given: Mapping[tuple[str, ...], _Given]
) -> InvalidConfigError:
    """Add the full dotted name and the value's source to a ``config_error`` from a section."""
    field = exc.context.get("field")
    if field is None or field not in section.children:
        return exc
    child = section.children[field]
    message = exc.message
    context: dict[str, object] = dict(exc.context)
    if section.path:
        dotted = ".".join((*section.path, field))
        message = f"{section.dotted}.{message}" if message.startswith(field) else message
        context["field"] = dotted
    origin = given.get(child.path) if isinstance(child, _Leaf) else None
    if origin is not None:
        message = f"{message} (from {origin.source})"
        context["source"] = origin.source
    elif isinstance(child, _Leaf):
        message = f"{message} (the default)"
    return InvalidConfigError(message, context=context)


# --- command-line flags ---------------------------------------------------------------------


def add_config_arguments(
    parser: argparse.ArgumentParser, cls: type, *, only: Iterable[str] | None = None
) -> None:
    """Add one ``--kebab-name`` flag per setting of ``cls`` to ``parser``.

    Nested sections get their own argument group. Flags default to ``argparse.SUPPRESS`` so only
    the flags actually given appear in the namespace; read them back with
    :func:`config_overrides_from_args`. ``only`` restricts the flags to the given dotted setting
    names or section names (``"journal"`` selects every journal setting). Boolean flags may be
    given without a value to mean true.
    """
    schema = _schema(cls)
    leaves = _select(schema, only)
    groups: dict[tuple[str, ...], argparse._ActionsContainer] = {(): parser}
    for leaf in leaves:
        section_path = leaf.path[:-1]
        container = groups.get(section_path)
        if container is None:
            section = _section_at(schema, section_path)
            summary = (inspect.getdoc(section.cls) or "").split("\n", 1)[0]
            if summary.startswith(f"{section.cls.__name__}("):
                # The signature dataclasses write into an undocumented class says nothing here.
                summary = ""
            container = parser.add_argument_group(f"{section.dotted} settings", summary or None)
            groups[section_path] = container
        help_text = (
            f"{leaf.doc or leaf.dotted} [default: {_setting(leaf).default_text}; "
            f"env: {leaf.env_name}]"
        )
        options: dict[str, Any] = {
            "dest": leaf.dotted,
            "default": argparse.SUPPRESS,
            "metavar": leaf.value_type.metavar,
            # argparse %-formats help text; a literal "%" in a docstring must survive that.
            "help": help_text.replace("%", "%%"),
        }
        if leaf.value_type.is_bool:
            options.update(nargs="?", const="true")
        container.add_argument(leaf.flag, **options)


def config_overrides_from_args(namespace: argparse.Namespace, cls: type) -> dict[str, object]:
    """The nested overrides mapping for :func:`load_config` from flags parsed by argparse.

    Only flags that were given are present (the flags default to ``argparse.SUPPRESS``).
    """
    overrides: dict[str, object] = {}
    for leaf in _schema(cls).leaves:
        if hasattr(namespace, leaf.dotted):
            table = overrides
            for name in leaf.path[:-1]:
                table = cast("dict[str, object]", table.setdefault(name, {}))
            table[leaf.path[-1]] = getattr(namespace, leaf.dotted)
    return overrides


def _select(schema: _Schema, only: Iterable[str] | None) -> list[_Leaf]:
    if only is None:
        return list(schema.leaves)
    wanted = set(only)
    known = {leaf.dotted for leaf in schema.leaves}
    known |= {".".join(leaf.path[:i]) for leaf in schema.leaves for i in range(1, len(leaf.path))}
    unknown = sorted(wanted - known)
    if unknown:
        raise ValueError(f"no such settings in {schema.root.cls.__name__}: {', '.join(unknown)}")
    return [
        leaf
        for leaf in schema.leaves
        if any(".".join(leaf.path[:i]) in wanted for i in range(1, len(leaf.path) + 1))
    ]


def _section_at(schema: _Schema, path: tuple[str, ...]) -> _Section:
    section = schema.root
    for name in path:
        child = section.children[name]
        assert isinstance(child, _Section)
        section = child
    return section


# --- documentation and logging --------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One setting of a config class, flattened, as docs, flag help and Helm values show it."""

    name: str
    """Dotted path of the setting: ``journal.max_group_wait_ms``."""
    env_var: str
    """Environment variable that sets it: ``MAGNETAR_JOURNAL_MAX_GROUP_WAIT_MS``."""
    flag: str
    """Command-line flag that sets it: ``--journal-max-group-wait-ms``."""
    type: str
    """Short name of its type: ``int``, ``path``, ``list of str``, ``fsync|none``."""
    required: bool
    """No default: it must be given (see ``required_for``)."""
    required_for: str | None
    """The optional section it belongs to: required only once that section is used."""
    default: object
    """The effective default value (``None`` when required)."""
    default_text: str
    """The default as the environment and flags would spell it; ``required`` or ``empty``."""
    doc: str
    """The docstring under the field."""


def settings(cls: type) -> list[Setting]:
    """Every setting of ``cls``, nested sections flattened, in declaration order."""
    return [_setting(leaf) for leaf in _schema(cls).leaves]


def _setting(leaf: _Leaf) -> Setting:
    required = leaf.default is _MISSING
    if required:
        text = f"required for {leaf.unset_section}" if leaf.unset_section else "required"
    else:
        text = _default_text(leaf.default) or "empty"
    return Setting(
        name=leaf.dotted,
        env_var=leaf.env_name,
        flag=leaf.flag,
        type=leaf.value_type.label,
        required=required,
        required_for=leaf.unset_section if required else None,
        default=None if required else leaf.default,
        default_text=text,
        doc=leaf.doc,
    )


def config_reference(cls: type, *, sources: bool = True) -> str:
    """A markdown table of every setting of ``cls``: field, env var, flag, type, default, docs
    (without the env var and flag columns when ``sources`` is false: settings that are only
    keyword arguments, like the client's)."""
    if sources:
        rows = [
            "| field | env var | flag | type | default | description |",
            "|---|---|---|---|---|---|",
        ]
    else:
        rows = ["| setting | type | default | description |", "|---|---|---|---|"]
    for setting in settings(cls):
        plain_default = setting.required or setting.default_text == "empty"
        where = [f"`{setting.env_var}`", f"`{setting.flag}`"] if sources else []
        cells = [
            f"`{setting.name}`",
            *where,
            setting.type,
            setting.default_text if plain_default else f"`{setting.default_text}`",
            setting.doc,
        ]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def _default_text(value: object) -> str:
    """A default in the text form the environment and flags accept."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value) if isinstance(value.value, str) else value.name
    if isinstance(value, tuple):
        return ",".join(_default_text(item) for item in value)
    if isinstance(value, Mapping):
        return ",".join(f"{key}={_default_text(item)}" for key, item in value.items())
    if value == "":
        return '""'
    return str(value)


def to_dict(config: object) -> dict[str, object]:
    """``config`` as nested plain data (str, int, float, bool, None, list, dict) for logging.

    Paths become strings, enums their string value (or name), tuples lists.
    """
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"{config!r} is not a config dataclass instance")
    return {field.name: _plain(getattr(config, field.name)) for field in dataclasses.fields(config)}


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, enum.Enum):
        return value.value if isinstance(value.value, str | int | float | bool) else value.name
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    return value
