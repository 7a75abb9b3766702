//! Shared helpers for the root package's integration tests that run real CRIU (4.x, from the Debian root that
//! `tests/criu-root.sh` makes and enters: trixie's CRIU 4.1.1 by default, forky's 4.2.1 with
//! `CCM_CRIU_SUITE=forky`) with the freshly built plugin loaded through `--libdir`.
//!
//! Each test file uses a subset of these helpers; the rest would be dead code in that test crate.
#![allow(dead_code)]

pub mod elf;
pub mod package;

use std::fs;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The file name cargo gives the plugin `cdylib`.
pub const PLUGIN_FILE: &str = "libcriu_cuda_migrate.so";
/// Every line the plugin writes into CRIU's log carries this prefix (after CRIU's own timestamp).
pub const LOG_PREFIX: &str = "criu-cuda-migrate: ";
/// Images the plugin writes, only ever for CUDA processes.
pub const IMAGE_PREFIX: &str = "cuda-migrate-";

/// `criu-cuda-migrate 0.1.0: init stage=dump` and friends: the line the plugin logs from `init`.
pub fn init_line(stage: &str) -> String {
    format!("criu-cuda-migrate {}: init stage={stage}", env!("CARGO_PKG_VERSION"))
}

/// The DEBUG line the plugin logs when a hook is asked about a process that does not use CUDA.
pub fn not_cuda_line(pid: i32) -> String {
    format!("{LOG_PREFIX}pid {pid} is not a CUDA process; leaving it to CRIU (-ENOTSUP)")
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn running_under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `target/<profile>/`, where the workspace's binaries and libraries land (this test binary lives in
/// its `deps/`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test binary");
    exe.parent().and_then(Path::parent).expect("the test binary lives in target/<profile>/deps/").to_path_buf()
}

/// What the real-CRIU tests run, built by `cargo build --workspace`. A plain `cargo test` builds the
/// binaries but not the cdylibs (the plugin, the test doubles).
const ARTIFACTS: [&str; 7] = [
    PLUGIN_FILE,
    "libcuda_test_double.so",
    "libnvml_test_double.so",
    "ccm-sample-workload",
    "criu-cuda-migrate",
    "ccm-sim-ctl",
    "ccm-sim-target",
];

/// Builds the workspace (same profile) once when an artifact of [`ARTIFACTS`] is missing, so that a
/// plain `cargo test --workspace` on a fresh clone needs no earlier step. Cargo's build lock is free
/// while tests run.
pub fn ensure_built() -> PathBuf {
    static BUILT: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let dir = profile_dir();
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if !*built && ARTIFACTS.iter().any(|a| !dir.join(a).exists()) {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--workspace"]).current_dir(repo_root());
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        eprintln!("(building the workspace for the real-CRIU tests: {cmd:?})");
        let status = cmd.status().expect("run cargo build");
        assert!(status.success(), "cargo build --workspace failed");
    }
    *built = true;
    dir
}

/// The built plugin: `CCM_PLUGIN_SO` if set, else `target/<profile>/libcriu_cuda_migrate.so` (built on
/// demand, see [`ensure_built`]).
pub fn plugin_so() -> PathBuf {
    if let Some(path) = std::env::var_os("CCM_PLUGIN_SO") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "CCM_PLUGIN_SO={} is not a file", path.display());
        return path;
    }
    let so = ensure_built().join(PLUGIN_FILE);
    assert!(so.is_file(), "{} is missing after cargo build --workspace", so.display());
    so
}

/// The Debian root with real CRIU (the suite `CCM_CRIU_SUITE` names), or `None` after a loud message when the tests cannot enter it because they do
/// not run as root. Under CI they must run: there a missing privilege is a failure, not a skip.
pub fn criu_root_or_skip(test: &str) -> Option<CriuRoot> {
    if !is_root() {
        assert!(
            !running_under_ci(),
            "{test}: CI must run the real-CRIU tests, but they need root (mount namespaces, pivot_root, criu)"
        );
        // Straight to the process's stderr: the test harness captures eprintln! of passing tests, and a skip
        // nobody sees looks like a pass.
        let _ = writeln!(
            std::io::stderr(),
            "\n######## SKIPPED {test}: not root; real-CRIU tests need root (`sudo bash tests/run-all.sh`) ########\n"
        );
        return None;
    }
    let root = CriuRoot::locate();
    if !root.is_complete() {
        assert!(
            !running_under_ci(),
            "{test}: no complete {} root at {}: CI must make it (`CCM_CRIU_SUITE={} bash tests/criu-root.sh prepare`)",
            root.suite,
            root.root.display(),
            root.suite
        );
        loud(&format!(
            "SKIPPED {test}: no {} root with CRIU at {}; `CCM_CRIU_SUITE={} bash tests/criu-root.sh prepare` makes it (tests/run-all.sh does)",
            root.suite,
            root.root.display(),
            root.suite
        ));
        return None;
    }
    Some(root)
}

