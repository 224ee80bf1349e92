"""Prometheus metrics of a worker (served by ``notify run`` / the API)."""

from prometheus_client import Counter, Gauge, Histogram

from .tally import Tally, TallyHistogram

# the hot path's metrics (an event, an outcome, a provider call): plain numbers on the
# loop's thread, exposed by a collector as prometheus_client's own (pipeline/tally.py)
events_in = Tally("notify_events_in_total", "Events read from notify.events")
outcomes = Tally("notify_outcomes_total", "Outcomes emitted", ["state", "reason"])
attempts = Tally("notify_attempts_total", "Provider calls", ["provider", "result"])
handoffs = Tally("notify_lane_handoffs_total",
                 "Deliveries handed to a lane of the same worker in memory, not through its topic",
                 ["channel", "priority"])
send_latency = TallyHistogram(
    "notify_send_latency_seconds", "Provider call latency", ["channel", "priority"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
#: seed 001's service level, as it happens (the report: ``notify slo``, GET /v1/slo)
to_terminal = TallyHistogram(
    "notify_acceptance_to_terminal_seconds",
    "A delivery's acceptance -> its first terminal state (deliveries deferred on purpose count their wait: "
    "the SLO report sets them apart)",
    ["priority"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 3600),
)

#: a child by its label values (each made once, then a dict lookup)
outcomes_of = outcomes.labels
to_terminal_of = to_terminal.labels
attempts_of = attempts.labels
send_latency_of = send_latency.labels
handoffs_of = handoffs.labels

dead_letters = Counter("notify_dead_letters_total", "Messages sent to notify.dlq", ["source", "reason"])
agent_errors = Counter("notify_agent_errors_total",
                       "Entries an agent failed on (dead-lettered as agent_error; the agent went on)", ["agent"])

no_channel = Counter("notify_no_channel_total",
                     "Notifications dropped because no channel was left (opted out or unreachable, and the "
                     "category has no inbox fallback)", ["category", "reason"])
backpressure = Gauge("notify_backpressure", "1 while the throttled categories wait (pipeline/rules/backpressure.py)")
backlog_age = Gauge("notify_backlog_oldest_seconds",
                    "Oldest unprocessed entry of any lane or intents topic, as this worker last read it")
breaker_state = Gauge("notify_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open", ["provider"])
scheduled = Gauge("notify_scheduled_backlog", "Timers held by this worker")

_BREAKER = {"closed": 0, "half_open": 1, "open": 2}


provider_config_faults = Counter("notify_provider_config_faults_total",
                                 "Provider calls refused for a fault of our configuration (no retry fixes it)",
                                 ["provider"])


def on_provider_fault(name: str, result: object) -> None:
    """``Dispatcher(on_fault=...)``: a configuration fault (wrong APNs topic, FCM's
    third-party credentials): counted for an alert; the dispatcher logs it too."""
    provider_config_faults.labels(name).inc()


def on_breaker_change(name: str, old: str, new: str) -> None:
    breaker_state.labels(name).set(_BREAKER.get(new, -1))


# elastic workers (broker option members=dynamic, pipeline/transport/elastic.py)
rebalances = Counter("notify_rebalances_total", "Group rebalances completed by this worker")
rebalance_seconds = Histogram(
    "notify_rebalance_duration_seconds", "From seeing a new group generation to its assignment applied",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
group_generation = Gauge("notify_group_generation", "Group generation whose assignment this worker applied")
member_expelled = Counter("notify_member_expelled_total", "Times this worker was expelled from its group")

# push to every device (pipeline/rules/plan.py per_device, agents/users.py)
push_devices_not_sent = Counter("notify_push_devices_not_sent_total",
                                "Devices a push did not go to: over [channels.push] max_devices, the oldest")
push_devices_dropped = Counter("notify_push_devices_dropped_total",
                               "Push tokens dropped at registration: the user had [channels.push] max_devices newer")


def on_rebalance(seconds: float, generation: int) -> None:
    """A completed rebalance of an elastic group (the transport's hook)."""
    rebalances.inc()
    rebalance_seconds.observe(seconds)
    group_generation.set(generation)


offset_rollbacks = Counter(
    "notify_offset_rollbacks_total",
    "Committed offsets found past their partition's end at a seek (a stream rolled back), and repaired",
    ["topic"],
)


def on_offset_rollback(topic: str, partition: int, committed: int, end: int) -> None:
    """The transport found (and repaired) a committed offset ahead of its stream (pipeline/transport/integrity.py)."""
    offset_rollbacks.labels(topic).inc()
