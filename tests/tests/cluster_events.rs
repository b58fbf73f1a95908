//! The event sink against the real API server (`cargo xtask cluster up`): the recorder, connected
//! with a node's credentials as the agent would be, creates core/v1 Events with the kubelet's
//! involvedObject (UID, container fieldPath), source and reporting fields, folds 30 identical
//! events into one counted Event (as far as client-go's spam filter lets them through), and
//! combines the tenth distinct message of a reason into "(combined from similar events): ".

use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use ringlet::apiserver::{ApiClient, ApiClientOptions};
use ringlet::events::{EventObject, EventType, Recorder};
use ringlet_tests::cluster::{run, run_with_input};
use ringlet_tests::{Cluster, require_cluster, wait_for};
use serde_json::{Value, json};

const NAMESPACE: &str = "events-e2e";
const NODE: &str = "events-e2e-node";
const POD: &str = "crashloop";
/// How long the sink may take to write a few dozen events to a local API server.
const DEADLINE: Duration = Duration::from_mins(1);

/// Removes what the test created, also when it fails. The namespace itself stays, as every
/// namespace of the harness does: without kube-controller-manager's namespace controller a
/// deleted namespace stays Terminating for good, and the next run could not create its pod there.
struct Cleanup<'a> {
    cluster: &'a Cluster,
}

impl Cleanup<'_> {
    fn run(&self) -> Result<()> {
        // No kubelet confirms the pod's end, so only a forced delete removes it.
        run(self.cluster.kubectl().args([
            "delete",
            "pod",
            POD,
            "-n",
            NAMESPACE,
            "--ignore-not-found",
            "--force",
            "--grace-period=0",
        ]))?;
        run(self
            .cluster
            .kubectl()
            .args(["delete", "events", "--all", "-n", NAMESPACE]))?;
        let node_events = format!("involvedObject.kind=Node,involvedObject.name={NODE}");
        run(self.cluster.kubectl().args([
            "delete",
            "events",
            "-n",
            "default",
            "--field-selector",
            &node_events,
        ]))?;
        Ok(())
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if let Err(err) = self.run() {
            eprintln!("cleaning up after the events test: {err:#}");
        }
    }
}

fn pod_manifest() -> String {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": POD, "namespace": NAMESPACE },
        "spec": {
            // Bound by hand: no scheduler runs, and the Node authorizer ties the pod to the node.
            "nodeName": NODE,
            "initContainers": [{ "name": "setup", "image": "busybox" }],
            "containers": [{ "name": "main", "image": "busybox" }],
        },
    })
    .to_string()
}

/// The events of `namespace` whose involvedObject has `uid`.
fn events_about(cluster: &Cluster, namespace: &str, uid: &str) -> Result<Vec<Value>> {
    let list = cluster.get_json(&["events", "-n", namespace])?;
    Ok(list["items"]
        .as_array()
        .context("no items in the event list")?
        .iter()
        .filter(|e| e["involvedObject"]["uid"] == uid)
        .cloned()
        .collect())
}

fn with_reason<'a>(events: &'a [Value], reason: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["reason"] == reason).collect()
}

