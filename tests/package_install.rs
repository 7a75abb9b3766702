//! The Debian package (`packaging/build-deb.sh`), as a user gets it:
//!
//! - its contents: the plugin alone in its own libdir, the tool, the man page, the config example, the docs, and no
//!   test double; the man page describes every subcommand and option the tool's `--help` lists;
//! - installed with `dpkg -i` into a fresh copy of the Debian trixie root of `tests/criu-root.sh`, with the one
//!   libdir line of the shipped example appended to `/etc/criu/default.conf`: real CRIU, run WITHOUT `--libdir`,
//!   loads the plugin from that configuration alone, dumps and restores a plain process, and the installed tool
//!   answers the commands of the user guide with the documented exit codes; `dpkg --purge` removes it again.
//!
//! The package is built once per test run (release profile), or taken from `CCM_DEB`. The install test needs
//! root; it skips loudly without it, and fails under CI instead of skipping. The cached trixie root is never
//! modified: the test works on a `cp -a` copy (about 230 MiB, a few seconds) that it deletes afterwards.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use support::package::{deb, describe_output, run_ok, RootCopy, RootKind};
use support::{criu_root_or_skip, init_line, CriuRoot, MarkedWorkload, LOG_PREFIX};

const PACKAGE: &str = "criu-cuda-migrate";
const PLUGIN_DIR: &str = "/usr/lib/criu-cuda-migrate/plugins";
const PLUGIN_PATH: &str = "/usr/lib/criu-cuda-migrate/plugins/criu_cuda_migrate.so";
const CLI_PATH: &str = "/usr/bin/criu-cuda-migrate";
const MAN_PAGE_PATH: &str = "/usr/share/man/man1/criu-cuda-migrate.1.gz";
const CONFIG_EXAMPLE_PATH: &str = "/etc/criu/criu-cuda-migrate.conf.example";
const ACTION_SCRIPT_PATH: &str = "/usr/lib/criu-cuda-migrate/action-script";

/// Every file the package may hold; anything else (a test double above all) is a packaging bug.
const EXPECTED_FILES: &[&str] = &[
    PLUGIN_PATH,
    CLI_PATH,
    MAN_PAGE_PATH,
    CONFIG_EXAMPLE_PATH,
    ACTION_SCRIPT_PATH,
    "/usr/share/doc/criu-cuda-migrate/README.md",
    "/usr/share/doc/criu-cuda-migrate/USER-GUIDE.md",
    "/usr/share/doc/criu-cuda-migrate/IMAGE-FORMAT.md",
    "/usr/share/doc/criu-cuda-migrate/copyright",
    "/usr/share/doc/criu-cuda-migrate/changelog.Debian.gz",
];

/// `dpkg-deb --contents` lines end in `./path` (directories with a trailing `/`); the files only, as `/path`.
fn packaged_files(deb: &Path) -> Vec<String> {
    run_ok(Command::new("dpkg-deb").arg("--contents").arg(deb))
        .lines()
        .filter(|line| !line.starts_with('d'))
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(|path| path.trim_start_matches('.').to_string())
        .collect()
}

#[test]
fn package_holds_plugin_tool_man_page_config_and_docs_and_no_test_double() {
    let deb = deb();
    let files = packaged_files(deb);
    for expected in EXPECTED_FILES {
        assert!(files.iter().any(|f| f == expected), "{} lacks {expected}; it holds {files:#?}", deb.display());
    }
    let unexpected: Vec<&String> = files.iter().filter(|f| !EXPECTED_FILES.contains(&f.as_str())).collect();
    assert!(unexpected.is_empty(), "{} holds files nobody asked for (test doubles?): {unexpected:#?}", deb.display());
    // CRIU's own cuda_plugin.so sits in /usr/lib/criu; CRIU loads every .so of a libdir, so sharing it would load
    // both plugins.
    assert!(
        !files.iter().any(|f| f.starts_with("/usr/lib/criu/")),
        "the package installs into CRIU's default plugin directory: {files:#?}"
    );

    let field = |name: &str| run_ok(Command::new("dpkg-deb").arg("--field").arg(deb).arg(name)).trim().to_string();
    assert_eq!(field("Package"), PACKAGE);
    assert_eq!(field("Version"), format!("{}-1", env!("CARGO_PKG_VERSION")));
    assert!(field("Depends").contains("libc6"), "Depends lacks libc6: {:?}", field("Depends"));
    // The project has no home page yet: the package names none rather than an invented one.
    assert_eq!(field("Homepage"), "", "the package names a home page");
    // No maintainer scripts: the package never edits /etc/criu/*.conf behind the user's back.
    let info = run_ok(Command::new("dpkg-deb").arg("--info").arg(deb));
    for script in ["preinst", "postinst", "prerm", "postrm", "config"] {
        assert!(
            !info.lines().any(|l| l.split_whitespace().last() == Some(script)),
            "the package has a {script}:\n{info}"
        );
    }
}

