"""The agent's configuration schema: msgspec structs, the error type, the loaded result. No I/O.

This module is the bottom of the package: it imports nothing of nvdaemon but ``configcheck``. Reading, expanding and
validating a file is ``configload``, which sits above this module and above the validators of the sinks and the
compat surfaces (``sinks/webhook/config.py``, ``sinks/nvsentinel/config.py``, ``compat/node_exporter/options.py``)
and the Go-key folding (``goconfig``), so that none of them is imported from here.

Keys are camelCase and a superset of the Go agent's. Unknown keys are errors (a typo must not silently disable a
rule). ``${VAR}`` in a string value is replaced from the environment after YAML parsing, so a variable can never
inject YAML structure. Errors do not echo string values, because those may be secrets (the exception, a wrong
choice for a key with fixed choices, is quoted short and never when it came from the environment: configcheck).

Input is bounded: the file is read up to ``MAX_CONFIG_BYTES`` and must be UTF-8 (``configload``), its YAML nesting
and alias expansion are capped (``configcheck.load_yaml``), and every number has a range. Floors keep a typo from
spinning a core (``intervalSeconds: 0.000000001``); ceilings keep timeouts and sizes to what a node can live with.
Every key naming a file, directory or socket is typed ``FilePath``, ``RequiredPath`` or ``SocketPath``, so that the
walk which checks every key also refuses a path no system call can take (a NUL byte, an unencodable character, over
the kernel's limits: ``configcheck.path_problem``); a new path-valued key must use one of them.
The floors of the two tick intervals admit the sub-second ticks of the fixture tests; the Go agent's smallest
interval is 1 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from nvdaemon.configcheck import OPTIONAL, PATH_META, REQUIRED, SOCKET, ConfigIssue

MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: a real config is a few KiB
MIN_INTERVAL_SECONDS = 0.05  # intervalSeconds floor (a tick of the core/gpu tiers)
MIN_SMART_INTERVAL_SECONDS = 0.25  # smart.intervalSeconds floor: every tick runs smartctl on every disk
MIN_RETRY_SECONDS = 0.01  # backoff and retry delays
MAX_TIMEOUT_SECONDS = 600.0  # every timeout and grace period
MAX_INTERVAL_SECONDS = 86_400.0

Timeout = Annotated[float, msgspec.Meta(gt=0, le=MAX_TIMEOUT_SECONDS)]
Retry = Annotated[float, msgspec.Meta(ge=MIN_RETRY_SECONDS, le=MAX_INTERVAL_SECONDS)]
Count = Annotated[int, msgspec.Meta(ge=1)]
Attempts = Annotated[int, msgspec.Meta(ge=1, le=1000)]
QueueSize = Annotated[int, msgspec.Meta(ge=1, le=100_000)]  # events held in memory
Interval = Annotated[float, msgspec.Meta(ge=MIN_INTERVAL_SECONDS, le=MAX_INTERVAL_SECONDS)]
SmartInterval = Annotated[float, msgspec.Meta(ge=MIN_SMART_INTERVAL_SECONDS, le=7 * MAX_INTERVAL_SECONDS)]
FilePath = Annotated[str, msgspec.Meta(extra={PATH_META: OPTIONAL})]  # a file or directory; "" = unset
RequiredPath = Annotated[str, msgspec.Meta(extra={PATH_META: REQUIRED})]  # a file, directory or command; never ""
SocketPath = Annotated[str, msgspec.Meta(extra={PATH_META: SOCKET})]  # a Unix socket; never ""

TierName = Literal["core", "smart", "gpu"]
DEFAULT_LISTEN = "127.0.0.1:9847"
HISTORY_FILE_IN_DATA_DIR = "nvdaemon-history.db"  # the Go agent's bbolt file there is history.db: left untouched


class _Section(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    """Base of every config struct: camelCase keys, unknown keys rejected."""


RecommendedActionName = Literal[
    "NONE",
    "COMPONENT_RESET",
    "CONTACT_SUPPORT",
    "RUN_FIELDDIAG",
    "RESTART_VM",
    "RESTART_BM",
    "REPLACE_VM",
    "RUN_DCGMEUD",
    "CUSTOM",
    "UNKNOWN",
]
ProcessingStrategyName = Literal["EXECUTE_REMEDIATION", "STORE_ONLY", "STORE_AND_ANALYSE"]


class RuleNvsentinel(_Section):
    """How a rule's condition is reported to NVSentinel; unset fields take the defaults of sinks/nvsentinel/map.py."""

    check_name: str = ""  # default: Nvdaemon + the condition in CamelCase
    component_class: str = ""  # default: from the tier, metric and device (CPU, Memory, Disk, NIC, GPU, Node)
    fatal: bool | None = None  # default: severity is critical
    recommended_action: RecommendedActionName | None = None  # default: CONTACT_SUPPORT when fatal, else NONE
    custom_recommended_action: str = ""  # required with recommendedAction CUSTOM
    processing_strategy: ProcessingStrategyName | None = None  # default: sinks.nvsentinel.processingStrategy


