//! `cargo xtask test`: the unit and component tiers, then the privileged tiers against the lab (the
//! runtime manager's smoke tests on real containerd, and the end-to-end suite, which shares one
//! control plane for the whole run).
//! Both tiers always run, so one failing tier still shows the other's results.

use anyhow::{Result, bail};

use crate::{cargo, cluster, lab, workspace_root};

pub fn run() -> Result<()> {
    let root = workspace_root();
    // The lab first: it installs what the build needs (clang and libbpf headers for the eBPF
    // programs) as well as the containerd the privileged tiers use.
    println!("== lab");
    lab::up()?;
    // After the lab, which installs etcd-server.
    println!("== control plane");
    cluster::up()?;

    println!("== unit and component tests");
    let unit = cargo()
        .current_dir(&root)
        .args(["test", "--workspace", "--exclude", "ringlet-tests"])
        .status()?
        .success();

    println!("== privileged tests");
    let smoke = cargo()
        .current_dir(&root)
        .args(["test", "-p", "ringlet", "--lib", "kuberuntime::", "--"])
        // The runtime manager's and the streaming API's smoke tests on the lab's containerd.
        .args(["--ignored", "--test-threads=1"])
        .status()?
        .success();
    // Both I/O engines are first-class: the end-to-end suite runs once on each.
    let mut end_to_end = true;
    for engine in ["uring", "epoll"] {
        println!("== end-to-end tests on the {engine} engine");
        end_to_end &= cargo()
            .current_dir(&root)
            .env(ringlet_tests::IO_ENGINE_ENV, engine)
            .args(["test", "-p", "ringlet-tests", "--", "--test-threads=1"])
            .status()?
            .success();
    }
    let privileged = smoke && end_to_end;

    let verdict = |ok: bool| if ok { "passed" } else { "FAILED" };
    println!(
        "unit and component tests {}, privileged tests {}",
        verdict(unit),
        verdict(privileged)
    );
    if !(unit && privileged) {
        bail!("tests failed");
    }
    Ok(())
}
