//! Terminals: background processes started on a pseudo-terminal of their own, for a
//! person to type into. What starts one (its command, its size), what is reported about
//! one, and what an attached client sends it.

use crate::exec::ExecRequestError;
use crate::id::TerminalId;
use crate::process::{ProcessInfo, ProcessRequest};

/// The most columns or rows a terminal may have.
pub const MAX_TERMINAL_SIDE: u16 = 1000;

/// The command a terminal runs when none is given: the sandbox's shell (`bash` where the
/// sandbox has it, else `sh`), interactive.
pub const DEFAULT_SHELL: [&str; 3] =
    ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi"];

/// The `TERM` a terminal's process sees.
pub const TERM: &str = "xterm-256color";

/// How many bytes of a terminal's latest output a new attach replays first.
pub const TERMINAL_REPLAY_BYTES: u64 = 64 * 1024;

/// Why a terminal's size or command was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TerminalError {
    /// A side out of bounds.
    #[error("a terminal of {cols} columns and {rows} rows; each must be 1 to {MAX_TERMINAL_SIDE}")]
    BadSize {
        /// The columns asked for.
        cols: u64,
        /// The rows asked for.
        rows: u64,
    },
    /// The command breaks the exec rules.
    #[error(transparent)]
    Command(#[from] ExecRequestError),
}

/// A terminal's size in character cells, each side 1 to [`MAX_TERMINAL_SIDE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminalSize {
    cols: u16,
    rows: u16,
}

impl TerminalSize {
    /// A size, accepted exactly when both sides are within bounds.
    ///
    /// # Errors
    /// [`TerminalError::BadSize`] naming both sides.
    pub fn new(cols: u64, rows: u64) -> Result<Self, TerminalError> {
        let side = |n: u64| u16::try_from(n).ok().filter(|n| (1..=MAX_TERMINAL_SIDE).contains(n));
        match (side(cols), side(rows)) {
            (Some(cols), Some(rows)) => Ok(Self { cols, rows }),
            _ => Err(TerminalError::BadSize { cols, rows }),
        }
    }

    /// Columns.
    pub fn cols(self) -> u16 {
        self.cols
    }

    /// Rows.
    pub fn rows(self) -> u16 {
        self.rows
    }
}

/// A validated terminal to start: its command (the exec rules; none given: the
/// sandbox's shell, [`DEFAULT_SHELL`]) and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalRequest {
    argv: Vec<String>,
    size: TerminalSize,
}

impl TerminalRequest {
    /// A request; `argv` as exec's when given.
    ///
    /// # Errors
    /// [`TerminalError`] naming what is wrong.
    pub fn new(argv: Option<Vec<String>>, cols: u64, rows: u64) -> Result<Self, TerminalError> {
        let size = TerminalSize::new(cols, rows)?;
        let argv = argv.unwrap_or_else(|| DEFAULT_SHELL.map(str::to_owned).to_vec());
        // The exec rules, through the process request that will carry it.
        let checked = ProcessRequest::new(argv, Vec::new(), None)?;
        Ok(Self { argv: checked.argv().to_vec(), size })
    }

    /// The command.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// Its size at the start.
    pub fn size(&self) -> TerminalSize {
        self.size
    }

    /// The background process that runs it, on terminal `id`.
    pub fn process(&self, id: TerminalId) -> ProcessRequest {
        ProcessRequest::on_terminal(self.argv.clone(), id, self.size)
    }
}

/// A terminal as its sandbox reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalInfo {
    /// Its id.
    pub id: TerminalId,
    /// Its process.
    pub process: ProcessInfo,
}

impl TerminalInfo {
    /// The terminal a background process runs on, if it runs on one.
    pub fn of(process: ProcessInfo) -> Option<Self> {
        let id = process.terminal.clone()?;
        Some(Self { id, process })
    }
}

/// The SHA-256 of a terminal ticket: what the store keeps of it.
pub fn ticket_digest(ticket: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(ticket.as_bytes()).into()
}

/// What an attached client sends a terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalInput {
    /// Bytes typed.
    Bytes(Vec<u8>),
    /// Its new size.
    Resize(TerminalSize),
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// A size is accepted exactly when each side is 1 to 1000.
        #[test]
        fn sizes_are_accepted_exactly_when_within_bounds(cols in 0u64..1100, rows in prop_oneof![0u64..1100, any::<u64>()]) {
            let ok = (1..=1000).contains(&cols) && (1..=1000).contains(&rows);
            let size = TerminalSize::new(cols, rows);
            prop_assert_eq!(size.is_ok(), ok);
            if let Ok(size) = size {
                prop_assert_eq!((u64::from(size.cols()), u64::from(size.rows())), (cols, rows));
            } else {
                prop_assert_eq!(size, Err(TerminalError::BadSize { cols, rows }));
            }
        }

        /// A command is accepted exactly when exec would accept it, and absent is the shell.
        #[test]
        fn commands_follow_the_exec_rules(argv in proptest::collection::vec("[a-z\0]{0,3}", 0..4)) {
            let exec = crate::ExecRequest::new(argv.clone(), Vec::new(), None).map(|r| r.argv().to_vec());
            let terminal = TerminalRequest::new(Some(argv), 80, 24);
            prop_assert_eq!(terminal.as_ref().map(|t| t.argv().to_vec()).ok(), exec.ok());
        }
    }

    #[test]
    fn the_default_is_the_shell_and_the_process_carries_the_terminal() {
        let request = TerminalRequest::new(None, 80, 24).unwrap();
        assert_eq!(request.argv()[0], "/bin/sh");
        let id = TerminalId::generate(1, 2);
        let process = request.process(id.clone());
        assert_eq!(process.terminal(), Some(&(id, TerminalSize::new(80, 24).unwrap())));
        assert_eq!(process.timeout_ms(), None);
        let info = ProcessInfo {
            pid: 9,
            argv: vec![],
            running: true,
            exit_code: None,
            timed_out: false,
            terminal: None,
        };
        assert_eq!(TerminalInfo::of(info), None);
    }
}
