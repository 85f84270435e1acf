"""A verify run's report: ``report.json``, ``timeline.png``, ``availability.png`` and
``summary.md`` in one directory.

The JSON holds the configuration, the seed, the schedule, every fault with its times, the
checker's verdict (counts, samples, unavailability windows, and under ``availability`` every
outage and recovery time) and the per-second throughput. ``timeline.png`` plots acknowledged
sends and deliveries per second with every fault shaded and labelled; ``availability.png``
each partition's outages against the faults, and each fault's recovery times by kind.
The summary is one page of markdown for humans (and for ``bench/results/``). A secure run's
report also says what was secured, when the certificates and the token key were rotated (a
line on the timeline), how soon each server presented its new certificate, and what the
servers logged about tokens and certificates.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from magnetar.verify.availability import Availability, Distribution
from magnetar.verify.checker import Verdict
from magnetar.verify.history import History

_COLORS = {
    "kill-bookie": "#d62728",
    "pause-bookie": "#ff9896",
    "kill-broker": "#1f77b4",
    "pause-broker": "#aec7e8",
    "kill-etcd": "#9467bd",
    "fill-disk": "#8c564b",
    "cut-broker-etcd": "#2ca02c",
    "cut-broker-bookies": "#98df8a",
}


def throughput(history: History) -> dict[str, list[int]]:
    """Per whole second since the start: acknowledged sends, and deliveries (all
    subscriptions)."""
    acked = Counter(
        int(s.answered_at)
        for s in history.sends
        if s.outcome == "acked" and s.answered_at is not None
    )
    delivered = Counter(int(d.at) for d in history.deliveries)
    last = max([*acked, *delivered, 0])
    return {
        "acked_per_s": [acked.get(t, 0) for t in range(last + 1)],
        "delivered_per_s": [delivered.get(t, 0) for t in range(last + 1)],
    }


def report_body(history: History, verdict: Verdict, schedule: list[str]) -> dict[str, Any]:
    return {
        "seed": history.seed,
        "config": history.config,
        "phases": history.phases,
        "security": history.security,
        "schedule": schedule,
        "summary": verdict.summary(),
        "verdict": verdict.to_json(),
        "faults": [
            {
                "index": f.index,
                "kind": f.kind,
                "target": f.target,
                "started_at": f.started_at,
                "ended_at": f.ended_at,
                "error": f.error,
            }
            for f in history.faults
        ],
        "throughput": throughput(history),
        "stalls": history.stalls,
    }


def write_report(
    out_dir: Path, history: History, verdict: Verdict, schedule: list[str]
) -> dict[str, Path]:
    """Write the three files; their paths by name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    body = report_body(history, verdict, schedule)
    paths = {
        "json": out_dir / "report.json",
        "png": out_dir / "timeline.png",
        "availability_png": out_dir / "availability.png",
        "summary": out_dir / "summary.md",
    }
    paths["json"].write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    plot_timeline(paths["png"], history, body["throughput"])
    if verdict.availability is not None:
        plot_availability(paths["availability_png"], history, verdict.availability)
    else:
        del paths["availability_png"]
    paths["summary"].write_text(summary_markdown(history, verdict))
    return paths


