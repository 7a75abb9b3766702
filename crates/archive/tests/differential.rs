//! The reader against GNU tar and Python's `tarfile` (issue 29): for archives of odd headers, made up
//! by proptest, every archive `ccm_archive` accepts must have the member names that GNU tar
//! (`tar -t`) and Python list, in order. An archive whose members some mainstream reader names
//! differently must be refused, or `inspect` could show one identity image while a restore unpacks
//! another. (`tests/archives.rs` holds every well-formed archive of the tests to the same oracles.)
//!
//! The oracles run as programs; where one is missing the test says so in a `########` line and
//! passes, unless `CCM_REQUIRE_TEST_DOUBLES=1` (CI), where it fails.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use ccm_archive::{member_names, Limits};
use common::*;
use proptest::prelude::*;

/// One header's worth of choices.
#[derive(Debug, Clone)]
struct Member {
    name: String,
    flag: u8,
    format: Format,
    /// Bytes at offset 345, where ustar keeps its name prefix.
    prefix: Option<String>,
    long_name: Option<String>,
    long_link: Option<String>,
    pax: Vec<(&'static str, String)>,
    link: String,
    data: usize,
    /// A PAX global header before the member.
    global: Vec<(&'static str, String)>,
}

#[derive(Debug, Clone, Copy)]
enum Format {
    Gnu,
    Ustar,
    /// `ustar\0` with another version than `00`.
    UstarVersion([u8; 2]),
    /// ustar with a star trailer.
    Star,
    /// No magic at all (pre-POSIX).
    V7,
}

fn segment() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        20 => prop::sample::select(vec![
            "checkpoint",
            "checkpoint",
            "cuda-migrate-1.img",
            "cuda-migrate-2.img",
            "x",
            "x",
            ".",
            "",
            "a b",
            "spec.dump",
            "d\u{e9}",
        ]),
        1 => Just(".."),
    ]
}

fn path() -> impl Strategy<Value = String> {
    (prop::collection::vec(segment(), 1..4), any::<bool>(), any::<bool>()).prop_map(|(parts, dot, slash)| {
        let mut p = parts.join("/");
        if dot {
            p.insert_str(0, "./");
        }
        if slash {
            p.push('/');
        }
        p
    })
}

fn link_target() -> impl Strategy<Value = String> {
    prop_oneof![8 => path(), 1 => Just("/etc/shadow".to_string()), 1 => Just(String::new())]
}

fn format() -> impl Strategy<Value = Format> {
    prop_oneof![
        8 => Just(Format::Gnu),
        8 => Just(Format::Ustar),
        1 => prop::sample::select(vec![*b"\0\0", *b" \0", *b"01"]).prop_map(Format::UstarVersion),
        1 => Just(Format::Star),
        1 => Just(Format::V7),
    ]
}

fn pax_records() -> impl Strategy<Value = Vec<(&'static str, String)>> {
    let key = prop_oneof![
        8 => prop::sample::select(vec!["path", "linkpath", "comment", "uname", "path"]),
        1 => prop::sample::select(vec!["mtime", "GNU.sparse.name", "size"]),
    ];
    let value = prop_oneof![8 => path(), 1 => Just("1700000000.5".to_string()), 1 => Just("7".to_string())];
    prop::collection::vec((key, value), 0..3)
}

fn member() -> impl Strategy<Value = Member> {
    let flag = prop_oneof![
        12 => prop::sample::select(vec![b'0', b'0', b'0', 0, b'5', b'5', b'2', b'2', b'1', b'6', b'7', b'3']),
        1 => prop::sample::select(vec![b'X', b'V', b'S', b'D']),
    ];
    (
        (path(), flag, format(), prop::option::weighted(0.2, path()), prop::option::weighted(0.2, path())),
        (prop::option::weighted(0.1, link_target()), prop::option::weighted(0.3, pax_records()), link_target()),
        (0usize..700, prop::option::weighted(0.1, pax_records())),
    )
        .prop_map(|((name, flag, format, prefix, long_name), (long_link, pax, link), (data, global))| Member {
            name,
            flag,
            format,
            prefix,
            long_name,
            long_link,
            pax: pax.unwrap_or_default(),
            link,
            data,
            global: global.unwrap_or_default(),
        })
}

fn octal(field: &mut [u8], n: u64) {
    let s = format!("{n:0w$o}\0", w = field.len() - 1);
    field.copy_from_slice(s.as_bytes());
}

