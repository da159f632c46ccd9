//! `tests/cluster/up.sh` when a component cannot start: the run fails, names the
//! component and shows the end of its log, and takes down what it had started, leaving
//! no process, cgroup or mount behind. (tests/k8s_node.rs covers the cluster that starts.)
//!
//! Needs root and what tests/run.sh provisions (the Kubernetes binaries, the image's
//! binary).

use std::path::Path;
use std::process::Command;

#[test]
fn a_component_that_cannot_start_is_named_with_the_end_of_its_log() {
    let dir = std::env::temp_dir().join(format!("proxima-cluster-fails-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("cluster dir");
    // A kubelet that says why it cannot run, as a real one would, and exits.
    let kubelet = std::env::temp_dir().join(format!("broken-kubelet-{}", std::process::id()));
    std::fs::write(
        &kubelet,
        "#!/bin/sh\necho 'E1127 run.go:72] \"command failed\" err=\"failed to run Kubelet: a broken test kubelet\"' >&2\nexit 1\n",
    )
    .expect("write the broken kubelet");
    Command::new("chmod")
        .arg("+x")
        .arg(&kubelet)
        .status()
        .expect("chmod");

    let out = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/up.sh"))
        .arg(&dir)
        .env("PROXIMA_KUBELET", &kubelet)
        .env("PROXIMA_NO_CARGO", "1")
        .output()
        .expect("run tests/cluster/up.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    let _ = std::fs::remove_file(&kubelet);

    assert!(!out.status.success(), "up.sh must fail");
    assert!(
        stderr.contains("[cluster] ERROR: kubelet: exited"),
        "names the component and what happened"
    );
    assert!(
        stderr.contains("kubelet failed; the end of") && stderr.contains("a broken test kubelet"),
        "shows the end of the component's log"
    );
    // The components that did start (etcd, the API server, ...) were stopped.
    assert!(stderr.contains("components stopped"), "down.sh ran");
    assert!(!stderr.contains("LEFT BEHIND"), "nothing left behind");
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let cgroups = std::fs::read_dir("/sys/fs/cgroup/cpu")
        .expect("/sys/fs/cgroup/cpu")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(&name))
        .count();
    assert_eq!(cgroups, 0, "the cluster's cgroup tree is gone");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains(dir.to_str().unwrap()), "no mount left");
    let procs = Command::new("pgrep")
        .arg("-f")
        .arg(&dir)
        .output()
        .expect("pgrep");
    assert!(
        procs.stdout.is_empty(),
        "no process left: {}",
        String::from_utf8_lossy(&procs.stdout)
    );
    // Its logs stay for the reader.
    assert!(dir.join("logs/kubelet.log").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}
