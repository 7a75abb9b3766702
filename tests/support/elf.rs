//! Just enough of ELF64 (little endian) to find an exported data symbol's bytes in a shared object: the tests read
//! and byte-patch the plugin's `CR_PLUGIN_DESC` in the file CRIU will `dlopen`, without loading it into the test
//! process (its constructors and CRIU symbol lookups belong inside CRIU) and without a dependency for one lookup.

use std::ops::Range;

const SHT_DYNSYM: u32 = 11;
const SHT_NOBITS: u32 = 8;
const SECTION_HEADER_SIZE: usize = 64;
const SYMBOL_SIZE: usize = 24;

struct Section {
    kind: u32,
    addr: u64,
    offset: u64,
    size: u64,
    link: u32,
}

fn bytes_at(image: &[u8], at: usize, len: usize) -> Result<&[u8], String> {
    image
        .get(at..at.checked_add(len).ok_or("offset overflow")?)
        .ok_or_else(|| format!("ELF truncated: wanted {len} bytes at {at:#x}, file has {}", image.len()))
}

fn u16_at(image: &[u8], at: usize) -> Result<u16, String> {
    Ok(u16::from_le_bytes(bytes_at(image, at, 2)?.try_into().expect("2 bytes")))
}

fn u32_at(image: &[u8], at: usize) -> Result<u32, String> {
    Ok(u32::from_le_bytes(bytes_at(image, at, 4)?.try_into().expect("4 bytes")))
}

fn u64_at(image: &[u8], at: usize) -> Result<u64, String> {
    Ok(u64::from_le_bytes(bytes_at(image, at, 8)?.try_into().expect("8 bytes")))
}

fn to_usize(value: u64) -> Result<usize, String> {
    usize::try_from(value).map_err(|_| format!("ELF value {value:#x} does not fit in usize"))
}

fn sections(image: &[u8]) -> Result<Vec<Section>, String> {
    if bytes_at(image, 0, 4)? != b"\x7fELF" {
        return Err("not an ELF file".into());
    }
    if image[4] != 2 || image[5] != 1 {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let table = to_usize(u64_at(image, 0x28)?)?;
    let entry_size = usize::from(u16_at(image, 0x3A)?);
    let count = usize::from(u16_at(image, 0x3C)?);
    if entry_size != SECTION_HEADER_SIZE {
        return Err(format!("unexpected section header size {entry_size}"));
    }
    (0..count)
        .map(|i| {
            let at = table + i * SECTION_HEADER_SIZE;
            Ok(Section {
                kind: u32_at(image, at + 4)?,
                addr: u64_at(image, at + 16)?,
                offset: u64_at(image, at + 24)?,
                size: u64_at(image, at + 32)?,
                link: u32_at(image, at + 40)?,
            })
        })
        .collect()
}

fn c_string_at(image: &[u8], at: usize) -> Result<&[u8], String> {
    let rest = image.get(at..).ok_or("string offset out of the file")?;
    let end = rest.iter().position(|&b| b == 0).ok_or("unterminated string")?;
    Ok(&rest[..end])
}

/// The file bytes (as a range of `image`) that hold the exported symbol `name`'s initial value.
pub fn exported_symbol_bytes(image: &[u8], name: &str) -> Result<Range<usize>, String> {
    let sections = sections(image)?;
    let dynsym = sections.iter().find(|s| s.kind == SHT_DYNSYM).ok_or("no .dynsym: the file exports no symbols")?;
    let strings = sections.get(dynsym.link as usize).ok_or("the .dynsym string table index is out of range")?;
    let first = to_usize(dynsym.offset)?;
    for i in 0..to_usize(dynsym.size)? / SYMBOL_SIZE {
        let at = first + i * SYMBOL_SIZE;
        let name_at = to_usize(strings.offset)? + u32_at(image, at)? as usize;
        if c_string_at(image, name_at)? != name.as_bytes() {
            continue;
        }
        let section_index = usize::from(u16_at(image, at + 6)?);
        let value = u64_at(image, at + 8)?;
        let size = to_usize(u64_at(image, at + 16)?)?;
        let home = sections
            .get(section_index)
            .ok_or_else(|| format!("{name} is undefined or absolute (section {section_index})"))?;
        if home.kind == SHT_NOBITS {
            return Err(format!("{name} lives in .bss: its initial value is all zeros"));
        }
        if value < home.addr || value + size as u64 > home.addr + home.size {
            return Err(format!("{name} at {value:#x} lies outside its section"));
        }
        let start = to_usize(home.offset + (value - home.addr))?;
        bytes_at(image, start, size)?;
        return Ok(start..start + size);
    }
    Err(format!("the file does not export {name}"))
}
