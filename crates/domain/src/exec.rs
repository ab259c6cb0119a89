//! A command to run inside a sandbox and what it produced.

/// The longest wall-clock timeout an exec may ask for, in milliseconds.
pub const MAX_EXEC_TIMEOUT_MS: u64 = 600_000;
/// The timeout when an exec names none, in milliseconds.
pub const DEFAULT_EXEC_TIMEOUT_MS: u64 = 30_000;
/// The most arguments an exec may pass.
pub const MAX_ARGV: usize = 4096;
/// The argument rule as a regular expression, for schemas that describe the API: any
/// text without a NUL byte (the program, `argv[0]`, must also be non-empty).
pub const ARG_PATTERN: &str = "^[^\\x00]*$";

/// A validated command: a non-empty argv without NUL bytes, optional stdin, a timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    argv: Vec<String>,
    stdin: Vec<u8>,
    timeout_ms: u64,
}

/// Why an exec request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecRequestError {
    /// No program was named.
    #[error("argv must name a program: it is empty or its first element is empty")]
    EmptyArgv,
    /// Too many arguments.
    #[error("argv has {0} elements; at most {MAX_ARGV} are allowed")]
    TooManyArgs(usize),
    /// An argument held a NUL byte.
    #[error("argv[{0}] contains a NUL byte")]
    NulInArg(usize),
    /// The timeout was zero or over the maximum.
    #[error("timeout_ms {0} must be between 1 and {MAX_EXEC_TIMEOUT_MS}")]
    BadTimeout(u64),
}

impl ExecRequest {
    /// A request, validated.
    ///
    /// # Errors
    /// [`ExecRequestError`] naming what is wrong.
    pub fn new(argv: Vec<String>, stdin: Vec<u8>, timeout_ms: Option<u64>) -> Result<Self, ExecRequestError> {
        if argv.first().is_none_or(String::is_empty) {
            return Err(ExecRequestError::EmptyArgv);
        }
        if argv.len() > MAX_ARGV {
            return Err(ExecRequestError::TooManyArgs(argv.len()));
        }
        if let Some(i) = argv.iter().position(|a| a.contains('\0')) {
            return Err(ExecRequestError::NulInArg(i));
        }
        let timeout_ms = timeout_ms.unwrap_or(DEFAULT_EXEC_TIMEOUT_MS);
        if timeout_ms == 0 || timeout_ms > MAX_EXEC_TIMEOUT_MS {
            return Err(ExecRequestError::BadTimeout(timeout_ms));
        }
        Ok(Self { argv, stdin, timeout_ms })
    }

    /// The program and its arguments.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }
    /// Bytes to feed to the command's standard input.
    pub fn stdin(&self) -> &[u8] {
        &self.stdin
    }
    /// The wall-clock limit in milliseconds.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }
}

/// What a command produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecOutput {
    /// The exit status; `128 + signal` when a signal ended it.
    pub exit_code: i32,
    /// Standard output, capped.
    pub stdout: Vec<u8>,
    /// Standard error, capped.
    pub stderr: Vec<u8>,
    /// Whether the wall-clock timeout killed it.
    pub timed_out: bool,
    /// Whether either stream was cut at the cap.
    pub truncated: bool,
}

/// How a command ended, as the last event of its output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExitStatus {
    /// The exit status; `128 + signal` when a signal ended it.
    pub exit_code: i32,
    /// Whether the wall-clock timeout killed it.
    pub timed_out: bool,
    /// Whether output was left out of the stream (beyond a cap, or no longer buffered).
    pub truncated: bool,
}

/// One event of a command's (or a background process's) output as it arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputEvent {
    /// Bytes the command wrote to standard output.
    Stdout(Vec<u8>),
    /// Bytes the command wrote to standard error.
    Stderr(Vec<u8>),
    /// The command ended: always the last event.
    Exit(ExitStatus),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert_eq!(ExecRequest::new(vec![], vec![], None), Err(ExecRequestError::EmptyArgv));
        assert_eq!(ExecRequest::new(vec![String::new()], vec![], None), Err(ExecRequestError::EmptyArgv));
        assert_eq!(
            ExecRequest::new(vec!["a".into(), "b\0".into()], vec![], None),
            Err(ExecRequestError::NulInArg(1))
        );
        assert_eq!(ExecRequest::new(vec!["a".into()], vec![], Some(0)), Err(ExecRequestError::BadTimeout(0)));
        let ok = ExecRequest::new(vec!["true".into()], vec![], None).unwrap();
        assert_eq!(ok.timeout_ms(), DEFAULT_EXEC_TIMEOUT_MS);
    }

    #[test]
    fn arg_pattern_refuses_exactly_a_nul() {
        let pattern = regex::Regex::new(ARG_PATTERN).unwrap();
        for (arg, ok) in [("", true), ("a b\n\u{e9}", true), ("a\0", false), ("\0", false)] {
            assert_eq!(pattern.is_match(arg), ok, "{arg:?}");
            let request = ExecRequest::new(vec!["p".into(), arg.into()], vec![], None);
            assert_eq!(request.is_ok(), ok, "{arg:?}");
        }
    }
}
