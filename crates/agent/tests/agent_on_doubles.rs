//! The driver agent as the plugin uses it, on the test doubles of libcuda and NVML: forked, warmed
//! up, answering calls from several threads at once, mapping driver errors to typed ones, and gone
//! after `exit`; a stopped or killed agent, a missed deadline, and libraries it must not load.
//!
//! Without libtest's harness (`harness = false`): the agent is forked only from a process of one
//! thread, as CRIU's is, and libtest runs every test on a thread of its own.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ccm_agent::{Agent, AgentError, DriverLibs, Lost, WarmUp};

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

/// The doubles' GPU set and state directory in `tmp`, in this process's environment (the agent
/// is forked from it and inherits it, as it inherits CRIU's), and the libraries to load.
fn stack(tmp: &Path) -> DriverLibs {
    let bin = doubles();
    let state = tmp.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let config = tmp.join("gpus.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"driver_version":"580.159.04","cuda_driver_version":13000,"gpus":[
 {{"uuid":"{G0}","pci_bus_id":"0000:06:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":0}},
 {{"uuid":"{G1}","pci_bus_id":"0000:07:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":1}}]}}"#
        ),
    )
    .unwrap();
    std::env::set_var("CCM_SIM_CONFIG", &config);
    std::env::set_var("CCM_SIM_STATE_DIR", &state);
    // The settings reach the agent as given, not through its environment: a variable naming another
    // library is not what it loads.
    std::env::set_var("CRIU_CUDA_MIGRATE_LIBCUDA", "/nonexistent/libcuda.so.1");
    std::env::set_var("CRIU_CUDA_MIGRATE_LIBNVML", "/nonexistent/libnvidia-ml.so.1");
    DriverLibs {
        libcuda: Some(bin.join("libcuda_test_double.so").display().to_string()),
        libnvml: Some(bin.join("libnvml_test_double.so").display().to_string()),
    }
}

fn the_agent_serves_the_doubles_and_exits() {
    let tmp = tempfile::tempdir().expect("scratch dir");
    let libs = stack(tmp.path());
    let agent = Agent::spawn(&[], &libs, WarmUp::Dump).expect("the agent starts");
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
    let me = this_process();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..8).map(|_| s.spawn(|| agent.restore_thread_id(me))).collect();
        for h in handles {
            match h.join().unwrap() {
                Err(AgentError::Cuda(e)) => {
                    assert_eq!(e.code.raw(), 500, "{e}");
                    assert_eq!(e.call, "cuCheckpointProcessGetRestoreThreadId");
                }
                other => panic!("expected CUDA_ERROR_NOT_FOUND, got {other:?}"),
            }
        }
    });

    agent.exit();
    assert!(gone(driver.agent_pid, Duration::from_secs(5)), "the agent outlived its exit");
    assert!(
        matches!(agent.cuinit(), Err(AgentError::Lost { lost: Lost::Exited, .. })),
        "a call after exit fails cleanly"
    );
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid of the agent this test started.
    assert_eq!(unsafe { libc::kill(i32::try_from(pid).expect("pid"), sig) }, 0);
}

fn a_stopped_agent_misses_its_deadline_and_is_killed() {
    let tmp = tempfile::tempdir().expect("scratch dir");
    let agent = Agent::spawn(&[], &stack(tmp.path()), WarmUp::Dump).expect("the agent starts");
    agent.driver().expect("libcuda loads");
    let pid = agent.pid();
    signal(pid, libc::SIGSTOP);
    let t0 = Instant::now();
    let e = agent.checkpoint(this_process(), Duration::from_millis(400)).unwrap_err();
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(400) && waited < Duration::from_secs(3), "{waited:?}");
    match &e {
        AgentError::Lost { lost: Lost::Deadline { call, .. }, .. } => {
            assert_eq!(*call, "cuCheckpointProcessCheckpoint")
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("did not answer cuCheckpointProcessCheckpoint"), "{e}");
    assert!(gone(pid, Duration::from_secs(5)), "the stopped agent was not killed");
    // Every later call fails at once.
    let t1 = Instant::now();
    assert!(agent.state(ccm_identity::HostPid::new(1).unwrap()).unwrap_err().is_lost());
    assert!(t1.elapsed() < Duration::from_millis(100));
    assert!(agent.lost().is_some());
}

fn a_killed_agent_fails_the_call_in_flight_at_once() {
    let tmp = tempfile::tempdir().expect("scratch dir");
    let agent = Agent::spawn(&[], &stack(tmp.path()), WarmUp::Dump).expect("the agent starts");
    agent.driver().expect("libcuda loads");
    signal(agent.pid(), libc::SIGKILL);
    let t0 = Instant::now();
    let e = agent.checkpoint(this_process(), Duration::from_secs(30)).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(
        matches!(e, AgentError::Lost { lost: Lost::Gone, .. } | AgentError::Lost { lost: Lost::Broken(_), .. }),
        "{e:?}"
    );
}