/// The flags (`--device-map`) and, for the top level, the subcommands a clap `--help` text lists.
fn help_words(help: &str, subcommands: bool) -> Vec<String> {
    let mut words = Vec::new();
    let mut in_commands = false;
    for line in help.lines() {
        if line.starts_with("Commands:") {
            in_commands = true;
            continue;
        }
        if !line.starts_with(' ') {
            in_commands = false;
        }
        let first = line.split_whitespace().next().unwrap_or("");
        if in_commands && subcommands && !first.is_empty() && first != "help" {
            words.push(first.to_string());
        }
        for token in line.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']' || c == '=') {
            if token.starts_with("--") && token.len() > 2 && token != "--help" && token != "--version" {
                words.push(token.to_string());
            }
        }
    }
    words.sort();
    words.dedup();
    words
}

#[test]
fn man_page_describes_every_subcommand_and_option_of_the_packaged_tool() {
    let deb = deb();
    let unpacked = tempfile::Builder::new().prefix("ccm-deb-unpacked-").tempdir().expect("temporary directory");
    run_ok(Command::new("dpkg-deb").arg("--extract").arg(deb).arg(unpacked.path()));
    let cli = unpacked.path().join(CLI_PATH.trim_start_matches('/'));
    let man_gz = unpacked.path().join(MAN_PAGE_PATH.trim_start_matches('/'));
    // roff writes a literal hyphen as `\-`.
    let man = run_ok(Command::new("gzip").arg("-dc").arg(&man_gz)).replace("\\-", "-");

    let top = run_ok(Command::new(&cli).arg("--help"));
    let subcommands: Vec<String> = help_words(&top, true).into_iter().filter(|w| !w.starts_with("--")).collect();
    assert!(subcommands.len() >= 4, "the tool's --help lists too few subcommands ({subcommands:?}):\n{top}");
    let mut missing = Vec::new();
    for word in help_words(&top, true) {
        if !man.contains(&word) {
            missing.push(word);
        }
    }
    for sub in &subcommands {
        let help = run_ok(Command::new(&cli).arg(sub).arg("--help"));
        assert!(
            man.contains(&format!(".B {sub}"))
                || man.contains(&format!(".BI {sub}"))
                || man.contains(&format!(".BI \"{sub}")),
            "the man page has no entry for the subcommand {sub}"
        );
        for word in help_words(&help, false) {
            if !man.contains(&word) {
                missing.push(format!("{sub} {word}"));
            }
        }
    }
    assert!(missing.is_empty(), "the man page (packaging/criu-cuda-migrate.1) does not describe {missing:?}");
    let version = run_ok(Command::new(&cli).arg("--version"));
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "--version prints {version:?}");
}

