use std::io::Write;

use super::*;

fn load_with_file(
    yaml: &str,
    extra_args: &[&str],
) -> Result<(AgentConfig, Vec<String>), ConfigError> {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(yaml.as_bytes()).expect("write config");
    let path = file.path().to_str().expect("utf-8 temp path").to_owned();
    let mut args = vec![
        "ringlet",
        "--hostname-override",
        "node-a",
        "--config",
        &path,
    ];
    args.extend_from_slice(extra_args);
    load(args)
}

fn invalid_problems(result: Result<(AgentConfig, Vec<String>), ConfigError>) -> Vec<String> {
    match result {
        Err(ConfigError::Invalid { problems, .. }) => problems,
        other => panic!("expected an Invalid error, got {other:?}"),
    }
}

const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

#[test]
fn defaults_without_a_file() {
    let (config, warnings) =
        load(["ringlet", "--hostname-override", "Node-A"]).expect("defaults load");
    assert!(warnings.is_empty());
    assert_eq!(config.node_name, "node-a");
    assert_eq!(config.root_dir, PathBuf::from("/var/lib/kubelet"));
    assert!(!config.runonce);
    assert_eq!(config.max_dead_containers_per_container, Some(1));
    assert_eq!(config.verbosity, 0);
    assert_eq!(config.config_file, None);
    let k = &config.kubelet;
    // Without a file the kubelet serves the read-only port on its legacy default.
    assert_eq!(
        k,
        &KubeletConfiguration {
            read_only_port: Some(10255),
            ..KubeletConfiguration::default()
        }
    );
    assert_eq!(k.file_check_frequency, Duration::from_secs(20));
    assert_eq!(k.http_check_frequency, Duration::from_secs(20));
    assert_eq!(k.sync_frequency, Duration::from_mins(1));
    assert_eq!(k.runtime_request_timeout, Duration::from_mins(2));
    assert_eq!(k.server_addr(), "0.0.0.0:10250".parse().expect("addr"));
    assert_eq!(
        k.healthz_addr(),
        Some("127.0.0.1:10248".parse().expect("addr"))
    );
    assert_eq!(k.cgroup_driver, CgroupDriver::Cgroupfs);
    assert_eq!(k.cgroup_root, "/");
    assert!(k.cgroups_per_qos);
    assert_eq!(k.max_pods, 110);
    assert!(k.enable_debugging_handlers);
    assert_eq!(
        k.runtime_socket_path(),
        Path::new("/run/containerd/containerd.sock")
    );
}

#[test]
fn defaults_with_an_empty_file() {
    let (config, warnings) = load_with_file(HEADER, &[]).expect("minimal file loads");
    assert!(warnings.is_empty());
    assert_eq!(config.kubelet, KubeletConfiguration::default());
    assert_eq!(config.kubelet.read_only_port, None);
}

#[test]
fn file_values_and_flag_overrides() {
    let yaml = format!(
        "{HEADER}staticPodPath: /etc/file/manifests\nsyncFrequency: 30s\nport: 11250\n\
         readOnlyPort: 10255\nmaxPods: 50\ncgroupDriver: systemd\ncgroupRoot: /ringlet.slice\n\
         healthzPort: 0\nenableDebuggingHandlers: false\n"
    );
    let (config, _) = load_with_file(
        &yaml,
        &[
            "--pod-manifest-path",
            "/etc/flag/manifests",
            "--port=12250",
            "--cgroups-per-qos=false",
            // The kubelet refuses the default "pods" enforcement without per-QoS cgroups.
            "--enforce-node-allocatable=",
            "--runonce",
            "--v=4",
            "--maximum-dead-containers-per-container=-1",
        ],
    )
    .expect("file and flags load");
    let k = &config.kubelet;
    assert_eq!(
        k.static_pod_path,
        Some(PathBuf::from("/etc/flag/manifests"))
    );
    assert_eq!(k.port, 12250);
    assert_eq!(k.sync_frequency, Duration::from_secs(30));
    assert_eq!(k.read_only_port, Some(10255));
    assert_eq!(k.max_pods, 50);
    assert_eq!(k.cgroup_driver, CgroupDriver::Systemd);
    assert_eq!(k.cgroup_root, "/ringlet.slice");
    assert!(!k.cgroups_per_qos);
    assert_eq!(k.healthz_port, None);
    assert!(!k.enable_debugging_handlers);
    assert!(config.runonce);
    assert_eq!(config.verbosity, 4);
    assert_eq!(config.max_dead_containers_per_container, None);
}

#[test]
fn run_once_from_the_file() {
    let (config, _) = load_with_file(&format!("{HEADER}runOnce: true\n"), &[]).expect("loads");
    assert!(config.runonce);
}

#[test]
fn short_verbosity_flag() {
    let (config, _) = load(["ringlet", "--hostname-override=n", "-v", "3"]).expect("loads");
    assert_eq!(config.verbosity, 3);
    let (config, _) = load(["ringlet", "--hostname-override=n", "-v=5"]).expect("loads");
    assert_eq!(config.verbosity, 5);
    let (config, _) = load(["ringlet", "--hostname-override=n", "--v", "2"]).expect("loads");
    assert_eq!(config.verbosity, 2);
}

#[test]
fn unknown_field_is_rejected() {
    let yaml = format!("{HEADER}staticPodPath: /etc/m\nnotAField: 1\nalsoBogus: x\n");
    let problems = invalid_problems(load_with_file(&yaml, &[]));
    assert_eq!(
        problems,
        vec![
            "unknown fields (not KubeletConfiguration kubelet.config.k8s.io/v1beta1 fields): \
             notAField, alsoBogus"
                .to_owned()
        ]
    );
}

