//! The llama.cpp layer: the only code that calls into llama.cpp (`llama_cpp_sys_2`) or the C++
//! chat shim. Small RAII wrappers over the raw pointers; every `unsafe` block says why it holds.
//! Everything above this module is safe Rust. Wrappers check what llama.cpp would otherwise
//! abort on where that is cheap, but callers validate user input before it gets here.

mod backend;
mod batch;
pub mod chat;
mod context;
mod devices;
mod model;
mod mtmd;
mod sampler;

pub use backend::{
    init_backend, init_backend_from_dir, load_module, log_threshold, parse_log_level,
    set_log_threshold, system_info,
};
pub use batch::Batch;
pub use context::{
    Context, ContextConfig, POOLING_MEAN, POOLING_NONE, POOLING_RANK, SEQ_FILE_MAGIC,
    SEQ_FILE_VERSION, SEQ_STATE_MAGIC,
};
pub use devices::{
    gguf_block_count, install_abort_hook, local_devices, rpc_add_server, rpc_available,
    rpc_start_server, Device, DeviceInfo, DeviceKind,
};
pub use model::{Model, ModelParams, SplitMode};
pub use mtmd::{Bitmap, Chunks, Part, Piece, Projector};
pub use sampler::{json_schema_to_grammar, Candidates, Sampler, TokenData};

/// A token id (`llama_token`).
pub type Token = i32;
/// A position in a sequence (`llama_pos`).
pub type Pos = i32;
/// A KV sequence id (`llama_seq_id`).
pub type SeqId = i32;
