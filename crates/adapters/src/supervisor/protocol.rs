//! The wire protocol between the server and a sandbox's supervisor.
//!
//! # Frames
//! Every message is one frame: a 4-byte big-endian payload length, one frame-type byte,
//! then the payload. A length above [`MAX_FRAME`] fails the connection before anything is
//! allocated. Control frames carry one JSON object ([`Request`] from the server,
//! [`Reply`] from the supervisor); data frames carry raw bytes (standard input, output,
//! file or archive contents), so binary data costs nothing to encode.
//!
//! # A connection
//! One connection is one operation. The server speaks first: `hello` with its
//! [`VERSION`]; the supervisor answers `hello` with its own, its features and the
//! protections it runs under, or an `error` with code `version` and closes. Then the server
//! sends one request and the two sides exchange frames until the operation ends; either
//! side closing the connection ends it (for an exec: the command's process group is
//! killed). So a client that goes away ends its command.
//!
//! # Operations
//! - `exec`: runs a command; the server may send [`FrameType::Stdin`] frames (an empty one
//!   closes the command's input); the supervisor sends `started`, [`FrameType::Stdout`] and
//!   [`FrameType::Stderr`] frames as output arrives, then `exit`.
//! - `ping`: answered by `pong` (health, and how many commands run).
//! - `shutdown`: the supervisor exits; as the sandbox's init it takes every process of
//!   the sandbox with it.
//!
//! Requests the supervisor does not know are answered with an `error` of code
//! `unsupported` (the connection stays usable for nothing else; it closes), so a newer
//! server can ask an older supervisor without a protocol break. The next operations
//! (background processes with replayable output, signals, files, archives, and a
//! long-lived `events` stream on which the supervisor announces a new egress-proxy client
//! so the server opens a tunnel connection) are new request types and reply types on the
//! same frames; the hello's `features` list says which ones a supervisor serves.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The protocol version both sides announce in their hello. A mismatch fails the
/// connection with a clear error.
pub const VERSION: u32 = 1;

/// The largest frame payload either side accepts, in bytes (a control message or one
/// chunk of data).
pub const MAX_FRAME: usize = 256 * 1024;

/// The largest chunk of data a sender puts in one data frame.
pub const DATA_CHUNK: usize = 64 * 1024;

/// The bytes before a frame's payload: the length (u32, big-endian) and the type.
pub const HEADER_LEN: usize = 5;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    /// One JSON control message.
    Control = 1,
    /// Bytes for the command's standard input (server → supervisor); empty: end of input.
    Stdin = 2,
    /// Bytes the command wrote to standard output (supervisor → server).
    Stdout = 3,
    /// Bytes the command wrote to standard error (supervisor → server).
    Stderr = 4,
    /// Bytes of a file or an archive (either way; for the file operations to come).
    Data = 5,
}

impl FrameType {
    /// The type named by a frame's type byte.
    ///
    /// # Errors
    /// [`ProtocolError::UnknownFrameType`].
    pub fn from_byte(byte: u8) -> Result<Self, ProtocolError> {
        Ok(match byte {
            1 => Self::Control,
            2 => Self::Stdin,
            3 => Self::Stdout,
            4 => Self::Stderr,
            5 => Self::Data,
            other => return Err(ProtocolError::UnknownFrameType(other)),
        })
    }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What it carries.
    pub kind: FrameType,
    /// The payload (at most [`MAX_FRAME`] bytes).
    pub payload: Vec<u8>,
}

impl Frame {
    /// A control frame holding `message` as JSON.
    ///
    /// # Errors
    /// [`ProtocolError::Json`] when it cannot be encoded; [`ProtocolError::TooLarge`].
    pub fn control<T: Serialize>(message: &T) -> Result<Self, ProtocolError> {
        let payload = serde_json::to_vec(message).map_err(|e| ProtocolError::Json(e.to_string()))?;
        if payload.len() > MAX_FRAME {
            return Err(ProtocolError::TooLarge(payload.len()));
        }
        Ok(Self { kind: FrameType::Control, payload })
    }