/// A line the test output must show even when the test passes (the harness captures `eprintln!` of
/// passing tests): skips and notes. tests/run-all.sh lists them again at the end.
pub fn loud(line: &str) {
    let line = line.trim().replace('\n', " ");
    let _ = writeln!(std::io::stderr(), "\n######## {line} ########\n");
}

/// The Debian root of `tests/criu-root.sh` (path and suite from that script, so `CCM_CRIU_SUITE` and
/// `CCM_TRIXIE_ROOT` are honoured).
pub struct CriuRoot {
    script: PathBuf,
    root: PathBuf,
    /// `trixie` or `forky`.
    pub suite: String,
}

impl CriuRoot {
    pub fn locate() -> Self {
        let script = repo_root().join("tests/criu-root.sh");
        let ask = |what: &str| {
            let out = Command::new("bash").arg(&script).arg(what).output().expect("run tests/criu-root.sh");
            assert!(out.status.success(), "tests/criu-root.sh {what} failed: {out:?}");
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let root = PathBuf::from(ask("path"));
        let suite = ask("suite");
        Self { script, root, suite }
    }

    /// The root `tests/criu-root.sh patched-path` names (made by `prepare-patched`): forky's CRIU rebuilt with CRIU
    /// PR #3138's plugin options.
    pub fn patched() -> Self {
        let script = repo_root().join("tests/criu-root.sh");
        let out = Command::new("bash").arg(&script).arg("patched-path").output().expect("run tests/criu-root.sh");
        assert!(out.status.success(), "tests/criu-root.sh patched-path failed: {out:?}");
        let root = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Self { script, root, suite: "forky".to_string() }
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The packaged CRIU's version (`4.1.1-1`), from the root's dpkg database.
    pub fn criu_version(&self) -> String {
        let status = fs::read_to_string(self.root.join("var/lib/dpkg/status")).unwrap_or_default();
        status
            .split("\n\n")
            .find(|stanza| stanza.lines().any(|l| l == "Package: criu"))
            .and_then(|stanza| stanza.lines().find_map(|l| l.strip_prefix("Version: ")))
            .unwrap_or("unknown")
            .to_string()
    }

    /// The root holds CRIU and its plugin header (`tests/criu-root.sh prepare` made it).
    pub fn is_complete(&self) -> bool {
        self.root.join("usr/sbin/criu").is_file() && self.plugin_header().is_file()
    }

    /// CRIU's plugin header in the root: the ABI of the criu binary the tests run.
    pub fn plugin_header(&self) -> PathBuf {
        self.root.join("usr/include/criu/criu-plugin.h")
    }

    /// Runs `command` inside the root with `binds` visible at their own paths.
    pub fn run(&self, binds: &[&Path], command: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new("bash");
        cmd.arg(&self.script).arg("run");
        for dir in binds {
            cmd.arg("--bind").arg(dir);
        }
        cmd.arg("--").args(command).stdin(Stdio::null());
        // This root, whatever the test process's environment names (`env` may still point at a copy of it).
        cmd.env("CCM_TRIXIE_ROOT", &self.root).env("CCM_CRIU_SUITE", &self.suite);
        for (key, value) in env {
            cmd.env(key, value);
        }
        cmd.output().expect("run tests/criu-root.sh run")
    }
}

/// Where the plugin descriptor's fields sit inside the shared object file.
pub struct DescriptorInFile {
    pub version: u32,
    pub max_hooks: u32,
    pub max_hooks_bytes: Range<usize>,
}

/// Reads `CR_PLUGIN_DESC.version` and `.max_hooks` from the plugin file, using the field offsets of the
/// bindgen'd `cr_plugin_desc_t` (the same CRIU header the plugin was built against).
pub fn read_descriptor(image: &[u8]) -> Result<DescriptorInFile, String> {
    use criu_plugin_sys::cr_plugin_desc_t;
    let desc = elf::exported_symbol_bytes(image, "CR_PLUGIN_DESC")?;
    if desc.len() < std::mem::size_of::<cr_plugin_desc_t>() {
        return Err(format!(
            "CR_PLUGIN_DESC is {} bytes, smaller than cr_plugin_desc_t ({} bytes)",
            desc.len(),
            std::mem::size_of::<cr_plugin_desc_t>()
        ));
    }
    let field = |offset: usize| -> (u32, Range<usize>) {
        let at = desc.start + offset;
        let value = u32::from_le_bytes(image[at..at + 4].try_into().expect("4 bytes"));
        (value, at..at + 4)
    };
    let (version, _) = field(std::mem::offset_of!(cr_plugin_desc_t, version));
    let (max_hooks, max_hooks_bytes) = field(std::mem::offset_of!(cr_plugin_desc_t, max_hooks));
    Ok(DescriptorInFile { version, max_hooks, max_hooks_bytes })
}

/// The value of each `CR_PLUGIN_HOOK__*` enumerator in a `criu-plugin.h`, in declaration order, following C's
/// rules (an enumerator without `=` is the previous one plus one). `CR_PLUGIN_HOOK__MAX` is the hook count.
pub fn hook_enumerators(header: &str) -> Vec<(String, u32)> {
    let start =
        header.find("enum {").or_else(|| header.find("enum cr_plugin_hook")).expect("criu-plugin.h has no hook enum");
    let body_start = start + header[start..].find('{').expect("enum body") + 1;
    let body_end = body_start + header[body_start..].find('}').expect("enum end");
    let mut next = 0u32;
    let mut out = Vec::new();
    for item in header[body_start..body_end].split(',') {
        let item: String = item.lines().map(|line| line.split("//").next().unwrap_or("")).collect::<Vec<_>>().join(" ");
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (name, value) = match item.split_once('=') {
            Some((name, value)) => (name.trim(), value.trim().parse::<u32>().expect("numeric enumerator value")),
            None => (item, next),
        };
        assert!(name.starts_with("CR_PLUGIN_HOOK__"), "unexpected enumerator {name:?} in the hook enum");
        out.push((name.to_string(), value));
        next = value + 1;
    }
    out
}

pub fn hook_value(enumerators: &[(String, u32)], name: &str) -> u32 {
    enumerators
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("{name} is not in the header's hook enum"))
}

/// How a dump/restore run of the plain workload should go.
pub struct PlainRun<'a> {
    /// The plugin file to load (copied alone into a fresh plugin directory).
    pub plugin: &'a [u8],
    /// Also restore after a successful dump.
    pub restore: bool,
    /// CRIU's log level (`-v`).
    pub verbosity: u8,
    /// More arguments of `criu dump` and of `criu restore` (split at spaces).
    pub dump_args: &'a str,
    pub restore_args: &'a str,
}

