//! Opening a driver library that a setting names by path, for a process that runs as root.
//!
//! A path checked by name and then loaded by name can be swapped between the two: a directory
//! link owned by another user, re-pointed after the check, ran that user's code as root. So the
//! file is opened once, walking from `/` one component at a time relative to the directory fd
//! before it (`O_PATH | O_NOFOLLOW`), and every step is checked on its fd: each directory and the
//! file itself owned by root or by this process's user and writable by nobody else (a
//! world-writable directory is accepted only with the sticky bit, as `/tmp`: there nobody else can
//! rename or remove the entry the walk takes next, which is checked in turn). A symbolic link on
//! the way (the driver's own `libcuda.so.1 -> libcuda.so.580.x`, `/lib -> usr/lib`) is followed
//! only when the link itself is owned by root or this user, in a directory that passed; its target
//! is walked by the same rules. The dynamic loader then gets `/proc/self/fd/N` of the opened
//! file: it maps exactly what was checked, whatever happens to the path meanwhile.

use std::collections::VecDeque;
use std::os::fd::{AsFd, IntoRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, Stat};

/// The most symbolic links one path may go through (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// A library file opened and checked by [`open_library`]; loading it through
/// [`TrustedLibrary::into_loader_path`] maps exactly this file.
#[derive(Debug)]
pub struct TrustedLibrary {
    fd: OwnedFd,
    /// The path as the setting gave it, for messages.
    pub path: String,
}

impl TrustedLibrary {
    /// The name to give `dlopen`: this process's descriptor of the checked file, which stays open
    /// for the rest of the process. It must: the loader matches a name against the libraries it
    /// already has by its text, so a descriptor number closed and reused for the next library
    /// would get the earlier library back (measured: NVML's load returned the libcuda loaded as
    /// the same `/proc/self/fd/N`). One descriptor per library load, closed on exec.
    pub fn into_loader_path(self) -> String {
        let fd = self.fd.into_raw_fd();
        format!("/proc/self/fd/{fd}")
    }
}

/// Who may own what is loaded as root: root, or the user this process runs as.
fn owner_ok(st: &Stat, me: u32) -> bool {
    st.st_uid == 0 || st.st_uid == me
}

fn kind(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// Why a path is not loaded or run as root; each names the step that failed and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LibFileError {
    #[error("a relative path; name the library by its absolute path")]
    Relative,
    #[error("{path}: not an absolute path")]
    NotAbsolute { path: String },
    /// A step of the walk could not be opened, examined or read.
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: rustix::io::Errno,
    },
    #[error(
        "{what} {path} is owned by uid {uid}, not by root: only root's files are loaded as root; install the library \
         in a directory only root can change, or unset the setting to use the system's"
    )]
    NotRootsOwn { what: &'static str, path: PathBuf, uid: u32 },
    #[error(
        "{what} {path} can be changed by other users (mode {mode:o}): make it writable by its owner only (chmod go-w), \
         or install the library elsewhere"
    )]
    WritableByOthers { what: &'static str, path: PathBuf, mode: u32 },
    #[error("{path}: the walk lost /")]
    LostRoot { path: String },
    #[error("{path} goes through more than {MAX_LINKS} symbolic links")]
    TooManyLinks { path: String },
    #[error(
        "{path} goes through {link}, a link in /proc: the kernel follows /proc's links to what they stand for (a \
         process's root, working directory or open files, in its own mount namespace), not by their text, so what \
         was checked would not be what runs; name the file by its real path"
    )]
    ThroughProc { path: String, link: PathBuf },
    #[error(
        "the symbolic link {link} is owned by uid {uid}, not by root: another user could point it elsewhere after \
         the check; name the library by its real path, in directories only root can change"
    )]
    LinkNotRootsOwn { link: PathBuf, uid: u32 },
    #[error("{path} changed while it was checked; try again")]
    Changed { path: PathBuf },
    #[error("{file} is a file, not a directory, in the path {path}")]
    FileInPath { file: PathBuf, path: String },
    #[error("{path} is not a regular file (a device, FIFO or socket)")]
    NotRegular { path: PathBuf },
    #[error("{path} names a directory, not a library file")]
    Directory { path: String },
}