class Rule(_Section):
    """One threshold rule; its state is tracked per full series (metric, device, labels)."""

    metric: str  # internal metric name (no nodevitals_hw_ prefix): nvdaemon/catalogue.py
    condition: str  # the condition's name in events and /v1/conditions (letters, digits and _)
    threshold: float  # compared with the sample's value (or its rate) by op
    device: str = ""  # exact name or glob; "" = every device, each tracked on its own
    labels: dict[str, str] = msgspec.field(default_factory=dict)  # subset match on the sample's labels
    severity: Literal["info", "warning", "critical"] = "warning"  # carried by the condition's events
    op: Literal[">", ">=", "<", "<="] = ">"  # breaching: value op threshold
    enter_for: Count = 1  # consecutive breaching samples before ENTER
    exit_for: Count = 1  # consecutive clear samples before EXIT
    rate: bool = False  # compare the per-second increase of a counter instead of its value
    nvsentinel: RuleNvsentinel | None = None  # NVSentinel HealthEvent overrides (sinks.nvsentinel)


class ServerConfig(_Section):
    """The HTTP server on sinks.metrics.listenAddr: /metrics, /healthz, /readyz, /v1/* and the event stream."""

    api_token_file: FilePath = ""  # bearer token guarding /v1/*; /metrics, /healthz, /readyz stay open
    max_request_bytes: Annotated[int, msgspec.Meta(ge=1, le=16 << 20)] = 65536  # larger request bodies get 413
    header_timeout_seconds: Timeout = 10.0  # each request head must be complete within this long
    # A keep-alive connection with no request in progress is closed after it: above the scrape interval, so Prometheus
    # (default interval 1 min) keeps its connection from scrape to scrape as it does with node_exporter.
    idle_timeout_seconds: Timeout = 120.0
    # Served at once; above it only /healthz and /readyz are answered (503 otherwise).
    max_connections: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1024
    max_websocket_message_bytes: Annotated[int, msgspec.Meta(ge=1, le=16 << 20)] = 4096  # inbound; larger: 1009


class SmartConfig(_Section):
    """The smart tier: smartctl --all per whole disk, through pySMART."""

    smartctl_path: RequiredPath = "smartctl"  # a command name is looked up on PATH
    devices: list[RequiredPath] = msgspec.field(default_factory=list)  # [] = every whole disk under devRoot
    interval_seconds: SmartInterval = 300.0  # the smart tier's tick
    timeout_seconds: Timeout = 30.0  # per smartctl run; the process (group) is killed after it
    max_concurrent: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4  # smartctl processes at once (not 24 on a JBOD)


class GpuConfig(_Section):
    """The gpu tier: NVML readings per GPU, and XID errors as events."""

    xid: bool = True  # XID errors from NVML's event set become events
    backend: Literal["auto", "nvml", "fake"] = "auto"  # auto: the fake when fakeScenario is set, else NVML
    fake_scenario: FilePath = ""  # a recorded NVML scenario (fixtures/nvml/*.json): fixtures, tests, local runs only


class SpoolConfig(_Section):
    """The webhook spool (stateDir/spool.db): events kept until every endpoint has them, bounded."""

    # Both bound each endpoint's share; over either, dead letters go first, then the lowest severity, oldest first.
    max_events: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] = 100_000
    max_bytes: Annotated[int, msgspec.Meta(ge=1, le=1 << 40)] = 268_435_456  # bytes of spooled events


