//! The ground floor of `node --check`: no I/O. The facts a node gave (file contents, command
//! outputs, what the driver answered) go in; verdict lines, each with its fix, come out.
//!
//! Every fact is hostile text: it is parsed by small line rules that never fail, and anything
//! quoted from it into a line is escaped ([`esc`]) and shortened.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ccm_driver::cuda::LoadError;
use ccm_driver::nvml::NvmlFailure;
use ccm_identity::GpuIdentity;
use ccm_process::dir::FileError;
use serde::Serialize;

/// Where the Debian package installs the plugin (packaging/build-deb.sh), alone in its libdir.
pub const PACKAGE_LIBDIR: &str = "/usr/lib/criu-cuda-migrate/plugins";
/// The plugin's file name as the package installs it.
pub const PACKAGE_PLUGIN: &str = "criu_cuda_migrate.so";
/// The plugin's file name as cargo builds it.
pub const BUILT_PLUGIN: &str = "libcriu_cuda_migrate.so";
/// CRIU's own CUDA plugin: it claims every CUDA process, so it must never share a libdir with ours.
pub const CRIU_CUDA_PLUGIN: &str = "cuda_plugin.so";
/// CRIU's plugin directory when no `libdir` is set (Debian's and upstream's build).
pub const CRIU_DEFAULT_LIBDIR: &str = "/usr/lib/criu";
/// The CRIU configuration files a node may have, in `/etc/criu`.
pub const CRIU_CONF_FILES: [&str; 3] = ["default.conf", "runc.conf", "crun.conf"];
/// The plugin whose table containerd ≥ 2.2 reads its CRI restore switch from (`[plugins.'io.containerd.cri.v1.runtime']`).
pub const CONTAINERD_CRI_RUNTIME_PLUGIN: &str = "io.containerd.cri.v1.runtime";
/// containerd's switch that turns restore through CRI's `CreateContainer` back on (off by default since 2.2).
pub const CONTAINERD_RESTORE_KEY: &str = "enable_experimental_restore_via_create";
/// The oldest CRIU the plugin works with.
pub const MIN_CRIU: (u32, u32) = (4, 0);
/// The oldest driver branch with the checkpoint API, and the oldest that restores onto other GPUs.
pub const MIN_DRIVER: u32 = 555;
pub const MIN_DRIVER_MIGRATION: u32 = 580;

/// A file of the node: absent, read (text), or refused (a link, too large, unreadable: why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileFact {
    Absent,
    Text(String),
    Unreadable(String),
}

/// A command the check ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmdFact {
    /// Not installed (not found where commands are looked for).
    NotFound,
    /// It ran: its exit status (`None`: killed, a signal or the deadline) and its output, stdout then
    /// stderr, capped.
    Ran { status: Option<i32>, output: String },
    /// It could not be started or waited for.
    Failed(String),
}

/// The entries of a directory CRIU loads plugins from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    Names(Vec<String>),
    Missing,
    Unreadable(String),
}

/// What NVML answered.
#[derive(Debug, Clone)]
pub struct NvmlFacts {
    pub driver_version: String,
    pub gpus: Vec<GpuIdentity>,
}

/// Why the check has no answer of the driver's to one of its questions (NVML's GPU list, libcuda's checkpoint
/// API), asked in this process on a thread of its own.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// NVML's own failure.
    #[error(transparent)]
    Nvml(NvmlFailure),
    /// libcuda's own failure (its load, or a missing checkpoint function).
    #[error(transparent)]
    Libcuda(LoadError),
    #[error(
        "{what} did not answer within {} s: the driver is stuck (a GPU in a bad state, or a driver update under \
         way); see `dmesg` for NVRM lines and `nvidia-smi`",
        .deadline.as_secs()
    )]
    Stuck { what: &'static str, deadline: Duration },
    #[error("{what}: no answer (the thread asking the driver could not start or ended)")]
    NoAnswer { what: &'static str },
    /// The check did not ask (facts gathered for another purpose).
    #[error("not asked")]
    NotAsked,
}

/// Everything the check looks at, gathered by the I/O layer (`gather.rs`).
#[derive(Debug)]
pub struct Facts {
    /// Whether the check runs as root (`criu check` needs it).
    pub is_root: bool,
    /// `/etc/criu/{default,runc,crun}.conf`.
    pub criu_conf: BTreeMap<String, FileFact>,
    /// Whether runc and crun are installed.
    pub runc: bool,
    pub crun: bool,
    /// The package's plugin file: whether it is a regular file.
    pub package_plugin: Result<bool, FileError>,
    /// Each libdir that some caller's CRIU uses ([`libdirs_to_list`]), listed.
    pub libdirs: BTreeMap<String, Listing>,
    pub criu_version: CmdFact,
    pub criu_check: CmdFact,
    pub nvml: Result<NvmlFacts, ProbeError>,
    /// libcuda with the checkpoint API: its path, or why not.
    pub checkpoint_api: Result<String, ProbeError>,
    /// `nvidia-smi --query-gpu=uuid,persistence_mode --format=csv,noheader`.
    pub persistence: CmdFact,
    /// containerd's `--version` and `/etc/containerd/config.toml`; `None` when containerd is not installed.
    pub containerd: Option<(CmdFact, FileFact)>,
    /// CRI-O's `--version` and its configuration files in the order CRI-O reads them (`crio.conf`, then
    /// `crio.conf.d/*` sorted); `None` when CRI-O is not installed.
    pub crio: Option<(CmdFact, Vec<(String, FileFact)>)>,
    /// Whether `iptables-restore`, `ip6tables-restore` and `nft` are installed.
    pub iptables_restore: bool,
    pub ip6tables_restore: bool,
    pub nft: bool,
    /// CDI spec files (`/etc/cdi`, `/var/run/cdi`): shown path and content.
    pub cdi: Vec<(String, FileFact)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

impl Verdict {
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        }
    }
}

