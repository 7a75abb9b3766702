//! The walk over the tar stream, header by header.
//!
//! We read headers ourselves (decoding their fields with `tar::Header`) instead of using
//! `tar::Archive::entries`, because that iterator reads GNU long-name and PAX extension members into
//! memory whole, whatever size their header claims (a 100 GB "long name" from a zstd bomb), applies a
//! PAX `size` only when it parses, and takes the end of the file at a header boundary for the end of
//! the archive. Here every read is bounded before it is made, and a cut archive is an error.

use std::collections::HashMap;
use std::io;
use std::path::Path;

use tar::{EntryType, GnuExtSparseHeader, Header};

use crate::archive::{
    ArchiveFile, CheckpointArchive, Compression, Limits, MAX_EXTENSION_BYTES, MAX_IMAGES, MAX_REPORT_BYTES,
    MAX_SPEC_BYTES,
};
use crate::error::{ArchiveError, Truncation};
use crate::input::{self, Input};
use crate::name::{self, Role};
use crate::pax::{self, Pax};
use ccm_identity::image::MAX_IMAGE_BYTES;

/// Tar's block: every header is one, every member's data is padded to a multiple of it.
const BLOCK: u64 = 512;
/// Buffer for reading through skipped data of a compressed archive.
const SKIP_CHUNK: usize = 128 * 1024;
/// What one path component of a link is counted as in [`Limits::max_kept_bytes`]: its node in the
/// tree of links and its entry in the parent's map.
const LINK_NODE_BYTES: usize = 256;

/// What a walk found; [`crate::read_archive`] turns it into a [`crate::CheckpointArchive`].
#[derive(Default)]
pub(crate) struct Found {
    pub(crate) images: Vec<ArchiveFile>,
    pub(crate) reports: Vec<ArchiveFile>,
    pub(crate) spec: Option<ArchiveFile>,
    pub(crate) claims: Option<ArchiveFile>,
    /// Every `checkpoint/cuda-migrate-pages-<pid>.img`: its file name and size (its data is not read).
    pub(crate) page_files: Vec<(String, u64)>,
    pub(crate) has_inventory: bool,
    pub(crate) has_checkpoint: bool,
    pub(crate) members: usize,
    pub(crate) bytes_scanned: u64,
    /// Identity images kept.
    image_count: usize,
    /// Every member's name as resolved (GNU long name, PAX path, ustar prefix), when asked for.
    pub(crate) names: Option<Vec<Vec<u8>>>,
    /// The dumping CRIU's version, from the first lines of `dump.log`, and that member's name.
    pub(crate) criu_version: Option<(String, String)>,
    /// An OCI image layout in the tar (an `oci-archive`): `oci-layout` and `index.json`.
    pub(crate) oci_layout: Option<ArchiveFile>,
    pub(crate) oci_index: Option<ArchiveFile>,
    /// `blobs/<algorithm>/<name>` members: where their data lies in the tar stream.
    pub(crate) blobs: Vec<BlobMember>,
}

/// Where a blob's data lies in an `oci-archive` (a plain tar: the offset is the file's).
pub(crate) struct BlobMember {
    /// `<algorithm>/<name>` (`sha256/<hex>`), the components below `blobs/`.
    pub(crate) key: String,
    pub(crate) offset: u64,
    pub(crate) size: u64,
}

/// Bytes read of `dump.log`: CRIU names its version on one of the first lines.
const DUMP_LOG_HEAD: usize = 16 * 1024;
/// Most blobs an `oci-archive` may hold (a checkpoint image has three: manifest, config, layer).
pub(crate) const MAX_BLOBS: usize = 4096;
/// Largest `oci-layout` or `index.json` kept (the same bound as any image JSON).
pub(crate) const MAX_OCI_JSON_BYTES: u64 = crate::image_rule::MAX_JSON_BYTES;

/// Extension headers (GNU `L`/`K`, PAX `x`) read since the last member, for the member after them.
#[derive(Default)]
struct Pending {
    /// Offset of the first of them, for messages.
    offset: Option<u64>,
    long_name: Option<Vec<u8>>,
    /// A GNU long link name: a link's target.
    long_link: Option<Vec<u8>>,
    pax: Option<Pax>,
}

pub(crate) struct Walk<'a, 'l> {
    input: Input<'a>,
    compression: Compression,
    /// The archive's path, escaped for messages.
    archive: String,
    limits: &'l Limits,
    /// Bytes of the tar stream consumed (read or stepped over).
    pos: u64,
    chunk: Vec<u8>,
}

impl<'a, 'l> Walk<'a, 'l> {
    pub(crate) fn new(input: Input<'a>, compression: Compression, archive: String, limits: &'l Limits) -> Self {
        Walk { input, compression, archive, limits, pos: 0, chunk: Vec::new() }
    }

    pub(crate) fn run(self) -> Result<Found, ArchiveError> {
        self.walk(Found::default())
    }

