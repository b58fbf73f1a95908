//! End-to-end: pod DNS (`clusterDNS`, `clusterDomain`, `resolvConf`, `dnsPolicy`, `dnsConfig`)
//! with the real `ringlet` binary and real pods on the lab's containerd. The cluster's DNS server
//! is a small responder run by the test on the lab bridge's address (`cni0`, 10.88.0.1:53, which
//! pods on the pod network and on the host network both reach): it answers `A` queries for the
//! names it is given and records every query, so a test sees which name a pod asked for, through
//! which nameserver, from which address. The containers print their `/etc/resolv.conf` and what
//! busybox's `nslookup` resolved. Run as root after `cargo xtask lab up`, one test at a time.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ringlet_tests::{Agent, AgentOptions, container_status, phase, require_lab, tail, wait_for};
use serde_json::Value;

const START: Duration = Duration::from_mins(2);
/// The lab bridge's address (`cargo xtask lab up`'s CNI configuration: 10.88.0.0/16 on `cni0`).
const BRIDGE: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 1);
const CLUSTER_DOMAIN: &str = "ringlet.test";
/// The node's resolv.conf the agent is given as `--resolv-conf`.
const NODE_RESOLV_CONF: &str =
    "nameserver 10.88.0.1\nsearch node.example\noptions timeout:2 attempts:3\n";

/// What `web` resolves to in each search domain, so the address a lookup printed tells which
/// search path found it.
const ANSWERS: &[(&str, Ipv4Addr)] = &[
    ("web.default.svc.ringlet.test", Ipv4Addr::new(10, 0, 0, 1)),
    ("web.node.example", Ipv4Addr::new(10, 0, 0, 2)),
    ("web.custom.test", Ipv4Addr::new(10, 0, 0, 3)),
];

/// One query the responder received.
#[derive(Clone, Debug)]
struct Query {
    from: IpAddr,
    name: String,
}

/// A DNS responder on UDP: `A` records for the names it knows, an empty answer for other types
/// of those names, `NXDOMAIN` for every other name. Stops when dropped.
struct DnsResponder {
    queries: Arc<Mutex<Vec<Query>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DnsResponder {
    fn start(socket: UdpSocket, answers: HashMap<String, Ipv4Addr>) -> Result<Self> {
        // The loop looks at `stop` between reads.
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        let queries = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (queries, stop) = (Arc::clone(&queries), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut buffer = [0u8; 1500];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((len, from)) = socket.recv_from(&mut buffer) else {
                        continue;
                    };
                    let Some((name, reply)) = reply(&buffer[..len], &answers) else {
                        continue;
                    };
                    queries
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Query {
                            from: from.ip(),
                            name,
                        });
                    let _ = socket.send_to(&reply, from);
                }
            })
        };
        Ok(Self {
            queries,
            stop,
            thread: Some(thread),
        })
    }

    fn queries(&self) -> Vec<Query> {
        self.queries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for DnsResponder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The queried name (lowercase, without the root dot) and the reply to `query`; `None` for what
/// is not a one-question query.
fn reply(query: &[u8], answers: &HashMap<String, Ipv4Addr>) -> Option<(String, Vec<u8>)> {
    const TYPE_A: u16 = 1;
    let header = query.get(..12)?;
    if header[2] & 0x80 != 0 || u16::from_be_bytes([header[4], header[5]]) != 1 {
        return None;
    }
    let mut labels = Vec::new();
    let mut at = 12;
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        // Compression pointers do not occur in a question of its own.
        if len & 0xC0 != 0 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let question = query.get(12..at + 4)?;
    let qtype = u16::from_be_bytes([query[at], query[at + 1]]);
    let name = labels.join(".");
    let address = answers.get(&name);
    let answer = address.filter(|_| qtype == TYPE_A);
    let mut reply = Vec::with_capacity(64);
    reply.extend_from_slice(&header[..2]);
    // A response, authoritative, recursion desired as asked and available.
    reply.push(0x84 | (header[2] & 0x01));
    reply.push(0x80 | if address.is_some() { 0 } else { 3 });
    for count in [1, u16::from(answer.is_some()), 0, 0] {
        reply.extend_from_slice(&u16::to_be_bytes(count));
    }
    reply.extend_from_slice(question);
    if let Some(ip) = answer {
        // The question's name (a pointer to offset 12), IN A, TTL 30 s, 4 bytes of address.
        reply.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4]);
        reply.extend_from_slice(&ip.octets());
    }
    Some((name, reply))
}