def plot_timeline(path: Path, history: History, series: dict[str, list[int]]) -> None:
    """Throughput over time with each fault shaded in its kind's colour."""
    import matplotlib  # noqa: PLC0415 - a heavy import, needed only here

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    figure, axis = plt.subplots(figsize=(14, 6), dpi=100)
    seconds = list(range(len(series["acked_per_s"])))
    axis.plot(seconds, series["acked_per_s"], label="sends acknowledged/s", color="black", lw=1)
    axis.plot(
        seconds, series["delivered_per_s"], label="deliveries/s (all subscriptions)", lw=0.8,
        color="#7f7f7f", alpha=0.8,
    )  # fmt: skip
    top = max([*series["acked_per_s"], *series["delivered_per_s"], 1])
    seen_kinds: list[str] = []
    for fault in history.faults:
        if fault.started_at is None:
            continue
        end = fault.ended_at if fault.ended_at is not None else fault.started_at + 1
        color = _COLORS.get(fault.kind, "#bcbd22")
        axis.axvspan(fault.started_at, end, color=color, alpha=0.25, lw=0)
        axis.text(
            fault.started_at, top * 1.02, str(fault.index), fontsize=6, rotation=90, va="bottom"
        )
        if fault.kind not in seen_kinds:
            seen_kinds.append(fault.kind)
    for name, at in history.phases.items():
        if name in ("nemesis", "healed", "producers_stopped"):
            axis.axvline(at, color="#444444", ls=":", lw=0.8)
            axis.text(at, 0, f" {name}", fontsize=7, rotation=90, va="bottom", color="#444444")
        if name == "rotation":
            label = "certificates and token key rotated"
            axis.axvline(at, color="#e377c2", ls="--", lw=1.5, label=label)
            axis.text(at, 0, " rotation", fontsize=7, rotation=90, va="bottom", color="#e377c2")
    handles, _ = axis.get_legend_handles_labels()
    handles += [Patch(color=_COLORS.get(k, "#bcbd22"), alpha=0.4, label=k) for k in seen_kinds]
    axis.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=7, ncol=5
    )
    axis.set_xlabel("seconds since start")
    axis.set_ylabel("messages per second")
    axis.set_ylim(0, top * 1.15)
    injected = sum(1 for f in history.faults if f.started_at is not None)
    secure = " (secure)" if history.security.get("secure") else ""
    axis.set_title(f"magnetar verify{secure}, seed {history.seed}: {injected} faults")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def plot_availability(path: Path, history: History, availability: Availability) -> None:
    """Above: each partition's outages (late ones in red) over the faults, shaded by kind.
    Below: every (fault, partition out) pair's time to its first acknowledged send after the
    fault healed, by kind, and every outage's lateness, with the recovery bound."""
    import matplotlib  # noqa: PLC0415 - a heavy import, needed only here

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    figure, (timeline, recovery) = plt.subplots(
        2, 1, figsize=(14, 8), dpi=100, gridspec_kw={"height_ratios": [3, 2]}
    )
    partitions = sorted(
        {s.partition for s in history.sends if s.outcome == "acked"}
        | {o.partition for o in availability.outages}
    )
    row = {p: i for i, p in enumerate(partitions)}
    kinds: list[str] = []
    for index, fault in availability.faults.items():
        start = fault.started_at or 0.0
        end = availability.heals[index]
        end = end if math.isfinite(end) else start + 1
        timeline.axvspan(start, end, color=_COLORS.get(fault.kind, "#bcbd22"), alpha=0.25, lw=0)
        timeline.text(start, len(partitions) - 0.45, str(index), fontsize=6, rotation=90)
        if fault.kind not in kinds:
            kinds.append(fault.kind)
    late = set(map(id, availability.late))
    for outage in availability.outages:
        color = "#d62728" if id(outage) in late else "#333333"
        timeline.barh(
            row[outage.partition], outage.duration_s, left=outage.start, height=0.5,
            color=color, hatch=None if outage.recovered else "//",
        )  # fmt: skip
    for name in ("nemesis", "healed", "producers_stopped"):
        if name in history.phases:
            timeline.axvline(history.phases[name], color="#444444", ls=":", lw=0.8)
    timeline.set_yticks(range(len(partitions)), [f"partition {p}" for p in partitions])
    timeline.set_ylim(-0.6, len(partitions) - 0.1)
    timeline.set_xlabel("seconds since start")
    handles = [
        Patch(color="#333333", label=f"outage (> {availability.gap_s:g} s without an ack)"),
        Patch(color="#d62728", label=f"late: out > {availability.bound_s:g} s with no fault"),
        *(Patch(color=_COLORS.get(k, "#bcbd22"), alpha=0.4, label=k) for k in kinds),
    ]
    timeline.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=7, ncol=5
    )
    timeline.set_title(
        f"magnetar verify, seed {history.seed}: {len(availability.outages)} outages,"
        f" {len(availability.late)} late (recovery bound {availability.bound_s:g} s)"
    )
    # one column per fault kind (each partition's first ack after the fault healed), and a
    # last one with every outage's lateness: what the bound judges
    by_kind = sorted({availability.faults[r.fault].kind for r in availability.recoveries})
    columns: list[tuple[str, str, list[float | None]]] = [
        (
            kind,
            _COLORS.get(kind, "#bcbd22"),
            [
                r.after_heal_s
                for r in availability.recoveries
                if availability.faults[r.fault].kind == kind
            ],
        )
        for kind in by_kind
    ]
    columns.append(
        ("lateness\n(per outage)", "#000000", [o.lateness_s for o in availability.outages])
    )
    finite = [v for _, _, values in columns for v in values if v is not None and v < math.inf]
    top = max([availability.bound_s * 1.5, *finite]) * 1.1
    for x, (_, color, values) in enumerate(columns):
        recovery.scatter(
            [x] * len(values),
            [top if v is None or v == math.inf else v for v in values],
            color=color,
            marker="o",
            s=14,
            zorder=3,
        )
    recovery.axhline(
        availability.bound_s,
        color="#d62728",
        ls="--",
        lw=1,
        label="recovery bound (judges each outage's lateness)",
    )
    recovery.set_xticks(range(len(columns)), [name for name, _, _ in columns], fontsize=7)
    recovery.set_xlim(-0.5, len(columns) - 0.5)
    recovery.set_ylim(0, top * 1.05)
    recovery.set_ylabel("seconds (top edge: never)")
    recovery.set_title(
        "by fault kind: each partition's first acknowledged send after the fault healed (later"
        " faults may prolong it); last: each outage's longest stretch with no fault active",
        fontsize=9,
    )
    recovery.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _seconds(value: float) -> str:
    return "never" if math.isinf(value) else "-" if math.isnan(value) else f"{value:.2f}"


