//! Opening the archive file and turning it into a tar byte stream.

use std::fs::{File, FileType, OpenOptions};
use std::io::{self, BufReader, Read, Seek};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::archive::Compression;
use crate::error::ArchiveError;

/// Read buffer of the archive file.
const FILE_BUFFER: usize = 64 * 1024;

/// The largest zstd window we decode, as a power of two: 2^27 = 128 MiB, zstd's own default limit
/// for decoders, written out because it is what bounds a hostile frame's memory (a frame header may
/// ask for up to 2^31). Podman's zstd (klauspost/compress) uses windows of 8 MiB and less.
const ZSTD_WINDOW_LOG_MAX: u32 = 27;

/// The tar stream, however it is stored.
pub(crate) enum Input<'a> {
    /// An uncompressed tar in a regular file of `len` bytes: data we skip is stepped over by seeking,
    /// so a multi-GB `pages-*.img` costs nothing, and a cut file is seen from its length.
    File { reader: BufReader<File>, len: u64 },
    /// Everything else is read through.
    Stream(Box<dyn Read + 'a>),
}

impl Read for Input<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Input::File { reader, .. } => reader.read(buf),
            Input::Stream(reader) => reader.read(buf),
        }
    }
}

/// The archive path as printed in messages.
pub(crate) fn shown_path(path: &Path) -> String {
    ccm_identity::text::escaped(&path.display().to_string())
}

/// Opens `path` for reading if it is a regular file, following symbolic links (the user named it).
///
/// The type is checked twice: with `stat` before opening, so that a FIFO or device is never opened
/// at all (opening a FIFO blocks until a writer comes; opening some devices acts on them), and with
/// `fstat` on what was opened, in case the path was swapped in between. The open itself uses
/// `O_NONBLOCK` (a FIFO swapped in cannot block it) and `O_NOCTTY` (a terminal swapped in does not
/// become ours). On a regular file `O_NONBLOCK` changes nothing: Linux reads regular files fully.
pub(crate) fn open(path: &Path) -> Result<(File, u64), ArchiveError> {
    let open_error = |source| ArchiveError::Open { archive: shown_path(path), source };
    let before = std::fs::metadata(path).map_err(open_error)?;
    regular(path, before.file_type())?;
    let file =
        OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path).map_err(open_error)?;
    let after = file.metadata().map_err(open_error)?;
    regular(path, after.file_type())?;
    Ok((file, after.len()))
}

fn regular(path: &Path, file_type: FileType) -> Result<(), ArchiveError> {
    if file_type.is_file() {
        return Ok(());
    }
    let kind = if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO (named pipe)"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(ArchiveError::NotRegularFile { archive: shown_path(path), kind })
}

/// The compression the first bytes announce. Anything else is taken for a plain tar, and a wrong
/// guess shows as "not a tar archive" at the first header (see [`unsupported_hint`]).
pub(crate) fn detect(prefix: &[u8]) -> Compression {
    match prefix {
        [0x1f, 0x8b, ..] => Compression::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Zstd,
        // A zstd skippable frame (magic 0x184D2A50..=0x184D2A5F, little-endian), which pzstd writes
        // first; the decoder steps over it.
        [b0, 0x2a, 0x4d, 0x18, ..] if b0 & 0xf0 == 0x50 => Compression::Zstd,
        _ => Compression::None,
    }
}

/// For data that is not a tar header: the compression it looks like, which we do not read.
pub(crate) fn unsupported_hint(prefix: &[u8]) -> Option<&'static str> {
    match prefix {
        [0xfd, b'7', b'z', b'X', b'Z', 0x00, ..] => {
            Some("it looks xz-compressed, and only gzip and zstd are read: decompress it first (xz -d)")
        }
        [b'B', b'Z', b'h', ..] => {
            Some("it looks bzip2-compressed, and only gzip and zstd are read: decompress it first (bunzip2)")
        }
        [0x04, 0x22, 0x4d, 0x18, ..] => {
            Some("it looks lz4-compressed, and only gzip and zstd are read: decompress it first (lz4 -d)")
        }
        _ => None,
    }
}

