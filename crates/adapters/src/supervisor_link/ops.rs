//! The driver port's streaming, process and file operations, written once for every
//! driver that runs the supervisor (bubblewrap, containers, Kubernetes): a driver says
//! how a sandbox's supervisor is reached (a unix socket's path, a port-forward through the
//! API server: any [`Connect`]), how a command is specified in it, and how it cleans up
//! after a sandbox whose supervisor is gone ([`Host`]); the rest is here.

use std::time::Duration;

use async_trait::async_trait;
use domain::{
    ExecRequest, ExitStatus, OutputEvent, ProcessCaps, ProcessInfo, ProcessRequest, SandboxId, SandboxPath,
    Signal, TerminalId,
};
use ports::driver::{ByteSource, ByteStream, DriverError, OutputStream, ProcessInput, ReadOutcome, Unpacked};

use super::client::{self, ClientError, Connect, FileRead};
use super::listener::ProxyListener;
use supervisor::protocol::{ExecSpec, ProcessStart, ProcessStatus, TerminalStart};

/// What a driver gives the shared operations.
#[async_trait]
pub(crate) trait Host: Send + Sync {
    /// How a supervisor is reached: one new connection per operation.
    type Target: Connect + Sized;

    /// Where the supervisor of a sandbox the driver holds is reached.
    ///
    /// # Errors
    /// [`DriverError::NotFound`] for one it does not hold.
    async fn socket(&self, sandbox: &SandboxId) -> Result<Self::Target, DriverError>;

    /// A command in the sandbox: its environment, working directory, limits and output cap
    /// (as for exec), with `argv`, `timeout_ms` (0: none) and whether input is fed.
    ///
    /// # Errors
    /// [`DriverError::NotFound`] for an unknown sandbox.
    async fn command(
        &self,
        sandbox: &SandboxId,
        argv: &[String],
        timeout_ms: u64,
        stdin: bool,
    ) -> Result<ExecSpec, DriverError>;

    /// Cleans up after a sandbox whose supervisor is gone; the error to report.
    async fn supervisor_gone(&self, sandbox: &SandboxId, why: &ClientError) -> DriverError;

    /// The port's error for a failed operation on `sandbox` (`pid`: the background
    /// process it named): by default, a supervisor that is gone is cleaned up after
    /// ([`Host::supervisor_gone`]) and the rest is mapped by [`client::driver_error`]. A
    /// driver whose channel can fail without saying the supervisor is gone (a port-forward
    /// to a pod that has ended) looks further first.
    async fn failure(&self, sandbox: &SandboxId, pid: Option<u32>, e: ClientError) -> DriverError {
        match e {
            e @ ClientError::Gone(_) => self.supervisor_gone(sandbox, &e).await,
            e => client::driver_error(e, sandbox, pid),
        }
    }

    /// The egress proxy's listening socket, opened by the server in the sandbox's network
    /// namespace ([`super::listener`]); `None` where the supervisor listens on the proxy's
    /// port itself and hands its clients over (the default: a Kubernetes pod's namespace is
    /// on another machine).
    ///
    /// # Errors
    /// [`DriverError::NotFound`] for a sandbox that ended; why the socket cannot be opened.
    async fn proxy_listener(&self, sandbox: &SandboxId) -> Result<Option<ProxyListener>, DriverError> {
        let _ = sandbox;
        Ok(None)
    }

    /// What the proxy needs to broker TLS for `sandbox`: where its CA is found and how
    /// upstream servers are verified (by default: no CA, brokered `CONNECT`s refused).
    async fn broker_tls(&self, sandbox: &SandboxId) -> crate::egress::BrokerTls {
        let _ = sandbox;
        crate::egress::BrokerTls::without_ca()
    }

    /// How long connecting to a live supervisor may take.
    fn connect_timeout(&self) -> Duration;

    /// How long past a command's timeout its supervisor's answer may take.
    fn grace(&self) -> Duration;
}

/// The port's error for `e`, cleaning up after a supervisor that is gone.
async fn fail(host: &impl Host, sandbox: &SandboxId, pid: Option<u32>, e: ClientError) -> DriverError {
    host.failure(sandbox, pid, e).await
}

fn info(status: ProcessStatus) -> ProcessInfo {
    ProcessInfo {
        pid: status.pid,
        argv: status.argv,
        running: status.running,
        exit_code: status.exit_code,
        timed_out: status.timed_out,
        // An id the server did not make is no terminal of its.
        terminal: status.terminal.and_then(|id| TerminalId::parse(id).ok()),
    }
}

/// The output of a command that could not start: its reason on standard error and exit
/// code 127, as a buffered exec reports it.
struct NotStarted {
    events: Vec<OutputEvent>,
}

#[async_trait]
impl OutputStream for NotStarted {
    async fn next(&mut self) -> Result<Option<OutputEvent>, DriverError> {
        Ok(if self.events.is_empty() { None } else { Some(self.events.remove(0)) })
    }
}

