//! Property tests of the `KubeletConfiguration` loader (issue 14 §3, "Fuzzing"): whatever a config
//! file holds, reading, defaulting and validating it give a configuration or a list of problems,
//! never a panic. A fixed number of cases, so they run in every `cargo test`.

use std::path::Path;

use clap::Parser;
use proptest::prelude::*;
use proptest::test_runner::Config;

use super::{Flags, read_file_text, resolve};

/// Field names of the v1beta1 `KubeletConfiguration` (implemented, not implemented and unknown).
const FIELDS: &[&str] = &[
    "staticPodPath",
    "staticPodURL",
    "staticPodURLHeader",
    "fileCheckFrequency",
    "httpCheckFrequency",
    "syncFrequency",
    "address",
    "port",
    "readOnlyPort",
    "healthzPort",
    "healthzBindAddress",
    "cgroupDriver",
    "cgroupRoot",
    "cgroupsPerQOS",
    "maxPods",
    "podsPerCore",
    "runtimeRequestTimeout",
    "containerRuntimeEndpoint",
    "enableDebuggingHandlers",
    "runOnce",
    "plegMode",
    "plegRelistPeriod",
    "enableServer",
    "podLogsDir",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "tlsMinVersion",
    "tlsCipherSuites",
    "allowedUnsafeSysctls",
    "authentication",
    "authorization",
    "evictionHard",
    "registerWithTaints",
    "registerNode",
    "nodeStatusUpdateFrequency",
    "nodeLeaseDurationSeconds",
    "systemReserved",
    "kubeReserved",
    "containerLogMaxSize",
    "containerLogMaxFiles",
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "featureGates",
    "clusterDNS",
    "clusterDomain",
    "resolvConf",
    "noSuchField",
];

/// YAML values of every shape, with scalars that look like what the fields want and what they do not.
fn yaml_value() -> impl Strategy<Value = serde_yaml_ng::Value> {
    use serde_yaml_ng::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop_oneof![
            Just("10s"),
            Just("-1s"),
            Just("1h2m3.5s"),
            Just("99999999999999h"),
            Just(""),
            Just("0"),
            Just("VersionTLS13"),
            Just("systemd"),
            Just("cgroupfs"),
            Just("/kubepods"),
            Just("unix:///run/containerd/containerd.sock"),
            Just("http://[::1]:80/pods"),
            Just("memory.available<100Mi"),
            Just("key=value:NoSchedule"),
            Just("Webhook"),
            Just("AlwaysAllow"),
            Just("ebpf"),
            Just("10Mi"),
            Just("-1"),
            Just("10.96.0.10"),
            Just("cluster.local"),
        ]
        .prop_map(Value::from),
        "\\PC{0,16}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Sequence),
            proptest::collection::vec(
                (
                    prop_oneof![
                        proptest::sample::select(FIELDS).prop_map(String::from),
                        Just("x509".to_owned()),
                        Just("clientCAFile".to_owned()),
                        Just("webhook".to_owned()),
                        Just("enabled".to_owned()),
                        Just("anonymous".to_owned()),
                        Just("mode".to_owned()),
                        "[a-z]{1,6}",
                    ],
                    inner,
                ),
                0..4
            )
            .prop_map(|fields| {
                Value::Mapping(
                    fields
                        .into_iter()
                        .map(|(key, value)| (Value::from(key), value))
                        .collect(),
                )
            }),
        ]
    })
}

/// A config document: the header (sometimes wrong) and some fields with any values.
fn config_text() -> impl Strategy<Value = String> {
    let header = prop_oneof![
        Just("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"),
        Just("apiVersion: v1\nkind: Pod\n"),
        Just(""),
    ];
    let fields = proptest::collection::vec((proptest::sample::select(FIELDS), yaml_value()), 0..8);
    (header, fields).prop_map(|(header, fields)| {
        let mapping: serde_yaml_ng::Mapping = fields
            .into_iter()
            .map(|(key, value)| (serde_yaml_ng::Value::from(key), value))
            .collect();
        let body = if mapping.is_empty() {
            String::new()
        } else {
            serde_yaml_ng::to_string(&mapping).unwrap_or_default()
        };
        format!("{header}{body}")
    })
}

/// Reads `text` as the config file and resolves it as `load` would, with no other flags.
fn load_text(text: &str) {
    let path = Path::new("/etc/ringlet/config.yaml");
    let flags = Flags::try_parse_from([
        "ringlet",
        "--hostname-override",
        "node-a",
        "--config",
        "/etc/ringlet/config.yaml",
    ])
    .unwrap();
    if let Ok(contents) = read_file_text(path, text) {
        // Either a configuration or the problems, listed; both are fine, a panic is not.
        let _ = resolve(&flags, Some(contents), "node-a");
    }
}

proptest! {
    #![proptest_config(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    })]

    #[test]
    fn no_config_file_panics_the_loader(text in config_text()) {
        load_text(&text);
    }

    #[test]
    fn no_config_text_panics_the_loader(text in "\\PC{0,64}") {
        load_text(&text);
    }
}