    /// Walks the whole archive by the same rules as [`Walk::run`] and returns every member's name.
    pub(crate) fn names(self) -> Result<Vec<Vec<u8>>, ArchiveError> {
        Ok(self.walk(Found { names: Some(Vec::new()), ..Found::default() })?.names.unwrap_or_default())
    }

    fn walk(mut self, mut found: Found) -> Result<Found, ArchiveError> {
        // Canonical path of each recognized member → its name as first seen.
        let mut seen: HashMap<Vec<u8>, String> = HashMap::new();
        // Canonical path of every member, and of every directory a member implies → what it is and who made it.
        let mut kinds: HashMap<Vec<u8>, (PathKind, String)> = HashMap::new();
        let mut kept_bytes = 0u64;
        let mut links = LinkTree::default();
        let mut pending = Pending::default();
        let mut header = Header::new_old();
        loop {
            let offset = self.pos;
            self.budget(BLOCK)?;
            let n = self.fill(header.as_mut_bytes())?;
            if (n as u64) < BLOCK {
                return Err(self.short_header(offset, n, header.as_bytes()));
            }
            if header.as_bytes().iter().all(|&b| b == 0) {
                // The end-of-archive block. Writers add a second one and padding; nothing after that
                // second block is part of the archive, so it is not read.
                if let Some(at) = pending.offset {
                    return Err(self.corrupt(at, "extension headers that no member follows".into()));
                }
                found.bytes_scanned = self.pos;
                self.second_end_block(&mut header)?;
                return Ok(found);
            }
            if !checksum_ok(&header) {
                return Err(if offset == 0 {
                    self.not_tar(header.as_bytes())
                } else {
                    self.corrupt(offset, "its checksum does not match".into())
                });
            }
            let kind = header.entry_type();
            let header_size =
                header.entry_size().map_err(|_| self.corrupt(offset, "its size field is unreadable".into()))?;

            self.check_dialect(&header, offset)?;

            if matches!(kind, EntryType::GNULongName | EntryType::GNULongLink | EntryType::XHeader) {
                self.extension(&mut pending, kind, offset, header_size)?;
                continue;
            }

            found.members += 1;
            if found.members as u64 > self.limits.max_members {
                return Err(ArchiveError::TooManyMembers {
                    archive: self.archive.clone(),
                    max: self.limits.max_members,
                });
            }
            let Pending { offset: extensions_at, long_name, long_link, pax } = std::mem::take(&mut pending);
            if kind == EntryType::XGlobalHeader {
                // Go's archive/tar and the `tar` crate apply none of a global header's records to
                // later members; GNU tar applies all of them and Python some, so a global header
                // may hold none that names or sizes a member (`pax::parse` refuses those). Between a
                // member's own extensions and the member it would make readers disagree on which
                // member those extensions describe.
                if let Some(at) = extensions_at {
                    return Err(self.corrupt(at, "extension headers followed by a PAX global header".into()));
                }
                self.global(offset, header_size)?;
                continue;
            }
            let (pax_path, pax_link, pax_size) = pax.map_or((None, None, None), |p| (p.path, p.linkpath, p.size));
            if let (Some(long), Some(pax)) = (&long_name, &pax_path) {
                if long != pax {
                    // Go, GNU tar and the `tar` crate take the GNU long name, Python the one that
                    // came last.
                    return Err(self.ambiguous(offset, "a member with both a GNU long name and a different PAX path"));
                }
            }

            // The path rules hold for every name the member carries, not only the one we use
            // (GNU long name, then PAX path, then the header's, as Go and the `tar` crate choose):
            // another reader could pick another one.
            let header_name = header.path_bytes().into_owned();
            let raw_name: &[u8] = long_name.as_deref().or(pax_path.as_deref()).unwrap_or(&header_name);
            for candidate in [Some(&header_name[..]), long_name.as_deref(), pax_path.as_deref()].into_iter().flatten() {
                if let Err(rule) = name::components(candidate) {
                    return Err(ArchiveError::UnsafePath {
                        archive: self.archive.clone(),
                        member: name::shown(candidate),
                        rule,
                    });
                }
            }
            for candidate in [Some(&header_name[..]), long_name.as_deref(), pax_path.as_deref()].into_iter().flatten() {
                if name::components(candidate).unwrap_or_default().iter().any(|c| c.starts_with(name::WHITEOUT)) {
                    return Err(ArchiveError::Whiteout {
                        archive: self.archive.clone(),
                        member: name::shown(candidate),
                    });
                }
            }
            let components = name::components(raw_name).unwrap_or_default();
            let member = name::shown(raw_name);
            let size = pax_size.unwrap_or(header_size);

            // An extractor writes a member through a link an earlier member made: `x -> checkpoint`
            // then `x/cuda-migrate-1.img` is an identity image to GNU tar and Python. Refused, and
            // so is a member at the path of an earlier link (Python writes it into the link's target).
            if let Some((link, link_kind)) = links.lookup(&components, true) {
                return Err(ArchiveError::ThroughLink {
                    archive: self.archive.clone(),
                    path: member.clone(),
                    member,
                    link: link.to_string(),
                    kind: link_kind,
                });
            }
            if matches!(kind, EntryType::Link | EntryType::Symlink) {
                let header_link = header.link_name_bytes().map(|l| l.into_owned());
                if let (Some(long), Some(pax)) = (&long_link, &pax_link) {
                    if long != pax {
                        return Err(self
                            .ambiguous(offset, "a link with both a GNU long link name and a different PAX linkpath"));
                    }
                }
                for target in [header_link.as_deref(), long_link.as_deref(), pax_link.as_deref()].into_iter().flatten()
                {
                    let through = match name::components(target) {
                        // A hard link's target is a member path: it must not run through a link
                        // either. A symbolic link's is relative to its own directory.
                        Ok(parts) if kind == EntryType::Link => links.lookup(&parts, false),
                        Ok(_) => None,
                        Err(rule) => {
                            return Err(ArchiveError::UnsafeLinkTarget {
                                archive: self.archive.clone(),
                                member,
                                target: name::shown(target),
                                rule,
                            })
                        }
                    };
                    if let Some((link, link_kind)) = through {
                        return Err(ArchiveError::ThroughLink {
                            archive: self.archive.clone(),
                            member,
                            path: name::shown(target),
                            link: link.to_string(),
                            kind: link_kind,
                        });
                    }
                }
                if !components.is_empty() {
                    // The tree's nodes cost more than their names: count each component generously.
                    kept_bytes += (raw_name.len() + member.len() + LINK_NODE_BYTES * components.len()) as u64;
                    self.kept(kept_bytes)?;
                    links.insert(&components, member.clone(), kind_name(kind, false));
                }
            }
            if let Some(names) = &mut found.names {
                kept_bytes += raw_name.len() as u64;
                self.kept(kept_bytes)?;
                names.push(raw_name.to_vec());
            }

            // Go and Python take a regular member whose header name ends in `/` for a directory
            // even where a long name or PAX path without one replaces that name.
            let is_dir = kind == EntryType::Directory
                || (kind == EntryType::Regular && (raw_name.ends_with(b"/") || header_name.ends_with(b"/")));
            if (is_header_only(kind) || is_dir) && size != 0 {
                // Go's archive/tar (Podman's and containerd's reader) reads no data for these types
                // whatever the size field says, GNU tar and the `tar` crate read `size` bytes: the
                // readers would disagree on where the next header is (Go and Python take a regular
                // member whose name ends in `/` for a directory too). No writer does this.
                return Err(self.corrupt(
                    offset,
                    format!("member `{member}` is {} with {size} bytes of data", kind_name(kind, is_dir)),
                ));
            }
            let role = name::role(&components, is_dir);
            found.has_checkpoint |= role.in_checkpoint();

            if kind == EntryType::GNUSparse {
                self.skip_sparse_extensions(&header, offset)?;
            }

            if role.is_recognized() {
                // Links and special files under these names are refused: a link would make the report
                // describe a file other than the one a restore reads. Links and special files under
                // other names are skipped like any member: this reader creates nothing on disk and
                // follows no link, so their targets cannot reach anything here.
                if kind != EntryType::Regular || is_dir {
                    return Err(ArchiveError::NotRegularMember {
                        archive: self.archive.clone(),
                        member,
                        kind: kind_name(kind, is_dir),
                    });
                }
                let key = components.join(&b'/');
                if let Some(first) = seen.get(&key) {
                    return Err(ArchiveError::Duplicate {
                        archive: self.archive.clone(),
                        member,
                        first: first.clone(),
                    });
                }
                // Names count toward what is held, like data: 3,000 members named by 1 MiB PAX
                // paths once held 3 GB.
                kept_bytes += (key.len() + raw_name.len() + member.len()) as u64;
                self.kept(kept_bytes)?;
                seen.insert(key, member.clone());
            }

            // A member whose path an earlier member made as another kind would replace it when unpacked (a
            // `checkpoint` link after the `checkpoint/` directory: CRIU then restores the link's target).
            if !components.is_empty() {
                let this = PathKind::of(kind, is_dir);
                let mut claims: Vec<(Vec<u8>, PathKind)> =
                    (1..components.len()).map(|i| (components[..i].join(&b'/'), PathKind::Dir)).collect();
                claims.push((components.join(&b'/'), this));
                for (key, want) in claims {
                    match kinds.get(&key) {
                        Some((had, earlier)) if *had != want => {
                            return Err(ArchiveError::Replaces {
                                archive: self.archive.clone(),
                                member,
                                kind: want.name(),
                                earlier: earlier.clone(),
                                earlier_kind: had.name(),
                            })
                        }
                        Some(_) => {}
                        None => {
                            kept_bytes += (key.len() + member.len()) as u64;
                            self.kept(kept_bytes)?;
                            kinds.insert(key, (want, member.clone()));
                        }
                    }
                }
            }

            if let Role::DumpLog { .. } = role {
                if kind == EntryType::Regular && !is_dir && found.criu_version.is_none() {
                    let head = self.read_head(&member, offset, size, DUMP_LOG_HEAD)?;
                    found.criu_version = criu_version_line(&head).map(|v| (v, member.clone()));
                } else {
                    self.skip_member(&member, offset, size)?;
                }
                continue;
            }
            if role == Role::PageFile {
                if found.page_files.len() >= MAX_IMAGES {
                    return Err(ArchiveError::TooManyImages { archive: self.archive.clone(), max: MAX_IMAGES });
                }
                let name = components.last().map(|c| String::from_utf8_lossy(c).into_owned()).unwrap_or_default();
                found.page_files.push((name, size));
                self.skip_member(&member, offset, size)?;
                continue;
            }
            if role == Role::Blob {
                if found.blobs.len() == MAX_BLOBS {
                    return Err(ArchiveError::Image {
                        image: self.archive.clone(),
                        rule: crate::image_rule::ImageRule::TooManyBlobs { max: MAX_BLOBS },
                    });
                }
                let key = components[1..].join(&b'/');
                found.blobs.push(BlobMember {
                    key: String::from_utf8_lossy(&key).into_owned(),
                    offset: self.pos,
                    size,
                });
                self.skip_member(&member, offset, size)?;
                continue;
            }
            let cap = match role {
                Role::Image => Some(("an identity image", MAX_IMAGE_BYTES as u64)),
                Role::Report => Some(("a restore report", MAX_REPORT_BYTES)),
                Role::Spec => Some(("the OCI spec (spec.dump)", MAX_SPEC_BYTES)),
                Role::Claims => Some(("the device claims", ccm_identity::claims::MAX_CLAIMS_BYTES as u64)),
                Role::OciLayout => Some(("an OCI layout's oci-layout", MAX_OCI_JSON_BYTES)),
                Role::OciIndex => Some(("an OCI layout's index.json", MAX_OCI_JSON_BYTES)),
                _ => None,
            };
            let Some((what, max)) = cap else {
                found.has_inventory |= role == Role::Inventory;
                self.skip_member(&member, offset, size)?;
                continue;
            };
            if size > max {
                return Err(ArchiveError::MemberTooLarge { archive: self.archive.clone(), member, what, size, max });
            }
            kept_bytes += size;
            self.kept(kept_bytes)?;
            if role == Role::Image {
                found.image_count += 1;
                if found.image_count > MAX_IMAGES {
                    return Err(ArchiveError::TooManyImages { archive: self.archive.clone(), max: MAX_IMAGES });
                }
            }
            let bytes = self.read_member(&member, offset, size)?;
            let file = ArchiveFile {
                member: String::from_utf8_lossy(raw_name).into_owned(),
                name: components.last().map(|c| String::from_utf8_lossy(c).into_owned()).unwrap_or_default(),
                bytes,
            };
            match role {
                Role::Image => found.images.push(file),
                Role::Report => found.reports.push(file),
                Role::OciLayout => found.oci_layout = Some(file),
                Role::OciIndex => found.oci_index = Some(file),
                Role::Claims => found.claims = Some(file),
                _ => found.spec = Some(file),
            }
        }
    }

