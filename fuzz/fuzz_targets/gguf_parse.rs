//! Arbitrary bytes → GGUF reader → (when it parses) model config and tokenizer. None may panic,
//! abort or allocate without bound; errors are fine.
#![no_main]

use hearth_core::gguf::{GgufFile, MemorySource};
use hearth_core::model::ModelConfig;
use hearth_core::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|bytes: &[u8]| {
    let Ok(file) = GgufFile::read(Arc::new(MemorySource::new(bytes.to_vec()))) else { return };
    let _ = ModelConfig::from_metadata(&file.metadata);
    let _ = Tokenizer::from_gguf(&file.metadata);
    for tensor in &file.tensors {
        // The reader promised every tensor's bytes are inside the file.
        assert!(file.tensor_bytes(tensor).is_ok());
    }
});
