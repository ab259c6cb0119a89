//! The terminal routes: start, list, read or attach (a WebSocket), end, and tickets for
//! attaching from a browser. Each parses, calls one use case ([`crate::usecase`]'s
//! terminals) and maps; the attach then relays the WebSocket.
//!
//! # The WebSocket
//! `GET …/terminals/{terminal_id}` with `Upgrade: websocket` is upgraded by hyper itself
//! (the connection's own upgrade, [`hyper::upgrade::on`]) and spoken with
//! `tokio-tungstenite`: binary messages carry the terminal's bytes both ways; text messages
//! are JSON control messages (`{"type":"resize","cols","rows"}` in; `{"type":"exit",
//! "exit_code"}` out, then the close). The server keeps one frame of output in flight: it
//! pulls the next from the sandbox only once the last is written to the client, so a slow
//! reader holds the supervisor's bounded buffer, never the server's memory (and a reader
//! that fell behind skips ahead, its oldest output gone). A browser cannot set headers on
//! a WebSocket, so the credential may come as the `access_token` query parameter: a caller
//! key, a sandbox token, or a ticket (`POST …/tickets`), good once.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use domain::id::terminal_id_pattern;
use domain::{Actor, OutputEvent, TerminalId, TerminalInfo, TerminalInput, TerminalRequest, TerminalSize};
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};
use tracing::debug;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{IntoParams, PartialSchema, ToSchema};

use super::AppState;
use super::auth::{Principal, authenticate};
use super::dto::{Id, SandboxId as SandboxIdSchema, argv_schema};
use super::error::{ApiError, ErrorBody};
use super::ndjson::{Shutdown, operation_error};
use super::processes::ids;
use crate::usecase::standing::{self, Standing};
use crate::usecase::{self, Attached, TICKET_PREFIX, TicketError};

/// The schema of a terminal id.
pub struct TerminalIdSchema;

impl PartialSchema for TerminalIdSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("`term_` then 26 Crockford base32 characters (time-ordered)"))
            .pattern(Some(terminal_id_pattern()))
            .examples(["term_01KA2B3C4D5E6F7G8H9JKMNPQR"])
            .into()
    }
}

impl ToSchema for TerminalIdSchema {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("TerminalId")
    }
}

/// The path of a terminal.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TerminalPath {
    /// The org the sandbox belongs to.
    #[param(value_type = Id)]
    pub org: String,
    /// The sandbox.
    #[param(value_type = SandboxIdSchema)]
    pub sandbox_id: String,
    /// The terminal.
    #[param(value_type = TerminalIdSchema)]
    pub terminal_id: String,
}

fn side_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(1))
        .maximum(Some(f64::from(domain::terminal::MAX_TERMINAL_SIDE)))
        .into()
}

/// A terminal to start.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartTerminalBody {
    /// The program and its arguments; absent: the sandbox's shell (`bash` where it has
    /// one, else `sh`), interactive.
    #[schema(schema_with = argv_schema)]
    pub argv: Option<Vec<String>>,
    /// Columns, 1 to 1000.
    #[schema(schema_with = side_schema)]
    #[serde(deserialize_with = "whole")]
    pub cols: u64,
    /// Rows, 1 to 1000.
    #[schema(schema_with = side_schema)]
    #[serde(deserialize_with = "whole")]
    pub rows: u64,
}

/// A JSON Schema `integer` is any number with no fraction, `80.0` as well as `80`: accept
/// what the schema promises (a side out of bounds is refused by the domain's rule).
fn whole<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let number = serde_json::Number::deserialize(d)?;
    if let Some(n) = number.as_u64() {
        return Ok(n);
    }
    match number.as_f64() {
        Some(f) if f.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&f) => Ok(f as u64),
        _ => Err(serde::de::Error::custom(format!("{number} is not a whole number of character cells"))),
    }
}

/// A terminal.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TerminalBody {
    /// Its id.
    #[schema(value_type = TerminalIdSchema)]
    pub id: String,
    /// Its process's pid inside the sandbox (and its process group's id).
    pub pid: u32,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// Whether it still runs.
    pub running: bool,
    /// Its exit status once ended (`128 + signal` when a signal ended it); null while it
    /// runs.
    pub exit_code: Option<i32>,
}

impl From<TerminalInfo> for TerminalBody {
    fn from(t: TerminalInfo) -> Self {
        Self {
            id: t.id.to_string(),
            pid: t.process.pid,
            argv: t.process.argv,
            running: t.process.running,
            exit_code: t.process.exit_code,
        }
    }
}

