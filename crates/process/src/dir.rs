//! Files the plugin reads and writes as root in directories that other users may control: CRIU's
//! image directory, a runtime's bundle, a checkpoint archive's folder.
//!
//! The rules, for every file: it is reached relative to a directory fd opened once, by one path
//! component, never through a symbolic link; only a regular file is read, and at most one byte more
//! than its limit; a write creates a fresh file (`O_CREAT | O_EXCL | O_NOFOLLOW`) under a temporary
//! name and renames it into place, so a planted link or file is replaced, never written through.
//! Errors name the file and the rule that refused it, never the file's bytes.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// Most entries [`Dir::names`] lists (a CRIU image directory holds a few thousand at most).
pub const MAX_ENTRIES: usize = 1 << 20;

/// What refused a file, naming it.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path} does not exist")]
    Missing { path: PathBuf },
    #[error(
        "{path} is a symbolic link; criu-cuda-migrate runs as root and never follows a link it was not given: \
         put the file itself there"
    )]
    Symlink { path: PathBuf },
    #[error("{path} is {kind}, not a regular file: put the regular file itself there")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path} is larger than {limit} bytes, the most criu-cuda-migrate reads of such a file")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{path} changed while it was opened (another file took its place); nothing was read")]
    Replaced { path: PathBuf },
    #[error("{path} is not the empty file criu-cuda-migrate made for this write; nothing was written")]
    NotEmpty { path: PathBuf },
    #[error("`{name}` in {dir} is not a plain file name (one path component, not `.` or `..`)")]
    BadName { dir: PathBuf, name: String },
    #[error("{dir} holds more than {MAX_ENTRIES} entries; it is no directory criu-cuda-migrate reads")]
    TooManyEntries { dir: PathBuf },
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl FileError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            FileError::Missing { path }
            | FileError::Symlink { path }
            | FileError::NotRegular { path, .. }
            | FileError::TooLarge { path, .. }
            | FileError::Replaced { path }
            | FileError::NotEmpty { path }
            | FileError::Io { path, .. } => path,
            FileError::BadName { dir, .. } | FileError::TooManyEntries { dir } => dir,
        }
    }
}

/// What a directory entry is, without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Regular,
    Directory,
    Symlink,
    Other(&'static str),
}

/// The words errors use for a file type.
pub fn kind_name(t: FileType) -> &'static str {
    match t {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        _ => "a file of an unknown type",
    }
}

/// An open directory; every file in it is reached through its fd.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    /// How messages name the directory.
    shown: PathBuf,
}

/// A file of an image directory rewritten in place (its whole content each time: an `fsync`-free `pwrite` and a
/// truncation, tens of microseconds): for a record that grows during one CRIU run and must be whole whenever CRIU's
/// post-dump script may copy the directory, but need not survive a crash of that run (CRIU's own images do not).
#[derive(Debug)]
pub struct RewrittenFile {
    file: std::fs::File,
    path: PathBuf,
}

impl RewrittenFile {
    pub fn rewrite(&self, bytes: &[u8]) -> Result<(), FileError> {
        use std::os::unix::fs::FileExt;
        let io = |source| FileError::Io { action: "write", path: self.path.clone(), source };
        self.file.write_all_at(bytes, 0).map_err(io)?;
        self.file.set_len(bytes.len() as u64).map_err(io)
    }

    /// Writes `bytes` at `offset` (an append when `offset` is the length written so far): what a record that only
    /// grows costs per addition, whatever its size.
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> Result<(), FileError> {
        use std::os::unix::fs::FileExt;
        self.file.write_all_at(bytes, offset).map_err(|source| FileError::Io {
            action: "write",
            path: self.path.clone(),
            source,
        })
    }
}

fn io_err(action: &'static str, path: PathBuf) -> impl FnOnce(rustix::io::Errno) -> FileError {
    move |e| match e {
        rustix::io::Errno::NOENT => FileError::Missing { path },
        e => FileError::Io { action, path, source: e.into() },
    }
}

fn check_name(dir: &Path, name: &str) -> Result<(), FileError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(FileError::BadName { dir: dir.to_path_buf(), name: name.escape_debug().to_string() });
    }
    Ok(())
}

