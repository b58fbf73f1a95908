use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::json;

use super::*;
use crate::apis::config::CgroupDriver;
use crate::container::{ContainerId, PodUid};

mod privileged;

const MIB: u64 = 1024 * 1024;
const NET_DEV: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  900 9 0 0 0 0 0 0  900 9 0 0 0 0 0 0
  eth0: 1000 10 1 0 0 0 0 0 2000 20 2 0 0 0 0 0
vethab12: 5 1 0 0 0 0 0 0 6 1 0 0 0 0 0 0
  cni0:  300 3 0 0 0 0 0 0  400 4 3 0 0 0 0 0
";
/// What the v1 memory controller reports for "no limit" (`i64::MAX` rounded down to a page).
const V1_UNLIMITED: u64 = 9_223_372_036_854_771_712;
const POD_CGROUP: &str = "/kubepods/burstable/pod1234";
const CONTAINER_ID: &str = "c0ffee";

#[derive(Debug)]
struct ManualClock(Mutex<Timestamp>);

impl ManualClock {
    fn at(seconds: i64) -> Arc<Self> {
        Arc::new(Self(Mutex::new(Timestamp::from_second(seconds).unwrap())))
    }

    fn advance(&self, by: SignedDuration) {
        let mut now = self.0.lock().unwrap();
        *now = now.checked_add(by).unwrap();
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap()
    }
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// A node in a tempdir: procfs, cgroup mounts, the agent's, containerd's and the log directories.
struct Fixture {
    dir: tempfile::TempDir,
    layout: CgroupLayout,
}

impl Fixture {
    fn new(layout: impl FnOnce(&Path) -> CgroupLayout) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            &root.join("proc/stat"),
            "cpu  100 20 30 4000 50 6 7 8 9 0\ncpu0 100 20 30 4000 50 6 7 8 9 0\nintr 1 2\nbtime 1700000000\nprocesses 42\n",
        );
        write(
            &root.join("proc/meminfo"),
            "MemTotal:       4000 kB\nMemFree:        1000 kB\nMemAvailable:   2500 kB\nInactive(file):  500 kB\nAnonPages:       700 kB\nSwapTotal:      2000 kB\nSwapFree:       1500 kB\n",
        );
        write(
            &root.join("proc/vmstat"),
            "nr_free_pages 10\npgfault 12345\npgmajfault 67\n",
        );
        write(&root.join("proc/loadavg"), "0.10 0.20 0.30 3/456 789\n");
        write(&root.join("proc/net/dev"), NET_DEV);
        write(&root.join("proc/sys/kernel/pid_max"), "32768\n");
        fs::create_dir_all(root.join("var/lib/kubelet")).unwrap();
        fs::create_dir_all(root.join("var/log/pods")).unwrap();
        fs::create_dir_all(root.join("var/lib/containerd")).unwrap();
        let layout = layout(&root.join("cgroup"));
        Self { dir, layout }
    }

    fn v1() -> Self {
        Self::new(|cgroup| CgroupLayout::V1 {
            cpuacct: cgroup.join("cpuacct"),
            memory: cgroup.join("memory"),
        })
    }

    fn v2() -> Self {
        Self::new(|cgroup| CgroupLayout::V2 {
            root: cgroup.join("unified"),
        })
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    fn settings(&self) -> StatsSettings {
        StatsSettings {
            root_dir: self.path("var/lib/kubelet"),
            containerd_root: self.path("var/lib/containerd"),
            pod_log_root: self.path("var/log/pods"),
            proc_root: self.path("proc"),
            pods_cgroup: None,
            ..StatsSettings::new("node-a", self.layout.clone())
        }
    }

    fn provider(&self, clock: &Arc<ManualClock>) -> StatsProvider {
        provider_with(self.settings(), clock)
    }

    /// A v1 cgroup's cpuacct and memory files.
    fn v1_cgroup(&self, cgroup: &str, cpu_ns: u64, memory: V1Memory) {
        let CgroupLayout::V1 {
            cpuacct,
            memory: memory_root,
        } = &self.layout
        else {
            panic!("not a v1 fixture");
        };
        let relative = cgroup.trim_start_matches('/');
        write(
            &cpuacct.join(relative).join("cpuacct.usage"),
            &format!("{cpu_ns}\n"),
        );
        let dir = memory_root.join(relative);
        write(
            &dir.join("memory.usage_in_bytes"),
            &format!("{}\n", memory.usage),
        );
        write(
            &dir.join("memory.limit_in_bytes"),
            &format!("{}\n", memory.limit),
        );
        write(
            &dir.join("memory.stat"),
            &format!(
                "cache 1\nrss 2\ntotal_cache 3\ntotal_rss {}\ntotal_pgfault {}\ntotal_pgmajfault {}\ntotal_inactive_anon 4\ntotal_inactive_file {}\n",
                memory.rss, memory.faults, memory.major_faults, memory.inactive_file
            ),
        );
    }

    fn set_v1_cpu(&self, cgroup: &str, cpu_ns: u64) {
        let CgroupLayout::V1 { cpuacct, .. } = &self.layout else {
            panic!("not a v1 fixture");
        };
        write(
            &cpuacct
                .join(cgroup.trim_start_matches('/'))
                .join("cpuacct.usage"),
            &format!("{cpu_ns}\n"),
        );
    }

    /// A v2 cgroup's cpu.stat and memory files.
    fn v2_cgroup(
        &self,
        cgroup: &str,
        usage_usec: u64,
        current: u64,
        inactive_file: u64,
        max: &str,
    ) {
        let CgroupLayout::V2 { root } = &self.layout else {
            panic!("not a v2 fixture");
        };
        let dir = root.join(cgroup.trim_start_matches('/'));
        write(
            &dir.join("cpu.stat"),
            &format!("usage_usec {usage_usec}\nuser_usec 1\nsystem_usec 2\n"),
        );
        write(&dir.join("memory.current"), &format!("{current}\n"));
        write(&dir.join("memory.max"), &format!("{max}\n"));
        write(
            &dir.join("memory.stat"),
            &format!(
                "anon 4096\nfile 8192\ninactive_file {inactive_file}\nactive_file 5\npgfault 77\npgmajfault 3\n"
            ),
        );
    }
}