/// The sandbox's terminals.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TerminalListBody {
    /// Running ones and ended ones the sandbox still keeps.
    pub terminals: Vec<TerminalBody>,
}

/// A ticket for attaching a terminal once.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TicketBody {
    /// The ticket: pass it as `access_token` to the attach, within its minute; good once.
    pub ticket: String,
    /// When it expires (RFC 3339).
    pub expires_at: String,
}

/// The query of an attach.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AttachQuery {
    /// A credential for clients that cannot set headers (browsers on a WebSocket): a
    /// ticket from `POST …/tickets` (good once), or a caller key. Instead of the
    /// `Authorization` header.
    pub access_token: Option<String>,
}

fn terminal_ids(
    org: String,
    sandbox_id: String,
    terminal_id: String,
) -> Result<(domain::OrgId, domain::SandboxId, TerminalId), ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    Ok((org, sandbox_id, TerminalId::parse(terminal_id)?))
}

/// Start a terminal.
#[utoipa::path(
    post, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/terminals", tag = "terminals",
    params(super::dto::SandboxPath),
    request_body = StartTerminalBody,
    responses(
        (status = 201, description = "started; it outlives this request (and a restart of the server), not the sandbox", body = TerminalBody,
            links(
                ("get_terminal" = (operation_id = "get_terminal", parameters(("org" = "$request.path.org"),
                    ("sandbox_id" = "$request.path.sandbox_id"), ("terminal_id" = "$response.body#/id")))),
                ("create_ticket" = (operation_id = "create_ticket", parameters(("org" = "$request.path.org"),
                    ("sandbox_id" = "$request.path.sandbox_id"), ("terminal_id" = "$response.body#/id")))),
                ("delete_terminal" = (operation_id = "delete_terminal", parameters(("org" = "$request.path.org"),
                    ("sandbox_id" = "$request.path.sandbox_id"), ("terminal_id" = "$response.body#/id")))),
            )),
        (status = 400, description = "an id in the path, the command or the size breaks the rules", body = ErrorBody),
        (status = 403, description = "the caller may not exec in this sandbox", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org, or no such program in it", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready, or the program cannot be started (not executable)", body = ErrorBody),
        (status = 429, description = "resource_exhausted: a command quota of the org's policy is used up (a terminal holds its place until it ends), resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes), or the sandbox keeps its most background processes, all running, or their output buffers are used up", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create_terminal(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id)): Path<(String, String)>,
    Json(b): Json<StartTerminalBody>,
) -> Result<(StatusCode, Json<TerminalBody>), ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    let request =
        TerminalRequest::new(b.argv, b.cols, b.rows).map_err(|e| ApiError::invalid(e.to_string()))?;
    let info = usecase::create_terminal(&state.deps, &principal.0, &org, &sandbox_id, &request)
        .await
        .map_err(operation_error(&state, &org))?;
    Ok((StatusCode::CREATED, Json(info.into())))
}

