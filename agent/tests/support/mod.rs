//! Doubles shared by the component tests in `agent/tests/`: a test file brings them in with
//! `mod support;`. Corresponds to the kubelet's `pkg/kubelet/kuberuntime` test fakes.

pub mod apiserver;
pub mod fake_cri;
