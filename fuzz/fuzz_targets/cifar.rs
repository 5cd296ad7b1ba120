//! CIFAR-10 binary batch parsing must return an error, never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let _ = dptrain::data::cifar::parse_cifar10_batch(Path::new("fuzz-input"), data);
});
