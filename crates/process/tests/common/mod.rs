//! Child processes for the integration tests: this test binary re-executed in a "child mode"; and
//! the small helpers the tests share (`is_root`, `KillOnDrop`).
//!
//! Each test binary that starts such children declares
//! `#[test] fn zz_child_entry() { common::run_child_if_requested() }`; the parent re-runs the binary with only that test and `CCM_PROCESS_TEST_CHILD=<mode>`.
//! Children talk on stdout in lines that start with an upper-case tag (libtest's own lines are
//! skipped) and take commands on stdin.

#![allow(dead_code)] // each test binary uses a part of this module

use ccm_identity::PciSignature;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

const CHILD_ENV: &str = "CCM_PROCESS_TEST_CHILD";
const CHILD_TEST_NAME: &str = "zz_child_entry";
/// The signature a holder child keeps on its heap, as 6 hex words separated by commas.
pub const HOLDER_SIG_ENV: &str = "CCM_TEST_SIG";
/// Size of the holder's big buffer (an mmap'd malloc chunk): spans two scan-chunk borders.
pub const BIG_BUFFER_BYTES: usize = 20 << 20;

/// Runs the requested child mode (never returns) or returns at once in a normal test run.
pub fn run_child_if_requested() {
    match std::env::var(CHILD_ENV).as_deref() {
        Ok("holder") => holder(),
        Ok("ticker") => ticker(),
        Ok("vforker") => vforker(),
        Ok("env-span") => env_span(),
        Ok("many-maps") => many_maps(),
        _ => {}
    }
}

pub fn sig_to_env(sig: &PciSignature) -> String {
    sig.words().iter().map(|w| format!("{w:x}")).collect::<Vec<_>>().join(",")
}

fn sig_from_env() -> PciSignature {
    let text = std::env::var(HOLDER_SIG_ENV).expect("holder needs CCM_TEST_SIG");
    let words: Vec<u32> = text.split(',').map(|w| u32::from_str_radix(w, 16).expect("hex word")).collect();
    PciSignature::from(<[u32; 6]>::try_from(words).expect("six words"))
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("stdout");
    out.flush().expect("stdout");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Holds the signature in a small heap buffer at an offset that is 4 but not 8 aligned, and
/// a big buffer the parent can place signatures in; answers commands until stdin closes.
fn holder() -> ! {
    let sig = sig_from_env();
    let mut small = vec![0u8; 4096];
    small[100..124].copy_from_slice(&sig.to_bytes());
    let mut big = vec![0u8; BIG_BUFFER_BYTES];
    let small_addr = small.as_ptr() as u64 + 100;
    let big_addr = big.as_ptr() as u64;
    say(&format!("PID {}", std::process::id()));
    say(&format!("ADDR {small_addr:x}"));
    say(&format!("BIG {big_addr:x}"));
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.expect("stdin");
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("sig"), _) => say(&format!("SIG {}", hex(&small[100..124]))),
            (Some("env"), Some(key)) => say(&format!("ENV {}", std::env::var(key).unwrap_or_default())),
            (Some("put"), Some(addr)) => {
                // Place the signature at an absolute address inside `big`.
                let addr = u64::from_str_radix(addr, 16).expect("hex addr");
                let offset = usize::try_from(addr - big_addr).expect("offset");
                big[offset..offset + 24].copy_from_slice(&sig.to_bytes());
                say("OK");
            }
            (Some("getbig"), Some(addr)) => {
                let addr = u64::from_str_radix(addr, 16).expect("hex addr");
                let offset = usize::try_from(addr - big_addr).expect("offset");
                say(&format!("BIGSIG {}", hex(&big[offset..offset + 24])));
            }
            (Some("open"), Some(path)) => {
                std::mem::forget(std::fs::File::open(path).expect("open"));
                say("OK");
            }
            (Some("open_unshared"), Some(path)) => {
                // A thread with its own fd table (CLONE_FILES unshared) holding the file open.
                let path = path.to_string();
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    nix::sched::unshare(nix::sched::CloneFlags::CLONE_FILES).expect("unshare");
                    std::mem::forget(std::fs::File::open(&path).expect("open"));
                    tx.send(()).expect("send");
                    loop {
                        std::thread::park();
                    }
                });
                rx.recv().expect("thread opened");
                say("OK");
            }
            (Some("mmap"), Some(path)) => {
                let file = std::fs::OpenOptions::new().read(true).write(true).open(path).expect("open");
                // SAFETY: mmap with a null hint creates a new mapping and touches no existing
                // memory; the 4096-byte mapping of this file is never accessed through the
                // returned pointer and deliberately outlives the fd.
                let addr = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        4096,
                        libc::PROT_READ,
                        libc::MAP_SHARED,
                        std::os::fd::AsRawFd::as_raw_fd(&file),
                        0,
                    )
                };
                assert_ne!(addr, libc::MAP_FAILED, "mmap {path}");
                drop(file);
                say("OK");
            }
            _ => say("ERR"),
        }
    }
    drop(small);
    drop(big);
    std::process::exit(0)
}

