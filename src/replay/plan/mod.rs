//! The plan: which records are sent, when, in which order, and with which bodies.

pub mod body;
pub mod prompts;
pub mod servertext;
pub mod shaping;
pub mod source;
pub mod start;
pub mod turns;
