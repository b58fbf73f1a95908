use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PodDNSConfigOption, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::container::PodUid;
use crate::events::Recorder;
use crate::kuberuntime::{CriClient, RuntimeHelper, RuntimeSettings};

const NODE_RESOLV_CONF: &str = "\
# written by the node's network manager
nameserver 192.0.2.53
nameserver 192.0.2.54
search corp.example. example.org
options timeout:1 edns0
";

fn pod(policy: Option<&str>, host_network: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("shop".into()),
            uid: Some("u1".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            dns_policy: policy.map(str::to_owned),
            host_network: Some(host_network),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

fn with_dns_config(mut pod: Pod, config: PodDNSConfig) -> Pod {
    if let Some(spec) = pod.spec.as_mut() {
        spec.dns_config = Some(config);
    }
    pod
}

fn option(name: &str, value: Option<&str>) -> PodDNSConfigOption {
    PodDNSConfigOption {
        name: Some(name.to_owned()),
        value: value.map(str::to_owned),
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|&s| s.to_owned()).collect()
}

fn node_conf() -> ResolvConf {
    parse_resolv_conf(Path::new("/etc/resolv.conf"), NODE_RESOLV_CONF).unwrap()
}

fn configurer(cluster_dns: &[&str], domain: &str) -> DnsConfigurer {
    DnsConfigurer::new(
        DnsSettings {
            cluster_dns: cluster_dns.iter().map(|ip| ip.parse().unwrap()).collect(),
            cluster_domain: domain.to_owned(),
            ..DnsSettings::default()
        },
        Vec::new(),
    )
}

fn cluster() -> DnsConfigurer {
    configurer(&["10.96.0.10"], "cluster.local")
}

fn config(servers: &[&str], searches: &[&str], options: &[&str]) -> cri::DnsConfig {
    cri::DnsConfig {
        servers: strings(servers),
        searches: strings(searches),
        options: strings(options),
    }
}

#[test]
fn resolv_conf_parses_as_the_kubelet_reads_it() {
    let text = "nameserver 10.0.0.1\n  # nameserver 10.0.0.9\nsearch a.example\n\
                domain ignored.example\nnameserver 10.0.0.2 extra\noptions ndots:2\n\
                search b.example. c.example\noptions rotate\n";
    let conf = parse_resolv_conf(Path::new("/r"), text).unwrap();
    assert_eq!(conf.nameservers, ["10.0.0.1", "10.0.0.2"]);
    assert_eq!(
        conf.searches,
        ["b.example", "c.example"],
        "the last search line wins"
    );
    assert_eq!(conf.options, ["rotate"], "the last options line wins");

    let err = parse_resolv_conf(Path::new("/r"), "nameserver\nnameserver 10.0.0.1\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "the node's resolver configuration /r has a nameserver line without an address"
    );
}

#[test]
fn cluster_first_resolves_through_the_cluster_dns_only() {
    let dns = cluster().pod_dns(&pod(Some("ClusterFirst"), false), node_conf());
    assert_eq!(
        dns.config,
        config(
            &["10.96.0.10"],
            &[
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example",
                "example.org"
            ],
            &["ndots:5"],
        ),
        "the node's nameservers and options give way; its search paths follow the cluster's"
    );
    assert!(dns.warnings.is_empty(), "{:?}", dns.warnings);
    // The API server's default policy.
    assert_eq!(cluster().pod_dns(&pod(None, false), node_conf()), dns);
}

#[test]
fn cluster_search_paths_come_once_and_only_with_a_cluster_domain() {
    let mut node = node_conf();
    node.searches = strings(&["cluster.local", "example.org"]);
    let dns = cluster().pod_dns(&pod(Some("ClusterFirst"), false), node.clone());
    assert_eq!(
        dns.config.searches,
        [
            "shop.svc.cluster.local",
            "svc.cluster.local",
            "cluster.local",
            "example.org"
        ]
    );
    let dns = configurer(&["10.96.0.10", "fd00::a"], "").pod_dns(&pod(None, false), node);
    assert_eq!(dns.config.servers, ["10.96.0.10", "fd00::a"]);
    assert_eq!(dns.config.searches, ["cluster.local", "example.org"]);
}

#[test]
fn cluster_first_without_cluster_dns_falls_back_to_default_and_says_so() {
    let dns =
        configurer(&[], "cluster.local").pod_dns(&pod(Some("ClusterFirst"), false), node_conf());
    assert_eq!(
        dns.config,
        config(
            &["192.0.2.53", "192.0.2.54"],
            &["corp.example", "example.org"],
            &["timeout:1", "edns0"],
        )
    );
    let message = "kubelet does not have ClusterDNS IP configured and cannot create Pod using \
                   \"ClusterFirst\" policy. Falling back to \"Default\" policy.";
    assert_eq!(
        dns.warnings,
        [
            DnsWarning {
                target: WarningTarget::Node,
                reason: "MissingClusterDNS",
                message: message.to_owned(),
            },
            DnsWarning {
                target: WarningTarget::Pod,
                reason: "MissingClusterDNS",
                message: format!("pod: \"web_shop(u1)\". {message}"),
            },
        ]
    );
}

#[test]
fn host_network_pods_need_cluster_first_with_host_net_for_the_cluster_dns() {
    let with_host_net = cluster().pod_dns(&pod(Some("ClusterFirstWithHostNet"), true), node_conf());
    assert_eq!(with_host_net.config.servers, ["10.96.0.10"]);
    assert_eq!(with_host_net.config.searches[0], "shop.svc.cluster.local");
    assert_eq!(with_host_net.config.options, ["ndots:5"]);

    let cluster_first = cluster().pod_dns(&pod(Some("ClusterFirst"), true), node_conf());
    assert_eq!(
        cluster_first.config,
        config(
            &["192.0.2.53", "192.0.2.54"],
            &["corp.example", "example.org"],
            &["timeout:1", "edns0"],
        ),
        "ClusterFirst on the host network is Default"
    );
    assert!(cluster_first.warnings.is_empty());
}

#[test]
fn default_takes_the_nodes_configuration_as_it_is() {
    let dns = cluster().pod_dns(&pod(Some("Default"), false), node_conf());
    assert_eq!(
        dns.config,
        config(
            &["192.0.2.53", "192.0.2.54"],
            &["corp.example", "example.org"],
            &["timeout:1", "edns0"],
        )
    );
    assert!(dns.warnings.is_empty());
}

#[test]
fn without_a_resolv_conf_default_pods_ask_the_nodes_loopback() {
    let settings = DnsSettings {
        resolv_conf: None,
        ..DnsSettings::default()
    };
    let no_ips = DnsConfigurer::new(settings.clone(), Vec::new());
    let dns = no_ips.pod_dns(&pod(Some("Default"), false), ResolvConf::default());
    assert_eq!(dns.config, config(&["127.0.0.1"], &["."], &[]));

    let dual_stack = DnsConfigurer::new(
        settings.clone(),
        vec!["192.0.2.2".parse().unwrap(), "fd00::2".parse().unwrap()],
    );
    let dns = dual_stack.pod_dns(&pod(Some("Default"), false), ResolvConf::default());
    assert_eq!(dns.config, config(&["127.0.0.1", "::1"], &["."], &[]));

    let ipv6 = DnsConfigurer::new(settings, vec!["fd00::2".parse().unwrap()]);
    let dns = ipv6.pod_dns(&pod(Some("ClusterFirst"), false), ResolvConf::default());
    assert_eq!(
        dns.config,
        config(&["::1"], &["."], &[]),
        "after MissingClusterDNS"
    );
}

#[test]
fn none_is_the_pods_dns_config_and_nothing_else() {
    let dns_config = PodDNSConfig {
        nameservers: Some(strings(&["10.88.0.1"])),
        searches: Some(strings(&["custom.test"])),
        options: Some(vec![option("ndots", Some("2")), option("edns0", None)]),
    };
    let dns = cluster().pod_dns(
        &with_dns_config(pod(Some("None"), false), dns_config),
        node_conf(),
    );
    assert_eq!(
        dns.config,
        config(&["10.88.0.1"], &["custom.test"], &["ndots:2", "edns0"])
    );
    assert!(dns.warnings.is_empty());

    let empty = cluster().pod_dns(&pod(Some("None"), false), node_conf());
    assert_eq!(empty.config, cri::DnsConfig::default());
}

#[test]
fn the_pods_dns_config_adds_to_the_policys_and_its_options_win() {
    let dns_config = PodDNSConfig {
        nameservers: Some(strings(&["10.96.0.10", "10.0.0.53"])),
        searches: Some(strings(&["svc.cluster.local", "extra.test"])),
        options: Some(vec![
            option("ndots", Some("2")),
            option("single-request-reopen", None),
            option("attempts", Some("")),
        ]),
    };
    let dns = cluster().pod_dns(
        &with_dns_config(pod(Some("ClusterFirst"), false), dns_config),
        node_conf(),
    );
    assert_eq!(dns.config.servers, ["10.96.0.10", "10.0.0.53"]);
    assert_eq!(
        dns.config.searches,
        [
            "shop.svc.cluster.local",
            "svc.cluster.local",
            "cluster.local",
            "corp.example",
            "example.org",
            "extra.test"
        ]
    );
    assert_eq!(
        dns.config.options,
        ["ndots:2", "single-request-reopen", "attempts"]
    );
}

#[test]
fn more_than_three_nameservers_are_cut_with_a_warning() {
    let dns_config = PodDNSConfig {
        nameservers: Some(strings(&["10.0.0.1", "10.0.0.2", "10.0.0.3"])),
        ..PodDNSConfig::default()
    };
    let dns = cluster().pod_dns(
        &with_dns_config(pod(Some("ClusterFirst"), false), dns_config),
        node_conf(),
    );
    assert_eq!(dns.config.servers, ["10.96.0.10", "10.0.0.1", "10.0.0.2"]);
    assert_eq!(
        dns.warnings,
        [DnsWarning {
            target: WarningTarget::Pod,
            reason: "DNSConfigForming",
            message: "Nameserver limits were exceeded, some nameservers have been omitted, the \
                      applied nameserver line is: 10.96.0.10 10.0.0.1 10.0.0.2"
                .to_owned(),
        }]
    );
}

fn with_searches(searches: Vec<String>) -> Pod {
    with_dns_config(
        pod(Some("None"), false),
        PodDNSConfig {
            searches: Some(searches),
            ..PodDNSConfig::default()
        },
    )
}

fn search_warning(applied: &[String]) -> DnsWarning {
    DnsWarning {
        target: WarningTarget::Pod,
        reason: "DNSConfigForming",
        message: format!(
            "Search Line limits were exceeded, some search paths have been omitted, the applied \
             search line is: {}",
            applied.join(" ")
        ),
    }
}

#[test]
fn search_paths_past_thirty_two_are_cut_with_a_warning() {
    let searches: Vec<String> = (0..40).map(|i| format!("s{i}.test")).collect();
    let dns = cluster().pod_dns(&with_searches(searches.clone()), ResolvConf::default());
    assert_eq!(dns.config.searches, searches[..32]);
    assert_eq!(dns.warnings, [search_warning(&searches[..32])]);

    let exactly = cluster().pod_dns(
        &with_searches(searches[..32].to_vec()),
        ResolvConf::default(),
    );
    assert_eq!(exactly.config.searches, searches[..32]);
    assert!(exactly.warnings.is_empty());
}

#[test]
fn a_search_path_longer_than_253_characters_is_dropped() {
    let long = format!("{}.test", "a".repeat(249));
    assert_eq!(long.len(), 254);
    let fits = format!("{}.test", "a".repeat(248));
    let searches = strings(&["first.test", &long, &fits]);
    let dns = cluster().pod_dns(&with_searches(searches), ResolvConf::default());
    let kept = strings(&["first.test", &fits]);
    assert_eq!(dns.config.searches, kept);
    assert_eq!(dns.warnings, [search_warning(&kept)]);
}

#[test]
fn a_search_line_past_2048_characters_loses_paths_from_its_end() {
    // Nine paths of 250 characters: 8 fit in 8 * 251 - 1 = 2007 characters, 9 do not.
    let searches: Vec<String> = (0..9)
        .map(|i| format!("{i}{}.test", "a".repeat(244)))
        .collect();
    assert!(searches.iter().all(|s| s.len() == 250));
    let dns = cluster().pod_dns(&with_searches(searches.clone()), ResolvConf::default());
    assert_eq!(dns.config.searches, searches[..8]);
    assert_eq!(dns.warnings, [search_warning(&searches[..8])]);

    // Exactly 2048 characters fit.
    let mut exact = searches[..8].to_vec();
    exact.push("b".repeat(2048 - 2007 - 1));
    assert_eq!(exact.join(" ").len(), 2048);
    let dns = cluster().pod_dns(&with_searches(exact.clone()), ResolvConf::default());
    assert_eq!(dns.config.searches, exact);
    assert!(dns.warnings.is_empty());
}

#[test]
fn the_node_resolv_conf_is_checked_against_the_limits() {
    let path = "/etc/resolv.conf";
    let node = |searches: Vec<String>| ResolvConf {
        searches,
        ..ResolvConf::default()
    };
    let thirty: Vec<String> = (0..30).map(|i| format!("s{i}.test")).collect();
    assert_eq!(
        cluster().check_node_resolv_conf(&node(thirty.clone())),
        Some(format!(
            "Resolv.conf file '{path}' contains search line consisting of more than 29 domains!"
        )),
        "three paths are the cluster's"
    );
    assert_eq!(
        configurer(&[], "").check_node_resolv_conf(&node(thirty)),
        None
    );
    assert_eq!(
        cluster().check_node_resolv_conf(&node(vec!["a".repeat(254)])),
        Some(format!(
            "Resolv.conf file \"{path}\" contains a search path which length is more than allowed 253 chars!"
        ))
    );
    let long_line: Vec<String> = (0..9).map(|_| "a".repeat(250)).collect();
    assert_eq!(
        cluster().check_node_resolv_conf(&node(long_line)),
        Some(format!(
            "Resolv.conf file '{path}' contains search line which length is more than allowed 2048 chars!"
        ))
    );
    assert_eq!(cluster().check_node_resolv_conf(&node_conf()), None);
    let no_file = DnsConfigurer::new(
        DnsSettings {
            resolv_conf: None,
            ..DnsSettings::default()
        },
        Vec::new(),
    );
    assert_eq!(
        no_file.check_node_resolv_conf(&node(vec!["a".repeat(254)])),
        None
    );
}

fn reading(path: Option<PathBuf>) -> DnsConfigurer {
    DnsConfigurer::new(
        DnsSettings {
            resolv_conf: path,
            ..DnsSettings::default()
        },
        Vec::new(),
    )
}

#[tokio::test]
async fn the_node_resolv_conf_is_read_from_resolv_conf() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resolv.conf");
    std::fs::write(&path, NODE_RESOLV_CONF).unwrap();
    assert_eq!(
        reading(Some(path.clone()))
            .read_node_resolv_conf()
            .await
            .unwrap(),
        node_conf()
    );
    assert_eq!(
        reading(None).read_node_resolv_conf().await.unwrap(),
        ResolvConf::default()
    );

    let missing = dir.path().join("missing.conf");
    let err = reading(Some(missing.clone()))
        .read_node_resolv_conf()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, DnsError::Read { path, .. } if *path == missing),
        "{err:?}"
    );

    // A sparse file: big without writing it.
    let big = dir.path().join("big.conf");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(MAX_RESOLV_CONF_BYTES + 1)
        .unwrap();
    let err = reading(Some(big))
        .read_node_resolv_conf()
        .await
        .unwrap_err();
    assert!(matches!(err, DnsError::TooLarge { .. }), "{err:?}");
}