/// Reports its thread id, then prints `tick` every 5 ms forever.
fn ticker() -> ! {
    say(&format!("TID {}", nix::unistd::gettid()));
    loop {
        say("tick");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Says its thread id, then for each `vfork` line on stdin starts a vfork-style child (the
/// caller waits until the child exits) that sleeps 2 s: meanwhile this thread waits in the
/// kernel where no ptrace interrupt can stop it.
fn vforker() -> ! {
    say(&format!("TID {}", nix::unistd::gettid()));
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
        if line.trim_end() == "vfork" {
            let two_seconds = libc::timespec { tv_sec: 2, tv_nsec: 0 };
            // SAFETY: CLONE_VFORK without CLONE_VM: the child gets its own copy of the memory
            // (as after fork), so nothing it does can touch this process; it makes only the raw
            // nanosleep and exit_group system calls, which need no lock of the copied threads.
            unsafe {
                let flags = libc::c_long::from(libc::CLONE_VFORK | libc::SIGCHLD);
                if libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0) == 0 {
                    libc::syscall(libc::SYS_nanosleep, &two_seconds, std::ptr::null_mut::<libc::timespec>());
                    libc::syscall(libc::SYS_exit_group, 0);
                }
            }
            say("VFORKED");
        }
        line.clear();
    }
    std::process::exit(0)
}

/// The env span a hostile process sets: `CCM_TEST_ENV_SPAN` bytes ending where its real environ
/// block ends.
pub const ENV_SPAN_ENV: &str = "CCM_TEST_ENV_SPAN";

/// `struct prctl_mm_map` of `<linux/prctl.h>` (the libc crate lacks it).
#[repr(C)]
struct PrctlMmMap {
    start_code: u64,
    end_code: u64,
    start_data: u64,
    end_data: u64,
    start_brk: u64,
    brk: u64,
    start_stack: u64,
    arg_start: u64,
    arg_end: u64,
    env_start: u64,
    env_end: u64,
    auxv: *mut u64,
    auxv_size: u32,
    exe_fd: u32,
}

/// Becomes an unprivileged user (uid and gid 65534, no supplementary groups, no capability left)
/// when started as root, then moves its `env_start..env_end` to span `CCM_TEST_ENV_SPAN` bytes
/// with `prctl(PR_SET_MM, PR_SET_MM_MAP)`, which needs no capability: says `UID n`, `CAPEFF hex`,
/// `SPAN start end` (or `PRCTL errno`), then waits until stdin closes.
fn env_span() -> ! {
    let span: u64 = std::env::var(ENV_SPAN_ENV).expect("env-span needs CCM_TEST_ENV_SPAN").parse().expect("bytes");
    if rustix::process::geteuid().is_root() {
        let nobody: libc::uid_t = 65534;
        // SAFETY: plain system calls on this process's credentials, no memory handed over but an
        // empty group list; a failure is checked at once.
        let dropped = unsafe {
            libc::setgroups(0, std::ptr::null()) == 0 && libc::setgid(nobody) == 0 && libc::setuid(nobody) == 0
        };
        assert!(dropped, "dropping root: {}", std::io::Error::last_os_error());
    }
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).unwrap_or("?").trim().to_string();
    say(&format!("UID {}", field("Uid:")));
    say(&format!("CAPEFF {}", field("CapEff:")));
    let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
    let after_comm: Vec<u64> =
        stat[stat.rfind(')').expect("comm") + 1..].split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
    // proc(5) field numbers, from field 3 on.
    let f = |n: usize| after_comm[n - 3];
    // SAFETY: brk(0) changes nothing and returns the current program break.
    let brk = unsafe { libc::syscall(libc::SYS_brk, 0) };
    let env_end = f(51);
    let mut map = PrctlMmMap {
        start_code: f(26),
        end_code: f(27),
        start_data: f(45),
        end_data: f(46),
        start_brk: f(47),
        brk: u64::try_from(brk).expect("brk"),
        start_stack: f(28),
        arg_start: f(48),
        arg_end: f(49),
        env_start: env_end - span,
        env_end,
        auxv: std::ptr::null_mut(),
        auxv_size: 0,
        exe_fd: u32::MAX,
    };
    let size = libc::c_ulong::try_from(std::mem::size_of::<PrctlMmMap>()).expect("size");
    // SAFETY: PR_SET_MM_MAP reads `size` bytes of the struct, which lives on this stack for the
    // call; it changes only the reported bounds of this process's own memory areas.
    let r = unsafe { libc::prctl(libc::PR_SET_MM, libc::PR_SET_MM_MAP, std::ptr::addr_of_mut!(map), size, 0) };
    if r != 0 {
        say(&format!("PRCTL {}", std::io::Error::last_os_error()));
    } else {
        say(&format!("SPAN {:x} {:x}", map.env_start, map.env_end));
    }
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
        line.clear();
    }
    std::process::exit(0)
}

