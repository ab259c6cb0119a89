//! The supervisor's background processes: started by one connection, kept by the
//! supervisor (so they outlive the server's connections and the server itself, and end
//! with the sandbox, whose init the supervisor is), each with a bounded buffer of its
//! output that any number of readers replay and follow.
//!
//! # A pid is a handle here
//! The supervisor is every background process's parent and its only reaper, and it reaps
//! on its one event-loop thread. Until it reaps a process, the kernel keeps that pid (and
//! so the process group's id) for it, whatever else runs in the sandbox; the reaper marks
//! the process reaped in the same step, on the same thread as every signal is sent. So a
//! signal goes to the process group only while its leader is unreaped, and never to a pid
//! the kernel may have handed to another process.
//!
//! # Output
//! A process's standard output and error are read as they come (the process never waits
//! on a reader) into its buffer: chunks tagged with their stream and their offset in the
//! process's output, at most `buffer_bytes` (each chunk counted with [`CHUNK_COST`] on
//! top, so many tiny writes cannot hold more memory than the cap says); beyond, the oldest
//! bytes go. A reader holds only an offset: it sends what lies past it, and when it has
//! fallen behind the buffer's start, it skips ahead and counts what it missed.
//!
//! # Terminals
//! A process started on a pseudo-terminal ([`crate::pty`]) has one output stream, the
//! terminal's, buffered the same way, and its input is the terminal: what is written to
//! its [`Input`] is typed into it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::unix::pipe;
use tokio::sync::watch;

use crate::protocol::{FrameType, MAX_FRAME, ProcessStatus};
use crate::pty::Master;

/// Where a background process's input goes.
pub enum Input {
    /// The write end of its standard input's pipe.
    Pipe(pipe::Sender),
    /// Its terminal (the master end, shared with the reader of its output).
    Terminal(Arc<Master>),
}

impl Input {
    /// Writes all of `bytes`.
    ///
    /// # Errors
    /// What the kernel said (the reading end closed).
    pub async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        match self {
            Self::Pipe(pipe) => pipe.write_all(bytes).await,
            Self::Terminal(master) => master.write_all(bytes).await,
        }
    }
}

/// A background process's terminal.
pub struct Terminal {
    /// The id the server knows it by.
    pub id: String,
    /// The master end.
    pub master: Arc<Master>,
}

/// What each buffered chunk costs on top of its bytes, in the cap's accounting.
pub const CHUNK_COST: u64 = 64;
/// The most bytes a chunk grows to by appending (same stream, consecutive writes).
const CHUNK_MAX: usize = 32 * 1024;

/// One piece of a process's output.
struct Chunk {
    kind: FrameType,
    /// Its first byte's offset in the process's output.
    offset: u64,
    bytes: Vec<u8>,
}

/// A process's buffered output and how it ended.
#[derive(Default)]
struct Buffer {
    chunks: VecDeque<Chunk>,
    /// The offset of the first byte still held.
    start: u64,
    /// The offset past the last byte.
    end: u64,
    /// Bytes held plus [`CHUNK_COST`] per chunk.
    cost: u64,
    /// `(exit code, timed out)` once it ended.
    exit: Option<(i32, bool)>,
}

impl Buffer {
    fn push(&mut self, kind: FrameType, bytes: &[u8], cap: u64) {
        if bytes.is_empty() {
            return;
        }
        let appended = match self.chunks.back_mut() {
            Some(last) if last.kind == kind && last.bytes.len() + bytes.len() <= CHUNK_MAX => {
                last.bytes.extend_from_slice(bytes);
                true
            }
            _ => false,
        };
        if !appended {
            self.chunks.push_back(Chunk { kind, offset: self.end, bytes: bytes.to_vec() });
            self.cost += CHUNK_COST;
        }
        self.end += bytes.len() as u64;
        self.cost += bytes.len() as u64;
        while self.cost > cap {
            let Some(front) = self.chunks.front_mut() else { break };
            let excess = usize::try_from(self.cost - cap).unwrap_or(usize::MAX);
            if excess >= front.bytes.len() {
                let gone = front.bytes.len() as u64;
                self.chunks.pop_front();
                self.cost -= gone + CHUNK_COST;
                self.start += gone;
            } else {
                front.bytes.drain(..excess);
                front.offset += excess as u64;
                self.cost -= excess as u64;
                self.start += excess as u64;
            }
        }
        if let Some(front) = self.chunks.front() {
            self.start = front.offset;
        } else {
            self.start = self.end;
        }
    }
}

