//! Sampling: validated parameters (`config`), the llama.cpp sampler chain built from them
//! (`chain`), and picking a token from a logits row (`pick`).

pub mod chain;
pub mod config;
pub mod pick;

pub use chain::Chain;
pub use config::SamplingConfig;