/// What happened. Dropping it kills the workload (original or restored) if it still runs.
pub struct PlainOutcome {
    pub scratch: tempfile::TempDir,
    pub pid: i32,
    pub dump_rc: Option<i32>,
    pub restore_rc: Option<i32>,
    pub runner: Output,
}

/// The workload: a shell loop that prints a growing counter, so "it runs after restore" is observable.
/// Its `$0` marks it, so cleanup never kills a process that merely reused the pid.
const WORKLOAD_MARK: &str = "ccm-plain-workload";

/// Runs inside the root: start the workload detached, dump it, optionally restore it; every step's status
/// goes to a file in the scratch directory for the Rust side to assert on.
const PLAIN_SCENARIO: &str = r#"
set -u
S=$1 VERBOSITY=$2 RESTORE=$3 MARK=$4 DUMP_ARGS=$5 RESTORE_ARGS=$6
# The workload must not inherit fds of files outside this mount namespace (cargo's pipes, the runner's files):
# CRIU could not restore them.
for fd in /proc/$$/fd/*; do
    n=${fd##*/}
    # Not 255: bash reads this script through it, and bash 5.3 (forky) lets `exec 255>&-` close it (the script
    # then ends there, status 0).
    [ "$n" -gt 2 ] && [ "$n" -ne 255 ] && eval "exec $n>&-"
done 2>/dev/null
setsid -f sh -c 'echo $$ >"$1.tmp" && mv "$1.tmp" "$1" && exec sh -c "$2" "$3"' sh "$S/workload.pid" \
    'i=0; while :; do i=$((i+1)); echo $i; sleep 0.1; done' "$MARK" </dev/null >/tmp/ccm-workload.out 2>&1