    /// After the first zero block: the second one, or the end of the stream. Go's archive/tar (the reader of
    /// containerd's unpack and Podman's import) refuses a zero block followed by anything else (`ErrHeader`),
    /// or by a part of a block; GNU tar and Python's `tarfile` stop at the first zero block, and `tar -i` reads
    /// the members after it. So a lone zero block followed by data is refused: what follows it is an archive
    /// to some readers and nothing to others.
    fn second_end_block(&mut self, block: &mut Header) -> Result<(), ArchiveError> {
        let offset = self.pos;
        self.budget(BLOCK)?;
        match self.fill(block.as_mut_bytes())? {
            0 => Ok(()),
            n if (n as u64) < BLOCK => Err(self.truncated(Truncation::InHeader { offset })),
            _ if block.as_bytes().iter().all(|&b| b == 0) => Ok(()),
            _ => Err(self.ambiguous(
                offset,
                "a lone zero block (the end of the archive to GNU tar and Python's tarfile) followed by more data, \
                 which Go's archive/tar of containerd and Podman refuses and `tar --ignore-zeros` reads as members",
            )),
        }
    }

    /// Reads a GNU long name/link or PAX header into `pending`.
    fn extension(
        &mut self,
        pending: &mut Pending,
        kind: EntryType,
        offset: u64,
        size: u64,
    ) -> Result<(), ArchiveError> {
        let what = match kind {
            EntryType::GNULongName => "a GNU long-name header",
            EntryType::GNULongLink => "a GNU long-link header",
            _ => "a PAX header",
        };
        // Go's archive/tar caps these at 1 MiB too; a path is shorter than PATH_MAX on Linux, so a
        // GNU long name or link (a C string) is at most PATH_MAX bytes with its NUL.
        let max = match kind {
            EntryType::XHeader => MAX_EXTENSION_BYTES,
            _ => name::PATH_MAX as u64,
        };
        if size > max {
            return Err(
                self.corrupt(offset, format!("{what} of {} (at most {max} bytes are read)", crate::error::Bytes(size)))
            );
        }
        let data = self.read_member(&format!("({what})"), offset, size)?;
        if kind != EntryType::XHeader && data.first().is_none_or(|&b| b == 0) {
            // Go's archive/tar ignores an empty one and keeps the header's name; the others do not.
            return Err(self.ambiguous(offset, "an empty GNU long name or long link name"));
        }
        let duplicate = match kind {
            EntryType::GNULongName => pending.long_name.replace(cut_at_nul(data)).is_some(),
            EntryType::GNULongLink => pending.long_link.replace(cut_at_nul(data)).is_some(),
            _ => {
                let pax = pax::parse(&data, pax::Scope::Local).map_err(|reason| self.refused_pax(offset, reason))?;
                pending.pax.replace(pax).is_some()
            }
        };
        if duplicate {
            // The `tar` crate refuses this, Go keeps the last: refusing leaves no doubt.
            return Err(self.corrupt(offset, format!("{what} after another one for the same member")));
        }
        pending.offset.get_or_insert(offset);
        Ok(())
    }

