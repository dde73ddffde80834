//! llama-branch: branched inference for Node.js on llama.cpp.
//!
//! Layers, bottom up: `ffi` (the only unsafe llama.cpp code), pure bookkeeping (`handles`,
//! `leases`, `plan`, `metrics`, `sampling`), the `store` of branches, and the napi boundary
//! (`worker` for off-thread execution, `session` for the JS class).

pub mod cancel;
pub mod chat_ffi;
pub mod error;
pub mod ffi;
pub mod handles;
pub mod leases;
pub mod logits_view;
pub mod metrics;
pub mod parallel;
pub mod plan;
pub mod profile;
pub mod sampling;
pub mod session;
pub mod store;
pub mod worker;
