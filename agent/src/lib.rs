//! ringlet: a Kubernetes node agent that does the kubelet's job (`pkg/kubelet`) for nodes with
//! thousands of pods. `docs/architecture.md` describes the architecture; each module names the
//! kubelet package it corresponds to. Calls Rust cannot check live in [`sys`]: `unsafe` anywhere
//! else has to say why it is allowed there.

#![deny(unsafe_code)]

pub mod apis;
pub mod apiserver;
pub mod certificate;
pub mod cli;
pub mod cm;
pub mod container;
pub mod ebpf;
pub mod envvars;
pub mod error_chain;
pub mod event_stream;
pub mod events;
pub mod eviction;
pub mod images;
pub mod io;
pub mod kubelet;
pub mod kuberuntime;
pub mod lifecycle;
pub mod logs;
pub mod memory;
pub mod metrics;
pub mod mountinfo;
pub mod nodelease;
pub mod nodeshutdown;
pub mod nodestatus;
pub mod objects;
pub mod observe;
pub mod pleg;
pub mod pod;
pub mod pod_workers;
pub mod podconfig;
pub mod prober;
pub mod server;
pub mod stats;
pub mod status;
pub mod supervise;
pub mod sys;
pub mod systemd_notify;
#[cfg(test)]
mod testing;
pub mod token;
pub mod volumes;