def _distribution_cells(dist: Distribution) -> str:
    return f"{_seconds(dist.p50)} / {_seconds(dist.p99)} / {_seconds(dist.max)}"


def _recovery_lines(verdict: Verdict) -> list[str]:
    """The summary's section on availability: recovery times by fault kind, late outages."""
    availability = verdict.availability
    if availability is None:
        return []
    late = availability.late
    lines = [
        "## Recovery",
        "",
        (
            f"{len(availability.outages)} outages (more than {availability.gap_s:g} s without an"
            " acknowledged send on a partition while the workload sent to it);"
            f" {len(late)} late: out more than the {availability.bound_s:g} s recovery bound"
            " with no fault active that could explain it. Per fault kind, over each partition"
            " in an outage the fault could explain, the time to its first acknowledged send"
            " after the fault began and after it healed (docs/verify.md, Availability;"
            " plot: `availability.png`):"
        ),
        "",
        (
            "| fault kind | partitions out | after start p50 / p99 / max (s) |"
            " after heal p50 / p99 / max (s) |"
        ),
        "|---|---:|---:|---:|",
    ]
    rows = [*availability.by_kind().items(), ("all", availability.overall())]
    lines.extend(
        f"| {kind} | {d['after_start'].count} | {_distribution_cells(d['after_start'])} |"
        f" {_distribution_cells(d['after_heal'])} |"
        for kind, d in rows
    )
    longest = max(availability.outages, key=lambda o: o.lateness_s, default=None)
    lines.append("")
    if longest is not None:
        lines += [
            (
                "Out with no fault active that could explain it (lateness, judged against the"
                f" bound), over the {len(availability.outages)} outages: p50 / p99 / max"
                f" {_distribution_cells(availability.lateness())} s; the longest on partition"
                f" {longest.partition}, {longest.late_from:.1f}-{longest.late_to:.1f} s."
            ),
            "",
        ]
    if late:
        lines += ["Late recoveries:", "", *(f"- {line}" for line in verdict.late_recoveries), ""]
    return lines


def _cluster_lines(config: dict[str, Any]) -> list[str]:
    quorums = (
        f"E{config.get('ensemble')}/Qw{config.get('write_quorum')}/Qa{config.get('ack_quorum')}"
    )
    isolated = " (one in its own network namespace)" if config.get("isolated_broker") else ""
    unsupported = ", ".join(f"{k} ({r})" for k, r in config.get("unsupported", {}).items())
    dedup = "on" if config.get("dedup", True) else "off"
    return [
        (
            f"- {config.get('etcd_members')} etcd members, {config.get('bookies')} bookies"
            f" ({quorums}), {config.get('brokers')} brokers{isolated}"
        ),
        (
            f"- {config.get('partitions')} partitions, {config.get('producers')} producers,"
            f" {config.get('keys')} keys, {config.get('rate')} msg/s of"
            f" {config.get('message_size')}"
            f" B, deduplication {dedup}"
        ),
        f"- subscriptions: {', '.join(config.get('subscriptions', []))}",
        f"- nemesis {config.get('duration_s')} s; not injectable here: {unsupported or 'none'}",
        "- secure: "
        + ("yes: TLS and authentication on every hop (below)" if config.get("secure") else "no"),
    ]


