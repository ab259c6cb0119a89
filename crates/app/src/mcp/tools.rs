//! The MCP tools: each one parses its arguments, calls the use case its HTTP route calls
//! (so it is authorised exactly as that route), and answers MCP content. A use case's
//! refusal is a tool result with `isError` set and the API's error body as its text
//! (`{"error":"permission_denied","message":…}`), so the model reads why; a malformed call
//! is the protocol's invalid-params error.
//!
//! Outputs are capped ([`TEXT_CAP`], [`FILE_CAP`], [`ENTRIES_CAP`]) and a capped result
//! says what it left out: a model's context is not the place for a megabyte of log.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use domain::{Actor, ExecRequest, OrgId, ProcessRequest, SandboxId, SandboxPath, SnapshotName};
use ports::{ByteSource, ReadOutcome, SourceError};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ResourceContents, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::json;

use crate::http::AppState;
use crate::http::auth::Principal;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::files::EntryBody;
use crate::http::processes::ProcessBody;
use crate::http::sandboxes::exec_failure;
use crate::http::snapshots::SnapshotBody;
use crate::usecase;

/// The most bytes of each output stream a tool result carries.
pub const TEXT_CAP: usize = 64 * 1024;
/// The most bytes of a file `read_file` returns.
pub const FILE_CAP: usize = 1024 * 1024;
/// The most entries `list_files` returns.
pub const ENTRIES_CAP: usize = 1000;
/// The longest `process_output` waits for more output.
pub const MAX_WAIT_MS: u64 = 30_000;

/// The lane's tools, for one request (the transport makes one per request: it is
/// stateless).
#[derive(Clone)]
pub struct LaneTools {
    state: Arc<AppState>,
    tool_router: ToolRouter<Self>,
}

/// Where a tool acts.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Target {
    /// The org. May be left out when the caller's key acts in one org only, or with a
    /// sandbox token (its own org).
    #[serde(default)]
    pub org: Option<String>,
    /// The sandbox (`sbx_…`). A sandbox token acts only in its own sandbox.
    pub sandbox_id: String,
}

/// `exec`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExecArgs {
    /// Where.
    #[serde(flatten)]
    pub target: Target,
    /// The program and its arguments, e.g. `["sh", "-c", "ls -la"]`.
    pub argv: Vec<String>,
    /// Text for the command's standard input.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Wall-clock limit in milliseconds (the server's default when left out).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// A path's arguments (`read_file`, `list_files`).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct PathArgs {
    /// Where.
    #[serde(flatten)]
    pub target: Target,
    /// An absolute path beneath `/workspace` or `/tmp`.
    pub path: String,
}

/// `write_file`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WriteArgs {
    /// Where.
    #[serde(flatten)]
    pub target: Target,
    /// An absolute path beneath `/workspace` or `/tmp` (parents are created).
    pub path: String,
    /// The file's whole new contents.
    pub content: String,
    /// `text` (default) or `base64` (for binary contents).
    #[serde(default)]
    pub encoding: Option<String>,
}

/// `start_process`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct StartArgs {
    /// Where.
    #[serde(flatten)]
    pub target: Target,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// Text written to its standard input first.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Wall-clock limit in milliseconds; none when left out.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// `process_output`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct OutputArgs {
    /// Where.
    #[serde(flatten)]
    pub target: Target,
    /// The process's pid (from `start_process`).
    pub pid: u32,
    /// How long to wait for more output, at most 30000 ms; 0 or left out: only what is
    /// buffered now.
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// `snapshot`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SnapshotArgs {
    /// Where.
    #[serde(flatten)]
    pub target: Target,
    /// A name for it.
    #[serde(default)]
    pub name: Option<String>,
}

type ToolResult = Result<CallToolResult, ErrorData>;

/// The value of a step that may refuse, or (returned from the tool) the refusal.
macro_rules! or_refused {
    ($step:expr) => {
        match $step {
            Ok(value) => value,
            Err(e) => return refused(e),
        }
    };
}

#[tool_router]
impl LaneTools {
    /// The tools over `state`.
    pub fn new(state: Arc<AppState>) -> Self {
        Self { state, tool_router: Self::tool_router() }
    }

    /// The names of the tools, as `tools/list` gives them.
    pub fn names() -> Vec<String> {
        Self::tool_router().list_all().into_iter().map(|tool| tool.name.into_owned()).collect()
    }