/// Runs inside the copy of the trixie root: install the package, append the example's libdir line to
/// /etc/criu/default.conf, start a plain workload detached, `criu dump` and `criu restore -d` it WITHOUT
/// --libdir, then run the installed tool on the images. Every step leaves its status in the scratch directory.
const INSTALL_SCENARIO: &str = r#"
set -u
S=$1 MARK=$2
# Only the configuration file may tell CRIU where the plugin is.
unset CRIU_LIBS_DIR CRIU_CONFIG_FILE
DEBIAN_FRONTEND=noninteractive dpkg -i "$S/package.deb" >"$S/dpkg-install.out" 2>&1
echo $? >"$S/install.rc"
[ "$(cat "$S/install.rc")" = 0 ] || exit 0
mkdir -p /etc/criu
grep '^libdir ' /etc/criu/criu-cuda-migrate.conf.example >>/etc/criu/default.conf
cp /etc/criu/default.conf "$S/default.conf"
# The workload must not inherit fds of files outside this mount namespace (cargo's pipes): CRIU could not restore
# them.
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
criu dump -t "$PID" -D "$S/images" -v4 -o dump.log 2>"$S/dump.stderr"
echo $? >"$S/dump.rc"
[ "$(cat "$S/dump.rc")" = 0 ] || exit 0
# CRIU restores the same pid, so the dumped task must be gone and reaped first.
for _ in $(seq 400); do [ -e "/proc/$PID" ] || break; sleep 0.05; done
[ -e "/proc/$PID" ] && { echo "pid $PID still exists 20 s after the dump" >&2; exit 91; }
criu restore -d -D "$S/images" -v4 -o restore.log 2>"$S/restore.stderr"
echo $? >"$S/restore.rc"
# The installed tool, as the user guide uses it (no NVIDIA driver in this root).
cli() {
    name=$1
    shift
    criu-cuda-migrate "$@" >"$S/cli-$name.out" 2>"$S/cli-$name.err"
    echo $? >"$S/cli-$name.rc"
}
cli version --version
cli inspect inspect "$S/images"
cli inspect-json inspect "$S/images" --json
cli preflight preflight "$S/images"
cli preflight-json --json preflight "$S/images"
cli inspect-missing inspect "$S/no-such-directory"
cli node node
cli bad-usage frobnicate
# The user guide's alternative to a libdir line: CRIU_LIBS_DIR in CRIU's environment. A pid that cannot exist:
# CRIU loads its plugins before it looks for the task, so the log shows whether it found this one.
mv /etc/criu/default.conf /tmp/default.conf.saved
mkdir -p "$S/libs-dir"
CRIU_LIBS_DIR=/usr/lib/criu-cuda-migrate/plugins criu dump -t 2147483646 -D "$S/libs-dir" -v4 -o dump.log 2>/dev/null
echo $? >"$S/libs-dir.rc"
mv /tmp/default.conf.saved /etc/criu/default.conf
"#;

/// Runs inside the same copy after the install scenario: purge the package.
const PURGE_SCENARIO: &str = r#"
set -u
S=$1
DEBIAN_FRONTEND=noninteractive dpkg --purge criu-cuda-migrate >"$S/dpkg-purge.out" 2>&1
echo $? >"$S/purge.rc"
# The libdir line left behind now names a missing directory: CRIU must refuse to run (the user guide says to remove
# the line first). A pid that cannot exist: CRIU loads plugins before it looks for the task.
mkdir -p "$S/after-purge"
criu dump -t 2147483646 -D "$S/after-purge" -v4 -o dump.log 2>/dev/null
echo $? >"$S/after-purge.rc"
"#;

/// The scratch directory shared with the scenarios (bound into the root at its own path).
struct Scratch {
    dir: tempfile::TempDir,
    /// The workload's pid once started; dropped: killed if it still runs.
    pid: i32,
}

const WORKLOAD_MARK: &str = "ccm-package-workload";

impl Scratch {
    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn read(&self, name: &str) -> String {
        fs::read_to_string(self.path().join(name)).unwrap_or_default()
    }

    fn rc(&self, name: &str) -> Option<i32> {
        self.read(name).trim().parse().ok()
    }

    fn workload(&self) -> MarkedWorkload {
        MarkedWorkload { pid: self.pid, mark: WORKLOAD_MARK }
    }

