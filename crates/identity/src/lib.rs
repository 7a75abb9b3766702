//! The identity core of criu-cuda-migrate.
//!
//! Everything here is pure: no file, process or driver access. The dump side turns what it
//! observed into an [`image::IdentityImage`]; the restore side decodes it, plans a device map
//! ([`map`]), finds and plans rewrites of stale PCI words ([`pattern`]) and checks the result
//! ([`validate`]); environment strings that name GPUs are rewritten by plans from [`mod@env`].
//! The settings, CRIU's plugin options and the runtime's OCI spec are read by `ccm-settings`.
//! Most of the project's tests live in this crate.

#![forbid(unsafe_code)]

pub mod claims;
pub mod criu_pstree;
pub mod criu_support;
pub mod devprop;
pub mod env;
pub mod gpu;
pub mod image;
pub mod managed;
pub mod map;
pub mod memory;
pub mod pattern;
pub mod pid;
pub mod staging;
pub mod text;
pub mod validate;

mod table;

pub use gpu::{GpuIdentity, GpuUuid, PciAddress, PciAddressParseError, PciSignature, UuidParseError};
pub use image::{is_image_file_name, IdentityImage, ImageError, PciSite, ProcessEnv};
pub use map::{plan, DeviceMap, MapError, MapPair, MapRequest, PairReason};
pub use pid::{HostPid, HostTid, NsPid};
