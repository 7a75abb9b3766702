//! `/proc/PID/maps`: the target's mappings, and which of them may hold libcuda's identity words.

use crate::procfs;
use crate::ProcessError;

/// Largest mapping [`is_scannable`] accepts by default: 1 GiB.
///
/// Why a bound: libcuda keeps its per-GPU identity objects (the six PCI words) in small mappings,
/// the glibc `[heap]` and a few anonymous mappings of a few MiB (GPU-FACTS: 8 sites in 56 MiB
/// scanned in 0.1 s). After a CRIU restore the host copy of the device memory lives in big
/// anonymous mappings (as large as the process's device memory), which would cost seconds to
/// scan and only risk false matches inside user data. A process whose identity objects sit in a
/// mapping above the bound is not expected; callers may pass a larger bound.
pub const DEFAULT_MAX_MAPPING_BYTES: u64 = 1 << 30;

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address of the mapping.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    /// `s` (shared) rather than `p` (private, copy-on-write).
    pub shared: bool,
    /// Offset into the mapped file (0 for anonymous mappings).
    pub offset: u64,
    /// Device (major, minor) of the mapped file's filesystem; (0, 0) for anonymous mappings.
    pub dev: (u32, u32),
    /// Inode of the mapped file; 0 for anonymous mappings.
    pub inode: u64,
    /// Path or pseudo-name (`[heap]`, `[stack]`, `[anon:NAME]`...), without a trailing
    /// ` (deleted)`; empty for an anonymous mapping. May contain spaces.
    pub path: String,
    /// The kernel marked the mapped file ` (deleted)`.
    pub deleted: bool,
}

impl Mapping {
    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// True for a zero-sized mapping (never produced by the kernel).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A name for reports: the path, or `[anon]` for an unnamed anonymous mapping.
    pub fn display_name(&self) -> &str {
        if self.path.is_empty() {
            "[anon]"
        } else {
            &self.path
        }
    }
}

const DELETED_SUFFIX: &str = " (deleted)";

/// Parses the text of `/proc/PID/maps`. Lines that do not parse are skipped (the kernel never
/// writes them; skipping keeps a reader of a newer kernel's format working on the rest).
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

/// Splits off the next whitespace-separated field; returns it and the rest.
fn next_field(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start_matches([' ', '\t']);
    if s.is_empty() {
        return None;
    }
    let end = s.find([' ', '\t']).unwrap_or(s.len());
    Some((&s[..end], &s[end..]))
}

fn parse_line(line: &str) -> Option<Mapping> {
    let (range, rest) = next_field(line)?;
    let (perms, rest) = next_field(rest)?;
    let (offset, rest) = next_field(rest)?;
    let (dev, rest) = next_field(rest)?;
    let (inode, rest) = next_field(rest)?;

    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    if end < start {
        return None;
    }
    let perms = perms.as_bytes();
    if perms.len() < 4 {
        return None;
    }
    let offset = u64::from_str_radix(offset, 16).ok()?;
    let (major, minor) = dev.split_once(':')?;
    let dev = (u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?);
    let inode = inode.parse::<u64>().ok()?;

    // The path is everything after the padding that follows the inode; it may contain spaces.
    let path = rest.trim_start_matches([' ', '\t']);
    let (path, deleted) = match path.strip_suffix(DELETED_SUFFIX) {
        Some(p) => (p, true),
        None => (path, false),
    };

    Some(Mapping {
        start,
        end,
        readable: perms[0] == b'r',
        writable: perms[1] == b'w',
        executable: perms[2] == b'x',
        shared: perms[3] == b's',
        offset,
        dev,
        inode,
        path: path.to_string(),
        deleted,
    })
}

/// Reads and parses `/proc/PID/maps`.
pub fn read_maps(pid: u32) -> Result<Vec<Mapping>, ProcessError> {
    Ok(parse_maps(&procfs::read_text(pid, "maps", procfs::MAX_MAPS_BYTES)?))
}