def _security_lines(history: History) -> list[str]:
    """The summary's section on a secure run: the hops, the rotation and what followed."""
    security = history.security
    if not security.get("secure"):
        return []
    lines = ["## Security", "", *(f"- {hop}" for hop in security.get("hops", [])), ""]
    rotation = security.get("rotation")
    if rotation is None:
        lines += ["**The certificates were not rotated.**", ""]
    else:
        presented: dict[str, float | None] = rotation.get("presented_new_after_s", {})
        took = [t for t in presented.values() if t is not None]
        late = sorted(label for label, t in presented.items() if t is None)
        active = ", ".join(rotation.get("faults_active", [])) or "none"
        during = rotation.get("faults_started_while_waiting", [])
        # "#4 kill-broker:broker-1": down at the time, back later from the nemesis' heal
        down = [
            a.split(":", 1)[1] + " (killed then)"
            for a in rotation.get("faults_active", [])
            if a.split(" ", 1)[-1].startswith("kill-")
        ]
        lines += [
            (
                f"**Rotation** at {rotation['at']:.1f} s ({rotation['into_nemesis_s']:.1f} s into"
                f" the nemesis; faults active then: {active}): {len(rotation['certificates'])}"
                " certificates re-issued in place from the same CA with new keys"
                f" ({', '.join(rotation['certificates'])}), and token signing key"
                f" {rotation['token_key_generation']} added to the brokers' key bundle; tokens"
                f" signed with it from {rotation['signing_with_new_key_at']:.1f} s."
            ),
            "",
            (
                f"{len(took)} of {len(presented)} TLS listeners presented their new certificate"
                f" within {max(took, default=0.0):.1f} s of the rotation (median"
                f" {sorted(took)[len(took) // 2] if took else 0.0:.1f} s)"
                + (f"; not within the wait: {', '.join(late)}" if late else "")
                + ". No process was restarted for it: each took its new files at its next"
                " connection"
                + (f"; {', '.join(down)} came back on them" if down else "")
                + (f" (faults begun while waiting for them: {', '.join(during)})" if during else "")
                + "."
            ),
            "",
        ]
    final: dict[str, bool] = security.get("final_certificates", {})
    if final:
        stale = sorted(label for label, ok in final.items() if not ok)
        lines += [
            (
                f"At the end, {len(final) - len(stale)} of {len(final)} TLS listeners presented"
                " the rotated certificate" + (f"; not: {', '.join(stale)}." if stale else ".")
            ),
            "",
        ]
    by_key = ", ".join(
        f"{count} signed with key {key}"
        for key, count in sorted(security.get("tokens_by_key", {}).items())
    )
    brokers: dict[str, int] = security.get("broker_log_events", {})
    bookies: dict[str, int] = security.get("bookie_log_events", {})
    lines += [
        (
            f"Tokens: {security.get('tokens_issued', 0)} handed out by the workload's supplier"
            f" ({by_key or 'by key: not recorded'}), each valid {security.get('token_expiry_s')}"
            " s; open streams refreshed in band"
            f" {brokers.get('stream_credentials_refreshed', 0)} times (challenged"
            f" {brokers.get('stream_credentials_expired', 0)} times)."
        ),
        "",
        "| logged by | " + " | ".join(sorted({*brokers, *bookies})) + " |",
        "|---|" + "---:|" * len({*brokers, *bookies}),
        "| brokers | "
        + " | ".join(str(brokers.get(k, "-")) for k in sorted({*brokers, *bookies}))
        + " |",
        "| bookies | "
        + " | ".join(str(bookies.get(k, "-")) for k in sorted({*brokers, *bookies}))
        + " |",
        "",
    ]
    return lines


_RESULT_ROWS = (
    "attempted", "acked", "failed", "stored", "lost", "misplaced", "phantoms", "duplicates",
    "reordered", "redeliveries", "redelivered_after_ack", "unexplained_redeliveries_after_ack",
    "faults", "failed_faults", "late_recoveries", "unexpected_exits",
)  # fmt: skip


def _position_text(position: dict[str, Any] | None) -> str:
    if not position:
        return "-"
    return f"({position.get('ledger_id')},{position.get('entry_id')})"