fn provider_with(settings: StatsSettings, clock: &Arc<ManualClock>) -> StatsProvider {
    let clock: Arc<dyn Clock> = clock.clone();
    StatsProvider::with_clock(settings, clock)
}

#[derive(Clone, Copy)]
struct V1Memory {
    usage: u64,
    inactive_file: u64,
    rss: u64,
    faults: u64,
    major_faults: u64,
    limit: u64,
}

fn v1_memory(usage: u64, inactive_file: u64, limit: u64) -> V1Memory {
    V1Memory {
        usage,
        inactive_file,
        rss: 40 * MIB,
        faults: 1000,
        major_faults: 5,
        limit,
    }
}

fn pod_input(containers: Vec<ContainerStatsInput>) -> PodStatsInput {
    PodStatsInput {
        namespace: "default".to_owned(),
        name: "web".to_owned(),
        uid: PodUid::new("1234"),
        start_time: Timestamp::from_second(1_700_000_100).unwrap(),
        cgroup: POD_CGROUP.to_owned(),
        containers,
    }
}

fn container_input(name: &str, id: &str) -> ContainerStatsInput {
    ContainerStatsInput {
        name: name.to_owned(),
        id: ContainerId::new(id),
        start_time: Timestamp::from_second(1_700_000_200).unwrap(),
    }
}

fn ts(seconds: i64) -> Time {
    Time(Timestamp::from_second(seconds).unwrap())
}

#[test]
fn v1_memory_and_cpu_of_pod_and_container() {
    let fixture = Fixture::v1();
    fixture.v1_cgroup(
        POD_CGROUP,
        5_000_000_000,
        v1_memory(100 * MIB, 30 * MIB, V1_UNLIMITED),
    );
    fixture.v1_cgroup(
        &format!("{POD_CGROUP}/{CONTAINER_ID}"),
        4_000_000_000,
        v1_memory(80 * MIB, 20 * MIB, 200 * MIB),
    );
    let clock = ManualClock::at(1_700_001_000);
    let provider = fixture.provider(&clock);

    let summary = provider.summary(&[pod_input(vec![container_input("app", CONTAINER_ID)])]);

    let pod = &summary.pods[0];
    assert_eq!(
        pod.memory,
        Some(MemoryStats {
            time: ts(1_700_001_000),
            available_bytes: None,
            usage_bytes: Some(100 * MIB),
            working_set_bytes: Some(70 * MIB),
            rss_bytes: Some(40 * MIB),
            page_faults: Some(1000),
            major_page_faults: Some(5),
        })
    );
    assert_eq!(
        pod.cpu,
        Some(CpuStats {
            time: ts(1_700_001_000),
            usage_nano_cores: None,
            usage_core_nano_seconds: Some(5_000_000_000),
        })
    );
    let container = &pod.containers[0];
    assert_eq!(container.name, "app");
    assert_eq!(container.start_time, ts(1_700_000_200));
    let memory = container.memory.as_ref().unwrap();
    assert_eq!(memory.working_set_bytes, Some(60 * MIB));
    assert_eq!(memory.available_bytes, Some(140 * MIB));
    assert_eq!(
        container.cpu.as_ref().unwrap().usage_core_nano_seconds,
        Some(4_000_000_000)
    );
}

#[test]
fn cpu_rate_between_two_scrapes() {
    let fixture = Fixture::v1();
    let container = format!("{POD_CGROUP}/{CONTAINER_ID}");
    fixture.v1_cgroup(POD_CGROUP, 5_000_000_000, v1_memory(MIB, 0, V1_UNLIMITED));
    fixture.v1_cgroup(&container, 1_000_000_000, v1_memory(MIB, 0, V1_UNLIMITED));
    let clock = ManualClock::at(1_700_001_000);
    let provider = fixture.provider(&clock);
    let pods = [pod_input(vec![container_input("app", CONTAINER_ID)])];

    let first = provider.summary(&pods);
    assert_eq!(first.pods[0].cpu.as_ref().unwrap().usage_nano_cores, None);

    // 1.5 cores in the pod and a quarter core in the container over two seconds.
    fixture.set_v1_cpu(POD_CGROUP, 8_000_000_000);
    fixture.set_v1_cpu(&container, 1_500_000_000);
    clock.advance(SignedDuration::from_secs(2));
    // A clone shares the samples.
    let second = provider.clone().summary(&pods);

    let pod_cpu = second.pods[0].cpu.as_ref().unwrap();
    assert_eq!(pod_cpu.usage_nano_cores, Some(1_500_000_000));
    assert_eq!(pod_cpu.usage_core_nano_seconds, Some(8_000_000_000));
    assert_eq!(pod_cpu.time, ts(1_700_001_002));
    let container_cpu = second.pods[0].containers[0].cpu.as_ref().unwrap();
    assert_eq!(container_cpu.usage_nano_cores, Some(250_000_000));
}