    /// Reads a PAX global header and checks that it holds no record that some readers would apply
    /// to later members' names or sizes.
    fn global(&mut self, offset: u64, size: u64) -> Result<(), ArchiveError> {
        const WHAT: &str = "(a PAX global header)";
        if size > MAX_EXTENSION_BYTES {
            return Err(self.corrupt(
                offset,
                format!(
                    "a PAX global header of {} (at most {MAX_EXTENSION_BYTES} bytes are read)",
                    crate::error::Bytes(size)
                ),
            ));
        }
        let data = self.read_member(WHAT, offset, size)?;
        pax::parse(&data, pax::Scope::Global).map_err(|reason| self.refused_pax(offset, reason))?;
        Ok(())
    }

    /// A PAX header that is malformed (corrupt), or that readers apply differently (ambiguous).
    fn refused_pax(&self, offset: u64, error: pax::PaxError) -> ArchiveError {
        match error {
            pax::PaxError::Malformed(reason) => self.corrupt(offset, reason.into()),
            pax::PaxError::Ambiguous(reason) => self.ambiguous(offset, reason),
        }
    }

    /// Refuses headers that GNU tar, Python's `tarfile`, Go's archive/tar and the `tar` crate (whose
    /// field decoding this walk uses) would name differently.
    fn check_dialect(&self, header: &Header, offset: u64) -> Result<(), ArchiveError> {
        let b = header.as_bytes();
        let flag = b[156];
        if !matches!(flag, 0 | b'0'..=b'7' | b'x' | b'g' | b'L' | b'K' | b'S') {
            // GNU tar lists `V` (a volume label), `M`, `N`, `D` by rules of its own; Python and GNU
            // tar read `X` as a PAX header, Go and the `tar` crate as a file.
            return Err(
                self.ambiguous(offset, "a tar type other than those of POSIX, PAX and GNU long names or sparse files")
            );
        }
        let (magic, version) = (&b[257..263], &b[263..265]);
        if magic == b"ustar\0" {
            if version != b"00" {
                // GNU tar, Python and Go read the prefix field of any `ustar\0` header; the `tar`
                // crate only when the version is `00`.
                return Err(self.ambiguous(offset, "a ustar header (magic `ustar\\0`) whose version is not `00`"));
            }
            if &b[508..512] == b"tar\0" {
                // Go reads 131 bytes of prefix there (the rest are times), the others 155.
                return Err(self.ambiguous(offset, "a ustar header with a star trailer (`tar\\0` at byte 508)"));
            }
        } else if b[345] != 0 && !matches!(flag, b'L' | b'K' | b'S' | b'x' | b'g') {
            // GNU and pre-POSIX headers have no prefix field, but Python's `tarfile` prefixes the
            // name with whatever string those bytes hold.
            return Err(
                self.ambiguous(offset, "a GNU or pre-POSIX header with bytes where ustar's name prefix would be")
            );
        }
        Ok(())
    }

