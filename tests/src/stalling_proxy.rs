//! A unix socket proxy in front of another socket (the lab's containerd) that can be told to stall:
//! while stalled it accepts connections and reads what either side sends but forwards nothing, so
//! every call through it hangs, as it does on a runtime that stopped answering without closing its
//! socket. Once released, what it held is forwarded and traffic flows again.

use std::io::{Read as _, Write as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;

use anyhow::{Context as _, Result};

/// Whether traffic is held, and whether the proxy is being dropped.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    stalled: bool,
    closed: bool,
}

impl Gate {
    fn set(&self, update: impl FnOnce(&mut GateState)) {
        update(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.notify_all();
    }

    /// Returns once traffic may flow.
    fn wait_open(&self) {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let _open = self
            .changed
            .wait_while(state, |s| s.stalled && !s.closed)
            .unwrap_or_else(PoisonError::into_inner);
    }

    fn closed(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed
    }
}

/// The proxy; its socket is removed and the gate opened when it is dropped.
pub struct StallingProxy {
    socket: PathBuf,
    gate: Arc<Gate>,
}

impl StallingProxy {
    /// Listens on `socket` and forwards each connection to `upstream`.
    pub fn start(socket: &Path, upstream: &Path) -> Result<Self> {
        let listener = UnixListener::bind(socket)
            .with_context(|| format!("listening on {}", socket.display()))?;
        let gate = Arc::new(Gate::default());
        let upstream = upstream.to_path_buf();
        let accepting = Arc::clone(&gate);
        thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.closed() {
                    return;
                }
                let Ok(client) = client else { continue };
                match UnixStream::connect(&upstream) {
                    Ok(server) => forward_both_ways(client, server, &accepting),
                    Err(err) => eprintln!(
                        "stalling proxy: connecting to {}: {err}",
                        upstream.display()
                    ),
                }
            }
        });
        Ok(Self {
            socket: socket.to_path_buf(),
            gate,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// From now on nothing is forwarded until [`StallingProxy::release`].
    pub fn stall(&self) {
        self.gate.set(|s| s.stalled = true);
    }

    /// Forwards what was held and everything after it.
    pub fn release(&self) {
        self.gate.set(|s| s.stalled = false);
    }
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.gate.set(|s| s.closed = true);
        // Wakes the accepting thread so it sees the proxy is closed.
        let _ = UnixStream::connect(&self.socket);
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn forward_both_ways(client: UnixStream, server: UnixStream, gate: &Arc<Gate>) {
    let (Ok(client_reader), Ok(server_reader)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    for (from, to) in [(client_reader, server), (server_reader, client)] {
        let gate = Arc::clone(gate);
        thread::spawn(move || pump(from, to, &gate));
    }
}

/// Copies `from` to `to`, each chunk only once the gate is open; closes `to`'s write side when
/// `from` ends.
fn pump(mut from: UnixStream, mut to: UnixStream, gate: &Gate) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        gate.wait_open();
        if to.write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}