for _ in $(seq 100); do [ -s "$S/workload.pid" ] && [ -s /tmp/ccm-workload.out ] && break; sleep 0.05; done
[ -s "$S/workload.pid" ] || { echo "workload did not start" >&2; exit 90; }
PID=$(cat "$S/workload.pid")
# shellcheck disable=SC2086 # the extra arguments are words
criu dump -t "$PID" -D "$S/images" -v"$VERBOSITY" -o dump.log --libdir "$S/plugins" $DUMP_ARGS 2>"$S/dump.stderr"
echo $? >"$S/dump.rc"
[ "$(cat "$S/dump.rc")" = 0 ] && [ "$RESTORE" = 1 ] || exit 0
# CRIU restores the same pid, so the dumped task must be gone and reaped first.
for _ in $(seq 400); do [ -e "/proc/$PID" ] || break; sleep 0.05; done
[ -e "/proc/$PID" ] && { echo "pid $PID still exists 20 s after the dump" >&2; exit 91; }
# shellcheck disable=SC2086 # the extra arguments are words
criu restore -d -D "$S/images" -v"$VERBOSITY" -o restore.log --libdir "$S/plugins" $RESTORE_ARGS 2>"$S/restore.stderr"
echo $? >"$S/restore.rc"
"#;

pub fn run_plain(root: &CriuRoot, run: &PlainRun<'_>) -> PlainOutcome {
    let scratch = tempfile::Builder::new().prefix("ccm-criu-plain-").tempdir().expect("scratch directory");
    let dir = scratch.path();
    fs::create_dir(dir.join("images")).expect("images directory");
    fs::create_dir(dir.join("plugins")).expect("plugin directory");
    fs::write(dir.join("plugins").join(PLUGIN_FILE), run.plugin).expect("copy of the plugin");
    fs::write(dir.join("scenario.sh"), PLAIN_SCENARIO).expect("scenario script");

    let scratch_str = dir.to_str().expect("UTF-8 scratch path");
    let script = dir.join("scenario.sh");
    let verbosity = run.verbosity.to_string();
    let runner = root.run(
        &[dir],
        &[
            "bash",
            script.to_str().expect("UTF-8 path"),
            scratch_str,
            &verbosity,
            if run.restore { "1" } else { "0" },
            WORKLOAD_MARK,
            run.dump_args,
            run.restore_args,
        ],
        &[],
    );
    let read_number =
        |name: &str| -> Option<i32> { fs::read_to_string(dir.join(name)).ok().and_then(|s| s.trim().parse().ok()) };
    let pid = read_number("workload.pid").unwrap_or(0);
    let outcome =
        PlainOutcome { pid, dump_rc: read_number("dump.rc"), restore_rc: read_number("restore.rc"), runner, scratch };
    assert!(
        outcome.pid > 0 && outcome.runner.status.success(),
        "the scenario in the CRIU root failed: {}",
        outcome.describe()
    );
    outcome
}

impl PlainOutcome {
    pub fn images(&self) -> PathBuf {
        self.scratch.path().join("images")
    }

    fn read(&self, name: &str) -> String {
        fs::read_to_string(self.scratch.path().join(name)).unwrap_or_default()
    }

    pub fn dump_log(&self) -> String {
        fs::read_to_string(self.images().join("dump.log")).unwrap_or_default()
    }

    pub fn restore_log(&self) -> String {
        fs::read_to_string(self.images().join("restore.log")).unwrap_or_default()
    }

    pub fn criu_stderr(&self) -> String {
        self.read("dump.stderr") + &self.read("restore.stderr")
    }

    /// Names of the image files the plugin wrote.
    pub fn plugin_images(&self) -> Vec<String> {
        fs::read_dir(self.images())
            .expect("images directory")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with(IMAGE_PREFIX))
            .collect()
    }

    /// Everything needed to understand a failure, for assertion messages.
    pub fn describe(&self) -> String {
        let tail = |text: &str| -> String {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(25)..].join("\n")
        };
        format!(
            "pid {}, dump rc {:?}, restore rc {:?}, runner {:?}\nrunner stderr:\n{}\ncriu stderr:\n{}\n\
             --- dump.log (tail) ---\n{}\n--- restore.log (tail) ---\n{}",
            self.pid,
            self.dump_rc,
            self.restore_rc,
            self.runner.status,
            String::from_utf8_lossy(&self.runner.stderr),
            self.criu_stderr(),
            tail(&self.dump_log()),
            tail(&self.restore_log()),
        )
    }

    fn workload(&self) -> MarkedWorkload {
        MarkedWorkload { pid: self.pid, mark: WORKLOAD_MARK }
    }

    /// Whether the (restored) workload is alive and still counting within `within`.
    pub fn workload_makes_progress(&self, within: Duration) -> bool {
        self.workload().makes_progress(within)
    }

    pub fn workload_alive(&self) -> bool {
        self.workload().is_ours()
    }
}

