//! The one error type of `hearth-core`. Variants are structured so callers (CLI, server, JS edge)
//! can react to the kind of failure, and every message names the thing that was wrong.

use crate::graph::BufType;
use thiserror::Error;

pub type Result<T, E = CoreError> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum CoreError {
    #[error("I/O error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic bytes are {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error(
        "GGUF file is truncated: {what} needs {needed} bytes at offset {offset}, but the file is {file_len} bytes long"
    )]
    Truncated { what: String, offset: u64, needed: u64, file_len: u64 },
    #[error("GGUF limit exceeded: {what} is {value}, the maximum is {max}")]
    LimitExceeded { what: String, value: u64, max: u64 },
    #[error("GGUF metadata key '{key}' has unknown value type {type_id}")]
    BadValueType { key: String, type_id: u32 },
    #[error("GGUF {what} is not valid UTF-8")]
    BadUtf8 { what: String },
    #[error("GGUF has duplicate {what} '{name}'")]
    Duplicate { what: &'static str, name: String },
    #[error("tensor '{tensor}' has unknown tensor type id {type_id}")]
    UnknownTensorType { tensor: String, type_id: u32 },
    #[error("tensor '{tensor}': {reason}")]
    BadTensor { tensor: String, reason: String },
    #[error("missing metadata key '{0}'")]
    MissingKey(String),
    #[error("metadata key '{key}' is {found}, expected {expected}")]
    WrongType { key: String, expected: &'static str, found: &'static str },
    #[error("unsupported architecture '{0}' (supported: llama, qwen2, qwen3, gemma3)")]
    UnknownArchitecture(String),
    #[error("model is missing tensor '{0}'")]
    MissingTensor(String),
    #[error("tensor '{tensor}' has shape {found:?}, expected {expected:?}")]
    ShapeMismatch { tensor: String, expected: Vec<u64>, found: Vec<u64> },
    #[error("tensor type {ty} is not supported for {what}")]
    UnsupportedTensorType { ty: String, what: String },
    #[error("invalid model hyper-parameter: {0}")]
    BadHyperParameter(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("context overflow: {needed} tokens needed, but the context holds {capacity}")]
    ContextOverflow { needed: usize, capacity: usize },
    #[error(
        "KV memory exhausted: {needed_blocks} more blocks of {block_size} tokens needed, {available_blocks} of {total_blocks} available (give the KV cache more memory or shorten the request)"
    )]
    KvExhausted { needed_blocks: usize, available_blocks: usize, total_blocks: usize, block_size: usize },
    #[error("the draft model's vocabulary does not match the target's: {0}")]
    VocabMismatch(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A request parameter that is missing, of the wrong type, out of range or not implemented
    /// ([`crate::request`]): a client error (HTTP 400, JS `bad-argument`) naming `param`.
    #[error("{message}")]
    BadRequest { param: Option<String>, message: String },
    /// A constrained answer (structured output) that cannot go on: its grammar allows no token
    /// the model has, or failed while matching. Ends the request; the text so far is kept.
    #[error("{param}: the answer cannot continue under its grammar: {message}")]
    Constraint { param: &'static str, message: String },
    #[error("graph op #{index} ({op}) is inconsistent: {reason}")]
    BadGraph { index: usize, op: &'static str, reason: String },
    /// A graph op given a buffer of another element type than it reads or writes (every op but
    /// those exchanging ids takes f32).
    #[error("graph op #{index} ({op}) takes {expected} buffers; '{buffer}' holds {found}")]
    BufTypeMismatch { index: usize, op: &'static str, buffer: String, expected: BufType, found: BufType },
    /// A graph op given a weight that stacks several matrices (experts) where it reads one.
    #[error("graph op #{index} ({op}) reads one matrix; weight '{weight}' stacks {n_experts} experts")]
    ExpertWeight { index: usize, op: &'static str, weight: String, n_experts: usize },
    /// The backend cannot run this model or KV layout (asked through `Backend::supports` before
    /// anything compiles): another backend may.
    #[error("backend '{backend}' does not support {what}")]
    Unsupported { backend: String, what: String },
    /// The device itself failed; what a caller can do depends on `kind`.
    #[error("backend '{backend}': {kind}: {message}")]
    Device { backend: String, kind: DeviceFault, message: String },
    #[error("backend '{backend}': {message}")]
    Backend { backend: String, message: String },
}

/// How a device failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceFault {
    /// The device is gone (driver reset, GPU process crash, a browser reclaiming it): every later
    /// step fails; the model must be loaded again on a new device.
    Lost,
    /// An allocation (weights, KV pool, activations) failed: a smaller context, KV budget or
    /// batch may fit.
    OutOfMemory,
}

impl std::fmt::Display for DeviceFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceFault::Lost => "the device was lost",
            DeviceFault::OutOfMemory => "out of device memory",
        })
    }
}

impl CoreError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        CoreError::Io { context: context.into(), source }
    }
}
