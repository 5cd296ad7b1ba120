//! A model file's text through everything `dptrain model show` does with it (parse, expand
//! templates, build the graph, infer and check every shape, render the table) must give a
//! table or an error: no panic, no overflow, no deep recursion, no unbounded time or memory.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = dptrain::model::show_text(text, "fuzz.toml");
    }
});