fn exit_kills_an_agent_that_is_stopped() {
    let tmp = tempfile::tempdir().expect("scratch dir");
    let agent = Agent::spawn(&[], &stack(tmp.path()), WarmUp::Dump).expect("the agent starts");
    agent.driver().expect("libcuda loads");
    let pid = agent.pid();
    signal(pid, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    agent.exit();
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    assert!(gone(pid, Duration::from_secs(2)), "a stopped agent outlived exit()");
    // Without the wait (a dump's agent), a stopped agent is killed at once.
    let agent = Agent::spawn(&[], &stack(tmp.path()), WarmUp::Dump).expect("the agent starts");
    agent.driver().expect("libcuda loads");
    agent.exit_without_waiting();
    let pid = agent.pid();
    signal(pid, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(50));
    agent.exit();
    assert!(gone(pid, Duration::from_secs(2)), "a stopped dump agent outlived exit()");
}

fn a_library_others_can_change_is_not_loaded() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().expect("scratch dir");
    let libs = stack(tmp.path());
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let lib = open.join("libcuda.so.1");
    std::fs::copy(libs.libcuda.as_ref().unwrap(), &lib).unwrap();
    let agent =
        Agent::spawn(&[], &DriverLibs { libcuda: Some(lib.display().to_string()), ..libs.clone() }, WarmUp::Restore)
            .expect("the agent starts");
    match agent.driver() {
        Err(AgentError::NoDriver(m)) => assert!(m.contains("can be changed by other users"), "{m}"),
        other => panic!("{other:?}"),
    }
    let agent = Agent::spawn(
        &[],
        &DriverLibs { libcuda: Some("relative/libcuda.so.1".into()), ..libs.clone() },
        WarmUp::Restore,
    )
    .unwrap();
    assert!(matches!(agent.driver(), Err(AgentError::NoDriver(m)) if m.contains("relative path")));
    // The swap: a link to the good library's directory, in a directory anyone may write. The old
    // check followed it (both ends were root's); whoever can write there re-points it between the
    // check and the load.
    let real_dir = Path::new(libs.libcuda.as_deref().unwrap()).parent().unwrap().to_path_buf();
    std::os::unix::fs::symlink(&real_dir, open.join("lib")).unwrap();
    for (libcuda, libnvml) in [
        (Some(open.join("lib/libcuda_test_double.so").display().to_string()), libs.libnvml.clone()),
        (libs.libcuda.clone(), Some(open.join("lib/libnvml_test_double.so").display().to_string())),
    ] {
        let swapped = DriverLibs { libcuda, libnvml };
        let agent = Agent::spawn(&[], &swapped, WarmUp::Restore).expect("the agent starts");
        let why = if swapped.libnvml == libs.libnvml {
            match agent.driver() {
                Err(AgentError::NoDriver(m)) => m,
                other => panic!("libcuda through an open directory: {other:?}"),
            }
        } else {
            match agent.node().map(|n| n.nvml) {
                Ok(Err(m)) => m.to_string(),
                other => panic!("NVML through an open directory: {other:?}"),
            }
        };
        assert!(why.contains(&format!("the directory {}", open.display())), "{why}");
        assert!(why.contains("can be changed by other users"), "{why}");
    }
    // The same libraries through a link only root or this user can change load (and are the very
    // files checked: the loader is given the descriptor).
    let mine = tmp.path().join("mine");
    std::os::unix::fs::symlink(&real_dir, &mine).unwrap();
    let linked = DriverLibs {
        libcuda: Some(mine.join("libcuda_test_double.so").display().to_string()),
        libnvml: Some(mine.join("libnvml_test_double.so").display().to_string()),
    };
    let agent = Agent::spawn(&[], &linked, WarmUp::Restore).expect("the agent starts");
    agent.driver().expect("libcuda through a link of root's loads");
    let nvml = agent.node().expect("NVML answers").nvml;
    assert!(nvml.is_ok(), "NVML through a link of root's loads: {nvml:?}");
}

fn main() {
    let cases: [(&str, fn()); 5] = [
        ("the_agent_serves_the_doubles_and_exits", the_agent_serves_the_doubles_and_exits),
        ("a_stopped_agent_misses_its_deadline_and_is_killed", a_stopped_agent_misses_its_deadline_and_is_killed),
        ("a_killed_agent_fails_the_call_in_flight_at_once", a_killed_agent_fails_the_call_in_flight_at_once),
        ("exit_kills_an_agent_that_is_stopped", exit_kills_an_agent_that_is_stopped),
        ("a_library_others_can_change_is_not_loaded", a_library_others_can_change_is_not_loaded),
    ];
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let mut ran = 0;
    for (name, case) in cases {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        println!("test {name} ...");
        case();
        println!("test {name} ... ok");
        ran += 1;
    }
    println!("test result: ok. {ran} passed; 0 failed");
}

/// This test process, as the agent's calls name a process.
fn this_process() -> ccm_identity::HostPid {
    ccm_identity::HostPid::new(std::process::id().into()).expect("a running process has a valid pid")
}
