//! The plan: which records are sent, when, in which order, and with which bodies.

pub mod body;
pub(crate) mod prompts;
pub(crate) mod servertext;
pub(crate) mod shaping;
pub mod source;
pub(crate) mod start;
pub mod turns;
