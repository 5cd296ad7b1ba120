//! Testbeds: what the reliability tests and the cluster emulation put into a run that a real
//! run does not have. [`fault`] injects failures (`--inject-fault`) that take the real failure
//! paths; [`device`] holds each worker's compute to a measured profile's times
//! (`--emulate-device`), as the in-process link emulation holds its messages to a link's.
//!
//! Below the pipeline, the configuration and the trainer, which all carry them.

pub mod device;
pub mod fault;

pub use device::{DeviceError, EmulatedDevice};
pub use fault::{BadFault, Fault, FaultPhase};