#[test]
fn no_rate_when_the_counter_restarts_or_the_cgroup_was_forgotten() {
    let fixture = Fixture::v1();
    fixture.v1_cgroup(POD_CGROUP, 5_000_000_000, v1_memory(MIB, 0, V1_UNLIMITED));
    let clock = ManualClock::at(1_700_001_000);
    let provider = fixture.provider(&clock);
    let pods = [pod_input(Vec::new())];
    provider.summary(&pods);

    // Re-created cgroup: the counter starts again from a lower value.
    fixture.set_v1_cpu(POD_CGROUP, 1_000_000_000);
    clock.advance(SignedDuration::from_secs(1));
    let restarted = provider.summary(&pods);
    assert_eq!(
        restarted.pods[0].cpu.as_ref().unwrap().usage_nano_cores,
        None
    );

    // A scrape without the pod forgets its sample; it comes back without a rate.
    clock.advance(SignedDuration::from_secs(1));
    provider.summary(&[]);
    fixture.set_v1_cpu(POD_CGROUP, 2_000_000_000);
    clock.advance(SignedDuration::from_secs(1));
    let back = provider.summary(&pods);
    assert_eq!(back.pods[0].cpu.as_ref().unwrap().usage_nano_cores, None);
    assert_eq!(
        back.pods[0].cpu.as_ref().unwrap().usage_core_nano_seconds,
        Some(2_000_000_000)
    );
}

#[test]
fn v2_cpu_and_memory() {
    let fixture = Fixture::v2();
    fixture.v2_cgroup(
        POD_CGROUP,
        3_000_000,
        50 * MIB,
        10 * MIB,
        &(64 * MIB).to_string(),
    );
    // Inactive file pages above usage: the working set floors at zero.
    fixture.v2_cgroup(
        &format!("{POD_CGROUP}/{CONTAINER_ID}"),
        1_000,
        4096,
        8192,
        "max",
    );
    let clock = ManualClock::at(1_700_001_000);
    let provider = fixture.provider(&clock);
    let pods = [pod_input(vec![container_input("app", CONTAINER_ID)])];
    provider.summary(&pods);
    fixture.v2_cgroup(
        POD_CGROUP,
        3_500_000,
        50 * MIB,
        10 * MIB,
        &(64 * MIB).to_string(),
    );
    clock.advance(SignedDuration::from_millis(500));

    let summary = provider.summary(&pods);

    let pod = &summary.pods[0];
    assert_eq!(
        pod.cpu,
        Some(CpuStats {
            time: Time(Timestamp::from_millisecond(1_700_001_000_500).unwrap()),
            usage_nano_cores: Some(1_000_000_000),
            usage_core_nano_seconds: Some(3_500_000_000),
        })
    );
    assert_eq!(
        pod.memory,
        Some(MemoryStats {
            time: Time(Timestamp::from_millisecond(1_700_001_000_500).unwrap()),
            available_bytes: Some(24 * MIB),
            usage_bytes: Some(50 * MIB),
            working_set_bytes: Some(40 * MIB),
            rss_bytes: Some(4096),
            page_faults: Some(77),
            major_page_faults: Some(3),
        })
    );
    let container_memory = pod.containers[0].memory.as_ref().unwrap();
    assert_eq!(container_memory.working_set_bytes, Some(0));
    assert_eq!(container_memory.available_bytes, None);
}

#[test]
fn a_missing_container_cgroup_leaves_only_its_numbers_out() {
    let fixture = Fixture::v1();
    fixture.v1_cgroup(POD_CGROUP, 5_000_000_000, v1_memory(MIB, 0, V1_UNLIMITED));
    fixture.v1_cgroup(
        &format!("{POD_CGROUP}/{CONTAINER_ID}"),
        1,
        v1_memory(MIB, 0, V1_UNLIMITED),
    );
    let clock = ManualClock::at(1_700_001_000);
    let provider = fixture.provider(&clock);

    let summary = provider.summary(&[
        pod_input(vec![
            container_input("app", CONTAINER_ID),
            container_input("exited", "deadbeef"),
        ]),
        PodStatsInput {
            uid: PodUid::new("gone"),
            cgroup: "/kubepods/besteffort/podgone".to_owned(),
            ..pod_input(vec![container_input("x", "feed")])
        },
    ]);

    assert_eq!(summary.pods.len(), 2);
    let pod = &summary.pods[0];
    assert!(pod.cpu.is_some() && pod.memory.is_some());
    assert!(pod.containers[0].cpu.is_some());
    let exited = &pod.containers[1];
    assert_eq!(exited.name, "exited");
    assert_eq!(exited.start_time, ts(1_700_000_200));
    assert_eq!((&exited.cpu, &exited.memory), (&None, &None));
    let gone = &summary.pods[1];
    assert_eq!((&gone.cpu, &gone.memory), (&None, &None));
    assert_eq!(gone.containers.len(), 1);
    assert!(summary.node.memory.is_some());
}

