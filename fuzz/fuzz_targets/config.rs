//! A run config's text (`train --config FILE`) must parse into options or give an error:
//! no panic, no deep recursion, no unbounded time or memory.
#![no_main]
use dptrain::config::TrainOptions;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(options) = TrainOptions::from_toml_text(text, "fuzz.toml") {
            let _ = options.overlaid_with(&TrainOptions::default());
        }
    }
});