/// List the sandbox's terminals.
#[utoipa::path(
    get, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/terminals", tag = "terminals",
    params(super::dto::SandboxPath),
    responses(
        (status = 200, description = "running ones, and ended ones the sandbox still keeps", body = TerminalListBody),
        (status = 400, description = "an id in the path breaks the id rules", body = ErrorBody),
        (status = 403, description = "the caller may not exec in this sandbox", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready", body = ErrorBody),
        (status = 429, description = "resource_exhausted: resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_terminals(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id)): Path<(String, String)>,
) -> Result<Json<TerminalListBody>, ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    let list = usecase::list_terminals(&state.deps, &principal.0, &org, &sandbox_id)
        .await
        .map_err(operation_error(&state, &org))?;
    Ok(Json(TerminalListBody { terminals: list.into_iter().map(Into::into).collect() }))
}

/// Read a terminal, or attach to it: with `Upgrade: websocket`, the connection becomes a
/// WebSocket on the terminal (binary messages: its bytes both ways; text: JSON control
/// messages, `{"type":"resize","cols","rows"}` in, `{"type":"exit","exit_code"}` out
/// before the close). The output starts with the last 64 KiB the terminal wrote. Closing
/// the WebSocket detaches; the terminal runs on.
#[utoipa::path(
    get, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/terminals/{terminal_id}", tag = "terminals",
    params(TerminalPath, AttachQuery),
    responses(
        (status = 101, description = "with `Upgrade: websocket`: attached; the connection is a WebSocket on the terminal (see the operation's description)"),
        (status = 200, description = "without an upgrade: the terminal", body = TerminalBody),
        (status = 400, description = "an id in the path breaks the rules, or the upgrade is not a WebSocket's", body = ErrorBody),
        (status = 401, description = "no credential, or one that does not authenticate (a ticket used, expired, or for another terminal)", body = ErrorBody),
        (status = 403, description = "the caller may not exec in this sandbox", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org, or no such terminal in it", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready", body = ErrorBody),
        (status = 429, description = "resource_exhausted: resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
    ),
    security(("bearer" = []), ())
)]
pub async fn get_terminal(
    State(state): State<Arc<AppState>>,
    Path((org, sandbox_id, terminal_id)): Path<(String, String, String)>,
    Query(q): Query<AttachQuery>,
    mut request: Request,
) -> Result<Response, ApiError> {
    let (org, sandbox_id, terminal_id) = terminal_ids(org, sandbox_id, terminal_id)?;
    let actor = match q.access_token.as_deref() {
        Some(ticket) if ticket.starts_with(TICKET_PREFIX) => {
            usecase::redeem_ticket(&state.deps, ticket, &org, &sandbox_id, &terminal_id).await.map_err(
                |e| match e {
                    e @ TicketError::Refused => ApiError::unauthenticated(e.to_string()),
                    e @ (TicketError::Store(_) | TicketError::Directory(_)) => ApiError::unavailable_from(&e),
                },
            )?
        }
        Some(credential) => authenticate(&state, credential).await?,
        None => {
            let (mut parts, body) = request.into_parts();
            let principal =
                <Principal as axum::extract::FromRequestParts<Arc<AppState>>>::from_request_parts(
                    &mut parts, &state,
                )
                .await?;
            request = Request::from_parts(parts, body);
            principal.0
        }
    };
    if !wants_websocket(request.headers()) {
        let info = usecase::get_terminal(&state.deps, &actor, &org, &sandbox_id, &terminal_id)
            .await
            .map_err(operation_error(&state, &org))?;
        return Ok(Json(TerminalBody::from(info)).into_response());
    }
    let key = websocket_key(request.headers())?;
    let attached = usecase::attach_terminal(&state.deps, &actor, &org, &sandbox_id, &terminal_id)
        .await
        .map_err(operation_error(&state, &org))?;
    let on_upgrade = hyper::upgrade::on(&mut request);
    let shutdown = state.shutdown.clone();
    let lapsed = standing::lapsed(state.deps.clone(), standing_of(&actor));
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(websocket_config()),
                )
                .await;
                tokio::select! {
                    () = relay(ws, attached, &shutdown) => {}
                    () = lapsed => {}
                }
            }
            Err(e) => debug!(error = %e, "a terminal's upgrade failed"),
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    Ok(response)
}

/// The most bytes one message from a terminal's client may hold (keystrokes, a paste, a
/// resize): a larger one closes the connection (1009), so that no client makes the server
/// hold more per terminal than this (the library's default is 64 MiB).
pub const MAX_CLIENT_MESSAGE: usize = 1 << 20;

/// How long one input of a client may wait for the program to take it before the client
/// is detached (see the relay).
pub const INPUT_STALL: std::time::Duration = std::time::Duration::from_secs(30);

/// The WebSocket settings of an attached terminal.
fn websocket_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_CLIENT_MESSAGE))
        .max_frame_size(Some(MAX_CLIENT_MESSAGE))
}

/// Whether the request asks for a WebSocket.
fn wants_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|p| p.trim().eq_ignore_ascii_case("websocket")))
}

/// The handshake's key, once the rest of the handshake is checked.
fn websocket_key(headers: &HeaderMap) -> Result<HeaderValue, ApiError> {
    let upgrade = headers
        .get(header::CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|p| p.trim().eq_ignore_ascii_case("upgrade")));
    let version = headers.get(header::SEC_WEBSOCKET_VERSION).is_some_and(|v| v.as_bytes() == b"13");
    match headers.get(header::SEC_WEBSOCKET_KEY) {
        Some(key) if upgrade && version => Ok(key.clone()),
        _ => Err(ApiError::invalid(
            "a WebSocket handshake needs Connection: upgrade, Sec-WebSocket-Version: 13 and a Sec-WebSocket-Key",
        )),
    }
}