    /// Refuses to hold more than [`Limits::max_kept_bytes`] (kept data and names).
    fn kept(&self, kept_bytes: u64) -> Result<(), ArchiveError> {
        if kept_bytes > self.limits.max_kept_bytes {
            return Err(ArchiveError::KeptLimit { archive: self.archive.clone(), max: self.limits.max_kept_bytes });
        }
        Ok(())
    }

    /// Old-style GNU sparse members carry more 512-byte maps between header and data. GNU tar reads
    /// the next map only while every entry of the one before was present and valid (an offset and
    /// length within the file's real size); Go, Python and the `tar` crate read it whenever the
    /// `isextended` flag says so. A map that would make them disagree on where the data starts is
    /// refused.
    fn skip_sparse_extensions(&mut self, header: &Header, offset: u64) -> Result<(), ArchiveError> {
        let Some(gnu) = header.as_gnu() else {
            return Err(self.corrupt(offset, "a GNU sparse member without a GNU header".into()));
        };
        let real_size =
            gnu.real_size().map_err(|_| self.corrupt(offset, "its sparse real size is unreadable".into()))?;
        const BROKEN: &str = "a GNU sparse map that says more maps follow after an entry that is missing or out of \
                              the file's bounds (GNU tar then reads no more maps, other readers do)";
        let full = |entries: &[tar::GnuSparseHeader]| {
            entries.iter().all(|e| {
                e.numbytes[0] != 0
                    && matches!((e.offset(), e.length()), (Ok(o), Ok(n)) if o.checked_add(n).is_some_and(|end| end <= real_size))
            })
        };
        let mut extended = gnu.is_extended();
        if extended && !full(&gnu.sparse) {
            return Err(self.ambiguous(offset, BROKEN));
        }
        let mut ext = GnuExtSparseHeader::new();
        while extended {
            let at = self.pos;
            self.budget(BLOCK)?;
            if (self.fill(ext.as_mut_bytes())? as u64) < BLOCK {
                return Err(self.truncated(Truncation::InHeader { offset: at }));
            }
            extended = ext.is_extended();
            if extended && !full(ext.sparse()) {
                return Err(self.ambiguous(at, BROKEN));
            }
        }
        Ok(())
    }

