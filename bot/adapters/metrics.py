"""The bot's Prometheus metrics (prometheus_client), in a registry of each runtime's own.

Counted where it happens: commands by name and result (the audit writer, which sees every command's result),
probes by host and result with their latency, alerts by verdict. Read when scraped: outbox depth and the age of its
oldest row, leader or follower, watched launches, the Slack connection (`Metrics.refresh`). Names follow
Prometheus' conventions: a `gpubot_` prefix, `_total` counters, `_seconds` units.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

#: The Content-Type of `Metrics.exposition()` (Prometheus' text format 0.0.4).
CONTENT_TYPE = CONTENT_TYPE_LATEST
#: Probe latency buckets (seconds): a loopback probe takes milliseconds, a slow host seconds, a timeout tens.
PROBE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """One runtime's metrics. The `count_*`/`observe_*` methods cost about a microsecond (a labelled counter's
    increment); the gauges are set by `refresh` just before a scrape is answered."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.commands = Counter("gpubot_commands", "Commands answered, by command and result (ok, refused, "
                                "denied, error, ...).", ["command", "result"], registry=r)
        self.probes = Histogram("gpubot_probe_seconds", "Probe latency per host (seconds), by result.",
                                ["host", "result"], buckets=PROBE_BUCKETS, registry=r)
        self.alerts = Counter("gpubot_alerts", "Alerts posted, by verdict.", ["verdict"], registry=r)
        self.outbox_depth = Gauge("gpubot_outbox_depth", "Messages queued for Slack and not yet sent.", registry=r)
        self.outbox_oldest = Gauge("gpubot_outbox_oldest_age_seconds", "Age of the oldest message queued for Slack "
                                   "(0 when none is queued).", registry=r)
        self.leader = Gauge("gpubot_leader", "1 while this bot leads (sends the outbox, runs the checks), 0 while it "
                            "follows.", registry=r)
        self.watched = Gauge("gpubot_watched_launches", "Launches whose readiness checks run on this bot.",
                             registry=r)
        self.slack_connected = Gauge("gpubot_slack_connected", "1 while the connection to Slack is up.", registry=r)
        self.database_up = Gauge("gpubot_database_up", "1 when the database answered the last health check.",
                                 registry=r)

    def count_command(self, command: str, result: str) -> None:
        """One command answered (`command` its table name, `result` the audit's result word)."""
        self.commands.labels(command, result).inc()

    def observe_probe(self, host: str, seconds: float, ok: bool) -> None:
        """One probe of `host` that took `seconds` (wall), ending in a snapshot (`ok`) or a host failure."""
        self.probes.labels(host, "ok" if ok else "failed").observe(seconds)

    def count_alert(self, verdict: str) -> None:
        """One alert posted for `verdict` (e.g. `hang`, `crashed`, `oom`, `ready`)."""
        self.alerts.labels(verdict).inc()

    def refresh(self, *, outbox: tuple[int, float] | None, leader: bool, watched: int, slack: bool | None,
                database: bool) -> None:
        """Set the gauges read at a scrape: `outbox` (rows queued, age of the oldest in seconds; None without an
        outbox), whether this bot leads, how many launches it watches, the Slack connection (None: not known, left
        out) and whether the database answered."""
        depth, oldest = outbox or (0, 0.0)
        self.outbox_depth.set(depth)
        self.outbox_oldest.set(oldest)
        self.leader.set(1 if leader else 0)
        self.watched.set(watched)
        if slack is not None:
            self.slack_connected.set(1 if slack else 0)
        self.database_up.set(1 if database else 0)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (CONTENT_TYPE)."""
        return generate_latest(self.registry)
