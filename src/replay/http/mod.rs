//! The transport: requests built, sent over pooled HTTP/1.1 connections, and their streams read.

pub(crate) mod client;
pub(crate) mod h1conn;
pub(crate) mod overhead;
pub(crate) mod pool;
pub(crate) mod reader;
pub(crate) mod request;
pub mod target;