    /// Reads a member's data (its size already checked against a cap) and steps over its padding.
    fn read_member(&mut self, member: &str, offset: u64, size: u64) -> Result<Vec<u8>, ArchiveError> {
        let record = self.record(offset, size)?;
        self.budget(record)?;
        let len = usize::try_from(size).map_err(|_| self.corrupt(offset, "a size beyond memory".into()))?;
        let mut data = vec![0; len];
        let got = self.fill(&mut data)? as u64;
        let padding = if got == size { self.skip_bytes(record - size)? } else { 0 };
        if got + padding < record {
            return Err(self.truncated(Truncation::InMember {
                member: member.to_string(),
                size,
                present: got + padding,
                record,
            }));
        }
        Ok(data)
    }

    /// Reads the first `head` bytes of a member's data (all of a shorter one) and steps over the
    /// rest and its padding.
    fn read_head(&mut self, member: &str, offset: u64, size: u64, head: usize) -> Result<Vec<u8>, ArchiveError> {
        let record = self.record(offset, size)?;
        self.budget(record)?;
        let take = size.min(head as u64);
        // At most `head`, a usize.
        let mut data = vec![0; usize::try_from(take).unwrap_or(head)];
        let got = self.fill(&mut data)? as u64;
        let rest = if got == take { self.skip_bytes(record - take)? } else { 0 };
        if got + rest < record {
            return Err(self.truncated(Truncation::InMember {
                member: member.to_string(),
                size,
                present: got + rest,
                record,
            }));
        }
        Ok(data)
    }

    /// Steps over a member's data and padding.
    fn skip_member(&mut self, member: &str, offset: u64, size: u64) -> Result<(), ArchiveError> {
        let record = self.record(offset, size)?;
        // A plain file's length tells a cut archive at once, before the scan limit is looked at.
        if let Input::File { len, .. } = self.input {
            let present = len.saturating_sub(self.pos);
            if present < record {
                return Err(self.truncated(Truncation::InMember { member: member.to_string(), size, present, record }));
            }
        }
        self.budget(record)?;
        let present = self.skip_bytes(record)?;
        if present < record {
            return Err(self.truncated(Truncation::InMember { member: member.to_string(), size, present, record }));
        }
        Ok(())
    }

    /// `size` rounded up to whole blocks.
    fn record(&self, offset: u64, size: u64) -> Result<u64, ArchiveError> {
        size.checked_next_multiple_of(BLOCK).ok_or_else(|| self.corrupt(offset, "its size overflows".into()))
    }

    /// Refuses to go past [`Limits::max_scanned_bytes`]: checked before each read, so a bomb stops at
    /// the limit, not after it.
    fn budget(&self, more: u64) -> Result<(), ArchiveError> {
        match self.pos.checked_add(more) {
            Some(end) if end <= self.limits.max_scanned_bytes => Ok(()),
            _ => Err(ArchiveError::ScanLimit { archive: self.archive.clone(), max: self.limits.max_scanned_bytes }),
        }
    }

