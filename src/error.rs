//! The one error type of the addon. Every failure a user can cause maps to a variant with a
//! stable `code` (the JS `error.code`) and a message that says what to do next.

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

    #[error("Branch handle {0} does not belong to this context")]
    ForeignBranch(u32),

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

    #[error("{0}")]
    Unsupported(String),

    #[error("internal error: {0}")]
    Internal(String),

    #[error("Chat template error: {0}")]
    ChatTemplate(String),

    #[error("Chat output does not match its format: {0}")]
    ChatParse(String),
}

impl Error {
    /// The stable code JS callers can switch on.
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidArgument(_) => "ERR_INVALID_ARG",
            Error::ContextDisposed => "ERR_CONTEXT_DISPOSED",
            Error::ContextBusy(_) => "ERR_CONTEXT_BUSY",
            Error::BranchDisposed => "ERR_BRANCH_DISPOSED",
            Error::ForeignBranch(_) => "ERR_FOREIGN_BRANCH",
            Error::ModelNotFound(_) => "ERR_MODEL_NOT_FOUND",
            Error::ModelLoad(_) => "ERR_MODEL_LOAD",
            Error::ContextCreate(_) => "ERR_CONTEXT_CREATE",
            Error::TokenOutOfRange { .. } | Error::TokenNotInteger(..) => "ERR_TOKEN_OUT_OF_RANGE",
            Error::NoFreeSequence { .. } => "ERR_NO_FREE_SEQUENCE",
            Error::KvFull(_) => "ERR_KV_FULL",
            Error::Decode { .. } => "ERR_DECODE",
            Error::Aborted => "ERR_ABORTED",
            Error::NoLogits => "ERR_NO_LOGITS",
            Error::NoOutput(_) => "ERR_NO_LOGITS",
            Error::Grammar(_) => "ERR_GRAMMAR",
            Error::GrammarRejected(_) => "ERR_GRAMMAR_REJECTED",
            Error::Tokenize(_) => "ERR_TOKENIZE",
            Error::State(_) => "ERR_STATE",
            Error::Unsupported(_) => "ERR_UNSUPPORTED",
            Error::Internal(_) => "ERR_INTERNAL",
            Error::ChatTemplate(_) => "ERR_CHAT_TEMPLATE",
            Error::ChatParse(_) => "ERR_CHAT_PARSE",
        }
    }

    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