pub(crate) async fn exec_stream(
    host: &impl Host,
    sandbox: &SandboxId,
    request: &ExecRequest,
) -> Result<Box<dyn OutputStream>, DriverError> {
    let spec =
        host.command(sandbox, request.argv(), request.timeout_ms(), !request.stdin().is_empty()).await?;
    let socket = host.socket(sandbox).await?;
    match client::exec_stream(&socket, &spec, request.stdin().to_vec(), host.connect_timeout(), host.grace())
        .await
    {
        Ok(stream) => Ok(Box::new(stream.for_sandbox(sandbox))),
        Err(ClientError::Refused { code, message }) if code == "spawn" => Ok(Box::new(NotStarted {
            events: vec![
                OutputEvent::Stderr(message.into_bytes()),
                OutputEvent::Exit(ExitStatus { exit_code: 127, timed_out: false, truncated: false }),
            ],
        })),
        Err(e) => Err(fail(host, sandbox, None, e).await),
    }
}

pub(crate) async fn start_process(
    host: &impl Host,
    sandbox: &SandboxId,
    request: &ProcessRequest,
    caps: &ProcessCaps,
) -> Result<ProcessInfo, DriverError> {
    let mut spec = host.command(sandbox, request.argv(), request.timeout_ms().unwrap_or(0), true).await?;
    let terminal = request.terminal().map(|(id, size)| {
        spec.env.retain(|(k, _)| k != "TERM");
        spec.env.push(("TERM".to_owned(), domain::terminal::TERM.to_owned()));
        TerminalStart { id: id.to_string(), cols: size.cols(), rows: size.rows() }
    });
    let socket = host.socket(sandbox).await?;
    let start = ProcessStart {
        spec,
        buffer_bytes: caps.buffer_bytes,
        max_processes: caps.max_processes,
        max_buffered_bytes: caps.max_buffered_bytes,
        terminal,
    };
    match client::process_start(&socket, &start, request.stdin(), host.connect_timeout()).await {
        Ok(status) => Ok(info(status)),
        Err(e) => Err(fail(host, sandbox, None, e).await),
    }
}

pub(crate) async fn list_processes(
    host: &impl Host,
    sandbox: &SandboxId,
) -> Result<Vec<ProcessInfo>, DriverError> {
    let socket = host.socket(sandbox).await?;
    match client::process_list(&socket, host.connect_timeout()).await {
        Ok(list) => Ok(list.into_iter().map(info).collect()),
        Err(e) => Err(fail(host, sandbox, None, e).await),
    }
}

pub(crate) async fn process(
    host: &impl Host,
    sandbox: &SandboxId,
    pid: u32,
) -> Result<ProcessInfo, DriverError> {
    let socket = host.socket(sandbox).await?;
    match client::process_status(&socket, pid, host.connect_timeout()).await {
        Ok(status) => Ok(info(status)),
        Err(e) => Err(fail(host, sandbox, Some(pid), e).await),
    }
}

pub(crate) async fn process_output(
    host: &impl Host,
    sandbox: &SandboxId,
    pid: u32,
    follow: bool,
) -> Result<Box<dyn OutputStream>, DriverError> {
    let socket = host.socket(sandbox).await?;
    match client::process_output(&socket, sandbox, pid, follow, host.connect_timeout()).await {
        Ok(stream) => Ok(Box::new(stream)),
        Err(e) => Err(fail(host, sandbox, Some(pid), e).await),
    }
}

pub(crate) async fn write_stdin(
    host: &impl Host,
    sandbox: &SandboxId,
    pid: u32,
    bytes: &[u8],
    close: bool,
) -> Result<(), DriverError> {
    let socket = host.socket(sandbox).await?;
    match client::process_stdin(&socket, pid, bytes, close, host.connect_timeout()).await {
        Ok(()) => Ok(()),
        Err(e) => Err(fail(host, sandbox, Some(pid), e).await),
    }
}

pub(crate) async fn signal_process(
    host: &impl Host,
    sandbox: &SandboxId,
    pid: u32,
    signal: Signal,
) -> Result<(), DriverError> {
    let socket = host.socket(sandbox).await?;
    match client::process_signal(&socket, pid, signal.as_str(), host.connect_timeout()).await {
        Ok(()) => Ok(()),
        Err(e) => Err(fail(host, sandbox, Some(pid), e).await),
    }
}

pub(crate) async fn process_input(
    host: &impl Host,
    sandbox: &SandboxId,
    pid: u32,
) -> Result<Box<dyn ProcessInput>, DriverError> {
    let socket = host.socket(sandbox).await?;
    match client::process_input(&socket, sandbox, pid, host.connect_timeout()).await {
        Ok(input) => Ok(Box::new(input)),
        Err(e) => Err(fail(host, sandbox, Some(pid), e).await),
    }
}

