"""Prometheus metrics of the relay (text format at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RelayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.messages = Counter(
            "svc_relay_messages_total", "Messages stored and relayed", ["kind"], registry=r
        )
        # The hot path's child, looked up once.
        self.application_messages = self.messages.labels("application")
        self.bytes = Counter("svc_relay_message_bytes_total", "Bytes stored", registry=r)
        self.deliveries = Counter(
            "svc_relay_deliveries_total", "Messages written to subscriber streams", registry=r
        )
        self.streams = Gauge("svc_relay_connected_streams", "Open agent streams", registry=r)
        self.streams_ended = Counter(
            "svc_relay_streams_ended_total",
            "Streams the relay ended, by status",
            ["code"],
            registry=r,
        )
        self.commit_rejections = Counter(
            "svc_relay_commit_rejections_total", "Commits for a stale epoch", registry=r
        )
        self.handshake_rejections = Counter(
            "svc_relay_handshake_rejections_total",
            "Commits and proposals refused by group validation, by reason",
            ["reason"],
            registry=r,
        )
        self.tracked_groups = Gauge(
            "svc_relay_tracked_groups", "Tracked MLS groups held in memory", registry=r
        )
        self.tracked_group_bytes = Gauge(
            "svc_relay_tracked_group_bytes",
            "Size of the tracked groups held in memory (their snapshots)",
            registry=r,
        )
        self.lagged = Gauge(
            "svc_relay_lagged_total", "Subscribers told to resume from their cursor", registry=r
        )
        self.buffered_bytes = Gauge(
            "svc_relay_buffered_bytes",
            "Bytes of deliveries queued for all streams (bounded by relay_buffer_bytes)",
            registry=r,
        )
        self.delivery_latency = Histogram(
            "svc_relay_delivery_latency_seconds",
            "From storing a message to writing it to a subscriber's stream",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 5.0),
            registry=r,
        )
