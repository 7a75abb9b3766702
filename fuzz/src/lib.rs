//! The fuzz targets' shared oracle (`oracle.rs`, also used by the stable-Rust mutation test
//! `tests/identity_image_mutation.rs` of the root package).

#[path = "oracle.rs"]
pub mod oracle;