/// Binds the responder's socket on the lab bridge; the bridge exists once a pod on the pod
/// network has been set up, which `anchor` (already written) does.
fn bind_on_bridge(agent: &Agent) -> Result<UdpSocket> {
    let address = SocketAddr::from((BRIDGE, 53));
    let mut last_error = String::new();
    wait_for(&format!("{address} to be bindable"), START, || {
        UdpSocket::bind(address)
            .map_err(|err| last_error = err.to_string())
            .ok()
    })
    .with_context(|| {
        format!(
            "last bind error: {last_error}; agent log:\n{}",
            tail(&agent.log(), 40)
        )
    })
}

/// A pod running one busybox container that prints its resolv.conf and hosts file, then what
/// `nslookup web` resolved (if `lookup`), and exits.
fn lookup_pod(name: &str, spec: &str, lookup: bool) -> String {
    let lookup = if lookup { "nslookup web;" } else { "" };
    let script = format!(
        "cat /etc/resolv.conf; echo ---hosts; cat /etc/hosts; echo ---lookup; {lookup} true"
    );
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
{spec}  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {script:?}]
"#
    )
}

fn anchor_pod() -> &'static str {
    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: anchor\nspec:\n  dnsPolicy: Default\n  \
     terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: busybox\n    \
     imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n"
}

/// What a finished lookup pod printed: (resolv.conf, hosts file, lookup output), and the pod.
fn finished_output(agent: &Agent, name: &str) -> Result<(String, String, String, Value)> {
    let pod = agent.wait_pod(name, "finished", START, |pod| {
        phase(pod) == "Succeeded"
            || container_status(pod, "main").is_some_and(|c| c["state"]["terminated"].is_object())
    })?;
    let path = format!("/containerLogs/default/{name}-{}/main", agent.node);
    let (code, body) = agent.api_get(&path)?;
    if code != 200 {
        bail!("{path} answered {code}: {body}");
    }
    let (resolv_conf, rest) = body
        .split_once("---hosts\n")
        .with_context(|| format!("{name} printed no hosts file: {body}"))?;
    let (hosts, lookup) = rest
        .split_once("---lookup\n")
        .with_context(|| format!("{name} printed no lookup: {body}"))?;
    Ok((
        resolv_conf.to_owned(),
        hosts.to_owned(),
        lookup.to_owned(),
        pod,
    ))
}

