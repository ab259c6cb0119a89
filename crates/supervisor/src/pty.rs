//! Pseudo-terminals for the background processes started on one (terminals): opened
//! from `/dev/ptmx` of the sandbox's own `/dev/pts`, the other end taken with
//! `TIOCGPTPEER` (no path lookup, so no race with another opener), sized with
//! `TIOCSWINSZ`. The supervisor keeps the master end, non-blocking, on its event loop;
//! the process gets the other end as its standard input, output and error and as its
//! session's controlling terminal (module `launch`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A new pseudo-terminal: the master end (non-blocking, kept by the supervisor) and the
/// other end (blocking, for the process).
#[derive(Debug)]
pub struct Pty {
    /// The supervisor's end.
    pub master: OwnedFd,
    /// The process's end.
    pub slave: OwnedFd,
}

/// Opens a new pseudo-terminal of `cols` × `rows`; its other end is handed to `owner`
/// (uid, gid) when given, so the process that runs as that user owns its terminal.
///
/// # Errors
/// What the kernel said (`/dev/ptmx` missing, no pty left, …).
#[allow(unsafe_code)]
pub fn open(cols: u16, rows: u16, owner: Option<(u32, u32)>) -> io::Result<Pty> {
    use rustix::fs::{Mode, OFlags};
    let master = rustix::fs::open(
        c"/dev/ptmx",
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )?;
    let mut unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int from the pointer, which is valid.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &raw mut unlock) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: TIOCGPTPEER takes open flags by value and returns a new descriptor.
    let slave = unsafe {
        libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC)
    };
    if slave < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `slave` is a descriptor the kernel just returned and nothing else owns.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    if let Some((uid, gid)) = owner {
        // Best effort: a terminal its process cannot reopen by path still works through
        // the descriptors it was given.
        let _ = rustix::fs::fchown(
            &slave,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        );
    }
    resize(&master, cols, rows)?;
    Ok(Pty { master, slave })
}

/// Sets the terminal's size (the kernel signals `SIGWINCH` to its foreground process
/// group when it changes).
///
/// # Errors
/// What the kernel said.
#[allow(unsafe_code)]
pub fn resize(master: &impl AsRawFd, cols: u16, rows: u16) -> io::Result<()> {
    let size = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which is valid.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &raw const size) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The terminal's size as (cols, rows).
///
/// # Errors
/// What the kernel said.
#[allow(unsafe_code)]
pub fn size(fd: &impl AsRawFd) -> io::Result<(u16, u16)> {
    let mut size = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which is valid.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &raw mut size) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((size.ws_col, size.ws_row))
}

/// The master end on the event loop: read and written without blocking it.
#[derive(Debug)]
pub struct Master {
    fd: AsyncFd<OwnedFd>,
}

impl Master {
    /// The master end of `pty` (already non-blocking).
    ///
    /// # Errors
    /// When it cannot be registered with the event loop.
    #[allow(unsafe_code)]
    pub fn new(master: OwnedFd) -> io::Result<Self> {
        // SAFETY: the descriptor is owned here and closed only when the `AsyncFd` drops
        // (which deregisters it first): nothing can close it while it is registered.
        let fd = unsafe { AsyncFd::register_with_interest(master, Interest::READABLE | Interest::WRITABLE) }?;
        Ok(Self { fd })
    }

    /// Reads what the terminal's process wrote; `Ok(0)` once every other end has closed
    /// (the kernel's `EIO`).
    ///
    /// # Errors
    /// What the kernel said.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut *buf)?)) {
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(result) => return result,
                Err(_would_block) => {}
            }
        }
    }

    /// What can be read now without waiting: `None` when nothing is there (yet), `Some(0)`
    /// once every other end has closed.
    pub fn try_read(&self, buf: &mut [u8]) -> Option<usize> {
        match rustix::io::read(self.fd.get_ref(), buf) {
            Ok(n) => Some(n),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => None,
            Err(_) => Some(0),
        }
    }

    /// Writes all of `bytes` to the terminal (its process reads them as typed input).
    ///
    /// # Errors
    /// What the kernel said.
    pub async fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| Ok(rustix::io::write(fd.get_ref(), bytes)?)) {
                Ok(Ok(n)) => bytes = &bytes[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }

    /// Sets the terminal's size.
    ///
    /// # Errors
    /// What the kernel said.
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        resize(self.fd.get_ref(), cols, rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pty_carries_bytes_both_ways_and_keeps_its_size() {
        let pty = open(100, 40, None).unwrap();
        assert_eq!(size(&pty.slave).unwrap(), (100, 40));
        let master = Master::new(pty.master).unwrap();
        master.resize(132, 50).unwrap();
        assert_eq!(size(&pty.slave).unwrap(), (132, 50));
        // What the master writes, the other end reads (the line discipline echoes it back).
        master.write_all(b"hi\n").await.unwrap();
        let mut buf = [0u8; 64];
        let n = rustix::io::read(&pty.slave, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hi\n");
        let mut echoed = Vec::new();
        while !echoed.ends_with(b"\r\n") {
            let n = master.read(&mut buf).await.unwrap();
            echoed.extend_from_slice(&buf[..n]);
        }
        assert_eq!(echoed, b"hi\r\n");
        // Once the other end is closed, the master reads its end.
        drop(pty.slave);
        assert_eq!(master.read(&mut buf).await.unwrap(), 0);
    }
}
