//! PAX extended-header records (`x` members), the few keys that change how the stream is read.
//!
//! Our own parser rather than `tar::PaxExtensions`: that one splits records at newlines (a value may
//! hold one; the length prefix is what delimits a record) and `tar`'s reader silently ignores a `size`
//! it cannot parse, which would make us walk the stream differently from Go's archive/tar (Podman's
//! and containerd's reader). Here a malformed record refuses the archive, as Go does.

/// What a local PAX header says about the member after it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Pax {
    /// `path`: the member's name, overriding the header's.
    pub(crate) path: Option<Vec<u8>>,
    /// `size`: the member's data size, overriding the header's (Go writes it, with 0 in the header,
    /// for members of 8 GiB and more, which a large `pages-*.img` can be).
    pub(crate) size: Option<u64>,
}

/// Parses the records `<len> <key>=<value>\n`, where `len` counts the whole record.
pub(crate) fn parse(mut data: &[u8]) -> Result<Pax, &'static str> {
    let mut pax = Pax::default();
    while !data.is_empty() {
        let space = data.iter().position(|&b| b == b' ').ok_or("a PAX record without its length")?;
        let len = decimal(&data[..space]).ok_or("a PAX record whose length is not a decimal number")?;
        let len = usize::try_from(len).map_err(|_| "a PAX record longer than its header")?;
        if len <= space + 1 || len > data.len() {
            return Err("a PAX record whose length does not fit its header");
        }
        let record = data[space + 1..len].strip_suffix(b"\n").ok_or("a PAX record not ended by a newline")?;
        data = &data[len..];
        let eq = record.iter().position(|&b| b == b'=').ok_or("a PAX record without `=`")?;
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        match key {
            b"path" => {
                // A C string cannot hold NUL; Go refuses such a path too.
                if value.contains(&0) {
                    return Err("a PAX path with a NUL byte");
                }
                pax.path = Some(value.to_vec());
            }
            b"size" => pax.size = Some(decimal(value).ok_or("a PAX size that is not a decimal number")?),
            _ => {}
        }
    }
    Ok(pax)
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
        let pax = parse(&data).unwrap();
        assert_eq!(pax.path.as_deref(), Some(&b"checkpoint/a\nb"[..]));
        assert_eq!(pax.size, Some(10 << 30));
        assert_eq!(parse(b"").unwrap(), Pax::default());
    }

    #[test]
    fn malformed_records_are_refused() {
        assert!(parse(b"garbage").is_err());
        assert!(parse(b"99 path=x\n").is_err());
        assert!(parse(b"3 p\n").is_err());
        assert!(parse(b"10 path=xy").is_err());
        assert!(parse(b"9 pathxy\n").is_err());
        assert!(parse(&record("size", b"-1")).is_err());
        assert!(parse(&record("size", b"+1")).is_err());
        assert!(parse(&record("size", b"99999999999999999999999")).is_err());
        assert!(parse(&record("path", b"a\0b")).is_err());
        assert!(parse(b"+9 path=x\n").is_err());
    }
}
