//! The identity core of criu-cuda-migrate.
//!
//! Everything here is pure: no file, process or driver access. The dump side turns what it
//! observed into an [`image::IdentityImage`]; the restore side decodes it, plans a device map
//! ([`map`]), finds and plans rewrites of stale PCI words ([`pattern`]) and checks the result
//! ([`validate`]). Most of the project's tests live in this crate.

pub mod gpu;
pub mod image;
pub mod map;
pub mod pattern;
pub mod validate;

pub use gpu::{GpuIdentity, GpuUuid, PciAddress, PciSignature, UuidParseError};
