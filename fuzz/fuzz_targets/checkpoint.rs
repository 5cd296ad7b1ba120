//! Checkpoint loading (safetensors header, metadata, tensors) must return an error, never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let _ = dptrain::train::checkpoint::Checkpoint::from_bytes(data, Path::new("fuzz-input"));
});