    /// Reads up to `buf.len()` bytes, fewer only at the end of the stream.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, ArchiveError> {
        match input::read_prefix(&mut self.input, buf) {
            Ok(n) => {
                self.pos += n as u64;
                Ok(n)
            }
            Err(e) => Err(self.io_error(e)),
        }
    }

    /// Steps over up to `n` bytes; returns how many there were (fewer only at the end).
    fn skip_bytes(&mut self, n: u64) -> Result<u64, ArchiveError> {
        if let Input::File { reader, len } = &mut self.input {
            let present = n.min(len.saturating_sub(self.pos));
            // A file's length fits i64 (it is an off_t).
            let step = i64::try_from(present).unwrap_or(i64::MAX);
            if let Err(e) = reader.seek_relative(step) {
                return Err(self.io_error(e));
            }
            self.pos += present;
            return Ok(present);
        }
        let mut chunk = std::mem::take(&mut self.chunk);
        chunk.resize(SKIP_CHUNK, 0);
        let mut done = 0;
        while done < n {
            // At most SKIP_CHUNK, a usize.
            let want = usize::try_from((n - done).min(SKIP_CHUNK as u64)).unwrap_or(SKIP_CHUNK);
            let got = self.fill(&mut chunk[..want])?;
            done += got as u64;
            if got < want {
                break;
            }
        }
        self.chunk = chunk;
        Ok(done)
    }

    fn io_error(&self, source: io::Error) -> ArchiveError {
        let (archive, offset) = (self.archive.clone(), self.pos);
        match self.compression {
            Compression::None => ArchiveError::Read { archive, offset, source },
            compression if source.kind() == io::ErrorKind::UnexpectedEof => {
                ArchiveError::Truncated { archive, what: Truncation::CompressedStream { compression, offset } }
            }
            compression => ArchiveError::Decompress { archive, compression, offset, source },
        }
    }

    fn short_header(&self, offset: u64, got: usize, bytes: &[u8]) -> ArchiveError {
        if offset == 0 {
            let why = match got {
                0 => "it is empty",
                _ => input::unsupported_hint(&bytes[..got]).unwrap_or("it is shorter than one tar header"),
            };
            return ArchiveError::NotTar { archive: self.archive.clone(), why };
        }
        self.truncated(match got {
            0 => Truncation::NoEndMarker { offset },
            _ => Truncation::InHeader { offset },
        })
    }

    fn not_tar(&self, first_block: &[u8]) -> ArchiveError {
        let why = match self.compression {
            Compression::None => {
                input::unsupported_hint(first_block).unwrap_or("its first 512 bytes are not a tar header")
            }
            _ => "its decompressed data does not start with a tar header",
        };
        ArchiveError::NotTar { archive: self.archive.clone(), why }
    }

    fn ambiguous(&self, offset: u64, reason: &'static str) -> ArchiveError {
        ArchiveError::Ambiguous { archive: self.archive.clone(), offset, reason }
    }

    fn corrupt(&self, offset: u64, reason: String) -> ArchiveError {
        ArchiveError::CorruptHeader { archive: self.archive.clone(), offset, reason }
    }

    fn truncated(&self, what: Truncation) -> ArchiveError {
        ArchiveError::Truncated { archive: self.archive.clone(), what }
    }
}

/// The links earlier members made, as a tree of path components, so that a member's path is checked
/// against all of them in one pass over its components.
#[derive(Default)]
struct LinkTree {
    nodes: Vec<LinkNode>,
}

#[derive(Default)]
struct LinkNode {
    children: HashMap<Vec<u8>, usize>,
    /// The link's name (shown) and kind, where a link member has this path.
    link: Option<(String, &'static str)>,
}

impl LinkTree {
    /// The first earlier link that `path` runs through (or is, with `or_equal`).
    fn lookup(&self, path: &[&[u8]], or_equal: bool) -> Option<(&str, &'static str)> {
        let mut at = 0;
        for (i, part) in path.iter().enumerate() {
            at = *self.nodes.get(at)?.children.get(*part)?;
            let node = &self.nodes[at];
            if let Some((name, kind)) = &node.link {
                if i + 1 < path.len() || or_equal {
                    return Some((name, kind));
                }
            }
        }
        None
    }

    fn insert(&mut self, path: &[&[u8]], shown: String, kind: &'static str) {
        if self.nodes.is_empty() {
            self.nodes.push(LinkNode::default());
        }
        let mut at = 0;
        for part in path {
            at = match self.nodes[at].children.get(*part) {
                Some(&next) => next,
                None => {
                    let next = self.nodes.len();
                    self.nodes.push(LinkNode::default());
                    self.nodes[at].children.insert(part.to_vec(), next);
                    next
                }
            };
        }
        self.nodes[at].link.get_or_insert((shown, kind));
    }
}

/// The header checksum: the sum of its bytes with the checksum field read as spaces. Unsigned, as
/// POSIX says; signed too, as some old writers did and Go and GNU tar still accept.
fn checksum_ok(header: &Header) -> bool {
    let Ok(stored) = header.cksum() else { return false };
    let (mut unsigned, mut signed) = (0u32, 0i32);
    for (i, &b) in header.as_bytes().iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { b };
        unsigned += u32::from(b);
        signed += i32::from(i8::from_ne_bytes([b]));
    }
    stored == unsigned || i64::from(stored) == i64::from(signed)
}

/// Types that carry no data in Go's archive/tar.
fn is_header_only(kind: EntryType) -> bool {
    matches!(
        kind,
        EntryType::Link
            | EntryType::Symlink
            | EntryType::Char
            | EntryType::Block
            | EntryType::Directory
            | EntryType::Fifo
    )
}

