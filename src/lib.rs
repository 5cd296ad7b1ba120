//! dptrain: fast data-parallel training of convolutional neural networks.
//!
//! See `docs/ARCHITECTURE.md` for the map from the paper's three ideas to these modules.

pub mod models;
pub mod nn;
pub mod ops;