    #[tool(description = "Run a command in a sandbox and wait for it: its exit code, standard output and \
                          standard error (each capped at 64 KiB here).")]
    async fn exec(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ExecArgs>,
    ) -> ToolResult {
        let (actor, org, sandbox) = or_refused!(place(&ctx, args.target));
        let request =
            match ExecRequest::new(args.argv, args.stdin.unwrap_or_default().into_bytes(), args.timeout_ms) {
                Ok(r) => r,
                Err(e) => return refused(ApiError::invalid(e.to_string())),
            };
        let started = Instant::now();
        match usecase::exec_in_sandbox(&self.state.deps, &actor, &org, &sandbox, &request).await {
            Ok(out) => {
                self.state.metrics.observe_exec(
                    if out.timed_out { "timed_out" } else { "ok" },
                    started.elapsed().as_secs_f64(),
                );
                let (stdout, stdout_left) = head(&out.stdout, TEXT_CAP);
                let (stderr, stderr_left) = head(&out.stderr, TEXT_CAP);
                let body = json!({
                    "exit_code": out.exit_code,
                    "timed_out": out.timed_out,
                    "stdout": stdout,
                    "stderr": stderr,
                    "stdout_bytes_left_out": stdout_left,
                    "stderr_bytes_left_out": stderr_left,
                    "truncated_by_server": out.truncated,
                });
                Ok(CallToolResult::success(vec![ContentBlock::text(body.to_string())]))
            }
            Err(e) => refused(exec_failure(&self.state, &org, started.elapsed().as_secs_f64(), e)),
        }
    }

    #[tool(description = "Read a file in a sandbox (beneath /workspace or /tmp), as an embedded resource: \
                          text when it is UTF-8, else base64; at most 1 MiB here.")]
    async fn read_file(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<PathArgs>,
    ) -> ToolResult {
        let (actor, org, sandbox) = or_refused!(place(&ctx, args.target));
        let path = or_refused!(parse_path(&args.path));
        let outcome = match usecase::read_path(&self.state.deps, &actor, &org, &sandbox, &path).await {
            Ok(o) => o,
            Err(e) => return refused(e.into()),
        };
        let ReadOutcome::File { size, mut contents } = outcome else {
            return refused(ApiError::invalid(format!("{path} is a directory; list it with list_files")));
        };
        let mut bytes = Vec::new();
        while bytes.len() < FILE_CAP {
            match contents.next().await {
                Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(e) => return refused(ApiError::unavailable(format!("reading {path} failed: {e}"))),
            }
        }
        drop(contents);
        bytes.truncate(FILE_CAP);
        let uri = format!("sandlane://{org}/{sandbox}{path}");
        let shown = bytes.len() as u64;
        let resource = match String::from_utf8(bytes) {
            Ok(text) => ResourceContents::text(text, uri),
            Err(e) => {
                ResourceContents::blob(base64::engine::general_purpose::STANDARD.encode(e.as_bytes()), uri)
                    .with_mime_type("application/octet-stream")
            }
        };
        let mut content = vec![ContentBlock::resource(resource)];
        if shown < size {
            content.push(ContentBlock::text(format!(
                "the file has {size} bytes; the first {shown} are shown (the cap here is {FILE_CAP})"
            )));
        }
        Ok(CallToolResult::success(content))
    }

    #[tool(description = "Write a whole file in a sandbox (beneath /workspace or /tmp; parents created).")]
    async fn write_file(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<WriteArgs>,
    ) -> ToolResult {
        let (actor, org, sandbox) = or_refused!(place(&ctx, args.target));
        let path = or_refused!(parse_path(&args.path));
        let bytes = match args.encoding.as_deref() {
            None | Some("text") => args.content.into_bytes(),
            Some("base64") => match base64::engine::general_purpose::STANDARD.decode(args.content) {
                Ok(b) => b,
                Err(e) => return refused(ApiError::invalid(format!("content is not base64: {e}"))),
            },
            Some(other) => {
                return refused(ApiError::invalid(format!(
                    "encoding must be `text` or `base64`, not `{other}`"
                )));
            }
        };
        let declared = bytes.len() as u64;
        let source = Box::new(Whole(Some(bytes)));
        match usecase::write_file(&self.state.deps, &actor, &org, &sandbox, &path, source, Some(declared))
            .await
        {
            Ok(written) => Ok(CallToolResult::success(vec![ContentBlock::text(
                json!({ "path": path.to_string(), "bytes": written }).to_string(),
            )])),
            Err(e) => refused(e.into()),
        }
    }

