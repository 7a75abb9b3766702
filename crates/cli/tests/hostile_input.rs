//! `criu-cuda-migrate` on hostile input: every case ends with a clear message naming the problem,
//! the documented exit code, and no panic.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Cargo builds the binary for this package's integration tests, so a plain `cargo test` finds it.
fn cli() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_criu-cuda-migrate"))
}

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(cli()).args(args).env("RUST_BACKTRACE", "0").output().expect("run the CLI")
}

fn assert_clean_failure(out: &Output, code: i32, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(code), "exit code; stdout: {stdout}; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "the CLI panicked: {stderr}");
    assert!(stderr.contains(needle) || stdout.contains(needle), "expected {needle:?} in: {stdout} {stderr}");
}

/// The hint of a path `inspect` and `preflight` cannot use names everything they take.
const WHAT_TO_PASS: &str = "pass CRIU's image directory (the -D of `criu dump`), a checkpoint archive (as \
    `podman container checkpoint --export` or the kubelet writes it: a tar, plain, gzip or zstd) or a checkpoint image \
    (an OCI layout directory or an oci-archive)";

#[test]
fn missing_directory() {
    let out = run(&["inspect".as_ref(), "/nonexistent/criu-images".as_ref()]);
    assert_clean_failure(&out, 2, "does not exist");
    // Not only image directories: an archive or a checkpoint image that is not there is missing too.
    assert_clean_failure(&out, 2, &format!("/nonexistent/criu-images does not exist; {WHAT_TO_PASS}"));
}

#[test]
fn a_file_that_is_neither_a_directory_nor_an_archive() {
    // A file is read as an archive (`podman container checkpoint --export`); this one is none.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("file");
    std::fs::write(&f, b"x").unwrap();
    let out = run(&["preflight".as_ref(), f.as_os_str()]);
    assert_clean_failure(&out, 2, "is not a tar archive (plain, gzip or zstd)");
    assert_clean_failure(&out, 2, &format!("it is shorter than one tar header; {WHAT_TO_PASS}"));
}

#[test]
fn a_text_file_given_as_a_checkpoint_says_what_to_pass() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("notes.txt");
    std::fs::write(&short, b"a few words, not a checkpoint\n").unwrap();
    assert_clean_failure(
        &run(&["inspect".as_ref(), short.as_os_str()]),
        2,
        &format!("is not a tar archive (plain, gzip or zstd): it is shorter than one tar header; {WHAT_TO_PASS}"),
    );
    let long = dir.path().join("long.txt");
    std::fs::write(&long, "a line of text\n".repeat(100)).unwrap();
    assert_clean_failure(
        &run(&["preflight".as_ref(), long.as_os_str()]),
        2,
        &format!("its first 512 bytes are not a tar header; {WHAT_TO_PASS}"),
    );
}

#[test]
fn non_utf8_path() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join(std::ffi::OsStr::from_bytes(b"img-\xff\xfe"));
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(bad.join("inventory.img"), b"inventory").unwrap();
    let out = run(&["inspect".as_ref(), bad.as_os_str()]);
    assert_eq!(out.status.code(), Some(0), "a plain checkpoint with a non-UTF-8 name: {out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("no criu-cuda-migrate identity images"));
}

#[test]
fn garbage_and_huge_images() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cuda-migrate-7.img"), b"definitely not an identity image").unwrap();
    let out = run(&["inspect".as_ref(), dir.path().as_os_str()]);
    assert_clean_failure(&out, 2, "not a criu-cuda-migrate identity image");

    let dir = tempfile::tempdir().unwrap();
    let f = std::fs::File::create(dir.path().join("cuda-migrate-8.img")).unwrap();
    f.set_len(1 << 30).unwrap(); // sparse: 1 GiB that is never read
    let out = run(&["--json".as_ref(), "inspect".as_ref(), dir.path().as_os_str()]);
    assert_clean_failure(&out, 2, "is larger than 16777216 bytes");
}

