//! Kubelet configuration APIs (the kubelet's `pkg/kubelet/apis`).

pub mod config;
