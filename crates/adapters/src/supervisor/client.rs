//! The server's side of the protocol: connect to a sandbox's supervisor, say hello, run
//! an operation. Everything the supervisor sends is treated as hostile: frames are
//! bounded, output is capped again here, and every wait has a deadline.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use domain::ExecOutput;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

use super::protocol::{
    ExecSpec, Frame, FrameType, Protections, ProtocolError, Reply, Request, VERSION, read_frame, write_data,
    write_frame,
};

/// What the supervisor said about itself in its hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The operations it serves.
    pub features: Vec<String>,
    /// What it runs under.
    pub protections: Protections,
}

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody listens: the supervisor is gone (its socket is missing or refuses).
    #[error("the sandbox's supervisor is gone: {0}")]
    Gone(io::Error),
    /// The exchange broke the protocol, timed out or the connection failed.
    #[error("supervisor connection: {0}")]
    Protocol(#[from] ProtocolError),
    /// The supervisor refused the request.
    #[error("the supervisor refused ({code}): {message}")]
    Refused {
        /// Its error code.
        code: String,
        /// Its message.
        message: String,
    },
}

/// Where a supervisor is reached: one new byte stream per operation. A unix socket's path
/// ([`Path`], [`PathBuf`]: bubblewrap, containers) is one; the Kubernetes driver's
/// port-forward through the API server is another. Every operation of this module runs
/// over any of them unchanged.
pub trait Connect: Send + Sync {
    /// The stream of one connection.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// Opens a new connection, ready for the hello.
    ///
    /// # Errors
    /// [`ClientError::Gone`] when nobody listens; a protocol error otherwise.
    fn open(&self) -> impl Future<Output = Result<Self::Stream, ClientError>> + Send;
}

impl Connect for Path {
    type Stream = UnixStream;

    async fn open(&self) -> Result<UnixStream, ClientError> {
        match UnixStream::connect(self).await {
            Ok(s) => Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound
                        | io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::ConnectionReset
                ) =>
            {
                Err(ClientError::Gone(e))
            }
            Err(e) => Err(ProtocolError::Io(e.to_string()).into()),
        }
    }
}

impl Connect for PathBuf {
    type Stream = UnixStream;

    fn open(&self) -> impl Future<Output = Result<UnixStream, ClientError>> + Send {
        self.as_path().open()
    }
}

/// Connects and exchanges hellos within `timeout`.
///
/// # Errors
/// [`ClientError::Gone`] when nobody listens at `socket`; otherwise as the exchange fails.
pub async fn connect<C: Connect + ?Sized>(
    socket: &C,
    timeout: Duration,
) -> Result<(C::Stream, Hello), ClientError> {
    connect_with(socket, timeout, None).await
}

/// Connects, sends the hello and (when given) the request in one write, so the request
/// costs no round trip of its own, and reads the supervisor's hello within `timeout`.
async fn connect_with<C: Connect + ?Sized>(
    socket: &C,
    timeout: Duration,
    request: Option<&Request>,
) -> Result<(C::Stream, Hello), ClientError> {
    let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let mut stream =
        tokio::time::timeout(timeout, socket.open()).await.map_err(|_| ProtocolError::Timeout(millis))??;
    let exchange = async {
        let mut bytes = Frame::control(&Request::Hello { version: VERSION })?.encode();
        if let Some(request) = request {
            bytes.extend_from_slice(&Frame::control(request)?.encode());
        }
        stream.write_all(&bytes).await.map_err(|e| ProtocolError::Io(e.to_string()))?;
        let frame = read_frame(&mut stream).await?.ok_or(ProtocolError::Truncated)?;
        match frame.parse::<Reply>()? {
            Reply::Hello { version, features, protections } if version == VERSION => {
                Ok(Hello { features, protections })
            }
            Reply::Hello { version, .. } => {
                Err(ProtocolError::Version { ours: VERSION, theirs: version }.into())
            }
            Reply::Error { code, message } => Err(ClientError::Refused { code, message }),
            other => Err(ProtocolError::Unexpected(format!("{other:?} instead of hello")).into()),
        }
    };
    let hello =
        tokio::time::timeout(timeout, exchange).await.map_err(|_| ProtocolError::Timeout(millis))??;
    Ok((stream, hello))
}