/// The file a `many-maps` child maps, and how many times.
pub const MAPS_FILE_ENV: &str = "CCM_TEST_MAPS_FILE";
pub const MAPS_COUNT_ENV: &str = "CCM_TEST_MAPS_COUNT";

/// Maps one page of `CCM_TEST_MAPS_FILE` `CCM_TEST_MAPS_COUNT` times (each its own mapping: the
/// same offset at every address, so the kernel merges none), says `MAPPED n`, then waits until
/// stdin closes. With a name of 4 KB that is 4 KB of `/proc/PID/maps` a mapping.
fn many_maps() -> ! {
    let path = std::env::var(MAPS_FILE_ENV).expect("many-maps needs CCM_TEST_MAPS_FILE");
    let count: usize = std::env::var(MAPS_COUNT_ENV).expect("count").parse().expect("count");
    let file = std::fs::File::open(&path).expect("open");
    let mut mapped = 0;
    for _ in 0..count {
        // SAFETY: a new one-page read-only mapping at an address the kernel picks; nothing of this
        // process is touched and the mapping is never accessed.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            break;
        }
        mapped += 1;
    }
    say(&format!("MAPPED {mapped}"));
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
        line.clear();
    }
    std::process::exit(0)
}

/// Whether the test runs as root (the namespace tests need it, and skip loudly without).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false)
}

/// A child process (not this test binary) that is killed and reaped when dropped, so that a failed
/// assertion leaves nothing running.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child running this test binary in a child mode; killed and reaped on drop.
pub struct TestChild {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Option<BufReader<ChildStdout>>,
}

impl TestChild {
    pub fn spawn(mode: &str, envs: &[(&str, &str)]) -> TestChild {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.args(["--exact", CHILD_TEST_NAME, "--nocapture", "--test-threads=1", "-q"])
            .env(CHILD_ENV, mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().map(BufReader::new);
        TestChild { child, stdin, stdout }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads lines until one starts with `TAG `; returns the rest of it.
    pub fn expect(&mut self, tag: &str) -> String {
        let stdout = self.stdout.as_mut().expect("stdout taken");
        let mut line = String::new();
        loop {
            line.clear();
            let n = stdout.read_line(&mut line).expect("read child stdout");
            assert!(n > 0, "child closed stdout while waiting for {tag}");
            let text = line.trim_end();
            if text == tag {
                return String::new();
            }
            if let Some(rest) = text.strip_prefix(tag).and_then(|r| r.strip_prefix(' ')) {
                return rest.to_string();
            }
        }
    }

    /// Reads lines until one starts with one of `tags` (then a space or the end); returns the line.
    pub fn expect_any(&mut self, tags: &[&str]) -> String {
        let stdout = self.stdout.as_mut().expect("stdout taken");
        let mut line = String::new();
        loop {
            line.clear();
            let n = stdout.read_line(&mut line).expect("read child stdout");
            assert!(n > 0, "child closed stdout while waiting for {tags:?}");
            let text = line.trim_end();
            if tags.iter().any(|t| text == *t || text.strip_prefix(t).is_some_and(|r| r.starts_with(' '))) {
                return text.to_string();
            }
        }
    }

    pub fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().expect("stdin taken");
        writeln!(stdin, "{command}").expect("write child stdin");
        stdin.flush().expect("flush child stdin");
    }

    /// Hands the stdout reader to the caller (e.g. to a counting thread).
    pub fn take_stdout(&mut self) -> BufReader<ChildStdout> {
        self.stdout.take().expect("stdout taken")
    }

    /// Kills the child and reaps it, its threads that this test traces first: a traced thread
    /// stays a zombie until its tracer waits for it, and the child cannot be reaped before that,
    /// so a test that panicked while tracing would otherwise hang here instead of failing.
    pub fn kill_and_reap(&mut self) {
        let pid = self.child.id();
        let threads: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|dir| dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default();
        let _ = self.child.kill();
        for tid in threads.into_iter().filter(|&t| i64::from(t) != i64::from(pid)) {
            // ECHILD for a thread nobody here traces; a traced one returns once it has died.
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(tid), Some(nix::sys::wait::WaitPidFlag::__WALL));
        }
        let _ = self.child.wait();
    }

    pub fn kill_no_reap(&mut self) {
        let _ = self.child.kill();
    }

    pub fn inner(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for TestChild {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

pub fn parse_hex_u64(s: &str) -> u64 {
    u64::from_str_radix(s.trim(), 16).expect("hex")
}

pub fn parse_sig_hex(s: &str) -> PciSignature {
    let s = s.trim();
    let mut bytes = [0u8; 24];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[i * 2..i * 2 + 2], 16).expect("hex byte");
    }
    PciSignature::from_bytes(&bytes)
}