pub(crate) async fn read_path(
    host: &impl Host,
    sandbox: &SandboxId,
    path: &SandboxPath,
) -> Result<ReadOutcome, DriverError> {
    let socket = host.socket(sandbox).await?;
    match client::file_read(&socket, sandbox, &path.to_string(), host.connect_timeout()).await {
        Ok(FileRead::File(size, contents)) => Ok(ReadOutcome::File { size, contents: Box::new(contents) }),
        Ok(FileRead::Directory(listing)) => Ok(ReadOutcome::Directory(Box::new(listing))),
        Err(e) => Err(fail(host, sandbox, None, e).await),
    }
}

pub(crate) async fn write_file(
    host: &impl Host,
    sandbox: &SandboxId,
    path: &SandboxPath,
    contents: Box<dyn ByteSource>,
) -> Result<u64, DriverError> {
    let socket = host.socket(sandbox).await?;
    match client::file_write(&socket, &path.to_string(), contents, host.connect_timeout()).await {
        Ok(bytes) => Ok(bytes),
        Err(e) => Err(fail(host, sandbox, None, e).await),
    }
}

pub(crate) async fn delete_path(
    host: &impl Host,
    sandbox: &SandboxId,
    path: &SandboxPath,
    recursive: bool,
) -> Result<(), DriverError> {
    let socket = host.socket(sandbox).await?;
    match client::file_delete(&socket, &path.to_string(), recursive, host.connect_timeout()).await {
        Ok(()) => Ok(()),
        Err(e) => Err(fail(host, sandbox, None, e).await),
    }
}

pub(crate) async fn archive_out(
    host: &impl Host,
    sandbox: &SandboxId,
    path: &SandboxPath,
) -> Result<Box<dyn ByteStream>, DriverError> {
    let socket = host.socket(sandbox).await?;
    match client::archive_read(&socket, sandbox, &path.to_string(), host.connect_timeout()).await {
        Ok(stream) => Ok(Box::new(stream)),
        Err(e) => Err(fail(host, sandbox, None, e).await),
    }
}

pub(crate) async fn archive_in(
    host: &impl Host,
    sandbox: &SandboxId,
    path: &SandboxPath,
    archive: Box<dyn ByteSource>,
) -> Result<Unpacked, DriverError> {
    let socket = host.socket(sandbox).await?;
    match client::archive_write(&socket, &path.to_string(), archive, host.connect_timeout()).await {
        Ok((entries, bytes)) => Ok(Unpacked { entries, bytes }),
        Err(e) => Err(fail(host, sandbox, None, e).await),
    }
}

/// Serves the sandbox's egress proxy until the sandbox ends (see
/// [`ports::SandboxDriver::serve_egress`]).
pub(crate) async fn serve_egress<H: Host>(
    host: &H,
    sandbox: &SandboxId,
    gate: std::sync::Arc<dyn ports::EgressGate>,
) -> Result<(), DriverError>
where
    H::Target: Clone + 'static,
{
    if let Some(proxy) = host.proxy_listener(sandbox).await? {
        let tls = host.broker_tls(sandbox).await;
        return crate::egress::serve_listener(proxy, sandbox, gate, tls).await;
    }
    let socket = host.socket(sandbox).await?;
    let tls = host.broker_tls(sandbox).await;
    crate::egress::serve(&socket, sandbox, gate, tls, host.connect_timeout()).await
}

/// A connection to `port` on the sandbox's own loopback, made by its supervisor (see
/// [`ports::SandboxDriver::open_port`]): the socket itself where the channel carries
/// descriptors, else its bytes in frames.
pub(crate) async fn open_port(
    host: &impl Host,
    sandbox: &SandboxId,
    port: u16,
) -> Result<Box<dyn ports::PortStream>, DriverError> {
    let socket = host.socket(sandbox).await?;
    match client::connect_port(&socket, port, host.connect_timeout()).await {
        Ok(client::PortConnection::Taken(tcp)) => Ok(Box::new(Port { stream: tcp, _tasks: None })),
        Ok(client::PortConnection::Framed(rx, tx)) => {
            let (pipe, tasks) = crate::egress::bridge(rx, tx);
            Ok(Box::new(Port { stream: pipe, _tasks: Some(tasks) }))
        }
        Err(ClientError::Refused { code, message }) if code == "unreachable" => {
            Err(DriverError::Failed(ports::Cause::msg(format!("sandbox {sandbox}: {message}"))))
        }
        Err(e) => Err(fail(host, sandbox, None, e).await),
    }
}

/// A runtime byte stream as the port's [`ports::PortStream`], with the bridge's tasks when
/// its bytes go in frames (ended with the stream: the preview is done with it).
struct Port<T> {
    stream: T,
    _tasks: Option<crate::egress::BridgeTasks>,
}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> ports::PortStream for Port<T> {
    fn poll_read(
        &mut self,
        cx: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let mut read = tokio::io::ReadBuf::new(buf);
        match std::pin::Pin::new(&mut self.stream).poll_read(cx, &mut read) {
            std::task::Poll::Ready(Ok(())) => std::task::Poll::Ready(Ok(read.filled().len())),
            std::task::Poll::Ready(Err(e)) => std::task::Poll::Ready(Err(e)),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }

    fn poll_write(
        &mut self,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