/// Kernel pseudo-mappings that are never the process's own data (and some cannot be read
/// through `/proc/PID/mem` at all).
const KERNEL_PSEUDO_MAPPINGS: [&str; 4] = ["[vvar]", "[vvar_vclock]", "[vsyscall]", "[vdso]"];

/// Whether the identity scan reads this mapping: readable, writable and private (the `[heap]`,
/// `[stack]`, anonymous and private file-backed data), at most `max_mapping_bytes` long, and
/// neither a device mapping (`/dev/*`: reading GPU BARs or driver memory through
/// `/proc/PID/mem` is at best useless) nor a kernel pseudo-mapping.
/// Which mappings a scan reads.
///
/// On driver 580 libcuda keeps its per-GPU PCI words in the glibc `[heap]` and in small
/// anonymous mappings (one of 480 KiB in a PyTorch process whose scannable memory is 2.3 GiB).
/// [`ScanScope::LIBCUDA_OBJECTS`] reads just those, which is what keeps a scan of a framework
/// process in the tens of milliseconds; [`ScanScope::FULL`] is the fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanScope {
    /// Largest mapping read, other than the heap.
    pub max_mapping_bytes: u64,
    /// Largest `[heap]` read.
    pub max_heap_bytes: u64,
}

impl ScanScope {
    /// The heap (up to the default bound) and mappings of at most 64 MiB.
    pub const LIBCUDA_OBJECTS: ScanScope =
        ScanScope { max_mapping_bytes: 64 << 20, max_heap_bytes: DEFAULT_MAX_MAPPING_BYTES };
    /// Every private writable mapping up to the default bound.
    pub const FULL: ScanScope =
        ScanScope { max_mapping_bytes: DEFAULT_MAX_MAPPING_BYTES, max_heap_bytes: DEFAULT_MAX_MAPPING_BYTES };

    pub fn admits(&self, m: &Mapping) -> bool {
        is_scannable(m, if m.path == "[heap]" { self.max_heap_bytes } else { self.max_mapping_bytes })
    }
}

pub fn is_scannable(m: &Mapping, max_mapping_bytes: u64) -> bool {
    m.readable
        && m.writable
        && !m.shared
        && !m.is_empty()
        && m.len() <= max_mapping_bytes
        && !m.path.starts_with("/dev/")
        && !KERNEL_PSEUDO_MAPPINGS.contains(&m.path.as_str())
}

/// How a process's anonymous memory is backed (`/proc/PID/smaps_rollup`, KiB): all of it, and the part in
/// transparent huge pages. The driver pins the staging pages to copy them to and from the GPU, which 4 KiB pages
/// make slower than huge ones: the restore logs this before the driver's restore, in both staging modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AnonRollup {
    pub anon_kib: u64,
    pub huge_kib: u64,
}

/// `Anonymous:` and `AnonHugePages:` of a `smaps_rollup` text.
pub fn parse_anon_rollup(text: &str) -> AnonRollup {
    let kib = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    AnonRollup { anon_kib: kib("Anonymous:"), huge_kib: kib("AnonHugePages:") }
}

