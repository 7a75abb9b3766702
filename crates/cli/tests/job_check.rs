//! `criu-cuda-migrate job --pid N`: the tree, its CUDA processes and the verdict, exit 0 ready / 1 refused / 2
//! usage. Machines without the NVIDIA kernel driver (CI) prove the path where the importer check cannot run: it
//! says why, and a tree without CUDA processes is ready. The verdict's rules themselves are unit-tested in
//! `ccm_engine::sharing`; the GPU machine proves the importer and the refusal (tests/gpu/ipc-refuse.sh).

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};

fn cli() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_criu-cuda-migrate"));
    // The settings come from the environment, as the plugin's.
    c.env_remove("CRIU_CUDA_MIGRATE_IPC").env_remove("CRIU_CUDA_MIGRATE_MULTI_PROCESS");
    c
}

/// A small tree of its own: a shell with a sleeping child.
fn tree() -> std::process::Child {
    let child =
        Command::new("sh").args(["-c", "sleep 30 & wait"]).stdin(Stdio::null()).stdout(Stdio::null()).spawn().unwrap();
    // Until the child exists.
    for _ in 0..100 {
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id())).unwrap_or_default();
        if !children.trim().is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child
}

#[test]
fn a_tree_without_cuda_processes_is_ready_and_the_report_lists_it() {
    let mut t = tree();
    let out = cli().args(["job", "--pid", &t.id().to_string()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with(&format!("job of pid {}: 2 process(es), 0 CUDA process(es)", t.id())), "{text}");
    assert!(text.contains("sleep"), "{text}");
    assert!(text.contains("verdict: ready: no CUDA process in this tree"), "{text}");
    if !std::path::Path::new("/proc/driver/nvidia/version").exists() {
        assert!(text.contains("importer check: could not run: /proc/driver/nvidia/version"), "{text}");
    }
    t.kill().unwrap();
    t.wait().unwrap();
}

#[test]
fn the_json_report_holds_every_process_the_check_and_the_verdict() {
    let mut t = tree();
    let out = cli().args(["--json", "job", "--pid", &t.id().to_string()]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["pid"], t.id());
    assert_eq!(v["processes"].as_array().unwrap().len(), 2);
    assert_eq!(v["cuda_processes"].as_array().unwrap().len(), 0);
    assert_eq!(v["verdict"], "ready");
    assert_eq!(v["exit_code"], 0);
    let check = &v["importer_check"];
    assert!(check["ran"].is_boolean());
    if check["ran"] == false {
        assert!(check["why"].as_str().unwrap().len() > 10, "{check}");
    }
    t.kill().unwrap();
    t.wait().unwrap();
}

#[test]
fn a_pid_that_is_not_there_or_no_pid_is_a_usage_error() {
    let out = cli().args(["job", "--pid", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is no process id"));
    // Below pid_max's ceiling (2^22), and far above what a test machine hands out.
    let out = cli().args(["job", "--pid", "4194000"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not exist on this host") && err.contains("podman inspect"), "{err}");
    let out = cli().args(["job"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_bad_setting_in_the_environment_is_named() {
    let out = cli().args(["job", "--pid", "1"]).env("CRIU_CUDA_MIGRATE_IPC", "sometimes").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CRIU_CUDA_MIGRATE_IPC") && err.contains("`allow`"), "{err}");
}

/// A process names itself (`/proc/self/comm`, `prctl(PR_SET_NAME)`): a name holding a line break and a verdict
/// must reach the report escaped, one line, and never add a line of its own (issue 41 part 5).
#[test]
fn a_forged_process_name_cannot_add_a_line_to_the_report() {
    // One write of its own name (perl's syswrite to /proc/self/comm: the kernel takes it whole, up to 15 bytes),
    // then a child, so that the tree has two processes as the others here.
    let mut t = Command::new("perl")
        .args([
            "-e",
            r#"open(my $f, ">", "/proc/self/comm") or die; syswrite($f, "x\nverdict: ok"); close $f; if (fork() == 0) { exec "sleep", "30" } wait"#,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..100 {
        if std::fs::read_to_string(format!("/proc/{}/comm", t.id())).unwrap_or_default().starts_with("x\n") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = cli().args(["job", "--pid", &t.id().to_string()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().filter(|l| l.starts_with("verdict:")).count(), 1, "{text}");
    assert!(text.contains(r"x\nverdict: ok"), "the name is shown escaped: {text}");
    t.kill().unwrap();
    t.wait().unwrap();
}

/// A small program holding an io_uring (its descriptor and its two ring mappings), as torchrun's elastic agent does;
/// `None` where this kernel refuses io_uring.
fn io_uring_holder(dir: &std::path::Path) -> Option<std::process::Child> {
    let script = dir.join("ring.py");
    std::fs::write(
        &script,
        "import ctypes, mmap, os, sys, time\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         params = ctypes.create_string_buffer(120)\n\
         fd = libc.syscall(425, 8, params)\n\
         if fd < 0:\n    print('ENOSYS' if ctypes.get_errno() == 38 else 'refused', flush=True); sys.exit(0)\n\
         sq = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)\n\
         print('ring', fd, flush=True)\n\
         time.sleep(30)\n",
    )
    .unwrap();
    let mut child = Command::new("python3").arg(&script).stdout(Stdio::piped()).stdin(Stdio::null()).spawn().ok()?;
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take()?), &mut line).ok()?;
    if line.starts_with("ring") {
        Some(child)
    } else {
        let _ = child.wait();
        None
    }
}

/// Issue 46: a tree holding an io_uring (CRIU cannot dump one) is `would fail`, exit 1, the process and the way out
/// named; the same program started under `criu-cuda-migrate no-io-uring` gets ENOSYS and holds none.
#[test]
fn an_io_uring_makes_the_job_fail_in_criu_and_no_io_uring_takes_it_away() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut holder) = io_uring_holder(dir.path()) else {
        eprintln!("skipped: this kernel refuses io_uring_setup");
        return;
    };
    let out = cli().args(["job", "--pid", &holder.id().to_string()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(out.status.code(), Some(1), "{text}");
    let verdict = text.lines().find(|l| l.starts_with("verdict: ")).unwrap_or_default();
    assert!(verdict.starts_with("verdict: would fail: pid "), "{text}");
    for needle in ["anon_inode:[io_uring]", "descriptor", "mapping at", "criu-cuda-migrate no-io-uring"] {
        assert!(verdict.contains(needle), "{needle}: {verdict}");
    }
    let out = cli().args(["no-io-uring", "--", "python3"]).arg(dir.path().join("ring.py")).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ENOSYS", "{}", String::from_utf8_lossy(&out.stderr));
}

/// Issue 46, on the GPU machines: CRIU before 4.2 cannot dump an inet socket on Linux 6.16 and later (a torchrun
/// tree's TCP connections to its store failed the dump with "sockets: Can't get 1:16 opt"). A tree holding a TCP
/// socket is `would fail` with a CRIU 4.1 there, naming the process and CRIU 4.2 as the way out; with CRIU 4.2 the
/// line is not there. The CRIU asked is a stand-in that prints only its version (`--criu`).
#[test]
fn inet_sockets_make_the_job_fail_with_a_criu_older_than_4_2_on_linux_6_16_and_later() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let criu = |v: &str| {
        let p = dir.path().join(format!("criu-{v}"));
        std::fs::write(&p, format!("#!/bin/sh\necho 'Version: {v}'\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    };
    let (old, new) = (criu("4.1.1"), criu("4.2.1"));
    let mut holder = std::process::Command::new("python3")
        .args(["-c", "import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); print('ready', flush=True); time.sleep(60)"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.stdout.take().unwrap()), &mut line).unwrap();
    let pid = holder.id().to_string();
    let with = |c: &std::path::Path| cli().args(["job", "--pid", &pid, "--criu"]).arg(c).output().unwrap();
    let (o_old, o_new) = (with(&old), with(&new));
    let _ = holder.kill();
    let _ = holder.wait();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let parts: Vec<u32> =
        kernel.trim().split(|c: char| !c.is_ascii_digit()).take(2).map(|p| p.parse().unwrap()).collect();
    let text_old = String::from_utf8_lossy(&o_old.stdout);
    let text_new = String::from_utf8_lossy(&o_new.stdout);
    assert!(!text_new.contains("inet socket"), "CRIU 4.2 dumps inet sockets: {text_new}");
    if (parts[0], parts[1]) >= (6, 16) {
        assert_eq!(o_old.status.code(), Some(1), "{text_old}");
        let verdict = text_old.lines().find(|l| l.starts_with("verdict: ")).unwrap_or_default();
        assert!(
            verdict.starts_with(&format!("verdict: would fail: pid {pid} (python3) holds 1 inet socket(s)")),
            "{text_old}"
        );
        assert!(
            verdict.contains("CRIU 4.1.1 cannot dump on Linux") && verdict.contains("CRIU 4.2 or later"),
            "{verdict}"
        );
    } else {
        assert!(!text_old.contains("inet socket"), "kernel {kernel}: {text_old}");
    }
}