/// The largest resident size (KiB) of any child this test binary has waited for.
fn children_max_rss_kib() -> i64 {
    // SAFETY: getrusage writes the zeroed struct of this frame and nothing else.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut u);
        u.ru_maxrss
    }
}

/// Runs the CLI with a deadline: a read that never ends fails the test instead of hanging it.
fn run_within(args: &[&std::ffi::OsStr], limit: std::time::Duration) -> Output {
    let mut child = Command::new(cli())
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the CLI");
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("the CLI did not end within {limit:?} on {args:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn images_that_are_links_fifos_or_too_large_are_refused_unread_and_quickly() {
    let second = std::time::Duration::from_secs(1);
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), b"TOPSECRET-0123456789").unwrap();
    let cases: [(&str, Plant, &str); 4] = [
        (
            "a link to /dev/zero",
            Box::new(|p| std::os::unix::fs::symlink("/dev/zero", p).unwrap()),
            "is a symbolic link",
        ),
        (
            "a link to a secret",
            Box::new(|p| std::os::unix::fs::symlink(secret.path(), p).unwrap()),
            "is a symbolic link",
        ),
        (
            "a FIFO",
            Box::new(|p| assert!(Command::new("mkfifo").arg(p).status().unwrap().success())),
            "is a FIFO, not a regular file",
        ),
        (
            "a 17 MiB file",
            Box::new(|p| std::fs::File::create(p).unwrap().set_len(17 << 20).unwrap()),
            "is larger than 16777216 bytes",
        ),
    ];
    for (what, make, needle) in cases {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("cuda-migrate-1.img");
        make(&img);
        for cmd in ["inspect", "preflight"] {
            let out = run_within(&[cmd.as_ref(), dir.path().as_os_str()], second);
            assert_clean_failure(&out, 2, needle);
            let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(!all.contains("TOPSECRET"), "{what}: foreign bytes printed: {all}");
        }
        assert!(std::fs::symlink_metadata(&img).is_ok(), "{what}: the image is still there");
    }
    assert_eq!(std::fs::read(secret.path()).unwrap(), b"TOPSECRET-0123456789");
    let rss = children_max_rss_kib();
    assert!(rss < 256 << 10, "a CLI run grew to {rss} KiB: a read was not bounded");
}

#[test]
fn an_image_with_control_characters_is_refused_and_prints_none() {
    use ccm_identity::image::IdentityImage;
    let img =
        IdentityImage { hostname: "node\u{1b}[2J\r\ncriu-cuda-migrate: Error: forged".into(), ..image_of(5, 0, 0) };
    assert!(img.try_encode().is_err(), "the dump side never writes one");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cuda-migrate-5.img"), img.encode()).unwrap();
    for json in [false, true] {
        let mut args: Vec<&std::ffi::OsStr> = vec!["inspect".as_ref(), dir.path().as_os_str()];
        if json {
            args.insert(0, "--json".as_ref());
        }
        let out = run(&args);
        assert_clean_failure(&out, 2, "holds a control character");
        assert!(!out.stdout.contains(&0x1b) && !out.stderr.contains(&0x1b), "a raw ESC was printed");
    }
}

