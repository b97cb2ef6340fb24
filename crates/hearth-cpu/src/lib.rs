//! CPU backend.

pub mod kernels;
