"""What the API answers, as frozen dataclasses (each keeps the JSON it came from in ``raw``)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Mapping, TypedDict, TypeVar, Union

from ._errors import LaneDisabledError, ProvisioningFailedError

__all__ = [
    "SandboxInfo",
    "ExecResult",
    "OutputFrame",
    "ExitFrame",
    "Frame",
    "Process",
    "FileInfo",
    "DirEntry",
    "Unpacked",
    "Snapshot",
    "AuditEvent",
    "AuditPage",
    "Policy",
    "Secret",
    "SecretPutResult",
    "IdentityScope",
    "ClassScope",
    "OrgScope",
    "Scope",
    "Introspection",
    "Health",
    "HealthCheck",
    "TerminalInfo",
    "TerminalTicket",
    "PreviewLink",
    "EnsureResult",
]

_Raw = Mapping[str, Any]


def _opt_str(raw: _Raw, key: str) -> str | None:
    value = raw.get(key)
    return None if value is None else str(value)


def _opt_int(raw: _Raw, key: str) -> int | None:
    value = raw.get(key)
    return None if value is None else int(value)


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the API shows it (``S`` in docs/api.md)."""

    id: str
    kind: str
    key: str
    org: str
    durability: str
    state: str
    driver: str
    created_at: str
    token_id: str | None = None
    forked_from: str | None = None
    snapshot_ignored: str | None = None
    raw: _Raw = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, raw: _Raw) -> SandboxInfo:
        """Decode the API's JSON."""
        return cls(
            id=str(raw["id"]),
            kind=str(raw["kind"]),
            key=str(raw["key"]),
            org=str(raw["org"]),
            durability=str(raw["durability"]),
            state=str(raw["state"]),
            driver=str(raw["driver"]),
            created_at=str(raw["created_at"]),
            token_id=_opt_str(raw, "token_id"),
            forked_from=_opt_str(raw, "forked_from"),
            snapshot_ignored=_opt_str(raw, "snapshot_ignored"),
            raw=raw,
        )


@dataclass(frozen=True)
class ExecResult:
    """What a buffered exec produced (output is UTF-8 with invalid bytes replaced, capped)."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool

    @classmethod
    def from_json(cls, raw: _Raw) -> ExecResult:
        """Decode the API's JSON."""
        return cls(
            exit_code=int(raw["exit_code"]),
            stdout=str(raw["stdout"]),
            stderr=str(raw["stderr"]),
            timed_out=bool(raw["timed_out"]),
            truncated=bool(raw["truncated"]),
        )


@dataclass(frozen=True)
class OutputFrame:
    """Bytes a command wrote to ``stdout`` or ``stderr``, exactly as written.

    The API sends them as ``text`` (UTF-8) or ``data`` (base64); either way ``data`` holds
    the bytes, and concatenating the frames of one stream gives the command's bytes.
    """

    stream: Literal["stdout", "stderr"]
    data: bytes

    @property
    def text(self) -> str:
        """The bytes decoded as UTF-8 (invalid bytes replaced)."""
        return self.data.decode("utf-8", "replace")

    @classmethod
    def from_json(cls, raw: _Raw) -> OutputFrame:
        """Decode one ``stdout``/``stderr`` line: exactly one of ``text`` and ``data``."""
        stream = raw["type"]
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"not an output frame: {stream!r}")
        text = raw.get("text")
        data = raw.get("data")
        if text is not None and data is None:
            payload = str(text).encode("utf-8")
        elif data is not None and text is None:
            payload = base64.b64decode(str(data), validate=True)
        else:
            raise ValueError("an output frame holds exactly one of text and data")
        return cls(stream="stdout" if stream == "stdout" else "stderr", data=payload)


@dataclass(frozen=True)
class ExitFrame:
    """The command ended: the last frame of a stream that ran to its end."""

    exit_code: int
    timed_out: bool
    truncated: bool

    @classmethod
    def from_json(cls, raw: _Raw) -> ExitFrame:
        """Decode the API's JSON."""
        return cls(
            exit_code=int(raw["exit_code"]),
            timed_out=bool(raw["timed_out"]),
            truncated=bool(raw["truncated"]),
        )


Frame = Union[OutputFrame, ExitFrame]
"""One frame of a streamed output: bytes, then the exit."""