/// A header with every field set by hand (the builder of the `tar` crate would refuse or fix most
/// of these), its checksum right.
fn header(name: &[u8], flag: u8, size: u64, format: Format, prefix: Option<&[u8]>, link: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    let cut = |s: &[u8], n: usize| s[..s.len().min(n)].to_vec();
    b[..name.len().min(100)].copy_from_slice(&cut(name, 100));
    octal(&mut b[100..108], 0o644);
    octal(&mut b[108..116], 0);
    octal(&mut b[116..124], 0);
    octal(&mut b[124..136], size);
    octal(&mut b[136..148], 1_700_000_000);
    b[156] = flag;
    b[157..157 + link.len().min(100)].copy_from_slice(&cut(link, 100));
    match format {
        Format::Gnu => b[257..265].copy_from_slice(b"ustar  \0"),
        Format::Ustar | Format::Star => b[257..265].copy_from_slice(b"ustar\x0000"),
        Format::UstarVersion(v) => {
            b[257..263].copy_from_slice(b"ustar\0");
            b[263..265].copy_from_slice(&v);
        }
        Format::V7 => {}
    }
    if let Some(prefix) = prefix {
        b[345..345 + prefix.len().min(155)].copy_from_slice(&cut(prefix, 155));
    }
    if let Format::Star = format {
        b[508..512].copy_from_slice(b"tar\0");
    }
    b[148..156].copy_from_slice(b"        ");
    let sum: u32 = b.iter().map(|&x| u32::from(x)).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    b
}

fn padded(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(512), 0);
}

fn pax_data(records: &[(&str, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in records {
        let body = key.len() + value.len() + 3;
        let mut len = body + 1;
        while len != body + len.to_string().len() {
            len = body + len.to_string().len();
        }
        out.extend_from_slice(format!("{len} {key}={value}\n").as_bytes());
    }
    out
}

fn archive(members: &[Member]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in members {
        if !m.global.is_empty() {
            let data = pax_data(&m.global);
            out.extend(header(b"pax_global_header", b'g', data.len() as u64, Format::Ustar, None, b""));
            padded(&mut out, &data);
        }
        for (flag, long) in [(b'L', &m.long_name), (b'K', &m.long_link)] {
            if let Some(long) = long {
                let mut data = long.as_bytes().to_vec();
                data.push(0);
                out.extend(header(b"././@LongLink", flag, data.len() as u64, Format::Gnu, None, b""));
                padded(&mut out, &data);
            }
        }
        if !m.pax.is_empty() {
            let data = pax_data(&m.pax);
            out.extend(header(b"PaxHeaders/x", b'x', data.len() as u64, Format::Ustar, None, b""));
            padded(&mut out, &data);
        }
        let has_data = matches!(m.flag, b'0' | 0 | b'7' | b'X' | b'V');
        let size = if has_data { m.data as u64 } else { 0 };
        out.extend(header(
            m.name.as_bytes(),
            m.flag,
            size,
            m.format,
            m.prefix.as_deref().map(str::as_bytes),
            m.link.as_bytes(),
        ));
        padded(&mut out, &vec![0x61; usize::try_from(size).unwrap()]);
    }
    out.extend([0; 1024]);
    out
}

/// Runs one generated archive through the reader and, where it is accepted, through the oracles.
fn check(members: &[Member]) -> Result<bool, TestCaseError> {
    let bytes = archive(members);
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "generated.tar", &bytes);
    let Ok(ours) = member_names(&path, &Limits::default()) else { return Ok(false) };
    let ours: Vec<_> = ours.iter().map(|n| normalized(n)).collect();
    let Some(oracles) = oracle_names(&bytes) else { return Ok(true) };
    for (oracle, names) in oracles {
        let names = names.map_err(|e| TestCaseError::fail(format!("{oracle} fails on an accepted archive: {e}")))?;
        prop_assert_eq!(shown_names(&names), shown_names(&ours), "{} disagrees", oracle);
    }
    Ok(true)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn accepted_archives_have_the_names_gnu_tar_and_python_list(members in prop::collection::vec(member(), 1..6)) {
        check(&members)?;
    }
}

#[test]
fn the_generator_makes_archives_the_reader_accepts() {
    // A plain archive of each format the reader takes, so the property above is not vacuous.
    let plain = |name: &str, flag: u8, format: Format| Member {
        name: name.into(),
        flag,
        format,
        prefix: None,
        long_name: None,
        long_link: None,
        pax: Vec::new(),
        link: String::new(),
        data: 10,
        global: Vec::new(),
    };
    let mut with_prefix = plain("cuda-migrate-1.img", b'0', Format::Ustar);
    with_prefix.prefix = Some("./checkpoint".into());
    let mut with_pax = plain("x", b'0', Format::Ustar);
    with_pax.pax = vec![("path", "checkpoint/cuda-migrate-2.img".into()), ("mtime", "1".into())];
    let mut with_long = plain("y", b'0', Format::Gnu);
    with_long.long_name = Some("checkpoint/./a b".into());
    let mut link = plain("checkpoint/l", b'2', Format::Gnu);
    link.link = "cuda-migrate-1.img".into();
    let members = [
        plain("checkpoint/", b'5', Format::Gnu),
        with_prefix,
        with_pax,
        with_long,
        link,
        plain("checkpoint/old", 0, Format::V7),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "plain.tar", &archive(&members));
    if let Err(e) = member_names(&path, &Limits::default()) {
        panic!("the reader refused {members:#?}: {e}");
    }
    assert!(check(&members).unwrap());
}