impl Dir {
    /// Opens a directory the user named (the command line's `DIR`): links in that path are the
    /// user's own choice and are followed; nothing below it is.
    pub fn open(path: &Path) -> Result<Dir, FileError> {
        let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).map_err(
            |e| match e {
                rustix::io::Errno::NOTDIR => {
                    FileError::NotRegular { path: path.to_path_buf(), kind: "not a directory" }
                }
                e => io_err("open the directory", path.to_path_buf())(e),
            },
        )?;
        Ok(Dir { fd, shown: path.to_path_buf() })
    }

    /// A directory from a descriptor of our own (a duplicate of CRIU's image directory fd).
    pub fn from_owned(fd: OwnedFd, shown: PathBuf) -> Result<Dir, FileError> {
        let st = rustix::fs::fstat(&fd).map_err(io_err("stat the directory", shown.clone()))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(FileError::NotRegular { path: shown, kind: "not a directory" });
        }
        Ok(Dir { fd, shown })
    }

    /// A directory from a descriptor someone else owns (CRIU's image directory fd), duplicated so
    /// that the original is never closed here. `shown` names it in messages.
    pub fn from_borrowed(fd: BorrowedFd<'_>, shown: PathBuf) -> Result<Dir, FileError> {
        let st = rustix::fs::fstat(fd).map_err(io_err("stat the directory", shown.clone()))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(FileError::NotRegular {
                path: shown,
                kind: "not a directory (CRIU's image directory fd names something else)",
            });
        }
        let fd =
            rustix::io::fcntl_dupfd_cloexec(fd, 3).map_err(io_err("duplicate the descriptor of", shown.clone()))?;
        Ok(Dir { fd, shown })
    }

    pub fn shown(&self) -> &Path {
        &self.shown
    }

    /// The same directory, named `shown` in messages.
    pub fn named(mut self, shown: PathBuf) -> Dir {
        self.shown = shown;
        self
    }

    /// How messages name `name` in this directory.
    pub fn shown_file(&self, name: &str) -> PathBuf {
        self.shown.join(name)
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The subdirectory `name`, not through a link.
    pub fn open_dir(&self, name: &str) -> Result<Dir, FileError> {
        check_name(&self.shown, name)?;
        let path = self.shown_file(name);
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => FileError::Symlink { path: path.clone() },
            rustix::io::Errno::NOTDIR => {
                self.refusal_of(name).unwrap_or(FileError::NotRegular { path: path.clone(), kind: "not a directory" })
            }
            e => io_err("open the directory", path.clone())(e),
        })?;
        Ok(Dir { fd, shown: path })
    }

    /// Why `name` is not a regular file or directory, for messages.
    fn refusal_of(&self, name: &str) -> Option<FileError> {
        let st = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        let path = self.shown_file(name);
        Some(match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => FileError::Symlink { path },
            t => FileError::NotRegular { path, kind: kind_name(t) },
        })
    }

    /// What `name` is, without following it; `None` when it does not exist.
    pub fn kind_of(&self, name: &str) -> Result<Option<EntryKind>, FileError> {
        check_name(&self.shown, name)?;
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(match FileType::from_raw_mode(st.st_mode) {
                FileType::RegularFile => EntryKind::Regular,
                FileType::Directory => EntryKind::Directory,
                FileType::Symlink => EntryKind::Symlink,
                t => EntryKind::Other(kind_name(t)),
            })),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(io_err("stat", self.shown_file(name))(e)),
        }
    }

    /// The names in this directory (`.` and `..` left out), at most [`MAX_ENTRIES`].
    pub fn names(&self) -> Result<Vec<OsString>, FileError> {
        let mut dir = rustix::fs::Dir::read_from(&self.fd).map_err(io_err("list", self.shown.clone()))?;
        let mut out = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(io_err("list", self.shown.clone()))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if out.len() == MAX_ENTRIES {
                return Err(FileError::TooManyEntries { dir: self.shown.clone() });
            }
            out.push(OsString::from_vec(name.to_vec()));
        }
        Ok(out)
    }

    /// Reads the regular file `name`, at most `limit` bytes: a larger file, a link, a FIFO, a device
    /// or anything else is refused without reading it.
    pub fn read_file(&self, name: &str, limit: u64) -> Result<Vec<u8>, FileError> {
        let (file, _, path) = self.open_regular(name, Some(limit))?;
        let mut bytes = Vec::new();
        file.take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(|source| FileError::Io {
            action: "read",
            path: path.clone(),
            source,
        })?;
        if bytes.len() as u64 > limit {
            return Err(FileError::TooLarge { path, limit });
        }
        Ok(bytes)
    }

    /// Opens the regular file `name` for a bounded streaming read by the caller (an OCI image's layer
    /// blob, too large for [`Dir::read_file`]), by the same rules: not through a link, a FIFO or device
    /// never opened, the inode opened the one probed. Returns the file and its size at open; the
    /// caller reads at most that many bytes.
    /// Creates `name` (or empties the regular file there), not through a link, with exactly `mode`, for a file
    /// rewritten in place many times within one CRIU run ([`RewrittenFile`]); a link or anything but a regular file
    /// under the name is refused.
    pub fn create_rewritten(&self, name: &str, mode: u32) -> Result<RewrittenFile, FileError> {
        check_name(&self.shown, name)?;
        let path = self.shown_file(name);
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => FileError::Replaced { path: path.clone() },
            e => io_err("create", path.clone())(e),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(io_err("stat", path.clone()))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(FileError::NotRegular { path, kind: kind_name(FileType::from_raw_mode(st.st_mode)) });
        }
        // The umask may have narrowed the mode: the file gets exactly `mode`.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(io_err("chmod", path.clone()))?;
        let file = RewrittenFile { file: std::fs::File::from(fd), path };
        file.rewrite(&[])?;
        Ok(file)
    }

    pub fn open_file(&self, name: &str) -> Result<(std::fs::File, u64), FileError> {
        let (file, size, _) = self.open_regular(name, None)?;
        Ok((file, size))
    }

    /// The one way a regular file is opened: first without opening what `name` names (O_PATH opens no
    /// device and blocks on no FIFO), refused there when over `limit`, then the same inode for reading.
    /// The probe pins the inode until the same inode is open for reading.
    fn open_regular(&self, name: &str, limit: Option<u64>) -> Result<(std::fs::File, u64, PathBuf), FileError> {
        check_name(&self.shown, name)?;
        let path = self.shown_file(name);
        let (_probe, st) = self.probe(name, &path)?;
        if let Some(limit) = limit.filter(|&l| u64::try_from(st.st_size).unwrap_or(u64::MAX) > l) {
            return Err(FileError::TooLarge { path, limit });
        }
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => FileError::Replaced { path: path.clone() },
            e => io_err("open", path.clone())(e),
        })?;
        let again = rustix::fs::fstat(&fd).map_err(io_err("stat", path.clone()))?;
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
            return Err(FileError::Replaced { path });
        }
        Ok((std::fs::File::from(fd), u64::try_from(again.st_size).unwrap_or(u64::MAX), path))
    }

    /// The size of the regular file `name`, from `fstat` on an `O_PATH` descriptor: nothing is
    /// opened for reading, and a link, a FIFO, a device or anything else is refused as by
    /// [`Dir::read_file`]. For a bound on several files together, before any is read (each read
    /// still has its own limit: a file may grow in between).
    pub fn file_size(&self, name: &str) -> Result<u64, FileError> {
        check_name(&self.shown, name)?;
        let path = self.shown_file(name);
        let (_, st) = self.probe(name, &path)?;
        Ok(u64::try_from(st.st_size).unwrap_or(u64::MAX))
    }

    /// `fstat` of `name` opened `O_PATH | O_NOFOLLOW`, refused unless a regular file.
    fn probe(&self, name: &str, path: &Path) -> Result<(OwnedFd, rustix::fs::Stat), FileError> {
        let probe =
            rustix::fs::openat(&self.fd, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
                .map_err(io_err("open", path.to_path_buf()))?;
        let st = rustix::fs::fstat(&probe).map_err(io_err("stat", path.to_path_buf()))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Ok((probe, st)),
            FileType::Symlink => Err(FileError::Symlink { path: path.to_path_buf() }),
            t => Err(FileError::NotRegular { path: path.to_path_buf(), kind: kind_name(t) }),
        }
    }

    /// Writes `bytes` into the existing regular file `name` (a kernel interface file: a cgroup's
    /// `cgroup.freeze`), never through a link and never creating it.
    pub fn write_existing(&self, name: &str, bytes: &[u8]) -> Result<(), FileError> {
        let (fd, _, path) = self.open_existing_for_writing(name)?;
        std::fs::File::from(fd).write_all(bytes).map_err(|source| FileError::Io { action: "write", path, source })
    }

    /// Creates a new file for a large write by the caller (the staging page file), under a temporary name beside
    /// `name`, read-write, with exactly `mode`, never through a link; with `O_DIRECT` when `direct` and the
    /// filesystem takes it. [`Dir::rename_into_place`] then gives it its name, [`Dir::remove`] drops it.
    /// Returns the file, its temporary name and whether it is open with `O_DIRECT`.
    pub fn create_fresh(
        &self,
        name: &str,
        mode: u32,
        direct: bool,
    ) -> Result<(std::fs::File, String, bool), FileError> {
        check_name(&self.shown, name)?;
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let tmp = format!(".{name}.{}-{nanos:09}.tmp", std::process::id());
        let base = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let open = |flags| rustix::fs::openat(&self.fd, tmp.as_str(), flags, Mode::from_raw_mode(mode));
        let (fd, direct) = match direct.then(|| open(base | OFlags::DIRECT)) {
            Some(Ok(fd)) => (fd, true),
            // EINVAL: this filesystem takes no O_DIRECT.
            Some(Err(rustix::io::Errno::INVAL)) | None => {
                (open(base).map_err(io_err("create", self.shown_file(&tmp)))?, false)
            }
            Some(Err(e)) => return Err(io_err("create", self.shown_file(&tmp))(e)),
        };
        if let Err(e) = rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)) {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
            return Err(io_err("chmod", self.shown_file(&tmp))(e));
        }
        Ok((std::fs::File::from(fd), tmp, direct))
    }

    /// Opens the existing, empty regular file `name` for writing (a page file the plugin made with
    /// [`Dir::create_fresh`], written by the driver agent), never through a link.
    pub fn open_empty_for_writing(&self, name: &str) -> Result<std::fs::File, FileError> {
        let (fd, size, path) = self.open_existing_for_writing(name)?;
        if size != 0 {
            return Err(FileError::NotEmpty { path });
        }
        Ok(std::fs::File::from(fd))
    }

    /// The existing regular file `name` opened write-only, never through a link and never created: its descriptor,
    /// size and shown path.
    fn open_existing_for_writing(&self, name: &str) -> Result<(OwnedFd, i64, PathBuf), FileError> {
        check_name(&self.shown, name)?;
        let path = self.shown_file(name);
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => FileError::Symlink { path: path.clone() },
            e => io_err("open", path.clone())(e),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(io_err("stat", path.clone()))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Ok((fd, st.st_size, path)),
            t => Err(FileError::NotRegular { path, kind: kind_name(t) }),
        }
    }

    /// Renames `tmp` (made by [`Dir::create_fresh`]) over `name`: whatever stood there is replaced, not written
    /// through.
    pub fn rename_into_place(&self, tmp: &str, name: &str) -> Result<(), FileError> {
        check_name(&self.shown, tmp)?;
        check_name(&self.shown, name)?;
        rustix::fs::renameat(&self.fd, tmp, &self.fd, name).map_err(io_err("rename into", self.shown_file(name)))
    }

    /// Removes the entry `name` (not what a link there points to).
    pub fn remove(&self, name: &str) -> Result<(), FileError> {
        check_name(&self.shown, name)?;
        rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()).map_err(io_err("remove", self.shown_file(name)))
    }

    /// Writes `bytes` as the file `name` with `mode`: a new file under a temporary name, synced,
    /// then renamed over `name`. Whatever stood at `name` (a link planted there included) is
    /// replaced, never written through.
    pub fn write_file(&self, name: &str, bytes: &[u8], mode: u32) -> Result<(), FileError> {
        check_name(&self.shown, name)?;
        let path = self.shown_file(name);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let tmp = format!(".{name}.{}-{nanos:09}.tmp", std::process::id());
        let fd = rustix::fs::openat(
            &self.fd,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(io_err("create", self.shown_file(&tmp)))?;
        let written = (|| {
            // The umask may have narrowed the mode: the file gets exactly `mode`.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(std::io::Error::from)?;
            let mut f = std::fs::File::from(fd);
            f.write_all(bytes)?;
            f.sync_all()
        })();
        let renamed =
            written.map_err(|source| FileError::Io { action: "write", path: self.shown_file(&tmp), source }).and_then(
                |()| rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name).map_err(io_err("rename into", path)),
            );
        if renamed.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
        }
        renamed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir() -> (tempfile::TempDir, Dir) {
        let t = tempfile::tempdir().unwrap();
        let d = Dir::open(t.path()).unwrap();
        (t, d)
    }

    #[test]
    fn a_regular_file_is_read_up_to_its_limit() {
        let (t, d) = dir();
        std::fs::write(t.path().join("a"), b"hello").unwrap();
        assert_eq!(d.read_file("a", 5).unwrap(), b"hello");
        assert!(matches!(d.read_file("a", 4), Err(FileError::TooLarge { limit: 4, .. })));
        assert!(matches!(d.read_file("missing", 4), Err(FileError::Missing { .. })));
    }

    #[test]
    fn links_fifos_and_devices_are_refused_without_reading() {
        let (t, d) = dir();
        std::fs::write(t.path().join("secret"), b"TOPSECRET").unwrap();
        std::os::unix::fs::symlink(t.path().join("secret"), t.path().join("link")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", t.path().join("zero")).unwrap();
        rustix::fs::mkfifoat(d.as_fd(), "fifo", Mode::from_raw_mode(0o600)).unwrap();
        for (name, want) in [("link", "symbolic link"), ("zero", "symbolic link"), ("fifo", "a FIFO")] {
            let e = d.read_file(name, 1 << 20).unwrap_err().to_string();
            assert!(e.contains(want), "{name}: {e}");
            assert!(!e.contains("TOPSECRET"), "{e}");
        }
        assert!(matches!(d.read_file("../secret", 10), Err(FileError::BadName { .. })));
        assert!(matches!(d.open_dir("link"), Err(FileError::Symlink { .. })));
        assert_eq!(d.kind_of("link").unwrap(), Some(EntryKind::Symlink));
        assert_eq!(d.kind_of("fifo").unwrap(), Some(EntryKind::Other("a FIFO")));
        assert_eq!(d.kind_of("nothing").unwrap(), None);
        for (name, want) in [("link", "symbolic link"), ("fifo", "a FIFO")] {
            let e = d.file_size(name).unwrap_err().to_string();
            assert!(e.contains(want), "{name}: {e}");
        }
    }

    #[test]
    fn a_file_size_is_read_without_reading_the_file() {
        let (t, d) = dir();
        let f = std::fs::File::create(t.path().join("big")).unwrap();
        f.set_len(1 << 40).unwrap(); // sparse
        assert_eq!(d.file_size("big").unwrap(), 1 << 40);
        assert!(matches!(d.file_size("missing"), Err(FileError::Missing { .. })));
        assert!(matches!(d.file_size("../big"), Err(FileError::BadName { .. })));
    }

    #[test]
    fn a_write_replaces_a_planted_link_and_never_writes_through_it() {
        let (t, d) = dir();
        let victim = t.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, t.path().join("report.txt")).unwrap();
        d.write_file("report.txt", b"new", 0o600).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let meta = std::fs::symlink_metadata(t.path().join("report.txt")).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        assert_eq!(std::fs::read(t.path().join("report.txt")).unwrap(), b"new");
        let mut names = d.names().unwrap();
        names.sort();
        assert_eq!(names, vec![OsString::from("report.txt"), OsString::from("victim")], "no temporary file left");
    }
}