/// One checked thing: what was found, the verdict, and what to do when it is not ok.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Line {
    pub check: String,
    pub verdict: Verdict,
    pub found: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn line(check: impl Into<String>, verdict: Verdict, found: impl Into<String>, fix: Option<String>) -> Line {
    Line { check: check.into(), verdict, found: found.into(), fix }
}
fn ok(check: impl Into<String>, found: impl Into<String>) -> Line {
    line(check, Verdict::Ok, found, None)
}
fn warn(check: impl Into<String>, found: impl Into<String>, fix: impl Into<String>) -> Line {
    line(check, Verdict::Warn, found, Some(fix.into()))
}
fn fail(check: impl Into<String>, found: impl Into<String>, fix: impl Into<String>) -> Line {
    line(check, Verdict::Fail, found, Some(fix.into()))
}

/// Foreign text as a line may quote it: control characters escaped, at most 300 characters.
pub fn esc(s: &str) -> String {
    const MAX: usize = 300;
    let t = ccm_identity::text::escaped(s.trim());
    if t.chars().count() <= MAX {
        return t;
    }
    let mut c: String = t.chars().take(MAX).collect();
    c.push('…');
    c
}

/// The last few non-empty lines of a command's output, escaped, joined with " | ".
fn tail(output: &str, n: usize) -> String {
    let lines: Vec<&str> = output.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    esc(&lines[lines.len().saturating_sub(n)..].join(" | "))
}

// ---------------------------------------------------------------------------------------------
// CRIU's configuration files
// ---------------------------------------------------------------------------------------------

/// The options of a CRIU configuration file, in order: `key value`, `key=value` or `--key value`
/// lines, `#` comments. Values lose surrounding quotes.
pub fn criu_options(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for raw in text.lines() {
        let l = raw.split('#').next().unwrap_or("").trim();
        if l.is_empty() {
            continue;
        }
        let l = l.trim_start_matches("--");
        let (k, v) = match l.find(|c: char| c == '=' || c.is_whitespace()) {
            Some(i) => (&l[..i], l[i + 1..].trim()),
            None => (l, ""),
        };
        let v = v.trim_matches(|c| c == '"' || c == '\'');
        out.push((k.to_string(), v.to_string()));
    }
    out
}

/// The last value of `key` in a configuration file's text, if it is there.
fn criu_option(fact: Option<&FileFact>, key: &str) -> Option<String> {
    match fact {
        Some(FileFact::Text(t)) => criu_options(t).into_iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
        _ => None,
    }
}

/// One CRIU caller of the node and the files its CRIU reads, the later overriding the earlier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: &'static str,
    pub files: Vec<&'static str>,
}

/// The CRIU callers installed: `criu` itself always (default.conf, read by every CRIU run), runc
/// (runc.conf), crun (crun.conf if it exists, else runc.conf: crun ≥ 1.26 with libcriu ≥ 4.2).
pub fn callers(f: &Facts) -> Vec<Caller> {
    let mut v = vec![Caller { name: "criu", files: vec!["default.conf"] }];
    if f.runc {
        v.push(Caller { name: "runc", files: vec!["default.conf", "runc.conf"] });
    }
    if f.crun {
        let own =
            if matches!(f.criu_conf.get("crun.conf"), Some(FileFact::Text(_))) { "crun.conf" } else { "runc.conf" };
        v.push(Caller { name: "crun", files: vec!["default.conf", own] });
    }
    v
}

/// The libdir a caller's CRIU uses, and the file that set it (`None`: CRIU's default).
pub fn effective_libdir(conf: &BTreeMap<String, FileFact>, caller: &Caller) -> (String, Option<&'static str>) {
    let mut found = (CRIU_DEFAULT_LIBDIR.to_string(), None);
    for file in &caller.files {
        if let Some(v) = criu_option(conf.get(*file), "libdir") {
            found = (v, Some(*file));
        }
    }
    found
}

/// The directories the I/O layer must list: every caller's libdir, CRIU's default and the package's.
pub fn libdirs_to_list(conf: &BTreeMap<String, FileFact>, runc: bool, crun: bool) -> Vec<String> {
    let probe = Facts { criu_conf: conf.clone(), runc, crun, ..Facts::empty() };
    let mut set: BTreeSet<String> = callers(&probe).iter().map(|c| effective_libdir(conf, c).0).collect();
    set.insert(CRIU_DEFAULT_LIBDIR.to_string());
    set.insert(PACKAGE_LIBDIR.to_string());
    set.into_iter().collect()
}

impl Facts {
    /// Facts of a node that has nothing at all (the base the tests change one thing of).
    pub fn empty() -> Facts {
        Facts {
            is_root: true,
            criu_conf: BTreeMap::new(),
            runc: false,
            crun: false,
            package_plugin: Ok(false),
            libdirs: BTreeMap::new(),
            criu_version: CmdFact::NotFound,
            criu_check: CmdFact::NotFound,
            nvml: Err(ProbeError::NotAsked),
            checkpoint_api: Err(ProbeError::NotAsked),
            persistence: CmdFact::NotFound,
            containerd: None,
            crio: None,
            iptables_restore: false,
            ip6tables_restore: false,
            nft: false,
            cdi: Vec::new(),
        }
    }
}