#[test]
fn unimplemented_fields_warn_once_listing_all() {
    let yaml = format!(
        "{HEADER}hairpinMode: hairpin-veth\nfailSwapOn: false\n\
         staticPodPath: /etc/m\nmergeDefaultEvictionSettings: true\n\
         evictionHard:\n  memory.available: 200Mi\n"
    );
    let (config, warnings) = load_with_file(&yaml, &[]).expect("loads");
    assert_eq!(
        config.kubelet.static_pod_path,
        Some(PathBuf::from("/etc/m"))
    );
    assert_eq!(
        config.kubelet.node.eviction_hard,
        std::collections::BTreeMap::from([("memory.available".to_owned(), "200Mi".to_owned())]),
        "evictionHard replaces the defaults, as in the kubelet"
    );
    assert_eq!(
        warnings,
        vec![
            "ringlet does not implement these KubeletConfiguration fields yet: hairpinMode, \
             failSwapOn, mergeDefaultEvictionSettings"
                .to_owned()
        ]
    );
}

#[test]
fn every_invalid_value_is_reported_together() {
    let yaml = "apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfig\n\
                port: 70000\nsyncFrequency: 10\nfileCheckFrequency: 5d\ncgroupDriver: openrc\n\
                maxPods: -3\nstaticPodPath: etc/manifests\naddress: not-an-ip\n\
                containerRuntimeEndpoint: tcp://1.2.3.4:1\nstaticPodURL: ftp://x/y\nbogus: 1\n";
    let problems = invalid_problems(load_with_file(yaml, &["--healthz-port=-1"]));
    let expected_fragments = [
        "apiVersion: must be kubelet.config.k8s.io/v1beta1",
        "kind: must be KubeletConfiguration",
        "syncFrequency: expected a duration string",
        "fileCheckFrequency: invalid duration \"5d\": unknown unit",
        "unknown fields (not KubeletConfiguration kubelet.config.k8s.io/v1beta1 fields): bogus",
        "staticPodPath (--pod-manifest-path): etc/manifests must be an absolute path",
        "staticPodURL (--manifest-url): manifest url \"ftp://x/y\": scheme \"ftp\" is not supported yet",
        "address (--address): \"not-an-ip\" is not an IP address",
        "port (--port): 70000 must be between 1 and 65535",
        "healthzPort (--healthz-port): -1 must be between 1 and 65535, or 0 to disable",
        "cgroupDriver (--cgroup-driver): \"openrc\" must be cgroupfs or systemd",
        "maxPods (--max-pods): -3 must not be a negative number",
        "containerRuntimeEndpoint (--container-runtime-endpoint): \"tcp://1.2.3.4:1\" must be a unix socket URL",
    ];
    for fragment in expected_fragments {
        assert!(
            problems.iter().any(|p| p.starts_with(fragment)),
            "missing {fragment:?} in {problems:#?}"
        );
    }
    assert_eq!(problems.len(), expected_fragments.len(), "{problems:#?}");
}

#[test]
fn error_message_lists_every_problem() {
    let err = load([
        "ringlet",
        "--hostname-override=n",
        "--port=0",
        "--max-pods=-1",
    ])
    .expect_err("invalid flags");
    let message = err.to_string();
    assert!(
        message.starts_with("invalid configuration (command-line flags):"),
        "{message}"
    );
    assert!(
        message.contains("\n  - port (--port): 0 must be between 1 and 65535"),
        "{message}"
    );
    assert!(
        message.contains("\n  - maxPods (--max-pods): -1 must not be a negative number"),
        "{message}"
    );
}

#[test]
fn missing_api_version_and_kind_are_reported() {
    let problems = invalid_problems(load_with_file("staticPodPath: /etc/m\n", &[]));
    assert_eq!(
        problems,
        vec![
            "apiVersion: missing (must be kubelet.config.k8s.io/v1beta1)".to_owned(),
            "kind: missing (must be KubeletConfiguration)".to_owned(),
        ]
    );
}

#[test]
fn non_mapping_file_is_rejected() {
    let problems = invalid_problems(load_with_file("- a\n- b\n", &[]));
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].contains("must be a YAML mapping"),
        "{problems:?}"
    );
}

#[test]
fn yaml_syntax_error_names_the_file() {
    let err = load_with_file("apiVersion: [unclosed\n", &[]).expect_err("bad yaml");
    assert!(matches!(err, ConfigError::ParseFile { .. }), "{err:?}");
}

#[test]
fn a_deeply_nested_file_is_refused_before_parsing() {
    // Parsing 100,000 levels of flow nesting took libyaml about a minute.
    let depth = 100_000;
    let yaml = format!(
        "{HEADER}syncFrequency: {}1{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let err = load_with_file(&yaml, &[]).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::TooDeep {
                limit: 128,
                line: 3,
                column: 143,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("nests deeper than 128 levels"),
        "{err}"
    );
}

#[test]
fn missing_file_names_the_path() {
    let err = load([
        "ringlet",
        "--hostname-override=n",
        "--config=/nonexistent/ringlet.yaml",
    ])
    .expect_err("missing file");
    assert!(
        err.to_string().contains("/nonexistent/ringlet.yaml"),
        "{err}"
    );
}