/// A control message from the client.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Control {
    Resize { cols: u64, rows: u64 },
}

/// Relays an attached terminal over `ws` until the terminal ends (its exit sent, then the
/// close), the client goes away (a detach), or the server stops.
async fn relay<S>(ws: WebSocketStream<S>, attached: Attached, shutdown: &Shutdown)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let Attached { mut output, input, .. } = attached;
    let (mut sink, mut incoming) = ws.split();
    let stopping = shutdown.stopping();
    tokio::pin!(stopping);
    let outbound = async {
        loop {
            // One frame in flight: the next is pulled once this one is written.
            match output.next().await {
                Ok(Some(OutputEvent::Stdout(bytes) | OutputEvent::Stderr(bytes))) => {
                    if sink.send(Message::Binary(bytes.into())).await.is_err() {
                        return;
                    }
                }
                Ok(Some(OutputEvent::Exit(status))) => {
                    let exit = serde_json::json!({"type": "exit", "exit_code": status.exit_code}).to_string();
                    let _ = sink.send(Message::Text(Utf8Bytes::from(exit))).await;
                    let _ = sink.close().await;
                    return;
                }
                Ok(None) | Err(_) => {
                    let _ = sink.close().await;
                    return;
                }
            }
        }
    };
    let inbound = async {
        let mut input = input;
        while let Some(Ok(message)) = incoming.next().await {
            let to_send = match message {
                Message::Binary(bytes) => Some(TerminalInput::Bytes(bytes.to_vec())),
                Message::Text(text) => match serde_json::from_str::<Control>(text.as_str()) {
                    // A size out of bounds is ignored.
                    Ok(Control::Resize { cols, rows }) => {
                        TerminalSize::new(cols, rows).ok().map(TerminalInput::Resize)
                    }
                    Err(_) => None,
                },
                Message::Close(_) => return,
                _ => None,
            };
            let sent = match (to_send, input.as_mut()) {
                // While a send waits, the client's connection is not read: a program that
                // takes no input for this long ends the attachment, so a client that went
                // away behind it is noticed (the terminal runs on).
                (Some(to_send), Some(input)) => {
                    match tokio::time::timeout(INPUT_STALL, input.send(to_send)).await {
                        Ok(sent) => sent,
                        Err(_) => {
                            debug!("a terminal took no input for {INPUT_STALL:?}: the client is detached");
                            return;
                        }
                    }
                }
                // Nothing to send, or a terminal already ended.
                _ => Ok(()),
            };
            if sent.is_err() {
                // The terminal ended; its output says how.
                input = None;
            }
        }
    };
    tokio::select! {
        () = outbound => {}
        () = inbound => {}
        () = &mut stopping => {}
    }
}

