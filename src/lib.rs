//! llama-branch: branched inference for Node.js on llama.cpp. Three layers, bottom up (see
//! ARCHITECTURE.md): `llama` (the only code that calls llama.cpp), `engine` (plain Rust: the
//! store, leases, KV accounting, the one decode engine, sampling, metrics) and `napi` (the JS
//! surface, one file per domain). `error` is the one error type all three share.

pub mod engine;
pub mod error;
pub mod llama;
pub mod napi;