class WebhookSink(_Section):
    """One webhook endpoint: CloudEvents POSTed, signed, spooled and retried until delivered."""

    url: str  # https://, or http:// to loopback (elsewhere only with allowInsecure)
    secret: str = ""  # Standard Webhooks signing key; none of secret, secrets, secretFile: unsigned (warned)
    secrets: list[str] = msgspec.field(default_factory=list)  # several keys, one signature each (rotation)
    secret_file: FilePath = ""  # signing keys, one per line
    mode: Literal["structured", "binary"] = "structured"  # the CloudEvents HTTP content mode
    timeout_seconds: Timeout = 15.0  # per POST
    max_age_hours: Annotated[float, msgspec.Meta(gt=0, le=8760)] = 72.0  # transient failures retried this long
    max_attempts: Attempts = 3  # tries on a status other than 2xx, 408, 429, 5xx and 410, then a dead letter
    # Extra static headers (not content-type, webhook-*, ce-*).
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    allow_insecure: bool = False  # permit plain http:// to a host that is not loopback
    backoff_base_seconds: Retry = 1.0  # retry delays grow from this, up to backoffMaxSeconds
    backoff_max_seconds: Retry = 300.0  # the largest retry delay


class MetricsSink(_Section):
    """The one HTTP listener: /metrics, /healthz, /readyz, /v1/* and the event stream."""

    enabled: bool = True  # accepted; false is ignored with a note (the listener serves the probes and /v1/* too)
    listen_addr: str = DEFAULT_LISTEN  # the one HTTP port: HOST:PORT, or :PORT for every interface


class NvsentinelSink(_Section):
    """The agent as an NVSentinel health monitor: HealthEvents to the platform-connector's Unix socket."""

    enabled: bool = False  # the sink runs
    socket_path: SocketPath = "/var/run/nvsentinel.sock"  # the platform-connector's gRPC socket
    token_path: FilePath = "/var/run/secrets/nvsentinel/platform-connector/token"  # "": no authorization header
    agent: str = "nvdaemon"  # the HealthEvent's agent and the monitor label of its metrics
    processing_strategy: ProcessingStrategyName = "EXECUTE_REMEDIATION"  # STORE_ONLY for an observe-only rollout
    healthy_baseline: bool = True  # a healthy event for every configured check the first time it is seen
    xid_actions: dict[str, RecommendedActionName] = msgspec.field(default_factory=dict)  # XID -> action overrides
    call_timeout_seconds: Timeout = 5.0  # per gRPC call
    max_attempts: Attempts = 5  # per difference and tick, on UNAVAILABLE / DEADLINE_EXCEEDED / reset / broken pipe
    retry_initial_seconds: Retry = 2.0  # first retry delay
    retry_multiplier: Annotated[float, msgspec.Meta(ge=1, le=10)] = 1.5  # each retry delay over the one before
    retry_jitter: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.1  # +-10 % of each delay


class StreamSink(_Section):
    """The live event stream: the /v1/events websocket."""

    enabled: bool = True  # /v1/events is served
    buffer_size: QueueSize = 1000  # ring buffer of recent events replayed on connect
    max_clients: QueueSize = 64  # more websocket clients get HTTP 503 before the upgrade
    client_queue: QueueSize = 256  # events a client may lag behind before it is closed with 1013
    ping_seconds: Annotated[float, msgspec.Meta(ge=0.1, le=3600)] = 20.0  # websocket ping to each client


class Sinks(_Section):
    """Where events and metrics go."""

    webhook: list[WebhookSink] = msgspec.field(default_factory=list)
    metrics: MetricsSink = msgspec.field(default_factory=MetricsSink)
    nvsentinel: NvsentinelSink = msgspec.field(default_factory=NvsentinelSink)
    stream: StreamSink = msgspec.field(default_factory=StreamSink)


class HistoryConfig(_Section):
    """Long-term history of allowlisted metrics, downsampled into a SQLite store (/v1/history)."""

    enabled: bool = False  # history is kept
    interval_minutes: Annotated[int, msgspec.Meta(ge=1, le=1440)] = 5  # one point per series per interval
    retention_days: Annotated[int, msgspec.Meta(ge=1, le=36_500)] = 1825  # older points are deleted
    metrics: list[str] = msgspec.field(default_factory=list)  # metric names kept; [] = the default allowlist
    data_dir: FilePath = ""  # the directory of the history database ("" = stateDir); the Go agent's key


class Toggle(_Section):
    """A surface with nothing to set but on or off."""

    enabled: bool = False  # the surface is on /metrics


class DcgmCompatConfig(_Section):
    """The dcgm-exporter surface, and which pod holds each GPU (the kubelet's pod-resources API, gpu/podresources)."""

    enabled: bool = False  # dcgm-exporter's DCGM_FI_* families on /metrics (gpu tier)
    pod_attribution: bool = False  # container/namespace/pod labels on DCGM_FI_* and detail.pods on GPU events
    pod_resources_socket: SocketPath = "/var/lib/kubelet/pod-resources/kubelet.sock"  # the kubelet's API
    # Per List call; a slower kubelet turns attribution off that tick. Bounded like every timeout: gRPC turns a
    # deadline past ~1e10 s into one already expired, so every call would fail.
    pod_resources_timeout_seconds: Timeout = 5.0


