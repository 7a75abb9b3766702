//! PAX extended-header records (`x` members), the few keys that change how the stream is read.
//!
//! Our own parser rather than `tar::PaxExtensions`: that one splits records at newlines (a value may
//! hold one; the length prefix is what delimits a record) and `tar`'s reader silently ignores a `size`
//! it cannot parse, which would make us walk the stream differently from Go's archive/tar (Podman's
//! and containerd's reader). Here a malformed record refuses the archive, as Go does.
//!
//! Some keys make GNU tar and Python's `tarfile` name or lay out a member differently from Go's
//! archive/tar and the `tar` crate; those are refused (see [`parse`]), so that every reader names a
//! member alike.

/// What a local PAX header says about the member after it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Pax {
    /// `path`: the member's name, overriding the header's.
    pub(crate) path: Option<Vec<u8>>,
    /// `linkpath`: a link's target, overriding the header's.
    pub(crate) linkpath: Option<Vec<u8>>,
    /// `size`: the member's data size, overriding the header's (Go writes it, with 0 in the header,
    /// for members of 8 GiB and more, which a large `pages-*.img` can be).
    pub(crate) size: Option<u64>,
}

/// Why a PAX header is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PaxError {
    /// Not PAX's syntax.
    Malformed(&'static str),
    /// Well-formed, but read differently by different readers.
    Ambiguous(&'static str),
}

impl PaxError {
    #[cfg(test)]
    fn reason(self) -> &'static str {
        match self {
            PaxError::Malformed(r) | PaxError::Ambiguous(r) => r,
        }
    }
}

use PaxError::{Ambiguous, Malformed};

/// Which kind of PAX header the records come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// `x`: the next member's.
    Local,
    /// `g`: every later member's, for the readers that apply one at all.
    Global,
}

/// Parses the records `<len> <key>=<value>\n`, where `len` counts the whole record.
///
/// Refused besides malformed records:
/// - `GNU.sparse.*` keys: GNU tar, Python's `tarfile` and Go's archive/tar take `GNU.sparse.name`
///   for the member's name (and the other keys for its layout), the `tar` crate does not.
/// - `path`, `linkpath` or `size` twice in one header (readers differ on which one counts), or
///   empty (POSIX: "use the header's field", which not every reader does).
/// - In a global header, `path`, `linkpath` and `size`: GNU tar applies them to every later member,
///   Python to those with a local header of their own, Go and the `tar` crate to none.
pub(crate) fn parse(mut data: &[u8], scope: Scope) -> Result<Pax, PaxError> {
    let mut pax = Pax::default();
    while !data.is_empty() {
        let space = data.iter().position(|&b| b == b' ').ok_or(Malformed("a PAX record without its length"))?;
        let len = decimal(&data[..space]).ok_or(Malformed("a PAX record whose length is not a decimal number"))?;
        let len = usize::try_from(len).map_err(|_| Malformed("a PAX record longer than its header"))?;
        if len <= space + 1 || len > data.len() {
            return Err(Malformed("a PAX record whose length does not fit its header"));
        }
        let record =
            data[space + 1..len].strip_suffix(b"\n").ok_or(Malformed("a PAX record not ended by a newline"))?;
        data = &data[len..];
        let eq = record.iter().position(|&b| b == b'=').ok_or(Malformed("a PAX record without `=`"))?;
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        if key.starts_with(b"GNU.sparse.") {
            return Err(Ambiguous(
                "a PAX `GNU.sparse.*` record (GNU tar, Python and Go take its `GNU.sparse.name` for \
                        the member's name, other readers do not; no checkpoint writer makes sparse members)",
            ));
        }
        let slot = match key {
            b"path" | b"linkpath" | b"size" if scope == Scope::Global => {
                return Err(Ambiguous(
                    "a PAX global header with a `path`, `linkpath` or `size` record (readers differ \
                            on which members it renames)",
                ));
            }
            b"path" => PathSlot::Path,
            b"linkpath" => PathSlot::Link,
            b"size" => {
                if pax.size.is_some() {
                    return Err(Ambiguous("two PAX `size` records for one member"));
                }
                pax.size = Some(decimal(value).ok_or(Malformed("a PAX size that is not a decimal number"))?);
                continue;
            }
            // Go's archive/tar refuses an archive whose times or ids do not parse, GNU tar fails
            // on it, Python takes 0: a malformed one is refused here too.
            b"mtime" | b"atime" | b"ctime" => {
                if !is_time(value) {
                    return Err(Malformed("a PAX time that is not a decimal number of seconds"));
                }
                continue;
            }
            b"uid" | b"gid" => {
                if decimal(value.strip_prefix(b"-").unwrap_or(value)).is_none_or(|n| n > i64::MAX as u64) {
                    return Err(Malformed("a PAX uid or gid that is not a decimal number"));
                }
                continue;
            }
            _ => continue,
        };
        // A C string cannot hold NUL; Go refuses such a path too.
        if value.contains(&0) {
            return Err(Malformed("a PAX path or link path with a NUL byte"));
        }
        if value.is_empty() {
            return Err(Ambiguous("an empty PAX path or link path (readers differ on what it means)"));
        }
        let field = match slot {
            PathSlot::Path => &mut pax.path,
            PathSlot::Link => &mut pax.linkpath,
        };
        if field.replace(value.to_vec()).is_some() {
            return Err(Ambiguous("two PAX `path` or `linkpath` records for one member"));
        }
    }
    Ok(pax)
}

