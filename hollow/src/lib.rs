//! ringlet-hollow: a hollow CRI endpoint for scale tests, **a scale harness, not a container
//! runtime**. It serves the CRI calls a node agent makes (ringlet's or the upstream kubelet's) the
//! way containerd's CRI plugin answers them, but each container is only a tiny real process (the
//! `ringlet-hollow-child` binary) forked into a real cgroup below the pod's cgroup: no image,
//! rootfs, namespaces, network or shim. The kernel's cgroup, exec and exit events are therefore
//! real, and so is everything an agent's PLEG sees, while the runtime itself costs next to
//! nothing. It plays the part of kubemark's hollow node runtime (`pkg/kubemark`,
//! `FakeRuntimeService` in `cri-api/pkg/apis/testing`), except that its containers are processes.
//!
//! State lives in memory only: a restarted `ringlet-hollow` knows no sandboxes, containers or
//! images, and its containers' processes die with it (they get `SIGKILL` when it exits).

pub mod cgroup;
pub mod child;
pub mod cri;
mod image_ref;
mod image_service;
mod runtime_service;
pub mod server;
mod spawn;
mod state;
mod stats;