const BACK_OFF: &str = "Back-off restarting failed container main in pod crashloop";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_the_api_server_counted_and_combined_like_the_kubelets() -> Result<()> {
    let Some(cluster) =
        require_cluster("events_reach_the_api_server_counted_and_combined_like_the_kubelets")
    else {
        return Ok(());
    };
    cluster.prepare_namespace(NAMESPACE)?;
    let cleanup = Cleanup { cluster: &cluster };
    // A failed run may have left its objects behind.
    cleanup.run()?;
    run_with_input(
        cluster.kubectl().args(["create", "-f", "-"]),
        &pod_manifest(),
    )?;
    let pod: Pod = serde_json::from_value(cluster.get_json(&["pod", POD, "-n", NAMESPACE])?)?;
    let uid = pod.metadata.uid.clone().context("the pod has no UID")?;

    // As the agent connects: with the node's own identity, so the Node authorizer applies.
    let kubeconfig = cluster.node_kubeconfig(NODE)?;
    let client = ApiClient::from_kubeconfig(&kubeconfig, ApiClientOptions::default()).await?;
    let recorder = Recorder::new(None);
    recorder.connect(client, NODE, 50, 100)?;
    record_a_crash_loop(&recorder, &pod);
    // The sink writes in order, so once the node's event (recorded last) is in, so is everything
    // before it.
    recorder.event(
        EventType::Normal,
        EventObject::node(NODE),
        "NodeReady",
        "ready",
    );
    let node_event = wait_for("the node's event", DEADLINE, || {
        let list = cluster.get_json(&["events", "-n", "default"]).ok()?;
        list["items"]
            .as_array()?
            .iter()
            .find(|e| e["involvedObject"]["kind"] == "Node" && e["involvedObject"]["name"] == NODE)
            .cloned()
    })?;
    assert_eq!(node_event["reason"], "NodeReady");
    assert_eq!(node_event["involvedObject"]["apiVersion"], "v1");
    assert!(
        node_event["involvedObject"]["namespace"].is_null(),
        "{node_event}"
    );

    let events = events_about(&cluster, NAMESPACE, &uid)?;
    check_references_and_source(&events, &pod)?;
    check_counted_and_combined(&events, &uid);

    // It would have landed where namespace-less objects' events go, before the node's.
    let defaults = cluster.get_json(&["events", "-n", "default"])?;
    let local = defaults["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["reason"] == "FailedToParse" && e["source"]["host"] == NODE);
    assert_eq!(local, None, "a local event reached the API server");
    assert_eq!(recorder.dropped_events(), 0);
    assert_eq!(recorder.recent().len(), 2 + 30 + 12 + 3);

    drop(cleanup);
    Ok(())
}

/// What a kubelet records about a pod whose container keeps crashing, and a bad manifest file.
fn record_a_crash_loop(recorder: &Recorder, pod: &Pod) {
    let main = || EventObject::container(pod, "main");
    recorder.event(
        EventType::Normal,
        EventObject::container(pod, "setup"),
        "Created",
        "Created container setup",
    );
    recorder.event(
        EventType::Normal,
        main(),
        "Started",
        "Started container main",
    );
    for _ in 0..30 {
        recorder.event(EventType::Warning, main(), "BackOff", BACK_OFF);
    }
    for i in 1..=12 {
        recorder.event(
            EventType::Normal,
            main(),
            "Pulling",
            format!("Pulling image \"busybox:{i}\""),
        );
    }
    recorder.event(
        EventType::Normal,
        EventObject::pod(pod),
        "Killing",
        "stopped the pod's containers",
    );
    // Files are no API objects: this one stays in the agent's own record.
    recorder.event(
        EventType::Warning,
        EventObject::local("file//etc/kubernetes/manifests/broken.yaml"),
        "FailedToParse",
        "bad yaml",
    );
}

/// The involvedObject (UID, resourceVersion, container fieldPath), name, source and reporting
/// fields of single events.
fn check_references_and_source(events: &[Value], pod: &Pod) -> Result<()> {
    let started = with_reason(events, "Started");
    assert_eq!(started.len(), 1, "{events:#?}");
    let started = started[0];
    let object = &started["involvedObject"];
    assert_eq!(object["kind"], "Pod");
    assert_eq!(object["apiVersion"], "v1");
    assert_eq!(object["namespace"], NAMESPACE);
    assert_eq!(object["name"], POD);
    assert_eq!(object["fieldPath"], "spec.containers{main}");
    assert_eq!(
        object["resourceVersion"].as_str(),
        pod.metadata.resource_version.as_deref()
    );
    assert_eq!(started["type"], "Normal");
    assert_eq!(started["message"], "Started container main");
    assert_eq!(started["count"], 1);
    assert_eq!(
        started["source"],
        json!({ "component": "kubelet", "host": NODE })
    );
    assert_eq!(started["reportingComponent"], "kubelet");
    assert_eq!(started["reportingInstance"], NODE);
    let name = started["metadata"]["name"].as_str().unwrap_or_default();
    let Some(suffix) = name.strip_prefix("crashloop.") else {
        bail!("the event's name is not <pod>.<hex>: {name}");
    };
    assert!(u64::from_str_radix(suffix, 16).is_ok(), "{name}");

    let created = with_reason(events, "Created");
    assert_eq!(created.len(), 1, "{events:#?}");
    assert_eq!(
        created[0]["involvedObject"]["fieldPath"],
        "spec.initContainers{setup}"
    );
    let killing = with_reason(events, "Killing");
    assert_eq!(killing.len(), 1, "{events:#?}");
    assert!(killing[0]["involvedObject"]["fieldPath"].is_null());
    Ok(())
}

/// What client-go's correlator makes of 30 identical warnings and 12 distinct messages.
fn check_counted_and_combined(events: &[Value], uid: &str) {
    // 30 identical warnings: one Event. client-go's spam filter lets 25 events per object and
    // type through at once (one more every 5 minutes), so it stops counting at 25.
    let back_offs = with_reason(events, "BackOff");
    assert_eq!(back_offs.len(), 1, "{back_offs:#?}");
    assert_eq!(back_offs[0]["count"], 25);
    assert_eq!(back_offs[0]["message"], BACK_OFF);
    assert_eq!(back_offs[0]["type"], "Warning");
    assert_ne!(back_offs[0]["firstTimestamp"], Value::Null);

    // 12 distinct messages of one reason: 9 on their own, then one combined Event that the 10th
    // created and the 11th and 12th counted up.
    let pulling = with_reason(events, "Pulling");
    let (combined, single): (Vec<&Value>, Vec<&Value>) = pulling.iter().partition(|e| {
        e["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("(combined from similar events): "))
    });
    assert_eq!(single.len(), 9, "{pulling:#?}");
    assert!(single.iter().all(|e| e["count"] == 1), "{pulling:#?}");
    assert_eq!(combined.len(), 1, "{pulling:#?}");
    assert_eq!(
        combined[0]["message"],
        "(combined from similar events): Pulling image \"busybox:12\""
    );
    assert_eq!(combined[0]["count"], 3);
    assert_eq!(combined[0]["involvedObject"]["uid"], uid);
}