#[test]
fn durations_in_file_and_flags() {
    let yaml = format!(
        "{HEADER}fileCheckFrequency: 1m30s\nhttpCheckFrequency: 500ms\nsyncFrequency: 0s\n\
         runtimeRequestTimeout: 2h\n"
    );
    let (config, _) = load_with_file(&yaml, &["--http-check-frequency=1.5s"]).expect("loads");
    let k = &config.kubelet;
    assert_eq!(k.file_check_frequency, Duration::from_secs(90));
    assert_eq!(k.http_check_frequency, Duration::from_millis(1500));
    // A zero duration in the file means "default", as in the kubelet.
    assert_eq!(k.sync_frequency, Duration::from_mins(1));
    assert_eq!(k.runtime_request_timeout, Duration::from_hours(2));

    let zero = invalid_problems(load([
        "ringlet",
        "--hostname-override=n",
        "--sync-frequency=0s",
    ]));
    assert_eq!(
        zero,
        vec!["syncFrequency (--sync-frequency): must be greater than 0".to_owned()]
    );

    let err = load(["ringlet", "--sync-frequency=10"]).expect_err("unitless duration");
    assert!(matches!(err, ConfigError::Flags(_)), "{err:?}");
}

#[test]
fn url_headers_from_file_and_flags() {
    let yaml = format!(
        "{HEADER}staticPodURL: http://example.com/pods\n\
         staticPodURLHeader:\n  Authorization: [\"Bearer abc\"]\n  X-Multi: [a, b]\n"
    );
    let (config, _) = load_with_file(&yaml, &[]).expect("loads");
    let headers = &config.kubelet.static_pod_url_header;
    assert_eq!(headers["Authorization"], vec!["Bearer abc"]);
    assert_eq!(headers["X-Multi"], vec!["a", "b"]);

    let (config, _) = load_with_file(
        &yaml,
        &[
            "--manifest-url-header",
            "a:hello,b:again,c:world",
            "--manifest-url-header",
            "b:beautiful, url: http://x:1/y ",
        ],
    )
    .expect("loads");
    let headers = &config.kubelet.static_pod_url_header;
    let expected: BTreeMap<String, Vec<String>> = [
        ("a", vec!["hello"]),
        ("b", vec!["again", "beautiful"]),
        ("c", vec!["world"]),
        ("url", vec!["http://x:1/y"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(headers, &expected, "flags replace the file's headers");

    let problems = invalid_problems(load([
        "ringlet",
        "--hostname-override=n",
        "--manifest-url-header=novalue,:empty",
        "--manifest-url-header=bad name:x",
    ]));
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("\"novalue\" is not a name:value pair"));
    assert!(problems[1].contains("\":empty\" is not a name:value pair"));
    assert!(problems[2].contains("\"bad name\" is not a valid HTTP header name"));

    let bad_types = invalid_problems(load_with_file(
        &format!("{HEADER}staticPodURLHeader:\n  A: b\n  C: [1]\n"),
        &[],
    ));
    assert_eq!(bad_types.len(), 2, "{bad_types:#?}");
    assert!(bad_types[0].contains("header \"A\": expected a list of strings"));
    assert!(bad_types[1].contains("header \"C\": values must be strings"));
}

#[test]
fn node_name_is_validated() {
    let problems = invalid_problems(load(["ringlet", "--hostname-override=bad_name!"]));
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].starts_with("node name \"bad_name!\""),
        "{problems:?}"
    );
}

#[test]
fn system_hostname_is_used_without_override() {
    let (config, _) = load(["ringlet"]).expect("loads with the system hostname");
    let expected = system_hostname().expect("hostname").trim().to_lowercase();
    assert_eq!(config.node_name, expected);
}

#[test]
fn systemd_cgroup_root_must_be_a_slice() {
    let problems = invalid_problems(load([
        "ringlet",
        "--hostname-override=n",
        "--cgroup-driver=systemd",
        "--cgroup-root=/ringlet",
    ]));
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].starts_with("cgroupRoot (--cgroup-root)"),
        "{problems:?}"
    );
}

#[test]
fn help_is_available() {
    let err = load(["ringlet", "--help"]).expect_err("help exits");
    let ConfigError::Flags(clap_err) = err else {
        panic!("expected a clap error");
    };
    assert_eq!(clap_err.kind(), clap::error::ErrorKind::DisplayHelp);
    let help = clap_err.to_string();
    for flag in [
        "--config",
        "--pod-manifest-path",
        "--manifest-url-header",
        "--root-dir",
        "--maximum-dead-containers-per-container",
        "--cgroups-per-qos",
        "--pleg-mode",
        "--pleg-relist-period",
    ] {
        assert!(help.contains(flag), "{flag} missing from help");
    }
}

#[test]
fn example_config_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/kubelet-config.yaml");
    let path = path.to_str().expect("utf-8 path").to_owned();
    let (config, warnings) =
        load(["ringlet", "--hostname-override=node-a", "--config", &path]).expect("example loads");
    assert_eq!(
        config.kubelet.static_pod_path,
        Some(PathBuf::from("/etc/ringlet/manifests"))
    );
    assert_eq!(config.kubelet.read_only_port, Some(10255));
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn pleg_mode_and_period_from_file_and_flags() {
    let (config, warnings) = load(["ringlet", "--hostname-override=node-a"]).expect("defaults");
    assert!(warnings.is_empty());
    assert_eq!(config.kubelet.pleg_mode, PlegModeSetting::Auto);
    assert_eq!(config.kubelet.pleg_relist_period, None);

    let yaml = format!("{HEADER}plegMode: relist\nplegRelistPeriod: 2s\n");
    let (config, warnings) = load_with_file(&yaml, &[]).expect("extension fields load");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(config.kubelet.pleg_mode, PlegModeSetting::Relist);
    assert_eq!(
        config.kubelet.pleg_relist_period,
        Some(Duration::from_secs(2))
    );

    let (config, _) = load_with_file(&yaml, &["--pleg-mode=ebpf", "--pleg-relist-period", "10m"])
        .expect("flags override");
    assert_eq!(config.kubelet.pleg_mode, PlegModeSetting::Ebpf);
    assert_eq!(
        config.kubelet.pleg_relist_period,
        Some(Duration::from_mins(10))
    );
}

