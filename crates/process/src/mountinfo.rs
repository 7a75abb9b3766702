//! `/proc/PID/mountinfo`: which mount stands at a path of a process's mount namespace, of what file
//! system type, on which device.

/// One line of `/proc/PID/mountinfo` (proc(5)), the fields the plugin decides by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_id: u64,
    pub parent_id: u64,
    /// `st_dev` of the mounted file system: `makedev(major, minor)` of field 3.
    pub major: u32,
    pub minor: u32,
    /// The directory of the file system that is mounted (`/` for a whole file system, a
    /// subdirectory for a bind mount of it).
    pub root: String,
    /// Where it is mounted, relative to the process's root.
    pub mount_point: String,
    pub fs_type: String,
    pub source: String,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = u32::from(b[i + 1] - b'0') * 64 + u32::from(b[i + 2] - b'0') * 8 + u32::from(b[i + 3] - b'0');
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses one mountinfo line; `None` for a line that does not have proc(5)'s shape.
pub fn parse_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let mount_id = l.next()?.parse().ok()?;
    let parent_id = l.next()?.parse().ok()?;
    let (major, minor) = l.next()?.split_once(':')?;
    let root = unescape(l.next()?);
    let mount_point = unescape(l.next()?);
    let mut r = right.split(' ');
    let fs_type = unescape(r.next()?);
    let source = unescape(r.next().unwrap_or(""));
    Some(MountEntry {
        mount_id,
        parent_id,
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        root,
        mount_point,
        fs_type,
        source,
    })
}

/// Every well-formed line of a mountinfo text, in the kernel's order (a mount listed later at the
/// same point is stacked on top of the earlier ones).
pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

/// The mount a process sees at `path`: the last one listed there.
pub fn top_mount_at<'a>(mounts: &'a [MountEntry], path: &str) -> Option<&'a MountEntry> {
    mounts.iter().rev().find(|m| m.mount_point == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw,size=4096k
300 299 0:88 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
301 300 0:89 / /dev/pts rw - devpts devpts rw
302 299 0:21 /srv/my\\040dir /data rw - ext4 /dev/vda rw
";

    #[test]
    fn lines_are_read_with_their_escapes() {
        let m = parse(TEXT);
        assert_eq!(m.len(), 5);
        assert_eq!(m[4].root, "/srv/my dir");
        assert_eq!((m[1].major, m[1].minor, m[1].fs_type.as_str()), (0, 5, "devtmpfs"));
        assert_eq!(parse_line("garbage"), None);
        assert_eq!(parse_line("1 2 x / / rw - ext4 a rw"), None);
    }

    #[test]
    fn the_top_mount_wins() {
        let m = parse(TEXT);
        let dev = top_mount_at(&m, "/dev").unwrap();
        assert_eq!((dev.mount_id, dev.fs_type.as_str()), (300, "tmpfs"));
        assert!(top_mount_at(&m, "/nothing").is_none());
    }
}