#[test]
fn node_stats_from_procfs_and_the_root_cgroup() {
    let fixture = Fixture::v1();
    fixture.v1_cgroup("/", 9_000_000_000, v1_memory(MIB, 0, V1_UNLIMITED));
    fixture.v1_cgroup(
        "/kubepods",
        7_000_000_000,
        v1_memory(3 * MIB, MIB, V1_UNLIMITED),
    );
    let clock = ManualClock::at(1_700_001_000);
    let settings = StatsSettings {
        pods_cgroup: Some("/kubepods".to_owned()),
        ..fixture.settings()
    };
    let provider = provider_with(settings, &clock);

    let node = provider.summary(&[]).node;

    assert_eq!(node.node_name, "node-a");
    assert_eq!(node.start_time, ts(1_700_000_000));
    assert_eq!(
        node.cpu.unwrap().usage_core_nano_seconds,
        Some(9_000_000_000)
    );
    assert_eq!(
        node.memory,
        Some(MemoryStats {
            time: ts(1_700_001_000),
            // Capacity (MemTotal 4000 kB) minus the working set, as the kubelet computes it.
            available_bytes: Some(1500 * 1024),
            usage_bytes: Some(3000 * 1024),
            working_set_bytes: Some(2500 * 1024),
            rss_bytes: Some(700 * 1024),
            page_faults: Some(12345),
            major_page_faults: Some(67),
        })
    );
    assert_eq!(
        node.swap,
        Some(SwapStats {
            time: ts(1_700_001_000),
            swap_available_bytes: Some(1500 * 1024),
            swap_usage_bytes: Some(500 * 1024),
        })
    );
    assert_eq!(
        node.rlimit,
        Some(RlimitStats {
            time: ts(1_700_001_000),
            maxpid: Some(32768),
            curproc: Some(456),
        })
    );
    let eth0 = InterfaceStats {
        name: "eth0".to_owned(),
        rx_bytes: Some(1000),
        rx_errors: Some(1),
        tx_bytes: Some(2000),
        tx_errors: Some(2),
    };
    let cni0 = InterfaceStats {
        name: "cni0".to_owned(),
        rx_bytes: Some(300),
        rx_errors: Some(0),
        tx_bytes: Some(400),
        tx_errors: Some(3),
    };
    assert_eq!(
        node.network,
        Some(NetworkStats {
            time: ts(1_700_001_000),
            default_interface: eth0.clone(),
            interfaces: vec![eth0, cni0],
        })
    );
    let pods = &node.system_containers[0];
    assert_eq!(pods.name, SYSTEM_CONTAINER_PODS);
    assert_eq!(
        pods.memory.as_ref().unwrap().working_set_bytes,
        Some(2 * MIB)
    );
    assert_eq!(
        pods.cpu.as_ref().unwrap().usage_core_nano_seconds,
        Some(7_000_000_000)
    );
    let fs = node.fs.unwrap();
    assert!(fs.capacity_bytes.unwrap() > 0);
    assert!(fs.used_bytes.unwrap() <= fs.capacity_bytes.unwrap());
    assert_eq!(
        fs.inodes_used,
        Some(fs.inodes.unwrap() - fs.inodes_free.unwrap())
    );
}

#[test]
fn node_cpu_falls_back_to_proc_stat() {
    // No cpu.stat in the v2 root: user+nice+system+irq+softirq+steal = 171 ticks of 10 ms.
    let fixture = Fixture::v2();
    let clock = ManualClock::at(1_700_001_000);
    let node = fixture.provider(&clock).summary(&[]).node;
    assert_eq!(
        node.cpu.unwrap().usage_core_nano_seconds,
        Some(171 * 10_000_000)
    );
}

#[test]
fn unreadable_node_files_leave_the_node_numbers_out() {
    let fixture = Fixture::v1();
    fs::remove_dir_all(fixture.path("proc")).unwrap();
    let clock = ManualClock::at(1_700_001_000);
    let node = fixture.provider(&clock).summary(&[]).node;
    assert_eq!(node.cpu, None);
    assert_eq!(node.memory, None);
    assert_eq!(node.rlimit, None);
    assert_eq!(node.start_time, Time(Timestamp::UNIX_EPOCH));
    assert!(
        render_resource_metrics(&Summary {
            node,
            pods: Vec::new()
        })
        .contains("\nresource_scrape_error 1\n")
    );
}