#[test]
fn a_bundle_spec_that_cannot_be_read_is_refused_naming_it() {
    let images = tempfile::tempdir().unwrap();
    std::fs::write(images.path().join("inventory.img"), b"inventory").unwrap();
    let write = |d: &std::path::Path, text: &[u8]| std::fs::write(d.join("config.json"), text).unwrap();
    let cases: [(&str, Plant, i32, &str); 7] = [
        (
            "a FIFO",
            Box::new(|d| assert!(Command::new("mkfifo").arg(d.join("config.json")).status().unwrap().success())),
            2,
            "is a FIFO",
        ),
        (
            "a link to /dev/zero",
            Box::new(|d| std::os::unix::fs::symlink("/dev/zero", d.join("config.json")).unwrap()),
            2,
            "is a symbolic link",
        ),
        (
            "5 MB",
            Box::new(|d| std::fs::File::create(d.join("config.json")).unwrap().set_len(5_000_000).unwrap()),
            2,
            "is larger than",
        ),
        ("malformed JSON", Box::new(move |d| write(d, b"{\"ociVersion\": ")), 1, "is not an OCI runtime spec"),
        (
            "a duplicate key",
            Box::new(move |d| write(d, br#"{"ociVersion":"1.0.2","linux":{},"linux":{}}"#)),
            1,
            "duplicate field",
        ),
        (
            "a string minor",
            Box::new(move |d| {
                write(d, br#"{"ociVersion":"1.0.2","linux":{"devices":[{"path":"/dev/nvidia1","type":"c","major":195,"minor":"1"}]}}"#)
            }),
            1,
            "is not an OCI runtime spec",
        ),
        (
            "a MIG device",
            Box::new(move |d| {
                write(d, br#"{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=MIG-1"]}}"#)
            }),
            1,
            "a MIG device",
        ),
    ];
    for (what, make, code, needle) in cases {
        let bundle = tempfile::tempdir().unwrap();
        make(bundle.path());
        let out = run_within(
            &["preflight".as_ref(), images.path().as_os_str(), "--bundle".as_ref(), bundle.path().as_os_str()],
            std::time::Duration::from_secs(2),
        );
        assert_eq!(out.status.code(), Some(code), "{what}: {out:?}");
        let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(all.contains(needle) && all.contains("config.json"), "{what}: {all}");
    }
}

/// `preflight` of a directory that is no checkpoint (empty, `/etc`, identity images without CRIU's
/// `inventory.img`) said "preflight passed" (exit 0) where the archive form refused the same
/// content (exit 2): both forms refuse it now, naming what is missing and the fix, and `inspect`
/// agrees (it still shows the identity images of a cut dump, saying it is one).
#[test]
fn a_directory_that_is_no_checkpoint_is_refused_like_an_archive() {
    let empty = tempfile::tempdir().unwrap();
    let cut = tempfile::tempdir().unwrap();
    std::fs::write(cut.path().join("cuda-migrate-5.img"), identity_image(5)).unwrap();
    let needles = ["has no inventory.img, which CRIU writes when a dump completes", "criu dump -D DIR"];
    for (what, dir) in [("an empty directory", empty.path()), ("/etc", Path::new("/etc")), ("images only", cut.path())]
    {
        let out = run(&["preflight".as_ref(), dir.as_os_str()]);
        for n in needles {
            assert_clean_failure(&out, 2, n);
        }
        assert!(!String::from_utf8_lossy(&out.stdout).contains("preflight passed"), "{what}: {out:?}");
        let out = run(&["--json".as_ref(), "preflight".as_ref(), dir.as_os_str()]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        assert_eq!((v["ok"].as_bool(), v["exit_code"].as_i64()), (Some(false), Some(2)), "{what}: {v}");
        let out = run(&["inspect".as_ref(), dir.as_os_str()]);
        if what == "images only" {
            assert_eq!(out.status.code(), Some(0), "{out:?}");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("NO inventory.img: the dump did not complete") && text.contains("pid 5"), "{text}");
        } else {
            assert_clean_failure(&out, 2, needles[0]);
        }
    }
    // With CRIU's inventory, a checkpoint of no CUDA process passes, as before.
    std::fs::write(empty.path().join("inventory.img"), b"inventory").unwrap();
    let out = run(&["preflight".as_ref(), empty.path().as_os_str()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to restore onto a GPU"), "{out:?}");
}

/// When NVML cannot be loaded, the refusal of a checkpoint with CUDA processes says so, with the
/// loader's error (it said "NVML lists no GPU on this node", sending the user to the wrong fix).
#[test]
fn preflight_without_nvml_names_its_load_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("inventory.img"), b"inventory").unwrap();
    std::fs::write(dir.path().join("cuda-migrate-5.img"), identity_image(5)).unwrap();
    let out = Command::new(cli())
        .args(["preflight".as_ref(), dir.path().as_os_str()])
        .env("CRIU_CUDA_MIGRATE_LIBNVML", "/nonexistent/libnvidia-ml.so.1")
        .env_remove("CRIU_CUDA_MIGRATE_USABLE_GPUS")
        .env_remove("CRIU_CUDA_MIGRATE_DEVICE_MAP")
        .output()
        .expect("run the CLI");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stdout.contains(
            "preflight refused: the checkpoint holds CUDA processes, but NVML, which names this node's GPUs, failed: "
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("/nonexistent/libnvidia-ml.so.1") && stdout.contains("check the NVIDIA driver"),
        "{stdout}"
    );
    assert!(!stdout.contains("NVML lists no GPU"), "{stdout}");
}

/// A valid identity image of `pid` (no GPU, no site), encoded.
fn identity_image(pid: u32) -> Vec<u8> {
    image_of(pid, 0, 0).try_encode().expect("a clean image encodes")
}

#[test]
fn unreadable_image() {
    let dir = tempfile::tempdir().unwrap();
    // A directory where an image file should be: reading it fails with an I/O error.
    std::fs::create_dir(dir.path().join("cuda-migrate-9.img")).unwrap();
    let out = run(&["preflight".as_ref(), dir.path().as_os_str()]);
    assert_clean_failure(&out, 2, "cuda-migrate-9.img");
}

#[test]
fn bad_flags_and_values() {
    let out = run(&["recover".as_ref(), "--pid".as_ref(), "not-a-number".as_ref()]);
    assert_clean_failure(&out, 2, "invalid value");
    let dir = tempfile::tempdir().unwrap();
    let out = run(&["preflight".as_ref(), dir.path().as_os_str(), "--device-map".as_ref(), "GPU-zz=GPU-yy".as_ref()]);
    // A malformed map is refused even with nothing to map: it is the user's input.
    assert_clean_failure(&out, 2, "--device-map");
}

/// What a case plants in its directory before the CLI runs.
type Plant<'a> = Box<dyn Fn(&std::path::Path) + 'a>;

/// `action-script` is CRIU's: outside CRIU it says how to configure it (exit 2); under CRIU every
/// step but setup-namespaces is left alone, and a bad or stale pid there is only a warning, since a
/// script that fails would fail the whole dump or restore (exit 0).
#[test]
fn the_action_script_outside_criu_and_with_bad_pids() {
    let action = |env: &[(&str, &str)]| {
        let mut c = Command::new(cli());
        c.arg("action-script").env_remove("CRTOOLS_SCRIPT_ACTION").env_remove("CRTOOLS_INIT_PID");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("run the CLI")
    };
    let out = action(&[]);
    assert_clean_failure(&out, 2, "action-script /usr/lib/criu-cuda-migrate/action-script");

    for step in ["pre-dump", "post-dump", "pre-restore", "post-restore", "network-lock", "network-unlock"] {
        let out = action(&[("CRTOOLS_SCRIPT_ACTION", step), ("CRTOOLS_INIT_PID", "1")]);
        assert_eq!(out.status.code(), Some(0), "{step}");
        assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{step}: {out:?}");
    }
    for pid in ["", "0", "-1", "x", "99999999999"] {
        let out = action(&[("CRTOOLS_SCRIPT_ACTION", "setup-namespaces"), ("CRTOOLS_INIT_PID", pid)]);
        assert_eq!(out.status.code(), Some(0), "pid {pid:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("WARNING") && stderr.contains("CRTOOLS_INIT_PID"), "pid {pid:?}: {stderr}");
    }
    // A process that is gone.
    let mut child = Command::new("true").spawn().expect("true");
    let gone = child.id().to_string();
    child.wait().expect("reap");
    let out = action(&[("CRTOOLS_SCRIPT_ACTION", "setup-namespaces"), ("CRTOOLS_INIT_PID", &gone)]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is gone"), "{out:?}");
}

/// Whether `bytes` hold anything a terminal acts on: a control character but the line feed, or a
/// Unicode format character (bidi overrides, zero-width characters, U+2028).
fn has_raw_unsafe(bytes: &[u8]) -> bool {
    String::from_utf8_lossy(bytes).chars().any(|c| c != '\n' && ccm_identity::text::needs_escape(c))
}

/// A value of a bundle's spec or an image drew "preflight passed" over the error in a terminal
/// (CR, ESC, BEL), reversed a line (U+202E), or filled the terminal (a megabyte on one line): every
/// byte the command prints goes through one escaping choke point, and echoed values are shortened.
#[test]
fn foreign_values_reach_the_terminal_escaped_and_shortened() {
    let images = tempfile::tempdir().unwrap();
    std::fs::write(images.path().join("inventory.img"), b"inventory").unwrap();
    let forged = "x\r\u{1b}[2K\u{1b}[1Apreflight passed\u{7}\u{9b}\u{202e}\u{2028}\u{200b}";
    let huge = format!("{}garbage", "0,".repeat(1 << 20));
    for (what, value) in [("control and bidi characters", forged.to_string()), ("2 MiB of ids", huge.clone())] {
        let bundle = tempfile::tempdir().unwrap();
        let spec =
            serde_json::json!({"ociVersion": "1.0.2", "process": {"env": [format!("NVIDIA_VISIBLE_DEVICES={value}")]}});
        std::fs::write(bundle.path().join("config.json"), spec.to_string()).unwrap();
        for json in [false, true] {
            let mut args: Vec<&std::ffi::OsStr> =
                vec!["preflight".as_ref(), images.path().as_os_str(), "--bundle".as_ref(), bundle.path().as_os_str()];
            if json {
                args.insert(0, "--json".as_ref());
            }
            let out = run(&args);
            assert_eq!(out.status.code(), Some(1), "{what}: {out:?}");
            let all = [&out.stdout[..], &out.stderr[..]].concat();
            assert!(!has_raw_unsafe(&all), "{what}: printed raw: {:?}", String::from_utf8_lossy(&all));
            let text = String::from_utf8_lossy(&all);
            assert!(text.contains("NVIDIA_VISIBLE_DEVICES"), "{what}: {text:.400}");
            assert!(text.lines().all(|l| l.len() < 2000), "{what}: a line of {} bytes", text.len());
            if value == huge {
                assert!(text.contains(&format!("({} bytes in all)", value.len())), "{text:.600}");
            }
            if json {
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("still one JSON document");
                assert_eq!(v["ok"], false);
            }
        }
    }
    // An image's strings: control characters are refused at decode; format characters are not
    // (a hostname may be any text), so they are escaped on output, and JSON still decodes to them.
    use ccm_identity::image::IdentityImage;
    let host = "node-\u{202e}1-\u{2066}\u{200b}\u{2028}";
    let img = IdentityImage { hostname: host.into(), ..image_of(5, 0, 0) };
    std::fs::write(images.path().join("cuda-migrate-5.img"), img.try_encode().expect("format characters encode"))
        .unwrap();
    let out = run(&["inspect".as_ref(), images.path().as_os_str()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!has_raw_unsafe(&out.stdout) && !has_raw_unsafe(&out.stderr), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("node-\\u{202e}1-\\u{2066}\\u{200b}\\u{2028}"), "{out:?}");
    let out = run(&["--json".as_ref(), "inspect".as_ref(), images.path().as_os_str()]);
    assert!(!has_raw_unsafe(&out.stdout), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(v["processes"][0]["hostname"], host);
}

/// `recover --pid N` on a process another CRIU holds (it traces every task it dumps or restores):
/// a put-back then would race that CRIU; refused, naming the CRIU and what to do. Any other
/// tracer is refused too (the driver cannot reach a process stopped for it).
#[test]
fn recover_refuses_a_process_that_criu_or_another_tracer_holds() {
    for (tracer_name, needles) in [
        ("criu", &["is held by CRIU (pid ", "Wait for that CRIU to end", "kill "][..]),
        ("some-debugger", &["is traced by pid ", "(some-debugger", "Detach or end the tracer"][..]),
    ] {
        let mut target = Command::new("sleep").arg("30").spawn().expect("sleep");
        let pid = i32::try_from(target.id()).unwrap();
        let (seized_tx, seized_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        // A thread named like the tracer (its comm), as CRIU's main thread traces what it dumps.
        let tracer = std::thread::Builder::new()
            .name(tracer_name.into())
            .spawn(move || {
                // SAFETY: PTRACE_SEIZE of this test's own child: no memory is passed.
                let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) };
                // SAFETY: gettid has no arguments.
                seized_tx.send((r, unsafe { libc::gettid() })).unwrap();
                // Traced until the command has looked; the thread's exit detaches it.
                let _ = done_rx.recv();
            })
            .unwrap();
        let (r, tid) = seized_rx.recv().unwrap();
        assert_eq!(r, 0, "PTRACE_SEIZE: {}", std::io::Error::last_os_error());
        let out = run(&["recover".as_ref(), "--pid".as_ref(), pid.to_string().as_ref()]);
        done_tx.send(()).unwrap();
        tracer.join().unwrap();
        let _ = target.kill();
        let _ = target.wait();
        let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "{tracer_name}: {all}");
        assert!(all.contains(&format!("pid {tid}")), "{tracer_name}: the tracer's pid {tid}: {all}");
        for n in needles {
            assert!(all.contains(n), "{tracer_name}: {n:?} in {all}");
        }
    }
}

/// A valid identity image of `pid` with `sites` PCI word sites, each in a mapping named by
/// `name_len` bytes: up to the format's 16 MiB.
fn image_of(pid: u32, sites: usize, name_len: usize) -> ccm_identity::image::IdentityImage {
    use ccm_identity::gpu::{PciAddress, PciSignature};
    use ccm_identity::image::{IdentityImage, PciSite, ProcessEnv};
    use ccm_identity::GpuUuid;
    let words = PciSignature::new(PciAddress { domain: 0, bus: 6, device: 0, function: 0 }, 0x2335_10de, 0x18bf_10de);
    let site = |i: usize| PciSite {
        gpu: GpuUuid([7; 16]),
        addr: 0x1000 + 64 * i as u64,
        mapping_start: 0x1000,
        mapping_end: 0x1000 + 64 * (i as u64 + 1),
        mapping_name: "m".repeat(name_len),
        words,
    };
    IdentityImage {
        staging: None,
        driver_storage: None,
        pid,
        host_pid: pid,
        dumped_at_unix: 0,
        hostname: "node".into(),
        driver_version: "580.159.04".into(),
        cuda_driver_version: 13000,
        node_gpus: Vec::new(),
        enumerated: Vec::new(),
        used: Vec::new(),
        env: ProcessEnv::default(),
        sites: (0..sites).map(site).collect(),
        prop_sites: Vec::new(),
        device_memory: None,
    }
}

#[test]
fn image_directories_are_held_to_a_total_and_a_count() {
    // Issue 29: 40 valid images of 16 MB made `inspect DIR` hold 660 MB (the plugin's init(RESTORE)
    // reads the same way). Seventeen are more than the 256 MiB an archive may hold: refused from
    // their sizes, before any is read.
    let dir = tempfile::tempdir().unwrap();
    let mut image = image_of(1, 4000, 4000);
    let bytes = image.try_encode().expect("a valid image");
    assert!(bytes.len() > 15 << 20 && bytes.len() <= 16 << 20, "{}", bytes.len());
    for pid in 1..=17u32 {
        (image.pid, image.host_pid) = (pid, pid);
        std::fs::write(dir.path().join(format!("cuda-migrate-{pid}.img")), image.encode()).unwrap();
    }
    let limit = std::time::Duration::from_secs(2);
    for cmd in ["inspect", "preflight"] {
        let out = run_within(&[cmd.as_ref(), dir.path().as_os_str()], limit);
        assert_clean_failure(&out, 2, "bytes (256 MiB) together, the most criu-cuda-migrate reads");
        assert_clean_failure(&out, 2, "remove the images that are not this dump's");
    }
    let rss = children_max_rss_kib();
    assert!(rss < 256 << 10, "a CLI run grew to {rss} KiB: the images were read");

    // More images than a checkpoint has processes, each tiny.
    let dir = tempfile::tempdir().unwrap();
    let mut image = image_of(1, 0, 0);
    for pid in 1..=4097u32 {
        (image.pid, image.host_pid) = (pid, pid);
        std::fs::write(dir.path().join(format!("cuda-migrate-{pid}.img")), image.encode()).unwrap();
    }
    let out = run_within(&["inspect".as_ref(), dir.path().as_os_str()], limit);
    assert_clean_failure(&out, 2, "holds 4097 identity images (cuda-migrate-*.img), more than the 4096");
}

/// What a case puts into its directory.
type MakeDir<'a> = &'a dyn Fn(&Path);

/// An identity image of `pid` whose device memory went through the driver's custom storage: one 4 KiB region, one
/// data chunk in a page file of 4 KiB.
fn custom_storage_image(pid: u32) -> Vec<u8> {
    use ccm_identity::staging::{
        DriverRegion, DriverStorage, StagedChunk, StagingRegion, StagingTable, MIN_CHUNK_BYTES,
    };
    let mut img = image_of(pid, 0, 0);
    img.driver_storage = Some(DriverStorage {
        regions: vec![DriverRegion { gpu: ccm_identity::GpuUuid([7; 16]), size: 4096 }],
        table: StagingTable {
            chunk_bytes: MIN_CHUNK_BYTES,
            file_bytes: 4096,
            regions: vec![StagingRegion { start: 0, len: 4096, chunks: vec![StagedChunk::Data { offset: 0, crc: 1 }] }],
        },
    });
    img.try_encode().expect("a clean image encodes")
}

/// `recover --images DIR` reads the process's identity image and page file from a directory the user names: an image
/// or page file that is a link or a FIFO is refused unread (no hang), and an image without a driver storage table is
/// refused naming why; each before any driver is loaded.
#[test]
fn recover_images_refuses_links_fifos_and_an_image_without_the_table() {
    let mut target = Command::new("sleep").arg("30").spawn().expect("sleep");
    let pid = target.id();
    let image = format!("cuda-migrate-{pid}.img");
    let pages = ccm_identity::staging::page_file_name(pid);
    let cases: [(&str, MakeDir<'_>, &str); 4] = [
        (
            "the image a link to /dev/zero",
            &|d| std::os::unix::fs::symlink("/dev/zero", d.join(&image)).unwrap(),
            "symbolic link",
        ),
        (
            "an image without the table",
            &|d| std::fs::write(d.join(&image), identity_image(pid)).unwrap(),
            "has no driver storage table",
        ),
        (
            "the page file a link",
            &|d| {
                std::fs::write(d.join(&image), custom_storage_image(pid)).unwrap();
                std::os::unix::fs::symlink("/etc/shadow", d.join(&pages)).unwrap();
            },
            "symbolic link",
        ),
        (
            "the page file a FIFO",
            &|d| {
                std::fs::write(d.join(&image), custom_storage_image(pid)).unwrap();
                assert!(Command::new("mkfifo").arg(d.join(&pages)).status().unwrap().success());
            },
            "not a regular file",
        ),
    ];
    for (what, make, needle) in cases {
        let dir = tempfile::tempdir().unwrap();
        make(dir.path());
        let out = run_within(
            &[
                "recover".as_ref(),
                "--pid".as_ref(),
                pid.to_string().as_ref(),
                "--images".as_ref(),
                dir.path().as_os_str(),
            ],
            std::time::Duration::from_secs(20),
        );
        assert_clean_failure(&out, 2, needle);
        assert!(!String::from_utf8_lossy(&out.stdout).contains("root:"), "{what}: a linked file's bytes were printed");
    }
    let _ = target.kill();
    let _ = target.wait();
}
