//! Zero-copy forwarding for a healed link: `splice(2)` moves what a socket received into a
//! pipe and from the pipe into the other socket, without the bytes ever reaching user space
//! (Linux; elsewhere [`Pipe::new`] says no and the copying path serves).
//!
//! What this module must never do: lose or reorder a byte when the link's condition changes.
//! A pump splices only while its direction passes untouched; the instant a fault or condition
//! arrives, whatever is still in the pipe is taken out ([`Pipe::take`]) and goes first through
//! the copying path, in order.

use std::io;
#[cfg(target_os = "linux")]
use std::os::fd::{AsFd, OwnedFd};

use bytes::Bytes;
#[cfg(target_os = "linux")]
use nix::fcntl::{SpliceFFlags, splice};
use tokio::net::TcpStream;

/// What one `splice` moves at most: the pipe's size.
#[cfg(target_os = "linux")]
const PIPE_SIZE: usize = 1 << 20;

/// A pipe between the two sockets of one direction.
#[cfg(target_os = "linux")]
pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Bytes in the pipe, not yet spliced out.
    pub(crate) held: usize,
    size: usize,
}

#[cfg(target_os = "linux")]
impl Pipe {
    /// A non-blocking pipe as large as the kernel lets it be (1 MiB asked); `None` where
    /// `splice` cannot serve.
    pub(crate) fn new() -> Option<Pipe> {
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC)
                .ok()?;
        let size = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE as i32))
            .map(|s| s as usize)
            .unwrap_or(64 * 1024);
        Some(Pipe {
            read,
            write,
            held: 0,
            size,
        })
    }

    /// Moves what `from` has received into the pipe (which must be empty): the count, 0 at
    /// the end of the stream, `WouldBlock` when nothing waits.
    pub(crate) fn fill(&mut self, from: &TcpStream) -> io::Result<usize> {
        let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
        let n = from.try_io(tokio::io::Interest::READABLE, || {
            splice(from.as_fd(), None, &self.write, None, self.size, flags).map_err(io::Error::from)
        })?;
        self.held += n;
        Ok(n)
    }

    /// Moves what the pipe holds into `to`, as much as it takes now: the count, `WouldBlock`
    /// when its buffer is full.
    pub(crate) fn drain(&mut self, to: &TcpStream) -> io::Result<usize> {
        let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
        let n = to.try_io(tokio::io::Interest::WRITABLE, || {
            splice(&self.read, None, to.as_fd(), None, self.held, flags).map_err(io::Error::from)
        })?;
        self.held -= n;
        Ok(n)
    }

    /// Takes what the pipe still holds out into memory, in order (the copying path sends it).
    pub(crate) fn take(&mut self) -> io::Result<Bytes> {
        let mut out = vec![0u8; self.held];
        let mut got = 0;
        while got < out.len() {
            match nix::unistd::read(&self.read, &mut out[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        out.truncate(got);
        self.held -= got;
        Ok(Bytes::from(out))
    }
}

/// Where there is no `splice(2)`: no pipe is ever made, so the copying path serves.
#[cfg(not(target_os = "linux"))]
pub(crate) struct Pipe {
    pub(crate) held: usize,
}

#[cfg(not(target_os = "linux"))]
impl Pipe {
    pub(crate) fn new() -> Option<Pipe> {
        None
    }

    pub(crate) fn fill(&mut self, _from: &TcpStream) -> io::Result<usize> {
        Err(io::ErrorKind::Unsupported.into())
    }

    pub(crate) fn drain(&mut self, _to: &TcpStream) -> io::Result<usize> {
        Err(io::ErrorKind::Unsupported.into())
    }

    pub(crate) fn take(&mut self) -> io::Result<Bytes> {
        Ok(Bytes::new())
    }
}