fn is_our_plugin(name: &str) -> bool {
    name == PACKAGE_PLUGIN || name == BUILT_PLUGIN
}

fn libdir_fix(caller: &Caller) -> String {
    let file = caller.files.last().copied().unwrap_or("default.conf");
    format!(
        "put `libdir {PACKAGE_LIBDIR}` into /etc/criu/{file} (docs/USER-GUIDE.md section 3; /etc/criu/default.conf \
         serves every caller)"
    )
}

fn check_plugin(f: &Facts, out: &mut Vec<Line>) {
    let pkg = format!("{PACKAGE_LIBDIR}/{PACKAGE_PLUGIN}");
    match &f.package_plugin {
        Ok(true) => out.push(ok("plugin", format!("{pkg} is installed"))),
        Ok(false) => {
            let elsewhere: Vec<&String> = f
                .libdirs
                .iter()
                .filter(|(_, l)| matches!(l, Listing::Names(n) if n.iter().any(|n| is_our_plugin(n))))
                .map(|(d, _)| d)
                .collect();
            if elsewhere.is_empty() {
                out.push(fail(
                    "plugin",
                    format!("{pkg} is not installed, nor is the plugin in any CRIU libdir of this node"),
                    "install the package: `sudo apt install ./criu-cuda-migrate_*.deb` (docs/USER-GUIDE.md section 2)",
                ));
            } else {
                let d: Vec<String> = elsewhere.iter().map(|d| esc(d)).collect();
                out.push(warn(
                    "plugin",
                    format!("{pkg} is not installed; a plugin file is in {}", d.join(", ")),
                    "install the package so that its version and its libdir are the documented ones (docs/USER-GUIDE.md \
                     section 2)",
                ));
            }
        }
        Err(e) => out.push(warn("plugin", format!("{pkg}: {}", esc(&e.to_string())), "check that file by hand")),
    }
}

fn check_libdirs(f: &Facts, out: &mut Vec<Line>) {
    for (name, fact) in &f.criu_conf {
        if let FileFact::Unreadable(why) = fact {
            out.push(warn(
                format!("criu-config:{name}"),
                format!("/etc/criu/{name} was not read: {}", esc(why)),
                "make it a regular file of at most 1 MiB (CRIU reads it as the root user does)",
            ));
        }
    }
    for c in callers(f) {
        let (dir, from) = effective_libdir(&f.criu_conf, &c);
        let check = format!("libdir:{}", c.name);
        let whence = match from {
            Some(file) => format!("libdir {} (/etc/criu/{file})", esc(&dir)),
            None => format!("no libdir line: CRIU's default {dir}"),
        };
        let shown = if c.name == "criu" { "criu run directly".to_string() } else { format!("{}'s CRIU", c.name) };
        match f.libdirs.get(&dir) {
            Some(Listing::Names(names)) => {
                let ours = names.iter().any(|n| is_our_plugin(n));
                let theirs = names.iter().any(|n| n == CRIU_CUDA_PLUGIN);
                match (ours, theirs) {
                    (true, false) => out.push(ok(check, format!("{shown}: {whence} holds the plugin"))),
                    (true, true) => out.push(fail(
                        check,
                        format!("{shown}: {whence} holds the plugin AND CRIU's own {CRIU_CUDA_PLUGIN}, which claims every CUDA process first"),
                        format!("use the package's own directory: `libdir {PACKAGE_LIBDIR}` (never copy the plugin into {CRIU_DEFAULT_LIBDIR})"),
                    )),
                    (false, _) => out.push(fail(
                        check,
                        format!("{shown}: {whence} does not hold the plugin: CRIU will not load it"),
                        libdir_fix(&c),
                    )),
                }
            }
            Some(Listing::Missing) if from.is_some() => out.push(fail(
                check,
                format!("{shown}: {whence} does not exist: CRIU fails every run (`Unable to open directory`)"),
                format!("install the package, or correct the libdir line to {PACKAGE_LIBDIR}"),
            )),
            Some(Listing::Missing) | None => out.push(fail(
                check,
                format!("{shown}: {whence}, which does not exist: CRIU will not load the plugin"),
                libdir_fix(&c),
            )),
            Some(Listing::Unreadable(why)) => out.push(warn(
                check,
                format!("{shown}: {whence} could not be listed: {}", esc(why)),
                "check by hand that the directory holds criu_cuda_migrate.so (links are not followed here)",
            )),
        }
    }
}

/// `(major, minor, patch)` of the first `Version:`-like token: the first word that starts with a
/// digit (or `v` and a digit) after any word.
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    for word in text.split(|c: char| c.is_whitespace() || c == ',') {
        let w = word.strip_prefix('v').unwrap_or(word);
        if !w.starts_with(|c: char| c.is_ascii_digit()) || !w.contains('.') {
            continue;
        }
        let mut parts = w.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().ok());
        let (Some(Some(a)), Some(Some(b))) = (parts.next(), parts.next()) else { continue };
        let c = parts.next().flatten().unwrap_or(0);
        return Some((a, b, c));
    }
    None
}

