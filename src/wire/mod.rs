//! Wire formats, pure: HTTP/1.1 framing, SSE, the OpenAI shapes, the chunk memo, the byte
//! scanner, and Prometheus text.

pub(crate) mod bytescan;
pub(crate) mod chunkmemo;
pub mod h1;
pub mod openai;
pub(crate) mod output;
pub(crate) mod prom;
pub mod sse;

/// The error of an HTTP body or service (hyper's boxed error).
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
