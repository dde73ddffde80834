//! The one error type of the addon. Every failure a user can cause maps to a variant with a
//! stable `code` (the JS `error.code`, for thrown errors and rejections alike) and a message that
//! says what to do next. Codes and messages are defined here and nowhere else.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),

    #[error("Context has been disposed; create a new one with createContext()")]
    ContextDisposed,

    #[error("Another operation on this context is still running ({0}); await it first")]
    ContextBusy(&'static str),

    #[error(
        "Branch has been disposed (pruned, destroyed or released by retainOnly); use a live branch"
    )]
    BranchDisposed,

    #[error("{0}")]
    BranchParked(String),

    #[error("{0}: the branch belongs to another context; pass branches of this store's context")]
    ForeignBranch(String),

    #[error("Model file not found: {0}")]
    ModelNotFound(String),

    #[error("Failed to load model from {0}: not a readable GGUF model")]
    ModelLoad(String),

    #[error("Failed to create the llama.cpp context: {0}")]
    ContextCreate(String),

    #[error("Token id {token} is outside the vocabulary [0, {n_vocab}); pass ids from this model's tokenizer")]
    TokenOutOfRange { token: i64, n_vocab: i32 },

    #[error("Token id {0} is not an integer id in the vocabulary [0, {1}); pass ids from this model's tokenizer")]
    TokenNotInteger(f64, i32),

    #[error("All {n_seq_max} sequence ids are leased by live branches; prune a branch or create the context with a larger nSeqMax")]
    NoFreeSequence { n_seq_max: u32 },

    #[error("{what} needs {needed} free sequences, and {free} of this context's nSeqMax = {n_seq_max} are free; prune branches or create the context with a larger nSeqMax")]
    NotEnoughSequences {
        what: &'static str,
        needed: u32,
        free: u32,
        n_seq_max: u32,
    },

    #[error("The KV cache is full ({0}); prune branches or use a larger nCtx")]
    KvFull(String),

    #[error("llama_decode failed with code {code}: {what}")]
    Decode { code: i32, what: String },

    #[error("The operation was aborted by its AbortSignal before it completed; no branch or KV state changed, so retry it if it is still wanted")]
    Aborted,

    #[error(
        "No logits captured yet; decode or prefill this branch first (or call captureLogits())"
    )]
    NoLogits,

    /// Nothing computed yet for a context-level read (e.g. embeddings before `encode`).
    #[error("{0}")]
    NoOutput(String),

    #[error("Invalid grammar: {0}")]
    Grammar(String),

    #[error("Token {0} is not allowed by the grammar in its current state")]
    GrammarRejected(i32),

    #[error("{0}")]
    Tokenize(String),

    #[error("{0}")]
    State(String),

    /// A saved state from another model, llama.cpp state format or KV configuration.
    #[error("{0}")]
    StateMismatch(String),

    /// A saved-state file (engine/saved_state.rs) that is truncated, corrupt or not such a file.
    #[error("{0}")]
    StateCorrupt(String),

    #[error("{0}")]
    Unsupported(String),

    #[error("internal error: {0}")]
    Internal(String),

    #[error("RPC server unreachable: {0}")]
    RpcUnreachable(String),

    #[error("{0}")]
    Device(String),

    #[error("The context was lost: {0}. Its memory and one thread stay leaked until the process exits; create a new context (without the failed server)")]
    ContextLost(String),

    #[error("Chat template error: {0}")]
    ChatTemplate(String),

    #[error("Chat output does not match its format: {0}")]
    ChatParse(String),

    #[error("This context has no image projector; create it with createContext({{ modelPath, mmprojPath }}) (the model's mmproj .gguf) to send images")]
    NoProjector,

    #[error("Cannot load the image projector: {0}")]
    ProjectorLoad(String),

    #[error("The image projector does not match the model: {0}")]
    ProjectorMismatch(String),

    /// Bytes that are not a complete, decodable image.
    #[error("{0}")]
    ImageDecode(String),

    /// An image format this build does not decode.
    #[error("{0}")]
    ImageFormat(String),

    /// Over `imageMaxBytes` or `imageMaxPixels`.
    #[error("{0}")]
    ImageTooLarge(String),

    /// An image whose positions do not fit the context (nCtx, nBatch), or a fork inside one.
    #[error("{0}")]
    ImagePositions(String),

    /// What images cannot do yet (M-RoPE models, saving a branch that holds an image).
    #[error("{0}")]
    ImageUnsupported(String),
}

/// Defines `Error::code` and `Error::codes` from one table, so the list JS checks its typings
/// against can never miss a variant.
macro_rules! codes {
    ($($variant:ident => $code:literal,)+) => {
        impl Error {
            /// The stable code JS callers can switch on.
            pub fn code(&self) -> &'static str {
                match self {
                    $(Error::$variant { .. } => $code,)+
                }
            }

            /// Every code once, in declaration order (several variants may share one).
            pub fn codes() -> Vec<&'static str> {
                let mut codes: Vec<&'static str> = Vec::new();
                for code in [$($code),+] {
                    if !codes.contains(&code) {
                        codes.push(code);
                    }
                }
                codes
            }
        }
    };
}

codes! {
    InvalidArgument => "ERR_INVALID_ARG",
    ContextDisposed => "ERR_CONTEXT_DISPOSED",
    ContextBusy => "ERR_CONTEXT_BUSY",
    BranchDisposed => "ERR_BRANCH_DISPOSED",
    BranchParked => "ERR_BRANCH_PARKED",
    ForeignBranch => "ERR_FOREIGN_BRANCH",
    ModelNotFound => "ERR_MODEL_NOT_FOUND",
    ModelLoad => "ERR_MODEL_LOAD",
    ContextCreate => "ERR_CONTEXT_CREATE",
    TokenOutOfRange => "ERR_TOKEN_OUT_OF_RANGE",
    TokenNotInteger => "ERR_TOKEN_OUT_OF_RANGE",
    NoFreeSequence => "ERR_NO_FREE_SEQUENCE",
    NotEnoughSequences => "ERR_NO_FREE_SEQUENCE",
    KvFull => "ERR_KV_FULL",
    Decode => "ERR_DECODE",
    Aborted => "ERR_ABORTED",
    NoLogits => "ERR_NO_LOGITS",
    NoOutput => "ERR_NO_LOGITS",
    Grammar => "ERR_GRAMMAR",
    GrammarRejected => "ERR_GRAMMAR_REJECTED",
    Tokenize => "ERR_TOKENIZE",
    State => "ERR_STATE",
    StateMismatch => "ERR_STATE_MISMATCH",
    StateCorrupt => "ERR_STATE_CORRUPT",
    Unsupported => "ERR_UNSUPPORTED",
    Internal => "ERR_INTERNAL",
    RpcUnreachable => "ERR_RPC_UNREACHABLE",
    Device => "ERR_DEVICE",
    ContextLost => "ERR_CONTEXT_LOST",
    ChatTemplate => "ERR_CHAT_TEMPLATE",
    ChatParse => "ERR_CHAT_PARSE",
    NoProjector => "ERR_NO_PROJECTOR",
    ProjectorLoad => "ERR_PROJECTOR_LOAD",
    ProjectorMismatch => "ERR_PROJECTOR_MISMATCH",
    ImageDecode => "ERR_IMAGE_DECODE",
    ImageFormat => "ERR_IMAGE_FORMAT",
    ImageTooLarge => "ERR_IMAGE_TOO_LARGE",
    ImagePositions => "ERR_IMAGE_POSITIONS",
    ImageUnsupported => "ERR_IMAGE_UNSUPPORTED",
}

impl Error {
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