fn check_criu(f: &Facts, out: &mut Vec<Line>) {
    match &f.criu_version {
        CmdFact::NotFound => out.push(fail(
            "criu-version",
            "criu is not installed",
            "install CRIU 4.0 or later (Debian trixie: `apt install criu`, 4.1.1)",
        )),
        CmdFact::Ran { status: Some(0), output } => {
            // CRIU prints `Version: 4.1.1`; the line is looked for first, any version-like word after.
            let v = output
                .lines()
                .find(|l| l.trim_start().starts_with("Version:"))
                .and_then(parse_version)
                .or_else(|| parse_version(output));
            match v {
                Some((a, b, c)) if (a, b) >= MIN_CRIU => out.push(ok("criu-version", format!("CRIU {a}.{b}.{c}"))),
                Some((a, b, c)) => out.push(fail(
                    "criu-version",
                    format!("CRIU {a}.{b}.{c}, older than 4.0 (bookworm's 3.17 cannot run on current kernels)"),
                    "install CRIU 4.0 or later (Debian trixie's 4.1.1 or forky's 4.2.1); restore with the CRIU version \
                     that dumped, or a newer one",
                )),
                None => out.push(warn(
                    "criu-version",
                    format!("`criu --version` said no version: {}", tail(output, 2)),
                    "check `criu --version` by hand: 4.0 or later is needed",
                )),
            }
        }
        CmdFact::Ran { output, .. } => out.push(fail(
            "criu-version",
            format!("`criu --version` failed: {}", tail(output, 2)),
            "reinstall CRIU 4.0 or later",
        )),
        CmdFact::Failed(w) => out.push(fail(
            "criu-version",
            format!("`criu --version` could not run: {}", esc(w)),
            "reinstall CRIU 4.0 or later",
        )),
    }
    match &f.criu_check {
        CmdFact::NotFound => {}
        CmdFact::Ran { status: Some(0), output } if output.contains("Looks good but") => out.push(warn(
            "criu-check",
            format!("`criu check`: {}", tail(output, 3)),
            "a kernel feature CRIU can use is missing; `sudo criu check --all` names it (GPU checkpoints need none of \
             the optional ones)",
        )),
        CmdFact::Ran { status: Some(0), output } => {
            out.push(ok("criu-check", format!("`criu check`: {}", tail(output, 1))))
        }
        CmdFact::Ran { output, .. } if !f.is_root => out.push(warn(
            "criu-check",
            format!("`criu check` failed, not run as root: {}", tail(output, 2)),
            "run the check as root: `sudo criu-cuda-migrate node --check`",
        )),
        CmdFact::Ran { output, .. } => out.push(fail(
            "criu-check",
            format!("`criu check` failed: {}", tail(output, 3)),
            "fix what CRIU names (kernel options, see `sudo criu check --all`); CRIU cannot checkpoint on this kernel \
             as it is",
        )),
        CmdFact::Failed(w) => {
            out.push(fail("criu-check", format!("`criu check` could not run: {}", esc(w)), "run `sudo criu check`"))
        }
    }
}

fn check_driver(f: &Facts, out: &mut Vec<Line>) {
    match &f.nvml {
        Ok(n) => {
            let major = n.driver_version.split('.').next().and_then(|m| m.trim().parse::<u32>().ok());
            let v = esc(&n.driver_version);
            match major {
                Some(m) if m >= MIN_DRIVER_MIGRATION => out.push(ok("driver", format!("NVIDIA driver {v}"))),
                Some(m) if m >= MIN_DRIVER => out.push(warn(
                    "driver",
                    format!(
                        "NVIDIA driver {v}: checkpoints work, restores onto OTHER GPUs need r{MIN_DRIVER_MIGRATION}"
                    ),
                    format!("install driver r{MIN_DRIVER_MIGRATION} or newer, the same branch on every node"),
                )),
                Some(_) => out.push(fail(
                    "driver",
                    format!("NVIDIA driver {v} has no checkpoint API (r{MIN_DRIVER}+)"),
                    format!("install driver r{MIN_DRIVER_MIGRATION} or newer"),
                )),
                None => out.push(warn(
                    "driver",
                    format!("NVIDIA driver version {v:?} not understood"),
                    "check `nvidia-smi`",
                )),
            }
            if n.gpus.is_empty() {
                out.push(fail(
                    "gpus",
                    "NVML lists no GPU",
                    "check `nvidia-smi -L`; the GPUs or their driver are not up",
                ));
            } else {
                let names: Vec<String> = n.gpus.iter().map(|g| format!("{} (minor {})", g.uuid, g.minor)).collect();
                out.push(ok("gpus", format!("{} GPU(s): {}", n.gpus.len(), names.join(", "))));
            }
        }
        Err(e) => out.push(fail(
            "driver",
            format!("NVML: {}", esc(&e.to_string())),
            "install the NVIDIA driver (r580 or newer) with its libnvidia-ml.so.1",
        )),
    }
    match &f.checkpoint_api {
        Ok(path) => out.push(ok(
            "checkpoint-api",
            format!(
                "{} exports cuCheckpointProcess{{Lock,Checkpoint,Restore,Unlock,GetState,GetRestoreThreadId}}",
                esc(path)
            ),
        )),
        Err(e) => out.push(fail(
            "checkpoint-api",
            format!("libcuda's checkpoint API: {}", esc(&e.to_string())),
            "install driver r580 or newer (its libcuda.so.1 exports cuCheckpointProcessLock and the rest)",
        )),
    }
}

/// `(uuid, enabled)` of each line of `nvidia-smi --query-gpu=uuid,persistence_mode --format=csv,noheader`.
pub fn parse_persistence(output: &str) -> Vec<(String, bool)> {
    output
        .lines()
        .filter_map(|l| {
            let (u, m) = l.split_once(',')?;
            let m = m.trim();
            let on = if m.eq_ignore_ascii_case("enabled") {
                true
            } else if m.eq_ignore_ascii_case("disabled") {
                false
            } else {
                return None;
            };
            Some((u.trim().to_string(), on))
        })
        .collect()
}