/// The rule for a directory or the file: owned by root or `me`, writable by nobody else (a
/// directory with the sticky bit excepted, see the module).
fn check(st: &Stat, me: u32, what: &'static str, shown: &Path) -> Result<(), LibFileError> {
    if !owner_ok(st, me) {
        return Err(LibFileError::NotRootsOwn { what, path: shown.to_path_buf(), uid: st.st_uid });
    }
    let sticky = st.st_mode & libc::S_ISVTX != 0 && kind(st) == FileType::Directory;
    if st.st_mode & 0o022 != 0 && !sticky {
        return Err(LibFileError::WritableByOthers { what, path: shown.to_path_buf(), mode: st.st_mode & 0o7777 });
    }
    Ok(())
}

/// Whether the link `fd` (an `O_PATH` descriptor) lives in `/proc` (`/proc/self`, `/proc/PID/root`,
/// `/proc/PID/cwd`, `/proc/PID/fd/N`, `/dev/fd` through `/proc/self/fd`): such a link is refused.
///
/// The walk follows a link by its text, as the kernel follows every other link; a `/proc` link is a
/// "magic" link that the kernel follows to the object it stands for, not to its text:
/// `/proc/PID/root` reads as `/` but leads into process PID's mount namespace. Walking its text
/// vouched for the host's file (and a library load mapped that one, not the named one), while
/// `Command::new` of the name ran the other namespace's file. Two fixes were possible: run the checked descriptor (`/proc/self/fd/N`, `fexecve`),
/// or refuse such links. Refusing is the robust one: with every link left one whose text is what
/// the kernel follows, the walk checks exactly the file the name reaches, for every caller (a
/// library whose loader gets the descriptor, and a command run by name); running the descriptor
/// would still vouch for a file the path does not name (the host's `criu` reported as the one in
/// PATH), and it breaks what runs by name: a script's interpreter cannot open a close-on-exec
/// descriptor, and a multi-call program (`iptables-restore` as `xtables-nft-multi`) reads its
/// `argv[0]`. A path through `/proc` is no way to name a library or a command; the fix is the real
/// path.
fn on_procfs(fd: &OwnedFd) -> rustix::io::Result<bool> {
    Ok(rustix::fs::fstatfs(fd)?.f_type == rustix::fs::PROC_SUPER_MAGIC)
}

fn components(path: &str) -> impl Iterator<Item = String> + '_ {
    path.split('/').filter(|c| !c.is_empty() && *c != ".").map(str::to_string)
}

/// Opens the library `path` names for loading as root. `Ok(None)`: a bare file name, left to the
/// dynamic loader's search (the system's directories). A path must be absolute and pass the
/// rules of the module; the error names the step that failed and the fix.
pub fn open_library(path: &str) -> Result<Option<TrustedLibrary>, LibFileError> {
    if !path.contains('/') {
        return Ok(None);
    }
    if !path.starts_with('/') {
        return Err(LibFileError::Relative);
    }
    let me = rustix::process::geteuid().as_raw();
    let at = |d: &OwnedFd, name: &str, flags: OFlags| {
        rustix::fs::openat(d.as_fd(), name, flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
    };
    let io = |action: &'static str, shown: &Path| {
        let path = shown.to_path_buf();
        move |source| LibFileError::Io { action, path, source }
    };
    let root = rustix::fs::open("/", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(io("open", Path::new("/")))?;
    let root_stat = rustix::fs::fstat(&root).map_err(io("stat", Path::new("/")))?;
    check(&root_stat, me, "the directory", Path::new("/"))?;
    // The directories walked so far, each checked, with the path that shows it.
    let mut walked: Vec<(OwnedFd, PathBuf)> = vec![(root, PathBuf::from("/"))];
    let mut pending: VecDeque<String> = components(path).collect();
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            // Lexically up to the directory already checked (never past `/`).
            if walked.len() > 1 {
                walked.pop();
            }
            continue;
        }
        // The walk holds / at least (`..` never pops it).
        let Some((dir, dir_shown)) = walked.last() else {
            return Err(LibFileError::LostRoot { path: path.to_string() });
        };
        let shown = dir_shown.join(&name);
        let fd = at(dir, &name, OFlags::PATH).map_err(io("open", &shown))?;
        let st = rustix::fs::fstat(&fd).map_err(io("stat", &shown))?;
        match kind(&st) {
            FileType::Symlink => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(LibFileError::TooManyLinks { path: path.to_string() });
                }
                if on_procfs(&fd).map_err(io("stat the file system of", &shown))? {
                    return Err(LibFileError::ThroughProc { path: path.to_string(), link: shown });
                }
                if !owner_ok(&st, me) {
                    return Err(LibFileError::LinkNotRootsOwn { link: shown, uid: st.st_uid });
                }
                let target =
                    rustix::fs::readlinkat(&fd, "", Vec::new()).map_err(io("read the symbolic link", &shown))?;
                let target = target.to_string_lossy().into_owned();
                if target.starts_with('/') {
                    walked.truncate(1);
                }
                for c in components(&target).collect::<Vec<_>>().into_iter().rev() {
                    pending.push_front(c);
                }
            }
            FileType::Directory => {
                check(&st, me, "the directory", &shown)?;
                walked.push((fd, shown));
            }
            FileType::RegularFile if pending.is_empty() => {
                check(&st, me, "the file", &shown)?;
                // The file to map: opened for reading relative to the same checked directory, and
                // the very inode that was checked.
                let file =
                    at(dir, &name, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY).map_err(io("open", &shown))?;
                let again = rustix::fs::fstat(&file).map_err(io("stat", &shown))?;
                if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) || kind(&again) != FileType::RegularFile {
                    return Err(LibFileError::Changed { path: shown });
                }
                return Ok(Some(TrustedLibrary { fd: file, path: path.to_string() }));
            }
            FileType::RegularFile => {
                return Err(LibFileError::FileInPath { file: shown, path: path.to_string() });
            }
            _ => return Err(LibFileError::NotRegular { path: shown }),
        }
    }
    Err(LibFileError::Directory { path: path.to_string() })
}

