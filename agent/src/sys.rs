//! The agent's calls that Rust cannot check: glibc's allocator controls, a shutdown on a
//! descriptor borrowed from a type that only hands out its raw number, and registering a descriptor
//! with tokio's reactor. Every other system call goes through `rustix` or `nix`, whose wrappers are
//! safe; what must stay `unsafe` lives here, each block with the reason it is sound. (Outside it,
//! only `io::net::SendStream`'s `Send` and the drop of its stream, whose soundness rests on that
//! type's own thread checks, and test code.)

#![allow(unsafe_code)]

use std::os::fd::{BorrowedFd, OwnedFd, RawFd};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// `mallopt(3)`: sets one of glibc malloc's parameters; a value it refuses leaves it as it was.
pub fn mallopt(parameter: libc::c_int, value: libc::c_int) {
    // SAFETY: mallopt only changes the allocator's parameters; it takes and keeps no pointers.
    unsafe {
        libc::mallopt(parameter, value);
    }
}

/// `malloc_trim(0)`: hands the free pages of every arena back to the kernel.
pub fn malloc_trim() {
    // SAFETY: malloc_trim only walks the allocator's own free lists; no pointer is handed over.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Shuts both directions of the socket `fd` down, ignoring errors (it may already be shut down or
/// closed by the peer). The caller owns `fd` for the duration of the call.
pub fn shutdown_socket(fd: RawFd) {
    // SAFETY: the caller still owns the open descriptor (it passes the raw number of a socket it
    // holds), and the borrow ends with this call.
    let socket = unsafe { BorrowedFd::borrow_raw(fd) };
    let _ = rustix::net::shutdown(socket, rustix::net::Shutdown::Both);
}

/// Registers `fd` with tokio's reactor for readability (tokio made its registration `unsafe`:
/// the descriptor must stay open and keep its number while registered). Must run on a runtime.
pub fn register_readable(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the `AsyncFd` takes ownership of the `OwnedFd`, so the descriptor stays open and
    // keeps its number for as long as it is registered.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(Into::into)
}
