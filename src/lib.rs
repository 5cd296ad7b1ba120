//! dptrain: fast data-parallel training of convolutional neural networks.
//!
//! See `docs/ARCHITECTURE.md` for the map from the paper's three ideas to these modules.

// Every public item is documented: clippy -D warnings in scripts/test.sh holds it.
#![warn(missing_docs)]

pub mod backend;
pub mod bench;
pub mod cli;
pub mod comm;
pub mod config;
pub mod data;
pub mod elastic;
pub mod export;
pub mod infer;
pub mod input;
pub mod interrupt;
pub mod limits;
pub mod measure;
pub mod model;
pub mod nn;
pub mod optim;
pub mod output;
pub mod parallel;
pub mod pipeline;
pub mod plan;
pub mod report;
pub mod sim;
pub mod terminal;
pub mod testbed;
pub mod trace;
pub mod train;