struct Helper;

impl RuntimeHelper for Helper {
    fn pod_cgroup_parent(&self, _pod: &Pod) -> Result<String, String> {
        Ok("/kubepods/besteffort/podu1".to_owned())
    }
    fn pod_dir(&self, uid: &PodUid) -> PathBuf {
        PathBuf::from("/nonexistent/pods").join(uid.as_str())
    }
    fn node_name(&self) -> &'static str {
        "node-1"
    }
    fn pod_log_dir(&self, _namespace: &str, _name: &str, uid: &PodUid) -> PathBuf {
        PathBuf::from("/nonexistent/logs").join(uid.as_str())
    }
}

/// A runtime manager whose CRI is never dialled (building sandbox configs does not reach it).
fn manager(dns: DnsConfigurer, recorder: &Recorder) -> KubeGenericRuntimeManager {
    let cri = CriClient::new("unix:///nonexistent/cri.sock", Duration::from_secs(1)).unwrap();
    KubeGenericRuntimeManager::new(
        cri,
        Arc::new(Helper),
        recorder.clone(),
        RuntimeSettings {
            dns,
            ..RuntimeSettings::default()
        },
    )
}

#[tokio::test]
async fn the_sandbox_config_carries_the_pods_dns_and_its_warnings_become_events() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resolv.conf");
    std::fs::write(&path, NODE_RESOLV_CONF).unwrap();
    let settings = |cluster_dns: &[&str]| DnsSettings {
        cluster_dns: cluster_dns.iter().map(|ip| ip.parse().unwrap()).collect(),
        cluster_domain: "cluster.local".to_owned(),
        resolv_conf: Some(path.clone()),
    };

    let recorder = Recorder::new(None);
    let with_cluster_dns = manager(
        DnsConfigurer::new(settings(&["10.96.0.10"]), Vec::new()),
        &recorder,
    );
    let config = with_cluster_dns
        .pod_sandbox_config(&pod(None, false), 0, Path::new("/l"))
        .await
        .unwrap();
    let dns = config.dns_config.unwrap();
    assert_eq!(dns.servers, ["10.96.0.10"]);
    assert_eq!(dns.options, ["ndots:5"]);
    assert!(recorder.recent().is_empty());

    let without = manager(DnsConfigurer::new(settings(&[]), Vec::new()), &recorder);
    let config = without
        .pod_sandbox_config(&pod(None, false), 0, Path::new("/l"))
        .await
        .unwrap();
    assert_eq!(
        config.dns_config.unwrap().servers,
        ["192.0.2.53", "192.0.2.54"]
    );
    let events: Vec<(String, String)> = recorder
        .recent()
        .into_iter()
        .map(|e| (e.object, e.reason))
        .collect();
    let missing = "MissingClusterDNS".to_owned();
    assert_eq!(
        events,
        [
            ("node/node-1".to_owned(), missing.clone()),
            ("pod/shop/web".to_owned(), missing)
        ]
    );

    std::fs::write(&path, "nameserver\n").unwrap();
    let err = without
        .pod_sandbox_config(&pod(None, false), 0, Path::new("/l"))
        .await
        .unwrap_err();
    assert!(err.contains("nameserver line without an address"), "{err}");
}

