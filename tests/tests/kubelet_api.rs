//! End-to-end: the kubelet API over TLS, served by the real `ringlet` binary with real pods on the
//! lab's containerd, talked to with `curl` (the test's client certificate, signed by the CA given
//! as `--client-ca-file`). Run as root after `cargo xtask lab up`, one test at a time.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ringlet_tests::{
    Agent, AgentOptions, busybox_pod, container_status, http_get, phase, require_lab, wait_for,
};
use serde_json::Value;

const START: Duration = Duration::from_mins(1);

fn running(pod: &Value) -> bool {
    phase(pod) == "Running"
        && container_status(pod, "main").is_some_and(|c| c["state"]["running"].is_object())
}

fn json(body: &str) -> Result<Value> {
    serde_json::from_str(body).with_context(|| format!("not JSON: {body}"))
}

#[test]
fn the_api_authenticates_clients_and_serves_pods_configz_and_healthz() -> Result<()> {
    if !require_lab("the_api_authenticates_clients_and_serves_pods_configz_and_healthz") {
        return Ok(());
    }
    let mut agent = Agent::start("api-basics", AgentOptions::default())?;
    agent.write_manifest("web.yaml", &busybox_pod("web", "Always", "exec sleep 3600"))?;
    agent.wait_pod("web", "running", START, running)?;

    let (code, body) = agent.api_request("GET", "/pods", false)?;
    assert_eq!(code, 401, "no client certificate, anonymous off: {body}");

    let (code, body) = agent.api_get("/pods")?;
    assert_eq!(code, 200, "{body}");
    let names: Vec<String> = json(&body)?["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|pod| pod["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(names, [format!("web-{}", agent.node)]);

    let (code, body) = agent.api_get("/runningpods/")?;
    assert_eq!(code, 200, "{body}");
    let running_pods = json(&body)?;
    assert_eq!(
        running_pods["items"][0]["spec"]["containers"][0]["name"],
        "main"
    );

    let (code, body) = agent.api_get("/configz")?;
    assert_eq!(code, 200, "{body}");
    let configz = json(&body)?;
    assert_eq!(configz["kubeletconfig"]["port"], agent.api_port);
    assert_eq!(
        configz["kubeletconfig"]["authentication"]["anonymous"]["enabled"],
        false
    );

    let (code, body) = agent.api_get("/healthz?verbose")?;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[+]pleg ok"), "{body}");
    assert_eq!(agent.api_get("/healthz/syncloop")?.0, 200);
    assert_eq!(agent.api_get("/nope")?.0, 404);
    assert_eq!(agent.api_request("DELETE", "/pods", true)?.0, 405);

    // The generated serving certificate is kept and reused by the next start.
    let generated = std::fs::read(agent.serving_cert())?;
    agent.restart()?;
    assert_eq!(std::fs::read(agent.serving_cert())?, generated);
    assert_eq!(agent.api_get("/healthz")?.0, 200);
    Ok(())
}

#[test]
fn anonymous_requests_are_served_only_when_enabled() -> Result<()> {
    if !require_lab("anonymous_requests_are_served_only_when_enabled") {
        return Ok(());
    }
    let agent = Agent::start(
        "api-anonymous",
        AgentOptions {
            args: vec!["--anonymous-auth=true".to_owned()],
            ..AgentOptions::default()
        },
    )?;
    let (code, body) = agent.api_request("GET", "/healthz", false)?;
    assert_eq!((code, body.as_str()), (200, "ok"));
    Ok(())
}

#[test]
fn container_logs_follow_a_container_that_prints() -> Result<()> {
    if !require_lab("container_logs_follow_a_container_that_prints") {
        return Ok(());
    }
    let agent = Agent::start("api-logs", AgentOptions::default())?;
    agent.write_manifest(
        "talker.yaml",
        &busybox_pod(
            "talker",
            "Always",
            "i=0; while true; do i=$((i+1)); echo line-$i; sleep 0.2; done",
        ),
    )?;
    agent.wait_pod("talker", "running", START, running)?;
    let path = format!("/containerLogs/default/talker-{}/main", agent.node);

    let (code, body) = agent.api_get(&format!("{path}?tailLines=2"))?;
    assert_eq!(code, 200, "{body}");
    assert!(body.lines().count() <= 2, "{body}");

    let (code, body) = agent.api_get(&format!("{path}?tailLines=abc"))?;
    assert_eq!(code, 400);
    assert!(body.contains("tailLines"), "{body}");

    // Follow: lines printed after the request was made keep arriving on the same response.
    let mut curl = agent.curl(true);
    curl.arg("-N")
        .arg(format!(
            "https://127.0.0.1:{}{path}?follow=true&timestamps=true",
            agent.api_port
        ))
        .stdout(Stdio::piped());
    let mut child = curl.spawn()?;
    let stdout = child.stdout.take().context("curl stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().context("no log line")??;
    let first_number = line_number(&first)?;
    let mut last_number = first_number;
    for line in lines.by_ref().take(10) {
        let line = line?;
        assert!(
            line.split_once(' ').is_some_and(|(ts, _)| ts.contains('T')),
            "no timestamp: {line}"
        );
        last_number = line_number(&line)?;
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        last_number >= first_number + 10,
        "followed from line {first_number} to {last_number}"
    );
    Ok(())
}

fn line_number(line: &str) -> Result<u64> {
    let Some((_, number)) = line.rsplit_once("line-") else {
        bail!("unexpected log line {line:?}");
    };
    Ok(number.trim().parse()?)
}

#[test]
fn stats_summary_moves_when_a_container_burns_cpu() -> Result<()> {
    if !require_lab("stats_summary_moves_when_a_container_burns_cpu") {
        return Ok(());
    }
    let agent = Agent::start("api-stats", AgentOptions::default())?;
    agent.write_manifest(
        "burner.yaml",
        &busybox_pod("burner", "Always", "while true; do :; done"),
    )?;
    agent.wait_pod("burner", "running", START, running)?;
    let pod_name = format!("burner-{}", agent.node);
    let cpu_seconds = || -> Option<(u64, u64)> {
        let (code, body) = agent.api_get("/stats/summary").ok()?;
        if code != 200 {
            return None;
        }
        let summary: Value = serde_json::from_str(&body).ok()?;
        let pod = summary["pods"]
            .as_array()?
            .iter()
            .find(|p| p["podRef"]["name"] == pod_name.as_str())?
            .clone();
        let container = pod["containers"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == "main")?
            .clone();
        let cpu = container["cpu"]["usageCoreNanoSeconds"].as_u64()?;
        let memory = container["memory"]["workingSetBytes"].as_u64()?;
        Some((cpu, memory))
    };
    let (first, memory) = wait_for("the burner in /stats/summary", START, cpu_seconds)?;
    assert!(memory > 0);
    wait_for(
        "the burner's CPU time to grow",
        Duration::from_secs(30),
        || cpu_seconds().filter(|(cpu, _)| *cpu > first + 100_000_000),
    )?;

    let (code, resource) = agent.api_get("/metrics/resource")?;
    assert_eq!(code, 200);
    assert!(
        resource.lines().any(|line| line.starts_with(
            &format!("container_cpu_usage_seconds_total{{container=\"main\",namespace=\"default\",pod=\"{pod_name}\"}}")
        )),
        "{resource}"
    );
    let (code, metrics) = agent.api_get("/metrics")?;
    assert_eq!(code, 200);
    for (name, text) in [("/metrics", metrics), ("/metrics/resource", resource)] {
        promtool_accepts(name, &text)?;
    }
    Ok(())
}

fn promtool_accepts(name: &str, text: &str) -> Result<()> {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run promtool (apt install prometheus)")?;
    promtool
        .stdin
        .take()
        .context("promtool stdin")?
        .write_all(text.as_bytes())?;
    let out = promtool.wait_with_output()?;
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Exit 3 is lint advice. The one finding allowed is the kubelet's own counter name
    // `kubelet_pleg_discard_events` (no `_total`), which ringlet keeps for dashboards' sake.
    let kubelet_names_only = findings
        .lines()
        .filter(|line| !line.trim().is_empty())
        .all(|line| line.starts_with("kubelet_pleg_discard_events "));
    match out.status.code() {
        Some(0) => Ok(()),
        Some(3) if kubelet_names_only => Ok(()),
        _ => bail!("promtool rejects {name}: {findings}"),
    }
}

#[test]
fn node_logs_refuse_traversal_and_debugging_can_be_switched_off() -> Result<()> {
    if !require_lab("node_logs_refuse_traversal_and_debugging_can_be_switched_off") {
        return Ok(());
    }
    let agent = Agent::start("api-nodelogs", AgentOptions::default())?;
    let (code, listing) = agent.api_get("/logs/")?;
    assert_eq!(code, 200, "{listing}");
    for attack in [
        "/logs/../etc/passwd",
        "/logs/%2e%2e/etc/passwd",
        "/logs/..%2fetc/passwd",
    ] {
        let (code, body) = agent.api_get(attack)?;
        assert!(
            code == 400 || code == 404,
            "{attack} answered {code}: {body}"
        );
        assert!(!body.contains("root:"), "{attack} leaked /etc/passwd");
    }
    drop(agent);

    let agent = Agent::start(
        "api-nodebug",
        AgentOptions {
            args: vec!["--enable-debugging-handlers=false".to_owned()],
            ..AgentOptions::default()
        },
    )?;
    let (code, body) = agent.api_get("/logs/")?;
    assert_eq!(code, 405, "{body}");
    assert_eq!(body.trim(), "Debug endpoints are disabled.");
    let (code, _) = agent.api_request("POST", "/exec/default/x/main?command=true", true)?;
    assert_eq!(code, 405);
    assert_eq!(agent.api_get("/pods")?.0, 200);
    Ok(())
}

#[test]
fn hostile_clients_do_not_stop_the_api() -> Result<()> {
    if !require_lab("hostile_clients_do_not_stop_the_api") {
        return Ok(());
    }
    let agent = Agent::start("api-hostile", AgentOptions::default())?;
    // A flood of connections that never finish a TLS handshake, some sending half a request.
    let mut held = Vec::new();
    for i in 0..300 {
        let mut stream = TcpStream::connect(("127.0.0.1", agent.api_port))?;
        if i % 2 == 0 {
            stream.write_all(b"\x16\x03\x01")?;
        }
        held.push(stream);
    }
    // A slowloris on the plain read-only port: half a header.
    let mut slow = TcpStream::connect(("127.0.0.1", agent.read_only_port))?;
    slow.write_all(b"GET /pods HTTP/1.1\r\nHost: x\r\n")?;
    // An oversized header.
    let big_header = agent.dir.path().join("big-header");
    std::fs::write(&big_header, format!("X-Big: {}\n", "a".repeat(2 << 20)))?;
    let mut oversized = agent.curl(true);
    oversized
        .args(["-o", "/dev/null", "-w", "%{http_code}", "-H"])
        .arg(format!("@{}", big_header.display()))
        .arg(format!("https://127.0.0.1:{}/pods", agent.api_port));
    let code = String::from_utf8_lossy(&oversized.output()?.stdout)
        .trim()
        .to_owned();
    assert!(
        code == "431" || code == "400" || code == "000",
        "oversized header answered {code}"
    );
    // Throughout, the API and the healthz port keep answering.
    assert_eq!(agent.api_get("/healthz")?.0, 200, "{}", agent.log());
    assert_eq!(http_get(agent.healthz_port, "/healthz")?.0, 200);
    drop(held);
    drop(slow);
    assert_eq!(agent.api_get("/healthz")?.0, 200);
    Ok(())
}

#[test]
fn exec_runs_a_command_through_the_cri_streaming_server() -> Result<()> {
    if !require_lab("exec_runs_a_command_through_the_cri_streaming_server") {
        return Ok(());
    }
    let agent = Agent::start("api-exec", AgentOptions::default())?;
    agent.write_manifest("box.yaml", &busybox_pod("box", "Always", "exec sleep 3600"))?;
    agent.wait_pod("box", "running", START, running)?;
    let path = format!(
        "/exec/default/box-{}/main?command=sh&command=-c&command=echo%20hello-$((6*7))&output=1",
        agent.node
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (stdout, status) = runtime.block_on(websocket_exec(&agent, &path))?;
    assert_eq!(stdout, "hello-42\n");
    assert!(status.contains("Success"), "status channel: {status}");

    let (code, body) = agent.api_request(
        "POST",
        &format!("/run/default/box-{}/main?cmd=echo%20ran", agent.node),
        true,
    )?;
    assert_eq!((code, body.as_str()), (200, "ran\n"));
    Ok(())
}

/// A `v4.channel.k8s.io` WebSocket session through the agent's TLS API, authenticated with the
/// test's client certificate; returns stdout (channel 1) and the status channel (3).
async fn websocket_exec(agent: &Agent, path: &str) -> Result<(String, String)> {
    use futures::StreamExt;
    use rustls_pki_types::ServerName;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let config =
        ringlet_tests::ClientIdentity::tls_client_config(agent.dir.path(), &agent.serving_cert())?;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", agent.api_port)).await?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("127.0.0.1")?, tcp)
        .await?;
    let mut request = format!("wss://127.0.0.1:{}{path}", agent.api_port).into_client_request()?;
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", "v4.channel.k8s.io".parse()?);
    let (mut socket, response) = tokio_tungstenite::client_async(request, tls).await?;
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        "v4.channel.k8s.io"
    );
    let (mut stdout, mut status) = (Vec::new(), Vec::new());
    while let Some(message) = socket.next().await {
        match message? {
            Message::Binary(data) => match data.split_first() {
                Some((1, rest)) => stdout.extend_from_slice(rest),
                Some((3, rest)) => status.extend_from_slice(rest),
                _ => {}
            },
            Message::Close(_) => break,
            _ => {}
        }
    }
    Ok((String::from_utf8(stdout)?, String::from_utf8(status)?))
}
