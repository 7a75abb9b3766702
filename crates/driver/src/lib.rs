//! The driver layer: `libcuda.so.1` loaded at run time, and NVML through `nvml-wrapper`.
//!
//! Nothing is linked at build time, so the plugin loads on hosts without an NVIDIA driver and
//! disables itself there. All FFI `unsafe` of the driver libraries lives in this crate.

pub mod abi;
pub mod checkpoint;
pub mod cuda;
pub mod custom_storage;
pub mod libfile;
pub mod nvml;
pub mod procfs;
pub mod rm;

pub use cuda::{CuResult, CudaError, Libcuda};
