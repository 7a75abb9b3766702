//! `criu-cuda-migrate` on hostile input: every case ends with a clear message naming the problem,
//! the documented exit code, and no panic.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
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

#[test]
fn missing_directory() {
    let out = run(&["inspect".as_ref(), "/nonexistent/criu-images".as_ref()]);
    assert_clean_failure(&out, 2, "does not exist");
}

#[test]
fn a_file_instead_of_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("file");
    std::fs::write(&f, b"x").unwrap();
    let out = run(&["preflight".as_ref(), f.as_os_str()]);
    assert_clean_failure(&out, 2, "is not a directory");
}

#[test]
fn non_utf8_path() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join(std::ffi::OsStr::from_bytes(b"img-\xff\xfe"));
    std::fs::create_dir(&bad).unwrap();
    let out = run(&["inspect".as_ref(), bad.as_os_str()]);
    assert_eq!(out.status.code(), Some(0), "an empty directory with a non-UTF-8 name: {out:?}");
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
    assert_clean_failure(&out, 2, "larger than any identity image");
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