/// Reads up to `buf.len()` bytes, fewer only at the end of `reader`.
pub(crate) fn read_prefix(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match reader.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The tar stream of an opened regular file.
pub(crate) fn from_file(path: &Path, mut file: File, len: u64) -> Result<(Input<'static>, Compression), ArchiveError> {
    let read_error = |source| ArchiveError::Read { archive: shown_path(path), offset: 0, source };
    let mut prefix = [0u8; 4];
    let n = read_prefix(&mut file, &mut prefix).map_err(read_error)?;
    file.rewind().map_err(read_error)?;
    let compression = detect(&prefix[..n]);
    let reader = BufReader::with_capacity(FILE_BUFFER, file);
    let input = match compression {
        Compression::None => Input::File { reader, len },
        Compression::Gzip => gzip(reader),
        Compression::Zstd => zstd(path, reader)?,
    };
    Ok((input, compression))
}

/// The tar stream of any reader (read through, never seeked).
pub(crate) fn from_reader<'a>(
    path: &Path,
    mut reader: impl Read + 'a,
) -> Result<(Input<'a>, Compression), ArchiveError> {
    let mut prefix = [0u8; 4];
    let n = read_prefix(&mut reader, &mut prefix).map_err(|source| ArchiveError::Read {
        archive: shown_path(path),
        offset: 0,
        source,
    })?;
    let compression = detect(&prefix[..n]);
    // Put the peeked bytes back in front.
    let whole = BufReader::with_capacity(FILE_BUFFER, io::Cursor::new(prefix[..n].to_vec()).chain(reader));
    let input = match compression {
        Compression::None => Input::Stream(Box::new(whole)),
        Compression::Gzip => gzip(whole),
        Compression::Zstd => zstd(path, whole)?,
    };
    Ok((input, compression))
}

/// The gzip decoder. Multi-member: a gzip file may be a concatenation (pigz, parallel writers); a
/// single-member decoder would stop after the first and take the rest for a cut archive.
fn gzip<'a>(reader: impl io::BufRead + 'a) -> Input<'a> {
    Input::Stream(Box::new(flate2::bufread::MultiGzDecoder::new(reader)))
}

/// The zstd decoder, frames decoded one after the other (the crate's default), windows capped.
fn zstd<'a>(path: &Path, reader: impl io::BufRead + 'a) -> Result<Input<'a>, ArchiveError> {
    let failed = |source| ArchiveError::Decompress {
        archive: shown_path(path),
        compression: Compression::Zstd,
        offset: 0,
        source,
    };
    let mut decoder = zstd::stream::read::Decoder::with_buffer(reader).map_err(failed)?;
    decoder.window_log_max(ZSTD_WINDOW_LOG_MAX).map_err(failed)?;
    Ok(Input::Stream(Box::new(decoder)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_bytes_pick_the_decoder() {
        assert_eq!(detect(&[0x1f, 0x8b, 8, 0]), Compression::Gzip);
        assert_eq!(detect(&[0x28, 0xb5, 0x2f, 0xfd]), Compression::Zstd);
        assert_eq!(detect(&[0x50, 0x2a, 0x4d, 0x18]), Compression::Zstd);
        assert_eq!(detect(&[0x5f, 0x2a, 0x4d, 0x18]), Compression::Zstd);
        assert_eq!(detect(b"chec"), Compression::None);
        assert_eq!(detect(&[0x1f]), Compression::None);
        assert_eq!(detect(&[]), Compression::None);
    }

    #[test]
    fn other_compressions_get_a_hint() {
        assert!(unsupported_hint(&[0xfd, b'7', b'z', b'X', b'Z', 0]).unwrap().contains("xz"));
        assert!(unsupported_hint(b"BZh91AY").unwrap().contains("bzip2"));
        assert!(unsupported_hint(b"checkpoint/").is_none());
    }
}
