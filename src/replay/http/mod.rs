//! The transport: requests built, sent over pooled HTTP/1.1 connections, and their streams read.

pub mod client;
pub mod h1conn;
pub mod overhead;
pub mod pool;
pub mod reader;
pub mod request;
pub mod target;
