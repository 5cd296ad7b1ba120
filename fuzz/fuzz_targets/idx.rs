//! IDX image and label parsing (raw and gzipped) must return an error, never panic, hang or
//! allocate what the header claims without checking it against the input.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let _ = dptrain::data::idx::parse_images(Path::new("fuzz-input"), data);
    let _ = dptrain::data::idx::parse_labels(Path::new("fuzz-input"), data, 10);
});