    fn describe(&self) -> String {
        let tail = |text: String| -> String {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(25)..].join("\n")
        };
        format!(
            "install rc {:?}, dump rc {:?}, restore rc {:?}, workload pid {}\n--- dpkg -i ---\n{}\n--- default.conf \
             ---\n{}\n--- criu stderr ---\n{}{}\n--- dump.log (tail) ---\n{}\n--- restore.log (tail) ---\n{}",
            self.rc("install.rc"),
            self.rc("dump.rc"),
            self.rc("restore.rc"),
            self.pid,
            self.read("dpkg-install.out"),
            self.read("default.conf"),
            self.read("dump.stderr"),
            self.read("restore.stderr"),
            tail(self.read("images/dump.log")),
            tail(self.read("images/restore.log")),
        )
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.workload().kill();
    }
}

fn run_in(root: &CriuRoot, copy: &RootCopy, scratch: &Path, script: &str, args: &[&str]) -> Output {
    let path = scratch.join("scenario.sh");
    fs::write(&path, script).expect("write scenario");
    let mut command = vec!["bash", path.to_str().expect("UTF-8 path")];
    command.extend_from_slice(args);
    let copy_path = copy.path();
    root.run(&[scratch], &command, &[("CCM_TRIXIE_ROOT", copy_path.to_str().expect("UTF-8 root path"))])
}