#[test]
fn logs_ephemeral_storage_and_image_fs_usage() {
    let fixture = Fixture::v1();
    let pod_logs = fixture.path("var/log/pods/default_web_1234");
    write(&pod_logs.join("app/0.log"), &"x".repeat(1000));
    write(&pod_logs.join("app/1.log"), &"y".repeat(234));
    write(&pod_logs.join("sidecar/0.log"), &"z".repeat(10));
    write(
        &fixture.path("var/lib/kubelet/pods/1234/etc-hosts"),
        &"h".repeat(100),
    );
    let blobs = fixture.path("var/lib/containerd/io.containerd.content.v1.content/blobs/sha256");
    write(&blobs.join("aa"), &"b".repeat(4000));
    write(&blobs.join("bb"), &"b".repeat(96));
    let clock = ManualClock::at(1_700_001_000);

    let summary = fixture.provider(&clock).summary(&[pod_input(vec![
        container_input("app", CONTAINER_ID),
        container_input("nolog", "abc"),
    ])]);

    let pod = &summary.pods[0];
    let logs = pod.containers[0].logs.as_ref().unwrap();
    assert_eq!(logs.used_bytes, Some(1234));
    // The directory and its two files.
    assert_eq!(logs.inodes_used, Some(3));
    assert!(logs.capacity_bytes.is_some() && logs.available_bytes.is_some());
    assert_eq!(pod.containers[1].logs, None);
    let ephemeral = pod.ephemeral_storage.as_ref().unwrap();
    assert_eq!(ephemeral.used_bytes, Some(1234 + 10 + 100));
    let image_fs = summary
        .node
        .runtime
        .as_ref()
        .unwrap()
        .image_fs
        .as_ref()
        .unwrap();
    assert_eq!(image_fs.used_bytes, Some(4096));
    assert!(image_fs.capacity_bytes.is_some());
}

#[test]
fn without_pod_cgroups_pod_usage_is_the_sum_of_its_containers() {
    let fixture = Fixture::v1();
    fixture.v1_cgroup("/a", 1_000, v1_memory(10 * MIB, MIB, V1_UNLIMITED));
    fixture.v1_cgroup("/b", 2_000, v1_memory(20 * MIB, 2 * MIB, V1_UNLIMITED));
    let clock = ManualClock::at(1_700_001_000);
    let settings = StatsSettings {
        cgroups_per_qos: false,
        ..fixture.settings()
    };
    let provider = provider_with(settings, &clock);
    let pods = [PodStatsInput {
        cgroup: "/".to_owned(),
        ..pod_input(vec![container_input("a", "a"), container_input("b", "b")])
    }];

    let summary = provider.summary(&pods);

    let pod = &summary.pods[0];
    assert_eq!(
        pod.cpu.as_ref().unwrap().usage_core_nano_seconds,
        Some(3_000)
    );
    assert_eq!(pod.cpu.as_ref().unwrap().usage_nano_cores, None);
    let memory = pod.memory.as_ref().unwrap();
    assert_eq!(memory.working_set_bytes, Some(27 * MIB));
    assert_eq!(memory.usage_bytes, Some(30 * MIB));
    assert_eq!(memory.available_bytes, None);
}

#[test]
fn systemd_driver_names_container_scopes() {
    let fixture = Fixture::v2();
    let pod_slice = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice";
    fixture.v2_cgroup(pod_slice, 10, MIB, 0, "max");
    fixture.v2_cgroup(
        &format!("{pod_slice}/cri-containerd-{CONTAINER_ID}.scope"),
        5,
        MIB,
        0,
        "max",
    );
    let clock = ManualClock::at(1_700_001_000);
    let settings = StatsSettings {
        cgroup_driver: CgroupDriver::Systemd,
        ..fixture.settings()
    };
    let summary = provider_with(settings, &clock).summary(&[PodStatsInput {
        cgroup: pod_slice.to_owned(),
        ..pod_input(vec![container_input("app", CONTAINER_ID)])
    }]);
    assert_eq!(
        summary.pods[0].containers[0]
            .cpu
            .as_ref()
            .unwrap()
            .usage_core_nano_seconds,
        Some(5_000)
    );
}

#[test]
fn cgroup_paths_cannot_leave_the_hierarchy() {
    let fixture = Fixture::v1();
    fs::create_dir_all(fixture.path("cgroup/cpuacct")).unwrap();
    write(&fixture.path("cgroup/cpuacct.usage"), "99\n");
    let clock = ManualClock::at(1_700_001_000);
    let summary = fixture.provider(&clock).summary(&[PodStatsInput {
        cgroup: "/..".to_owned(),
        ..pod_input(Vec::new())
    }]);
    // `..` is dropped, so this is the hierarchy root (no files in the fixture), not the
    // directory above the mount with its planted cpuacct.usage.
    assert_eq!(summary.pods[0].cpu, None);
}

#[test]
fn layout_from_mountinfo() {
    let hybrid = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    assert_eq!(
        CgroupLayout::from_mountinfo(hybrid).unwrap(),
        CgroupLayout::V1 {
            cpuacct: PathBuf::from("/sys/fs/cgroup/cpuacct"),
            memory: PathBuf::from("/sys/fs/cgroup/memory"),
        }
    );
    let comounted = "\
25 24 0:22 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:7 - cgroup cgroup rw,cpu,cpuacct
26 24 0:23 / /sys/fs/cgroup/mem\\040ory rw,nosuid shared:8 - cgroup cgroup rw,memory
";
    assert_eq!(
        CgroupLayout::from_mountinfo(comounted).unwrap(),
        CgroupLayout::V1 {
            cpuacct: PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"),
            memory: PathBuf::from("/sys/fs/cgroup/mem ory"),
        }
    );
    let unified =
        "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
    assert_eq!(
        CgroupLayout::from_mountinfo(unified).unwrap(),
        CgroupLayout::V2 {
            root: PathBuf::from("/sys/fs/cgroup"),
        }
    );
    let none = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n";
    assert!(matches!(
        CgroupLayout::from_mountinfo(none),
        Err(StatsError::NoCgroupHierarchy)
    ));
}