fn check_persistence(f: &Facts, out: &mut Vec<Line>) {
    const FIX: &str = "turn persistence mode on: `sudo systemctl enable --now nvidia-persistenced` (or `sudo nvidia-smi -pm 1`); \
         without it the driver tears the GPUs' state down when their last user exits, and every restore waits for it to \
         come back (a cuInit)";
    match &f.persistence {
        CmdFact::Ran { status: Some(0), output } => {
            let gpus = parse_persistence(output);
            let off: Vec<String> = gpus.iter().filter(|(_, on)| !on).map(|(u, _)| esc(u)).collect();
            if gpus.is_empty() {
                out.push(warn("persistence", format!("nvidia-smi said nothing readable: {}", tail(output, 2)), FIX));
            } else if off.is_empty() {
                out.push(ok("persistence", format!("persistence mode on for all {} GPU(s)", gpus.len())));
            } else {
                out.push(warn("persistence", format!("persistence mode off on {}", off.join(", ")), FIX));
            }
        }
        CmdFact::Ran { output, .. } => {
            out.push(warn("persistence", format!("nvidia-smi failed: {}", tail(output, 2)), FIX))
        }
        CmdFact::NotFound => out.push(warn("persistence", "nvidia-smi is not installed: cannot tell", FIX)),
        CmdFact::Failed(w) => out.push(warn("persistence", format!("nvidia-smi could not run: {}", esc(w)), FIX)),
    }
}

/// A TOML document parsed as containerd (go-toml v2) and CRI-O read theirs: TOML 1.0, every rule of
/// it (a key inside a `"""` string is text, `"key "` is another name than `key`, a key set twice is an
/// error). `Err` is why the file is no TOML, with its line and column: neither runtime starts with such
/// a file.
pub fn parse_toml(text: &str) -> Result<toml::Table, TomlSyntaxError> {
    text.parse::<toml::Table>().map_err(|e| {
        let at = e.span().map(|r| r.start).unwrap_or(0).min(text.len());
        let before = text.get(..at).unwrap_or("");
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        TomlSyntaxError { line, column, message: e.message().trim().to_string() }
    })
}

/// Where and why a file is no TOML (the `toml` crate's message, placed by line and column).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct TomlSyntaxError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// The value at `path` (table names, then the key), if every step is there.
pub fn toml_get<'a>(table: &'a toml::Table, path: &[&str]) -> Option<&'a toml::Value> {
    let (last, tables) = path.split_last()?;
    let mut t = table;
    for name in tables {
        t = t.get(*name)?.as_table()?;
    }
    t.get(*last)
}

/// A key path as TOML writes it: bare keys as they are, others quoted.
fn toml_path(path: &[String]) -> String {
    let bare = |k: &str| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    path.iter().map(|k| if bare(k) { k.clone() } else { format!("{k:?}") }).collect::<Vec<_>>().join(".")
}

/// Every path in `table` (through tables and arrays of tables) whose last key is `key` once trimmed
/// and lower-cased: the places a user set it, right or wrong.
fn toml_find(table: &toml::Table, key: &str) -> Vec<Vec<String>> {
    fn walk(t: &toml::Table, key: &str, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        for (k, v) in t {
            at.push(k.clone());
            if k.trim().eq_ignore_ascii_case(key) {
                out.push(at.clone());
            }
            match v {
                toml::Value::Table(inner) => walk(inner, key, at, out),
                toml::Value::Array(items) => {
                    for item in items {
                        if let toml::Value::Table(inner) = item {
                            walk(inner, key, at, out);
                        }
                    }
                }
                _ => {}
            }
            at.pop();
        }
    }
    let mut out = Vec::new();
    walk(table, key, &mut Vec::new(), &mut out);
    out
}

/// A TOML value as a line may quote it, with its type where it is no boolean.
fn toml_shown(v: &toml::Value) -> String {
    match v {
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::String(s) => format!("{} (a string)", esc(&format!("{s:?}"))),
        toml::Value::Integer(i) => format!("{i} (an integer)"),
        toml::Value::Float(x) => format!("{x} (a float)"),
        toml::Value::Datetime(d) => format!("{} (a date-time)", esc(&d.to_string())),
        toml::Value::Array(_) => "[…] (an array)".into(),
        toml::Value::Table(_) => "{…} (a table)".into(),
    }
}

/// Where containerd reads its CRI restore switch in a configuration of `version`: the CRI runtime
/// plugin's table; in a version 1 or 2 file also the old CRI plugin's (`io.containerd.grpc.v1.cri`,
/// `cri` in version 1), whose keys containerd 2 moves there when the runtime table does not set them
/// (`plugins/cri/runtime` `configMigration`), so the runtime table's own value wins.
fn containerd_restore_paths(version: i64) -> Vec<Vec<&'static str>> {
    let mut paths = vec![vec!["plugins", CONTAINERD_CRI_RUNTIME_PLUGIN, CONTAINERD_RESTORE_KEY]];
    if version < 3 {
        paths.push(vec!["plugins", "io.containerd.grpc.v1.cri", CONTAINERD_RESTORE_KEY]);
    }
    if version < 2 {
        paths.push(vec!["plugins", "cri", CONTAINERD_RESTORE_KEY]);
    }
    paths
}

