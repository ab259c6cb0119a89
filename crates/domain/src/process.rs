//! Background processes: what starts one, what is reported about one, the signals one
//! may be sent, and the caps that bound them per sandbox.

use std::fmt;

use crate::exec::{ExecRequest, ExecRequestError, MAX_EXEC_TIMEOUT_MS};
use crate::id::TerminalId;
use crate::terminal::TerminalSize;

/// A validated background process: a command like an exec's, with an optional timeout
/// (none: it runs until it ends, is signalled, or its sandbox ends), on pipes or on a
/// terminal of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRequest {
    argv: Vec<String>,
    stdin: Vec<u8>,
    timeout_ms: Option<u64>,
    terminal: Option<(TerminalId, TerminalSize)>,
}

impl ProcessRequest {
    /// A request, validated by the exec rules (argv) and, when given, the timeout's bounds.
    ///
    /// # Errors
    /// [`ExecRequestError`] naming what is wrong.
    pub fn new(argv: Vec<String>, stdin: Vec<u8>, timeout_ms: Option<u64>) -> Result<Self, ExecRequestError> {
        // The argv rules are exec's; a given timeout has exec's bounds.
        let checked = ExecRequest::new(argv, Vec::new(), Some(timeout_ms.unwrap_or(MAX_EXEC_TIMEOUT_MS)))?;
        Ok(Self { argv: checked.argv().to_vec(), stdin, timeout_ms, terminal: None })
    }

    /// A process on terminal `id` of `size`, with no timeout and no first input (`argv`
    /// already checked: see [`crate::TerminalRequest`]).
    pub(crate) fn on_terminal(argv: Vec<String>, id: TerminalId, size: TerminalSize) -> Self {
        Self { argv, stdin: Vec::new(), timeout_ms: None, terminal: Some((id, size)) }
    }

    /// The terminal it starts on, and the terminal's size, if it starts on one.
    pub fn terminal(&self) -> Option<&(TerminalId, TerminalSize)> {
        self.terminal.as_ref()
    }

    /// The program and its arguments.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }
    /// Bytes written to the process's standard input first (it stays open).
    pub fn stdin(&self) -> &[u8] {
        &self.stdin
    }
    /// The wall-clock limit in milliseconds, if any.
    pub fn timeout_ms(&self) -> Option<u64> {
        self.timeout_ms
    }
}

/// A background process as its supervisor reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Its pid inside the sandbox (and its process group's id).
    pub pid: u32,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// Whether it still runs.
    pub running: bool,
    /// Its exit status once ended (`128 + signal` when a signal ended it).
    pub exit_code: Option<i32>,
    /// Whether its timeout killed it.
    pub timed_out: bool,
    /// The terminal it runs on, if it was started on one.
    pub terminal: Option<TerminalId>,
}

/// A signal a caller may send to a background process (to its whole process group).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// `SIGTERM`: ask it to end.
    Term,
    /// `SIGINT`: interrupt it (as Ctrl-C).
    Int,
    /// `SIGKILL`: end it now.
    Kill,
}

/// Why a signal name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("signal {0:?} is not one of TERM, INT, KILL")]
pub struct SignalError(pub String);

impl Signal {
    /// Every signal, in the order the API lists them.
    pub const ALL: [Self; 3] = [Self::Term, Self::Int, Self::Kill];

    /// `TERM`, `INT`, `KILL`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Term => "TERM",
            Self::Int => "INT",
            Self::Kill => "KILL",
        }
    }

    /// The signal named `name`: `TERM`, `INT`, `KILL`, with or without `SIG`.
    ///
    /// # Errors
    /// [`SignalError`] naming the input.
    pub fn parse(name: &str) -> Result<Self, SignalError> {
        let bare = name.strip_prefix("SIG").unwrap_or(name);
        Self::ALL.into_iter().find(|s| s.as_str() == bare).ok_or_else(|| SignalError(name.to_owned()))
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SIG{}", self.as_str())
    }
}

/// The caps a sandbox's background processes live under (enforced by its supervisor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessCaps {
    /// Most processes kept at once, running or ended (ended ones are forgotten, oldest
    /// first, to make room; when every kept one runs, a start is refused).
    pub max_processes: u32,
    /// The size of each process's output buffer (its oldest output is dropped beyond).
    pub buffer_bytes: u64,
    /// Most output buffer bytes of all kept processes together.
    pub max_buffered_bytes: u64,
}

impl Default for ProcessCaps {
    /// 32 processes, 1 MiB of output each, 16 MiB together.
    fn default() -> Self {
        Self { max_processes: 32, buffer_bytes: 1 << 20, max_buffered_bytes: 16 << 20 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_follow_the_exec_rules_and_may_run_unbounded() {
        let ok = ProcessRequest::new(vec!["sleep".into(), "9".into()], b"in".to_vec(), None).unwrap();
        assert_eq!((ok.argv().len(), ok.stdin(), ok.timeout_ms()), (2, &b"in"[..], None));
        assert_eq!(ProcessRequest::new(vec![], vec![], None), Err(ExecRequestError::EmptyArgv));
        assert_eq!(
            ProcessRequest::new(vec!["a".into()], vec![], Some(0)),
            Err(ExecRequestError::BadTimeout(0))
        );
        let limit = MAX_EXEC_TIMEOUT_MS;
        assert!(ProcessRequest::new(vec!["a".into()], vec![], Some(limit)).is_ok());
        assert!(ProcessRequest::new(vec!["a".into()], vec![], Some(limit + 1)).is_err());
    }

    #[test]
    fn signals_parse_with_or_without_sig() {
        for s in Signal::ALL {
            assert_eq!(Signal::parse(s.as_str()), Ok(s));
            assert_eq!(Signal::parse(&s.to_string()), Ok(s));
        }
        assert_eq!(Signal::parse("HUP"), Err(SignalError("HUP".into())));
        assert_eq!(Signal::parse("term"), Err(SignalError("term".into())));
    }
}