#[tokio::test]
async fn a_node_resolv_conf_past_the_limits_is_an_event_on_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resolv.conf");
    let searches: Vec<String> = (0..30).map(|i| format!("s{i}.test")).collect();
    std::fs::write(&path, format!("search {}\n", searches.join(" "))).unwrap();
    let recorder = Recorder::new(None);
    let configurer = |path: Option<PathBuf>| {
        DnsConfigurer::new(
            DnsSettings {
                cluster_domain: "cluster.local".to_owned(),
                resolv_conf: path,
                ..DnsSettings::default()
            },
            Vec::new(),
        )
    };
    manager(configurer(Some(path)), &recorder)
        .check_node_resolv_conf()
        .await;
    manager(configurer(None), &recorder)
        .check_node_resolv_conf()
        .await;
    manager(configurer(Some(dir.path().join("missing"))), &recorder)
        .check_node_resolv_conf()
        .await;
    let events = recorder.recent();
    let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(
        reasons,
        ["CheckLimitsForResolvConf", "CheckLimitsForResolvConf"]
    );
    assert!(
        events[0].message.contains("more than 29 domains"),
        "{events:?}"
    );
    assert!(
        events[1]
            .message
            .starts_with("reading the node's resolver configuration"),
        "{events:?}"
    );
    assert!(
        events.iter().all(|e| e.object == "node/node-1"),
        "{events:?}"
    );
}
