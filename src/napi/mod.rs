//! The napi surface: one file per JS domain, each adding members to `SessionContext` (or module
//! functions), converting JS values at the boundary and calling the engine. lib/ wraps the
//! `_`-prefixed members; the rest are public.

#[cfg(feature = "bench")]
pub mod bench;
pub mod branch;
pub mod cancel;
pub mod chat;
pub mod context;
pub mod convert;
pub mod devices;
pub mod embeddings;
pub mod images;
pub mod load;
pub mod logits_view;
pub mod metrics;
pub mod park;
pub mod raw;
pub mod sampling;
pub mod saved_state;
pub mod state;
pub mod store;
pub mod tokenizer;
pub mod tree;
pub mod worker;
