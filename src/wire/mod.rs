//! Wire formats, pure: HTTP/1.1 framing, SSE, the OpenAI shapes, the chunk memo, the byte
//! scanner, and Prometheus text.

pub mod bytescan;
pub mod chunkmemo;
pub mod h1;
pub mod openai;
pub mod prom;
pub mod sse;