#[test]
fn bad_pleg_settings_are_reported() {
    let problems = invalid_problems(load([
        "ringlet",
        "--hostname-override=node-a",
        "--pleg-mode=kernel",
        "--pleg-relist-period=0s",
    ]));
    assert_eq!(
        problems,
        vec![
            "plegMode (--pleg-mode): \"kernel\" must be auto, ebpf or relist".to_owned(),
            "plegRelistPeriod (--pleg-relist-period): must be greater than 0".to_owned(),
        ]
    );
}

#[test]
fn tls_and_auth_sections_from_file_and_flags() {
    let yaml = format!(
        "{HEADER}tlsCertFile: /etc/ringlet/tls.crt\ntlsPrivateKeyFile: /etc/ringlet/tls.key\n\
         tlsMinVersion: VersionTLS13\ntlsCipherSuites: [TLS_AES_128_GCM_SHA256]\n\
         authentication:\n  x509:\n    clientCAFile: /etc/ringlet/ca.crt\n  anonymous:\n    enabled: true\n\
         \x20 webhook:\n    enabled: true\n    cacheTTL: 10s\n\
         authorization:\n  mode: Webhook\n  webhook:\n    cacheAuthorizedTTL: 1m\n    cacheUnauthorizedTTL: 5s\n"
    );
    let (config, warnings) = load_with_file(
        &yaml,
        &[
            "--kubeconfig",
            "/etc/ringlet/kubeconfig",
            "--anonymous-auth=false",
        ],
    )
    .expect("loads");
    assert!(warnings.is_empty(), "{warnings:?}");
    let k = &config.kubelet;
    assert_eq!(k.tls_cert_file, Some(PathBuf::from("/etc/ringlet/tls.crt")));
    assert_eq!(
        k.tls_private_key_file,
        Some(PathBuf::from("/etc/ringlet/tls.key"))
    );
    assert_eq!(k.tls_min_version.as_deref(), Some("VersionTLS13"));
    assert_eq!(k.tls_cipher_suites, ["TLS_AES_128_GCM_SHA256"]);
    assert_eq!(
        k.authentication,
        Authentication {
            x509_client_ca_file: Some(PathBuf::from("/etc/ringlet/ca.crt")),
            webhook_enabled: true,
            webhook_cache_ttl: Duration::from_secs(10),
            anonymous_enabled: false,
        }
    );
    assert_eq!(
        k.authorization,
        Authorization {
            mode: AuthorizationModeSetting::Webhook,
            webhook_cache_authorized_ttl: Duration::from_mins(1),
            webhook_cache_unauthorized_ttl: Duration::from_secs(5),
        }
    );
    assert_eq!(
        config.kubeconfig,
        Some(PathBuf::from("/etc/ringlet/kubeconfig"))
    );
    assert_eq!(config.cert_dir, PathBuf::from("/var/lib/kubelet/pki"));
}

#[test]
fn webhooks_default_on_only_with_an_api_server() {
    let (standalone, _) = load_with_file(HEADER, &[]).expect("loads");
    assert!(!standalone.kubelet.authentication.webhook_enabled);
    assert!(!standalone.kubelet.authentication.anonymous_enabled);
    assert_eq!(
        standalone.kubelet.authorization.mode,
        AuthorizationModeSetting::AlwaysAllow
    );
    let (attached, _) =
        load_with_file(HEADER, &["--kubeconfig", "/etc/kubeconfig"]).expect("loads");
    assert!(attached.kubelet.authentication.webhook_enabled);
    assert_eq!(
        attached.kubelet.authorization.mode,
        AuthorizationModeSetting::Webhook
    );
}

#[test]
fn bad_tls_and_auth_settings_are_reported_together() {
    let yaml = format!(
        "{HEADER}tlsCertFile: relative.crt\nauthentication:\n  webhook:\n    enabled: true\n  \
         x509: yes-please\n  bogus: 1\nauthorization:\n  mode: RBAC\n"
    );
    let problems = invalid_problems(load_with_file(&yaml, &["--cert-dir", "pki"]));
    let all = problems.join("\n");
    for needle in [
        "tlsCertFile (--tls-cert-file): relative.crt must be an absolute path",
        "authentication.webhook.enabled (--authentication-token-webhook): needs --kubeconfig",
        "authentication.x509: expected a mapping",
        "authentication.bogus",
        "authorization.mode (--authorization-mode): \"RBAC\" must be AlwaysAllow or Webhook",
        "--cert-dir: pki must be an absolute path",
    ] {
        assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
    }
}

#[test]
fn a_certificate_without_its_key_is_refused() {
    let problems = invalid_problems(load([
        "ringlet",
        "--hostname-override",
        "n",
        "--tls-cert-file",
        "/a.crt",
    ]));
    assert_eq!(
        problems,
        ["tlsPrivateKeyFile (--tls-private-key-file): must be set with tlsCertFile /a.crt"]
    );
}

#[test]
fn configz_output_loads_back_as_the_same_configuration() {
    let yaml = format!(
        "{HEADER}staticPodPath: /etc/m\nsyncFrequency: 90s\nreadOnlyPort: 10255\nplegMode: relist\n\
         tlsCipherSuites: [TLS_AES_128_GCM_SHA256]\nauthentication:\n  anonymous:\n    enabled: true\n"
    );
    let (config, _) = load_with_file(&yaml, &[]).expect("loads");
    let configz = config.kubelet.configz();
    let written = serde_json::to_string(&configz["kubeletconfig"]).expect("json");
    let (reloaded, warnings) = load_with_file(&written, &[]).expect("configz output loads");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(reloaded.kubelet, config.kubelet);
}