/// The resolv.conf lines that matter, in order, without blank lines and comments.
fn lines(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

/// The events in the agent's `events.log` with `reason`, as (object, message).
fn logged_events(agent: &Agent, reason: &str) -> Vec<(String, String)> {
    std::fs::read_to_string(agent.root_dir().join("events.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event["reason"] == reason)
        .map(|event| {
            let text = |field: &str| event[field].as_str().unwrap_or_default().to_owned();
            (text("object"), text("message"))
        })
        .collect()
}

/// An agent given `args` and the node's resolv.conf, with the test's DNS responder on the lab
/// bridge. Dropped in this order: the agent (its pods go), the responder, the node's file.
struct DnsLab {
    agent: Agent,
    responder: DnsResponder,
    _node_dir: tempfile::TempDir,
}

impl DnsLab {
    fn start(test: &str, args: &[&str]) -> Result<Self> {
        let node_dir = tempfile::tempdir()?;
        let resolv_conf = node_dir.path().join("resolv.conf");
        std::fs::write(&resolv_conf, NODE_RESOLV_CONF)?;
        let mut args: Vec<String> = args.iter().map(|&arg| arg.to_owned()).collect();
        args.extend([
            "--resolv-conf".to_owned(),
            resolv_conf.display().to_string(),
        ]);
        let agent = Agent::start(
            test,
            AgentOptions {
                args,
                ..AgentOptions::default()
            },
        )?;
        agent.write_manifest("anchor.yaml", anchor_pod())?;
        let answers = ANSWERS
            .iter()
            .map(|(name, ip)| ((*name).to_owned(), *ip))
            .collect();
        let responder = DnsResponder::start(bind_on_bridge(&agent)?, answers)?;
        Ok(Self {
            agent,
            responder,
            _node_dir: node_dir,
        })
    }
}

/// The resolv.conf of a `ClusterFirst` pod in namespace `default`.
const CLUSTER_FIRST: [&str; 3] = [
    "search default.svc.ringlet.test svc.ringlet.test ringlet.test node.example",
    "nameserver 10.88.0.1",
    "options ndots:5",
];

/// The node's resolv.conf as containerd writes it back.
const NODE_DEFAULT: [&str; 3] = [
    "search node.example",
    "nameserver 10.88.0.1",
    "options timeout:2 attempts:3",
];

#[test]
fn cluster_first_pods_resolve_through_the_cluster_dns() -> Result<()> {
    let test = "cluster_first_pods_resolve_through_the_cluster_dns";
    if !require_lab(test) {
        return Ok(());
    }
    let lab = DnsLab::start(
        "pod-dns",
        &[
            "--cluster-dns",
            "10.88.0.1",
            "--cluster-domain",
            CLUSTER_DOMAIN,
        ],
    )?;
    let agent = &lab.agent;
    let pods = [
        ("cluster-first", "  hostname: db\n  subdomain: team\n"),
        (
            "host-net-cluster",
            "  hostNetwork: true\n  dnsPolicy: ClusterFirstWithHostNet\n",
        ),
        (
            "host-net-default",
            "  hostNetwork: true\n  dnsPolicy: ClusterFirst\n",
        ),
    ];
    for (name, spec) in pods {
        agent.write_manifest(&format!("{name}.yaml"), &lookup_pod(name, spec, true))?;
    }

    let (resolv, hosts, lookup, pod) = finished_output(agent, "cluster-first")?;
    assert_eq!(lines(&resolv), CLUSTER_FIRST, "ClusterFirst");
    assert!(lookup.contains("Address: 10.0.0.1"), "{lookup}");
    let pod_ip: IpAddr = pod["status"]["podIP"]
        .as_str()
        .context("the pod has no IP")?
        .parse()?;
    let queries = lab.responder.queries();
    assert!(
        queries
            .iter()
            .any(|q| q.name == "web.default.svc.ringlet.test" && q.from == pod_ip),
        "the pod at {pod_ip} asked the cluster DNS for its namespace's name first: {queries:?}"
    );
    assert!(
        hosts.contains("\tdb.team.default.svc.ringlet.test\tdb\n"),
        "the hosts-file name is in clusterDomain: {hosts}"
    );

    let (resolv, _, lookup, _) = finished_output(agent, "host-net-cluster")?;
    assert_eq!(lines(&resolv), CLUSTER_FIRST, "ClusterFirstWithHostNet");
    assert!(lookup.contains("Address: 10.0.0.1"), "{lookup}");

    let (resolv, _, lookup, _) = finished_output(agent, "host-net-default")?;
    assert_eq!(
        lines(&resolv),
        NODE_DEFAULT,
        "ClusterFirst on the host network is the node's resolv.conf"
    );
    assert!(lookup.contains("Address: 10.0.0.2"), "{lookup}");
    assert!(
        logged_events(agent, "MissingClusterDNS").is_empty(),
        "the cluster DNS is configured"
    );
    Ok(())
}

#[test]
fn a_pods_dns_config_is_applied_and_cut_to_the_limits() -> Result<()> {
    let test = "a_pods_dns_config_is_applied_and_cut_to_the_limits";
    if !require_lab(test) {
        return Ok(());
    }
    let lab = DnsLab::start(
        "pod-dns-config",
        &[
            "--cluster-dns",
            "10.88.0.1",
            "--cluster-domain",
            CLUSTER_DOMAIN,
        ],
    )?;
    let agent = &lab.agent;
    let none = "  dnsPolicy: None\n  dnsConfig:\n    nameservers: [10.88.0.1]\n    \
                searches: [custom.test]\n    options: [{name: ndots, value: \"2\"}, {name: edns0}]\n";
    agent.write_manifest("none.yaml", &lookup_pod("none", none, true))?;
    // One nameserver more than a resolver reads: the kubelet cuts the line and says so.
    let trimmed = "  dnsConfig:\n    nameservers: [192.0.2.10, 192.0.2.11, 192.0.2.12]\n";
    agent.write_manifest("trimmed.yaml", &lookup_pod("trimmed", trimmed, false))?;

    let (resolv, _, lookup, _) = finished_output(agent, "none")?;
    assert_eq!(
        lines(&resolv),
        [
            "search custom.test",
            "nameserver 10.88.0.1",
            "options ndots:2 edns0"
        ],
        "None is the pod's dnsConfig alone"
    );
    assert!(lookup.contains("Address: 10.0.0.3"), "{lookup}");

    let (resolv, _, _, _) = finished_output(agent, "trimmed")?;
    assert_eq!(
        lines(&resolv),
        [
            CLUSTER_FIRST[0],
            "nameserver 10.88.0.1",
            "nameserver 192.0.2.10",
            "nameserver 192.0.2.11",
            "options ndots:5",
        ]
    );
    let forming = logged_events(agent, "DNSConfigForming");
    let applied = "the applied nameserver line is: 10.88.0.1 192.0.2.10 192.0.2.11";
    assert!(
        forming.iter().any(|(object, message)| {
            object == &format!("pod/default/trimmed-{}", agent.node) && message.ends_with(applied)
        }),
        "{forming:?}"
    );
    Ok(())
}

#[test]
fn without_cluster_dns_cluster_first_pods_get_the_nodes_resolver_and_a_warning() -> Result<()> {
    let test = "without_cluster_dns_cluster_first_pods_get_the_nodes_resolver_and_a_warning";
    if !require_lab(test) {
        return Ok(());
    }
    let lab = DnsLab::start("pod-dns-missing", &[])?;
    let agent = &lab.agent;
    agent.write_manifest("fallback.yaml", &lookup_pod("fallback", "", true))?;

    let (resolv, _, lookup, _) = finished_output(agent, "fallback")?;
    assert_eq!(lines(&resolv), NODE_DEFAULT, "Default, the fallback");
    assert!(lookup.contains("Address: 10.0.0.2"), "{lookup}");
    let queries = lab.responder.queries();
    assert!(
        queries.iter().any(|q| q.name == "web.node.example"),
        "{queries:?}"
    );

    let message = "kubelet does not have ClusterDNS IP configured and cannot create Pod using \
                   \"ClusterFirst\" policy. Falling back to \"Default\" policy.";
    let missing = wait_for(
        "MissingClusterDNS events on the node and the pod",
        START,
        || {
            let events = logged_events(agent, "MissingClusterDNS");
            let on = |object: &str| {
                events
                    .iter()
                    .any(|(o, m)| o == object && m.ends_with(message))
            };
            (on(&format!("node/{}", agent.node))
                && on(&format!("pod/default/fallback-{}", agent.node)))
            .then_some(events)
        },
    )?;
    assert!(
        missing.iter().all(|(object, _)| !object.contains("anchor")),
        "a Default pod is not warned about: {missing:?}"
    );
    Ok(())
}