/// Asks whether the supervisor is alive; returns its hello and how many commands run.
///
/// # Errors
/// As [`connect`].
pub async fn ping<C: Connect + ?Sized>(socket: &C, timeout: Duration) -> Result<(Hello, u32), ClientError> {
    let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let (mut stream, hello) = connect(socket, timeout).await?;
    let exchange = async {
        write_frame(&mut stream, &Frame::control(&Request::Ping)?).await?;
        let frame = read_frame(&mut stream).await?.ok_or(ProtocolError::Truncated)?;
        match frame.parse::<Reply>()? {
            Reply::Pong { running } => Ok(running),
            Reply::Error { code, message } => Err(ClientError::Refused { code, message }),
            other => Err(ProtocolError::Unexpected(format!("{other:?} instead of pong")).into()),
        }
    };
    let running =
        tokio::time::timeout(timeout, exchange).await.map_err(|_| ProtocolError::Timeout(millis))??;
    Ok((hello, running))
}

/// Asks the supervisor to end the sandbox (best effort: `Ok` once the request is sent).
///
/// # Errors
/// As [`connect`].
pub async fn shutdown<C: Connect + ?Sized>(socket: &C, timeout: Duration) -> Result<(), ClientError> {
    let (mut stream, _hello) = connect(socket, timeout).await?;
    write_frame(&mut stream, &Frame::control(&Request::Shutdown)?).await?;
    // Its end closes the connection.
    let _ = tokio::time::timeout(timeout, read_frame(&mut stream)).await;
    Ok(())
}

/// Runs one command to its end and collects its output (at most `spec.output_cap` bytes
/// per stream). Dropping the future closes the connection, which ends the command.
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] when it could not start; a protocol error
/// when the supervisor misbehaves or does not answer within the command's timeout plus
/// `grace`.
pub async fn exec<C: Connect + ?Sized>(
    socket: &C,
    spec: &ExecSpec,
    stdin: &[u8],
    connect_timeout: Duration,
    grace: Duration,
) -> Result<ExecOutput, ClientError> {
    let (stream, _hello) = connect_with(socket, connect_timeout, Some(&Request::Exec(spec.clone()))).await?;
    let (mut rx, mut tx) = tokio::io::split(stream);
    let feed = async {
        if spec.stdin {
            // A command that does not read its input may exit first: not an error.
            if write_data(&mut tx, FrameType::Stdin, stdin).await.is_ok() {
                let _ = write_frame(&mut tx, &Frame { kind: FrameType::Stdin, payload: Vec::new() }).await;
            }
        }
        // Keep the write half open until the end: closing it would cancel the command.
        std::future::pending::<()>().await;
    };
    let cap = usize::try_from(spec.output_cap).unwrap_or(usize::MAX);
    let collect = async {
        let mut out = ExecOutput {
            exit_code: -1,
            stdout: Vec::new(),
            stderr: Vec::new(),
            timed_out: false,
            truncated: false,
        };
        let mut started = false;
        loop {
            let frame = read_frame(&mut rx).await?.ok_or(ProtocolError::Truncated)?;
            match frame.kind {
                FrameType::Stdout | FrameType::Stderr => {
                    let sink =
                        if frame.kind == FrameType::Stdout { &mut out.stdout } else { &mut out.stderr };
                    let room = cap.saturating_sub(sink.len());
                    if frame.payload.len() > room {
                        out.truncated = true;
                    }
                    sink.extend_from_slice(&frame.payload[..frame.payload.len().min(room)]);
                }
                FrameType::Control => match frame.parse::<Reply>()? {
                    Reply::Started { .. } if !started => started = true,
                    Reply::Exit { code, timed_out, truncated } if started => {
                        out.exit_code = code;
                        out.timed_out = timed_out;
                        out.truncated |= truncated;
                        return Ok(out);
                    }
                    Reply::Error { code, message } => return Err(ClientError::Refused { code, message }),
                    other => return Err(ProtocolError::Unexpected(format!("{other:?} during exec")).into()),
                },
                other => {
                    return Err(ProtocolError::Unexpected(format!("a {other:?} frame during exec")).into());
                }
            }
        }
    };
    let limit = Duration::from_millis(spec.timeout_ms).saturating_add(grace);
    let millis = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
    let result = tokio::time::timeout(limit, async {
        tokio::select! {
            () = feed => unreachable_pending(),
            r = collect => r,
        }
    })
    .await
    .map_err(|_| ProtocolError::Timeout(millis))?;
    let _ = tx.shutdown().await;
    result
}

fn unreachable_pending() -> Result<ExecOutput, ClientError> {
    Err(ProtocolError::Unexpected("input feed ended".to_owned()).into())
}