/// [`AnonRollup`] of `pid` (the kernel walks its page tables to answer: tens of milliseconds for tens of GiB).
pub fn anon_rollup(pid: u32) -> Result<AnonRollup, ProcessError> {
    procfs::read_text(pid, "smaps_rollup", procfs::MAX_SMALL_PROC_FILE).map(|t| parse_anon_rollup(&t))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 fd:01 1835123                    /usr/bin/cat
55d0c0c21000-55d0c0c42000 rw-p 00000000 00:00 0                          [heap]
7f1e2c000000-7f1e2c021000 rw-p 00000000 00:00 0 
7f1e30000000-7f1e30200000 rw-s 00000000 00:05 1024                       /dev/nvidia0
7f1e30200000-7f1e30400000 rw-s 00000000 00:05 1030                       /dev/nvidiactl
7f1e31000000-7f1e31001000 rw-p 00003000 08:02 777                        /opt/my app/lib data.so (deleted)
7f1e32000000-7f1e32001000 rw-p 00000000 00:00 0                          [anon:libcuda arena]
7ffc1a2b0000-7ffc1a2d1000 rw-p 00000000 00:00 0                          [stack]
7ffc1a3f0000-7ffc1a3f4000 r--p 00000000 00:00 0                          [vvar]
7ffc1a3f4000-7ffc1a3f6000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
this line is junk
";

    #[test]
    fn parses_fields_paths_with_spaces_and_deleted() {
        let maps = parse_maps(SAMPLE);
        assert_eq!(maps.len(), 11, "the junk line is skipped");

        let cat = &maps[0];
        assert_eq!((cat.start, cat.end), (0x55d0c0a00000, 0x55d0c0a02000));
        assert!(cat.readable && !cat.writable && !cat.executable && !cat.shared);
        assert_eq!(cat.dev, (0xfd, 0x01));
        assert_eq!(cat.inode, 1835123);
        assert_eq!(cat.path, "/usr/bin/cat");

        assert_eq!(maps[1].path, "[heap]");
        assert_eq!(maps[2].path, "", "anonymous mapping (trailing space only)");
        assert_eq!(maps[2].display_name(), "[anon]");
        assert!(maps[3].shared);

        let deleted = &maps[5];
        assert_eq!(deleted.path, "/opt/my app/lib data.so");
        assert!(deleted.deleted);
        assert_eq!(deleted.offset, 0x3000);
        assert_eq!(deleted.dev, (8, 2));

        assert_eq!(maps[6].path, "[anon:libcuda arena]");
        assert_eq!(maps[10].start, 0xffffffffff600000);
        assert!(maps[10].executable && !maps[10].readable);
    }

    #[test]
    fn scannable_selection() {
        let maps = parse_maps(SAMPLE);
        let names: Vec<&str> =
            maps.iter().filter(|m| is_scannable(m, DEFAULT_MAX_MAPPING_BYTES)).map(|m| m.display_name()).collect();
        assert_eq!(names, ["[heap]", "[anon]", "/opt/my app/lib data.so", "[anon:libcuda arena]", "[stack]"]);
    }

    #[test]
    fn size_bound_and_private_device_mappings() {
        let big = parse_maps("7f0000000000-7f0040000001 rw-p 00000000 00:00 0\n");
        assert!(!is_scannable(&big[0], DEFAULT_MAX_MAPPING_BYTES));
        assert!(is_scannable(&big[0], 2 << 30));
        let exact = parse_maps("7f0000000000-7f0040000000 rw-p 00000000 00:00 0\n");
        assert!(is_scannable(&exact[0], DEFAULT_MAX_MAPPING_BYTES));
        // Even a private writable mapping of a device node is never read.
        let dev = parse_maps("7f0000000000-7f0000001000 rw-p 00000000 00:05 9 /dev/nvidia-uvm\n");
        assert!(!is_scannable(&dev[0], DEFAULT_MAX_MAPPING_BYTES));
        let vvar = parse_maps("7f0000000000-7f0000001000 rw-p 00000000 00:00 0 [vvar_vclock]\n");
        assert!(!is_scannable(&vvar[0], DEFAULT_MAX_MAPPING_BYTES));
    }

    #[test]
    fn reads_own_maps() {
        let maps = read_maps(std::process::id()).expect("own maps");
        assert!(maps.iter().any(|m| m.path == "[stack]"));
        assert!(maps.iter().any(|m| is_scannable(m, DEFAULT_MAX_MAPPING_BYTES)));
    }

    #[test]
    fn the_anonymous_rollup_reads_its_two_lines() {
        let text = "55d0c0000000-7ffd00000000 ---p 00000000 00:00 0 [rollup]\nRss: 100 kB\nAnonymous:     34095104 kB\nAnonHugePages:  33554432 kB\n";
        assert_eq!(parse_anon_rollup(text), AnonRollup { anon_kib: 34_095_104, huge_kib: 33_554_432 });
        let me = anon_rollup(std::process::id()).unwrap();
        assert!(me.anon_kib > 0 && me.huge_kib <= me.anon_kib, "{me:?}");
    }
}