/// Ask for a ticket to attach a terminal once.
#[utoipa::path(
    post, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/terminals/{terminal_id}/tickets", tag = "terminals",
    params(TerminalPath),
    responses(
        (status = 201, description = "a ticket for this caller and this terminal, good once within 60 s (as the attach's access_token)", body = TicketBody),
        (status = 400, description = "an id in the path breaks the rules", body = ErrorBody),
        (status = 403, description = "the caller may not exec in this sandbox, or is a sandbox token (which needs no ticket)", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org, or no such terminal in it", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready", body = ErrorBody),
        (status = 429, description = "resource_exhausted: resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create_ticket(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id, terminal_id)): Path<(String, String, String)>,
) -> Result<(StatusCode, Json<TicketBody>), ApiError> {
    let (org, sandbox_id, terminal_id) = terminal_ids(org, sandbox_id, terminal_id)?;
    let caller = match &principal.0 {
        Actor::Caller(caller) => caller,
        Actor::SandboxToken { .. } => {
            return Err(ApiError::denied(
                "a sandbox token needs no ticket: pass it as the attach's access_token itself",
            ));
        }
    };
    let ticket = usecase::issue_ticket(&state.deps, caller, &org, &sandbox_id, &terminal_id)
        .await
        .map_err(operation_error(&state, &org))?;
    Ok((
        StatusCode::CREATED,
        Json(TicketBody { ticket: ticket.ticket, expires_at: ticket.expires_at.to_rfc3339() }),
    ))
}

/// End a terminal (its process group is killed).
#[utoipa::path(
    delete, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/terminals/{terminal_id}", tag = "terminals",
    params(TerminalPath),
    responses(
        (status = 204, description = "ended (or it had ended already)"),
        (status = 400, description = "an id in the path breaks the rules", body = ErrorBody),
        (status = 403, description = "the caller may not exec in this sandbox", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org, or no such terminal in it", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready", body = ErrorBody),
        (status = 429, description = "resource_exhausted: resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn delete_terminal(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id, terminal_id)): Path<(String, String, String)>,
) -> Result<StatusCode, ApiError> {
    let (org, sandbox_id, terminal_id) = terminal_ids(org, sandbox_id, terminal_id)?;
    usecase::delete_terminal(&state.deps, &principal.0, &org, &sandbox_id, &terminal_id)
        .await
        .map_err(operation_error(&state, &org))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Whom an attachment stands for: the caller, or for a sandbox token the caller it acts
/// for (a leaked token's attachment does not outlive its subject's revocation).
fn standing_of(actor: &Actor) -> Standing {
    match actor {
        Actor::Caller(caller) => Standing::Caller(caller.identity_id().clone()),
        Actor::SandboxToken { subject, .. } => Standing::Caller(subject.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An attachment made with a sandbox token lapses with the caller the token acts for.
    #[test]
    fn a_tokens_attachment_stands_for_its_subject() {
        let subject = domain::IdentityId::parse("user-ada").unwrap();
        let token = Actor::SandboxToken {
            org: domain::OrgId::parse("acme").unwrap(),
            sandbox_id: domain::SandboxId::generate(1, 2),
            subject: subject.clone(),
        };
        assert!(matches!(standing_of(&token), Standing::Caller(id) if id == subject));
    }

    /// A client's message over the cap ends the connection on the server's side; one at
    /// the cap is read.
    #[tokio::test]
    async fn a_clients_message_over_the_cap_is_refused() {
        let (server, client) = tokio::io::duplex(64 << 10);
        let mut server =
            WebSocketStream::from_raw_socket(server, Role::Server, Some(websocket_config())).await;
        let mut client = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
        let sending = tokio::spawn(async move {
            client.send(Message::Binary(vec![b'a'; MAX_CLIENT_MESSAGE].into())).await.unwrap();
            let _ = client.send(Message::Binary(vec![b'b'; MAX_CLIENT_MESSAGE + 1].into())).await;
            client
        });
        match server.next().await {
            Some(Ok(Message::Binary(bytes))) => assert_eq!(bytes.len(), MAX_CLIENT_MESSAGE),
            other => panic!("the message at the cap: {other:?}"),
        }
        let over = server.next().await;
        assert!(matches!(over, Some(Err(_))), "the message over the cap: {over:?}");
        drop(server);
        let _ = sending.await;
    }

    /// Output that never comes.
    struct Silent;

    #[async_trait::async_trait]
    impl ports::OutputStream for Silent {
        async fn next(&mut self) -> Result<Option<OutputEvent>, ports::DriverError> {
            std::future::pending().await
        }
    }

    /// A program that never takes its input (its terminal's buffer full).
    struct Stuck;

    #[async_trait::async_trait]
    impl ports::ProcessInput for Stuck {
        async fn send(&mut self, _: TerminalInput) -> Result<(), ports::DriverError> {
            std::future::pending().await
        }
    }

    /// A client whose input the program does not take, and who then goes away, is
    /// detached after [`INPUT_STALL`] (not kept until the program ends).
    #[tokio::test(start_paused = true)]
    async fn a_client_behind_input_the_program_does_not_take_is_detached() {
        let (server, client) = tokio::io::duplex(64 << 10);
        let server = WebSocketStream::from_raw_socket(server, Role::Server, Some(websocket_config())).await;
        let mut client = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
        let attached = Attached {
            terminal: TerminalInfo {
                id: TerminalId::generate(1, 1),
                process: domain::ProcessInfo {
                    pid: 2,
                    argv: vec!["sh".into()],
                    running: true,
                    exit_code: None,
                    timed_out: false,
                    terminal: Some(TerminalId::generate(1, 1)),
                },
            },
            output: Box::new(Silent),
            input: Some(Box::new(Stuck)),
        };
        client.send(Message::Binary(b"pasted".to_vec().into())).await.unwrap();
        drop(client);
        let started = tokio::time::Instant::now();
        relay(server, attached, &super::super::ndjson::Shutdown::default()).await;
        assert_eq!(started.elapsed(), INPUT_STALL);
    }
}