/// What a path is once an archive is unpacked, by the member that made it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PathKind {
    Dir,
    File,
    Link,
    Special,
}

impl PathKind {
    fn of(kind: EntryType, is_dir: bool) -> PathKind {
        match kind {
            _ if is_dir => PathKind::Dir,
            EntryType::Directory => PathKind::Dir,
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => PathKind::File,
            EntryType::Link | EntryType::Symlink => PathKind::Link,
            _ => PathKind::Special,
        }
    }

    fn name(self) -> &'static str {
        match self {
            PathKind::Dir => "a directory",
            PathKind::File => "a file",
            PathKind::Link => "a link",
            PathKind::Special => "a special file",
        }
    }
}

fn kind_name(kind: EntryType, is_dir: bool) -> &'static str {
    match kind {
        EntryType::Regular if is_dir => "a directory (its name ends in `/`)",
        EntryType::Regular => "a regular file",
        EntryType::Link => "a hard link",
        EntryType::Symlink => "a symbolic link",
        EntryType::Char => "a character device",
        EntryType::Block => "a block device",
        EntryType::Directory => "a directory",
        EntryType::Fifo => "a FIFO",
        EntryType::Continuous => "a contiguous file (tar type 7)",
        EntryType::GNUSparse => "a GNU sparse file",
        _ => "a member of an unknown tar type",
    }
}

/// The version on CRIU's `Version: 4.2 (gitid ...)` line among a log's first bytes: digits and
/// dots only, at most 32 of them (anything else is no version this tool shows).
fn criu_version_line(head: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(head);
    let line = text.lines().find(|l| l.contains(") Version: ") || l.starts_with("Version: "))?;
    let version = line.split("Version: ").nth(1)?.split_whitespace().next()?;
    let ok = !version.is_empty()
        && version.len() <= 32
        && version.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && version.bytes().next().is_some_and(|b| b.is_ascii_digit());
    ok.then(|| version.to_string())
}

/// A GNU long name is a C string: it ends at its first NUL (as Go and GNU tar read it).
fn cut_at_nul(mut data: Vec<u8>) -> Vec<u8> {
    if let Some(end) = data.iter().position(|&b| b == 0) {
        data.truncate(end);
    }
    data
}

/// What a walk found, as the checkpoint archive it is: refused when it holds no `checkpoint/`.
pub(crate) fn finish(path: &Path, compression: Compression, found: Found) -> Result<CheckpointArchive, ArchiveError> {
    if !found.has_checkpoint {
        return Err(ArchiveError::NotCheckpoint { archive: input::shown_path(path) });
    }
    let mut images = found.images;
    images.sort_by_key(ArchiveFile::pid);
    let mut reports = found.reports;
    reports.sort_by_key(ArchiveFile::pid);
    Ok(CheckpointArchive {
        path: path.to_path_buf(),
        compression,
        images,
        reports,
        spec: found.spec,
        claims: found.claims,
        page_files: found.page_files,
        has_inventory: found.has_inventory,
        members: found.members,
        bytes_scanned: found.bytes_scanned,
        criu_version: found.criu_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_are_checked_both_ways() {
        let mut h = Header::new_gnu();
        h.set_path("checkpoint/x").unwrap();
        h.set_size(3);
        h.set_cksum();
        assert!(checksum_ok(&h));
        h.as_mut_bytes()[0] ^= 1;
        assert!(!checksum_ok(&h));

        // A signed sum (a name byte of 0xff) is accepted too.
        let mut h = Header::new_gnu();
        h.as_mut_bytes()[0] = 0xff;
        let signed: i32 = h
            .as_bytes()
            .iter()
            .enumerate()
            .map(|(i, &b)| if (148..156).contains(&i) { 32 } else { i32::from(i8::from_ne_bytes([b])) })
            .sum();
        let field = format!("{signed:06o}\0 ");
        h.as_mut_bytes()[148..156].copy_from_slice(field.as_bytes());
        assert!(checksum_ok(&h));
    }

    #[test]
    fn criu_names_its_version_on_an_early_line() {
        let log = b"(00.000000) Version: 4.2 (gitid 0)\n(00.000001) Running on host\n";
        assert_eq!(criu_version_line(log).as_deref(), Some("4.2"));
        assert_eq!(criu_version_line(b"(00.000000) Version: 4.1.1 (gitid v4.1.1)").as_deref(), Some("4.1.1"));
        assert_eq!(criu_version_line(b"(00.000000) Version: 4.2\x1b[2J (gitid 0)"), None);
        assert_eq!(criu_version_line(b"no version here"), None);
    }

    #[test]
    fn long_names_end_at_nul() {
        assert_eq!(cut_at_nul(b"abc\0\0".to_vec()), b"abc");
        assert_eq!(cut_at_nul(b"abc".to_vec()), b"abc");
    }
}