fn check_containerd(f: &Facts, out: &mut Vec<Line>) {
    let Some((version, config)) = &f.containerd else { return };
    let v = match version {
        CmdFact::Ran { status: Some(0), output } => {
            parse_version(output.split_whitespace().skip(1).collect::<Vec<_>>().join(" ").as_str())
        }
        _ => None,
    };
    let fix = format!(
        "in /etc/containerd/config.toml: `[plugins.'io.containerd.cri.v1.runtime']` then `{CONTAINERD_RESTORE_KEY} = \
         true`, and `sudo systemctl restart containerd`"
    );
    match v {
        None => out.push(warn(
            "containerd",
            "containerd is installed, its version not understood: cannot tell whether restores through CRI are on",
            format!("containerd 2.2 and later: {fix}"),
        )),
        Some((a, b, _)) if a < 2 => out.push(warn(
            "containerd",
            format!(
                "containerd {a}.{b}: no CRI checkpoint (the kubelet's checkpoint needs containerd 2.0+); `ctr` works"
            ),
            "for the kubelet's checkpoints install containerd 2.0 or later",
        )),
        Some((a, b, _)) if (a, b) < (2, 2) => out.push(ok(
            "containerd",
            format!("containerd {a}.{b}: restore through CRI (CreateContainer from a checkpoint) is on by default"),
        )),
        Some((a, b, _)) => {
            let text = match config {
                FileFact::Text(t) => Some(t),
                FileFact::Absent => None,
                FileFact::Unreadable(why) => {
                    out.push(warn(
                        "containerd",
                        format!("containerd {a}.{b}; /etc/containerd/config.toml not read: {}", esc(why)),
                        fix,
                    ));
                    return;
                }
            };
            let Some(text) = text else {
                out.push(fail(
                    "containerd",
                    format!(
                        "containerd {a}.{b}: no /etc/containerd/config.toml: since 2.2 restores through CRI (the \
                         kubelet's way) are off by default"
                    ),
                    fix,
                ));
                return;
            };
            out.push(containerd_config_line(a, b, text, &fix));
        }
    }
}

/// The verdict on containerd ≥ 2.2's `config.toml`, read as containerd reads it.
fn containerd_config_line(a: u32, b: u32, text: &str, fix: &str) -> Line {
    let table = match parse_toml(text) {
        Ok(t) => t,
        Err(why) => {
            return fail(
                "containerd",
                format!(
                    "containerd {a}.{b}: /etc/containerd/config.toml is not valid TOML ({}): containerd refuses to \
                     start with it (`failed to unmarshal TOML`), so nothing is restored through CRI",
                    esc(&why.to_string())
                ),
                format!(
                    "correct the file (`python3 -c 'import tomllib; tomllib.load(open(\"/etc/containerd/config.toml\", \
                     \"rb\"))'` names the same place), then {fix}"
                ),
            )
        }
    };
    let version = match table.get("version") {
        None => 1,
        Some(toml::Value::Integer(v)) => *v,
        Some(other) => {
            return fail(
                "containerd",
                format!(
                    "containerd {a}.{b}: /etc/containerd/config.toml has `version = {}`, not a number: containerd \
                     refuses to start with it",
                    toml_shown(other)
                ),
                format!("write `version = 3`, then {fix}"),
            )
        }
    };
    let paths = containerd_restore_paths(version);
    let found = paths.iter().find_map(|p| toml_get(&table, p).map(|v| (p, v)));
    let imports: Vec<String> = match table.get("imports") {
        Some(toml::Value::Array(items)) => {
            items.iter().map(|i| i.as_str().map_or_else(|| toml_shown(i), |p| esc(&format!("{p:?}")))).collect()
        }
        _ => Vec::new(),
    };
    let line = match found {
        Some((_, toml::Value::Boolean(true))) => {
            ok("containerd", format!("containerd {a}.{b}: {CONTAINERD_RESTORE_KEY} = true (restore through CRI is on)"))
        }
        Some((_, toml::Value::Boolean(false))) => fail(
            "containerd",
            format!("containerd {a}.{b}: {CONTAINERD_RESTORE_KEY} = false: restores through CRI are refused"),
            fix,
        ),
        Some((path, other)) => fail(
            "containerd",
            format!(
                "containerd {a}.{b}: {} = {}, not the boolean true: containerd cannot decode the CRI runtime plugin's \
                 configuration, so that plugin does not load and CRI serves nothing",
                toml_path(&path.iter().map(|k| k.to_string()).collect::<Vec<_>>()),
                toml_shown(other)
            ),
            format!("write `{CONTAINERD_RESTORE_KEY} = true` (no quotes), then {fix}"),
        ),
        None => {
            let wanted: Vec<Vec<String>> = paths.iter().map(|p| p.iter().map(|k| k.to_string()).collect()).collect();
            let elsewhere: Vec<String> = toml_find(&table, CONTAINERD_RESTORE_KEY)
                .into_iter()
                .filter(|p| !wanted.contains(p))
                .map(|p| esc(&toml_path(&p)))
                .collect();
            if elsewhere.is_empty() {
                fail(
                    "containerd",
                    format!(
                        "containerd {a}.{b}: /etc/containerd/config.toml lacks {CONTAINERD_RESTORE_KEY} = true: since \
                         2.2 restores through CRI (the kubelet's way) are off by default"
                    ),
                    fix,
                )
            } else {
                fail(
                    "containerd",
                    format!(
                        "containerd {a}.{b}: {CONTAINERD_RESTORE_KEY} is set as {}, a place or a name containerd does \
                         not read ({})",
                        elsewhere.join(", "),
                        if table.contains_key("version") {
                            format!("version {version} file")
                        } else {
                            "no `version`: a version 1 file".into()
                        }
                    ),
                    fix,
                )
            }
        }
    };
    if imports.is_empty() || line.verdict == Verdict::Fail && found.is_some() {
        return line;
    }
    // An imported file's plugin table replaces this one's whole (containerd merges `plugins` by
    // plugin, values replaced): what this file says is not the last word.
    warn(
        "containerd",
        format!(
            "{}; this file imports {}, which the check does not read and whose CRI runtime table would replace this \
             one's",
            line.found,
            imports.join(", ")
        ),
        format!("check the imported files by hand (`containerd config dump | grep {CONTAINERD_RESTORE_KEY}`); {fix}"),
    )
}