@dataclass(frozen=True)
class Process:
    """A background process (``exit_code`` is ``None`` while it runs)."""

    pid: int
    argv: list[str]
    running: bool
    exit_code: int | None
    timed_out: bool
    terminal: str | None = None
    """The terminal it runs on (``term_…``), ``None`` for a process started without one."""

    @classmethod
    def from_json(cls, raw: _Raw) -> Process:
        """Decode the API's JSON."""
        terminal = raw.get("terminal")
        return cls(
            pid=int(raw["pid"]),
            argv=[str(a) for a in raw["argv"]],
            running=bool(raw["running"]),
            exit_code=_opt_int(raw, "exit_code"),
            timed_out=bool(raw.get("timed_out", False)),
            terminal=None if terminal is None else str(terminal),
        )


@dataclass(frozen=True)
class FileInfo:
    """A file written: its absolute path and size."""

    path: str
    size: int

    @classmethod
    def from_json(cls, raw: _Raw) -> FileInfo:
        """Decode the API's JSON."""
        return cls(path=str(raw["path"]), size=int(raw["size"]))


@dataclass(frozen=True)
class DirEntry:
    """One entry of a directory listing (``type``: file, directory, symlink or other)."""

    name: str
    type: str
    size: int

    @classmethod
    def from_json(cls, raw: _Raw) -> DirEntry:
        """Decode the API's JSON."""
        return cls(name=str(raw["name"]), type=str(raw["type"]), size=int(raw["size"]))


@dataclass(frozen=True)
class Unpacked:
    """An archive unpacked: the directory, the entries and the file bytes written."""

    path: str
    entries: int
    bytes: int

    @classmethod
    def from_json(cls, raw: _Raw) -> Unpacked:
        """Decode the API's JSON."""
        return cls(path=str(raw["path"]), entries=int(raw["entries"]), bytes=int(raw["bytes"]))


@dataclass(frozen=True)
class Snapshot:
    """A snapshot of a sandbox's workspace."""

    id: str
    sandbox_id: str
    org: str
    source_kind: str
    source_key: str
    owner: str
    created_by: str
    name: str | None
    created_at: str
    bytes: int
    raw: _Raw = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, raw: _Raw) -> Snapshot:
        """Decode the API's JSON."""
        return cls(
            id=str(raw["id"]),
            sandbox_id=str(raw["sandbox_id"]),
            org=str(raw["org"]),
            source_kind=str(raw["source_kind"]),
            source_key=str(raw["source_key"]),
            owner=str(raw["owner"]),
            created_by=str(raw["created_by"]),
            name=_opt_str(raw, "name"),
            created_at=str(raw["created_at"]),
            bytes=int(raw["bytes"]),
            raw=raw,
        )


@dataclass(frozen=True)
class AuditEvent:
    """One audit event (``seq`` is its position in the org's log)."""

    seq: int
    action: str
    org: str
    kind: str
    key: str
    sandbox_id: str | None
    caller_id: str
    caller_class: str
    durability: str | None
    driver: str
    outcome: str
    message: str
    token_id: str | None
    at: str
    sealed: bool
    raw: _Raw = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, raw: _Raw) -> AuditEvent:
        """Decode the API's JSON."""
        return cls(
            seq=int(raw["seq"]),
            action=str(raw["action"]),
            org=str(raw["org"]),
            kind=str(raw["kind"]),
            key=str(raw["key"]),
            sandbox_id=_opt_str(raw, "sandbox_id"),
            caller_id=str(raw["caller_id"]),
            caller_class=str(raw["caller_class"]),
            durability=_opt_str(raw, "durability"),
            driver=str(raw["driver"]),
            outcome=str(raw["outcome"]),
            message=str(raw.get("message", "")),
            token_id=_opt_str(raw, "token_id"),
            at=str(raw["at"]),
            sealed=bool(raw["sealed"]),
            raw=raw,
        )


@dataclass(frozen=True)
class AuditPage:
    """A page of audit events, oldest first; pass ``next`` as the following page's ``after``."""

    events: list[AuditEvent]
    next: int

    @classmethod
    def from_json(cls, raw: _Raw) -> AuditPage:
        """Decode the API's JSON."""
        return cls(events=[AuditEvent.from_json(e) for e in raw["events"]], next=int(raw["next"]))


@dataclass(frozen=True)
class WebhookDelivery:
    """One delivery of a webhook event to the org's receiver."""

    id: str
    event_type: str
    audit_seq: int
    status: str
    attempts: int
    next_attempt_at: str
    last_status: int | None
    last_error: str | None
    created_at: str
    updated_at: str

    @classmethod
    def from_json(cls, raw: _Raw) -> WebhookDelivery:
        """Decode the API's JSON."""
        return cls(
            id=str(raw["id"]),
            event_type=str(raw["event_type"]),
            audit_seq=int(raw["audit_seq"]),
            status=str(raw["status"]),
            attempts=int(raw["attempts"]),
            next_attempt_at=str(raw["next_attempt_at"]),
            last_status=_opt_int(raw, "last_status"),
            last_error=_opt_str(raw, "last_error"),
            created_at=str(raw["created_at"]),
            updated_at=str(raw["updated_at"]),
        )