# node_exporter's defaults for its most used per-collector filters (regular expressions, Python syntax).
NODE_DISKSTATS_EXCLUDE = r"^(ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$"
NODE_MOUNT_POINTS_EXCLUDE = r"^/(dev|proc|run/credentials/.+|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)"
NODE_FS_TYPES_EXCLUDE = (
    r"^(autofs|binfmt_misc|bpf|cgroup2?|configfs|debugfs|devpts|devtmpfs|fusectl|hugetlbfs|iso9660|mqueue|nsfs|"
    r"overlay|proc|procfs|pstore|rpc_pipefs|securityfs|selinuxfs|squashfs|sysfs|tracefs)$"
)


class NodeDiskstatsOptions(_Section):
    """Which block devices the diskstats collector reports (regular expressions)."""

    device_include: str = ""  # when set, only matching devices (device_exclude is then ignored)
    device_exclude: str = NODE_DISKSTATS_EXCLUDE  # node_exporter's default


class NodeFilesystemOptions(_Section):
    """Which mounts the filesystem collector reports (regular expressions)."""

    mount_points_exclude: str = NODE_MOUNT_POINTS_EXCLUDE  # node_exporter's default
    fs_types_exclude: str = NODE_FS_TYPES_EXCLUDE  # node_exporter's default
    mount_timeout_seconds: Timeout = 5.0  # a statfs slower than this marks the mount stuck (device_error 1)


class NodeNetdevOptions(_Section):
    """Which interfaces the netdev collector reports (regular expressions)."""

    device_include: str = ""  # when set, only matching interfaces
    device_exclude: str = ""  # matching interfaces are left out


class NodeHwmonOptions(_Section):
    """Which hwmon chips the hwmon collector reports (regular expressions)."""

    chip_include: str = ""  # when set, only matching chips
    chip_exclude: str = ""  # matching chips are left out


class NodeExporterConfig(_Section):
    """The node_exporter drop-in surface (``node_*`` families on /metrics)."""

    enabled: bool = False  # node_exporter's node_* families on /metrics (core tier)
    collectors: dict[str, bool] = msgspec.field(default_factory=dict)  # node_exporter name -> on/off over default
    textfile_directory: FilePath = ""  # *.prom files merged into /metrics ("" = the textfile collector reads nothing)
    textfile_dir: FilePath = ""  # the Go agent's name for textfileDirectory (both set: they must agree)
    rootfs_path: FilePath = ""  # the Go agent's key: sets rootfs; given as "" it turns the filesystem collector off
    extra_flags: list[str] = msgspec.field(default_factory=list)  # the Go agent's: --[no-]collector.* (goconfig)
    diskstats: NodeDiskstatsOptions = msgspec.field(default_factory=NodeDiskstatsOptions)
    filesystem: NodeFilesystemOptions = msgspec.field(default_factory=NodeFilesystemOptions)
    netdev: NodeNetdevOptions = msgspec.field(default_factory=NodeNetdevOptions)
    hwmon: NodeHwmonOptions = msgspec.field(default_factory=NodeHwmonOptions)
    # A larger *.prom file is skipped (node_textfile_scrape_error 1) and counted as a collector error.
    textfile_max_bytes: Annotated[int, msgspec.Meta(ge=1024, le=256 << 20)] = 4 << 20


class KernelRule(_Section):
    """A kernel log pattern (kernelRules): an event per match, or a condition raised after ``count`` matches within
    ``windowSeconds`` and cleared after ``clearAfterSeconds`` without one. Checked by ``nvdaemon/kmsg/rules.py``."""

    pattern: str  # a Python regular expression, searched in each record's message
    condition: str  # the condition's name in events (letters, digits and _)
    severity: Literal["info", "warning", "critical"] = "warning"
    mode: Literal["event", "condition"] = "event"
    device: str = ""  # a named group of the pattern whose text is the event's device; "" = the node (device "kernel")
    # A literal the message must contain before the pattern is tried (the cheap prefilter); "" = derived from the
    # pattern's leading literal text, or none when it has none (the pattern is then tried on every record).
    contains: str = ""
    count: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1  # condition mode: matches within windowSeconds
    window_seconds: Annotated[float, msgspec.Meta(gt=0, le=MAX_INTERVAL_SECONDS)] = 300.0  # also: event mode folds
    # repeats of one (condition, device) within this window into the next event's detail.repeats
    clear_after_seconds: Annotated[float, msgspec.Meta(gt=0, le=30 * MAX_INTERVAL_SECONDS)] = 3600.0  # condition mode
    nvsentinel: RuleNvsentinel | None = None  # NVSentinel HealthEvent overrides (condition mode)