fn check_crio(f: &Facts, out: &mut Vec<Line>) {
    let Some((version, files)) = &f.crio else { return };
    let shown_version = match version {
        CmdFact::Ran { status: Some(0), output } => match parse_version(output) {
            Some((a, b, c)) => format!("CRI-O {a}.{b}.{c}"),
            None => "CRI-O".to_string(),
        },
        _ => "CRI-O".to_string(),
    };
    // Each file in CRI-O's order, a later one's key over an earlier one's; a file that is no TOML, or a
    // value of the wrong type, and CRI-O does not start.
    let mut level: Option<(String, String)> = None;
    let mut criu_support: Option<(String, String)> = None;
    for (name, fact) in files {
        match fact {
            FileFact::Text(t) => {
                let table = match parse_toml(t) {
                    Ok(table) => table,
                    Err(why) => {
                        out.push(fail(
                            "cri-o",
                            format!(
                                "{shown_version}: {} is not valid TOML ({}): CRI-O refuses to start with it",
                                esc(name),
                                esc(&why.to_string())
                            ),
                            "correct the file (Python's `tomllib` names the same place), then `sudo systemctl restart crio`",
                        ));
                        return;
                    }
                };
                let level_path = ["crio", "checkpoint_restore", "container_level_enabled"];
                let support_path = ["crio", "runtime", "enable_criu_support"];
                let wrong = |path: &[&str], v: &toml::Value, want: &str| {
                    fail(
                        "cri-o",
                        format!(
                            "{shown_version}: {} = {} in {}, not {want}: CRI-O refuses to start with it",
                            toml_path(&path.iter().map(|k| k.to_string()).collect::<Vec<_>>()),
                            toml_shown(v),
                            esc(name)
                        ),
                        "write the value as the CRI-O configuration reference does, then `sudo systemctl restart crio`",
                    )
                };
                match toml_get(&table, &level_path) {
                    Some(toml::Value::String(v)) => level = Some((v.clone(), name.clone())),
                    Some(v) => {
                        out.push(wrong(&level_path, v, "a string"));
                        return;
                    }
                    None => {}
                }
                match toml_get(&table, &support_path) {
                    Some(toml::Value::Boolean(v)) => criu_support = Some((v.to_string(), name.clone())),
                    Some(v) => {
                        out.push(wrong(&support_path, v, "a boolean"));
                        return;
                    }
                    None => {}
                }
            }
            FileFact::Unreadable(why) => out.push(warn(
                "cri-o",
                format!("{} not read: {}", esc(name), esc(why)),
                "make it a regular file of at most 1 MiB",
            )),
            FileFact::Absent => {}
        }
    }
    const FIX: &str = "in /etc/crio/crio.conf.d/ (a file of its own): `[crio.checkpoint_restore]` then \
         `container_level_enabled = \"checkpoint_restore\"` (older CRI-O: `[crio.runtime]` `enable_criu_support = true`), \
         and `sudo systemctl restart crio`";
    match (level, criu_support) {
        (Some((v, from)), _) if v == "checkpoint_restore" => out.push(ok(
            "cri-o",
            format!("{shown_version}: container_level_enabled = \"checkpoint_restore\" ({})", esc(&from)),
        )),
        (Some((v, from)), _) => out.push(fail(
            "cri-o",
            format!(
                "{shown_version}: container_level_enabled = \"{}\" ({}): restores are refused",
                esc(&v),
                esc(&from)
            ),
            FIX,
        )),
        (None, Some((v, from))) if v == "true" => out.push(warn(
            "cri-o",
            format!(
                "{shown_version}: enable_criu_support = true ({}), no [crio.checkpoint_restore]: a CRI-O with that table \
                 (1.30-1.34 since the 2026-08 backports, and later) only checkpoints by default and refuses restores",
                esc(&from)
            ),
            FIX,
        )),
        _ => out.push(fail(
            "cri-o",
            format!("{shown_version}: neither [crio.checkpoint_restore] container_level_enabled nor enable_criu_support is set: checkpoint/restore is off"),
            FIX,
        )),
    }
}

