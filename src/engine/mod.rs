//! The engine: plain Rust between the llama.cpp layer and the napi surface. It owns every
//! rule about branches — leases, the branch tree, exact KV accounting, decode planning and the
//! one decode engine, sampling, metrics — and is unit-tested without a model (`fake`).

pub mod branch;
pub mod calibrate;
pub mod decode;
pub mod endpoint;
pub mod fingerprint;
pub mod handles;
pub mod image_header;
pub mod kv;
pub mod kv_types;
pub mod leases;
pub mod media;
pub mod metrics;
pub mod park;
pub mod placement;
pub mod plan;
pub mod pool;
pub mod prefix_file;
pub mod profile;
pub mod sampling;
pub mod saved_state;
pub mod segments;
pub mod speculate;
pub mod state_file;
pub mod step;
pub mod store;
pub mod store_sampling;
pub mod tree;
pub mod tree_file;
pub mod warmup;

#[cfg(test)]
pub mod fake;
#[cfg(test)]
mod park_tests;
#[cfg(test)]
mod store_tests;

pub use kv::KvBackend;
pub use store::BranchStore;