impl Drop for PlainOutcome {
    fn drop(&mut self) {
        self.workload().kill();
    }
}

/// The counting shell loop the real-CRIU tests start detached inside the CRIU root (`setsid`, so it leads its
/// own process group with its `sleep` children). An extra argument, `mark`, identifies it: a pid that no longer
/// carries the mark is someone else's and is never touched. It writes one counter per line to its `/tmp`
/// (`/tmp/ccm-workload.out` in the root's namespace).
pub struct MarkedWorkload {
    pub pid: i32,
    pub mark: &'static str,
}

impl MarkedWorkload {
    pub fn is_ours(&self) -> bool {
        self.pid > 0
            && fs::read(format!("/proc/{}/cmdline", self.pid))
                .map(|cmdline| cmdline.split(|&b| b == 0).any(|arg| arg == self.mark.as_bytes()))
                .unwrap_or(false)
    }

    /// The latest counter, read through the workload's own root (its output lives in that namespace's /tmp).
    fn counter(&self) -> Option<u64> {
        let out = fs::read_to_string(format!("/proc/{}/root/tmp/ccm-workload.out", self.pid)).ok()?;
        out.lines().rev().find_map(|l| l.trim().parse().ok())
    }

    /// Whether it stays ours and its counter moves within `within`.
    pub fn makes_progress(&self, within: Duration) -> bool {
        let first = self.counter();
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            sleep(Duration::from_millis(100));
            if !self.is_ours() {
                return false;
            }
            if first.is_some() && self.counter() > first {
                return true;
            }
        }
        false
    }

    /// Kills its process group, if the pid is still ours.
    pub fn kill(&self) {
        if self.is_ours() {
            // SAFETY: kill has no memory-safety preconditions; the pid was checked to be our marked workload,
            // which leads its own process group (setsid) holding its `sleep` children.
            unsafe {
                libc::kill(-self.pid, libc::SIGKILL);
                libc::kill(self.pid, libc::SIGKILL);
            }
        }
    }
}

/// One case of a simulated-stack script (`tests/sim/plugin-flow.sh`, `tests/sim/faults.sh`) under real CRIU in
/// the CRIU root, on the binaries of this test's target dir. The script runs `CASE` in the scratch dir named by
/// `work_var` and prints `<ok_word> <case> OK` on success.
pub struct SimScript<'a> {
    pub test: &'a str,
    pub script: &'a str,
    pub work_var: &'a str,
    pub ok_word: &'a str,
    /// Binaries of the target dir the script needs besides the plugin, the workload and the doubles.
    pub extra_bins: &'a [&'a str],
}

/// The simulated-stack cases share the machine's two cores with the doubles' call timeouts: one at a time, so a
/// timeout measures the plugin, not the scheduler.
static SIM_SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn run_sim_case(s: &SimScript<'_>, case: &str) {
    let _serial = SIM_SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(root) = criu_root_or_skip(&format!("{}::{case}", s.test)) else { return };
    let bin = ensure_built();
    let common =
        [PLUGIN_FILE, "ccm-sample-workload", "criu-cuda-migrate", "libcuda_test_double.so", "libnvml_test_double.so"];
    for f in common.iter().chain(s.extra_bins) {
        assert!(
            bin.join(f).exists(),
            "{} is missing: run `cargo build --workspace` first (tests/run-all.sh does)",
            bin.join(f).display()
        );
    }
    let script = repo_root().join(s.script);
    let work = tempfile::tempdir().expect("scratch dir");
    let work_dir = work.path().join(case);
    let out = root.run(
        &[bin.as_path(), work.path()],
        &["bash", script.to_str().expect("UTF-8 script path"), bin.to_str().expect("UTF-8 target path"), case],
        &[(s.work_var, work_dir.to_str().expect("UTF-8 scratch path")), ("CCM_SIM_CALL_TIMEOUT_MS", "20000")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // CCM_SIM_KEEP=1: the case's scratch directory (CRIU's logs, the images) stays for a look.
    if std::env::var_os("CCM_SIM_KEEP").is_some() {
        eprintln!("{}: {case}: scratch kept in {}", s.test, work.keep().display());
    }
    // A case's figures (the node case's sizes and times), for `--nocapture`.
    for l in stdout.lines().filter(|l| l.starts_with("NODE ")) {
        eprintln!("{}: {l}", s.test);
    }
    assert!(
        out.status.success() && stdout.contains(&format!("{} {case} OK", s.ok_word)),
        "{} {case} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        s.script,
        out.status
    );
}