enum PathSlot {
    Path,
    Link,
}

/// `-?\d+(\.\d+)?`, seconds that fit an i64: what Go, GNU tar and Python all read alike.
fn is_time(s: &[u8]) -> bool {
    let s = s.strip_prefix(b"-").unwrap_or(s);
    let (whole, fraction) = match s.iter().position(|&b| b == b'.') {
        Some(dot) => (&s[..dot], Some(&s[dot + 1..])),
        None => (s, None),
    };
    decimal(whole).is_some_and(|n| n <= i64::MAX as u64)
        && fraction.is_none_or(|f| !f.is_empty() && f.iter().all(u8::is_ascii_digit))
}

/// ASCII digits only (no sign, no spaces), as a u64.
fn decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str, value: &[u8]) -> Vec<u8> {
        // The length counts its own digits; find the fixed point.
        let body = key.len() + 1 + value.len() + 1;
        let mut len = body + 2;
        while len != body + 1 + len.to_string().len() {
            len = body + 1 + len.to_string().len();
        }
        let mut out = format!("{len} {key}=").into_bytes();
        out.extend_from_slice(value);
        out.push(b'\n');
        out
    }

    #[test]
    fn path_and_size_are_read_and_other_keys_ignored() {
        let mut data = record("mtime", b"1700000000.5");
        data.extend(record("path", b"checkpoint/a\nb"));
        data.extend(record("size", b"10737418240"));
        let pax = parse(&data, Scope::Local).unwrap();
        assert_eq!(pax.path.as_deref(), Some(&b"checkpoint/a\nb"[..]));
        assert_eq!(pax.size, Some(10 << 30));
        assert_eq!(parse(b"", Scope::Local).unwrap(), Pax::default());
    }

    #[test]
    fn malformed_records_are_refused() {
        assert!(parse(b"garbage", Scope::Local).is_err());
        assert!(parse(b"99 path=x\n", Scope::Local).is_err());
        assert!(parse(b"3 p\n", Scope::Local).is_err());
        assert!(parse(b"10 path=xy", Scope::Local).is_err());
        assert!(parse(b"9 pathxy\n", Scope::Local).is_err());
        assert!(parse(&record("size", b"-1"), Scope::Local).is_err());
        assert!(parse(&record("size", b"+1"), Scope::Local).is_err());
        assert!(parse(&record("size", b"99999999999999999999999"), Scope::Local).is_err());
        assert!(parse(&record("path", b"a\0b"), Scope::Local).is_err());
        assert!(parse(b"+9 path=x\n", Scope::Local).is_err());
        for (key, bad) in [("mtime", &b"x"[..]), ("atime", b"1."), ("ctime", b"+1"), ("uid", b"1.5"), ("gid", b"")] {
            assert!(matches!(parse(&record(key, bad), Scope::Local), Err(Malformed(_))), "{key}={bad:?}");
        }
        for (key, good) in [("mtime", &b"1700000000.123456789"[..]), ("atime", b"-1"), ("uid", b"0"), ("gid", b"-2")] {
            assert!(parse(&record(key, good), Scope::Local).is_ok(), "{key}");
        }
    }

    #[test]
    fn records_that_readers_apply_differently_are_refused() {
        let local = |data: &[u8]| parse(data, Scope::Local);
        assert!(local(&record("GNU.sparse.name", b"checkpoint/cuda-migrate-1.img"))
            .unwrap_err()
            .reason()
            .contains("GNU.sparse"));
        assert!(local(&record("GNU.sparse.major", b"1")).is_err());
        let mut two = record("path", b"a");
        two.extend(record("path", b"b"));
        assert!(local(&two).unwrap_err().reason().contains("two PAX"));
        let mut two = record("size", b"1");
        two.extend(record("size", b"1"));
        assert!(local(&two).is_err());
        assert!(local(&record("path", b"")).unwrap_err().reason().contains("empty"));
        assert!(local(&record("linkpath", b"")).is_err());
        assert_eq!(local(&record("linkpath", b"../x")).unwrap().linkpath.as_deref(), Some(&b"../x"[..]));
        for key in ["path", "linkpath", "size"] {
            assert!(parse(&record(key, b"1"), Scope::Global).unwrap_err().reason().contains("global"), "{key}");
        }
        // What `git archive` writes.
        assert_eq!(parse(&record("comment", b"2a3b4c"), Scope::Global).unwrap(), Pax::default());
    }
}