class KernelLogConfig(_Section):
    """The kernel log source: /dev/kmsg under devRoot, read as records (nvdaemon/kmsg)."""

    enabled: bool = True  # an agent that cannot open it reports the source unreadable and goes on
    lookback_seconds: Annotated[float, msgspec.Meta(ge=0, le=30 * MAX_INTERVAL_SECONDS)] = 3600.0  # after a reboot
    # or a first start: the records at most this old are read (after a restart: every record since the last one)
    max_records_per_second: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 2000  # parsed; the rest skipped, counted
    max_record_bytes: Annotated[int, msgspec.Meta(ge=256, le=1 << 20)] = 8192  # longer records are cut (counted)
    xid_merge_seconds: Annotated[float, msgspec.Meta(ge=0, le=60)] = 2.0  # NVML and kernel log reports of one XID
    # within this are one event naming both
    xid_repeat_seconds: Annotated[float, msgspec.Meta(gt=0, le=30 * MAX_INTERVAL_SECONDS)] = 3600.0  # an XID of a GPU
    # repeated within this of the last report is counted, not sent again (a recovery signal or a reboot ends it too)
    default_rules: bool = True  # the built-in kernelRules (OOM, hung task, oops, filesystem and I/O errors, ...)


class Config(_Section):
    """The top level of the config file."""

    node: str = ""  # node label on every series and event; "" = $NODE_NAME, else the hostname
    # The tiers run, in order; blanks and repeats dropped.
    tiers: list[TierName] = msgspec.field(default_factory=lambda: ["core"])
    tier: TierName | None = None  # legacy single-tier key of the Go agent
    interval_seconds: Interval = 15.0  # the core and gpu tiers' tick; <= 0 means 15, as in the Go agent
    proc_root: RequiredPath = "/proc"  # host roots: --host-root DIR sets all four
    sys_root: RequiredPath = "/sys"  # the host's sysfs
    dev_root: RequiredPath = "/dev"  # the host's /dev (the smart tier's disks)
    rootfs: RequiredPath = "/"  # the host's root filesystem (node_exporter's filesystem collector)
    # Engine state, webhook spool, NVSentinel's reported health, history. "" = the default
    # (configload.default_state_dir): /var/lib/nvdaemon as root, else $XDG_STATE_HOME/nvdaemon.
    state_dir: FilePath = ""
    rules: list[Rule] = msgspec.field(default_factory=list)
    shutdown_grace_seconds: Timeout = 10.0  # from SIGTERM to exit
    # Per collector read; a read that hangs is abandoned and the collector skipped until it returns.
    collector_timeout_seconds: Timeout = 5.0
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    smart: SmartConfig = msgspec.field(default_factory=SmartConfig)
    gpu: GpuConfig = msgspec.field(default_factory=GpuConfig)
    spool: SpoolConfig = msgspec.field(default_factory=SpoolConfig)
    sinks: Sinks = msgspec.field(default_factory=Sinks)
    history: HistoryConfig = msgspec.field(default_factory=HistoryConfig)
    node_exporter: NodeExporterConfig = msgspec.field(default_factory=NodeExporterConfig)
    dcgm_compat: DcgmCompatConfig = msgspec.field(default_factory=DcgmCompatConfig)
    smartctl_compat: Toggle = msgspec.field(default_factory=Toggle)  # smartctl_exporter's smartctl_* families
    kernel_log: KernelLogConfig = msgspec.field(default_factory=KernelLogConfig)
    kernel_rules: list[KernelRule] = msgspec.field(default_factory=list)  # added to the built-in ones


class ConfigError(Exception):
    """Every problem found in one config file; ``str()`` lists them one per line."""

    def __init__(self, source: str, issues: list[ConfigIssue]) -> None:
        self.source = source
        self.issues = issues
        lines = [f"{source}: {len(issues)} error(s) in config"]
        lines += [f"  {source}{issue.where()}: {issue.path or '<top>'}: {issue.message}" for issue in issues]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config plus where it came from and the values derived from the host."""

    config: Config
    source: str
    node: str
    state_dir: Path
    tiers: tuple[str, ...]
    notes: tuple[str, ...] = ()  # where this file means something the Go agent would do differently (check-config)