#[test]
fn input_from_the_runtime_status() {
    use crate::container::{
        ContainerState, ContainerStatus, PodStatus, SandboxState, SandboxStatus,
    };

    let container = |id: &str, name: &str, state, started_at| ContainerStatus {
        id: ContainerId::new(id),
        name: name.to_owned(),
        state,
        created_at: 0,
        started_at,
        finished_at: 0,
        exit_code: 0,
        image: String::new(),
        image_ref: String::new(),
        hash: String::new(),
        restart_count: 0,
        reason: String::new(),
        message: String::new(),
    };
    let sandbox = |id: &str, created_at| SandboxStatus {
        id: crate::container::SandboxId::new(id),
        state: SandboxState::Ready,
        created_at,
        attempt: 0,
        ip: None,
        host_network: true,
    };
    let status = PodStatus {
        uid: PodUid::new("1234"),
        name: "web".to_owned(),
        namespace: "default".to_owned(),
        ips: Vec::new(),
        sandboxes: vec![sandbox("s2", 2_000_000_000), sandbox("s1", 1_000_000_000)],
        containers: vec![
            container("c2", "app", ContainerState::Running, 3_000_000_000),
            container("c1", "app", ContainerState::Exited, 2_500_000_000),
            container("c3", "init", ContainerState::Exited, 2_100_000_000),
        ],
    };

    let input = PodStatsInput::from_runtime(&status, POD_CGROUP);

    assert_eq!(
        input,
        PodStatsInput {
            namespace: "default".to_owned(),
            name: "web".to_owned(),
            uid: PodUid::new("1234"),
            start_time: Timestamp::from_second(2).unwrap(),
            cgroup: POD_CGROUP.to_owned(),
            containers: vec![ContainerStatsInput {
                name: "app".to_owned(),
                id: ContainerId::new("c2"),
                start_time: Timestamp::from_second(3).unwrap(),
            }],
        }
    );
}

#[test]
fn cpu_and_memory_summary_skips_the_filesystems() {
    let fixture = Fixture::v1();
    fixture.v1_cgroup("/", 9_000_000_000, v1_memory(MIB, 0, V1_UNLIMITED));
    fixture.v1_cgroup(POD_CGROUP, 5, v1_memory(MIB, 0, V1_UNLIMITED));
    write(
        &fixture.path("var/log/pods/default_web_1234/app/0.log"),
        "log line",
    );
    let clock = ManualClock::at(1_700_001_000);

    let summary = fixture
        .provider(&clock)
        .cpu_and_memory_summary(&[pod_input(vec![container_input("app", CONTAINER_ID)])]);

    let node = &summary.node;
    assert!(node.cpu.is_some() && node.memory.is_some() && node.swap.is_some());
    assert_eq!(
        (&node.fs, &node.runtime, &node.rlimit),
        (&None, &None, &None)
    );
    assert_eq!(node.network, None);
    let pod = &summary.pods[0];
    assert!(pod.cpu.is_some() && pod.memory.is_some());
    assert_eq!(pod.ephemeral_storage, None);
    assert_eq!(pod.containers[0].logs, None);
}

#[test]
fn cri_timestamps() {
    assert_eq!(
        timestamp_from_unix_nanos(1_700_000_000_123_456_789),
        Timestamp::from_nanosecond(1_700_000_000_123_456_789).unwrap()
    );
}