/// Whether the file at the absolute `path` may be run by root: the walk of [`open_library`] (every
/// directory and the file owned by root or this user, writable by nobody else, links only when theirs),
/// so that nobody else can swap what runs between this check and the run.
pub fn check_runnable(path: &str) -> Result<(), LibFileError> {
    match open_library(path)? {
        Some(_) => Ok(()),
        None => Err(LibFileError::NotAbsolute { path: path.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A scratch directory only its owner can change, holding `lib/libx.so.1` (mode 0644).
    fn scratch() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        chmod(tmp.path(), 0o755);
        let lib = tmp.path().join("lib");
        std::fs::create_dir(&lib).unwrap();
        chmod(&lib, 0o755);
        let f = lib.join("libx.so.1");
        std::fs::write(&f, b"\x7fELF not really").unwrap();
        chmod(&f, 0o644);
        (tmp, f)
    }

    fn refused(path: &Path) -> String {
        open_library(path.to_str().unwrap()).expect_err("refused").to_string()
    }

    #[test]
    fn a_good_path_opens_the_file_itself() {
        let (_tmp, f) = scratch();
        let lib = open_library(f.to_str().unwrap()).unwrap().expect("a path is opened");
        // The loader's name is the descriptor of the very file checked, never reused.
        let name = lib.into_loader_path();
        assert_eq!(std::fs::canonicalize(&name).unwrap(), std::fs::canonicalize(&f).unwrap());
        assert_eq!(std::fs::read(&name).unwrap(), b"\x7fELF not really");
        let second = open_library(f.to_str().unwrap()).unwrap().unwrap().into_loader_path();
        assert_ne!(name, second, "a second load gets a name of its own");
        assert!(open_library("libcuda.so.1").unwrap().is_none(), "a bare name is the loader's search");
        assert!(open_library("lib/libcuda.so.1").unwrap_err().to_string().contains("relative path"));
    }

    #[test]
    fn links_owned_by_root_or_me_in_checked_directories_are_followed() {
        let (tmp, f) = scratch();
        // The driver's own layout: libx.so.1 -> libx.so.580 beside it, and a directory link.
        std::fs::rename(&f, f.with_file_name("libx.so.580")).unwrap();
        symlink("libx.so.580", &f).unwrap();
        symlink("lib", tmp.path().join("lib64")).unwrap();
        let via = tmp.path().join("lib64/../lib64/./libx.so.1");
        assert!(open_library(via.to_str().unwrap()).unwrap().is_some());
        symlink("loop", tmp.path().join("loop")).unwrap();
        assert!(refused(&tmp.path().join("loop/x")).contains("more than 40 symbolic links"));
    }

    #[test]
    fn writable_by_others_anywhere_on_the_path_is_refused() {
        let (tmp, f) = scratch();
        chmod(&f, 0o664);
        let e = refused(&f);
        assert!(e.contains("the file") && e.contains("can be changed by other users (mode 664)"), "{e}");
        assert!(e.contains("chmod go-w"), "{e}");
        chmod(&f, 0o644);
        // An ancestor, not only the file's own directory.
        chmod(tmp.path(), 0o777);
        let e = refused(&f);
        assert!(e.contains(&format!("the directory {}", tmp.path().display())) && e.contains("mode 777"), "{e}");
        // Sticky, as /tmp: nobody else can rename what the walk takes next.
        chmod(tmp.path(), 0o1777);
        assert!(open_library(f.to_str().unwrap()).unwrap().is_some());
        chmod(tmp.path(), 0o755);
    }

    #[test]
    fn a_link_in_a_directory_others_can_change_is_refused() {
        // The swap: a directory anyone may write holds a link to the good library; whoever can
        // write there can re-point it after any check by name.
        let (tmp, f) = scratch();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        chmod(&open, 0o777);
        symlink(f.parent().unwrap(), open.join("lib")).unwrap();
        let e = refused(&open.join("lib/libx.so.1"));
        assert!(e.contains(&format!("the directory {}", open.display())), "{e}");
        assert!(e.contains("can be changed by other users"), "{e}");
    }

    #[test]
    fn files_and_links_of_another_user_are_refused() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: chown to another user needs root");
            return;
        }
        let (tmp, f) = scratch();
        let other = 4242;
        std::os::unix::fs::chown(&f, Some(other), None).unwrap();
        let e = refused(&f);
        assert!(e.contains("the file") && e.contains("owned by uid 4242"), "{e}");
        std::os::unix::fs::chown(&f, Some(0), None).unwrap();
        // A directory link another user owns (in a directory only root can change: the link's
        // owner is who can re-point it where the directory is sticky).
        let link = tmp.path().join("theirs");
        symlink(f.parent().unwrap(), &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(other), None).unwrap();
        let e = refused(&link.join("libx.so.1"));
        assert!(e.contains("the symbolic link") && e.contains("owned by uid 4242"), "{e}");
        // A directory of theirs on the way.
        std::os::unix::fs::chown(f.parent().unwrap(), Some(other), None).unwrap();
        let e = refused(&f);
        assert!(e.contains("the directory") && e.contains("owned by uid 4242"), "{e}");
    }

    /// `/proc/self/root/...` reads as `/`, `/dev/fd/N` as `/proc/self/fd/N`: the walk took their text,
    /// and `check_runnable` vouched for a file of the host where the kernel follows the link into
    /// another mount namespace or an open descriptor (issue 35 item 6). Every way through /proc is
    /// refused, naming the link.
    #[test]
    fn paths_through_proc_links_are_refused() {
        let (_tmp, f) = scratch();
        assert!(open_library(f.to_str().unwrap()).unwrap().is_some(), "the real path is fine");
        let via_root = format!("/proc/self/root{}", f.display());
        let pid = std::process::id();
        let via_pid_root = format!("/proc/{pid}/root{}", f.display());
        let file = std::fs::File::open(&f).unwrap();
        let via_fd = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file));
        let via_dev_fd = format!("/dev/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file));
        for (path, link) in [
            (via_root.as_str(), "/proc/self".to_string()),
            (via_pid_root.as_str(), format!("/proc/{pid}/root")),
            (via_fd.as_str(), "/proc/self".to_string()),
            (via_dev_fd.as_str(), "/proc/self".to_string()),
        ] {
            let e = check_runnable(path).expect_err(path).to_string();
            assert!(e.contains(&format!("goes through {link}, a link in /proc")), "{path}: {e}");
            assert!(e.contains("real path"), "{e}");
            assert!(open_library(path).is_err(), "{path}");
        }
    }

    #[test]
    fn devices_fifos_and_directories_are_not_libraries() {
        assert!(refused(Path::new("/dev/null")).contains("not a regular file"));
        let (tmp, f) = scratch();
        assert!(refused(tmp.path()).contains("names a directory"));
        assert!(refused(&f.join("x")).contains("is a file, not a directory"));
        assert!(refused(&tmp.path().join("missing.so")).contains("cannot open"));
    }
}