    /// The control message in this frame.
    ///
    /// # Errors
    /// [`ProtocolError::Unexpected`] for a data frame; [`ProtocolError::Json`].
    pub fn parse<T: for<'de> Deserialize<'de>>(&self) -> Result<T, ProtocolError> {
        if self.kind != FrameType::Control {
            return Err(ProtocolError::Unexpected(format!(
                "a {:?} frame where a message was due",
                self.kind
            )));
        }
        serde_json::from_slice(&self.payload).map_err(|e| ProtocolError::Json(e.to_string()))
    }

    /// The frame as bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        let len = u32::try_from(self.payload.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.payload);
        out
    }
}

/// Why a connection failed. Every error ends that one connection, nothing else.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A frame longer than [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME}")]
    TooLarge(usize),
    /// A type byte no frame has.
    #[error("unknown frame type {0}")]
    UnknownFrameType(u8),
    /// A control message that is not the JSON expected.
    #[error("malformed message: {0}")]
    Json(String),
    /// A message out of turn.
    #[error("protocol violation: {0}")]
    Unexpected(String),
    /// The peer speaks another version.
    #[error("protocol version mismatch: this side speaks {ours}, the peer {theirs}")]
    Version {
        /// This side's version.
        ours: u32,
        /// The peer's.
        theirs: u32,
    },
    /// The connection ended in the middle of a frame.
    #[error("connection closed in the middle of a frame")]
    Truncated,
    /// An I/O error on the connection.
    #[error("connection error: {0}")]
    Io(String),
    /// No answer in time.
    #[error("no answer within {0} ms")]
    Timeout(u64),
}

/// Decodes one frame from the front of `buf`: `Ok(None)` when more bytes are needed,
/// else the frame and how many bytes it took. Never panics, never allocates more than
/// the frame's payload (at most [`MAX_FRAME`]).
///
/// # Errors
/// [`ProtocolError::TooLarge`], [`ProtocolError::UnknownFrameType`].
pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, ProtocolError> {
    let Some(header) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len > MAX_FRAME {
        return Err(ProtocolError::TooLarge(len));
    }
    let kind = FrameType::from_byte(header[4])?;
    let Some(payload) = buf.get(HEADER_LEN..HEADER_LEN + len) else {
        return Ok(None);
    };
    Ok(Some((Frame { kind, payload: payload.to_vec() }, HEADER_LEN + len)))
}

/// Reads one frame; `Ok(None)` at a clean end of the connection (between frames).
///
/// # Errors
/// As [`decode`]; [`ProtocolError::Truncated`] or [`ProtocolError::Io`].
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Frame>, ProtocolError> {
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match reader.read(&mut header[got..]).await {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(ProtocolError::Truncated),
            Ok(n) => got += n,
            Err(e) => return Err(ProtocolError::Io(e.to_string())),
        }
    }
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len > MAX_FRAME {
        return Err(ProtocolError::TooLarge(len));
    }
    let kind = FrameType::from_byte(header[4])?;
    let mut payload = vec![0u8; len];
    reader.read_exact(&mut payload).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            ProtocolError::Truncated
        } else {
            ProtocolError::Io(e.to_string())
        }
    })?;
    Ok(Some(Frame { kind, payload }))
}

/// Writes one frame.
///
/// # Errors
/// [`ProtocolError::Io`].
pub async fn write_frame<W: AsyncWrite + Unpin>(writer: &mut W, frame: &Frame) -> Result<(), ProtocolError> {
    writer.write_all(&frame.encode()).await.map_err(|e| ProtocolError::Io(e.to_string()))
}

/// Writes data as frames of `kind`, in chunks of at most [`DATA_CHUNK`] bytes.
///
/// # Errors
/// [`ProtocolError::Io`].
pub async fn write_data<W: AsyncWrite + Unpin>(
    writer: &mut W,
    kind: FrameType,
    bytes: &[u8],
) -> Result<(), ProtocolError> {
    for chunk in bytes.chunks(DATA_CHUNK) {
        write_frame(writer, &Frame { kind, payload: chunk.to_vec() }).await?;
    }
    Ok(())
}