/// A summary with every field, in the kubelet's shape.
fn full_summary() -> Summary {
    let time = || Time(Timestamp::from_millisecond(1_700_001_000_250).unwrap());
    let fs = FsStats {
        time: time(),
        available_bytes: Some(600),
        capacity_bytes: Some(1000),
        used_bytes: Some(400),
        inodes_free: Some(90),
        inodes: Some(100),
        inodes_used: Some(10),
    };
    let cpu = |cores: u64, total: u64| CpuStats {
        time: time(),
        usage_nano_cores: Some(cores),
        usage_core_nano_seconds: Some(total),
    };
    let memory = |working_set: u64| MemoryStats {
        time: time(),
        available_bytes: Some(1000),
        usage_bytes: Some(working_set + 100),
        working_set_bytes: Some(working_set),
        rss_bytes: Some(50),
        page_faults: Some(7),
        major_page_faults: Some(1),
    };
    Summary {
        node: NodeStats {
            node_name: "node-a".to_owned(),
            system_containers: vec![ContainerStats {
                name: "pods".to_owned(),
                start_time: ts(1_700_000_000),
                cpu: Some(cpu(5, 6)),
                memory: None,
                rootfs: None,
                logs: None,
            }],
            start_time: ts(1_700_000_000),
            cpu: Some(cpu(250_000_000, 12_500_000_000)),
            memory: Some(memory(2_097_152)),
            network: Some(NetworkStats {
                time: time(),
                default_interface: InterfaceStats::default(),
                interfaces: vec![InterfaceStats {
                    name: "ens3".to_owned(),
                    rx_bytes: Some(1),
                    rx_errors: Some(2),
                    tx_bytes: Some(3),
                    tx_errors: Some(4),
                }],
            }),
            fs: Some(fs.clone()),
            runtime: Some(RuntimeStats {
                image_fs: Some(fs.clone()),
            }),
            rlimit: Some(RlimitStats {
                time: time(),
                maxpid: Some(32768),
                curproc: Some(456),
            }),
            swap: Some(SwapStats {
                time: time(),
                swap_available_bytes: Some(10),
                swap_usage_bytes: Some(1_048_576),
            }),
        },
        pods: vec![PodStats {
            pod_ref: PodReference {
                name: "web".to_owned(),
                namespace: "default".to_owned(),
                uid: "1234".to_owned(),
            },
            start_time: ts(1_700_000_100),
            containers: vec![
                ContainerStats {
                    name: "app".to_owned(),
                    start_time: ts(1_700_000_200),
                    cpu: Some(cpu(1, 235_000_000)),
                    memory: Some(memory(123_456)),
                    rootfs: None,
                    logs: Some(fs.clone()),
                },
                ContainerStats {
                    name: "exited".to_owned(),
                    start_time: ts(1_700_000_300),
                    cpu: None,
                    memory: None,
                    rootfs: None,
                    logs: None,
                },
            ],
            cpu: Some(cpu(2, 300_000_000)),
            memory: Some(memory(20_000_000)),
            ephemeral_storage: Some(fs),
        }],
    }
}

#[test]
fn summary_json_has_the_kubelet_field_names() {
    let fs = json!({
        "time": "2023-11-14T22:30:00Z",
        "availableBytes": 600,
        "capacityBytes": 1000,
        "usedBytes": 400,
        "inodesFree": 90,
        "inodes": 100,
        "inodesUsed": 10
    });
    let memory = |working_set: u64| {
        json!({
            "time": "2023-11-14T22:30:00Z",
            "availableBytes": 1000,
            "usageBytes": working_set + 100,
            "workingSetBytes": working_set,
            "rssBytes": 50,
            "pageFaults": 7,
            "majorPageFaults": 1
        })
    };
    let cpu = |cores: u64, total: u64| {
        json!({
            "time": "2023-11-14T22:30:00Z",
            "usageNanoCores": cores,
            "usageCoreNanoSeconds": total
        })
    };
    let expected = json!({
        "node": {
            "nodeName": "node-a",
            "systemContainers": [{
                "name": "pods",
                "startTime": "2023-11-14T22:13:20Z",
                "cpu": cpu(5, 6)
            }],
            "startTime": "2023-11-14T22:13:20Z",
            "cpu": cpu(250_000_000, 12_500_000_000),
            "memory": memory(2_097_152),
            "network": {
                "time": "2023-11-14T22:30:00Z",
                "name": "",
                "interfaces": [
                    {"name": "ens3", "rxBytes": 1, "rxErrors": 2, "txBytes": 3, "txErrors": 4}
                ]
            },
            "fs": fs,
            "runtime": {"imageFs": fs},
            "rlimit": {"time": "2023-11-14T22:30:00Z", "maxpid": 32768, "curproc": 456},
            "swap": {
                "time": "2023-11-14T22:30:00Z",
                "swapAvailableBytes": 10,
                "swapUsageBytes": 1_048_576
            }
        },
        "pods": [{
            "podRef": {"name": "web", "namespace": "default", "uid": "1234"},
            "startTime": "2023-11-14T22:15:00Z",
            "containers": [
                {
                    "name": "app",
                    "startTime": "2023-11-14T22:16:40Z",
                    "cpu": cpu(1, 235_000_000),
                    "memory": memory(123_456),
                    "logs": fs
                },
                {"name": "exited", "startTime": "2023-11-14T22:18:20Z"}
            ],
            "cpu": cpu(2, 300_000_000),
            "memory": memory(20_000_000),
            "ephemeral-storage": fs
        }]
    });

    let summary = full_summary();
    assert_eq!(serde_json::to_value(&summary).unwrap(), expected);
    // And it reads back (e.g. by tests scraping /stats/summary), whole seconds on the wire.
    let read: Summary = serde_json::from_value(expected).unwrap();
    assert_eq!(read.pods[0].containers[1].cpu, None);
    assert_eq!(read.node.cpu.unwrap().time, ts(1_700_001_000));
}