    #[tool(
        description = "List a directory in a sandbox (beneath /workspace or /tmp): name, type and size of \
                          each entry, sorted by name; at most 1000 entries here."
    )]
    async fn list_files(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<PathArgs>,
    ) -> ToolResult {
        let (actor, org, sandbox) = or_refused!(place(&ctx, args.target));
        let path = or_refused!(parse_path(&args.path));
        let outcome = match usecase::read_path(&self.state.deps, &actor, &org, &sandbox, &path).await {
            Ok(o) => o,
            Err(e) => return refused(e.into()),
        };
        let ReadOutcome::Directory(mut batches) = outcome else {
            return refused(ApiError::invalid(format!("{path} is a file; read it with read_file")));
        };
        let mut entries = Vec::new();
        let mut more = false;
        loop {
            match batches.next().await {
                Ok(Some(batch)) => {
                    for entry in batch {
                        if entries.len() == ENTRIES_CAP {
                            more = true;
                            break;
                        }
                        entries.push(EntryBody::from(entry));
                    }
                    if more {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => return refused(ApiError::unavailable(format!("listing {path} failed: {e}"))),
            }
        }
        let body = json!({ "path": path.to_string(), "entries": entries, "more_entries_left_out": more });
        Ok(CallToolResult::success(vec![ContentBlock::text(body.to_string())]))
    }

    #[tool(description = "Start a background process in a sandbox; it outlives this call. Read its output \
                          with process_output.")]
    async fn start_process(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<StartArgs>,
    ) -> ToolResult {
        let (actor, org, sandbox) = or_refused!(place(&ctx, args.target));
        let request = match ProcessRequest::new(
            args.argv,
            args.stdin.unwrap_or_default().into_bytes(),
            args.timeout_ms,
        ) {
            Ok(r) => r,
            Err(e) => return refused(ApiError::invalid(e.to_string())),
        };
        match usecase::start_process(&self.state.deps, &actor, &org, &sandbox, &request).await {
            Ok(info) => json_result(&ProcessBody::from(info)),
            Err(e) => refused(e.into()),
        }
    }

    #[tool(
        description = "A background process's output (the last 64 KiB of what is buffered, waiting up to \
                          wait_ms for more) and whether it still runs."
    )]
    async fn process_output(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<OutputArgs>,
    ) -> ToolResult {
        let (actor, org, sandbox) = or_refused!(place(&ctx, args.target));
        let wait = args.wait_ms.unwrap_or(0);
        if wait > MAX_WAIT_MS {
            return refused(ApiError::invalid(format!("wait_ms is at most {MAX_WAIT_MS}")));
        }
        let follow = wait > 0;
        let mut stream =
            match usecase::process_output(&self.state.deps, &actor, &org, &sandbox, args.pid, follow).await {
                Ok(s) => s,
                Err(e) => return refused(e.into()),
            };
        let mut tail = Tail::default();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait);
        loop {
            let next = if follow {
                match tokio::time::timeout_at(deadline, stream.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                }
            } else {
                stream.next().await
            };
            match next {
                Ok(Some(domain::OutputEvent::Stdout(bytes) | domain::OutputEvent::Stderr(bytes))) => {
                    tail.push(&bytes);
                }
                Ok(Some(domain::OutputEvent::Exit(_)) | None) => break,
                Err(e) => return refused(ApiError::unavailable(format!("reading the output failed: {e}"))),
            }
        }
        drop(stream);
        let info = match usecase::get_process(&self.state.deps, &actor, &org, &sandbox, args.pid).await {
            Ok(info) => info,
            Err(e) => return refused(e.into()),
        };
        let body = json!({
            "process": ProcessBody::from(info),
            "output": String::from_utf8_lossy(&tail.bytes),
            "earlier_bytes_left_out": tail.dropped,
        });
        Ok(CallToolResult::success(vec![ContentBlock::text(body.to_string())]))
    }

    #[tool(description = "Take a snapshot of a sandbox's workspace (its files at one instant); fork new \
                          sandboxes from it through the HTTP API.")]
    async fn snapshot(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SnapshotArgs>,
    ) -> ToolResult {
        let (actor, org, sandbox) = or_refused!(place(&ctx, args.target));
        let name = match args.name.map(SnapshotName::parse).transpose() {
            Ok(n) => n,
            Err(e) => return refused(ApiError::invalid(e.to_string())),
        };
        match usecase::take_snapshot(&self.state.deps, &actor, &org, &sandbox, name).await {
            Ok(snapshot) => json_result(&SnapshotBody::from(&snapshot)),
            Err(e) => refused(e.into()),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for LaneTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("sandlane", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Tools that act in sandlane sandboxes as the caller whose key (or sandbox token) \
                 this connection carries: run commands, read and write files, start and follow \
                 background processes, take snapshots. Each call names its sandbox_id.",
            )
    }
}

