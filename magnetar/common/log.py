"""Logging: the process's one log pipeline, for structlog events and standard-library records.

Servers call :func:`configure_logging` once at startup (``mode="json"``: one JSON object per line
with ``timestamp`` (ISO 8601, UTC), ``level``, ``logger``, ``event`` and the bound context);
commands for humans use ``mode="console"`` (colours only when the stream is a terminal). Code gets
loggers from :func:`get_logger` and logs snake_case facts with context bound once::

    log = get_logger(__name__, component="bookie").bind(bookie_id=bookie_id)
    log.info("ledger_closed", ledger_id=ledger_id, last_entry_id=last_entry_id)

Records from the standard ``logging`` module (grpc, asyncio, aetcd) go through the same pipeline.
Library code only calls :func:`get_logger`; it never configures logging, so an application that
embeds the client keeps its own logging setup.

A caller never waits on the output stream. Records are rendered in the calling thread and put on a
bounded in-memory queue that a daemon thread drains to the stream. When the stream blocks (a full
pipe, a stalled terminal, a paused ``kubectl logs``) and the queue fills, new records are dropped
and counted (:func:`dropped_log_records`); once the writer can write again it emits a
``log_records_dropped`` record with the count, at the place in the output where the records went
missing. Call :func:`flush_logging` before exit (it is also registered with :mod:`atexit`) and in
tests before reading the output.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TextIO, cast

import structlog
from structlog.typing import EventDict, FilteringBoundLogger

from magnetar.common.errors import InvalidConfigError

__all__ = [
    "DEFAULT_QUEUE_SIZE",
    "LibraryLogger",
    "configure_logging",
    "dropped_log_records",
    "flush_logging",
    "get_library_logger",
    "get_logger",
    "reset_logging",
]

DEFAULT_QUEUE_SIZE = 10_000
"""Records held while the stream is slow; beyond this they are dropped and counted."""

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
# structlog passes the name of the method that was called; these are all the ones it has.
_METHOD_LEVELS = {
    **_LEVELS,
    "exception": logging.ERROR,
    "fatal": logging.CRITICAL,
    "msg": logging.INFO,
}
_FIRST_KEYS = ("timestamp", "level", "logger", "event")
_MAX_BATCH = 256
# How often an idle writer looks for drops to report and for being stopped.
_IDLE_POLL_S = 0.05
_OWN_LOGGER_NAME = "magnetar.common.log"


class _Dropped(NamedTuple):
    """Queue marker: ``records`` records were dropped at this point of the output."""

    records: int


class _Sink:
    """The bounded queue and the daemon thread that drains it to one stream."""

    def __init__(
        self, stream: TextIO, queue_size: int, render_dropped: Callable[[int], str]
    ) -> None:
        self._stream = stream
        self._render_dropped = render_dropped
        self._queue: queue.Queue[str | _Dropped] = queue.Queue(maxsize=queue_size)
        # Guards the drop counters, and orders a drop marker before the next record.
        self._lock = threading.Lock()
        self._unreported = 0
        self.dropped = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="magnetar-log-writer", daemon=True)
        self._thread.start()

    def submit(self, line: str) -> None:
        """Queue one rendered line; never blocks."""
        with self._lock:
            if self._unreported and not self._enqueue_marker_locked():
                self._count_drop_locked(1)
                return
            try:
                self._queue.put_nowait(line)
            except queue.Full:
                self._count_drop_locked(1)

    def _count_drop_locked(self, records: int) -> None:
        self.dropped += records
        self._unreported += records

    def _enqueue_marker_locked(self) -> bool:
        try:
            self._queue.put_nowait(_Dropped(self._unreported))
        except queue.Full:
            return False
        self._unreported = 0
        return True

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=_IDLE_POLL_S)
            except queue.Empty:
                if self._stopping.is_set():
                    return
                # Drops with no record after them yet: report them now the stream keeps up.
                with self._lock:
                    if self._unreported:
                        self._enqueue_marker_locked()
                continue
            batch = [item]
            while len(batch) < _MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    def _write(self, batch: list[str | _Dropped]) -> None:
        text = "".join(
            item if isinstance(item, str) else self._render_dropped(item.records) for item in batch
        )
        try:
            self._stream.write(text)
            self._stream.flush()
        except Exception:  # noqa: BLE001
            # A closed or broken stream must not kill the writer (the queue would then fill
            # for good); the lost records are counted like any other drop.
            lost_records = sum(1 for item in batch if isinstance(item, str))
            lost_markers = sum(item.records for item in batch if isinstance(item, _Dropped))
            with self._lock:
                self.dropped += lost_records
                self._unreported += lost_records + lost_markers

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything queued, and the report of any drops, is written."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self._unreported:
                    self._enqueue_marker_locked()
                settled = self._unreported == 0
            with self._queue.all_tasks_done:
                while self._queue.unfinished_tasks:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._queue.all_tasks_done.wait(remaining)
            if settled:
                return True
            if time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        """Let the writer finish what is queued, then exit."""
        self._stopping.set()


@dataclass(frozen=True)
class _Pipeline:
    sink: _Sink
    level: int
    render: Callable[[EventDict], str]


_pipeline: _Pipeline | None = None
_configure_lock = threading.Lock()
_stdlib_handler: _StdlibHandler | None = None
# The root logger's level before the first configure_logging, for reset_logging to restore.
_root_level_before: int | None = None
_atexit_registered = False


def configure_logging(
    *,
    mode: Literal["json", "console"] = "console",
    level: str = "info",
    stream: TextIO | None = None,
    queue_size: int = DEFAULT_QUEUE_SIZE,
) -> None:
    """Route structlog and standard-library logging through one pipeline to ``stream``.

    ``stream`` defaults to ``sys.stdout``. ``level`` is a level name (``debug``, ``info``,
    ``warning``, ``error``, ``critical``). Calling it again replaces the previous setup: the old
    writer finishes what it had queued and exits, and the drop count starts again at zero.
    """
    global _pipeline, _stdlib_handler, _root_level_before, _atexit_registered  # noqa: PLW0603
    if mode not in ("json", "console"):
        raise InvalidConfigError(
            f"log mode: must be 'json' or 'console', got {mode!r}", context={"field": "mode"}
        )
    level_number = _LEVELS.get(level.lower())
    if level_number is None:
        raise InvalidConfigError(
            f"log level: must be one of {', '.join(_LEVELS)}, got {level!r}",
            context={"field": "level"},
        )
    if queue_size < 1:
        raise InvalidConfigError(
            f"log queue_size: must be >= 1, got {queue_size!r}", context={"field": "queue_size"}
        )
    out = stream if stream is not None else sys.stdout
    render = _make_renderer(mode, out)

    def render_dropped(count: int) -> str:
        return render(
            {
                "timestamp": _now_iso(),
                "level": "warning",
                "logger": _OWN_LOGGER_NAME,
                "event": "log_records_dropped",
                "count": count,
            }
        )

    with _configure_lock:
        previous = _pipeline
        if previous is not None:
            # Briefly, so lines already queued keep their place ahead of the new writer's.
            previous.sink.flush(timeout_s=0.2)
            previous.sink.close()
        _pipeline = _Pipeline(_Sink(out, queue_size, render_dropped), level_number, render)

        # The processors read _pipeline at call time, so loggers cached by structlog (and
        # loggers bound before a reconfiguration) always use the current setup.
        structlog.configure(
            processors=[
                _drop_below_level,
                structlog.contextvars.merge_contextvars,
                structlog.processors.add_log_level,
                _add_logger_name,
                _add_timestamp,
                structlog.processors.StackInfoRenderer(),
                _render_line,
            ],
            wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
            logger_factory=_SinkLoggerFactory(),
            context_class=dict,
            cache_logger_on_first_use=True,
        )

        root = logging.getLogger()
        if _stdlib_handler is not None:
            root.removeHandler(_stdlib_handler)
        else:
            _root_level_before = root.level
        _stdlib_handler = _StdlibHandler(level_number)
        root.addHandler(_stdlib_handler)
        root.setLevel(level_number)

        if not _atexit_registered:
            atexit.register(flush_logging, timeout_s=2.0)
            _atexit_registered = True


def reset_logging() -> None:
    """Undo :func:`configure_logging` (for tests): write what is queued, stop the writer,
    detach from the root logger (restoring its level) and restore structlog's defaults.

    Loggers that structlog cached while the pipeline was configured stay quiet until
    :func:`configure_logging` is called again.
    """
    global _pipeline, _stdlib_handler  # noqa: PLW0603
    with _configure_lock:
        previous = _pipeline
        _pipeline = None
        if previous is not None:
            previous.sink.flush(timeout_s=0.2)
            previous.sink.close()
        if _stdlib_handler is not None:
            root = logging.getLogger()
            root.removeHandler(_stdlib_handler)
            if _root_level_before is not None:
                root.setLevel(_root_level_before)
            _stdlib_handler = None
        structlog.reset_defaults()


def get_logger(name: str | None = None, **bound: object) -> FilteringBoundLogger:
    """A structlog logger whose records carry ``logger=name`` (when given) and ``bound``.

    Safe to call at import time: the logger follows whatever :func:`configure_logging` set up
    when it is first used.
    """
    args = () if name is None else (name,)
    return cast("FilteringBoundLogger", structlog.get_logger(*args, **bound))


class LibraryLogger:
    """A logger for code that runs inside other people's programs (the client library).

    When the process configured structlog (our own commands do, through
    :func:`configure_logging`; so may the application) records go through structlog like any
    other. When nobody configured it, structlog's default would print every record to stdout;
    instead records go to the standard library logger ``name``, whose defaults show warnings and
    errors on stderr and keep quiet about the rest, and which an application configures the
    usual way (``logging.getLogger("magnetar").setLevel(logging.INFO)``).
    """

    __slots__ = ("_bound", "_name")

    def __init__(self, name: str, bound: dict[str, object]) -> None:
        self._name = name
        self._bound = bound

    def bind(self, **bound: object) -> LibraryLogger:
        return LibraryLogger(self._name, {**self._bound, **bound})

    def _log(self, level: int, method: str, event: str, fields: dict[str, Any]) -> None:
        if structlog.is_configured():
            target = structlog.get_logger(self._name, **self._bound)
            getattr(target, method)(event, **fields)
            return
        std = logging.getLogger(self._name)
        if not std.isEnabledFor(level):
            return
        context = {**self._bound, **fields}
        exc_info = method == "exception"
        text = " ".join([event, *(f"{k}={v}" for k, v in context.items())])
        std.log(level, "%s", text, exc_info=exc_info)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, "debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, "info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, "warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, "error", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, "exception", event, fields)


def get_library_logger(name: str, **bound: object) -> LibraryLogger:
    """A :class:`LibraryLogger`: structlog when the process configured it, otherwise the
    standard library logger ``name`` (quiet below warning unless the application says so)."""
    return LibraryLogger(name, dict(bound))


def flush_logging(timeout_s: float = 5.0) -> bool:
    """Wait up to ``timeout_s`` until every queued record is written; ``False`` on timeout."""
    pipeline = _pipeline
    return True if pipeline is None else pipeline.sink.flush(timeout_s)


def dropped_log_records() -> int:
    """Records dropped because the stream could not keep up, since the last configuration."""
    pipeline = _pipeline
    return 0 if pipeline is None else pipeline.sink.dropped


# --- pipeline pieces ------------------------------------------------------------------------


def _now_iso() -> str:
    return _iso(datetime.datetime.now(tz=datetime.UTC))


def _iso(moment: datetime.datetime) -> str:
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _drop_below_level(_logger: object, method_name: str, event_dict: EventDict) -> EventDict:
    pipeline = _pipeline
    if pipeline is None or _METHOD_LEVELS.get(method_name, logging.INFO) < pipeline.level:
        raise structlog.DropEvent
    return event_dict


def _add_logger_name(logger: object, _method_name: str, event_dict: EventDict) -> EventDict:
    name = getattr(logger, "name", None)
    if name is not None:
        event_dict.setdefault("logger", name)
    return event_dict


def _add_timestamp(_logger: object, _method_name: str, event_dict: EventDict) -> EventDict:
    event_dict["timestamp"] = _now_iso()
    return event_dict


def _render_line(_logger: object, _method_name: str, event_dict: EventDict) -> str:
    pipeline = _pipeline
    if pipeline is None:
        raise structlog.DropEvent
    return pipeline.render(event_dict)


def _make_renderer(mode: str, stream: TextIO) -> Callable[[EventDict], str]:
    if mode == "json":
        json_renderer = structlog.processors.JSONRenderer()

        def render_json(event_dict: EventDict) -> str:
            ordered: EventDict = {key: event_dict[key] for key in _FIRST_KEYS if key in event_dict}
            ordered.update(event_dict)
            ordered = structlog.processors.format_exc_info(None, "", ordered)
            return cast("str", json_renderer(None, "", ordered)) + "\n"

        return render_json

    console_renderer = structlog.dev.ConsoleRenderer(
        colors=_is_terminal(stream), exception_formatter=structlog.dev.plain_traceback
    )

    def render_console(event_dict: EventDict) -> str:
        return console_renderer(None, "", event_dict) + "\n"

    return render_console


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _SinkLogger:
    """What structlog writes rendered lines to: the current pipeline's queue."""

    def __init__(self, name: str | None) -> None:
        self.name = name

    def _submit(self, line: str) -> None:
        pipeline = _pipeline
        if pipeline is not None:
            pipeline.sink.submit(line)

    msg = debug = info = warning = warn = error = critical = exception = fatal = log = _submit


class _SinkLoggerFactory:
    """Called by structlog with ``get_logger``'s positional arguments: the logger's name."""

    def __call__(self, *args: Any) -> _SinkLogger:
        return _SinkLogger(str(args[0]) if args else None)


class _StdlibHandler(logging.Handler):
    """Turns standard-library records into events of the same pipeline."""

    def emit(self, record: logging.LogRecord) -> None:
        pipeline = _pipeline
        if pipeline is None:
            return
        try:
            event: MutableMapping[str, Any] = {
                "timestamp": _iso(datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)),
                "level": record.levelname.lower(),
                "logger": record.name,
                "event": record.getMessage(),
            }
            for key, value in structlog.contextvars.get_contextvars().items():
                event.setdefault(key, value)
            if record.exc_info:
                event["exc_info"] = record.exc_info
            if record.stack_info:
                event["stack"] = record.stack_info
            pipeline.sink.submit(pipeline.render(dict(event)))
        except Exception:  # noqa: BLE001
            # logging's own contract: a broken record is reported, never raised at the caller.
            self.handleError(record)