const EXPECTED_METRICS: &str = "\
# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container=\"app\",namespace=\"default\",pod=\"web\"} 0.235 1700001000250
# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container=\"app\",namespace=\"default\",pod=\"web\"} 123456 1700001000250
# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch in seconds
# TYPE container_start_time_seconds gauge
container_start_time_seconds{container=\"app\",namespace=\"default\",pod=\"web\"} 1.7000002e+09
container_start_time_seconds{container=\"exited\",namespace=\"default\",pod=\"web\"} 1.7000003e+09
# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 12.5 1700001000250
# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 2.097152e+06 1700001000250
# HELP node_swap_usage_bytes [ALPHA] Current swap usage of the node in bytes. Reported only on non-windows systems
# TYPE node_swap_usage_bytes gauge
node_swap_usage_bytes 1.048576e+06 1700001000250
# HELP pod_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the pod in core-seconds
# TYPE pod_cpu_usage_seconds_total counter
pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"web\"} 0.3 1700001000250
# HELP pod_memory_working_set_bytes [STABLE] Current working set of the pod in bytes
# TYPE pod_memory_working_set_bytes gauge
pod_memory_working_set_bytes{namespace=\"default\",pod=\"web\"} 2e+07 1700001000250
# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE resource_scrape_error gauge
resource_scrape_error 0
# HELP scrape_error [ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container metrics, 0 otherwise
# TYPE scrape_error gauge
scrape_error 0
";

#[test]
fn resource_metrics_render_like_the_kubelet() {
    assert_eq!(render_resource_metrics(&full_summary()), EXPECTED_METRICS);
}

#[test]
fn resource_metrics_sort_samples_and_escape_labels() {
    let mut summary = full_summary();
    let mut other = summary.pods[0].clone();
    other.pod_ref.name = "a\"b\\c\nd".to_owned();
    other.containers.truncate(1);
    summary.pods.push(other);
    let text = render_resource_metrics(&summary);
    let pod_cpu: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("pod_cpu_usage_seconds_total{"))
        .collect();
    assert_eq!(
        pod_cpu,
        [
            "pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"a\\\"b\\\\c\\nd\"} 0.3 1700001000250",
            "pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"web\"} 0.3 1700001000250",
        ]
    );
}

#[test]
fn empty_families_are_left_out() {
    let mut summary = full_summary();
    summary.pods.clear();
    summary.node.swap = None;
    let text = render_resource_metrics(&summary);
    assert!(!text.contains("container_"));
    assert!(!text.contains("pod_"));
    assert!(!text.contains("node_swap_usage_bytes"));
    assert!(text.contains("\nnode_cpu_usage_seconds_total 12.5 1700001000250\n"));
}

#[test]
fn resource_metrics_pass_promtool() {
    let Ok(output) = std::process::Command::new("promtool")
        .args(["--version"])
        .output()
    else {
        crate::testing::skip(
            "resource_metrics_pass_promtool",
            "promtool is not installed (apt-get install prometheus)",
        );
        return;
    };
    assert!(output.status.success());
    let mut summary = full_summary();
    summary.pods.push(summary.pods[0].clone());
    summary.pods[1].pod_ref.name = "second".to_owned();
    for text in [
        render_resource_metrics(&summary),
        EXPECTED_METRICS.to_owned(),
    ] {
        let mut child = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write as _;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(text.as_bytes()).unwrap();
        }
        let result = child.wait_with_output().unwrap();
        assert!(
            result.status.success(),
            "promtool rejected the metrics:\n{}{}\n{text}",
            String::from_utf8_lossy(&result.stdout),
            String::from_utf8_lossy(&result.stderr)
        );
    }
}

#[test]
fn a_scrape_reads_its_cgroup_files_from_the_read_ahead() {
    let fixture = Fixture::v1();
    let container = format!("{POD_CGROUP}/{CONTAINER_ID}");
    fixture.v1_cgroup(POD_CGROUP, 5_000_000_000, v1_memory(MIB, 0, V1_UNLIMITED));
    fixture.v1_cgroup(&container, 1_000_000_000, v1_memory(MIB, 0, V1_UNLIMITED));
    let clock = ManualClock::at(1_700_001_000);
    let provider = fixture.provider(&clock);
    let pods = [pod_input(vec![container_input("app", CONTAINER_ID)])];

    let files = provider.cgroup_files(&pods);
    // The root cgroup, the pod and the container: four files each on v1.
    assert_eq!(files.len(), 12);
    let container_usage = files
        .iter()
        .find(|path| path.ends_with(format!("{CONTAINER_ID}/cpuacct.usage")))
        .expect("the container's cpuacct.usage is read")
        .clone();
    // The fixture has no root cgroup files; the pod's and the container's are all there.
    assert!(files[4..].iter().all(|path| path.exists()), "{files:?}");

    // The read-ahead is what the scrape sees, not the file on disk.
    let read_ahead = std::collections::HashMap::from([(container_usage, b"7000000000\n".to_vec())]);
    let summary = provider.summary_prefetched(&pods, read_ahead, true);
    let cpu = summary.pods[0].containers[0].cpu.as_ref().unwrap();
    assert_eq!(cpu.usage_core_nano_seconds, Some(7_000_000_000));
    assert!(summary.node.fs.is_none(), "cpu and memory only");
    // Files not read ahead still come from disk, and the read-ahead ends with its scrape.
    assert_eq!(
        summary.pods[0]
            .cpu
            .as_ref()
            .unwrap()
            .usage_core_nano_seconds,
        Some(5_000_000_000)
    );
    let later = provider.summary(&pods);
    assert_eq!(
        later.pods[0].containers[0]
            .cpu
            .as_ref()
            .unwrap()
            .usage_core_nano_seconds,
        Some(1_000_000_000)
    );
}