/// A resource limit set in a command before it starts (`setrlimit`, soft = hard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rlimit {
    /// `RLIMIT_NOFILE`.
    OpenFiles,
    /// `RLIMIT_AS`, bytes.
    AddressSpace,
    /// `RLIMIT_FSIZE`, bytes.
    FileSize,
    /// `RLIMIT_CPU`, seconds (the hard limit one second above: SIGXCPU, then SIGKILL).
    CpuSecs,
    /// `RLIMIT_NPROC`.
    Processes,
    /// `RLIMIT_CORE`, bytes.
    Core,
}

/// One command to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    /// The program and its arguments (looked up on the command's `PATH`).
    pub argv: Vec<String>,
    /// Exactly the command's environment.
    pub env: Vec<(String, String)>,
    /// The working directory.
    pub cwd: String,
    /// Wall-clock limit in milliseconds: then the command's process group is killed.
    pub timeout_ms: u64,
    /// Most bytes kept per output stream; the rest is read and dropped (`truncated`).
    pub output_cap: u64,
    /// Whether the server sends standard input (else the command reads `/dev/null`).
    pub stdin: bool,
    /// Limits set in the command before it starts.
    #[serde(default)]
    pub rlimits: Vec<(Rlimit, u64)>,
}

/// A message from the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// The first message of every connection.
    Hello {
        /// The server's [`VERSION`].
        version: u32,
    },
    /// Run a command (see [`ExecSpec`]).
    Exec(ExecSpec),
    /// Are you alive?
    Ping,
    /// End the sandbox: the supervisor exits, and as its pid namespace's init it takes
    /// every process of the sandbox with it (the kernel kills them). No reply.
    Shutdown,
    /// A request this side does not know (a newer peer's): answered `unsupported`.
    #[serde(other)]
    Unknown,
}

/// What the supervisor enforces on itself and its commands, as it reports in its hello.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Protections {
    /// Whether the seccomp filter is installed (on the supervisor, so on every command).
    pub seccomp: bool,
    /// Whether the supervisor runs as PID 1 of its own pid namespace.
    pub pid_namespace: bool,
    /// Whether the supervisor is non-dumpable (no ptrace, no `/proc/1/mem` for its uid).
    pub non_dumpable: bool,
}