def _stall_lines(history: History) -> list[str]:
    """The drain ran out of time: what each lagging subscription held, broker and client."""
    if not history.stalls:
        return []
    lines = [
        "## Stalled at the drain",
        "",
        (
            "Subscriptions not given every acknowledged message when the drain ran out of time, per"
            " partition: the broker's consumers (permits, unacknowledged messages, blocked) and the"
            " client's streams (connected, messages queued, permits not yet given back). Everything"
            " is in `report.json` (`stalls`)."
        ),
        "",
        "| subscription | partition | missing | broker consumers | client streams |",
        "|---|---:|---:|---|---|",
    ]
    for stall in history.stalls:
        broker = stall.get("broker")
        if isinstance(broker, dict):
            consumers = "; ".join(
                f"{c.get('consumer_name', '?')}: permits {c.get('available_permits', 0)},"
                f" unacked {c.get('unacked_messages', 0)}"
                + (", blocked" if c.get("blocked") else "")
                for c in broker.get("consumers", [])
            )
            cursor = broker.get("cursor") or {}
            broker_cell = (
                f"on {broker.get('owner')}: backlog {broker.get('backlog_messages', 0)}"
                + (
                    f", mark-delete {_position_text(cursor.get('mark_delete'))},"
                    f" read {_position_text(cursor.get('read_position'))}"
                    if cursor
                    else ""
                )
                + (", blocked" if broker.get("blocked") else "")
                + f"; {consumers or 'no consumer'}"
            )
        else:
            broker_cell = str(broker)
        clients = "; ".join(
            f"{name}: "
            + (
                "no stream"
                if state is None
                else f"{'connected' if state['connected'] else 'not connected'}"
                f" to {state['broker']}, {state['streams']} streams, queued {state['queued']},"
                f" permits to give back {state['permits_to_give_back']}"
                + (f", failed {state['failed']}" if state["failed"] else "")
            )
            for name, state in stall.get("clients", {}).items()
        )
        lines.append(
            f"| {stall['subscription']} | {stall['partition']} | {stall['missing']} |"
            f" {broker_cell} | {clients or '-'} |"
        )
    lines.append("")
    return lines


def summary_markdown(history: History, verdict: Verdict) -> str:
    """The one-page summary."""
    config = history.config
    verdict_line = "**PASSED**" if verdict.ok else "**FAILED**: " + "; ".join(verdict.problems())
    replay = config.get("command", f"magnetar verify --seed {history.seed}")
    summary = verdict.summary()
    lines = [
        f"# magnetar verify, seed {history.seed}",
        "",
        verdict_line,
        "",
        f"Replay: `{replay}`",
        "",
        "## Cluster and workload",
        "",
        *_cluster_lines(config),
        "",
        "## Results",
        "",
        "| check | count |",
        "|---|---:|",
        *(f"| {name} | {summary[name]} |" for name in _RESULT_ROWS),
        *([f"| security_problems | {summary['security_problems']} |"] if verdict.secure else []),
        "",
        "Delivered per subscription: "
        + ", ".join(f"{k} {v}" for k, v in verdict.delivered.items()),
        "",
        "Redeliveries after a confirmed ack, explained by: "
        + (", ".join(f"{k} {v}" for k, v in sorted(verdict.explained_by.items())) or "none"),
        "",
        "Faults by kind: " + ", ".join(f"{k} x{v}" for k, v in verdict.fault_kinds.items()),
        "",
        "## Unavailability",
        "",
        (
            f"{len(verdict.windows)} windows over 1 s without an acknowledged send on a partition;"
            f" longest {verdict.longest_window_s:.2f} s."
        ),
        "",
    ]
    if verdict.windows:
        lines += [
            "| partition | from (s) | to (s) | length (s) | faults active |",
            "|---|---:|---:|---:|---|",
        ]
        lines.extend(
            f"| {w.partition} | {w.start:.1f} | {w.end:.1f} | {w.duration_s:.2f} |"
            f" {', '.join(w.faults) or '-'} |"
            for w in sorted(verdict.windows, key=lambda w: -w.duration_s)[:12]
        )
        lines.append("")
    durations = [
        f.ended_at - f.started_at
        for f in history.faults
        if f.started_at is not None and f.ended_at is not None
    ]
    mean = sum(durations) / len(durations) if durations else math.nan
    errors = sum(1 for f in history.faults if f.error)
    lines += _recovery_lines(verdict)
    lines += [
        "## Faults",
        "",
        (
            f"{len(durations)} injected, {errors} with an error; mean length {mean:.1f} s."
            " Timeline: `timeline.png`; outages: `availability.png`; every fault with its"
            " times: `report.json`."
        ),
        "",
    ]
    lines += _security_lines(history)
    lines += _stall_lines(history)
    if verdict.samples:
        lines += ["## Samples", ""]
        for rule, examples in verdict.samples.items():
            lines.extend(f"- {rule}: {example}" for example in examples[:5])
        lines.append("")
    return "\n".join(lines)
