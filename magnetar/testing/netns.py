"""A separate network host for partition tests: a Linux network namespace joined to this
machine by three veth links that can be cut and healed one at a time.

This module owns creating and removing the namespace, its links and their addresses, cutting
and healing a link, and cleaning up what a crashed test left behind. It knows nothing of
Magnetar; :class:`magnetar.testing.LocalCluster` runs one broker inside an :class:`IsolatedHost`
(``isolated_brokers=1``).

The picture, for a host ``h``::

    this machine (host side)                     namespace h.name (inside)
    h.gateway("clients") ---- veth "clients" ---- h.address              (clients reach it here)
    h.gateway("etcd")    ---- veth "etcd"    ---- h.inside_address("etcd")
    h.gateway("bookies") ---- veth "bookies" ---- h.inside_address("bookies")

Each link is its own /30 from 10.231.0.0/16, avoiding networks already on the machine. A server
on this machine that listens on ``h.gateway(link)`` is reached from inside through that link
only; processes on this machine reach the same address by local delivery, whatever the state
of the link. ``await h.cut(link)`` sets the inside end down; ``await h.heal(link)`` brings it up
again. While a link is cut:

- a new connection from inside to that link's gateway fails at once (``ENETUNREACH``: the
  namespace has no route left) and one from this machine to the inside address fails at once
  (``EHOSTUNREACH``: the host keeps an ``unreachable`` route under the link's own, used while the
  link is down);
- an established TCP connection across the link neither fails nor delivers: its segments are
  dropped and retransmitted, so it stalls until the link heals (then resumes) or until the
  application's own timeout or keepalive gives up on it;
- the other links, and this machine's own access to every gateway address, are untouched.

Typical use::

    async with IsolatedHost() as host:
        server = await asyncio.start_server(handle, host.gateway("etcd"), 0)
        command = [*host.command_prefix, sys.executable, "-c", "..."]  # runs inside
        await host.cut("etcd")  # the process inside can no longer reach the server
        await host.heal("etcd")

Needs root and iproute2's ``ip``; :func:`netns_unsupported_reason` says whether this machine
can. A namespace is removed by :meth:`IsolatedHost.close`, when its object is garbage-collected,
at interpreter exit, and (if the test process was killed outright) by the next
:meth:`IsolatedHost.create` on this machine, which sweeps namespaces whose creator is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import ipaddress
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Self

__all__ = ["LINKS", "IsolatedHost", "netns_unsupported_reason"]

LINKS: tuple[str, ...] = ("clients", "etcd", "bookies")
"""The links of every :class:`IsolatedHost`, by name."""

NAME_PREFIX = "mgv-"
"""Every namespace this module creates is named ``mgv-<8 hex digits>``."""

_POOL = ipaddress.IPv4Network("10.231.0.0/16")
_LINK_PREFIX_LENGTH = 30
# The host's fallback route for a link's subnet, under the link's own (metric 0): taken only
# while the link is down, so connections to the inside fail instead of waiting.
_UNREACHABLE_METRIC = 4000
_STATE_DIR = Path("/run/magnetar-netns")
_IP_TIMEOUT_S = 30.0
_LINK_STATE_WAIT_S = 5.0
_POLL_INTERVAL_S = 0.01


def _ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS``; its stdout, or RuntimeError quoting its stderr when it fails."""
    try:
        result = subprocess.run(
            ["ip", *args], capture_output=True, text=True, check=False, timeout=_IP_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"`ip {' '.join(args)}` could not run: {error}") from error
    if check and result.returncode != 0:
        raise RuntimeError(
            f"`ip {' '.join(args)}` failed with exit code {result.returncode}: "
            f"{result.stderr.strip()}"
        )
    return result.stdout