#[test]
fn io_engine_from_file_and_flags() {
    let (config, _) = load_with_file(&format!("{HEADER}ioEngine: epoll\n"), &[]).expect("loads");
    assert_eq!(config.kubelet.io_engine, IoEngineSetting::Epoll);
    let (config, _) = load_with_file(
        &format!("{HEADER}ioEngine: epoll\n"),
        &["--io-engine", "uring"],
    )
    .expect("loads");
    assert_eq!(config.kubelet.io_engine, IoEngineSetting::Uring);
    let (config, _) = load_with_file(HEADER, &[]).expect("loads");
    assert_eq!(config.kubelet.io_engine, IoEngineSetting::Epoll);
    let problems = invalid_problems(load_with_file(HEADER, &["--io-engine", "kqueue"]));
    assert_eq!(
        problems,
        ["ioEngine (--io-engine): \"kqueue\" must be auto, uring or epoll"]
    );
}

#[test]
fn allowed_unsafe_sysctls_from_file_and_flags() {
    let (config, _) = load_with_file(
        &format!("{HEADER}allowedUnsafeSysctls: [\"kernel.msg*\", net.core.somaxconn]\n"),
        &[],
    )
    .expect("loads");
    assert_eq!(
        config.kubelet.sysctls.allowed_unsafe(),
        ["kernel.msg*", "net.core.somaxconn"]
    );
    let (config, _) = load_with_file(
        HEADER,
        &["--allowed-unsafe-sysctls", "kernel.sem,fs.mqueue.*"],
    )
    .expect("loads");
    assert_eq!(
        config.kubelet.sysctls.allowed_unsafe(),
        ["kernel.sem", "fs.mqueue.*"]
    );
    let problems = invalid_problems(load_with_file(
        HEADER,
        &["--allowed-unsafe-sysctls", "vm.swappiness"],
    ));
    assert_eq!(
        problems,
        [
            "allowedUnsafeSysctls (--allowed-unsafe-sysctls): the sysctl \"vm.swappiness\" is not known to be namespaced"
        ]
    );
}

