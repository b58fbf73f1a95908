//! The agent's calls that Rust cannot check: glibc's allocator controls and a shutdown on a
//! descriptor borrowed from a type that only hands out its raw number. Every other system call
//! goes through `rustix` or `nix`, whose wrappers are safe; what must stay `unsafe` lives here,
//! each block with the reason it is sound. (Outside it, only `io::net::SendStream`'s `Send` and the
//! drop of its stream, whose soundness rests on that type's own thread checks, and test code.)

#![allow(unsafe_code)]

use std::os::fd::{BorrowedFd, RawFd};

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