/// A message from the supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// The answer to the server's hello.
    Hello {
        /// The supervisor's [`VERSION`].
        version: u32,
        /// The operations it serves (`exec`, `ping`, …).
        features: Vec<String>,
        /// What it runs under.
        protections: Protections,
    },
    /// The command started.
    Started {
        /// Its pid inside the sandbox (its process group id too).
        pid: i32,
    },
    /// The command ended (or was killed at its timeout).
    Exit {
        /// The exit status, or 128 + the signal that ended it.
        code: i32,
        /// Whether the timeout killed it.
        timed_out: bool,
        /// Whether output beyond the cap was dropped.
        truncated: bool,
    },
    /// The answer to `ping`.
    Pong {
        /// How many commands run now.
        running: u32,
    },
    /// The request failed; the connection ends.
    Error {
        /// `version`, `unsupported`, `bad_request`, `spawn`, `busy`.
        code: String,
        /// What happened.
        message: String,
    },
    /// A reply this side does not know (a newer peer's).
    #[serde(other)]
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_round_trip() {
        let frame = Frame::control(&Request::Ping).unwrap();
        let bytes = frame.encode();
        assert_eq!(&bytes[..5], &[0, 0, 0, 15, 1]);
        let (back, used) = decode(&bytes).unwrap().unwrap();
        assert_eq!((back, used), (frame, bytes.len()));
        assert_eq!(decode(&bytes[..4]).unwrap(), None);
        assert_eq!(decode(&bytes[..bytes.len() - 1]).unwrap(), None);
    }

    #[test]
    fn limits_and_types_are_checked_before_allocating() {
        let mut huge = (u32::MAX).to_be_bytes().to_vec();
        huge.push(1);
        assert_eq!(decode(&huge), Err(ProtocolError::TooLarge(u32::MAX as usize)));
        let mut over = u32::try_from(MAX_FRAME + 1).unwrap().to_be_bytes().to_vec();
        over.push(3);
        assert!(matches!(decode(&over), Err(ProtocolError::TooLarge(_))));
        assert_eq!(decode(&[0, 0, 0, 0, 9]), Err(ProtocolError::UnknownFrameType(9)));
    }

    #[test]
    fn unknown_requests_and_replies_are_not_errors() {
        let f = Frame { kind: FrameType::Control, payload: br#"{"type":"file_read","path":"/x"}"#.to_vec() };
        assert_eq!(f.parse::<Request>().unwrap(), Request::Unknown);
        let f = Frame { kind: FrameType::Control, payload: br#"{"type":"proxy_client","port":3}"#.to_vec() };
        assert_eq!(f.parse::<Reply>().unwrap(), Reply::Unknown);
        let f = Frame { kind: FrameType::Control, payload: b"{\"type\":7}".to_vec() };
        assert!(f.parse::<Request>().is_err());
        let data = Frame { kind: FrameType::Stdout, payload: b"{}".to_vec() };
        assert!(matches!(data.parse::<Reply>(), Err(ProtocolError::Unexpected(_))));
    }

    #[tokio::test]
    async fn read_frame_fails_on_truncation_and_ends_cleanly_between_frames() {
        let frame = Frame { kind: FrameType::Stdin, payload: b"abc".to_vec() };
        let bytes = frame.encode();
        let mut whole = &bytes[..];
        assert_eq!(read_frame(&mut whole).await.unwrap(), Some(frame));
        assert_eq!(read_frame(&mut whole).await.unwrap(), None);
        let mut cut = &bytes[..6];
        assert_eq!(read_frame(&mut cut).await, Err(ProtocolError::Truncated));
        let mut cut = &bytes[..2];
        assert_eq!(read_frame(&mut cut).await, Err(ProtocolError::Truncated));
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder, and whatever it accepts is a frame
        /// within the limit that encodes back to exactly the bytes it took.
        #[test]
        fn decoder_survives_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            if let Ok(Some((frame, used))) = decode(&bytes) {
                prop_assert!(frame.payload.len() <= MAX_FRAME);
                prop_assert_eq!(frame.encode(), bytes[..used].to_vec());
            }
            // A control frame of arbitrary bytes parses or errors, never panics.
            let frame = Frame { kind: FrameType::Control, payload: bytes.clone() };
            let _ = frame.parse::<Request>();
            let _ = frame.parse::<Reply>();
        }

        /// A stream of arbitrary bytes read frame by frame ends with a frame, a clean end
        /// or an error, and never reads past a bound.
        #[test]
        fn reader_survives_arbitrary_streams(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(async {
                let mut input = &bytes[..];
                for _ in 0..4096 {
                    match read_frame(&mut input).await {
                        Ok(Some(frame)) => assert!(frame.payload.len() <= MAX_FRAME),
                        Ok(None) | Err(_) => break,
                    }
                }
            });
        }

        /// Every request and reply round-trips through a frame.
        #[test]
        fn messages_round_trip(argv in proptest::collection::vec(".{0,12}", 1..4), timeout in any::<u64>(), cap in any::<u64>()) {
            let spec = ExecSpec {
                argv,
                env: vec![("A".into(), "b".into())],
                cwd: "/workspace".into(),
                timeout_ms: timeout,
                output_cap: cap,
                stdin: true,
                rlimits: vec![(Rlimit::CpuSecs, 3)],
            };
            let request = Request::Exec(spec);
            let frame = Frame::control(&request).unwrap();
            let (back, _) = decode(&frame.encode()).unwrap().unwrap();
            prop_assert_eq!(back.parse::<Request>().unwrap(), request);
        }
    }
}