#[test]
fn installed_package_is_loaded_by_criu_from_its_config_file_alone() {
    let Some(root) = criu_root_or_skip("installed_package_is_loaded_by_criu_from_its_config_file_alone") else {
        return;
    };
    let deb = deb();
    let copy = RootCopy::of(&root, RootKind::Criu);
    let mut scratch = Scratch {
        dir: tempfile::Builder::new().prefix("ccm-package-test-").tempdir().expect("scratch directory"),
        pid: 0,
    };
    fs::create_dir(scratch.path().join("images")).expect("images directory");
    fs::copy(deb, scratch.path().join("package.deb")).expect("copy of the package");

    let scratch_str = scratch.path().to_str().expect("UTF-8 scratch path").to_string();
    let runner = run_in(&root, &copy, scratch.path(), INSTALL_SCENARIO, &[&scratch_str, WORKLOAD_MARK]);
    scratch.pid = scratch.rc("workload.pid").unwrap_or(0);
    let why = format!("{}\nrunner: {}", scratch.describe(), describe_output(&runner));
    assert!(runner.status.success(), "the scenario in the copy of the trixie root failed:\n{why}");

    assert_eq!(scratch.rc("install.rc"), Some(0), "dpkg -i of {} failed:\n{why}", deb.display());
    for inside in [PLUGIN_PATH, CLI_PATH, CONFIG_EXAMPLE_PATH, MAN_PAGE_PATH] {
        assert!(copy.file(inside).is_file(), "{inside} is not installed:\n{why}");
    }
    assert!(
        !copy.file("/usr/lib/criu").join("criu_cuda_migrate.so").exists(),
        "the plugin landed in CRIU's default plugin directory"
    );
    assert!(
        scratch.read("default.conf").lines().any(|l| l.trim() == format!("libdir {PLUGIN_DIR}")),
        "the example's libdir line did not reach /etc/criu/default.conf:\n{why}"
    );

    assert_eq!(scratch.rc("dump.rc"), Some(0), "criu dump (plugin from /etc/criu/default.conf) failed:\n{why}");
    assert_eq!(scratch.rc("restore.rc"), Some(0), "criu restore (plugin from /etc/criu/default.conf) failed:\n{why}");
    let dump_log = scratch.read("images/dump.log");
    let restore_log = scratch.read("images/restore.log");
    assert!(
        dump_log.contains(&init_line("dump")),
        "dump.log lacks {:?}: CRIU did not load the plugin from the config file:\n{why}",
        init_line("dump")
    );
    assert!(
        restore_log.contains(&init_line("restore")),
        "restore.log lacks {:?}: CRIU did not load the plugin from the config file:\n{why}",
        init_line("restore")
    );
    assert!(dump_log.contains(LOG_PREFIX), "dump.log holds no line of the plugin:\n{why}");
    assert!(scratch.workload().makes_progress(Duration::from_secs(5)), "the restored workload does not run:\n{why}");
    scratch.workload().kill();

    // The installed tool, with the exit codes the man page and the user guide document.
    let cli = |name: &str| {
        (
            scratch.rc(&format!("cli-{name}.rc")),
            scratch.read(&format!("cli-{name}.out")),
            scratch.read(&format!("cli-{name}.err")),
        )
    };
    let (rc, out, err) = cli("version");
    assert_eq!(rc, Some(0), "criu-cuda-migrate --version: {out}{err}");
    assert!(out.contains(env!("CARGO_PKG_VERSION")), "criu-cuda-migrate --version printed {out:?}");
    let (rc, out, err) = cli("inspect");
    assert_eq!(rc, Some(0), "inspect of a plain dump: {out}{err}");
    assert!(out.contains("no criu-cuda-migrate identity images"), "inspect of a plain dump printed {out:?}");
    let (rc, out, err) = cli("inspect-json");
    assert_eq!(rc, Some(0), "inspect --json: {out}{err}");
    assert!(out.contains("\"processes\": []"), "inspect --json of a plain dump printed {out:?}");
    let (rc, out, err) = cli("preflight");
    assert_eq!(rc, Some(0), "preflight of a plain dump: {out}{err}");
    assert!(out.contains("nothing to restore onto a GPU"), "preflight of a plain dump printed {out:?}");
    let (rc, out, err) = cli("preflight-json");
    assert_eq!(rc, Some(0), "--json preflight: {out}{err}");
    assert!(out.contains("\"ok\":true"), "--json preflight of a plain dump printed {out:?}");
    let (rc, out, err) = cli("inspect-missing");
    assert_eq!(rc, Some(2), "inspect of a missing directory must exit 2: {out}{err}");
    assert!(err.contains("does not exist"), "inspect of a missing directory printed {err:?}");
    let (rc, out, err) = cli("bad-usage");
    assert_eq!(rc, Some(2), "an unknown subcommand must exit 2: {out}{err}");
    let (rc, out, err) = cli("node");
    if !Path::new("/proc/driver/nvidia").exists() {
        assert_eq!(rc, Some(2), "node without NVIDIA driver must exit 2: {out}{err}");
        assert!(!err.is_empty(), "node without NVIDIA driver must say why on stderr");
    }

    let libs_dir_log = scratch.read("libs-dir/dump.log");
    assert!(
        libs_dir_log.contains(&init_line("dump")),
        "with CRIU_LIBS_DIR and no libdir line CRIU did not load the plugin (docs/USER-GUIDE.md section 3); dump.log:\n{libs_dir_log}"
    );

    // Removal: everything the package installed goes, and /etc/criu/default.conf (the user's file) stays as is.
    let purge = run_in(&root, &copy, scratch.path(), PURGE_SCENARIO, &[&scratch_str]);
    assert!(purge.status.success(), "the purge scenario failed: {}", describe_output(&purge));
    assert_eq!(scratch.rc("purge.rc"), Some(0), "dpkg --purge failed:\n{}", scratch.read("dpkg-purge.out"));
    for inside in [PLUGIN_PATH, CLI_PATH, CONFIG_EXAMPLE_PATH, MAN_PAGE_PATH] {
        assert!(!copy.file(inside).exists(), "{inside} is still there after dpkg --purge");
    }
    let conf = fs::read_to_string(copy.file("/etc/criu/default.conf")).unwrap_or_default();
    assert_eq!(conf, scratch.read("default.conf"), "dpkg --purge changed /etc/criu/default.conf");
    let after_purge = scratch.read("after-purge/dump.log");
    assert!(
        scratch.rc("after-purge.rc") != Some(0)
            && after_purge.contains(&format!("Unable to open directory {PLUGIN_DIR}")),
        "CRIU with a libdir line naming a removed plugin directory should fail loudly (docs/USER-GUIDE.md says to \
         remove the line first); rc {:?}, dump.log:\n{after_purge}",
        scratch.rc("after-purge.rc")
    );
}