/// What a reader gets in one step.
pub struct Read {
    /// Output past the reader's offset, at most the size asked.
    pub frames: Vec<(FrameType, Vec<u8>)>,
    /// How it ended, once the reader has everything.
    pub exit: Option<(i32, bool)>,
}

/// One background process.
pub struct Proc {
    /// Its pid inside the sandbox (its process group's id too).
    pub pid: u32,
    argv: Vec<String>,
    /// Start order, for making room (the oldest ended process goes first).
    seq: u64,
    /// The size of its output buffer.
    pub buffer_bytes: u64,
    /// Set by the reaper when it reaps the process; see the module's doc.
    reaped: AtomicBool,
    buffer: Mutex<Buffer>,
    /// Bumped whenever output arrives or the process ends.
    changed: watch::Sender<u64>,
    /// Its standard input while open.
    pub stdin: tokio::sync::Mutex<Option<Input>>,
    /// Its terminal, when it was started on one.
    pub terminal: Option<Terminal>,
}

impl Proc {
    /// Marks the process reaped (by the reaper, as it reaps it).
    pub fn set_reaped(&self) {
        self.reaped.store(true, Ordering::SeqCst);
    }

    /// Whether it has been reaped (its pid is no longer its own).
    pub fn reaped(&self) -> bool {
        self.reaped.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buffer> {
        self.buffer.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds output.
    pub fn push(&self, kind: FrameType, bytes: &[u8]) {
        self.lock().push(kind, bytes, self.buffer_bytes);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Records how it ended.
    pub fn finish(&self, code: i32, timed_out: bool) {
        self.lock().exit = Some((code, timed_out));
        self.changed.send_modify(|n| *n += 1);
    }

    /// Whether it has ended (its output is complete).
    pub fn ended(&self) -> bool {
        self.lock().exit.is_some()
    }

    /// A receiver that sees every change from now on.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Output past `offset` (at most `max` bytes), moving `offset` on; bytes no longer
    /// held are skipped and added to `dropped`.
    pub fn read(&self, offset: &mut u64, dropped: &mut u64, max: usize) -> Read {
        let buffer = self.lock();
        if *offset < buffer.start {
            *dropped += buffer.start - *offset;
            *offset = buffer.start;
        }
        let mut frames = Vec::new();
        let mut taken = 0usize;
        for chunk in &buffer.chunks {
            let chunk_end = chunk.offset + chunk.bytes.len() as u64;
            if chunk_end <= *offset {
                continue;
            }
            if taken >= max {
                break;
            }
            let from = usize::try_from(offset.saturating_sub(chunk.offset)).unwrap_or(0);
            let piece = &chunk.bytes[from..];
            let piece = &piece[..piece.len().min(max - taken)];
            frames.push((chunk.kind, piece.to_vec()));
            taken += piece.len();
            *offset += piece.len() as u64;
        }
        let exit = if *offset == buffer.end { buffer.exit } else { None };
        Read { frames, exit }
    }

    /// Its status as the protocol reports it.
    pub fn status(&self) -> ProcessStatus {
        let exit = self.lock().exit;
        ProcessStatus {
            pid: self.pid,
            argv: shown_argv(&self.argv),
            running: exit.is_none(),
            exit_code: exit.map(|(code, _)| code),
            timed_out: exit.is_some_and(|(_, t)| t),
            terminal: self.terminal.as_ref().map(|t| t.id.clone()),
        }
    }
}

/// `argv` shortened, when needed, so that a status always fits in one frame.
fn shown_argv(argv: &[String]) -> Vec<String> {
    let budget = MAX_FRAME / 2;
    let mut used = 0;
    let mut out = Vec::new();
    for arg in argv {
        // JSON may escape a byte into six.
        let cost = arg.len() * 6 + 4;
        if used + cost > budget {
            out.push(format!("… ({} more arguments)", argv.len() - out.len()));
            return out;
        }
        used += cost;
        out.push(arg.clone());
    }
    out
}

/// The caps a start asks to be kept within.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Most processes kept.
    pub max_processes: u32,
    /// This process's buffer.
    pub buffer_bytes: u64,
    /// Most buffer bytes of all kept processes.
    pub max_buffered_bytes: u64,
}

/// The kept background processes, by pid.
#[derive(Default)]
pub struct Table {
    procs: Mutex<BTreeMap<u32, Arc<Proc>>>,
    next_seq: AtomicU64,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Arc<Proc>>> {
        self.procs.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes room for one more process within `caps`, forgetting ended processes oldest
    /// first.
    ///
    /// # Errors
    /// A message saying which cap leaves no room.
    pub fn make_room(&self, caps: Caps) -> Result<(), String> {
        if caps.buffer_bytes > caps.max_buffered_bytes {
            return Err(format!(
                "a process buffer of {} bytes is over the sandbox's {} buffered bytes",
                caps.buffer_bytes, caps.max_buffered_bytes
            ));
        }
        let mut procs = self.lock();
        loop {
            let kept = procs.len();
            let reserved: u64 = procs.values().map(|p| p.buffer_bytes).sum();
            let fits_count = kept < caps.max_processes as usize;
            let fits_bytes = reserved + caps.buffer_bytes <= caps.max_buffered_bytes;
            if fits_count && fits_bytes {
                return Ok(());
            }
            let victim = procs.values().filter(|p| p.ended()).min_by_key(|p| p.seq).map(|p| p.pid);
            match victim {
                Some(pid) => {
                    procs.remove(&pid);
                }
                None if !fits_count => {
                    return Err(format!(
                        "the sandbox already runs {kept} background processes, its most (end or signal one \
                         first)"
                    ));
                }
                None => {
                    return Err(format!(
                        "the sandbox's running background processes hold {reserved} of its {} buffered output \
                         bytes; a new one needs {} more",
                        caps.max_buffered_bytes, caps.buffer_bytes
                    ));
                }
            }
        }
    }

    /// Keeps a process that has just started (replacing a forgotten one of the same pid).
    pub fn insert(
        &self,
        pid: u32,
        argv: Vec<String>,
        buffer_bytes: u64,
        stdin: Option<Input>,
        terminal: Option<Terminal>,
    ) -> Arc<Proc> {
        let (changed, _) = watch::channel(0);
        let proc = Arc::new(Proc {
            pid,
            argv,
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
            buffer_bytes,
            reaped: AtomicBool::new(false),
            buffer: Mutex::new(Buffer::default()),
            changed,
            stdin: tokio::sync::Mutex::new(stdin),
            terminal,
        });
        self.lock().insert(pid, proc.clone());
        proc
    }

    /// The process `pid`.
    pub fn get(&self, pid: u32) -> Option<Arc<Proc>> {
        self.lock().get(&pid).cloned()
    }

    /// Every kept process, by pid.
    pub fn all(&self) -> Vec<Arc<Proc>> {
        self.lock().values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(proc: &Proc, offset: &mut u64, dropped: &mut u64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let read = proc.read(offset, dropped, 7);
            if read.frames.is_empty() {
                return out;
            }
            for (_, bytes) in read.frames {
                out.extend(bytes);
            }
        }
    }

    #[test]
    fn the_buffer_keeps_the_newest_bytes_within_its_cap_and_readers_count_what_they_missed() {
        let table = Table::default();
        let cap = 100 + 2 * CHUNK_COST;
        let proc = table.insert(7, vec!["x".into()], cap, None, None);
        proc.push(FrameType::Stdout, b"0123456789");
        proc.push(FrameType::Stderr, b"abcdefghij");
        let (mut offset, mut dropped) = (0, 0);
        assert_eq!(collect(&proc, &mut offset, &mut dropped), b"0123456789abcdefghij");
        assert_eq!((offset, dropped), (20, 0));
        // 200 more bytes alternating streams: only the newest fit.
        let mut slow = 0u64;
        for i in 0..20u8 {
            let kind = if i % 2 == 0 { FrameType::Stdout } else { FrameType::Stderr };
            proc.push(kind, &[b'A' + i; 10]);
        }
        let held = {
            let b = proc.lock();
            assert!(b.cost <= cap, "cost {} over cap {cap}", b.cost);
            b.end - b.start
        };
        assert!(held > 0 && held < 220, "{held}");
        let mut missed = 0;
        let got = collect(&proc, &mut slow, &mut missed);
        assert_eq!(missed + got.len() as u64, 220, "every byte is either read or counted missed");
        assert_eq!(got.last(), Some(&(b'A' + 19)));
        // The reader that kept up missed nothing but what went while it was away.
        let got = collect(&proc, &mut offset, &mut dropped);
        assert_eq!(dropped + got.len() as u64, 200);
        assert_eq!(proc.read(&mut offset, &mut dropped, 10).exit, None);
        proc.finish(3, false);
        assert_eq!(proc.read(&mut offset, &mut dropped, 10).exit, Some((3, false)));
        assert_eq!(proc.status().exit_code, Some(3));
    }

    #[test]
    fn tiny_alternating_writes_cannot_outgrow_the_cap() {
        let table = Table::default();
        let proc = table.insert(9, vec![], 10_000, None, None);
        for i in 0..100_000u32 {
            let kind = if i % 2 == 0 { FrameType::Stdout } else { FrameType::Stderr };
            proc.push(kind, b"x");
        }
        let b = proc.lock();
        assert!(
            b.cost <= 10_000 && b.chunks.len() <= 10_000 / CHUNK_COST as usize,
            "{} chunks",
            b.chunks.len()
        );
    }

    #[test]
    fn room_is_made_by_forgetting_ended_processes_oldest_first() {
        let table = Table::default();
        let caps = Caps { max_processes: 2, buffer_bytes: 10, max_buffered_bytes: 100 };
        table.make_room(caps).unwrap();
        let a = table.insert(1, vec![], 10, None, None);
        table.make_room(caps).unwrap();
        let b = table.insert(2, vec![], 10, None, None);
        let err = table.make_room(caps).unwrap_err();
        assert!(err.contains("runs 2"), "{err}");
        b.finish(0, false);
        a.finish(0, false);
        table.make_room(caps).unwrap();
        assert!(table.get(1).is_none() && table.get(2).is_some(), "the oldest ended one went");
        let big = Caps { max_processes: 10, buffer_bytes: 95, max_buffered_bytes: 100 };
        table.insert(3, vec![], 10, None, None);
        let err = table.make_room(big).unwrap_err();
        assert!(err.contains("buffered output"), "{err}");
        assert!(table.make_room(Caps { buffer_bytes: 101, ..big }).is_err());
    }

    #[test]
    fn huge_argv_is_shortened_to_fit_a_frame() {
        let argv: Vec<String> = (0..100).map(|_| "y".repeat(10_000)).collect();
        let shown = shown_argv(&argv);
        assert!(shown.len() < argv.len());
        assert!(shown.last().unwrap().contains("more arguments"));
        let json = serde_json::to_vec(&shown).unwrap();
        assert!(json.len() < MAX_FRAME);
        assert_eq!(shown_argv(&["a".into(), "b".into()]), vec!["a".to_owned(), "b".to_owned()]);
    }
}