/// The caller (put there by the route's authentication), the org and the sandbox of a
/// call.
fn place(ctx: &RequestContext<RoleServer>, target: Target) -> Result<(Actor, OrgId, SandboxId), ApiError> {
    let principal = ctx
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Principal>())
        .ok_or_else(|| ApiError::unauthenticated("missing Authorization: Bearer <key>"))?;
    let actor = principal.0.clone();
    let org = match target.org {
        Some(org) => OrgId::parse(org)?,
        None => match &actor {
            Actor::SandboxToken { org, .. } => org.clone(),
            Actor::Caller(identity) => match identity.orgs() {
                [one] => one.clone(),
                _ => return Err(ApiError::invalid("name the org: this caller acts in more than one")),
            },
        },
    };
    let sandbox = SandboxId::parse(target.sandbox_id)?;
    Ok((actor, org, sandbox))
}

fn parse_path(text: &str) -> Result<SandboxPath, ApiError> {
    SandboxPath::parse(text).map_err(|e| ApiError::invalid(e.to_string()))
}

/// A use case's refusal as a tool result the model reads: the API's error body.
#[allow(clippy::unnecessary_wraps)]
fn refused(e: ApiError) -> ToolResult {
    let body = ErrorBody {
        error: e.code,
        message: e.message,
        trace_id: crate::telemetry::current_trace_id().map(|t| t.as_str().to_owned()),
    };
    let text = serde_json::to_string(&body).unwrap_or_else(|_| body.message.clone());
    Ok(CallToolResult::error(vec![ContentBlock::text(text)]))
}

fn json_result(value: &impl serde::Serialize) -> ToolResult {
    Ok(CallToolResult::success(vec![ContentBlock::json(value)?]))
}

/// The first `cap` bytes of `bytes` as text (cut on a character boundary), and how many
/// bytes were left out.
fn head(bytes: &[u8], cap: usize) -> (String, usize) {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(cap)]).into_owned();
    let text = if bytes.len() > cap {
        // A character cut in two at the cap shows as one replacement character: drop it.
        text.trim_end_matches('\u{FFFD}').to_owned()
    } else {
        text
    };
    (text, bytes.len().saturating_sub(cap))
}

/// The last [`TEXT_CAP`] bytes of an output, and how many came before them.
#[derive(Default)]
struct Tail {
    bytes: Vec<u8>,
    dropped: u64,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > TEXT_CAP {
            let excess = self.bytes.len() - TEXT_CAP;
            self.bytes.drain(..excess);
            self.dropped += excess as u64;
        }
    }
}

/// A file's contents given whole (a tool call's argument is already in memory).
struct Whole(Option<Vec<u8>>);

#[async_trait::async_trait]
impl ByteSource for Whole {
    async fn next(&mut self) -> Result<Option<Vec<u8>>, SourceError> {
        Ok(self.0.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_cuts_at_the_cap_on_a_character_boundary_and_counts_the_rest() {
        assert_eq!(head(b"hello", 10), ("hello".to_owned(), 0));
        assert_eq!(head(b"hello", 3), ("hel".to_owned(), 2));
        // "é" is two bytes: a cap through its middle drops it whole from the text.
        assert_eq!(head("aé".as_bytes(), 2), ("a".to_owned(), 1));
    }

    #[test]
    fn a_tail_keeps_the_last_bytes_and_counts_what_went() {
        let mut tail = Tail::default();
        tail.push(&vec![b'a'; TEXT_CAP]);
        tail.push(b"xyz");
        assert_eq!(tail.bytes.len(), TEXT_CAP);
        assert!(tail.bytes.ends_with(b"axyz"));
        assert_eq!(tail.dropped, 3);
    }
}