@dataclass(frozen=True)
class WebhookDeliveryPage:
    """A page of webhook deliveries, newest first; pass ``next`` as the following page's ``before``."""

    deliveries: list[WebhookDelivery]
    next: str | None

    @classmethod
    def from_json(cls, raw: _Raw) -> WebhookDeliveryPage:
        """Decode the API's JSON."""
        return cls(
            deliveries=[WebhookDelivery.from_json(d) for d in raw["deliveries"]],
            next=_opt_str(raw, "next"),
        )


@dataclass(frozen=True)
class ListedSandbox:
    """One of the org's sandboxes in a listing."""

    id: str
    kind: str
    key: str
    durability: str
    state: str
    driver: str
    owner: str | None
    owner_class: str | None
    created_at: str
    last_active_at: str

    @classmethod
    def from_json(cls, raw: _Raw) -> ListedSandbox:
        """Decode the API's JSON."""
        return cls(
            id=str(raw["id"]),
            kind=str(raw["kind"]),
            key=str(raw["key"]),
            durability=str(raw["durability"]),
            state=str(raw["state"]),
            driver=str(raw["driver"]),
            owner=_opt_str(raw, "owner"),
            owner_class=_opt_str(raw, "owner_class"),
            created_at=str(raw["created_at"]),
            last_active_at=str(raw["last_active_at"]),
        )


@dataclass(frozen=True)
class SandboxListPage:
    """A page of the org's sandboxes, oldest first; pass ``next`` as the following page's ``after``."""

    sandboxes: list[ListedSandbox]
    next: str | None

    @classmethod
    def from_json(cls, raw: _Raw) -> SandboxListPage:
        """Decode the API's JSON."""
        return cls(sandboxes=[ListedSandbox.from_json(s) for s in raw["sandboxes"]], next=_opt_str(raw, "next"))


@dataclass(frozen=True)
class AuditVerdict:
    """What ``sandlane audit verify`` says of the log: ``intact`` or ``tampered``."""

    verdict: str
    checked_at: str
    message: str | None

    @classmethod
    def from_json(cls, raw: _Raw) -> AuditVerdict:
        """Decode the API's JSON."""
        return cls(verdict=str(raw["verdict"]), checked_at=str(raw["checked_at"]), message=_opt_str(raw, "message"))


@dataclass(frozen=True)
class Policy:
    """An org's effective policy (``None``: unlimited for a quota, off for a timeout)."""

    org: str
    version: int
    updated_at: str | None
    lane_session: bool
    lane_workflow: bool
    max_sandboxes: int | None
    max_commands: int | None
    max_commands_per_sandbox: int | None
    workspace_bytes: int | None
    idle_timeout_ms: int | None
    max_lifetime_ms: int | None
    warm_pool: int
    egress_allow: list[str]
    overridden: list[str]
    raw: _Raw = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, raw: _Raw) -> Policy:
        """Decode the API's JSON."""
        return cls(
            org=str(raw["org"]),
            version=int(raw["version"]),
            updated_at=_opt_str(raw, "updated_at"),
            lane_session=bool(raw["lane_session"]),
            lane_workflow=bool(raw["lane_workflow"]),
            max_sandboxes=_opt_int(raw, "max_sandboxes"),
            max_commands=_opt_int(raw, "max_commands"),
            max_commands_per_sandbox=_opt_int(raw, "max_commands_per_sandbox"),
            workspace_bytes=_opt_int(raw, "workspace_bytes"),
            idle_timeout_ms=_opt_int(raw, "idle_timeout_ms"),
            max_lifetime_ms=_opt_int(raw, "max_lifetime_ms"),
            warm_pool=int(raw["warm_pool"]),
            egress_allow=[str(x) for x in raw["egress_allow"]],
            overridden=[str(x) for x in raw["overridden"]],
            raw=raw,
        )


class IdentityScope(TypedDict):
    """A secret for one caller's identity id."""

    identity: str


ClassScope = TypedDict("ClassScope", {"class": Literal["user", "service"]})
"""A secret for every caller of a class: ``{"class": "user"}`` or ``{"class": "service"}``."""