#[test]
fn node_registration_from_file_and_flags() {
    let yaml = format!(
        "{HEADER}registerNode: false\nregisterWithTaints:\n- {{key: a, value: b, effect: NoSchedule}}\n\
         nodeStatusUpdateFrequency: 20s\nnodeLeaseDurationSeconds: 60\nsystemReserved:\n  cpu: 500m\n"
    );
    let (config, _) = load_with_file(
        &yaml,
        &[
            "--register-node",
            "--register-with-taints",
            "x:NoExecute",
            "--node-labels",
            "rack=r1,example.com/tier=gold",
            "--node-ip",
            "192.0.2.7",
            "--kubeconfig",
            "/etc/kubernetes/kubelet.conf",
            "--bootstrap-kubeconfig",
            "/etc/kubernetes/bootstrap.conf",
        ],
    )
    .expect("loads");
    let node = &config.kubelet.node;
    assert!(node.register_node, "the flag overrides the file");
    assert_eq!(
        node.register_with_taints,
        vec![TaintSetting {
            key: "x".to_owned(),
            value: None,
            effect: "NoExecute".to_owned()
        }]
    );
    assert_eq!(node.node_status_update_frequency, Duration::from_secs(20));
    assert_eq!(node.node_status_report_frequency, Duration::from_secs(20));
    assert_eq!(node.lease_renew_interval(), Duration::from_secs(15));
    assert_eq!(node.system_reserved["cpu"], "500m");
    assert_eq!(config.node_labels["example.com/tier"], "gold");
    assert_eq!(
        config.node_ips,
        vec!["192.0.2.7".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(
        config.bootstrap_kubeconfig,
        Some(PathBuf::from("/etc/kubernetes/bootstrap.conf"))
    );
}

#[test]
fn bad_node_flags_are_named() {
    let problems = invalid_problems(load([
        "ringlet",
        "--hostname-override",
        "n",
        "--node-labels=-bad=1",
        "--node-ip",
        "10.0.0.1,10.0.0.2",
        "--bootstrap-kubeconfig",
        "/b.conf",
        "--register-with-taints",
        "nocolon",
    ]));
    let text = problems.join("\n");
    for expected in [
        "--node-labels: label key \"-bad\"",
        "--node-ip: two addresses must be one IPv4 and one IPv6 address",
        "--bootstrap-kubeconfig: needs --kubeconfig",
        "registerWithTaints (--register-with-taints): \"nocolon\"",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
}

#[test]
fn container_log_rotation_from_file_and_flags() {
    let yaml = format!(
        "{HEADER}containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\ncontainerLogMaxWorkers: 2\n\
         containerLogMonitorInterval: 5s\n"
    );
    let (config, warnings) = load_with_file(&yaml, &[]).expect("loads");
    assert!(
        warnings.is_empty(),
        "acted on, not warned about: {warnings:?}"
    );
    let logs = &config.kubelet.container_logs;
    assert_eq!(logs.max_size, "1Mi");
    assert_eq!(logs.max_size_bytes, Some(1024 * 1024));
    assert_eq!(logs.max_files, 3);
    assert_eq!(logs.max_workers, 2);
    assert_eq!(logs.monitor_interval, Duration::from_secs(5));

    let (config, _) = load_with_file(
        &yaml,
        &[
            "--container-log-max-size",
            "-1",
            "--container-log-max-files=7",
            "--container-log-max-workers",
            "4",
            "--container-log-monitor-interval",
            "1m",
        ],
    )
    .expect("loads");
    let logs = &config.kubelet.container_logs;
    assert_eq!(logs.max_size, "-1");
    assert_eq!(
        logs.max_size_bytes, None,
        "a negative size turns rotation off"
    );
    assert_eq!(logs.max_files, 7);
    assert_eq!(logs.max_workers, 4);
    assert_eq!(logs.monitor_interval, Duration::from_mins(1));

    let configz = config.kubelet.configz();
    let kc = &configz["kubeletconfig"];
    assert_eq!(kc["containerLogMaxSize"], "-1");
    assert_eq!(kc["containerLogMaxFiles"], 7);
    assert_eq!(kc["containerLogMaxWorkers"], 4);
    assert_eq!(kc["containerLogMonitorInterval"], "1m0s");
    let written = serde_json::to_string(kc).expect("json");
    let (reloaded, _) = load_with_file(&written, &[]).expect("configz output loads");
    assert_eq!(
        reloaded.kubelet.container_logs,
        config.kubelet.container_logs
    );
}

#[test]
fn bad_container_log_settings_are_reported_together() {
    let yaml = format!(
        "{HEADER}containerLogMaxSize: 10 megs\ncontainerLogMaxFiles: 1\ncontainerLogMaxWorkers: 0\n\
         containerLogMonitorInterval: 0s\n"
    );
    assert_eq!(
        invalid_problems(load_with_file(&yaml, &[])),
        [
            "containerLogMaxSize (--container-log-max-size): \"10 megs\" is not a resource quantity such as 10Mi",
            "containerLogMaxFiles (--container-log-max-files): 1 must be greater than or equal to 2",
            "containerLogMaxWorkers (--container-log-max-workers): 0 must be greater than or equal to 1",
            "containerLogMonitorInterval (--container-log-monitor-interval): 0s must be a positive time duration greater than or equal to 3s",
        ]
    );
    let problems = invalid_problems(load_with_file(
        &format!("{HEADER}containerLogMaxFiles: \"5\"\ncontainerLogMonitorInterval: soon\n"),
        &["--container-log-max-size", "0.5"],
    ));
    assert_eq!(
        problems,
        [
            "containerLogMaxFiles: expected an integer, found string \"5\"",
            "containerLogMonitorInterval: invalid duration \"soon\": expected a number (expected e.g. \"20s\", \"1m30s\", \"2h\")",
            "containerLogMaxSize (--container-log-max-size): \"0.5\" is not a whole number of bytes",
        ]
    );
}

#[test]
fn pod_dns_from_file_and_flags() {
    let yaml = format!(
        "{HEADER}clusterDNS: [10.96.0.10, \"fd00::a\"]\nclusterDomain: cluster.local\n\
         resolvConf: /run/systemd/resolve/resolv.conf\n"
    );
    let (config, warnings) = load_with_file(&yaml, &[]).expect("loads");
    assert!(
        warnings.is_empty(),
        "acted on, not warned about: {warnings:?}"
    );
    let dns = &config.kubelet.dns;
    assert_eq!(
        dns.cluster_dns,
        [
            "10.96.0.10".parse::<IpAddr>().expect("ip"),
            "fd00::a".parse().expect("ip")
        ]
    );
    assert_eq!(dns.cluster_domain, "cluster.local");
    assert_eq!(
        dns.resolv_conf.as_deref(),
        Some(Path::new("/run/systemd/resolve/resolv.conf"))
    );

    let (config, _) = load_with_file(
        &yaml,
        &[
            "--cluster-dns",
            "10.0.0.10,10.0.0.11",
            "--cluster-domain=example.test",
            "--resolv-conf=",
        ],
    )
    .expect("loads");
    let dns = &config.kubelet.dns;
    assert_eq!(
        dns.cluster_dns,
        [
            "10.0.0.10".parse::<IpAddr>().expect("ip"),
            "10.0.0.11".parse().expect("ip")
        ]
    );
    assert_eq!(dns.cluster_domain, "example.test");
    assert_eq!(dns.resolv_conf, None, "an empty --resolv-conf means none");

    let configz = config.kubelet.configz();
    let kc = &configz["kubeletconfig"];
    assert_eq!(
        kc["clusterDNS"],
        serde_json::json!(["10.0.0.10", "10.0.0.11"])
    );
    assert_eq!(kc["clusterDomain"], "example.test");
    assert_eq!(kc["resolvConf"], "");
    let written = serde_json::to_string(kc).expect("json");
    let (reloaded, _) = load_with_file(&written, &[]).expect("configz output loads");
    assert_eq!(reloaded.kubelet.dns, config.kubelet.dns);
}

#[test]
fn bad_pod_dns_settings_are_reported_together() {
    let yaml = format!("{HEADER}clusterDNS: [10.0.0.10, dns.local]\nresolvConf: resolv.conf\n");
    assert_eq!(
        invalid_problems(load_with_file(
            &yaml,
            &["--cluster-domain", "cluster..local"]
        )),
        [
            "clusterDNS (--cluster-dns): \"dns.local\" is not an IP address",
            "clusterDomain (--cluster-domain): \"cluster..local\" must be a domain name such as cluster.local",
            "resolvConf (--resolv-conf): resolv.conf must be an absolute path, or empty for none",
        ]
    );
    let problems = invalid_problems(load_with_file(
        &format!("{HEADER}clusterDNS: 10.0.0.10\n"),
        &[],
    ));
    assert_eq!(
        problems,
        ["clusterDNS: expected a list of strings, found string \"10.0.0.10\""]
    );
}

#[test]
fn certificate_rotation_fields_and_flags_are_read() {
    let (config, warnings) =
        load_with_file(&format!("{HEADER}rotateCertificates: true\n"), &[]).expect("loads");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(config.kubelet.rotate_certificates);
    assert!(!config.kubelet.server_tls_bootstrap);
    let (config, _) = load_with_file(
        &format!("{HEADER}serverTLSBootstrap: true\n"),
        &[
            "--rotate-certificates",
            "--rotate-server-certificates=false",
        ],
    )
    .expect("loads");
    assert!(config.kubelet.rotate_certificates, "the flag sets it");
    assert!(
        !config.kubelet.server_tls_bootstrap,
        "the flag wins over the file"
    );
    let err = load_with_file(&format!("{HEADER}serverTLSBootstrap: [yes]\n"), &[])
        .expect_err("not a bool");
    let ConfigError::Invalid { problems, .. } = err else {
        panic!("{err:?}")
    };
    assert!(
        problems.iter().any(|p| p.contains("serverTLSBootstrap")),
        "{problems:?}"
    );
}

#[test]
fn eviction_fields_and_flags_are_read_and_flags_win() {
    let yaml = format!(
        "{HEADER}evictionHard:\n  memory.available: 200Mi\nevictionSoft:\n  nodefs.available: 20%\n\
         evictionSoftGracePeriod:\n  nodefs.available: 1m30s\n\
         evictionMinimumReclaim:\n  nodefs.available: 1Gi\n\
         evictionPressureTransitionPeriod: 30s\nevictionMaxPodGracePeriod: 20\n"
    );
    let (config, warnings) = load_with_file(
        &yaml,
        &[
            "--eviction-hard=memory.available<1Gi,pid.available<5%",
            "--eviction-max-pod-grace-period=40",
        ],
    )
    .expect("loads");
    assert!(warnings.is_empty(), "{warnings:?}");
    let kc = &config.kubelet;
    assert_eq!(
        kc.node.eviction_hard,
        std::collections::BTreeMap::from([
            ("memory.available".to_owned(), "1Gi".to_owned()),
            ("pid.available".to_owned(), "5%".to_owned()),
        ])
    );
    assert_eq!(kc.eviction.soft["nodefs.available"], "20%");
    assert_eq!(
        kc.eviction.soft_grace_period["nodefs.available"],
        Duration::from_secs(90)
    );
    assert_eq!(kc.eviction.minimum_reclaim["nodefs.available"], "1Gi");
    assert_eq!(
        kc.eviction.pressure_transition_period,
        Duration::from_secs(30)
    );
    assert_eq!(kc.eviction.max_pod_grace_period, 40);
    assert_eq!(
        kc.eviction
            .thresholds(&kc.node.eviction_hard)
            .map(|t| t.len()),
        Ok(3)
    );
    let problems = invalid_problems(load_with_file(
        HEADER,
        &[
            "--eviction-hard=memory.free<1Gi",
            "--eviction-soft=memory.available=1Gi",
        ],
    ));
    assert_eq!(
        problems,
        [
            "evictionSoft (--eviction-soft): \"memory.available=1Gi\" must be <signal><<value>",
            "evictionHard (--eviction-hard): unsupported eviction signal memory.free",
        ]
    );
}

#[test]
fn image_gc_from_file_and_flags() {
    let yaml = format!(
        "{HEADER}imageGCHighThresholdPercent: 90\nimageGCLowThresholdPercent: 70\n\
         imageMinimumGCAge: 5m\nimageMaximumGCAge: 24h\nimageGCPeriod: 1s\n"
    );
    let (config, warnings) = load_with_file(&yaml, &[]).expect("loads");
    assert!(
        warnings.is_empty(),
        "acted on, not warned about: {warnings:?}"
    );
    let gc = &config.kubelet.image_gc;
    assert_eq!(
        (gc.high_threshold_percent, gc.low_threshold_percent),
        (90, 70)
    );
    assert_eq!(gc.minimum_age, Duration::from_mins(5));
    assert_eq!(gc.maximum_age, Duration::from_hours(24));
    assert_eq!(gc.period, Duration::from_secs(1));
    let configz = config.kubelet.configz();
    assert_eq!(configz["kubeletconfig"]["imageGCHighThresholdPercent"], 90);
    assert_eq!(configz["kubeletconfig"]["imageMinimumGCAge"], "5m0s");

    let (config, _) = load_with_file(
        &yaml,
        &[
            "--image-gc-high-threshold",
            "100",
            "--image-gc-low-threshold=99",
            "--minimum-image-ttl-duration",
            "1m",
        ],
    )
    .expect("loads");
    let gc = &config.kubelet.image_gc;
    assert_eq!(
        (gc.high_threshold_percent, gc.low_threshold_percent),
        (100, 99)
    );
    assert_eq!(gc.minimum_age, Duration::from_mins(1));

    let problems = invalid_problems(load_with_file(&yaml, &["--image-gc-low-threshold", "95"]));
    assert_eq!(
        problems,
        [
            "imageGCLowThresholdPercent (--image-gc-low-threshold): 95 must be less than \
          imageGCHighThresholdPercent (--image-gc-high-threshold) 90"
        ]
    );
}

#[test]
fn image_pull_limits_from_file_and_flags() {
    let yaml = format!(
        "{HEADER}serializeImagePulls: false\nmaxParallelImagePulls: 2\nregistryPullQPS: 0\n\
         registryBurst: 3\n"
    );
    let (config, warnings) = load_with_file(&yaml, &[]).expect("loads");
    assert!(
        warnings.is_empty(),
        "acted on, not warned about: {warnings:?}"
    );
    let pulls = &config.kubelet.image_pull;
    assert!(!pulls.serialize);
    assert_eq!(pulls.max_parallel, std::num::NonZeroU32::new(2));
    assert_eq!((pulls.registry_qps, pulls.registry_burst), (0, 3));
    let configz = config.kubelet.configz();
    assert_eq!(configz["kubeletconfig"]["serializeImagePulls"], false);
    assert_eq!(configz["kubeletconfig"]["maxParallelImagePulls"], 2);
    assert_eq!(configz["kubeletconfig"]["registryPullQPS"], 0);

    let (config, _) =
        load_with_file(&yaml, &["--registry-qps", "7", "--registry-burst=20"]).expect("loads");
    let pulls = &config.kubelet.image_pull;
    assert_eq!((pulls.registry_qps, pulls.registry_burst), (7, 20));

    let problems = invalid_problems(load_with_file(&yaml, &["--serialize-image-pulls"]));
    assert_eq!(
        problems,
        [
            "maxParallelImagePulls: cannot be larger than 1 unless serializeImagePulls \
             (--serialize-image-pulls) is set to false"
        ]
    );
}

#[test]
fn graceful_shutdown_fields_are_read_validated_and_shown_in_configz() {
    let yaml = format!("{HEADER}shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n");
    let (config, warnings) = load_with_file(&yaml, &[]).expect("loads");
    assert!(
        warnings.is_empty(),
        "acted on, not warned about: {warnings:?}"
    );
    let shutdown = &config.kubelet.shutdown;
    assert_eq!(shutdown.grace_period, Duration::from_secs(30));
    assert_eq!(shutdown.grace_period_critical_pods, Duration::from_secs(10));
    let configz = config.kubelet.configz();
    assert_eq!(configz["kubeletconfig"]["shutdownGracePeriod"], "30s");
    assert_eq!(
        configz["kubeletconfig"]["shutdownGracePeriodCriticalPods"],
        "10s"
    );

    let yaml = format!(
        "{HEADER}shutdownGracePeriodByPodPriority:\n\
         - priority: 100000\n  shutdownGracePeriodSeconds: 5\n\
         - shutdownGracePeriodSeconds: 20\n"
    );
    let (config, _) = load_with_file(&yaml, &[]).expect("loads");
    let periods = config.kubelet.shutdown.periods();
    assert_eq!(
        periods
            .iter()
            .map(|p| (p.priority, p.shutdown_grace_period_seconds))
            .collect::<Vec<_>>(),
        [(0, 20), (100_000, 5)],
        "a missing priority is 0; sorted lowest first"
    );

    let yaml = format!(
        "{HEADER}shutdownGracePeriod: 5s\nshutdownGracePeriodCriticalPods: 10s\n\
         shutdownGracePeriodByPodPriority:\n\
         - priority: 3000000000\n  shutdownGracePeriodSeconds: -1\n  grace: 2\n\
         - soon\n"
    );
    assert_eq!(
        invalid_problems(load_with_file(&yaml, &[])),
        [
            "shutdownGracePeriodByPodPriority: [0].priority: 3000000000 is not a 32-bit integer",
            "shutdownGracePeriodByPodPriority: [0].shutdownGracePeriodSeconds: -1 must not be \
             negative",
            "shutdownGracePeriodByPodPriority: [0]: unknown field grace (expected priority and \
             shutdownGracePeriodSeconds)",
            "shutdownGracePeriodByPodPriority: [1]: expected a mapping with priority and \
             shutdownGracePeriodSeconds",
            "shutdownGracePeriodCriticalPods: 10s must be <= shutdownGracePeriod 5s",
            "shutdownGracePeriodByPodPriority: cannot be set together with shutdownGracePeriod \
             or shutdownGracePeriodCriticalPods",
        ]
    );
    let yaml = format!("{HEADER}shutdownGracePeriod: -30s\n");
    assert_eq!(
        invalid_problems(load_with_file(&yaml, &[])),
        ["shutdownGracePeriod: duration \"-30s\" must not be negative"]
    );
}

#[test]
fn enforcement_fields_read_from_the_file_and_the_flags() {
    let yaml = format!(
        "{HEADER}podPidsLimit: 512\ncpuCFSQuota: false\ncpuCFSQuotaPeriod: 50ms\n\
         seccompDefault: true\nenforceNodeAllocatable: [pods, kube-reserved]\n\
         kubeReservedCgroup: /kube.slice\n"
    );
    let (config, warnings) = load_with_file(&yaml, &[]).expect("file loads");
    assert!(warnings.is_empty(), "{warnings:?}");
    let r = &config.kubelet.resources;
    assert_eq!(r.pod_pids_limit, 512);
    assert!(!r.cpu_cfs_quota);
    assert_eq!(r.cpu_cfs_quota_period, Duration::from_millis(50));
    assert!(r.seccomp_default);
    assert_eq!(r.enforce_node_allocatable, ["pods", "kube-reserved"]);
    assert_eq!(r.kube_reserved_cgroup, "/kube.slice");
    let (config, _) = load_with_file(
        &yaml,
        &[
            "--pod-max-pids=-1",
            "--cpu-cfs-quota",
            "--cpu-cfs-quota-period=20ms",
            "--seccomp-default=false",
            "--enforce-node-allocatable=pods,system-reserved",
            "--system-reserved-cgroup=/system.slice",
        ],
    )
    .expect("flags override");
    let r = &config.kubelet.resources;
    assert_eq!(r.pod_pids_limit, -1);
    assert!(r.cpu_cfs_quota);
    assert_eq!(r.cpu_cfs_quota_period, Duration::from_millis(20));
    assert!(!r.seccomp_default);
    assert_eq!(r.enforce_node_allocatable, ["pods", "system-reserved"]);
    assert_eq!(r.system_reserved_cgroup, "/system.slice");
    let problems = invalid_problems(load_with_file(
        &format!("{HEADER}cpuCFSQuotaPeriod: 0s\nenforceNodeAllocatable: [kube-reserved]\n"),
        &[],
    ));
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].starts_with("cpuCFSQuotaPeriod (--cpu-cfs-quota-period): 0s"));
    assert!(
        problems[1].starts_with("kubeReservedCgroup (--kube-reserved-cgroup): must be specified")
    );
}
