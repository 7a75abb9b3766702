//! The driver agent as the plugin uses it, on the test doubles of libcuda and NVML: forked, warmed
//! up, answering calls from several threads at once, mapping driver errors to typed ones, and gone
//! after `exit`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ccm_agent::{Agent, AgentError};

const G0: &str = "GPU-5e110000-aabb-ccdd-0001-020304050600";
const G1: &str = "GPU-5e110001-aabb-ccdd-0001-020304050601";

/// target/<profile>/, where the doubles land; they are other packages' cdylibs, so build them.
fn doubles() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/").to_path_buf();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--quiet", "-p", "cuda-test-double", "-p", "nvml-test-double"]);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    assert!(cmd.status().expect("cargo runs").success(), "building the test doubles failed");
    dir
}

fn gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            // A zombie is gone too: the agent is nobody's child here but init's (or a subreaper's).
            Ok(s) if s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')) => return true,
            Ok(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    false
}

#[test]
fn the_agent_serves_the_doubles_and_exits() {
    let bin = doubles();
    let tmp = tempfile::tempdir().expect("scratch dir");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let config = tmp.path().join("gpus.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"driver_version":"580.159.04","cuda_driver_version":13000,"gpus":[
 {{"uuid":"{G0}","pci_bus_id":"0000:06:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":0}},
 {{"uuid":"{G1}","pci_bus_id":"0000:07:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":1}}]}}"#
        ),
    )
    .unwrap();
    // The agent is forked from this process and inherits its environment, as it inherits CRIU's.
    std::env::set_var("CRIU_CUDA_MIGRATE_LIBCUDA", bin.join("libcuda_test_double.so"));
    std::env::set_var("CRIU_CUDA_MIGRATE_LIBNVML", bin.join("libnvml_test_double.so"));
    std::env::set_var("CCM_SIM_CONFIG", &config);
    std::env::set_var("CCM_SIM_STATE_DIR", &state);

    let agent = Agent::spawn(&[]).expect("the agent starts");
    let driver = agent.driver().expect("libcuda loads in the agent");
    assert!(driver.libcuda_path.ends_with("libcuda_test_double.so"), "{driver:?}");
    assert_eq!(driver.cuda_driver_version, 13000);
    assert_ne!(driver.agent_pid, std::process::id(), "the calls run in another process");
    let node = agent.node().expect("NVML answers");
    let gpus = node.nvml.expect("NVML lists the GPUs").gpus;
    assert_eq!(gpus.iter().map(|g| g.uuid.to_string()).collect::<Vec<_>>(), [G0, G1]);
    agent.cuinit().expect("cuInit in the agent");
    assert_eq!(agent.uuid_at_pci(gpus[1].pci).unwrap(), Some(gpus[1].uuid));

    // Calls from several threads at once, each answered with its own result: this process is no
    // CUDA process of the doubles, so the driver says CUDA_ERROR_NOT_FOUND (500) for it.
    let me = std::process::id() as i32;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..8).map(|_| s.spawn(|| agent.restore_thread_id(me))).collect();
        for h in handles {
            match h.join().unwrap() {
                Err(AgentError::Cuda(e)) => {
                    assert_eq!(e.code, 500, "{e}");
                    assert_eq!(e.call, "cuCheckpointProcessGetRestoreThreadId");
                }
                other => panic!("expected CUDA_ERROR_NOT_FOUND, got {other:?}"),
            }
        }
    });

    agent.exit();
    assert!(gone(driver.agent_pid, Duration::from_secs(5)), "the agent outlived its exit");
    assert!(matches!(agent.cuinit(), Err(AgentError::Agent(_))), "a call after exit fails cleanly");
}