class OrgScope(TypedDict):
    """A secret for every caller of the org: ``{"org": True}``."""

    org: Literal[True]


Scope = Union[IdentityScope, ClassScope, OrgScope]
"""Who a secret is for: ``{"identity": ID}``, ``{"class": "user"|"service"}`` or ``{"org": True}``."""


@dataclass(frozen=True)
class Secret:
    """A secret's binding (never its value)."""

    name: str
    hosts: list[str]
    header: str
    format: str
    scope: dict[str, Any]
    methods: list[str]
    paths: list[str]
    created_at: str
    updated_at: str

    @classmethod
    def from_json(cls, raw: _Raw) -> Secret:
        """Decode the API's JSON."""
        return cls(
            name=str(raw["name"]),
            hosts=[str(x) for x in raw["hosts"]],
            header=str(raw["header"]),
            format=str(raw["format"]),
            scope=dict(raw["scope"]),
            methods=[str(x) for x in raw.get("methods", [])],
            paths=[str(x) for x in raw.get("paths", [])],
            created_at=str(raw["created_at"]),
            updated_at=str(raw["updated_at"]),
        )


@dataclass(frozen=True)
class SecretPutResult:
    """A secret set: its binding, and whether it was created (201) rather than replaced (200)."""

    secret: Secret
    created: bool


@dataclass(frozen=True)
class Introspection:
    """An RFC 7662 answer: ``active``, and the token's claims when it is."""

    active: bool
    claims: dict[str, Any]

    @classmethod
    def from_json(cls, raw: _Raw) -> Introspection:
        """Decode the API's JSON."""
        return cls(active=bool(raw.get("active", False)), claims={k: v for k, v in raw.items() if k != "active"})


@dataclass(frozen=True)
class HealthCheck:
    """One readiness check."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Health:
    """A health or readiness answer (``ok`` is the HTTP status being 200)."""

    ok: bool
    status: str
    checks: list[HealthCheck]

    @classmethod
    def from_json(cls, raw: _Raw, ok: bool) -> Health:
        """Decode the API's JSON."""
        return cls(
            ok=ok,
            status=str(raw.get("status", "")),
            checks=[
                HealthCheck(name=str(c["name"]), ok=bool(c["ok"]), detail=str(c.get("detail", "")))
                for c in raw.get("checks", [])
            ],
        )


@dataclass(frozen=True)
class TerminalInfo:
    """A terminal of a sandbox (needs a server with terminals)."""

    id: str
    raw: _Raw = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, raw: _Raw) -> TerminalInfo:
        """Decode the API's JSON."""
        return cls(id=str(raw["id"]), raw=raw)


@dataclass(frozen=True)
class TerminalTicket:
    """A short-lived ticket that attaches to one terminal (for a browser, which cannot send headers)."""

    ticket: str
    expires_at: str

    @classmethod
    def from_json(cls, raw: _Raw) -> TerminalTicket:
        """Decode the API's JSON."""
        return cls(ticket=str(raw["ticket"]), expires_at=str(raw["expires_at"]))


@dataclass(frozen=True)
class PreviewLink:
    """A preview link to a port of a sandbox (needs a server with preview links)."""

    id: str
    url: str
    expires_at: str

    @classmethod
    def from_json(cls, raw: _Raw) -> PreviewLink:
        """Decode the API's JSON."""
        return cls(id=str(raw["id"]), url=str(raw["url"]), expires_at=str(raw["expires_at"]))



SandboxT = TypeVar("SandboxT")


@dataclass(frozen=True)
class EnsureResult(Generic[SandboxT]):
    """What an ensure answered.

    ``outcome`` is ``"ready"`` (``sandbox`` is set), ``"failed"`` (a session ensure's
    provisioning failed: ``message`` starts with ``Sandbox provisioning failed: ``) or
    ``"disabled"`` (the lane is off; nothing was provisioned).
    """

    outcome: str
    sandbox: SandboxT | None
    message: str | None = None

    @property
    def ready(self) -> bool:
        """Whether a sandbox is ready."""
        return self.outcome == "ready" and self.sandbox is not None

    def require_sandbox(self) -> SandboxT:
        """The sandbox; raises :class:`ProvisioningFailedError` or :class:`LaneDisabledError` otherwise."""
        if self.sandbox is not None:
            return self.sandbox
        if self.outcome == "disabled":
            raise LaneDisabledError("the lane is off for this org and kind: nothing was provisioned", code="disabled")
        raise ProvisioningFailedError(self.message or "Sandbox provisioning failed", status=200)