@functools.cache
def netns_unsupported_reason() -> str | None:
    """None when this machine can run :class:`IsolatedHost` (Linux, root, ``ip``, and a probe
    namespace with a veth pair can be created and removed), else why not, for a skip message.

    The probe runs once per process.
    """
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return f"creating network namespaces needs root; this process runs as uid {os.geteuid()}"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not on PATH"
    token = secrets.token_hex(4)
    name = f"{NAME_PREFIX}{token}"
    try:
        _ip("netns", "add", name)
        try:
            _ip("link", "add", f"mgv{token}-p", "type", "veth", "peer", "name", "probe",
                "netns", name)  # fmt: skip
            _ip("link", "del", f"mgv{token}-p")
        finally:
            _ip("netns", "del", name, check=False)
    except RuntimeError as error:
        return f"cannot create a network namespace with a veth pair here: {error}"
    return None


# -- bookkeeping shared by every process on this machine --------------------------------------


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """Serialises address picking and sweeping among all processes of this machine."""
    _STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (_STATE_DIR / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def _owner_alive(record: dict[str, object]) -> bool:
    pid = record.get("pid")
    if not isinstance(pid, int):
        return False
    start = _process_start_ticks(pid)
    return start is not None and start == record.get("start_ticks")


def _destroy(name: str, host_devices: Sequence[str], subnets: Sequence[str]) -> None:
    """Remove a namespace, its links and the host's routes for them; whatever is left of it.

    Quiet: this runs from finalizers and sweeps, where there is nobody to tell.
    """
    for subnet in subnets:
        _ip("route", "del", "unreachable", subnet, "metric", str(_UNREACHABLE_METRIC),
            check=False)  # fmt: skip
    for device in host_devices:
        # deleting one end of a veth pair deletes both
        _ip("link", "del", device, check=False)
    _ip("netns", "del", name, check=False)
    with contextlib.suppress(OSError):
        (_STATE_DIR / name).unlink()


def _sweep_stale() -> None:
    """Destroy the namespaces whose creating process is gone (a test killed outright)."""
    with contextlib.suppress(OSError):
        for path in _STATE_DIR.iterdir():
            if not path.name.startswith(NAME_PREFIX):
                continue
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and not _owner_alive(record):
                _destroy(
                    path.name,
                    [str(d) for d in record.get("host_devices", [])],
                    [str(s) for s in record.get("subnets", [])],
                )


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network on this machine's interfaces, and every non-default route."""
    found: list[ipaddress.IPv4Network] = []
    for line in _ip("-o", "-4", "addr", "show").splitlines():
        words = line.split()
        if "inet" in words:
            found.append(ipaddress.IPv4Interface(words[words.index("inet") + 1]).network)
    for line in _ip("-4", "route", "show").splitlines():
        words = line.split()
        candidates = [w for w in words[:2] if w[:1].isdigit()]
        if candidates and candidates[0] != "0.0.0.0/0":
            with contextlib.suppress(ValueError):
                found.append(ipaddress.IPv4Network(candidates[0], strict=False))
    return found


def _pick_subnets(count: int) -> list[ipaddress.IPv4Network]:
    taken = [net for net in _networks_in_use() if net.overlaps(_POOL)]
    rng = random.SystemRandom()
    size = 2 ** (_POOL.max_prefixlen - _LINK_PREFIX_LENGTH)
    slots = _POOL.num_addresses // size
    picked: list[ipaddress.IPv4Network] = []
    for _ in range(slots):
        start = _POOL.network_address + rng.randrange(slots) * size
        candidate = ipaddress.IPv4Network(f"{start}/{_LINK_PREFIX_LENGTH}")
        if any(candidate.overlaps(net) for net in (*taken, *picked)):
            continue
        picked.append(candidate)
        if len(picked) == count:
            return picked
    raise RuntimeError(f"no {count} free /{_LINK_PREFIX_LENGTH} subnets left in {_POOL}")


def _carrier(device: str) -> bool | None:
    """Whether this machine's ``device`` has a carrier (its veth peer is up); None if gone."""
    try:
        return Path(f"/sys/class/net/{device}/carrier").read_text().strip() == "1"
    except OSError:
        return None


def _set_sysctl(path: str, value: str) -> None:
    Path("/proc/sys", path).write_text(value)


class IsolatedHost:
    """A network namespace joined to this machine by the links :data:`LINKS`.

    Nothing exists until :meth:`create` (or ``async with``); :meth:`close` removes it all.
    """

    def __init__(self) -> None:
        token = secrets.token_hex(4)
        self._name = f"{NAME_PREFIX}{token}"
        # the host ends live in this machine's namespace, so their names must be unique here
        # (and at most 15 characters); the inside ends are simply named after the link
        self._host_devices = {link: f"mgv{token}-{link[0]}" for link in LINKS}
        self._subnets: dict[str, ipaddress.IPv4Network] = {}
        self._cut: set[str] = set()
        self._state = "new"
        self._finalizer: weakref.finalize[..., IsolatedHost] | None = None

    def __repr__(self) -> str:
        links = ", ".join(
            f"{link}={self._subnets[link]}{' (cut)' if link in self._cut else ''}"
            for link in self._subnets
        )
        return f"IsolatedHost(name={self._name!r}, {self._state}{', ' if links else ''}{links})"

    # -- addresses ---------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The namespace's name (``ip netns`` lists it)."""
        return self._name

    @property
    def is_created(self) -> bool:
        """True from :meth:`create` until :meth:`close`."""
        return self._state == "created"

    @property
    def address(self) -> str:
        """The inside address of the "clients" link: what a server inside advertises."""
        return self.inside_address("clients")

    def gateway(self, link: str) -> str:
        """This machine's address on ``link``: servers for the inside listen here."""
        return str(self._subnet(link)[1])

    def inside_address(self, link: str) -> str:
        """The namespace's own address on ``link``."""
        return str(self._subnet(link)[2])

    def subnet(self, link: str) -> str:
        """The ``a.b.c.d/30`` of ``link``."""
        return str(self._subnet(link))

    @property
    def command_prefix(self) -> list[str]:
        """Prepend to a command to run it inside: ``["ip", "netns", "exec", name]``.

        ``ip netns exec`` execs the command, so the process id is the command's own.
        """
        return ["ip", "netns", "exec", self._name]

    # -- lifecycle ---------------------------------------------------------------------------

    async def create(self) -> None:
        """Create the namespace, its loopback (up) and its three links (up).

        RuntimeError if this machine cannot (see :func:`netns_unsupported_reason`), or if this
        object was created before.
        """
        if self._state != "new":
            raise RuntimeError(f"{self!r} was created before; make a new IsolatedHost")
        reason = netns_unsupported_reason()
        if reason is not None:
            raise RuntimeError(f"cannot create an isolated host: {reason}")
        self._state = "creating"
        try:
            await asyncio.to_thread(self._create)
        except BaseException:
            self._state = "closed"
            raise
        self._state = "created"

    async def close(self) -> None:
        """Remove the namespace, its links and the host's routes for them. Idempotent.

        A process still running inside loses its links (it is not killed).
        """
        if self._finalizer is not None and self._finalizer.alive:
            await asyncio.to_thread(self._finalizer)
        self._state = "closed"
        self._cut.clear()

    async def __aenter__(self) -> Self:
        await self.create()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- faults ------------------------------------------------------------------------------

    async def cut(self, link: str) -> None:
        """Set the inside end of ``link`` down; returns once this machine sees it down."""
        self._require_created(link)
        await asyncio.to_thread(self._cut_link, link)
        self._cut.add(link)

    async def heal(self, link: str) -> None:
        """Bring ``link`` up again, with its address and route; returns once it carries."""
        self._require_created(link)
        await asyncio.to_thread(self._heal_link, link)
        self._cut.discard(link)

    def is_cut(self, link: str) -> bool:
        """Whether ``link`` is cut now (by :meth:`cut`, not yet healed)."""
        self._check_link(link)
        return link in self._cut

    # -- internals ---------------------------------------------------------------------------

    def _check_link(self, link: str) -> None:
        if link not in LINKS:
            raise ValueError(f"unknown link {link!r}: the links are {', '.join(LINKS)}")

    def _subnet(self, link: str) -> ipaddress.IPv4Network:
        self._check_link(link)
        subnet = self._subnets.get(link)
        if subnet is None:
            raise RuntimeError(f"{self!r} has no addresses until it is created")
        return subnet

    def _require_created(self, link: str) -> None:
        self._check_link(link)
        if self._state != "created":
            raise RuntimeError(f"{self!r} is not created (or already closed)")

    def _create(self) -> None:
        with _machine_lock():
            _sweep_stale()
            subnets = _pick_subnets(len(LINKS))
            self._subnets = dict(zip(LINKS, subnets, strict=True))
            host_devices = list(self._host_devices.values())
            subnet_texts = [str(s) for s in subnets]
            # the record and the finalizer come first, so that a failure half-way (or a crash)
            # still has everything removed
            start_ticks = _process_start_ticks(os.getpid())
            (_STATE_DIR / self._name).write_text(
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "start_ticks": start_ticks,
                        "host_devices": host_devices,
                        "subnets": subnet_texts,
                    }
                )
            )
            self._finalizer = weakref.finalize(
                self, _destroy, self._name, host_devices, subnet_texts
            )
            try:
                self._build()
            except BaseException:
                self._finalizer()
                raise

    def _build(self) -> None:
        name = self._name
        _ip("netns", "add", name)
        _ip("-n", name, "link", "set", "lo", "up")
        for link in LINKS:
            device = self._host_devices[link]
            subnet = self._subnets[link]
            _ip("link", "add", device, "type", "veth", "peer", "name", link, "netns", name)
            _ip("addr", "add", f"{self.gateway(link)}/{_LINK_PREFIX_LENGTH}", "dev", device)
            # while the link is down, take the unreachable route below instead of queueing
            # packets for a peer that is not there
            _set_sysctl(f"net/ipv4/conf/{device}/ignore_routes_with_linkdown", "1")
            _ip("route", "add", "unreachable", str(subnet), "metric", str(_UNREACHABLE_METRIC))
            _ip("link", "set", device, "up")
            _ip("-n", name, "addr", "add",
                f"{self.inside_address(link)}/{_LINK_PREFIX_LENGTH}", "dev", link)  # fmt: skip
            _ip("-n", name, "link", "set", link, "up")
        for link in LINKS:
            self._wait_carrier(link, up=True)

    def _cut_link(self, link: str) -> None:
        _ip("-n", self._name, "link", "set", link, "down")
        self._wait_carrier(link, up=False)

    def _heal_link(self, link: str) -> None:
        name = self._name
        _ip("-n", name, "link", "set", link, "up")
        # IPv4 addresses survive a link going down, but put back anything that went missing
        inside = f"{self.inside_address(link)}/{_LINK_PREFIX_LENGTH}"
        if inside not in _ip("-n", name, "-o", "-4", "addr", "show", "dev", link):
            _ip("-n", name, "addr", "add", inside, "dev", link)
        if str(self._subnets[link]) not in _ip("-n", name, "-4", "route", "show", "dev", link):
            _ip("-n", name, "route", "add", str(self._subnets[link]), "dev", link,
                "src", self.inside_address(link))  # fmt: skip
        self._wait_carrier(link, up=True)

    def _wait_carrier(self, link: str, *, up: bool) -> None:
        """Wait until this machine's end of ``link`` has (or has lost) its carrier: from then
        on the host's routing treats the link as up (or down)."""
        device = self._host_devices[link]
        deadline = time.monotonic() + _LINK_STATE_WAIT_S
        while (carrier := _carrier(device)) != up:
            if carrier is None or time.monotonic() >= deadline:
                state = "gone" if carrier is None else ("down" if up else "up")
                raise RuntimeError(
                    f"{self._name}: link {link} ({device}) is still {state} after "
                    f"{_LINK_STATE_WAIT_S}s"
                )
            time.sleep(_POLL_INTERVAL_S)