fn check_network_lock(f: &Facts, out: &mut Vec<Line>) {
    // The method every runtime's CRIU gets: default.conf, overridden by runc.conf (the runtimes' file).
    let mut method = "iptables".to_string();
    let mut from = "CRIU's default".to_string();
    for file in ["default.conf", "runc.conf"] {
        if let Some(v) = criu_option(f.criu_conf.get(file), "network-lock") {
            method = v;
            from = format!("/etc/criu/{file}");
        }
    }
    match method.as_str() {
        "iptables" if f.iptables_restore && f.ip6tables_restore => out.push(ok(
            "network-lock",
            format!("CRIU locks the network with iptables ({from}); iptables-restore and ip6tables-restore are installed"),
        )),
        "iptables" if f.iptables_restore => out.push(warn(
            "network-lock",
            format!("CRIU locks the network with iptables ({from}); ip6tables-restore is missing"),
            "install iptables (`apt install iptables`), which has both",
        )),
        "iptables" => out.push(fail(
            "network-lock",
            format!(
                "CRIU locks the network with iptables ({from}), and iptables-restore is not installed: a container \
                 restore fails with only `ctr: OCI runtime restore failed: read unixpacket @->@: EOF` when the dump node had it"
            ),
            "install iptables (`apt install iptables`) on every node",
        )),
        "nftables" if f.nft => out.push(ok("network-lock", format!("CRIU locks the network with nftables ({from})"))),
        "nftables" => out.push(warn(
            "network-lock",
            format!("CRIU locks the network with nftables ({from}); nft is not installed"),
            "check `sudo criu check --feature network-lock-nftables`, or install iptables and drop the network-lock line",
        )),
        "skip" => out.push(warn(
            "network-lock",
            format!("network-lock skip ({from}): CRIU does not lock the network during a checkpoint"),
            "only where no lock works; TCP peers may see resets. Remove the line where iptables is installed",
        )),
        other => out.push(fail(
            "network-lock",
            format!("network-lock {} ({from}) is no method CRIU knows", esc(other)),
            "write `network-lock iptables` or `network-lock nftables`",
        )),
    }
}

/// The kind and the `/dev/nvidiaN` minors a CDI spec names (text rules, YAML or JSON): `None` when
/// it is no `nvidia.com/gpu` spec.
pub fn cdi_gpu_minors(text: &str) -> Option<BTreeSet<u32>> {
    let is_gpu = text.lines().any(|l| {
        let l = l.trim().trim_start_matches('{').trim();
        (l.starts_with("kind") || l.starts_with("\"kind\"")) && l.contains("nvidia.com/gpu")
    }) || text.contains("\"kind\":\"nvidia.com/gpu\"");
    if !is_gpu {
        return None;
    }
    let mut minors = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("/dev/nvidia") {
        rest = &rest[i + "/dev/nvidia".len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let next = rest[digits.len()..].chars().next();
        // `/dev/nvidia0` but not `/dev/nvidia-uvm`, `/dev/nvidiactl` or `/dev/nvidia0x`.
        if !digits.is_empty() && !matches!(next, Some(c) if c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            if let Ok(m) = digits.parse() {
                minors.insert(m);
            }
        }
    }
    Some(minors)
}

fn check_cdi(f: &Facts, out: &mut Vec<Line>) {
    const FIX: &str =
        "generate the spec: `sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` (again after every \
         driver or GPU change), or let the GPU operator/device plugin write it";
    let mut named = BTreeSet::new();
    let mut specs = Vec::new();
    for (path, fact) in &f.cdi {
        match fact {
            FileFact::Text(t) => {
                if let Some(m) = cdi_gpu_minors(t) {
                    named.extend(m);
                    specs.push(esc(path));
                }
            }
            FileFact::Unreadable(why) => out.push(warn(
                "cdi",
                format!("{} not read: {}", esc(path), esc(why)),
                "a CDI spec must be a regular file (at most 4 MiB)",
            )),
            FileFact::Absent => {}
        }
    }
    if specs.is_empty() {
        out.push(warn(
            "cdi",
            "no CDI spec for nvidia.com/gpu in /etc/cdi or /var/run/cdi: containers get GPUs only through the legacy \
             NVIDIA hook, whose containers CRIU restores less well",
            FIX,
        ));
        return;
    }
    let gpus: Vec<&GpuIdentity> = f.nvml.as_ref().map(|n| n.gpus.iter().collect()).unwrap_or_default();
    let missing: Vec<String> = gpus
        .iter()
        .filter(|g| !named.contains(&g.minor))
        .map(|g| format!("{} (/dev/nvidia{})", g.uuid, g.minor))
        .collect();
    let known: BTreeSet<u32> = gpus.iter().map(|g| g.minor).collect();
    let stale: Vec<String> =
        named.iter().filter(|m| !gpus.is_empty() && !known.contains(m)).map(|m| format!("/dev/nvidia{m}")).collect();
    if !missing.is_empty() {
        out.push(fail("cdi", format!("{} name no device node of {}", specs.join(", "), missing.join(", ")), FIX));
    } else if !stale.is_empty() {
        out.push(warn(
            "cdi",
            format!("{} name {}, which no GPU of this node has", specs.join(", "), stale.join(", ")),
            FIX,
        ));
    } else if gpus.is_empty() {
        out.push(ok("cdi", format!("{} (no GPU list to compare with)", specs.join(", "))));
    } else {
        out.push(ok("cdi", format!("{} name every GPU ({} device node(s))", specs.join(", "), named.len())));
    }
}

/// Every verdict line of the node, in the order a user fixes them.
pub fn evaluate(f: &Facts) -> Vec<Line> {
    let mut out = Vec::new();
    check_plugin(f, &mut out);
    check_libdirs(f, &mut out);
    check_criu(f, &mut out);
    check_driver(f, &mut out);
    check_persistence(f, &mut out);
    check_containerd(f, &mut out);
    check_crio(f, &mut out);
    check_network_lock(f, &mut out);
    check_cdi(f, &mut out);
    out
}

/// Ready: no line failed.
pub fn ready(lines: &[Line]) -> bool {
    lines.iter().all(|l| l.verdict != Verdict::Fail)
}
